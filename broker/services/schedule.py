"""Delivers delayed messages when their time comes (shell over broker.core.delay).

One task walks each delay level's queue of SCHEDULE_TOPIC_XXXX from its cursor,
re-writes every due message to its real topic and queue, and advances the
cursor. Messages of one level are due in queue order (same delay, growing
store time), so a level stops at its first message not yet due. The task
sleeps until the earliest next delivery (at most 1 s) or until a new delayed
message is stored. Work per pass is bounded so sends keep being served.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from pocketmq.broker.core.delay import ScheduleCursors, from_schedule, is_due
from pocketmq.broker.core.status import PUT_NEVER_STORABLE
from pocketmq.broker.store.api import MessageToStore, PutMessageStatus, Store
from pocketmq.common.constants import SCHEDULE_TOPIC
from pocketmq.protocol import message as msgcodec
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.broker.schedule")

PASS_MESSAGES_MAX = 512   # per level per pass


class ScheduleService:
    def __init__(self, store: Store, cursors: ScheduleCursors, delay_levels_ms: tuple[int, ...], *,
                 now_ms: Callable[[], int]):
        self.store = store
        self.now_ms = now_ms
        self.cursors = cursors
        self.levels = delay_levels_ms
        self._event = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.delivered = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="schedule-service")

    def wake(self) -> None:
        self._event.set()

    async def close(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            self._event.clear()
            try:
                wait_ms = self.deliver_due(self.now_ms())
            except Exception:
                log.exception("schedule pass failed")
                wait_ms = 1000
            if wait_ms == 0:
                await asyncio.sleep(0)   # more due: continue after letting requests through
                continue
            try:
                async with asyncio.timeout(min(wait_ms, 1000) / 1000):
                    await self._event.wait()
            except TimeoutError:
                pass

    def deliver_due(self, now_ms: int) -> int:
        """Deliver what is due; returns ms until the next delivery (0 = more due now)."""
        store = self.store
        next_ms = 1000
        for level, delay_ms in enumerate(self.levels, start=1):
            qid = level - 1
            offset = max(self.cursors.get(level), store.get_min_offset_in_queue(SCHEDULE_TOPIC, qid))
            max_offset = store.get_max_offset_in_queue(SCHEDULE_TOPIC, qid)
            offset, next_ms, stop_all = self._deliver_level(store, level, qid, delay_ms, offset, max_offset,
                                                            now_ms, next_ms)
            self.cursors.advance(level, offset)
            if stop_all:
                return 1000
        return next_ms

    def _deliver_level(self, store, level, qid, delay_ms, offset, max_offset, now_ms, next_ms):
        """Returns (new cursor, ms to next delivery, stop everything)."""
        done = 0
        while offset < max_offset:
            if done >= PASS_MESSAGES_MAX:
                return offset, 0, False
            r = store.get_message(SCHEDULE_TOPIC, qid, offset, 32)
            if r.message_count == 0:
                offset = r.next_begin_offset if r.next_begin_offset > offset else offset + 1
                continue
            records = msgcodec.decode_records(b"".join(r.buffers), decompress=False)
            for rec in records:
                deliver = rec.store_timestamp + delay_ms
                if not is_due(deliver, now_ms, delay_ms):
                    return offset, min(next_ms, deliver - now_ms), False
                if not self._deliver(rec, now_ms):
                    return offset, next_ms, True      # the store refuses writes: try again later
                offset = rec.queue_offset + 1
                # Advanced per message: if anything raises later, what was delivered is not
                # delivered again.
                self.cursors.advance(level, offset)
                done += 1
            if records and offset <= records[-1].queue_offset:
                offset = records[-1].queue_offset + 1
        return offset, next_ms, False

    def _deliver(self, rec, now_ms: int) -> bool:
        target = from_schedule(rec.properties)
        if target is None:
            log.error("delayed message at commit-log offset %d has no REAL_TOPIC/REAL_QID; dropped",
                      rec.commit_log_offset)
            return True
        topic, qid, props = target
        born_host = msgcodec.parse_host(rec.born_host)
        result = self.store.put_message(MessageToStore(
            topic, qid, rec.flag, rec.body, props, rec.sys_flag, rec.born_timestamp, born_host,
            now_ms, rec.reconsume_times))
        if result.status is not PutMessageStatus.PUT_OK:
            log.error("delivering a delayed message to %s/%d failed: %s", topic, qid, result.status.name)
            return result.status in PUT_NEVER_STORABLE   # never deliverable: skip it, go on
        self.delivered += 1
        return True
