"""Sends waiting for an offset to be reached: the flush's group commit (SYNC_FLUSH) and the
slaves' acks (SYNC_MASTER) share this one mechanism.

A waiter is a future answered True once `release(offset)` reaches its end offset, False
at its deadline, None when `fail()` says the offset will never come. The deadlines are not
a timer each: they sit in one heap swept by a single loop timer armed for the earliest one
(`asyncio.wait_for(asyncio.shield(...))` per send cost ~6 µs of the loop's CPU a send).
Entries of answered waiters are dropped from the heap's top as new ones arrive (they are
answered in offset order, which is deadline order for one timeout), and the heap is rebuilt
without them if it still grows past twice `waiters_max`. More than `waiters_max` waiting
answers False at once (the send is stored; its wait is what is refused).

Loop thread only.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools

__all__ = ["OffsetWaiters"]


class OffsetWaiters:
    def __init__(self, waiters_max: int = 100_000) -> None:
        self.waiters_max = waiters_max
        self.reached = 0
        self._waiters: list = []    # heap of (end_offset, seq, future)
        self._deadlines: list = []  # heap of (loop time, seq, future): the waiters' timeouts
        self._timer: asyncio.TimerHandle | None = None    # armed for the earliest deadline
        self._seq = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._waiters)

    def waiter(self, end_offset: int, timeout_s: float) -> asyncio.Future:
        """A future: True once `end_offset` is reached, False after `timeout_s`, None on fail()."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if self.reached >= end_offset:
            fut.set_result(True)
            return fut
        if len(self._waiters) >= self.waiters_max:
            fut.set_result(False)
            return fut
        seq = next(self._seq)
        heapq.heappush(self._waiters, (end_offset, seq, fut))
        self._add_deadline(loop.time() + timeout_s, seq, fut)
        return fut

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

    def release(self, offset: int) -> None:
        """`offset` is reached: every waiter at or below it gets True."""
        if offset > self.reached:
            self.reached = offset
        w = self._waiters
        reached = self.reached
        while w and w[0][0] <= reached:
            _, _, fut = heapq.heappop(w)
            if not fut.done():
                fut.set_result(True)

    def fail(self) -> None:
        """Every waiter gets None (the offset will never be reached)."""
        w = self._waiters
        while w:
            _, _, fut = heapq.heappop(w)
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
