"""Appending to the file store: put_message, put, put_messages, put_batch_body.

Owns the write side of MessageStore: checking what may be stored (topic, sizes, hosts,
ids, timestamps: recovery refuses records that break these, so none is ever written),
building records with protocol.message's one writer (join_records, which packs the
header fields a batch's records share once), appending them through CommitLog's API
(reserve / append_reserved), writing their consume-queue units right away when dispatch
is up to date (else DispatchPart.reput does), and the PutMessageResult with offsetMsgIds.

The record layout is protocol.message's; nothing here knows a byte offset.
"""
from __future__ import annotations

import logging
from itertools import repeat
from operator import add, itemgetter

from pocketmq.common.constants import SCHEDULE_TOPIC
from pocketmq.protocol.message import (BATCH_ELEMENT_OVERHEAD, BLANK_MARKER_SIZE, HOST_V6_FLAGS, MAX_INT, PORT_MAX,
                                       PROPERTIES_LENGTH_BYTES_MAX, MessageSysFlag, decode_batch_body, host_flags,
                                       parse_batch_body, parse_uniform_batch_body, join_records,
                                       join_uniform_records, offset_msg_ids, record_overhead,
                                       tags_code_of_properties, tags_codes_of_properties, topic_field)
from pocketmq.broker.store.api import (MessageBatchToStore, MessageToStore, PutMessageResult, PutMessageStatus,
                                       schedule_tags_code, valid_topic)
from pocketmq.broker.store.consumequeue import CQ_UNIT, ConsumeQueue
from pocketmq.broker.store.fileops import NotOpened
from pocketmq.broker.store.index import INDEX_HINT_BYTES_MAX

log = logging.getLogger("pocketmq.store")

_NOT_AVAILABLE = PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE)
_ILLEGAL = PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL)
_PROPS_EXCEEDED = PutMessageResult(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED)
_LAST = itemgetter(-1)
_CREATE_FAILED = PutMessageResult(PutMessageStatus.CREATE_MAPEDFILE_FAILED)

# the transaction types whose records get a consume-queue unit (MessageSysFlag.indexed as a set)
_INDEXED_TRAN = frozenset(t for t in (MessageSysFlag.TRANSACTION_NOT_TYPE, MessageSysFlag.TRANSACTION_PREPARED_TYPE,
                                      MessageSysFlag.TRANSACTION_COMMIT_TYPE, MessageSysFlag.TRANSACTION_ROLLBACK_TYPE)
                          if MessageSysFlag.indexed(t))
# record_overhead by the host bits of a sys_flag (put's hot path: a dict lookup, no call)
_OVERHEAD = {bits: record_overhead(bits) for bits in
             (0, MessageSysFlag.BORNHOST_V6_FLAG, MessageSysFlag.STOREHOSTADDRESS_V6_FLAG, HOST_V6_FLAGS)}
_TRANSACTION_MASK = MessageSysFlag.TRANSACTION_MASK
# no IndexHint for records with IPv6 hosts (the index walks those) nor, defensively, for
# prepared and rolled-back halves (PREPARED 4, ROLLBACK 12: not indexed; batches are never
# transactional today)
_NOT_HINTED = MessageSysFlag.TRANSACTION_PREPARED_TYPE | HOST_V6_FLAGS


class AppendPart:
    """MessageStore's put methods (a part of the MessageStore class: state in store.py)."""

    def _topic_part(self, topic: str) -> bytes | None:
        """TOPICLENGTH + TOPIC of a topic the store accepts (cached), None for an illegal one."""
        b = self._topic_parts.get(topic)
        if b is None:
            if not valid_topic(topic):
                return None
            b = topic_field(topic.encode())
            if len(self._topic_parts) > 100_000:
                self._topic_parts.clear()
            self._topic_parts[topic] = b
        return b

    def _tags_code(self, topic: str, queue_id: int, props_b: bytes, store_ts: int) -> int:
        if topic == SCHEDULE_TOPIC:
            return schedule_tags_code(queue_id, store_ts, self._delay_levels)
        return tags_code_of_properties(props_b)

    def _reserve(self, size: int) -> int:
        """CommitLog.reserve, or -1 when the next segment cannot be created (logged)."""
        try:
            return self._commitlog.reserve(size)
        except NotOpened as e:
            self._note_transient("create commit-log segment", e)
            return -1

    def _cq_room(self, cq: ConsumeQueue) -> bool:
        """Create the consume-queue file the next unit needs before the records go into
        the commit log, so that a full disk refuses the send rather than leaving the queue
        behind the log. False (logged) when it cannot be created. (A batch crossing into
        a further file can still fail there: then dispatch is behind, see _behind.)"""
        try:
            cq.make_room()
        except NotOpened as e:
            self._note_transient("create consume-queue file", e)
            return False
        return True

    def _behind(self, phys: int, e: OSError) -> None:
        """A consume-queue file could not be created after the records from `phys` went into
        the commit log: they stay stored (and acknowledged); dispatch restarts from there
        (units are idempotent) before the next put, which is refused until it succeeds."""
        if isinstance(e, NotOpened):
            self._reput_from = phys
            self._dispatch_behind = True
            self._note_transient("create consume-queue file", e)
        else:
            self._fail(f"consume queue write failed: {e}")

    def catch_up_dispatch(self) -> bool:
        """Retry the dispatch a failed consume-queue file creation left behind, without
        waiting for the next put (whose records would otherwise stay invisible to pulls
        until then). The broker calls it every second on the thread that puts (dispatch is
        not safe from the flush thread). True when dispatch is up to date."""
        if not self._open or self._failed is not None or not self._dispatch_behind:
            return not self._dispatch_behind
        return self._catch_up()

    def _catch_up(self) -> bool:
        """Dispatch what a failed consume-queue file creation left undispatched; True when
        dispatch is up to date (a put's queue offset is only right then)."""
        self._reput()
        return not self._dispatch_behind

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
        if self._dispatch_behind and not self._catch_up():
            return _CREATE_FAILED
        topic_part = self._topic_parts.get(topic) or self._topic_part(topic)
        if topic_part is None:
            return _ILLEGAL
        if props_b and props_b[-1] == 0:
            props_b += b"\x02"       # see commitlog: a record never ends in a zero byte
        pl = len(props_b)
        if pl > PROPERTIES_LENGTH_BYTES_MAX:
            return _PROPS_EXCEEDED
        born_addr, born_port = born_host
        bits = self._host_bits.get(len(born_addr))     # host_flags(0, born, store), per born length
        if bits is None:
            return _ILLEGAL
        sys_flag = (sys_flag & ~HOST_V6_FLAGS) | bits
        size = _OVERHEAD[sys_flag & HOST_V6_FLAGS] + len(body) + len(topic_part) - 1 + pl
        if (size > self._max_record or not 0 <= queue_id <= MAX_INT or now < 0
                or born_timestamp < 0 or reconsume_times < 0
                or prepared_transaction_offset < 0 or not 0 <= born_port <= PORT_MAX):
            return _ILLEGAL         # recovery refuses such records: never write one
        if sys_flag & _TRANSACTION_MASK in _INDEXED_TRAN:
            # (the hot path inlines the lookups of _cq, _reserve and _tags_code: one call each less)
            table = self._cq_table.get(topic)
            cq = table.get(queue_id) if table is not None else None
            if cq is None:
                cq = self._cq(topic, queue_id)
            queue_offset = cq.max_offset
            if queue_offset >= cq.room_until and not self._cq_room(cq):
                return _CREATE_FAILED
        else:
            cq = None
            queue_offset = 0
        commitlog = self._commitlog
        try:
            phys = commitlog.reserve(size)
        except NotOpened as e:
            self._note_transient("create commit-log segment", e)
            return _CREATE_FAILED
        commitlog.append_reserved(join_records(
            queue_id, queue_offset, phys, sys_flag, born_timestamp, born_host, now, self._store_host,
            reconsume_times, prepared_transaction_offset, topic_part, ((size, flag, body, props_b),)))
        self._last_store_ts = now
        if self._reput_from == phys:
            self._reput_from = phys + size
            if cq is not None:
                code = (tags_code_of_properties(props_b) if topic != SCHEDULE_TOPIC
                        else schedule_tags_code(queue_id, now, self._delay_levels))
                try:
                    cq.put(queue_offset, phys, size, code)
                except OSError as e:
                    self._behind(phys, e)
                else:
                    self._dispatched_ts = now
                    if self.on_dispatch is not None:
                        self._notify(topic, queue_id, queue_offset + 1, code, now)
        else:
            self._reput()
        return PutMessageResult(PutMessageStatus.PUT_OK, phys, size, queue_offset,
                                self._msg_id_prefix + format(phys, "016X"), now, 1)

    def _batch_sys_flag(self, topic_part, queue_id: int, sys_flag: int, born_timestamp: int,
                        born_host: tuple[bytes, int], now: int, reconsume_times: int) -> int | None:
        """The stored sys_flag of a batch (host bits set), or None when the batch-level
        fields are illegal."""
        if topic_part is None or not 0 <= queue_id <= MAX_INT:
            return None
        sys_flag = host_flags(sys_flag, len(born_host[0]), self._store_alen)
        if sys_flag is None:
            return None
        if sys_flag & _TRANSACTION_MASK:
            return None              # batches cannot be transactional (like Java)
        if now < 0 or born_timestamp < 0 or reconsume_times < 0 or not 0 <= born_host[1] <= PORT_MAX:
            return None
        return sys_flag

    def put_messages(self, batch: MessageBatchToStore) -> PutMessageResult:
        """Store a batch as consecutive records of one queue in one segment."""
        if self._failed is not None or not self._open:
            return _NOT_AVAILABLE
        if self._dispatch_behind and not self._catch_up():
            return _CREATE_FAILED
        topic_part = self._topic_part(batch.topic)
        sys_flag = self._batch_sys_flag(topic_part, batch.queue_id, batch.sys_flag, batch.born_timestamp,
                                        batch.born_host, batch.now_ms, batch.reconsume_times)
        if sys_flag is None or not batch.messages:
            return _ILLEGAL
        fixed = record_overhead(sys_flag) + len(topic_part) - 1
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
            elements.append((size, flag, body, props_b))
            total += size
        if total + BLANK_MARKER_SIZE > self._file_size:
            return _ILLEGAL
        cq = self._cq(batch.topic, batch.queue_id)
        if cq.max_offset >= cq.room_until and not self._cq_room(cq):
            return _CREATE_FAILED
        phys0 = self._reserve(total)
        if phys0 < 0:
            return _CREATE_FAILED
        # (put_batch_body parses and writes the batches that fit the current segment in one
        # pass, the hot path; this is the general path, which may roll to the next segment)
        topic, queue_id, now = batch.topic, batch.queue_id, batch.now_ms
        qo0 = cq.max_offset
        phys = phys0
        physs = []
        units = []
        codes = set()
        for size, _flag, _data, pb in elements:
            code = self._tags_code(topic, queue_id, pb, now)
            physs.append(phys)
            units.append(CQ_UNIT.pack(phys, size, code))
            codes.add(code)
            phys += size
        self._commitlog.append_reserved(join_records(queue_id, qo0, phys0, sys_flag, batch.born_timestamp,
                                                     batch.born_host, now, self._store_host, batch.reconsume_times,
                                                     0, topic_part, elements))
        return self._batch_stored(topic, queue_id, cq, qo0, phys0, total, physs, units, codes, now)

    def put_batch_body(self, topic: str, queue_id: int, sys_flag: int, born_timestamp: int,
                       born_host: tuple[bytes, int], now: int, body, append_properties: bytes = b"",
                       reconsume_times: int = 0, body_bytes_max: int | None = None) -> PutMessageResult:
        """SEND_BATCH_MESSAGE's body stored as consecutive records of one queue in one segment:
        the same result and records as put_messages(decode_batch_body(body, raw_properties=True,
        append_properties=..., body_bytes_max=...)), which is what runs when the batch might
        not fit the current segment. Otherwise (the batch send hot path) each element is
        parsed (protocol.message.parse_batch_body) and made a record in one pass.
        Raises ValueError naming the malformed element; then nothing is stored."""
        if self._failed is not None or not self._open:
            return _NOT_AVAILABLE
        if self._dispatch_behind and not self._catch_up():
            return _CREATE_FAILED
        topic_part = self._topic_part(topic)
        sys_flag = self._batch_sys_flag(topic_part, queue_id, sys_flag, born_timestamp, born_host, now,
                                        reconsume_times)
        if sys_flag is None:
            return _ILLEGAL
        if type(body) is not bytes:
            body = bytes(body)
        n = len(body)
        fixed = record_overhead(sys_flag) + len(topic_part) - 1
        # Each element grows from its batch form (BATCH_ELEMENT_OVERHEAD + body + properties) by at most
        # this when stored; a batch whose bound fits the current segment cannot roll it.
        growth = fixed - BATCH_ELEMENT_OVERHEAD + (len(append_properties) + 1 if append_properties else 0) + 1
        bound = n + (n // BATCH_ELEMENT_OVERHEAD + 1) * growth
        cl = self._commitlog
        if bound > cl.room() or n == 0:
            records = decode_batch_body(body, raw_properties=True, append_properties=append_properties,
                                        body_bytes_max=body_bytes_max)
            return self.put_messages(MessageBatchToStore(topic, queue_id, sys_flag, born_timestamp, born_host,
                                                         now, records, reconsume_times))
        table = self._cq_table.get(topic)
        cq = table.get(queue_id) if table is not None else None
        qo0 = cq.max_offset if cq is not None else 0       # the queue is created once stored
        max_record = self._max_record
        # (self._tags_code, with its SCHEDULE_TOPIC test hoisted out of the loop)
        tags_code_of = tags_code_of_properties if topic != SCHEDULE_TOPIC else None
        pack_unit = CQ_UNIT.pack
        phys0 = phys = cl.wrote_offset      # where reserve() puts a batch that fits (checked above)
        if tags_code_of is not None:
            uniform = parse_uniform_batch_body(body, body_bytes_max)
            if uniform is not None:
                stored = self._put_uniform(topic, queue_id, cq, qo0, phys0, fixed, sys_flag, born_timestamp,
                                           born_host, now, reconsume_times, topic_part, append_properties,
                                           *uniform)
                if stored is not None:
                    return stored
        codes = set()
        elements = []
        physs = []
        units = []
        for flag, data, pb in parse_batch_body(body, append_properties, body_bytes_max):
            if pb and pb[-1] == 0:
                pb += b"\x02"       # see commitlog: a record never ends in a zero byte
            if len(pb) > PROPERTIES_LENGTH_BYTES_MAX:
                return _PROPS_EXCEEDED
            size = fixed + len(data) + len(pb)
            if size > max_record:
                return _ILLEGAL
            elements.append((size, flag, data, pb))
            code = tags_code_of(pb) if tags_code_of is not None else self._tags_code(topic, queue_id, pb, now)
            physs.append(phys)
            units.append(pack_unit(phys, size, code))
            codes.add(code)
            phys += size
        records = join_records(queue_id, qo0, phys0, sys_flag, born_timestamp, born_host, now, self._store_host,
                               reconsume_times, 0, topic_part, elements)
        return self._append_batch(topic, queue_id, cq, qo0, phys0, records, physs, units, codes, now)

    def _put_uniform(self, topic: str, queue_id: int, cq: ConsumeQueue | None, qo0: int, phys0: int, fixed: int,
                     sys_flag: int, born_timestamp: int, born_host: tuple[bytes, int], now: int,
                     reconsume_times: int, topic_part: bytes, append_properties: bytes, flags: list[int],
                     bodies: list[bytes], props: list[bytes]) -> PutMessageResult | None:
        """put_batch_body for a batch of one record size (parse_uniform_batch_body's columns,
        not a SCHEDULE_TOPIC batch, fitting the active segment): the same records, units and
        result as the per-element loop, built column-wise (join_uniform_records). None when
        the loop must decide: some properties texts ending in \x02 and some not (Java's and
        the C++ client's all end in it), one ending in a zero byte (the loop's special
        cases), or one the loop would refuse (too long, a record over the limit)."""
        m = len(bodies)
        lasts = bytes(map(_LAST, props))
        if append_properties:
            ended = lasts.count(2)
            if ended == m:              # the loop appends without a separator of its own
                suffix = append_properties
            elif ended == 0:
                suffix = b"\x02" + append_properties
            else:
                return None
            if suffix[-1] == 0:         # the loop adds \x02 (a record never ends in a zero byte)
                return None
            finals = list(map(add, props, repeat(suffix)))
        else:
            if b"\x00" in lasts:
                return None
            suffix = b""
            finals = props
        props_len = len(finals[0])
        size = fixed + len(bodies[0]) + props_len
        if props_len > PROPERTIES_LENGTH_BYTES_MAX or size > self._max_record:
            return None
        codes = tags_codes_of_properties(finals)
        physs = list(range(phys0, phys0 + m * size, size))
        units = list(map(CQ_UNIT.pack, physs, repeat(size), codes))
        records = join_uniform_records(queue_id, qo0, phys0, sys_flag, born_timestamp, born_host, now,
                                       self._store_host, reconsume_times, 0, topic_part, size, flags, bodies,
                                       props, suffix)
        stored = self._append_batch(topic, queue_id, cq, qo0, phys0, records, physs, units, set(codes), now)
        hints = self._index_hints
        if hints is not None and stored.status is PutMessageStatus.PUT_OK and not sys_flag & _NOT_HINTED \
                and m * props_len <= INDEX_HINT_BYTES_MAX:
            # the message index takes these records' columns from here (index.py, IndexHint;
            # it reads records with IPv6 hosts itself: such a hint would never be used)
            hints.append((phys0, size, m, topic_part[1:], finals, now))
        return stored

    def _append_batch(self, topic: str, queue_id: int, cq: ConsumeQueue | None, qo0: int, phys0: int,
                      records: bytes, physs: list, units: list, codes: set, now: int) -> PutMessageResult:
        """A batch's records appended where reserve() puts them in the active segment (phys0:
        the caller checked they fit, so it never rolls and never raises), then _batch_stored;
        CREATE_MAPEDFILE_FAILED, nothing written, when the queue's consume queue has no room."""
        if cq is None:
            cq = self._cq(topic, queue_id)
        if cq.max_offset >= cq.room_until and not self._cq_room(cq):
            return _CREATE_FAILED
        cl = self._commitlog
        at = cl.reserve(len(records))
        assert at == phys0
        cl.append_reserved(records)
        return self._batch_stored(topic, queue_id, cq, qo0, phys0, len(records), physs, units, codes, now)

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
                self._behind(phys0, e)
            else:
                self._dispatched_ts = now
        else:
            self._reput()
        return PutMessageResult(PutMessageStatus.PUT_OK, phys0, total, qo0,
                                offset_msg_ids(self._msg_id_prefix, physs), now, len(units))
