"""Typed messages of the client: Message (to send), MessageExt (received), SendResult.

Message and SendResult are frozen dataclasses. MessageExt (an immutable tuple-based
value with lazily decoded properties) and FrozenProperties are protocol.message's,
re-exported here: the decoders return that one type. System property keys are
RocketMQ's (MessageConst); the wire form of properties is `name\\x01value\\x02...`
(protocol reference 5.5).
"""
from __future__ import annotations

import itertools
import os
import random
import socket
import sys
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum

from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.message import decode_properties, encode_properties  # noqa: F401 (re-exported)
from pocketmq.protocol.message import (SYSTEM_PROPERTY_KEYS, FrozenProperties, MessageExt,  # noqa: F401 (re-exported)
                                       frozen_properties as _frozen_props, keys_tuple as _keys_tuple)

__all__ = ["Message", "MessageExt", "MessageQueue", "PropertyKey", "SendResult", "SendStatus"]


class PropertyKey:
    """Property names the client sets or reads (the strings live in protocol.message)."""
    KEYS = msgcodec.KEYS
    TAGS = msgcodec.TAGS
    WAIT = msgcodec.WAIT
    DELAY = msgcodec.DELAY
    RETRY_TOPIC = msgcodec.RETRY_TOPIC
    REAL_TOPIC = msgcodec.REAL_TOPIC
    REAL_QID = msgcodec.REAL_QID
    TRAN_MSG = msgcodec.TRAN_MSG
    PGROUP = msgcodec.PGROUP
    MIN_OFFSET = msgcodec.MIN_OFFSET
    MAX_OFFSET = msgcodec.MAX_OFFSET
    ORIGIN_MESSAGE_ID = msgcodec.ORIGIN_MESSAGE_ID
    RECONSUME_TIME = msgcodec.RECONSUME_TIME
    MAX_RECONSUME_TIMES = msgcodec.MAX_RECONSUME_TIMES
    MSG_REGION = msgcodec.MSG_REGION
    TRACE_ON = msgcodec.TRACE_ON
    UNIQ_KEY = msgcodec.UNIQ_KEY
    CONSUME_START_TIME = msgcodec.CONSUME_START_TIME
    CLUSTER = msgcodec.CLUSTER
    SHARDING_KEY = msgcodec.SHARDING_KEY
    TIMER_DELIVER_MS = msgcodec.TIMER_DELIVER_MS


DELAY_LEVEL_MAX = 18
_WIRE_KEYS = frozenset({"TAGS", "KEYS", "DELAY", "WAIT", "UNIQ_KEY", msgcodec.TIMER_DELIVER_MS})


@dataclass(frozen=True, slots=True)
class Message:
    """A message to send.

    `keys` may be a string ("k1 k2") or an iterable; `properties` are user
    properties and must not use system keys (KEYS, TAGS, DELAY, ...): use the
    dedicated fields. A `str` body is encoded as UTF-8.

    `deliver_at_ms` (ms since the epoch, by the broker's clock) makes it a timer message
    (RocketMQ 5's TIMER_DELIVER_MS): consumers see it at that time, never earlier; a time
    already past delivers at once, one more than the broker's timerMaxDelaySec (3 days)
    away is refused. It cannot be combined with `delay_level` nor sent in a batch.
    """
    topic: str
    body: bytes = b""
    tags: str | None = None
    keys: tuple = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    delay_level: int = 0
    flag: int = 0
    wait_store_msg_ok: bool = True
    deliver_at_ms: int | None = None

    # Written by hand (dataclass keeps a class's own __init__): the generated one sets each of
    # the 9 fields through object.__setattr__ and then runs __post_init__, ~3x the cost of
    # storing through the slot descriptors; a producer of small messages spent more time
    # building Messages than encoding them. Same signature, defaults and conversions as the
    # generated __init__ + the former __post_init__ (tests/unit/test_client_fastpaths.py).
    # The stores: a Message is briefly a _MessageSlots (same slots, no frozen __setattr__)
    # and takes plain attribute stores, 0.47 -> 0.28 µs a Message() (the slot descriptors'
    # __set__ are a method call each): `send_batch([Message(...) for ...])` is the API users
    # call first and paid ~0.6 µs a message over send_batch(bodies, topic=...) for it
    # (docs/benchmarks.md, "The API users call first"). Every conversion that can raise runs
    # before the swap, so a Message() that fails never leaves a _MessageSlots behind.
    def __init__(self, topic: str, body: bytes = b"", tags: str | None = None, keys: tuple = (),
                 properties: Mapping[str, str] | None = None, delay_level: int = 0, flag: int = 0,
                 wait_store_msg_ok: bool = True, deliver_at_ms: int | None = None):
        if type(body) is not bytes:
            if isinstance(body, str):
                body = body.encode()
            elif not isinstance(body, bytes):
                body = bytes(body)
        if keys != ():
            keys = _keys_tuple(keys)
        if type(properties) is not FrozenProperties:
            properties = _NO_PROPS if properties is None else _frozen_props(properties)
        if type(self) is Message:
            _set_attr(self, "__class__", _MessageSlots)
            self.topic = topic
            self.body = body
            self.tags = tags
            self.keys = keys
            self.properties = properties
            self.delay_level = delay_level
            self.flag = flag
            self.wait_store_msg_ok = wait_store_msg_ok
            self.deliver_at_ms = deliver_at_ms
            self.__class__ = Message
            return
        # a dataclass subclass (other slots: no swap), through the slot descriptors
        _set_topic(self, topic)
        _set_body(self, body)
        _set_tags(self, tags)
        _set_keys(self, keys)
        _set_properties(self, properties)
        _set_delay_level(self, delay_level)
        _set_flag(self, flag)
        _set_wait_store_msg_ok(self, wait_store_msg_ok)
        _set_deliver_at_ms(self, deliver_at_ms)

    def __post_init__(self):
        # Not called by the __init__ above: a dataclass *subclass*'s generated __init__
        # stores its arguments as given and then calls this, so they get the same
        # conversions (the fields re-stored through Message's own __init__).
        Message.__init__(self, *[getattr(self, f.name) for f in fields(Message)])

    __hash__ = None  # properties is a mapping

    def wire_properties_text(self, uniq_key: str | None = None) -> str:
        """encode_properties(self.wire_properties(uniq_key)), built without the dict
        (the send hot path). Raises ValueError for the same bad user properties."""
        props = self.properties
        if not props:
            if not self.tags and not self.keys and self.delay_level <= 0 and self.deliver_at_ms is None:
                # a plain message (the most common): WAIT and the id alone, no list
                wait = "WAIT\x01true" if self.wait_store_msg_ok else "WAIT\x01false"
                return wait if uniq_key is None else f"{wait}\x02UNIQ_KEY\x01{uniq_key}"
        elif not _WIRE_KEYS.isdisjoint(props):
            return msgcodec.encode_properties(self.wire_properties(uniq_key))
        head = msgcodec.encode_properties(props) if props else ""
        parts = [head] if head else []
        if self.tags:
            parts.append(f"TAGS\x01{self.tags}")
        if self.keys:
            parts.append("KEYS\x01" + " ".join(self.keys))
        if self.delay_level > 0:
            parts.append(f"DELAY\x01{self.delay_level}")
        if self.deliver_at_ms is not None:
            parts.append(f"TIMER_DELIVER_MS\x01{self.deliver_at_ms}")
        parts.append("WAIT\x01true" if self.wait_store_msg_ok else "WAIT\x01false")
        if uniq_key is not None:
            parts.append(f"UNIQ_KEY\x01{uniq_key}")
        if len(parts) == 1:
            return parts[0]
        text = "\x02".join(parts)
        if "\x02" in (self.tags or "") or any("\x02" in k for k in self.keys):
            # the dict route raises for these; keep the same error
            return msgcodec.encode_properties(self.wire_properties(uniq_key))
        return text

    def wire_properties(self, uniq_key: str | None = None) -> dict[str, str]:
        """System + user properties as sent (order like Java: user ones first is irrelevant)."""
        props = dict(self.properties)
        if self.tags:
            props[PropertyKey.TAGS] = self.tags
        if self.keys:
            props[PropertyKey.KEYS] = " ".join(self.keys)
        if self.delay_level > 0:
            props[PropertyKey.DELAY] = str(self.delay_level)
        if self.deliver_at_ms is not None:
            props[PropertyKey.TIMER_DELIVER_MS] = str(self.deliver_at_ms)
        props[PropertyKey.WAIT] = "true" if self.wait_store_msg_ok else "false"
        if uniq_key is not None:
            props[PropertyKey.UNIQ_KEY] = uniq_key
        return props


def _slot_setters(cls) -> tuple:
    """The __set__ of each field's slot descriptor, in field order: how the hand-written
    __init__s of the frozen dataclasses below store without object.__setattr__."""
    return tuple(cls.__dict__[f.name].__set__ for f in fields(cls))


(_set_topic, _set_body, _set_tags, _set_keys, _set_properties, _set_delay_level, _set_flag,
 _set_wait_store_msg_ok, _set_deliver_at_ms) = _slot_setters(Message)
_set_attr = object.__setattr__      # for "__class__": past the frozen __setattr__
_NO_PROPS = _frozen_props(None)


def _slots_twin(cls) -> type:
    """A plain class with `cls`'s slots (same layout: __class__ may move between the two)
    and no frozen __setattr__: what a frozen dataclass's hand-written __init__ turns its
    instance into while it stores the fields, then back."""
    twin = type(f"_{cls.__name__}Slots", (), {"__slots__": cls.__slots__})
    probe = object.__new__(cls)
    _set_attr(probe, "__class__", twin)   # raises here, at import, should the layouts ever differ
    return twin


_MessageSlots = _slots_twin(Message)


class SendStatus(Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class SendResult:
    status: SendStatus
    msg_id: str                 # UNIQ_KEY (client id); comma-joined for batches
    offset_msg_id: str          # broker id(s): store host + commit-log offset
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None
    region_id: str = "DefaultRegion"
    trace_on: bool = True

    # Written by hand, as Message's: the generated __init__ of a frozen dataclass stores
    # each field through object.__setattr__ (0.86 against 0.50 µs here), and a coalesced
    # send builds one SendResult per message. Same signature and defaults as the generated
    # one (tests/unit/test_client_fastpaths.py); still frozen to attribute assignment
    # (only code that calls the slot descriptors' __set__ itself, as this does, can store).
    # A dataclass subclass (TransactionSendResult) gets its own generated __init__. The
    # stores as Message's (a _SendResultSlots for their time, 0.33 -> 0.25 µs; nothing
    # here raises); a subclass calling this one, through the slot descriptors.
    def __init__(self, status: SendStatus, msg_id: str, offset_msg_id: str, queue: MessageQueue,
                 queue_offset: int, transaction_id: str | None = None, region_id: str = "DefaultRegion",
                 trace_on: bool = True):
        if type(self) is SendResult:
            _set_attr(self, "__class__", _SendResultSlots)
            self.status = status
            self.msg_id = msg_id
            self.offset_msg_id = offset_msg_id
            self.queue = queue
            self.queue_offset = queue_offset
            self.transaction_id = transaction_id
            self.region_id = region_id
            self.trace_on = trace_on
            self.__class__ = SendResult
            return
        _sr_status(self, status)
        _sr_msg_id(self, msg_id)
        _sr_offset_msg_id(self, offset_msg_id)
        _sr_queue(self, queue)
        _sr_queue_offset(self, queue_offset)
        _sr_transaction_id(self, transaction_id)
        _sr_region_id(self, region_id)
        _sr_trace_on(self, trace_on)

    @property
    def ok(self) -> bool:
        return self.status is SendStatus.SEND_OK


(_sr_status, _sr_msg_id, _sr_offset_msg_id, _sr_queue, _sr_queue_offset, _sr_transaction_id, _sr_region_id,
 _sr_trace_on) = _slot_setters(SendResult)
_SendResultSlots = _slots_twin(SendResult)


def send_results(status: SendStatus, msg_ids: Sequence[str], offset_msg_ids: Sequence[str], queue,
                 queue_offsets: Iterable[int], transaction_id: str | None = None,
                 region_id: str = "DefaultRegion", trace_on: bool = True) -> list[SendResult]:
    """[SendResult(status, msg_ids[i], offset_msg_ids[i], queue, queue_offsets[i],
    transaction_id, region_id, trace_on) for each i]: a coalesced group's results, one per
    send. The same stores as SendResult.__init__ (an instance made as its slots twin, the
    fields stored, then made a SendResult) without a constructor call per result: 32
    results 16.5 -> 8.2 µs, measured; a producer with 64 sends in flight spent a tenth of
    its own time building them (docs/benchmarks.md). Pinned to the constructor by
    tests/unit/test_client_fastpaths.py. Columns of different lengths: ValueError."""
    out = []
    append = out.append
    new = object.__new__
    twin = _SendResultSlots
    cls = SendResult
    for msg_id, offset_msg_id, queue_offset in zip(msg_ids, offset_msg_ids, queue_offsets, strict=True):
        r = new(twin)
        r.status = status
        r.msg_id = msg_id
        r.offset_msg_id = offset_msg_id
        r.queue = queue
        r.queue_offset = queue_offset
        r.transaction_id = transaction_id
        r.region_id = region_id
        r.trace_on = trace_on
        r.__class__ = cls
        append(r)
    return out


# --- UNIQ_KEY ------------------------------------------------------------------------------

def _local_ipv4_bytes() -> bytes:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))   # no packet is sent for a UDP connect
            ip = s.getsockname()[0]
    except OSError:
        ip = "127.0.0.1"
    try:
        return socket.inet_aton(ip)
    except OSError:
        return b"\x7f\x00\x00\x01"


class UniqIdGenerator:
    """32 upper-case hex chars like Java's MessageClientIDSetter:
    ip(4) + pid(2) + random(4) + ms since start of month(4) + counter(2)."""

    def __init__(self, ip: bytes | None = None, pid: int | None = None, now_ms=None):
        ip = ip if ip is not None else _local_ipv4_bytes()
        pid = (pid if pid is not None else os.getpid()) & 0xFFFF
        self._prefix = (ip + pid.to_bytes(2, "big") + random.getrandbits(32).to_bytes(4, "big")).hex().upper()
        self._counter = itertools.count(random.getrandbits(15))
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self._month_start_ms = 0
        self._next_month_ms = 0
        self._last_ms = -1
        self._head = ""

    def _roll_month(self, now_ms: int) -> None:
        t = time.gmtime(now_ms / 1000)
        start = time.struct_time((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0))
        import calendar
        self._month_start_ms = calendar.timegm(start) * 1000
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        self._next_month_ms = calendar.timegm((year, month, 1, 0, 0, 0, 0, 0, 0)) * 1000

    def _head_now(self) -> str:
        """The id's first 28 characters: prefix + ms since the start of the month."""
        now = self._now_ms()
        if now != self._last_ms:
            if now >= self._next_month_ms:
                self._roll_month(now)
            since = (now - self._month_start_ms) & 0xFFFFFFFF
            self._last_ms = now
            self._head = f"{self._prefix}{since:08X}"
        return self._head

    def next_id(self) -> str:
        return f"{self._head_now()}{next(self._counter) & 0xFFFF:04X}"

    def next_id_counters(self, n: int) -> tuple[str, bytes]:
        """n ids as next_ids(n) gives them, without a string per id: (head, counters) where
        counters holds the ids' 16-bit counters as n big-endian unsigned shorts: id i is
        head + counters[2 * i:2 * i + 2].hex().upper(). The batch send path's template
        (counters.hex().upper() are the ids' last 4 characters back to back; a slice of a
        table, no Python int per id)."""
        head = self._head_now()
        # all n counter values in one C call (the GIL held throughout): another thread's
        # next_id() cannot take one of them between a first value and the skip of the rest
        last = next(itertools.islice(self._counter, n - 1, n))
        return head, _counter_run(last - (n - 1), n)

    def reseed(self) -> None:
        """In a forked child: its own pid and random part and a fresh counter, as a new
        process would have (else parent and child make the same ids in the same ms)."""
        ip = bytes.fromhex(self._prefix[:8])
        pid = os.getpid() & 0xFFFF
        self._prefix = (ip + pid.to_bytes(2, "big") + random.getrandbits(32).to_bytes(4, "big")).hex().upper()
        self._counter = itertools.count(random.getrandbits(15))
        self._last_ms = -1

    def next_ids(self, n: int) -> list[str]:
        """n ids, as n calls of next_id() within one millisecond would give."""
        first = self.next_id()
        head = first[:-4]
        counter = self._counter
        return [first] + [f"{head}{next(counter) & 0xFFFF:04X}" for _ in range(n - 1)]


_BE16: bytes = b""


def _counter_run(start: int, n: int) -> bytes:
    """The 16-bit counters start, start+1, ... (mod 2**16) of n ids as big-endian unsigned
    shorts: slices of a 128 KiB table of every value (built on first use), so a run of
    ids costs a slice, not a Python int per id."""
    global _BE16
    table = _BE16
    if not table:
        a = array("H", range(0x10000))
        if sys.byteorder == "little":
            a.byteswap()
        table = _BE16 = a.tobytes()
    start = 2 * (start & 0xFFFF)
    end = start + 2 * n
    if end <= len(table):
        return table[start:end]
    parts = [table[start:]]             # the counter wraps at 0xFFFF
    end -= len(table)
    while end > len(table):
        parts.append(table)
        end -= len(table)
    parts.append(table[:end])
    return b"".join(parts)


def as_message_list(msgs: Iterable) -> list[Message]:
    out = list(msgs)
    for m in out:
        if not isinstance(m, Message):
            raise TypeError(f"expected Message, got {type(m).__name__}")
    return out
