"""Process plumbing shared by the daemons: logging, uvloop, signals."""
from __future__ import annotations

import asyncio
import logging
import signal
import sys


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)-5s %(name)s - %(message)s")


def install_uvloop() -> None:
    try:
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # uvloop is a dependency, but keep the daemons usable without it
        logging.getLogger("pocketmq").warning("uvloop not available; using the default asyncio loop")


def tune_gc() -> None:
    """Fewer, later collections: the daemons allocate many short-lived objects per
    request and a full collection over a large heap is a latency spike (p99).
    Objects alive after start-up are frozen out of future collections."""
    import gc
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def stop_on_signal() -> asyncio.Event:
    """An event SIGTERM/SIGINT set from now on (in the running loop). A process that prints a
    ready line installs this before printing it: whoever reads the line may signal at once, and
    a signal before the handler is the default action (killed, exit -15), not a clean close."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def run_until_signal(*services, stop: asyncio.Event | None = None) -> None:
    """Start services (async context managers' start/close), run until SIGTERM/SIGINT (or `stop`,
    from stop_on_signal() called earlier), close in reverse."""
    if stop is None:
        stop = stop_on_signal()
    started = []
    try:
        for s in services:
            try:
                await s.start()
            except BaseException:
                # A half-started service holds sockets, files, threads: release them.
                try:
                    await s.close()
                except Exception:
                    logging.getLogger("pocketmq").debug("close after failed start failed", exc_info=True)
                raise
            started.append(s)
        tune_gc()
        await stop.wait()
    finally:
        for s in reversed(started):
            try:
                await s.close()
            except Exception:
                logging.getLogger("pocketmq").exception("error while closing %s", type(s).__name__)
