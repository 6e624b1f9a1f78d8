"""Long-polling shell: answers held pulls when woken or when their time is up.

Wake-ups come from the reput dispatcher (`on_dispatch`, called on the loop
thread right after an append). The loop task sleeps until the earliest
deadline, capped by the rescan interval (5 s, or 1 s with short polling),
which re-checks every held pull against the queue max offsets in case a
notification was missed.

The shell knows no processor: `replay(held)` (answer a held pull now, with
suspension disabled) is given by the composition root, as are the monotonic
clock of the deadlines and the store's queue max offset.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from pocketmq.broker.core.held_pulls import HeldPull, HeldPullTable
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.broker.hold")


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

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="hold-service")

    def wake(self) -> None:
        self._event.set()

    def on_dispatch(self, topic: str, queue_id: int, max_offset: int, tags_code, store_timestamp: int) -> None:
        if not self.table.by_queue:
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
        replay = self.replay
        for (topic, qid), (max_offset, codes) in pending.items():
            woken = []
            if len(codes) == 1:
                woken = self.table.notify(topic, qid, max_offset, next(iter(codes)))
            else:
                seen = set()
                for c in codes:
                    for p in self.table.notify(topic, qid, max_offset, c):
                        if id(p) not in seen:
                            seen.add(id(p))
                            woken.append(p)
            for p in woken:
                replay(p)

    async def _run(self) -> None:
        replay = self.replay
        last_rescan_ms = self.mono_ms()
        while True:
            now_ms = self.mono_ms()
            nd = self.table.next_deadline_ms()
            wait_ms = self.rescan_interval_ms if nd is None else max(0, min(self.rescan_interval_ms, nd - now_ms))
            self._event.clear()
            try:
                async with asyncio.timeout(wait_ms / 1000):
                    await self._event.wait()
            except asyncio.TimeoutError:
                pass
            try:
                now_ms = self.mono_ms()
                for p in self.table.expire(now_ms):
                    replay(p)
                if now_ms - last_rescan_ms >= self.rescan_interval_ms:
                    last_rescan_ms = now_ms
                    for p in self.table.stale(self.max_offset_of):
                        replay(p)
            except Exception:
                log.exception("hold service pass failed")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        # Answer everything still held so clients re-pull elsewhere instead of timing out.
        for p in self.table.drain_all():
            self.replay(p)
