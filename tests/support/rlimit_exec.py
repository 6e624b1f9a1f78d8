"""Run a command with a lower RLIMIT_NOFILE: `python rlimit_exec.py NOFILE cmd [args...]`.

Test tooling for the descriptor tests (tests/fault/test_descriptors.py): the limit is set
in this process, then exec() replaces it with the command, which inherits the limit (as
`ulimit -n NOFILE; exec cmd` would), so the daemon under test derives its connection
limit from it like in production.
"""
import os
import resource
import sys


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: rlimit_exec.py NOFILE cmd [args...]")
    nofile = int(sys.argv[1])
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard if hard != resource.RLIM_INFINITY and hard >= nofile
                                                else nofile))
    os.execvp(sys.argv[2], sys.argv[2:])


if __name__ == "__main__":
    main()
