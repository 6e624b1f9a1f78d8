"""Time search in the file store: store timestamps of queue offsets, and the offset nearest
a time (get_offset_in_queue_by_time, RocketMQ's ConsumeQueue.getOffsetInQueueByTime).

A record's STORETIMESTAMP is read from the commit log (protocol.message.store_timestamp_at)
through the consume-queue unit pointing at it. The search picks the consume-queue file
by its last unit's store time (RocketMQ uses the file mtime) and binary-searches it by
logical offset (ConsumeQueue.file_ranges / unit_at).
"""
from __future__ import annotations

from pocketmq.protocol.message import store_timestamp_at
from pocketmq.broker.store.api import CQ_FILLER_SIZE, nearest_by_time


class SearchPart:
    """MessageStore's time queries (a part of the MessageStore class: state in store.py)."""

    def _store_timestamp_at(self, phys: int, size: int) -> int:
        view = self._commitlog.read(phys, size)
        if view is None:
            return -1
        return store_timestamp_at(view, 0, size)

    def get_message_store_timestamp(self, topic: str, queue_id: int, offset: int) -> int:
        cq = self._find_cq(topic, queue_id)
        if cq is None:
            return -1
        u = cq.unit(offset)
        if u is None or u[1] == CQ_FILLER_SIZE:
            return -1
        return self._store_timestamp_at(u[0], u[1])

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        cq = self._find_cq(topic, queue_id)
        if cq is None or cq.min_offset >= cq.max_offset:
            return -1
        return self.get_message_store_timestamp(topic, queue_id, cq.min_offset)

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """Logical offset whose message's STORETIMESTAMP is nearest `timestamp` (RocketMQ's
        ConsumeQueue.getOffsetInQueueByTime; the file is chosen by its last unit's store time
        instead of the file mtime)."""
        cq = self._find_cq(topic, queue_id)
        if cq is None or cq.max_offset == 0 or not cq.has_files:
            return 0
        ranges = cq.file_ranges()
        unit_at = cq.unit_at
        chosen = None
        for first, end in ranges:
            if end == first:
                continue
            phys, size, _ = unit_at(end - 1)
            if self._store_timestamp_at(phys, size) >= timestamp:
                chosen = (first, end)
                break
        if chosen is None:
            chosen = ranges[-1]
        start, end = chosen
        # binary search over the chosen file's units, positions relative to its first unit
        low = cq.min_offset - start if cq.min_offset > start else 0
        high = end - start - 1
        cl_min = self._commitlog.min_offset

        def ts_at(pos: int) -> int | None:
            phys, size, _ = unit_at(start + pos)
            if phys < cl_min or size == CQ_FILLER_SIZE:
                return None
            return self._store_timestamp_at(phys, size)
        pos = nearest_by_time(low, high, timestamp, ts_at)
        if pos is None:
            return 0
        return cq.min_offset if pos < 0 else start + pos
