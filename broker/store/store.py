"""MessageStore: the file storage engine (CommitLog + ConsumeQueues + checkpoint/abort recovery).

Synchronous, no network, no clock: callers pass now_ms. Layout and formats: docs/store.md.

Threads: everything runs on the caller's (event-loop) thread except `flush()` and
`flush_consume_queues()`, which a flush thread may call concurrently with appends. They
only fdatasync descriptors and write the checkpoint; `_file_lock` keeps them away from
files being deleted (clean_expired_files, delete_topics, close).

Failure policy: the first failed fdatasync, checkpoint write or file write makes the store
sticky-failed (`failed` holds the reason); puts then answer SERVICE_NOT_AVAILABLE until a
restart, whose recovery decides what survived. A failed fsync is never retried.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import struct
import threading
import time
import zlib

from pocketmq.common.constants import SCHEDULE_TOPIC
from pocketmq.protocol.message import (MAX_INT, MESSAGE_MAGIC_CODE, PROPERTIES_LENGTH_BYTES_MAX, TOPIC_LENGTH_BYTES_MAX, decode_batch_body, encode_record_into, head_struct,
                              offset_msg_id_prefix, store_timestamp_pos, tags_code_of_properties)
from pocketmq.broker.store.api import (CQ_FILLER_SIZE, DispatchListener, GetMessageResult,
                              GetMessageStatus, MessageBatchToStore, MessageFilter,
                              MessageToStore, PutMessageResult, PutMessageStatus,
                              RecoveryReport, StoreError)
from pocketmq.broker.store.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from pocketmq.broker.store.commitlog import BLANK_MARKER_SIZE, CommitLog, DispatchRequest, schedule_tags_code
from pocketmq.broker.store.consumequeue import CQ_UNIT, CQ_UNIT_SIZE, EXISTS, ConsumeQueue
from pocketmq.broker.store.mapped_file import FileOps

_crc32 = zlib.crc32
_H_PACK = struct.Struct(">h").pack
_H_UNPACK = struct.Struct(">h").unpack_from
_BATCH_HEAD = struct.Struct(">iiiii")
# A stored record's first fields: TOTALSIZE MAGICCODE BODYCRC QUEUEID FLAG QUEUEOFFSET
# PHYSICALOFFSET (protocol.message's layout; SYSFLAG follows at _POS_SYSFLAG).
_HEAD_FIRST = struct.Struct(">iiiiiqq")
_BATCH_FLAG_BODYLEN = struct.Struct(">ii")     # at +12 in a batch element
_POS_SYSFLAG = 36   # a batch element's head (protocol.message)
from pocketmq.broker.store.store_config import StoreConfig

__all__ = ["MessageStore", "CleanResult"]

log = logging.getLogger("pocketmq.store")

_TOPIC_RE = re.compile(r"^[%|a-zA-Z0-9_-]+$")
_HEADS = {f: head_struct(f) for f in (0, 0x10, 0x20, 0x30)}
_HEAD_SIZE = {f: h.size for f, h in _HEADS.items()}
_Q = struct.Struct(">q")
_I = struct.Struct(">i")

_NOT_AVAILABLE = PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE)
_ILLEGAL = PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL)
_PROPS_EXCEEDED = PutMessageResult(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
_CREATE_FAILED = PutMessageResult(PutMessageStatus.CREATE_MAPEDFILE_FAILED)

_FOUND = GetMessageStatus.FOUND
_NO_MATCHED = GetMessageStatus.NO_MATCHED_MESSAGE
_REMOVING = GetMessageStatus.MESSAGE_WAS_REMOVING


def valid_topic(topic: str) -> bool:
    return (0 < len(topic) <= TOPIC_LENGTH_BYTES_MAX and _TOPIC_RE.fullmatch(topic) is not None
            and topic not in (".", ".."))


class CleanResult(tuple):
    """(commit_log_segments_deleted, consume_queue_files_deleted)."""

    __slots__ = ()

    def __new__(cls, segments: int, cq_files: int):
        return tuple.__new__(cls, (segments, cq_files))

    @property
    def segments(self) -> int:
        return self[0]

    @property
    def cq_files(self) -> int:
        return self[1]


class MessageStore:
    def __init__(self, config: StoreConfig, *, file_ops: FileOps | None = None,
                 on_dispatch: DispatchListener | None = None) -> None:
        self.config = config
        self.on_dispatch = on_dispatch
        self._ops = file_ops or FileOps(config.preallocate_files)
        self._delay_levels = config.delay_levels_ms
        self._file_size = config.mapped_file_size_commit_log
        self._max_record = min(config.max_message_size, self._file_size - BLANK_MARKER_SIZE)
        self._store_host = config.store_host
        self._store_v6 = 0x20 if len(config.store_host[0]) == 16 else 0
        self._msg_id_prefix = offset_msg_id_prefix(*config.store_host)
        self._memory_limit = config.memory_bytes() * config.access_message_in_memory_max_ratio // 100
        self._cq_root = config.consume_queue_dir
        self._cq_size = config.mapped_file_size_consume_queue
        self._commitlog = CommitLog(config.commit_log_dir, self._file_size, self._ops)
        self._cq_table: dict[str, dict[int, ConsumeQueue]] = {}
        self._topic_bytes: dict[str, bytes] = {}
        self._reput_from = 0
        self._last_store_ts = 0
        self._dispatched_ts = 0
        self._flushed_store_ts = 0
        self._checkpoint_dispatched = 0
        self._failed: str | None = None
        self._open = False
        self._file_lock = threading.Lock()
        self._lock_fd = -1
        self._create_failures = 0
        self._create_failed_logged_s = -1e9

    # ================================================================== lifecycle

    def open(self) -> RecoveryReport:
        """Recover and start accepting puts. Raises StoreError on a layout it will not guess
        about, OSError on I/O errors."""
        if self._open:
            raise StoreError("store already open")
        cfg = self.config
        root = cfg.store_path_root_dir
        os.makedirs(root, exist_ok=True)
        os.makedirs(cfg.commit_log_dir, exist_ok=True)
        cq_dir_missing = not os.path.isdir(self._cq_root)
        os.makedirs(self._cq_root, exist_ok=True)
        self._take_lock()
        try:
            return self._recover(cq_dir_missing)
        except BaseException:
            self._release_files()
            self._release_lock()
            raise

    def _recover(self, cq_dir_missing: bool) -> RecoveryReport:
        cfg = self.config
        abnormal = os.path.exists(cfg.abort_path)
        ck = read_checkpoint(cfg.checkpoint_path)
        cl = self._commitlog = CommitLog(cfg.commit_log_dir, self._file_size, self._ops)
        cl.load()
        files = cl.queue.files
        if not files:
            scan_from = 0
        elif ck is None:
            scan_from = files[max(0, len(files) - cfg.recover_segments_without_checkpoint)].start
        else:
            f = min(max(ck.flushed_physical_offset, files[0].start), files[-1].end)
            if abnormal:
                f -= f % self._file_size      # the whole segment holding the flushed offset
                if f >= files[-1].end:
                    f = files[-1].start
            scan_from = f
        outcome = cl.recover(scan_from, self._delay_levels, check_tail=abnormal or ck is None)
        end = cl.wrote_offset
        cl_min = cl.min_offset
        cl.flushed_offset = min(scan_from, end)

        truncated = 0
        cq_count = 0
        self._cq_table = {}
        if os.path.isdir(self._cq_root):
            for topic in sorted(os.listdir(self._cq_root)):
                tdir = os.path.join(self._cq_root, topic)
                if not os.path.isdir(tdir) or not valid_topic(topic):
                    log.warning("ignoring %s in consumequeue/", topic)
                    continue
                for qname in sorted(os.listdir(tdir)):
                    if not qname.isdigit() or not os.path.isdir(os.path.join(tdir, qname)):
                        log.warning("ignoring %s/%s in consumequeue/", topic, qname)
                        continue
                    cq = ConsumeQueue(topic, int(qname), self._cq_root, self._cq_size, self._ops)
                    cq.load()
                    if cq.queue.files:
                        cq_count += 1
                    truncated += cq.truncate_from_phys(end)
                    cq.correct_min_offset(cl_min)
                    self._cq_table.setdefault(topic, {})[cq.queue_id] = cq
        if truncated:
            log.warning("recovery dropped %d consume-queue units pointing past %d", truncated, end)

        if ck is None or cq_dir_missing or cq_count < ck.consume_queue_count:
            # consume queues were deleted (or nothing says how far they went): rebuild them
            # all from the commit log, idempotently
            reput_from = cl_min
        else:
            reput_from = min(max(ck.logics_physical_offset, cl_min), end)
        self._reput_from = reput_from
        self._failed = None
        self._open = True
        dispatched = self._reput()
        cl.flush()                       # what recovery accepted is now durable
        # a checkpoint from before a cut may point past the new end, into offsets that new
        # records will reuse: replace it now
        self.flush_consume_queues()
        self._create_abort_file()
        report = RecoveryReport(
            abnormal=abnormal, records_scanned=outcome.records_scanned,
            scan_from_offset=outcome.scan_from_offset, commit_log_min_offset=cl_min,
            commit_log_max_offset=end, truncated_from=outcome.truncated_from,
            truncated_to=outcome.truncated_to, cut_reason=outcome.reason,
            segments_removed=outcome.segments_removed, cq_entries_truncated=truncated,
            reput_from_offset=reput_from, records_dispatched=dispatched)
        log.info("store open: %s", report)
        return report

    def close(self) -> None:
        """Flush everything, write the checkpoint, remove the abort file. A sticky-failed
        store keeps its abort file so the next open runs the abnormal recovery."""
        if not self._open:
            return
        try:
            if self._failed is None:
                self.flush()
                self.flush_consume_queues()
        except StoreError:
            pass                         # failed: the abort file stays
        finally:
            with self._file_lock:
                self._open = False
                self._release_files()
            if self._failed is None:
                try:
                    os.unlink(self.config.abort_path)
                    self._ops.fsync_dir(self.config.store_path_root_dir)
                except FileNotFoundError:
                    pass
            self._release_lock()

    def abandon(self) -> None:
        """Drop the store like a killed process would: no flush, no checkpoint, the abort
        file stays. Writes already in the mappings survive (they are in the page cache)."""
        with self._file_lock:
            self._open = False
            self._release_files()
        self._release_lock()

    def _release_files(self) -> None:
        self._commitlog.close()
        for table in self._cq_table.values():
            for cq in table.values():
                cq.close()
        self._cq_table = {}

    def _take_lock(self) -> None:
        fd = os.open(self.config.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(f"{self.config.store_path_root_dir} is locked by another store") from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _create_abort_file(self) -> None:
        fd = os.open(self.config.abort_path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        self._ops.fsync_dir(self.config.store_path_root_dir)

    def _fail(self, reason: str) -> None:
        if self._failed is None:
            self._failed = reason
            log.error("store failed, refusing writes until restart: %s", reason)

    @property
    def failed(self) -> str | None:
        """Why the store stopped accepting writes, or None."""
        return self._failed

    @property
    def is_open(self) -> bool:
        return self._open

    # ================================================================== put

    def _topic_b(self, topic: str) -> bytes | None:
        b = self._topic_bytes.get(topic)
        if b is None:
            if not valid_topic(topic):
                return None
            b = topic.encode()
            if len(self._topic_bytes) > 100_000:
                self._topic_bytes.clear()
            self._topic_bytes[topic] = b
        return b

    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        table = self._cq_table.get(topic)
        if table is None:
            table = self._cq_table[topic] = {}
        cq = table.get(queue_id)
        if cq is None:
            cq = table[queue_id] = ConsumeQueue(topic, queue_id, self._cq_root, self._cq_size, self._ops)
        return cq

    def _tags_code(self, topic: str, queue_id: int, props_b: bytes, store_ts: int) -> int:
        if topic == SCHEDULE_TOPIC:
            return schedule_tags_code(queue_id, store_ts, self._delay_levels)
        return tags_code_of_properties(props_b)

    def _log_create_failed(self, e: OSError) -> None:
        # Every send fails the same way while the disk is full: one line per 10 s (with
        # the count) instead of one per message, which would fill the disk with logs too.
        now = time.monotonic()
        self._create_failures += 1
        if now - self._create_failed_logged_s >= 10.0:
            log.error("cannot create commit-log segment: %s (%d sends refused since the last report)",
                      e, self._create_failures)
            self._create_failed_logged_s = now
            self._create_failures = 0

    def put_message(self, msg: MessageToStore) -> PutMessageResult:
        return self.put(msg.topic, msg.queue_id, msg.flag, msg.body, msg.properties_str.encode(),
                        msg.sys_flag, msg.born_timestamp, msg.born_host, msg.now_ms,
                        msg.reconsume_times, msg.prepared_transaction_offset)

    def put(self, topic: str, queue_id: int, flag: int, body: bytes, props_b: bytes, sys_flag: int,
            born_timestamp: int, born_host: tuple[bytes, int], now: int, reconsume_times: int = 0,
            prepared_transaction_offset: int = 0) -> PutMessageResult:
        """put_message with the fields as arguments and the properties already encoded
        (the broker's single-send hot path: no MessageToStore, no second encode)."""
        if self._failed is not None or not self._open:
            return _NOT_AVAILABLE
        topic_b = self._topic_bytes.get(topic) or self._topic_b(topic)
        if topic_b is None:
            return _ILLEGAL
        if props_b and props_b[-1] == 0:
            props_b += b"\x02"       # see commitlog: a record never ends in a zero byte
        pl = len(props_b)
        if pl > PROPERTIES_LENGTH_BYTES_MAX:
            return _PROPS_EXCEEDED
        born_addr, born_port = born_host
        alen = len(born_addr)
        sys_flag = (sys_flag & ~0x30) | self._store_v6
        if alen == 16:
            sys_flag |= 0x10
        elif alen != 4:
            return _ILLEGAL
        head = _HEADS[sys_flag & 0x30]
        hs = head.size
        bl = len(body)
        tl = len(topic_b)
        size = hs + bl + 3 + tl + pl
        if (size > self._max_record or not 0 <= queue_id <= MAX_INT or now < 0
                or born_timestamp < 0 or reconsume_times < 0
                or prepared_transaction_offset < 0 or not 0 <= born_port <= 0xFFFF):
            return _ILLEGAL         # recovery refuses such records: never write one
        tran = sys_flag & 0xC
        if tran == 0 or tran == 8:
            cq = self._cq(topic, queue_id)
            queue_offset = cq.max_offset
        else:
            cq = None
            queue_offset = 0
        cl = self._commitlog
        try:
            mf = cl.reserve(size)
        except OSError as e:
            self._log_create_failed(e)
            return _CREATE_FAILED
        pos = mf.wrote
        phys = mf.start + pos
        mm = mf.mm
        # protocol.message.encode_record_into, inlined (host flags are already known here),
        # the record joined from its parts and written with one copy
        store_addr, store_port = self._store_host
        mm[pos:pos + size] = b"".join((
            head.pack(size, MESSAGE_MAGIC_CODE, _crc32(body) & 0x7FFFFFFF, queue_id, flag, queue_offset, phys,
                      sys_flag, born_timestamp, born_addr, born_port, now, store_addr, store_port,
                      reconsume_times, prepared_transaction_offset, bl),
            body, bytes((tl,)), topic_b, _H_PACK(pl), props_b))
        cl.commit(mf, size)
        self._last_store_ts = now
        if self._reput_from == phys:
            self._reput_from = phys + size
            if cq is not None:
                code = self._tags_code(topic, queue_id, props_b, now)
                try:
                    cq.put(queue_offset, phys, size, code)
                except OSError as e:
                    self._fail(f"consume queue write failed: {e}")
                else:
                    self._dispatched_ts = now
                    if self.on_dispatch is not None:
                        self._notify(topic, queue_id, queue_offset + 1, code, now)
        else:
            self._reput()
        return PutMessageResult(PutMessageStatus.PUT_OK, phys, size, queue_offset,
                                self._msg_id_prefix + format(phys, "016X"), now, 1)

    def _batch_sys_flag(self, topic_b, queue_id: int, sys_flag: int, born_timestamp: int,
                        born_host: tuple[bytes, int], now: int, reconsume_times: int) -> int | None:
        """The stored sys_flag of a batch (host bits set), or None when the batch-level
        fields are illegal."""
        if topic_b is None or not 0 <= queue_id <= MAX_INT:
            return None
        alen = len(born_host[0])
        sys_flag = (sys_flag & ~0x30) | self._store_v6
        if alen == 16:
            sys_flag |= 0x10
        elif alen != 4:
            return None
        if sys_flag & 0xC:
            return None              # batches cannot be transactional (like Java)
        if now < 0 or born_timestamp < 0 or reconsume_times < 0 or not 0 <= born_host[1] <= 0xFFFF:
            return None
        return sys_flag

    def put_messages(self, batch: MessageBatchToStore) -> PutMessageResult:
        """Store a batch as consecutive records of one queue in one segment."""
        if self._failed is not None or not self._open:
            return _NOT_AVAILABLE
        topic_b = self._topic_b(batch.topic)
        sys_flag = self._batch_sys_flag(topic_b, batch.queue_id, batch.sys_flag, batch.born_timestamp,
                                        batch.born_host, batch.now_ms, batch.reconsume_times)
        if sys_flag is None or not batch.messages:
            return _ILLEGAL
        fixed = _HEAD_SIZE[sys_flag & 0x30] + 3 + len(topic_b)
        elements = []
        total = 0
        for flag, body, props in batch.messages:
            props_b = props if type(props) is bytes else props.encode()
            if props_b and props_b[-1] == 0:
                props_b += b"\x02"
            if len(props_b) > PROPERTIES_LENGTH_BYTES_MAX:
                return _PROPS_EXCEEDED
            size = fixed + len(body) + len(props_b)
            if size > self._max_record:
                return _ILLEGAL
            elements.append((flag, body, props_b, size))
            total += size
        return self._append_batch(batch.topic, topic_b, batch.queue_id, sys_flag, batch.born_timestamp,
                                  batch.born_host, batch.now_ms, batch.reconsume_times, elements, total)

    def put_batch_body(self, topic: str, queue_id: int, sys_flag: int, born_timestamp: int,
                       born_host: tuple[bytes, int], now: int, body, append_properties: bytes = b"",
                       reconsume_times: int = 0, body_bytes_max: int | None = None) -> PutMessageResult:
        """SEND_BATCH_MESSAGE's body stored as consecutive records of one queue in one segment:
        the same result and records as put_messages(decode_batch_body(body, raw_properties=True,
        append_properties=..., body_bytes_max=...)), which is what runs when the batch might
        not fit the current segment. Otherwise (the batch send hot path) each element is
        parsed and written straight into the segment in one pass, its body copied once.
        Raises ValueError naming the malformed element; then nothing is stored."""
        if self._failed is not None or not self._open:
            return _NOT_AVAILABLE
        topic_b = self._topic_b(topic)
        sys_flag = self._batch_sys_flag(topic_b, queue_id, sys_flag, born_timestamp, born_host, now,
                                        reconsume_times)
        if sys_flag is None:
            return _ILLEGAL
        if type(body) is not bytes:
            body = bytes(body)
        n = len(body)
        head = _HEADS[sys_flag & 0x30]
        hs = head.size
        fixed = hs + 3 + len(topic_b)
        # Each element grows from its batch form (22 + body + properties bytes) by at most
        # this when stored; a batch whose bound fits the current segment cannot roll it.
        growth = fixed - 22 + (len(append_properties) + 1 if append_properties else 0) + 1
        bound = n + (n // 22 + 1) * growth
        mf = self._commitlog.queue.last
        if mf is None or mf.wrote + bound + BLANK_MARKER_SIZE > mf.size or n == 0:
            records = decode_batch_body(body, raw_properties=True, append_properties=append_properties,
                                        body_bytes_max=body_bytes_max)
            return self.put_messages(MessageBatchToStore(topic, queue_id, sys_flag, born_timestamp, born_host,
                                                         now, records, reconsume_times))
        if body_bytes_max is None:
            body_bytes_max = n
        table = self._cq_table.get(topic)
        cq = table.get(queue_id) if table is not None else None
        qo0 = cq.max_offset if cq is not None else 0       # the queue is created once stored
        sep_append = b"\x02" + append_properties if append_properties else b""
        max_record = self._max_record
        unpack_fb = _BATCH_FLAG_BODYLEN.unpack_from
        unpack_h = _H_UNPACK
        src = memoryview(body)
        # protocol.message.encode_record_into, inlined: the header fields from SYSFLAG to
        # PREPAREDTRANSACTIONOFFSET are the same for every record of a batch, packed once;
        # each record is joined from its parts and written with one copy.
        wpos0 = wpos = mf.wrote
        start = mf.start
        mm = mf.mm
        born_addr, born_port = born_host
        store_addr, store_port = self._store_host
        middle = head.pack(0, 0, 0, 0, 0, 0, 0, sys_flag, born_timestamp, born_addr, born_port, now,
                           store_addr, store_port, reconsume_times, 0, 0)[_POS_SYSFLAG:hs - 4]
        pack_first = _HEAD_FIRST.pack
        pack_i = _I.pack
        topic_part = bytes((len(topic_b),)) + topic_b
        pack_h = _H_PACK
        join = b"".join
        # (self._tags_code, with its SCHEDULE_TOPIC test hoisted out of the loop)
        tags_code_of = tags_code_of_properties if topic != SCHEDULE_TOPIC else None
        pack_unit = CQ_UNIT.pack
        codes = set()
        qo = qo0
        physs = []
        units = []
        pos = 0
        error = None
        while pos < n:
            k = qo - qo0
            if n - pos < 22:
                error = f"batch element {k} truncated at byte {pos}"
                break
            flag, bl = unpack_fb(body, pos + 12)
            bstart = pos + 20
            pos = bstart + bl
            if bl < 0 or pos + 2 > n:
                error = f"batch element {k}: body length {bl} out of bounds"
                break
            if bl > body_bytes_max:
                error = f"batch element {k}: body of {bl}B exceeds the limit {body_bytes_max}B"
                break
            (pl,) = unpack_h(body, pos)
            pos += 2
            if pl < 0 or pos + pl > n:
                error = f"batch element {k}: properties length {pl} out of bounds"
                break
            pb = body[pos:pos + pl]
            pos += pl
            if not pb.isascii():        # (ASCII is UTF-8: no decode needed to check it)
                try:
                    pb.decode()
                except UnicodeDecodeError:
                    error = f"batch element {k}: properties not UTF-8"
                    break
            if append_properties:
                pb = pb + sep_append if pb and pb[-1] != 2 else pb + append_properties
            if pb and pb[-1] == 0:
                pb += b"\x02"       # see commitlog: a record never ends in a zero byte
            if len(pb) > PROPERTIES_LENGTH_BYTES_MAX:
                error = _PROPS_EXCEEDED
                break
            size = fixed + bl + len(pb)
            if size > max_record:
                error = _ILLEGAL
                break
            phys = start + wpos
            data = src[bstart:bstart + bl]
            mm[wpos:wpos + size] = join((
                pack_first(size, MESSAGE_MAGIC_CODE, _crc32(data) & 0x7FFFFFFF, queue_id, flag, qo, phys),
                middle, pack_i(bl), data, topic_part, pack_h(len(pb)), pb))
            code = tags_code_of(pb) if tags_code_of is not None else self._tags_code(topic, queue_id, pb, now)
            physs.append(phys)
            units.append(pack_unit(phys, size, code))
            codes.add(code)
            wpos += size
            qo += 1
        if error is not None:
            # Records written past the commit point are not part of the log, but a crash
            # could leave them on disk for recovery to find: wipe them.
            if wpos > wpos0:
                mm[wpos0:wpos] = bytes(wpos - wpos0)
            if type(error) is str:
                raise ValueError(error)
            return error
        total = wpos - wpos0
        phys0 = start + wpos0
        if cq is None:
            cq = self._cq(topic, queue_id)
        self._commitlog.commit(mf, total)
        return self._batch_stored(topic, queue_id, cq, qo0, phys0, total, physs, units, codes, now)

    def _append_batch(self, topic: str, topic_b: bytes, queue_id: int, sys_flag: int, born_timestamp: int,
                      born_host: tuple[bytes, int], now: int, reconsume_times: int, elements: list,
                      total: int) -> PutMessageResult:
        """Write checked batch elements [(flag, body buffer, properties bytes, record size)]."""
        if total + BLANK_MARKER_SIZE > self._file_size:
            return _ILLEGAL
        cq = self._cq(topic, queue_id)
        qo0 = cq.max_offset
        cl = self._commitlog
        try:
            mf = cl.reserve(total)
        except OSError as e:
            self._log_create_failed(e)
            return _CREATE_FAILED
        # (put_batch_body writes the records of the batches that fit the current segment,
        # the hot path; this is the general path, which may roll to the next segment)
        wpos = mf.wrote
        start = mf.start
        phys0 = start + wpos
        mm = mf.mm
        store_host = self._store_host
        qo = qo0
        physs = []
        units = []
        codes = set()
        for flag, data, pb, size in elements:
            phys = start + wpos
            encode_record_into(mm, wpos, topic_b, queue_id, flag, data, pb, sys_flag, born_timestamp,
                               born_host, store_host, reconsume_times, 0, qo, phys, now)
            code = self._tags_code(topic, queue_id, pb, now)
            physs.append(phys)
            units.append(CQ_UNIT.pack(phys, size, code))
            codes.add(code)
            wpos += size
            qo += 1
        cl.commit(mf, total)
        return self._batch_stored(topic, queue_id, cq, qo0, phys0, total, physs, units, codes, now)

    def _batch_stored(self, topic: str, queue_id: int, cq: ConsumeQueue, qo0: int, phys0: int, total: int,
                      physs: list, units: list, codes: set, now: int) -> PutMessageResult:
        """After a batch's records are committed: consume-queue units (packed), wake-ups, result."""
        qo = qo0 + len(units)
        self._last_store_ts = now
        if self._reput_from == phys0:
            self._reput_from = phys0 + total
            listener = self.on_dispatch
            try:
                cq.put_many(qo0, b"".join(units))
                if listener is not None:
                    # One wake-up per distinct tag code with the batch's end offset: a held
                    # pull wakes if any message of the batch matches it, as per-message would.
                    for code in codes:
                        self._notify(topic, queue_id, qo, code, now)
            except OSError as e:
                self._fail(f"consume queue write failed: {e}")
            else:
                self._dispatched_ts = now
        else:
            self._reput()
        # The offsetMsgIds (host prefix + 16 hex digits of the offset each), comma-joined,
        # made by C-level bytes/str operations instead of a format() per message.
        prefix = self._msg_id_prefix
        hexes = struct.pack(f">{len(physs)}q", *physs).hex(",", 8).upper()
        return PutMessageResult(PutMessageStatus.PUT_OK, phys0, total, qo0,
                                prefix + hexes.replace(",", "," + prefix), now, len(units))

    # ================================================================== dispatch

    def reput(self) -> int:
        """Dispatch every record from reput_from_offset to the commit-log end into the
        consume queues. Returns the number of units written."""
        if not self._open:
            return 0
        return self._reput()

    def _reput(self) -> int:
        n = 0
        dispatch = self._dispatch
        try:
            for nxt, req in self._commitlog.iter_dispatch(self._reput_from, self._delay_levels):
                if req is not None:
                    n += dispatch(req)
                self._reput_from = nxt
        except OSError as e:
            self._fail(f"consume queue write failed: {e}")
        return n

    def _dispatch(self, req: DispatchRequest) -> int:
        tran = req.sys_flag & 0xC
        if tran != 0 and tran != 8:
            return 0
        if not valid_topic(req.topic):
            log.error("record at %d has topic %r that cannot be a directory; not dispatched",
                      req.commit_log_offset, req.topic)
            return 0
        cq = self._cq(req.topic, req.queue_id)
        if cq.put(req.queue_offset, req.commit_log_offset, req.size, req.tags_code) == EXISTS:
            return 0
        self._dispatched_ts = req.store_timestamp
        if self.on_dispatch is not None:
            self._notify(req.topic, req.queue_id, cq.max_offset, req.tags_code, req.store_timestamp)
        return 1

    def _notify(self, topic: str, queue_id: int, next_max_offset: int, code: int, store_ts: int) -> None:
        try:
            self.on_dispatch(topic, queue_id, next_max_offset, code, store_ts)
        except Exception:
            # the message is stored and indexed: a broken listener must not turn that into an error
            log.exception("on_dispatch listener failed")

    @property
    def reput_from_offset(self) -> int:
        return self._reput_from

    # ================================================================== flush

    @property
    def flushed_offset(self) -> int:
        return self._commitlog.flushed_offset

    def flush(self) -> int:
        """Make the commit log durable up to its current end; returns the flushed offset.
        Safe from a flush thread (SYNC_FLUSH group commit waits for flushed_offset >=
        PutMessageResult.end_offset). Also flushes the consume queues and writes the
        checkpoint once dispatch has moved checkpoint_interval_bytes past the last one, so
        crash recovery stays bounded even if nobody calls flush_consume_queues().
        Raises StoreError when the store has failed (now or earlier): never retried."""
        with self._file_lock:
            if self._failed is not None:
                raise StoreError(self._failed)
            if not self._open:
                return self._commitlog.flushed_offset
            ts = self._last_store_ts
            try:
                flushed = self._commitlog.flush()
            except OSError as e:
                self._fail(f"commit log fdatasync failed: {e}")
                raise StoreError(self._failed) from e
            self._flushed_store_ts = ts
            if self._reput_from - self._checkpoint_dispatched >= self.config.checkpoint_interval_bytes:
                self._flush_consume_queues_locked()
            return flushed

    def flush_consume_queues(self) -> int:
        """fdatasync the consume queues and write the checkpoint (RocketMQ flushes them every
        second). Returns the commit-log offset below which every consume-queue unit is
        durable. Safe from a flush thread. Raises StoreError when the store has failed."""
        with self._file_lock:
            if self._failed is not None:
                raise StoreError(self._failed)
            if not self._open:
                return self._checkpoint_dispatched
            return self._flush_consume_queues_locked()

    def _flush_consume_queues_locked(self) -> int:
        dispatched = self._reput_from
        logics_ts = self._dispatched_ts
        physic_ts = self._flushed_store_ts
        try:
            count = 0
            for table in list(self._cq_table.values()):
                for cq in list(table.values()):
                    cq.flush()
                    if cq.queue.files:
                        count += 1
            write_checkpoint(self.config.checkpoint_path, Checkpoint(
                physic_ts, logics_ts, 0, self._commitlog.flushed_offset, dispatched, count))
        except OSError as e:
            self._fail(f"consume queue / checkpoint flush failed: {e}")
            raise StoreError(self._failed) from e
        self._checkpoint_dispatched = dispatched
        return dispatched

    # ================================================================== get

    def get_message(self, topic: str, queue_id: int, offset: int, max_msg_nums: int,
                    message_filter: MessageFilter | None = None) -> GetMessageResult:
        if not self._open:
            raise StoreError("store is not open")
        table = self._cq_table.get(topic)
        cq = table.get(queue_id) if table is not None else None
        if cq is None:
            min_offset = max_offset = 0
        else:
            min_offset = cq.min_offset
            max_offset = cq.max_offset
        if max_offset == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, min_offset, max_offset)
        if offset < min_offset:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
        if offset == max_offset:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
        if offset > max_offset:
            # RocketMQ 4.9.4: back to 0 when the queue still starts at 0, else to the end
            nxt = min_offset if min_offset == 0 else max_offset
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, nxt, min_offset, max_offset)
        buf = cq.index_buffer(offset)
        if buf is None:
            return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, cq.roll_next_file(offset),
                                    min_offset, max_offset)
        limit = max(16000, max_msg_nums * CQ_UNIT_SIZE)
        if len(buf) > limit:
            buf = buf[:limit - limit % CQ_UNIT_SIZE]
        cfg = self.config
        if message_filter is None:
            fast = self._get_contiguous(buf, offset, max_msg_nums, min_offset, max_offset)
            if fast is not None:
                return fast
        cl = self._commitlog
        files = cl.queue.files
        nfiles = len(files)
        fsize = self._file_size
        first_start = files[0].start if files else 0
        cl_max = cl.wrote_offset
        mem_limit = self._memory_limit
        mem_bytes = cfg.max_transfer_bytes_on_message_in_memory
        mem_count = cfg.max_transfer_count_on_message_in_memory
        disk_bytes = cfg.max_transfer_bytes_on_message_in_disk
        disk_count = cfg.max_transfer_count_on_message_in_disk
        status = _NO_MATCHED
        slices = []
        cur_mf = None
        cur_start = cur_end = 0
        total = 0
        count = 0
        scanned = 0
        skip_below = -1
        for phys, size, tag in CQ_UNIT.iter_unpack(buf):
            if phys < skip_below or size == CQ_FILLER_SIZE:
                scanned += 1
                continue
            if count:
                if count >= max_msg_nums:
                    break
                if cl_max - phys > mem_limit:
                    if total + size > disk_bytes or count >= disk_count:
                        break
                elif total + size > mem_bytes or count >= mem_count:
                    break
            if message_filter is not None and not message_filter(tag):
                scanned += 1
                continue
            idx = (phys - first_start) // fsize
            if phys < first_start or idx >= nfiles or phys - files[idx].start + size > files[idx].wrote:
                if not total:
                    status = _REMOVING
                skip_below = phys + fsize - phys % fsize
                scanned += 1
                continue
            mf = files[idx]
            pos = phys - mf.start
            if mf is cur_mf and pos == cur_end:
                cur_end += size
            else:
                if cur_mf is not None:
                    slices.append(cur_mf.view[cur_start:cur_end])
                cur_mf = mf
                cur_start = pos
                cur_end = pos + size
            total += size
            count += 1
            status = _FOUND
            skip_below = -1
            scanned += 1
        if cur_mf is not None:
            slices.append(cur_mf.view[cur_start:cur_end])
        return GetMessageResult(status, offset + scanned, min_offset, max_offset, count, slices, total)

    def _get_contiguous(self, buf, offset: int, max_msg_nums: int, min_offset: int,
                        max_offset: int) -> GetMessageResult | None:
        """The common pull: no tag filter, and the next units point at records that lie
        back to back in one segment still in memory, within the transfer limits. Then the
        answer is one slice found from the first and last unit, with no per-unit loop.
        None when any of that does not hold (the general loop decides)."""
        cfg = self.config
        n = min(max_msg_nums, cfg.max_transfer_count_on_message_in_memory, len(buf) // CQ_UNIT_SIZE)
        if n <= 0:
            return None
        p0, _s0, _t0 = CQ_UNIT.unpack_from(buf, 0)
        pl, sl, _tl = CQ_UNIT.unpack_from(buf, (n - 1) * CQ_UNIT_SIZE)
        span = pl + sl - p0
        if span <= 0 or span > cfg.max_transfer_bytes_on_message_in_memory or sl == CQ_FILLER_SIZE:
            return None
        if len(buf) >= (n + 1) * CQ_UNIT_SIZE and CQ_UNIT.unpack_from(buf, n * CQ_UNIT_SIZE)[1] == CQ_FILLER_SIZE:
            return None     # the general loop also steps over the fillers that follow
        # Contiguous iff the sizes add up to the span (offsets only grow within a queue).
        sizes = memoryview(buf).cast("B")[:n * CQ_UNIT_SIZE]
        total = 0
        for _p, size, _t in CQ_UNIT.iter_unpack(sizes):
            if size == CQ_FILLER_SIZE:
                return None
            total += size
        if total != span:
            return None
        cl = self._commitlog
        if cl.wrote_offset - p0 > self._memory_limit:
            return None
        files = cl.queue.files
        if not files:
            return None
        idx = (p0 - files[0].start) // self._file_size
        if p0 < files[0].start or idx >= len(files):
            return None
        mf = files[idx]
        pos = p0 - mf.start
        if pos + span > mf.wrote:
            return None
        return GetMessageResult(_FOUND, offset + n, min_offset, max_offset, n, [mf.view[pos:pos + span]], span)

    # ================================================================== queries

    def _find_cq(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        table = self._cq_table.get(topic)
        return table.get(queue_id) if table is not None else None

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._find_cq(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._find_cq(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    def _store_timestamp_at(self, phys: int, size: int) -> int:
        view = self._commitlog.read(phys, size)
        if view is None or size < 72:
            return -1
        (sys_flag,) = _I.unpack_from(view, 36)
        (ts,) = _Q.unpack_from(view, store_timestamp_pos(sys_flag))
        return ts

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
        if cq is None or cq.max_offset == 0 or not cq.queue.files:
            return 0
        chosen = None
        for mf in cq.queue.files:
            if mf.wrote < CQ_UNIT_SIZE:
                continue
            phys, size, _ = CQ_UNIT.unpack_from(mf.mm, mf.wrote - CQ_UNIT_SIZE)
            if self._store_timestamp_at(phys, size) >= timestamp:
                chosen = mf
                break
        if chosen is None:
            chosen = cq.queue.files[-1]
        min_byte = cq.min_offset * CQ_UNIT_SIZE
        low = min_byte - chosen.start if min_byte > chosen.start else 0
        high = chosen.wrote - CQ_UNIT_SIZE
        cl_min = self._commitlog.min_offset
        target = left = right = -1
        left_ts = right_ts = -1
        while high >= low:
            mid = (low + high) // (2 * CQ_UNIT_SIZE) * CQ_UNIT_SIZE
            phys, size, _ = CQ_UNIT.unpack_from(chosen.mm, mid)
            if phys < cl_min or size == CQ_FILLER_SIZE:
                low = mid + CQ_UNIT_SIZE
                left = mid
                continue
            ts = self._store_timestamp_at(phys, size)
            if ts < 0:
                return 0
            if ts == timestamp:
                target = mid
                break
            if ts > timestamp:
                high = mid - CQ_UNIT_SIZE
                right = mid
                right_ts = ts
            else:
                low = mid + CQ_UNIT_SIZE
                left = mid
                left_ts = ts
        if target != -1:
            pos = target
        elif left_ts == -1:
            pos = right
        elif right_ts == -1:
            pos = left
        else:
            pos = right if abs(timestamp - left_ts) > abs(timestamp - right_ts) else left
        if pos < 0:
            return cq.min_offset
        return (chosen.start + pos) // CQ_UNIT_SIZE

    def look_message_by_offset(self, commit_log_offset: int) -> bytes | None:
        """The record stored at a commit-log offset (a copy), or None."""
        size = self._commitlog.record_size_at(commit_log_offset)
        if size < 0:
            return None
        view = self._commitlog.read(commit_log_offset, size)
        return bytes(view) if view is not None else None

    def check_in_disk_by_consume_offset(self, topic: str, queue_id: int, offset: int) -> bool:
        cq = self._find_cq(topic, queue_id)
        if cq is None:
            return False
        u = cq.unit(offset)
        if u is None or u[1] == CQ_FILLER_SIZE:     # a filler stands for no message
            return False
        return self._commitlog.wrote_offset - u[0] > self._memory_limit

    @property
    def commit_log_min_offset(self) -> int:
        return self._commitlog.min_offset

    @property
    def commit_log_max_offset(self) -> int:
        return self._commitlog.max_offset

    def topics(self) -> list[str]:
        return sorted(t for t, table in self._cq_table.items() if table)

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(self._cq_table.get(topic, {}))

    # ================================================================== maintenance

    def delete_topics(self, topics) -> int:
        """Drop the consume queues of these topics (their records stay in the commit log until
        it expires). Returns the number of queues removed."""
        removed = 0
        with self._file_lock:
            for topic in topics:
                table = self._cq_table.pop(topic, None)
                if table:
                    for cq in table.values():
                        cq.destroy()
                        removed += 1
                tdir = os.path.join(self._cq_root, topic)
                if valid_topic(topic) and os.path.isdir(tdir):
                    shutil.rmtree(tdir, ignore_errors=True)
        if self._open:
            # move the checkpoint's dispatch point past the deleted topics' records, so a
            # restart does not dispatch them again
            self.flush_consume_queues()
        return removed

    def clean_expired_files(self, now_ms: int, force: bool = False) -> CleanResult:
        """Delete commit-log segments (never the active one) whose mtime is older than
        file_reserved_time_hours (any age with force), oldest first, stopping at the first
        one kept; then the consume-queue files wholly below the new commit-log minimum.
        Consume-queue min offsets move up accordingly."""
        if not self._open:
            return CleanResult(0, 0)
        reserved_ms = self.config.file_reserved_time_hours * 3_600_000
        with self._file_lock:
            cl = self._commitlog
            victims = 0
            for mf in cl.queue.files[:-1]:
                if mf.end > self._reput_from:
                    break
                if not force:
                    try:
                        mtime_ms = os.stat(mf.path).st_mtime_ns // 1_000_000
                    except OSError:
                        break
                    if mtime_ms + reserved_ms > now_ms:
                        break
                victims += 1
            if victims:
                cl.delete_first_segments(victims)
                log.info("deleted %d expired commit-log segment(s); min offset now %d",
                         victims, cl.min_offset)
            cl_min = cl.min_offset
            cq_files = 0
            for table in self._cq_table.values():
                for cq in table.values():
                    cq_files += cq.clean(cl_min)
            cl.queue.reap()
        return CleanResult(victims, cq_files)
