"""`mqnamesrv` / `python -m pocketmq.nameserver`: run a NameServer until SIGTERM or SIGINT.

    mqnamesrv [-c namesrv.conf] [-p] [-h] [--listenPort=9876] [--key=value ...]

Exit codes: 0 after a clean shutdown (and after -h / -p), 2 for a
configuration error (one line on stderr), 1 when the server cannot start
(port in use, unreadable kvConfig.json).
"""
from __future__ import annotations

import asyncio
import logging
import sys

log = logging.getLogger("pocketmq.namesrv")


def _report_lines(report) -> list[str]:
    """Start-up lines from nameserver.config's LoadReport (tolerant of its shape)."""
    lines = []
    config_file = getattr(report, "config_file", None)
    if config_file:
        lines.append(f"load config properties file OK, {config_file}")
    lines.extend(str(n) for n in getattr(report, "notes", ()) or ())
    unused = getattr(report, "unused_line", None)
    if callable(unused):
        line = unused()
        if line:
            lines.append(line)
    return lines


def main(argv=None) -> int:
    from pocketmq.nameserver.config import ConfigError, parse_args
    from pocketmq.remoting.daemon import install_uvloop, run_until_signal, setup_logging

    try:
        config, report = parse_args(sys.argv[1:] if argv is None else list(argv))
    except ConfigError as e:
        print(f"mqnamesrv: {e}", file=sys.stderr)
        return 2
    setup_logging()
    for line in _report_lines(report):
        log.info("%s", line)
    from pocketmq.nameserver.app import NameServer
    install_uvloop()
    try:
        asyncio.run(run_until_signal(NameServer(config)))
    except KeyboardInterrupt:  # a second Ctrl-C while closing
        return 0
    except Exception as e:  # bind failure, unreadable kvConfig.json...
        log.error("The Name Server failed: %s: %s", type(e).__name__, e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
