"""Typed messages of the client: Message (to send), MessageExt (received), SendResult.

Message and SendResult are frozen dataclasses. MessageExt is an immutable tuple-based
value with lazily decoded properties that presents itself to `dataclasses` as a frozen
dataclass (is_dataclass, fields, asdict, replace work); a tuple because a pull body
becomes thousands of them per second and most listeners read a few fields.
Properties are FrozenProperties: dicts that refuse mutation (a dict, not a
MappingProxyType, so deepcopy, pickle, asdict and json.dumps work). System
property keys are RocketMQ's (MessageConst); the wire form of properties is
`name\\x01value\\x02...` (protocol reference 5.5).
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import random
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from operator import itemgetter

from pocketmq.common.constants import RETRY_GROUP_TOPIC_PREFIX
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.message import decode_properties, encode_properties  # noqa: F401 (re-exported)

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
    SHARDING_KEY = "__SHARDINGKEY"


SYSTEM_PROPERTY_KEYS = frozenset({
    "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID", "TRAN_MSG", "PGROUP",
    "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG",
    "MQ2_FLAG", "RECONSUME_TIME", "MSG_REGION", "TRACE_ON", "UNIQ_KEY", "MAX_RECONSUME_TIMES",
    "CONSUME_START_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "TRANSACTION_CHECK_TIMES",
    "CHECK_IMMUNITY_TIME_IN_SECONDS", "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL",
    "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE", "INNER_MULTI_DISPATCH",
    "INNER_MULTI_QUEUE_OFFSET", "__SHARDINGKEY",
})

DELAY_LEVEL_MAX = 18
_WIRE_KEYS = frozenset({"TAGS", "KEYS", "DELAY", "WAIT", "UNIQ_KEY"})


class FrozenProperties(dict):
    """Message properties: a dict whose mutators raise TypeError."""
    __slots__ = ()

    def _read_only(self, *args, **kwargs):
        raise TypeError("message properties are read-only")

    __setitem__ = __delitem__ = __ior__ = _read_only
    setdefault = pop = popitem = clear = update = _read_only

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return FrozenProperties, (dict(self),)

    def __repr__(self) -> str:
        return f"FrozenProperties({dict.__repr__(self)})"


_NO_PROPS: Mapping[str, str] = FrozenProperties()


def _frozen_props(props) -> Mapping[str, str]:
    if type(props) is FrozenProperties:
        return props
    if not props:
        return _NO_PROPS
    return FrozenProperties({str(k): str(v) for k, v in props.items()})


def _keys_tuple(keys) -> tuple[str, ...]:
    if not keys:
        return ()
    if isinstance(keys, str):
        return tuple(k for k in keys.split(" ") if k)
    return tuple(str(k) for k in keys)


@dataclass(frozen=True, slots=True)
class Message:
    """A message to send.

    `keys` may be a string ("k1 k2") or an iterable; `properties` are user
    properties and must not use system keys (KEYS, TAGS, DELAY, ...): use the
    dedicated fields. A `str` body is encoded as UTF-8.
    """
    topic: str
    body: bytes = b""
    tags: str | None = None
    keys: tuple = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    delay_level: int = 0
    flag: int = 0
    wait_store_msg_ok: bool = True

    def __post_init__(self):
        body = self.body
        if type(body) is not bytes:
            if isinstance(body, str):
                object.__setattr__(self, "body", body.encode())
            elif not isinstance(body, bytes):
                object.__setattr__(self, "body", bytes(body))
        if self.keys != ():
            object.__setattr__(self, "keys", _keys_tuple(self.keys))
        props = self.properties
        if type(props) is not FrozenProperties:
            object.__setattr__(self, "properties", _frozen_props(props))

    __hash__ = None  # properties is a mapping

    def wire_properties_text(self, uniq_key: str | None = None) -> str:
        """encode_properties(self.wire_properties(uniq_key)), built without the dict
        (the send hot path). Raises ValueError for the same bad user properties."""
        props = self.properties
        if props and not _WIRE_KEYS.isdisjoint(props):
            return msgcodec.encode_properties(self.wire_properties(uniq_key))
        head = msgcodec.encode_properties(props) if props else ""
        parts = [head] if head else []
        if self.tags:
            parts.append(f"TAGS\x01{self.tags}")
        if self.keys:
            parts.append("KEYS\x01" + " ".join(self.keys))
        if self.delay_level > 0:
            parts.append(f"DELAY\x01{self.delay_level}")
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
        props[PropertyKey.WAIT] = "true" if self.wait_store_msg_ok else "false"
        if uniq_key is not None:
            props[PropertyKey.UNIQ_KEY] = uniq_key
        return props


_FIELDS = ("topic", "body", "queue_id", "queue_offset", "properties", "flag", "sys_flag",
           "commit_log_offset", "born_timestamp", "born_host", "store_timestamp", "store_host",
           "reconsume_times", "prepared_transaction_offset", "body_crc", "store_size", "broker_name",
           "real_topic")
_tuple_new = tuple.__new__
_field = property  # readability below


def _host_text(raw) -> str:
    if type(raw) is str:
        return raw
    return msgcodec.format_host(raw[0], raw[1])


class MessageExt(tuple):
    """A message as stored by the broker and delivered to consumers (immutable).

    `msg_id` is the producer-generated UNIQ_KEY when present (what SendResult.msg_id
    returned), else the broker's `offset_msg_id`; `topic` is the original topic for
    messages redelivered from `%RETRY%<group>`.

    Built straight from a decoded pull body (`from_raw`) without parsing what a
    listener may never read: `properties` is made from the stored properties text
    on first access, `born_host` / `store_host` are formatted on first access.
    Fields are read-only (assigning raises dataclasses.FrozenInstanceError);
    equality compares the field values; `dataclasses` sees the fields of
    _MessageExtFields (below), so fields(), asdict() and replace() work.
    """
    # Storage: a tuple in the field order of _FIELDS (properties and hosts possibly raw);
    # values computed lazily are cached in the instance __dict__.

    def __new__(cls, topic: str, body: bytes, queue_id: int, queue_offset: int, broker_name: str = "",
                properties: Mapping[str, str] | None = None, flag: int = 0, sys_flag: int = 0,
                commit_log_offset: int = 0, born_timestamp: int = 0, born_host: str = "",
                store_timestamp: int = 0, store_host: str = "", reconsume_times: int = 0,
                prepared_transaction_offset: int = 0, body_crc: int = 0, store_size: int = 0,
                real_topic: str = ""):
        return _tuple_new(cls, (topic, body, queue_id, queue_offset, _frozen_props(properties), flag,
                                sys_flag, commit_log_offset, born_timestamp, born_host, store_timestamp,
                                store_host, reconsume_times, prepared_transaction_offset, body_crc,
                                store_size, broker_name, real_topic))

    topic = _field(itemgetter(0))
    body = _field(itemgetter(1))
    queue_id = _field(itemgetter(2))
    queue_offset = _field(itemgetter(3))
    flag = _field(itemgetter(5))
    sys_flag = _field(itemgetter(6))
    commit_log_offset = _field(itemgetter(7))
    born_timestamp = _field(itemgetter(8))
    store_timestamp = _field(itemgetter(10))
    reconsume_times = _field(itemgetter(12))
    prepared_transaction_offset = _field(itemgetter(13))
    body_crc = _field(itemgetter(14))
    store_size = _field(itemgetter(15))
    broker_name = _field(itemgetter(16))
    real_topic = _field(itemgetter(17))    # topic the record was read from (e.g. %RETRY%group)

    @property
    def properties(self) -> Mapping[str, str]:
        p = self[4]
        if type(p) is str:
            d = self.__dict__
            cached = d.get("properties")
            if cached is None:
                cached = d["properties"] = FrozenProperties(decode_properties(p)) if p else _NO_PROPS
            return cached
        return p

    @property
    def born_host(self) -> str:
        return _host_text(self[9])

    @property
    def store_host(self) -> str:
        return _host_text(self[11])

    def _property(self, name: str) -> str | None:
        p = self[4]
        if type(p) is str and "properties" not in self.__dict__:
            return msgcodec.property_value(p, name) if p else None
        return self.properties.get(name)

    @classmethod
    def from_raw(cls, t: tuple, broker_name: str = "") -> MessageExt:
        """From one tuple of protocol.message.decode_records_raw. Messages redelivered
        through `%RETRY%<group>` get their original topic back (RETRY_TOPIC)."""
        topic = t[0]
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            orig = msgcodec.property_value(t[4], PropertyKey.RETRY_TOPIC) if t[4] else None
            if orig:
                return _tuple_new(cls, (orig,) + t[1:] + (broker_name, topic))
        return _tuple_new(cls, t + (broker_name, topic))

    @classmethod
    def from_record(cls, rec, broker_name: str = "") -> MessageExt:
        """From a decoded stored record (protocol.message.MessageExt). Messages
        redelivered through `%RETRY%<group>` get their original topic back
        (RETRY_TOPIC), like the Java client's resetRetryAndNamespace."""
        props = rec.properties
        topic = rec.topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            topic = props.get(PropertyKey.RETRY_TOPIC) or topic
        return cls(topic, rec.body, rec.queue_id, rec.queue_offset, broker_name, FrozenProperties(props), rec.flag, rec.sys_flag, rec.commit_log_offset,
                   rec.born_timestamp, rec.born_host, rec.store_timestamp, rec.store_host,
                   rec.reconsume_times, rec.prepared_transaction_offset, rec.body_crc, rec.store_size,
                   rec.topic)

    # -- immutable value semantics -------------------------------------------------------
    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def _values(self) -> tuple:
        return tuple(getattr(self, f) for f in _FIELDS)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    __hash__ = None
    __lt__ = __le__ = __gt__ = __ge__ = None

    def __repr__(self) -> str:
        return "MessageExt(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in _FIELDS) + ")"

    def __reduce__(self):
        values = self._values()
        return (_message_ext_from_fields, (values[:4] + (dict(values[4]),) + values[5:],))

    # -- views -------------------------------------------------------------------------
    @property
    def offset_msg_id(self) -> str:
        """The broker's id: store host + commit-log offset (32 hex chars for IPv4)."""
        raw = self[11]
        if type(raw) is str:
            if not raw:
                return ""
            addr, port = msgcodec.parse_host(raw)
        else:
            addr, port = raw
        return msgcodec.offset_msg_id(addr, port, self[7])

    @property
    def msg_id(self) -> str:
        """UNIQ_KEY (the id SendResult.msg_id returned) when present, else offset_msg_id."""
        return self._property(PropertyKey.UNIQ_KEY) or self.offset_msg_id

    @property
    def tags(self) -> str | None:
        return self._property(PropertyKey.TAGS)

    @property
    def keys(self) -> tuple[str, ...]:
        return _keys_tuple(self._property(PropertyKey.KEYS))

    @property
    def delay_level(self) -> int:
        v = self._property(PropertyKey.DELAY)
        return int(v) if v and v.isdigit() else 0

    @property
    def user_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k not in SYSTEM_PROPERTY_KEYS}

    @property
    def queue(self) -> MessageQueue:
        """The queue this message was pulled from."""
        return MessageQueue(self[17] or self[0], self[16], self[2])


@dataclass(frozen=True)
class _MessageExtFields:
    """MessageExt's fields as `dataclasses` sees them (same names and order as
    MessageExt's constructor)."""
    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    broker_name: str = ""
    properties: Mapping[str, str] | None = None
    flag: int = 0
    sys_flag: int = 0
    commit_log_offset: int = 0
    born_timestamp: int = 0
    born_host: str = ""
    store_timestamp: int = 0
    store_host: str = ""
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0
    store_size: int = 0
    real_topic: str = ""


type.__setattr__(MessageExt, "__dataclass_fields__", _MessageExtFields.__dataclass_fields__)
type.__setattr__(MessageExt, "__dataclass_params__", _MessageExtFields.__dataclass_params__)
type.__setattr__(MessageExt, "__match_args__", _MessageExtFields.__match_args__)


def _message_ext_from_fields(values: tuple) -> MessageExt:
    (topic, body, queue_id, queue_offset, properties, flag, sys_flag, commit_log_offset, born_timestamp,
     born_host, store_timestamp, store_host, reconsume_times, prepared_transaction_offset, body_crc,
     store_size, broker_name, real_topic) = values
    return MessageExt(topic, body, queue_id, queue_offset, broker_name, dict(properties), flag, sys_flag,
                      commit_log_offset, born_timestamp, born_host, store_timestamp, store_host,
                      reconsume_times, prepared_transaction_offset, body_crc, store_size, real_topic)


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

    @property
    def ok(self) -> bool:
        return self.status is SendStatus.SEND_OK


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

    def next_id(self) -> str:
        now = self._now_ms()
        if now != self._last_ms:
            if now >= self._next_month_ms:
                self._roll_month(now)
            since = (now - self._month_start_ms) & 0xFFFFFFFF
            self._last_ms = now
            self._head = f"{self._prefix}{since:08X}"
        return f"{self._head}{next(self._counter) & 0xFFFF:04X}"

    def next_ids(self, n: int) -> list[str]:
        """n ids, as n calls of next_id() within one millisecond would give."""
        first = self.next_id()
        head = first[:-4]
        counter = self._counter
        return [first] + [f"{head}{next(counter) & 0xFFFF:04X}" for _ in range(n - 1)]


def as_message_list(msgs: Iterable) -> list[Message]:
    out = list(msgs)
    for m in out:
        if not isinstance(m, Message):
            raise TypeError(f"expected Message, got {type(m).__name__}")
    return out
