"""A process stopped the moment it prints its ready line: the test's wrapper (run with
`python -c`) replaces the module's `print` so that SIGTERM is sent to the process from
within the print of the first line starting with one of `prefixes`. No reader can be
faster, so a handler installed after the line (the default action: killed, exit -15) fails
such a test every time instead of once in a while."""
from __future__ import annotations

import builtins
import os
import signal


def signal_on_print(module, prefixes: tuple[str, ...], sig: int = signal.SIGTERM) -> None:
    def print_then_signal(*args, **kwargs):
        builtins.print(*args, **kwargs)
        if args and str(args[0]).startswith(prefixes):
            os.kill(os.getpid(), sig)
    module.print = print_then_signal


def wrapper(module_name: str, prefixes: tuple[str, ...]) -> str:
    """The `python -c` source that runs module_name's main(argv) with signal_on_print;
    run it from the checkout's root (it imports tests.support)."""
    return (f"import sys\nimport {module_name} as m\n"
            f"from tests.support.ready_signal import signal_on_print\n"
            f"signal_on_print(m, {prefixes!r})\nsys.exit(m.main(sys.argv[1:]))\n")
