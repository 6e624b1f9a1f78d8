"""Headless Chromium for the console's browser tests: Debian's `chromium` driven by Playwright
for Python with `executable_path` (Playwright's own browser download is not used), and the
`pocketmq console` process under test.

`chromium_path()` is None when either is missing: the tests skip, saying which.
"""
from __future__ import annotations

import os
import re
import shutil
import sys

from tests.support.daemons import Daemon, free_port

READY_CONSOLE = re.compile(r"pocketmq console: (http://\S+) ")
CANDIDATES = ("/usr/bin/chromium", "/usr/lib/chromium/chromium", "/usr/bin/chromium-browser")


def chromium_path() -> str | None:
    env = os.environ.get("POCKETMQ_CHROMIUM")
    for p in ((env,) if env else ()) + CANDIDATES:
        if p and os.access(p, os.X_OK):
            return p
    return shutil.which("chromium")


def why_no_browser() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; no browser download needed)"
    if chromium_path() is None:
        return "no chromium binary (apt-get install chromium); .ci/run installs it"
    return None


def console_daemon(namesrv: str, log_dir: str, *args: str, name: str = "console") -> Daemon:
    """`pocketmq console` on a free loopback port; `.match.group(1)` is its URL once started."""
    port = free_port()
    return Daemon(name, ["console", "--namesrv", namesrv, "--port", str(port), *args], READY_CONSOLE,
                  os.path.join(log_dir, f"{name}.log"), command=[sys.executable, "-m", "pocketmq"])


class ConsoleErrors:
    """Collects a page's console errors and uncaught exceptions (a page must have none)."""

    def __init__(self, page):
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def take(self) -> list[str]:
        out, self.errors[:] = list(self.errors), []
        return out
