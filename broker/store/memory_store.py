"""MemoryStore: the storage engine's public API over plain Python containers.

It is the reference the file store is tested against (same inputs -> same results, byte for
byte), and a quick store for broker tests. It keeps the file store's geometry as arithmetic
(segment roll-over with an 8-byte blank marker, consume-queue "files" of N units) so physical
offsets, message ids and scan limits agree, but it is written the obvious way: one dict of
records, one list of units per queue, a per-message loop in get_message.

State survives close()/abandon()/open() (it is the "disk"). Test hooks model what a crash
or an operator can do to the file store: truncate_commit_log(offset), rebuild_consume_queues().
Segment "mtime" for clean_expired_files is the now_ms of the last write into the segment.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pocketmq.common.constants import SCHEDULE_TOPIC, CQ_UNIT_SIZE
from pocketmq.protocol.message import (BLANK_MARKER_SIZE, KEY_SEPARATOR, KEYS, MAX_INT, PORT_MAX,
                                       PROPERTIES_LENGTH_BYTES_MAX, TAGS, UNIQ_KEY, MessageSysFlag, decode_batch_body, decode_properties, decode_record,
                                       encode_record, host_flags, offset_msg_id, record_overhead,
                                       store_timestamp_at, tags_code)
from pocketmq.broker.store.api import (CleanResult, GetMessageResult, GetMessageStatus, MessageBatchToStore,
                                       MessageToStore, PutMessageResult, PutMessageStatus, QueryMessageResult,
                                       RecoveryReport, nearest_by_time, schedule_tags_code, valid_topic)

if TYPE_CHECKING:       # (a type only: the reference model imports nothing of the file store)
    from pocketmq.broker.store.store_config import StoreConfig

__all__ = ["MemoryStore"]

log = logging.getLogger("pocketmq.store")

_BLANK = BLANK_MARKER_SIZE
_UNIT = CQ_UNIT_SIZE
_indexed = MessageSysFlag.indexed


class _Queue:
    def __init__(self) -> None:
        self.units: list[tuple[int, int, int] | None] = []   # index = logical offset; None = filler
        self.min_offset = 0
        self.first_file = 0          # logical offset where the first kept "file" starts

    @property
    def max_offset(self) -> int:
        return len(self.units)


def _result(status: PutMessageStatus) -> PutMessageResult:
    return PutMessageResult(status)


class MemoryStore:
    def __init__(self, config: StoreConfig, *, on_dispatch=None) -> None:
        self.config = config
        self.on_dispatch = on_dispatch
        self._fs = config.mapped_file_size_commit_log
        self._upf = config.mapped_file_size_consume_queue // _UNIT
        self._delay_levels = config.delay_levels_ms
        self._max_record = min(config.max_message_size, self._fs - _BLANK)
        self._memory_limit = config.memory_bytes() * config.access_message_in_memory_max_ratio // 100
        self.records: dict[int, bytes] = {}
        self.wrote = 0
        self.min_segment = 0         # index of the first kept segment
        self.last_segment = -1       # index of the active segment (-1: none yet)
        self.segment_mtime: dict[int, int] = {}
        self.queues: dict[tuple[str, int], _Queue] = {}
        self.flushed = 0
        self._open = False
        self._abnormal = False
        self.failed: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> RecoveryReport:
        self._open = True
        report = RecoveryReport(self._abnormal, 0, self.wrote, self.commit_log_min_offset, self.wrote,
                                -1, -1, "", 0, 0, self.wrote, 0)
        self._abnormal = False
        return report

    def close(self) -> None:
        self.flushed = self.wrote
        self._open = False

    def abandon(self) -> None:
        self._open = False
        self._abnormal = True

    @property
    def is_open(self) -> bool:
        return self._open

    # ------------------------------------------------------------------ geometry

    @property
    def commit_log_min_offset(self) -> int:
        if self.last_segment < 0:
            return self.wrote
        return self.min_segment * self._fs

    @property
    def commit_log_max_offset(self) -> int:
        return self.wrote

    @property
    def flushed_offset(self) -> int:
        return self.flushed

    def flush(self) -> int:
        self.flushed = self.wrote
        return self.flushed

    def flush_consume_queues(self) -> int:
        return self.wrote

    def set_warm_waker(self, wake) -> None:
        pass                        # no files: nothing to warm

    def warm_commit_log(self, ahead: int, buf) -> int:
        return 0

    def end_warming(self) -> None:
        pass

    def catch_up_dispatch(self) -> bool:
        return True                 # dispatch happens in the put itself

    def index_backlog_bytes(self) -> int:
        return 0                    # queries scan the messages: no index to build

    def index_some(self, max_records: int) -> int:
        return 0

    def reput(self) -> int:
        return 0

    @property
    def reput_from_offset(self) -> int:
        return self.wrote

    def _reserve(self, size: int, now_ms: int) -> int:
        """Where a record of `size` bytes goes: the active segment if size + 8 fits in
        what is left of it, else the start of the next one (after a blank marker)."""
        fs = self._fs
        if self.last_segment < 0:
            self.last_segment = self.min_segment = self.wrote // fs
        pos = self.wrote - self.last_segment * fs
        if size + _BLANK > fs - pos:
            self.last_segment += 1
            self.wrote = self.last_segment * fs
        self.segment_mtime[self.last_segment] = now_ms
        return self.wrote

    # ------------------------------------------------------------------ put

    def _check(self, topic: str, born_host, sys_flag: int, now_ms: int, born_ts: int,
               reconsume: int, prepared: int):
        if not valid_topic(topic):
            return None
        if len(born_host[0]) not in (4, 16) or not 0 <= born_host[1] <= PORT_MAX:
            return None
        if now_ms < 0 or born_ts < 0 or reconsume < 0 or prepared < 0:
            return None
        return host_flags(sys_flag, len(born_host[0]), len(self.config.store_host[0]))

    def _queue(self, topic: str, queue_id: int) -> _Queue:
        q = self.queues.get((topic, queue_id))
        if q is None:
            q = self.queues[(topic, queue_id)] = _Queue()
        return q

    def _code(self, topic: str, queue_id: int, props: str, now: int) -> int:
        return self._code_from_tags(topic, queue_id, decode_properties(props).get(TAGS), now)

    def _code_from_tags(self, topic: str, queue_id: int, tags: str | None, now: int) -> int:
        if topic == SCHEDULE_TOPIC:
            return schedule_tags_code(queue_id, now, self._delay_levels)
        return tags_code(tags)

    def _dispatch(self, topic, queue_id, queue_offset, phys, size, code, now) -> None:
        q = self._queue(topic, queue_id)
        if queue_offset < q.max_offset:
            return
        if queue_offset > q.max_offset:
            if q.max_offset == 0:
                q.first_file = queue_offset - queue_offset % self._upf
                q.min_offset = queue_offset
            else:
                log.error("memory store: gap in %s/%d before %d", topic, queue_id, queue_offset)
            q.units.extend([None] * (queue_offset - q.max_offset))
        q.units.append((phys, size, code))
        if self.on_dispatch is not None:
            self.on_dispatch(topic, queue_id, q.max_offset, code, now)

    def put_message(self, msg: MessageToStore) -> PutMessageResult:
        if self.failed is not None or not self._open:
            return _result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        sys_flag = self._check(msg.topic, msg.born_host, msg.sys_flag, msg.now_ms, msg.born_timestamp,
                               msg.reconsume_times, msg.prepared_transaction_offset)
        if sys_flag is None:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        if msg.properties_str.endswith("\x00"):
            msg = msg._replace(properties_str=msg.properties_str + "\x02")
        if len(msg.properties_str.encode()) > PROPERTIES_LENGTH_BYTES_MAX:
            return _result(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
        size = (record_overhead(sys_flag) + len(msg.body) + len(msg.topic.encode())
                + len(msg.properties_str.encode()))
        if size > self._max_record or not 0 <= msg.queue_id <= MAX_INT:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        dispatched = _indexed(sys_flag)
        queue_offset = self._queue(msg.topic, msg.queue_id).max_offset if dispatched else 0
        phys = self._reserve(size, msg.now_ms)
        rec = encode_record(msg.topic, msg.queue_id, msg.flag, msg.body, msg.properties_str, sys_flag,
                            msg.born_timestamp, msg.born_host, self.config.store_host,
                            msg.reconsume_times, msg.prepared_transaction_offset, queue_offset,
                            phys, msg.now_ms)
        assert len(rec) == size
        self.records[phys] = rec
        self.wrote = phys + size
        if dispatched:
            self._dispatch(msg.topic, msg.queue_id, queue_offset, phys, size,
                           self._code(msg.topic, msg.queue_id, msg.properties_str, msg.now_ms), msg.now_ms)
        return PutMessageResult(PutMessageStatus.PUT_OK, phys, size, queue_offset,
                                offset_msg_id(*self.config.store_host, phys), msg.now_ms, 1)

    def put(self, topic, queue_id, flag, body, props_b, sys_flag, born_timestamp, born_host, now,
            reconsume_times=0, prepared_transaction_offset=0) -> PutMessageResult:
        return self.put_message(MessageToStore(topic, queue_id, flag, body, props_b.decode(), sys_flag,
                                               born_timestamp, born_host, now, reconsume_times,
                                               prepared_transaction_offset))

    def put_batch_body(self, topic, queue_id, sys_flag, born_timestamp, born_host, now, body,
                       append_properties=b"", reconsume_times=0, body_bytes_max=None) -> PutMessageResult:
        # the file store's order: batch-level checks, then the body
        if self.failed is not None or not self._open:
            return _result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        checked = self._check(topic, born_host, sys_flag, now, born_timestamp, reconsume_times, 0)
        if checked is None or checked & MessageSysFlag.TRANSACTION_MASK or not 0 <= queue_id <= MAX_INT:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        records = decode_batch_body(body, raw_properties=True, append_properties=append_properties,
                                    body_bytes_max=body_bytes_max)
        return self.put_messages(MessageBatchToStore(topic, queue_id, sys_flag, born_timestamp, born_host,
                                                     now, records, reconsume_times))

    def put_messages(self, batch: MessageBatchToStore) -> PutMessageResult:
        if self.failed is not None or not self._open:
            return _result(PutMessageStatus.SERVICE_NOT_AVAILABLE)
        sys_flag = self._check(batch.topic, batch.born_host, batch.sys_flag, batch.now_ms,
                               batch.born_timestamp, batch.reconsume_times, 0)
        if (sys_flag is None or not batch.messages or sys_flag & MessageSysFlag.TRANSACTION_MASK
                or not 0 <= batch.queue_id <= MAX_INT):
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        sizes = []
        if any(type(p) is bytes for _f, _b, p in batch.messages):   # the file store takes bytes too
            batch = batch._replace(messages=[(f, b, p.decode() if type(p) is bytes else p)
                                             for f, b, p in batch.messages])
        batch = batch._replace(messages=[(f, b, p + "\x02" if p.endswith("\x00") else p)
                                         for f, b, p in batch.messages])
        for _flag, body, props in batch.messages:
            if len(props.encode()) > PROPERTIES_LENGTH_BYTES_MAX:
                return _result(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
            size = record_overhead(sys_flag) + len(body) + len(batch.topic.encode()) + len(props.encode())
            if size > self._max_record:
                return _result(PutMessageStatus.MESSAGE_ILLEGAL)
            sizes.append(size)
        total = sum(sizes)
        if total + _BLANK > self._fs:
            return _result(PutMessageStatus.MESSAGE_ILLEGAL)
        q = self._queue(batch.topic, batch.queue_id)
        qo0 = q.max_offset
        phys = phys0 = self._reserve(total, batch.now_ms)
        ids = []
        for i, ((flag, body, props), size) in enumerate(zip(batch.messages, sizes)):
            rec = encode_record(batch.topic, batch.queue_id, flag, body, props, sys_flag,
                                batch.born_timestamp, batch.born_host, self.config.store_host,
                                batch.reconsume_times, 0, qo0 + i, phys, batch.now_ms)
            self.records[phys] = rec
            self._dispatch(batch.topic, batch.queue_id, qo0 + i, phys, size,
                           self._code(batch.topic, batch.queue_id, props, batch.now_ms), batch.now_ms)
            ids.append(offset_msg_id(*self.config.store_host, phys))
            phys += size
        self.wrote = phys
        return PutMessageResult(PutMessageStatus.PUT_OK, phys0, total, qo0, ",".join(ids),
                                batch.now_ms, len(sizes))

    # ------------------------------------------------------------------ get

    def get_message(self, topic, queue_id, offset, max_msg_nums, message_filter=None,
                    record_filter=None) -> GetMessageResult:
        q = self.queues.get((topic, queue_id))
        mn = q.min_offset if q else 0
        mx = q.max_offset if q else 0
        S = GetMessageStatus
        if mx == 0:
            return GetMessageResult(S.NO_MESSAGE_IN_QUEUE, 0, mn, mx)
        if offset < mn:
            return GetMessageResult(S.OFFSET_TOO_SMALL, mn, mn, mx)
        if offset == mx:
            return GetMessageResult(S.OFFSET_OVERFLOW_ONE, offset, mn, mx)
        if offset > mx:
            return GetMessageResult(S.OFFSET_OVERFLOW_BADLY, mn if mn == 0 else mx, mn, mx)
        file_end = offset - offset % self._upf + self._upf
        scan_end = min(mx, file_end, offset + max(16000, max_msg_nums * _UNIT) // _UNIT)
        cfg = self.config
        status = S.NO_MATCHED_MESSAGE
        buffers = []
        total = 0
        next_file = None
        i = offset
        while i < scan_end:
            unit = q.units[i]
            if unit is None:
                i += 1
                continue
            phys, size, code = unit
            if next_file is not None and phys < next_file:
                i += 1
                continue
            in_disk = self.wrote - phys > self._memory_limit
            n = len(buffers)
            if n:
                if n >= max_msg_nums:
                    break
                max_bytes = cfg.max_transfer_bytes_on_message_in_disk if in_disk else cfg.max_transfer_bytes_on_message_in_memory
                max_count = cfg.max_transfer_count_on_message_in_disk if in_disk else cfg.max_transfer_count_on_message_in_memory
                if total + size > max_bytes or n >= max_count:
                    break
            if message_filter is not None and not message_filter(code):
                i += 1
                continue
            rec = self.records.get(phys)
            if rec is None or len(rec) != size:
                if total == 0:
                    status = S.MESSAGE_WAS_REMOVING
                next_file = phys - phys % self._fs + self._fs
                i += 1
                continue
            if record_filter is not None and not record_filter(rec, 0):
                if total == 0:
                    status = S.NO_MATCHED_MESSAGE
                i += 1
                continue
            buffers.append(rec)
            total += size
            status = S.FOUND
            next_file = None
            i += 1
        return GetMessageResult(status, i, mn, mx, len(buffers), buffers, total)

    # ------------------------------------------------------------------ queries

    def get_max_offset_in_queue(self, topic, queue_id) -> int:
        q = self.queues.get((topic, queue_id))
        return q.max_offset if q else 0

    def get_min_offset_in_queue(self, topic, queue_id) -> int:
        q = self.queues.get((topic, queue_id))
        return q.min_offset if q else 0

    def _ts(self, phys: int) -> int:
        rec = self.records.get(phys)
        if rec is None:
            return -1
        return store_timestamp_at(rec)

    def get_message_store_timestamp(self, topic, queue_id, offset) -> int:
        q = self.queues.get((topic, queue_id))
        if q is None or not q.min_offset <= offset < q.max_offset or q.units[offset] is None:
            return -1
        return self._ts(q.units[offset][0])

    def get_earliest_message_time(self, topic, queue_id) -> int:
        q = self.queues.get((topic, queue_id))
        if q is None or q.min_offset >= q.max_offset:
            return -1
        return self.get_message_store_timestamp(topic, queue_id, q.min_offset)

    def get_offset_in_queue_by_time(self, topic, queue_id, timestamp) -> int:
        """Same rules as MessageStore (RocketMQ's binary search inside one queue file)."""
        q = self.queues.get((topic, queue_id))
        if q is None or q.max_offset == 0:
            return 0
        first, last = q.first_file, (q.max_offset - 1) // self._upf * self._upf
        chosen = last
        for start in range(first, last + 1, self._upf):
            end = min(start + self._upf, q.max_offset)
            u = q.units[end - 1]
            if u is not None and self._ts(u[0]) >= timestamp:
                chosen = start
                break
        end = min(chosen + self._upf, q.max_offset)
        low = max(q.min_offset - chosen, 0)
        high = end - chosen - 1
        cl_min = self.commit_log_min_offset

        def ts_at(pos: int) -> int | None:
            u = q.units[chosen + pos]
            if u is None or u[0] < cl_min:
                return None
            return self._ts(u[0])
        pos = nearest_by_time(low, high, timestamp, ts_at)
        if pos is None:
            return 0
        return q.min_offset if pos < 0 else chosen + pos

    def look_message_by_offset(self, commit_log_offset: int) -> bytes | None:
        return self.records.get(commit_log_offset)

    def query_message(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> QueryMessageResult:
        """The file store's index query, the obvious way: every record, newest first."""
        out: list[int] = []
        limit = min(max_num, self.config.max_msgs_num_batch) if self.config.message_index_enable else 0
        last = (0, 0)
        for phys in sorted(self.records, reverse=True):
            m = decode_record(self.records[phys], decompress=False)
            if not _indexed(m.sys_flag):
                continue
            keys = [k for k in (m.properties.get(KEYS) or "").split(KEY_SEPARATOR) if k]
            uniq = m.properties.get(UNIQ_KEY)
            if last == (0, 0) and (keys or uniq):
                last = (m.store_timestamp, phys)
            if len(out) < limit and m.topic == topic and begin_ms <= m.store_timestamp <= end_ms \
                    and (uniq == key or key in keys):
                out.append(phys)
        if not self.config.message_index_enable:
            last = (0, 0)
        return QueryMessageResult(out, last[0], last[1])

    def check_in_disk_by_consume_offset(self, topic, queue_id, offset) -> bool:
        q = self.queues.get((topic, queue_id))
        if q is None or not q.min_offset <= offset < q.max_offset or q.units[offset] is None:
            return False
        return self.wrote - q.units[offset][0] > self._memory_limit

    def topics(self) -> list[str]:
        return sorted({t for (t, _q) in self.queues})

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(qid for (t, qid) in self.queues if t == topic)

    # ------------------------------------------------------------------ maintenance

    def delete_topics(self, topics) -> int:
        names = set(topics)
        victims = [k for k in self.queues if k[0] in names]
        for k in victims:
            del self.queues[k]
        return len(victims)

    def _correct_min(self, q: _Queue, cl_min: int) -> None:
        i = max(q.min_offset, q.first_file)
        while i < q.max_offset and (q.units[i] is None or q.units[i][0] < cl_min):
            i += 1
        q.min_offset = i

    def clean_expired_files(self, now_ms: int, force: bool = False) -> CleanResult:
        reserved_ms = self.config.file_reserved_time_hours * 3_600_000
        deleted = 0
        while self.min_segment < self.last_segment:
            seg = self.min_segment
            if not force and self.segment_mtime.get(seg, 0) + reserved_ms > now_ms:
                break
            lo, hi = seg * self._fs, (seg + 1) * self._fs
            for phys in [p for p in self.records if lo <= p < hi]:
                del self.records[phys]
            self.segment_mtime.pop(seg, None)
            self.min_segment += 1
            deleted += 1
        return CleanResult(deleted, self.clean_expired_consume_queues())

    def clean_expired_consume_queues(self) -> int:
        cl_min = self.commit_log_min_offset
        cq_files = 0
        for q in self.queues.values():
            last_file = (q.max_offset - 1) // self._upf * self._upf if q.max_offset else q.first_file
            while q.first_file < last_file:
                u = q.units[q.first_file + self._upf - 1]
                if (u[0] if u else 0) >= cl_min:
                    break
                q.first_file += self._upf
                cq_files += 1
            q.min_offset = max(q.min_offset, q.first_file)
            self._correct_min(q, cl_min)
        return cq_files

    # ------------------------------------------------------------------ test hooks

    def truncate_commit_log(self, offset: int) -> None:
        """What a recovery that cut the commit log at `offset` leaves behind."""
        for phys in [p for p in self.records if p >= offset]:
            del self.records[phys]
        self.wrote = offset
        self.last_segment = offset // self._fs
        self.flushed = min(self.flushed, offset)
        for q in self.queues.values():
            while q.max_offset > q.min_offset and q.units[-1] is not None and q.units[-1][0] >= offset:
                q.units.pop()
            q.min_offset = min(q.min_offset, q.max_offset)

    def rebuild_consume_queues(self) -> None:
        """What the file store does when consumequeue/ is deleted: dispatch every record again."""
        self.queues = {}
        for phys in sorted(self.records):
            m = decode_record(self.records[phys], decompress=False)
            if not _indexed(m.sys_flag):
                continue
            self._dispatch(m.topic, m.queue_id, m.queue_offset, phys, m.store_size,
                           self._code_from_tags(m.topic, m.queue_id, m.tags, m.store_timestamp),
                           m.store_timestamp)
        cl_min = self.commit_log_min_offset
        for q in self.queues.values():
            self._correct_min(q, cl_min)

