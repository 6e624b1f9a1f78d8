"""Commit-log flushing: periodic fdatasync (ASYNC_FLUSH) or group commit (SYNC_FLUSH).

The store's `flush()` runs in this service's thread (it may block on disk)
while the event loop keeps appending. SYNC_FLUSH: a send waits on
`wait_flushed(end_offset)`; the thread flushes whatever has been appended
since its last pass, so all sends that arrived during one fdatasync are
acknowledged by the next (group commit). A failed flush makes the store
refuse writes until restart; waiters then get None.

A waiter's timeout (syncFlushTimeout) is not a timer of its own: the deadlines
sit in one heap swept by a single loop timer armed for the earliest one
(`asyncio.wait_for(asyncio.shield(...))` per send cost ~6 µs of the loop's CPU
a send). Entries of answered waiters are dropped from the heap's top as new
ones arrive (they are answered in offset order, which is deadline order for
one timeout), and the heap is rebuilt without them if it still grows past
twice `waiters_max`.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time

log = logging.getLogger("pocketmq.broker.flush")


class FlushService:
    def __init__(self, store, *, sync: bool, interval_ms: int = 500, waiters_max: int = 100_000, latency=None):
        self.store = store
        self.latency = latency   # a LatencyHistogram (remoting/metrics.py) observing each flush, or None
        self.sync = sync
        self.interval_s = max(0.001, interval_ms / 1000)
        self.waiters_max = waiters_max
        self._waiters: list = []   # heap of (end_offset, seq, future)
        self._deadlines: list = []  # heap of (loop time, seq, future): the waiters' timeouts
        self._timer: asyncio.TimerHandle | None = None    # armed for the earliest deadline
        self._seq = itertools.count()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.failed = False
        self.flushed_offset = 0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="pocketmq-flush", daemon=True)
        self._thread.start()

    async def wait_flushed(self, end_offset: int, timeout_s: float):
        """True when flushed, False on timeout, None when the store failed."""
        if self.failed:
            return None
        if self.flushed_offset >= end_offset:
            return True
        if len(self._waiters) >= self.waiters_max:
            return False
        loop = self._loop
        fut = loop.create_future()
        seq = next(self._seq)
        heapq.heappush(self._waiters, (end_offset, seq, fut))
        self._add_deadline(loop.time() + timeout_s, seq, fut)
        self._wake.set()
        # True / None from _release, False from _expire; a cancelled caller cancels fut,
        # which both skip
        return await fut

    def _add_deadline(self, deadline: float, seq: int, fut) -> None:
        d = self._deadlines
        while d and d[0][2].done():         # answered: usually all but the newest few
            heapq.heappop(d)
        if len(d) >= 2 * self.waiters_max:  # answered ones behind a longer timeout
            d[:] = [e for e in d if not e[2].done()]
            heapq.heapify(d)
        heapq.heappush(d, (deadline, seq, fut))
        if self._timer is None or deadline < self._timer.when():
            self._arm(d[0][0])

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(at, self._expire)

    def _expire(self) -> None:
        """The timer: waiters past their deadline get False; then re-armed for the next."""
        self._timer = None
        d = self._deadlines
        now = self._loop.time()
        while d and (d[0][0] <= now or d[0][2].done()):
            _, _, fut = heapq.heappop(d)
            if not fut.done():
                fut.set_result(False)
        if d:
            self._arm(d[0][0])

    def _release(self, flushed: int, failed: bool) -> None:
        # Runs on the loop thread.
        self.flushed_offset = max(self.flushed_offset, flushed)
        w = self._waiters
        if failed:
            self.failed = True
            while w:
                _, _, fut = heapq.heappop(w)
                if not fut.done():
                    fut.set_result(None)
            return
        while w and w[0][0] <= self.flushed_offset:
            _, _, fut = heapq.heappop(w)
            if not fut.done():
                fut.set_result(True)

    CQ_FLUSH_INTERVAL_S = 1.0   # consume queues are rebuilt from the commit log; flush them lazily

    def _run(self) -> None:
        next_cq_flush = time.monotonic() + self.CQ_FLUSH_INTERVAL_S
        while not self._stop:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop:
                break
            self._flush_once()
            if time.monotonic() >= next_cq_flush and not self.failed:
                next_cq_flush = time.monotonic() + self.CQ_FLUSH_INTERVAL_S
                try:
                    self.store.flush_consume_queues()
                except Exception:
                    log.exception("consume queue flush failed")

    def _flush_once(self) -> None:
        if self.failed:
            return   # never retry a failed fsync; the store refuses writes until restart
        try:
            t0 = time.perf_counter()
            flushed = self.store.flush()
            if self.latency is not None:
                self.latency.observe(time.perf_counter() - t0)
            failed = False
        except Exception:
            log.exception("commit log flush failed; the store stops accepting writes until restart")
            flushed, failed = self.flushed_offset, True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._release, flushed, failed)
            except RuntimeError:
                pass

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
