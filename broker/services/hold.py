"""Long-polling shell: answers held pulls when woken or when their time is up.

Wake-ups come from the reput dispatcher (`on_dispatch`, called on the loop
thread right after an append). The loop task sleeps until the earliest
deadline, capped by the rescan interval (5 s, or 1 s with short polling),
which re-checks every held pull against the queue max offsets in case a
notification was missed.

Answers go out in slices (`SLICE` pulls or `SLICE_S`) with the loop yielded in between
(expiry: `await asyncio.sleep(0)`; wake-ups: the rest queued with `call_soon`),
so 20,000 pulls expiring or woken together delay other clients' requests by one
slice, not by all of them.

The shell knows no processor: `replay(held)` (answer a held pull now, with
suspension disabled) is given by the composition root, as are the monotonic
clock of the deadlines and the store's queue max offset.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from time import perf_counter
from typing import Callable

from pocketmq.broker.core.held_pulls import HeldPull, HeldPullTable
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.broker.hold")

# Pulls answered per loop turn: at most SLICE, and no more once SLICE_S have passed
# (checked every 16). One replay (a store read and a write) costs 30-150 µs on the
# machines measured, so a slice keeps the loop for a few ms, even on a loaded host.
SLICE = 256
SLICE_S = 0.005


class HoldService:
    def __init__(self, table: HeldPullTable, replay: Callable[[HeldPull], None], *,
                 mono_ms: Callable[[], int], max_offset_of: Callable[[str, int], int],
                 rescan_interval_ms: int = 5000):
        self.table = table
        self.replay = replay
        self.mono_ms = mono_ms
        self.max_offset_of = max_offset_of
        self.rescan_interval_ms = rescan_interval_ms
        self._event = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._pending_notify: dict = {}
        self._notify_scheduled = False
        self._due: deque[HeldPull] = deque()     # woken, waiting for their slice
        self._drain_scheduled = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="hold-service")

    def wake(self) -> None:
        self._event.set()

    def on_dispatch(self, topic: str, queue_id: int, max_offset: int, tags_code, store_timestamp: int) -> None:
        if not self.table.count:
            return
        # Coalesce dispatches of one batch/loop turn: replay once per queue.
        key = (topic, queue_id)
        prev = self._pending_notify.get(key)
        if prev is None:
            self._pending_notify[key] = [max_offset, {tags_code}]
        else:
            prev[0] = max(prev[0], max_offset)
            prev[1].add(tags_code)
        if not self._notify_scheduled:
            self._notify_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_notify)

    def _flush_notify(self) -> None:
        self._notify_scheduled = False
        pending, self._pending_notify = self._pending_notify, {}
        due = self._due
        notify = self.table.notify
        for (topic, qid), (max_offset, codes) in pending.items():
            # A pull is taken once: a second code finds it gone from every index.
            for c in codes:
                due.extend(notify(topic, qid, max_offset, c))
        if not self._drain_scheduled:
            self._drain()

    def _drain(self) -> None:
        """Replay one slice of woken pulls; the rest after the loop's next I/O poll."""
        self._drain_scheduled = False
        due = self._due
        self._replay_slice(due.popleft() for _ in range(min(SLICE, len(due))))
        if due and not self._drain_scheduled:
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _replay_slice(self, pulls) -> int:
        """Replay pulls from the iterator until it ends or the slice's time is up; returns
        how many were replayed (the rest stay in the iterator)."""
        replay = self.replay
        end = perf_counter() + SLICE_S
        n = 0
        for p in pulls:
            try:
                replay(p)
            except Exception:
                log.exception("replay of a held pull failed")
            n += 1
            if not n & 15 and perf_counter() > end:
                break
        return n

    async def _answer(self, pulls: list[HeldPull]) -> None:
        i = 0
        while i < len(pulls):
            if i:
                await asyncio.sleep(0)
            i += self._replay_slice(iter(pulls[i:i + SLICE]))

    async def _run(self) -> None:
        table = self.table
        last_rescan_ms = self.mono_ms()
        while True:
            now_ms = self.mono_ms()
            nd = table.next_deadline_ms()
            wait_ms = self.rescan_interval_ms if nd is None else max(0, min(self.rescan_interval_ms, nd - now_ms))
            self._event.clear()
            try:
                async with asyncio.timeout(wait_ms / 1000):
                    await self._event.wait()
            except asyncio.TimeoutError:
                pass
            try:
                now_ms = self.mono_ms()
                while True:
                    expired = table.expire(now_ms, SLICE)
                    if not expired:
                        break
                    await self._answer(expired)
                    await asyncio.sleep(0)
                if now_ms - last_rescan_ms >= self.rescan_interval_ms:
                    last_rescan_ms = now_ms
                    await self._answer(table.stale(self.max_offset_of))
            except Exception:
                log.exception("hold service pass failed")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        # Answer everything still held so clients re-pull elsewhere instead of timing out.
        due, self._due = list(self._due), deque()
        await self._answer(due + self.table.drain_all())
