"""Commit-log flushing: periodic fdatasync (ASYNC_FLUSH) or group commit (SYNC_FLUSH).

The store's `flush()` runs in this service's thread (it may block on disk)
while the event loop keeps appending. SYNC_FLUSH: a send waits on
`wait_flushed(end_offset)`; the thread flushes whatever has been appended
since its last pass, so all sends that arrived during one fdatasync are
acknowledged by the next (group commit). A failed flush makes the store
refuse writes until restart; waiters then get None.

A waiter's timeout (syncFlushTimeout) and the bookkeeping of many waiters are
services/waiters.py's `OffsetWaiters`, shared with SYNC_MASTER's wait for the slaves.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from pocketmq.broker.services.waiters import OffsetWaiters

log = logging.getLogger("pocketmq.broker.flush")


class FlushService:
    def __init__(self, store, *, sync: bool, interval_ms: int = 500, waiters_max: int = 100_000, latency=None):
        self.store = store
        self.latency = latency   # a LatencyHistogram (remoting/metrics.py) observing each flush, or None
        self.sync = sync
        self.interval_s = max(0.001, interval_ms / 1000)
        self._waiters = OffsetWaiters(waiters_max)
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
        fut = self._waiters.waiter(end_offset, timeout_s)
        self._wake.set()
        # True / None from _release, False at the deadline; a cancelled caller cancels fut,
        # which both skip
        return await fut

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _release(self, flushed: int, failed: bool) -> None:
        # Runs on the loop thread.
        self.flushed_offset = max(self.flushed_offset, flushed)
        if failed:
            self.failed = True
            self._waiters.fail()
            return
        self._waiters.release(self.flushed_offset)

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
        self._waiters.close()
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
