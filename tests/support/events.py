"""Awaitable test conditions: wake on the change that can make them true, never poll.

    got = Sink()                         # listeners append to it (from any thread)
    await got.until(lambda s: len(s) == 10)

Bound the wait with the test's own `asyncio.timeout(...)`.
"""
from __future__ import annotations

import asyncio
import threading


class Waiters:
    """Futures waiting for a predicate; `check()` after every change resolves the true ones."""

    def __init__(self):
        self._waiting: list = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def check(self) -> None:
        loop = self._loop
        if loop is None or not self._waiting:
            return
        if threading.get_ident() != self._thread:
            loop.call_soon_threadsafe(self._check)   # a listener running in a worker thread
            return
        self._check()

    def _check(self) -> None:
        for pred, fut in list(self._waiting):
            if not fut.done() and pred():
                fut.set_result(None)

    async def until(self, pred) -> None:
        # Register before the first check: a change made by another thread in between
        # then either is seen by that check or schedules one.
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        fut = self._loop.create_future()
        entry = (pred, fut)
        self._waiting.append(entry)
        try:
            if not pred():
                await fut
        finally:
            self._waiting.remove(entry)


class Sink(list):
    """A list whose append/extend wake `until(pred)` waiters (pred gets the list)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.waiters = Waiters()

    def append(self, item) -> None:
        super().append(item)
        self.waiters.check()

    def extend(self, items) -> None:
        super().extend(items)
        self.waiters.check()

    async def until(self, pred) -> None:
        await self.waiters.until(lambda: pred(self))


def pump_json_lines(proc, sink: Sink) -> threading.Thread:
    """Feed a subprocess's JSON-object lines (stdout, text mode) into `sink` as they come,
    from a daemon thread (tests/interop/cpp_agent.py prints one object per event)."""
    import json

    def run():
        for line in proc.stdout:
            if line.startswith("{"):
                sink.append(json.loads(line))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t
