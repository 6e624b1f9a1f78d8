"""Commit-log page warming: the pages just past the write position are read into the page
cache from this service's thread, so the event loop's writes find them there.

A segment is preallocated (posix_fallocate: unwritten extents), so the first write to each
of its pages faults: the kernel allocates a page, zeroes it and does the file system's
bookkeeping, on the event loop's time. Read ahead of the writer (a pread, the GIL
released) the page is found in the page cache instead: the write still faults (the
shared mapping's page_mkwrite), but the allocation and the zeroing were done by this
thread (docs/benchmarks.md, issue 35: the event loop's CPU a message with 64 sends in
flight, lower; about as much again on this thread).

Which bytes and when to wake are the commit log's rule (`CommitLog.warm_step`,
`warm_span`); the read is the store's (`warm_commit_log`: the step under its file lock,
the read on a descriptor of its own, so a flush never waits behind it); this module owns
only the thread. The writer wakes it when it reaches the mark the last
warming left (half the distance ahead), so an idle broker's warmer sleeps.
`commitLogWarmAheadBytes` (pocketmq's own; 0 = off) is how far ahead.
"""
from __future__ import annotations

import logging
import threading

from pocketmq.broker.config import BrokerRole

log = logging.getLogger("pocketmq.broker.warm")

# Bytes read a system call (and the buffer's size): 1 MiB and 256 KiB measured alike.
CHUNK = 1 << 20


def warm_ahead_bytes(config) -> int:
    """How far ahead a broker of this config warms: commitLogWarmAheadBytes, 0 on a slave
    (its replicated bytes are written with pwrite, which does not fault)."""
    return 0 if config.brokerRole is BrokerRole.SLAVE else config.commitLogWarmAheadBytes


class PageWarmer:
    def __init__(self, store, ahead_bytes: int) -> None:
        self.store = store
        self.ahead = ahead_bytes
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.warmed_bytes = 0           # read into the page cache so far

    def start(self) -> None:
        if self.ahead <= 0:
            return
        self.store.set_warm_waker(self._wake.set)
        self._thread = threading.Thread(target=self._run, name="pocketmq-warm", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        buf = memoryview(bytearray(CHUNK))
        while not self._stop:
            try:
                while not self._stop:
                    n = self.store.warm_commit_log(self.ahead, buf)
                    if not n:
                        break
                    self.warmed_bytes += n
            except Exception:
                log.exception("commit-log page warming failed")
                # the writer reset its mark when it woke us: re-arm it, or warming stops
                self.store.set_warm_waker(self._wake.set)
            self._wake.wait()
            self._wake.clear()
        self.store.end_warming()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
