"""Delivers timer messages at their time (shell over broker.core.timer's TimerSchedule).

One task does everything, in bounded slices with a loop turn between them, so sends and
pulls keep being served while it catches up after a restart or a burst:

- *enqueue*: reads new entries of rmq_sys_wheel_timer queue 0 (woken by the dispatcher)
  into the schedule, at most SLICE per turn;
- *reload*: when most of the in-memory schedule is delivered and messages beyond its
  horizon wait in the queue, rescans the queue for the next ones (RELOAD_SLICE per turn);
- *deliver*: writes every due message to its real topic and queue, at most SLICE per turn,
  never one whose TIMER_OUT_MS has not come (by the broker's wall clock);
- *checkpoint*: at most every timerFlushIntervalMs, when something changed, appends the
  schedule's checkpoint to queue 1, and once more on close.

Between turns it sleeps until the earliest due time (to the millisecond, re-checking the
clock when it wakes: a timer firing early delivers nothing), a new entry, or the next
checkpoint. The rebuild at start reads only the last checkpoint record; the queue itself
is then read by the enqueue slices. See docs/broker.md, "Timer messages".
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from pocketmq.broker.core.status import PUT_NEVER_STORABLE
from pocketmq.broker.core.timer import (CHECKPOINT_QUEUE, TIMER_QUEUE, TimerCheckpoint, TimerSchedule,
                                        parked_deliver_ms, unpark)
from pocketmq.broker.store.api import MessageToStore, PutMessageStatus, Store
from pocketmq.common.constants import TIMER_TOPIC
from pocketmq.protocol import message as msgcodec
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.broker.timer")

SLICE = 256               # entries read, or messages delivered, per loop turn
RELOAD_SLICE = 1024       # entries rescanned per loop turn (ahead of the enqueue slice)
READ_BATCH = 64           # entries per store read
CHECKPOINTS_SCANNED = 8   # damaged checkpoint records skipped at start before giving up
RETRY_MS = 1000           # after the store refused a delivery


class TimerService:
    def __init__(self, store: Store, *, capacity: int, born_host: tuple[bytes, int],
                 now_ms: Callable[[], int], checkpoint_interval_ms: int = 1000):
        self.store = store
        self.capacity = capacity
        self.born_host = born_host
        self.now_ms = now_ms
        self.checkpoint_interval_ms = max(1, checkpoint_interval_ms)
        self.schedule: TimerSchedule | None = None
        self._event = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._changes = 0              # schedule changes (entries read, messages delivered)
        self._changes_written = 0      # ... covered by the last checkpoint written
        self._last_written: TimerCheckpoint | None = None
        self._next_checkpoint_ms = 0
        self._blocked_until_ms = 0     # the store refused a delivery: try again then
        self.delivered = 0
        self.dropped = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def rebuild(self) -> None:
        """Start from the last checkpoint in the commit log (none: from the queue's start)."""
        cp = self._last_checkpoint()
        start = cp.low_offset if cp is not None else 0
        start = max(start, self.store.get_min_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE))
        self.schedule = TimerSchedule(self.capacity, start, cp)
        self._last_written = cp
        backlog = self.store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE) - start
        if cp is not None or backlog:
            log.info("timer: rebuilding from queue offset %d (%d entries to read; checkpoint %s)",
                     start, max(0, backlog), cp)

    def start(self) -> None:
        if self.schedule is None:
            self.rebuild()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="timer-service")

    def wake(self) -> None:
        self._event.set()

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self.schedule is not None and self.store.is_open:
            # a clean stop records everything delivered: no duplicates after it
            self._checkpoint(self.now_ms(), force=True)

    @property
    def waiting(self) -> int:
        """Timer messages not yet delivered: read into the schedule, plus not yet read."""
        s = self.schedule
        if s is None:
            return 0
        unread = self.store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE) - s.enqueue_offset
        return s.size + max(0, unread)

    # -- the loop ----------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self._event.clear()
            try:
                more = self.step()
            except Exception:
                log.exception("timer pass failed")
                more, self._blocked_until_ms = False, self.now_ms() + RETRY_MS
            if more:
                await asyncio.sleep(0)    # let requests through, then go on
                continue
            wait_ms = self._wait_ms(self.now_ms())
            if wait_ms is None:
                await self._event.wait()
                continue
            try:
                async with asyncio.timeout(wait_ms / 1000):
                    await self._event.wait()
            except TimeoutError:
                pass

    def _wait_ms(self, now: int) -> int | None:
        """How long nothing is to be done (None: until woken)."""
        waits = []
        due = self.schedule.next_due_ms()
        if due is not None:
            waits.append(max(due, self._blocked_until_ms) - now)
        if self._changes != self._changes_written:
            waits.append(self._next_checkpoint_ms - now)
        return max(0, min(waits)) if waits else None

    def step(self) -> bool:
        """One turn; True when more work is waiting now."""
        more = self._enqueue(SLICE)
        s = self.schedule
        if s.needs_reload():
            s.begin_reload()
        if s.reloading:
            more = self._reload(RELOAD_SLICE) or more
        now = self.now_ms()
        if now >= self._blocked_until_ms:
            more = self._deliver(now, SLICE) or more
        self._checkpoint(self.now_ms())
        return more

    # -- reading the queue -------------------------------------------------------------------
    def _read(self, queue_id: int, offset: int, n: int) -> tuple[list, int]:
        """(records from `offset`, the offset after them); a hole is skipped."""
        r = self.store.get_message(TIMER_TOPIC, queue_id, offset, n)
        if r.message_count == 0:
            nxt = r.next_begin_offset
            if nxt <= offset:
                log.error("timer: %s/%d offset %d cannot be read (%s); skipped", TIMER_TOPIC, queue_id, offset,
                          r.status.name)
                nxt = offset + 1
            return [], nxt
        records = msgcodec.decode_records(b"".join(r.buffers), decompress=False)
        return records, records[-1].queue_offset + 1

    def _entries(self, start: int, end: int, limit: int):
        """(offset, deliver_ms) of queue 0's entries in [start, end), at most `limit`;
        then (next offset, None)."""
        offset, done = start, 0
        while offset < end and done < limit:
            records, nxt = self._read(TIMER_QUEUE, offset, min(READ_BATCH, limit - done, end - offset))
            for rec in records:
                yield rec.queue_offset, parked_deliver_ms(rec.properties, rec.store_timestamp)
            done += max(1, len(records))
            offset = nxt
        yield offset, None

    def _enqueue(self, limit: int) -> bool:
        s = self.schedule
        end = self.store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE)
        if s.enqueue_offset >= end:
            return False
        for offset, at in self._entries(s.enqueue_offset, end, limit):
            if at is None:
                s.skip_to(offset)
            else:
                s.add(offset, at)
                self._changes += 1
        return s.enqueue_offset < end

    def _reload(self, limit: int) -> bool:
        s = self.schedule
        for offset, at in self._entries(s.reload_position(), s.enqueue_offset, limit):
            if at is None:
                s.reload_skip_to(offset)
            else:
                s.reload_add(offset, at)
        if s.reload_finish():
            log.info("timer: reloaded; %d in memory, %d deferred", len(s.heap), s.deferred)
            return False
        return True

    # -- delivering --------------------------------------------------------------------------
    def _deliver(self, now: int, limit: int) -> bool:
        s = self.schedule
        for key in s.pop_due(now, limit):
            if not self._deliver_one(key, now):
                s.put_back(key)
                self._blocked_until_ms = now + RETRY_MS
                return False
            self._changes += 1
        due = s.next_due_ms()
        return due is not None and due <= now

    def _deliver_one(self, key, now: int) -> bool:
        """False when the store refused a write it may take later."""
        offset = key[1]
        records, _ = self._read(TIMER_QUEUE, offset, 1)
        if not records or records[0].queue_offset != offset:
            log.error("timer message at %s offset %d is gone (files removed?); not delivered", TIMER_TOPIC, offset)
            self.dropped += 1
            return True
        rec = records[0]
        target = unpark(rec.properties, rec.store_timestamp, now)
        if target is None:
            log.error("timer message at commit-log offset %d has no REAL_TOPIC/REAL_QID; dropped",
                      rec.commit_log_offset)
            self.dropped += 1
            return True
        topic, qid, props = target
        result = self.store.put_message(MessageToStore(
            topic, qid, rec.flag, rec.body, props, rec.sys_flag, rec.born_timestamp,
            msgcodec.parse_host(rec.born_host), now, rec.reconsume_times))
        if result.status is not PutMessageStatus.PUT_OK:
            log.error("delivering a timer message to %s/%d failed: %s", topic, qid, result.status.name)
            if result.status in PUT_NEVER_STORABLE:
                self.dropped += 1
                return True
            return False
        self.delivered += 1
        return True

    # -- checkpoints -------------------------------------------------------------------------
    def _checkpoint(self, now: int, force: bool = False) -> None:
        if self._changes == self._changes_written or (not force and now < self._next_checkpoint_ms):
            return
        self._next_checkpoint_ms = now + self.checkpoint_interval_ms
        changes = self._changes
        cp = self.schedule.checkpoint()
        if cp is None or cp == self._last_written:
            self._changes_written = changes
            return
        result = self.store.put(TIMER_TOPIC, CHECKPOINT_QUEUE, 0, cp.encode(), b"", 0, now, self.born_host, now)
        if result.status is not PutMessageStatus.PUT_OK:
            log.warning("timer checkpoint not written: %s (tried again in %d ms)", result.status.name,
                        self.checkpoint_interval_ms)
            return
        self._last_written = cp
        self._changes_written = changes

    def _last_checkpoint(self) -> TimerCheckpoint | None:
        store = self.store
        end = store.get_max_offset_in_queue(TIMER_TOPIC, CHECKPOINT_QUEUE)
        first = max(store.get_min_offset_in_queue(TIMER_TOPIC, CHECKPOINT_QUEUE), end - CHECKPOINTS_SCANNED)
        for offset in range(end - 1, first - 1, -1):
            records, _ = self._read(CHECKPOINT_QUEUE, offset, 1)
            if not records:
                continue
            try:
                return TimerCheckpoint.decode(records[0].body)
            except ValueError as e:
                log.warning("timer: checkpoint at %s/%d offset %d skipped: %s", TIMER_TOPIC, CHECKPOINT_QUEUE,
                            offset, e)
        if end > 0:
            log.warning("timer: no readable checkpoint; rebuilding from the queue's start (messages already "
                        "delivered whose time has passed are delivered again)")
        return None
