"""The message index built right behind the dispatcher, on the event loop (IndexPump).

The store's index (broker/store/index.py) is derived data: the flush thread walks
what the dispatcher has passed once a second, at most indexBuildBatchNums records
a pass. Alone, that lets the index lag under load by whole seconds of messages, and
the work of indexing them lands later on whatever the broker does then: measured, a
consumer reading a topic just filled paid ~5 µs of broker CPU per message for the
fill's index (13.1 against 7.7 µs per message once the index had caught up), and
the flush thread took the GIL from the loop in 64-record slices while it worked.

So the loop indexes as it dispatches, like Java's reput thread (whose dispatchers
build the index per message): after a dispatch, once `backlog_bytes` of commit log
wait to be indexed, one step of at most `step_records` records runs as a loop
callback (after the replies of the current read are written, between reads), and
steps follow one another while that much is waiting. The cost of indexing a
message is then paid by the broker while it stores such messages, and the tail
below `backlog_bytes` is left to the flush thread's pass and to queries (which catch
up first). A step is short (~32 records: a fraction of a millisecond) so requests
interleave with a long catch-up instead of waiting behind it; no lock is held
across steps.
"""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("pocketmq.broker.index")


class IndexPump:
    # Records per step: long enough to amortise a step's fixed cost (~10 µs: the index
    # lock, the segment lookup), short enough that a request waits at most ~0.2 ms behind it.
    step_records = 32
    # Start stepping once this much commit log waits: sync sends index in groups of
    # about this size instead of one record per step.
    backlog_bytes = 8192

    def __init__(self, store) -> None:
        self.store = store
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._closed = False
        self.steps = 0              # steps run (tests, stats)
        self.records = 0            # records walked by them

    def kick(self) -> None:
        """Called after a dispatch (on the loop): schedule a step if enough waits."""
        if self._scheduled or self._closed:
            return
        if self.store.index_backlog_bytes() < self.backlog_bytes:
            return
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._scheduled = True
        self._loop.call_soon(self._step)

    def _step(self) -> None:
        self._scheduled = False
        if self._closed:
            return
        store = self.store
        try:
            n = store.index_some(self.step_records)
        except Exception:       # a closed or failed store: the flush pass and queries decide
            log.exception("message index step failed")
            return
        self.steps += 1
        self.records += n
        if n and store.index_backlog_bytes() >= self.backlog_bytes and not self._closed:
            self._scheduled = True
            self._loop.call_soon(self._step)

    def close(self) -> None:
        self._closed = True
