"""RocketMQ messages: the stored record codec, properties, batch bodies, message ids.

PURE module: stdlib only, no I/O, no clock. The one owner of the stored-record format:
the layout below as named positions and functions (POS_*, head_struct, store_timestamp_at,
host_flags, ...), the one record writer (join_records: single records and batches, whose shared
header fields it packs once), the one SEND_BATCH body parser (parse_batch_body), the decoders and the one
decoded-message type, MessageExt. The stores and the client import these.

Stored record (CommitLog entry; also what PULL / VIEW / QUERY bodies contain),
big-endian, signed Java types. Offsets for IPv4 hosts; an IPv6 BORNHOST
(sysFlag 0x10) or STOREHOST (sysFlag 0x20) takes 20 bytes instead of 8 and
shifts everything after it by 12.

| #  | field                     | size  | offset (IPv4) | notes                                        |
|----|---------------------------|-------|---------------|----------------------------------------------|
| 1  | TOTALSIZE                 | 4     | 0             | whole record, this field included            |
| 2  | MAGICCODE                 | 4     | 4             | -626843481 (0xDAA320A7)                       |
| 3  | BODYCRC                   | 4     | 8             | zlib.crc32(stored body) & 0x7FFFFFFF          |
| 4  | QUEUEID                   | 4     | 12            |                                              |
| 5  | FLAG                      | 4     | 16            | user flag                                    |
| 6  | QUEUEOFFSET               | 8     | 20            | logical offset in the consume queue          |
| 7  | PHYSICALOFFSET            | 8     | 28            | offset of this record in the commit log      |
| 8  | SYSFLAG                   | 4     | 36            | MessageSysFlag                               |
| 9  | BORNTIMESTAMP             | 8     | 40            | ms                                           |
| 10 | BORNHOST                  | 8/20  | 48            | 4 (16) address bytes + int port              |
| 11 | STORETIMESTAMP            | 8     | 56 (68 v6)    | ms                                           |
| 12 | STOREHOST                 | 8/20  | 64            | 4 (16) address bytes + int port              |
| 13 | RECONSUMETIMES            | 4     | 72            |                                              |
| 14 | PREPAREDTRANSACTIONOFFSET | 8     | 76            |                                              |
| 15 | BODYLENGTH + BODY         | 4 + n | 84            | compressed bytes when SYSFLAG bit 0          |
| 16 | TOPICLENGTH + TOPIC       | 1 + n | 88 + n        | 1 signed byte, so topic <= 127 bytes, UTF-8  |
| 17 | PROPERTIESLENGTH + PROPS  | 2 + n | ...           | signed short, <= 32767 bytes, UTF-8          |

Fixed overhead: 91 bytes with two IPv4 hosts, 103 with one IPv6 host, 115 with two.

End-of-file filler in a commit-log segment: 8 bytes [int remaining][int BLANK_MAGIC_CODE].

Batch body (SEND_BATCH_MESSAGE), per element:
[int TOTALSIZE][int MAGIC=0][int BODYCRC=0][int FLAG][int BODYLEN][BODY][short PROPLEN][PROPS].
TOTALSIZE is ignored on decode (Java ignores it; the C++ client writes 20+n+2+m
instead of 22+n+m). We write 22 + bodyLen + propsLen like Java.

offsetMsgId: hex(upper) of STOREHOST address bytes + int port + long commit-log offset
(32 chars for IPv4, 56 for IPv6).
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain as _chain
from itertools import repeat as _repeat
from operator import and_ as _and
from operator import itemgetter
from operator import sub as _sub

from pocketmq.protocol.bodies import MessageQueue

__all__ = [
    "record_struct",
    "MESSAGE_MAGIC_CODE", "BLANK_MAGIC_CODE", "MessageSysFlag",
    "MessageExt", "java_string_hash", "tags_code", "encode_properties",
    "decode_properties", "encode_record", "encode_record_into", "patch_record",
    "record_size", "decode_record", "decode_records", "decode_records_raw", "offset_msg_id",
    "decode_offset_msg_id", "decode_batch_body", "encode_batch_body", "encode_batch_elements",
    "compress_body", "decompress_body", "parse_host", "format_host",
    "store_timestamp_pos", "property_value", "tags_code_of_properties", "tags_codes_of_properties", "properties_at",
    "index_fields_at",
    "property_getter",
    # batch reads of many records' properties (the broker's SQL92 filter, a whole pull at a time)
    "properties_at_many", "property_keys", "property_slots", "slot_names_ok", "SLOTS_MAX_PROPERTIES",
    # the record layout, for the stores (one owner: nothing else retypes an offset or a mask)
    "POS_QUEUE_OFFSET", "POS_PHYSICAL_OFFSET", "POS_SYSFLAG", "POS_BORN_TIMESTAMP", "POS_BORN_HOST",
    "RECORD_HEAD_MIN", "HOST_V6_FLAGS", "PORT_MAX", "MAX_INT", "BLANK_MARKER_SIZE", "head_struct", "head_struct_at",
    "sys_flag_at", "queue_offset_at", "store_timestamp_at", "record_overhead", "body_crc", "host_flags",
    "pack_blank_marker", "unpack_size_magic", "topic_field", "join_records", "join_uniform_records",
    "parse_batch_body", "parse_uniform_batch_body", "decode_records_skipping", "FrozenProperties", "frozen_properties",
    "keys_tuple", "SYSTEM_PROPERTY_KEYS", "offset_msg_id_prefix", "offset_msg_ids",
    # column-wise readers (the Spark source): where each head field sits, record boundaries
    "head_positions", "record_starts", "record_starts_np",
]

# --------------------------------------------------------------------------- constants

MESSAGE_MAGIC_CODE = -626843481          # 0xDAA320A7 as a signed int
BLANK_MAGIC_CODE = -875286124            # 0xCBD43194 as a signed int
TOPIC_LENGTH_BYTES_MAX = 127
PROPERTIES_LENGTH_BYTES_MAX = 32767
BATCH_ELEMENT_OVERHEAD = 22              # 4+4+4+4+4 + 2 (+ body + properties)
MAX_INT = 0x7FFFFFFF
PORT_MAX = 0xFFFF                        # a host's port (int on the wire, 16 bits in practice)

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "


class MessageSysFlag:
    """Bits of the SYSFLAG int (§5.4)."""

    COMPRESSED_FLAG = 0x1
    MULTI_TAGS_FLAG = 0x2
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_PREPARED_TYPE = 0x4
    TRANSACTION_COMMIT_TYPE = 0x8
    TRANSACTION_ROLLBACK_TYPE = 0xC
    TRANSACTION_MASK = 0xC
    BORNHOST_V6_FLAG = 0x10
    STOREHOSTADDRESS_V6_FLAG = 0x20
    NEED_UNWRAP_FLAG = 0x40
    INNER_BATCH_FLAG = 0x80
    COMPRESSION_LZ4 = 0x100
    COMPRESSION_ZSTD = 0x200
    COMPRESSION_ZLIB = 0x300
    COMPRESSION_TYPE_MASK = 0x700

    @staticmethod
    def transaction_value(sys_flag: int) -> int:
        return sys_flag & MessageSysFlag.TRANSACTION_MASK

    @staticmethod
    def reset_transaction_value(sys_flag: int, tran_type: int) -> int:
        return (sys_flag & ~MessageSysFlag.TRANSACTION_MASK) | tran_type

    @staticmethod
    def indexed(sys_flag: int) -> bool:
        """Whether a stored record gets a consume-queue unit: plain and committed messages
        do; prepared and rolled-back transaction halves do not (Java's reput rule)."""
        tran = sys_flag & MessageSysFlag.TRANSACTION_MASK
        return tran == MessageSysFlag.TRANSACTION_NOT_TYPE or tran == MessageSysFlag.TRANSACTION_COMMIT_TYPE


# Property keys (MessageConst, 4.9.4).
KEYS = "KEYS"
TAGS = "TAGS"
WAIT = "WAIT"
DELAY = "DELAY"
RETRY_TOPIC = "RETRY_TOPIC"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
MIN_OFFSET = "MIN_OFFSET"
MAX_OFFSET = "MAX_OFFSET"
BUYER_ID = "BUYER_ID"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
TRANSFER_FLAG = "TRANSFER_FLAG"
CORRECTION_FLAG = "CORRECTION_FLAG"
MQ2_FLAG = "MQ2_FLAG"
RECONSUME_TIME = "RECONSUME_TIME"
MSG_REGION = "MSG_REGION"
TRACE_ON = "TRACE_ON"
UNIQ_KEY = "UNIQ_KEY"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
CONSUME_START_TIME = "CONSUME_START_TIME"
TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
INSTANCE_ID = "INSTANCE_ID"
CORRELATION_ID = "CORRELATION_ID"
REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
TTL = "TTL"
ARRIVE_TIME = "ARRIVE_TIME"
PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
CLUSTER = "CLUSTER"
MSG_TYPE = "MSG_TYPE"
INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
SHARDING_KEY = "__SHARDINGKEY"
# RocketMQ 5's timer messages (MessageConst 5.x; rules in broker/core/timer.py): what a
# producer sets (an absolute time, or a delay from the broker's clock on arrival) ...
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
# ... and what the broker writes: the delivery time it computed, when the message was
# parked and when it was delivered; TIMER_DEL_UNIQKEY (cancel a timer) is refused.
TIMER_OUT_MS = "TIMER_OUT_MS"
TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"

# --------------------------------------------------------------------------- hashing


def java_string_hash(s: str) -> int:
    """Java String.hashCode(): h = 31*h + c over UTF-16 code units, signed 32-bit."""
    h = 0
    if s.isascii():
        for c in s.encode("ascii"):
            h = (31 * h + c) & 0xFFFFFFFF
    else:
        units = s.encode("utf-16-be", "surrogatepass")
        for (c,) in struct.iter_unpack(">H", units):
            h = (31 * h + c) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


@lru_cache(maxsize=4096)
def tags_code(tags: str | None) -> int:
    """Consume-queue tagsCode of a TAGS value (0 for None / empty); sign-extended when packed as a long."""
    if not tags:
        return 0
    return java_string_hash(tags)


# --------------------------------------------------------------------------- properties


def encode_properties(props: dict[str, str | None]) -> str:
    """name\\x01value\\x02... without a trailing \\x02 (Java >= 4.9.2). None values are skipped."""
    parts = []
    for k, v in props.items():
        if v is None:
            continue
        if not k or "\x01" in k or "\x02" in k:
            raise ValueError(f"bad property name {k!r}")
        v = str(v)
        if "\x02" in v:
            raise ValueError(f"property {k!r} value contains \\x02")
        parts.append(f"{k}\x01{v}")
    return "\x02".join(parts)


def decode_properties(s: str) -> dict[str, str]:
    """Java's rules: chunks split on \\x02; the first \\x01 splits name and value and
    must be neither the chunk's first nor last char; other chunks are dropped.
    A trailing \\x02 is accepted. Later duplicates win (HashMap.put)."""
    out: dict[str, str] = {}
    if not s:
        return out
    for chunk in s.split("\x02"):
        i = chunk.find("\x01")
        if 0 < i < len(chunk) - 1:
            out[chunk[:i]] = chunk[i + 1:]
    return out


def property_value(props: str, name: str) -> str | None:
    """Value of one property straight from a properties string, without building a dict
    (same result as decode_properties(props).get(name))."""
    key = name + "\x01"
    if props.startswith(key):
        idx = 0
    else:
        idx = -1
    # the last occurrence wins, like HashMap.put in Java's parser
    j = props.rfind("\x02" + key)
    if j >= 0:
        idx = j + 1
    if idx < 0:
        return None
    start = idx + len(key)
    end = props.find("\x02", start)
    if end < 0:
        end = len(props)
    if end == start:
        return None
    return props[start:end]


def property_getter(name: str):
    """Like property_value, on the properties as stored (UTF-8 bytes) and with the keys
    built once: get(props_bytes) -> the raw value bytes, or None. What the broker's SQL92
    filter calls for every record it scans (decoding a value alone gives what decoding the
    whole text would: the separators are ASCII and end any broken UTF-8 sequence)."""
    key = name.encode() + b"\x01"
    sep_key = b"\x02" + key
    klen = len(key)

    def get(props: bytes) -> bytes | None:
        j = props.rfind(sep_key)
        if j >= 0:
            start = j + 1 + klen
        elif props.startswith(key):
            start = klen
        else:
            return None
        end = props.find(b"\x02", start)
        return (props[start:end] if end >= 0 else props[start:]) or None
    return get


_TAGS_KEY_B = b"TAGS\x01"
_TAGS_SEP_KEY_B = b"\x02TAGS\x01"
_tags_code_cache: dict[bytes, int] = {}


def tags_code_of_properties(props: bytes) -> int:
    """tags_code(decode_properties(props.decode()).get("TAGS")) straight from the encoded
    properties bytes (the stored form), without decoding them."""
    i = props.rfind(_TAGS_SEP_KEY_B)
    if i >= 0:
        start = i + 6
    elif props.startswith(_TAGS_KEY_B):
        start = 5
    else:
        return 0
    end = props.find(b"\x02", start)
    value = props[start:end] if end >= 0 else props[start:]
    code = _tags_code_cache.get(value)
    if code is None:
        code = tags_code(value.decode("utf-8", "replace")) if value else 0
        if len(_tags_code_cache) >= 4096:
            _tags_code_cache.clear()
        _tags_code_cache[value] = code
    return code


def tags_codes_of_properties(texts: Sequence[bytes]) -> list[int]:
    """[tags_code_of_properties(t) for t in texts]; all 0 at the cost of one join and one
    search when no text names TAGS (a batch without tags: the name holds no \x02, so no
    match spans two texts joined by it)."""
    if _TAGS_KEY_B in b"\x02".join(texts):
        return list(map(tags_code_of_properties, texts))
    return [0] * len(texts)


def property_keys(props: Sequence[bytes], names: Sequence[str]) -> list:
    """For each properties text (the stored UTF-8 bytes) the values of `names`, exactly
    property_getter's (the last occurrence wins; a missing or empty value is b""): a list
    of bytes for one name, of tuples of bytes (in `names` order) for several. What the
    broker's SQL92 filter keys its per-subscription results on, a whole pull at a time.

    One regex pass per name over all the texts joined, each text preceded by a sentinel
    "\\x02name\\x01\\x03" so that every text yields exactly two matches (the sentinel's
    value b"\\x03", then its own); a text that holds the name twice or not at all, or a
    \\x03 (which would make the sentinel ambiguous), takes property_getter itself for that
    name."""
    n = len(props)
    if not n:
        return []
    columns = []
    clean = None                        # no text holds \x03 (checked once)
    for name in names:
        key = b"\x02" + name.encode() + b"\x01"
        sentinel = key + b"\x03\x02"      # the \x02 starts the text's first chunk
        joined = sentinel + sentinel.join(props)
        if clean is None:
            clean = joined.count(b"\x03") == n
        values = _key_value_re(key).findall(joined) if clean else ()
        if len(values) == 2 * n and values.count(b"\x03") == n and values[0::2].count(b"\x03") == n:
            columns.append(values[1::2])
        else:
            get = property_getter(name)
            columns.append([get(p) or b"" for p in props])
    if len(columns) == 1:
        return columns[0]
    return list(zip(*columns))


# properties a text may hold for property_slots to split texts (more and splitting every
# property costs more than property_keys' regex passes)
SLOTS_MAX_PROPERTIES = 12


def property_slots(props: Sequence[bytes], names: Sequence[str]) -> list | None:
    """property_keys' fast path for texts that share one layout, the common case (one
    producer, the same properties in the same order): for each text a key standing for the
    values of `names` in it, or None when the texts do not share a layout (then
    property_keys). The key is the property itself, b"name\x01value", for one name; a
    tuple of them (in `names` order) for several. It is a properties text (joined with
    \x02 for a tuple) holding exactly the text's values of `names`, so whatever reads only
    `names` reads the same from the key as from the text.

    One split of all texts joined, each followed by a separator property b"\x03": when the
    separators fall exactly every p + 1 items (p: the first text's properties), every text
    has p properties, and a name's property in every text is the item at the same place
    as in the first text; that it is the only one of its name in each text is checked by
    counting b"\x02name\x01" in all texts at once (exactly one per text). Beyond
    SLOTS_MAX_PROPERTIES properties a text, or a name with \x01 or \x02 in it: None.
    A caller that remembers keys must still check that each of a key's properties has
    its name (`slot_names_ok`): that holds for every text only when it does."""
    n = len(props)
    if not n:
        return []
    keys = _slot_keys(tuple(names))
    if keys is None:
        return None
    first = b"\x02" + props[0]
    p = first.count(b"\x02")
    if p > SLOTS_MAX_PROPERTIES:
        return None
    joined = first + b"\x02\x03\x02" + b"\x02\x03\x02".join(props[1:]) if n > 1 else first
    items = joined.split(b"\x02")              # [b"", text 1's p items, b"\x03", text 2's ...]
    stride = p + 1
    if len(items) != n * stride or items[stride::stride].count(b"\x03") != n - 1 \
            or items.count(b"\x03") != n - 1:
        return None
    columns = []
    for sep_key in keys:
        at = first.rfind(sep_key)               # the last of the name in the first text...
        if at < 0 or joined.count(sep_key) != n:    # ...and one of it in every text
            return None
        columns.append(items[first.count(b"\x02", 0, at + 1)::stride])
    if len(columns) == 1:
        return columns[0]
    return list(zip(*columns))


@lru_cache(maxsize=256)
def _slot_keys(names: tuple[str, ...]) -> tuple[bytes, ...] | None:
    """b"\x02name\x01" for each name, None when a name holds \x01 or \x02."""
    keys = tuple(b"\x02" + name.encode() + b"\x01" for name in names)
    return None if any(b"\x02" in k[1:-1] or b"\x01" in k[1:-1] for k in keys) else keys


def slot_names_ok(key, names: Sequence[str]) -> bool:
    """A property_slots key holds `names`' properties (in order): the check that makes
    every one of that call's keys right (see property_slots)."""
    if type(key) is bytes:
        return key.startswith(names[0].encode() + b"\x01")
    return all(item.startswith(name.encode() + b"\x01") for item, name in zip(key, names))


@lru_cache(maxsize=256)
def _key_value_re(key: bytes):
    return re.compile(re.escape(key) + b"([^\x02]*)")


# --------------------------------------------------------------------------- hosts


@lru_cache(maxsize=1024)
def parse_host(host: str) -> tuple[bytes, int]:
    """"ip:port" (IPv6 as "::1:10911" or "[::1]:10911") -> (4 or 16 address bytes, port)."""
    ip, sep, port_s = host.rpartition(":")
    if not sep or not ip:
        raise ValueError(f"host {host!r} is not ip:port")
    if ip.startswith("[") and ip.endswith("]"):
        ip = ip[1:-1]
    try:
        port = int(port_s)
        addr = ipaddress.ip_address(ip)
    except ValueError:
        raise ValueError(f"host {host!r} is not ip:port") from None
    if not 0 <= port <= PORT_MAX:
        raise ValueError(f"host {host!r}: port out of range")
    return addr.packed, port


@lru_cache(maxsize=1024)
def _format_ip(addr: bytes) -> str:
    if len(addr) == 4:
        return "%d.%d.%d.%d" % tuple(addr)
    return str(ipaddress.IPv6Address(addr))


def format_host(addr: bytes, port: int) -> str:
    """(address bytes, port) -> "ip:port" (IPv6 unbracketed, like Java's lastIndexOf(':') parsers expect)."""
    return f"{_format_ip(bytes(addr))}:{port}"


# --------------------------------------------------------------------------- record layout

_I = struct.Struct(">i")
_Q = struct.Struct(">q")
_QQ = struct.Struct(">qq")
_H = struct.Struct(">h")
_B = struct.Struct(">b")
_II = struct.Struct(">ii")

# Field positions of the table above (those before BORNHOST do not depend on the host sizes).
POS_QUEUE_OFFSET = 20
POS_PHYSICAL_OFFSET = 28
POS_SYSFLAG = 36
POS_BORN_TIMESTAMP = 40
POS_BORN_HOST = 48
RECORD_HEAD_MIN = 40            # TOTALSIZE .. SYSFLAG: enough to know the rest of the layout
HOST_V6_FLAGS = MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
_HOST_BITS_SHIFT = 4            # (sys_flag >> 4) & 3 indexes the per-host-size layouts
_POS_SYSFLAG_LOW = POS_SYSFLAG + 3   # SYSFLAG's low byte holds the host bits
BLANK_MARKER_SIZE = 8           # [int remaining][int BLANK_MAGIC_CODE]
_HOST_V4_SIZE, _HOST_V6_SIZE = 4 + 4, 16 + 4     # address bytes + int port

# Fixed head up to and including BODYLENGTH, one Struct per (born v6, store v6); it is
# _HEAD_FIRST (TOTALSIZE .. PHYSICALOFFSET) + a middle (SYSFLAG .. PREPAREDTRANSACTIONOFFSET)
# + BODYLENGTH. The middle is the same for every record of a batch.
_FIRST_FMT = "iiiiiqq"                   # TOTALSIZE MAGICCODE BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET
_MIDDLE_FMT = "iq%dsiq%dsiiq"           # SYSFLAG BORNTIMESTAMP BORNHOST(addr, port) STORETIMESTAMP
                                        # STOREHOST(addr, port) RECONSUMETIMES PREPAREDTRANSACTIONOFFSET
_HEAD_FIRST = struct.Struct(">" + _FIRST_FMT)
assert _HEAD_FIRST.size == POS_SYSFLAG
# index: the host bits of SYSFLAG, (sys_flag >> 4) & 3: born v6 = 1, store v6 = 2
_ADDR_LENS_BY_BITS = [(4, 4), (16, 4), (4, 16), (16, 16)]
_MIDDLES_BY_BITS = [struct.Struct(">" + _MIDDLE_FMT % lens) for lens in _ADDR_LENS_BY_BITS]
_HEADS_BY_BITS = [struct.Struct(">" + _FIRST_FMT + _MIDDLE_FMT % lens + "i") for lens in _ADDR_LENS_BY_BITS]
_pack_first = _HEAD_FIRST.pack
_pack_i = _I.pack
_pack_h = _H.pack
_join = b"".join
_crc32 = zlib.crc32

unpack_size_magic = _II.unpack_from      # (TOTALSIZE, MAGICCODE) at a position: a record or a blank marker


# Names of the fixed head's fields, in _HEADS_BY_BITS' order (hosts as address + port).
_HEAD_FIELDS = ("total_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset", "physical_offset",
                "sys_flag", "born_timestamp", "born_host", "born_port", "store_timestamp", "store_host",
                "store_port", "reconsume_times", "prepared_transaction_offset", "body_length")


def _field_positions(head: struct.Struct) -> dict[str, int]:
    """Offset of each _HEAD_FIELDS entry in a head Struct, read off its format (so the
    positions cannot drift from the codec's), plus "body": where BODY starts."""
    out = {}
    pos = 0
    for name, (count, code) in zip(_HEAD_FIELDS, re.findall(r"(\d*)([a-z])", head.format.lstrip(">"))):
        out[name] = pos
        pos += int(count) if code == "s" else struct.calcsize(">" + code)
    out["body"] = pos
    return out


_POSITIONS_BY_BITS = [_field_positions(h) for h in _HEADS_BY_BITS]
assert all(p["queue_offset"] == POS_QUEUE_OFFSET and p["physical_offset"] == POS_PHYSICAL_OFFSET
           and p["sys_flag"] == POS_SYSFLAG and p["born_timestamp"] == POS_BORN_TIMESTAMP
           and p["born_host"] == POS_BORN_HOST and p["body"] == h.size
           for p, h in zip(_POSITIONS_BY_BITS, _HEADS_BY_BITS))


def head_positions(sys_flag: int) -> Mapping[str, int]:
    """Offset inside a record of each fixed head field (the _HEAD_FIELDS names: queue_id,
    queue_offset, born_timestamp, born_host / born_port, store_timestamp, store_host /
    store_port, reconsume_times, body_length, ...) and of "body", for the host sizes of
    sys_flag: what a column-wise reader gathers at record start + position."""
    return _POSITIONS_BY_BITS[(sys_flag >> _HOST_BITS_SHIFT) & 3]


_COLUMN_SLOW_FLAGS = MessageSysFlag.COMPRESSED_FLAG | HOST_V6_FLAGS


def record_starts(buf) -> tuple[list[int], list[int]] | None:
    """Records laid back to back (a PULL response body), walked once reading only TOTALSIZE,
    MAGICCODE and SYSFLAG's low byte: (start of each record, indexes into it of the records
    a column-wise reader must leave to decode_records_raw). Those are compressed bodies,
    IPv6 hosts (the fields after BORNHOST move) and records that are odd at this depth (a
    wrong magic code, a size below the two-IPv4-host overhead): decode_records_raw
    decompresses or names the problem. The others have head_positions(0)'s layout, their
    sizes fit the buffer, the rest of their framing is the reader's to check. None when the
    sizes do not frame the buffer (a truncated or corrupt body): decode it whole."""
    n = len(buf)
    pos = 0
    starts: list[int] = []
    slow: list[int] = []
    size_magic = _II.unpack_from
    low = _POS_SYSFLAG_LOW
    overhead = record_overhead(0)
    flags = _COLUMN_SLOW_FLAGS
    magic_code = MESSAGE_MAGIC_CODE
    while pos < n:
        if n - pos < RECORD_HEAD_MIN:
            return None
        total, magic = size_magic(buf, pos)
        if total < RECORD_HEAD_MIN or total > n - pos:
            return None
        if magic != magic_code or total < overhead or buf[pos + low] & flags:
            slow.append(len(starts))
        starts.append(pos)
        pos += total
    return starts, slow


_MAGIC_BYTES = struct.pack(">i", MESSAGE_MAGIC_CODE)


def record_starts_np(buf):
    """record_starts' answer as numpy arrays (int64 starts, int64 indexes of the records to
    leave to decode_records_raw), or None as it, without a Python step per record: numpy
    finds every place MAGICCODE's 4 bytes sit; their positions less 4 are taken as the
    records' starts when each one's TOTALSIZE lands exactly on the next and the last on the
    buffer's end (the walk from 0 then visits exactly these, each with the magic code, so
    record_starts would give the same). Otherwise (a body or property holding those bytes,
    a record of another magic code, framing off) record_starts walks the buffer. numpy is
    the Spark extra's, imported here so this module keeps to the stdlib without it."""
    import numpy as np

    arr = np.frombuffer(buf, np.uint8)
    n = len(arr)
    if n < RECORD_HEAD_MIN:
        return _walked_np(np, buf)
    # the buffer as a big-endian int32 at every byte offset (signed, as Java's ints): one
    # gather reads a field, not four byte gathers put together
    words = at_every_byte(arr, ">i4")
    at = np.flatnonzero(arr[4:n - 3] == _MAGIC_BYTES[0])     # candidates for MAGICCODE at at + 4
    at = at[words[at + 4] == MESSAGE_MAGIC_CODE]
    starts = at.astype(np.int64)
    if len(starts) and starts[0] == 0:
        total = words[starts].astype(np.int64)              # TOTALSIZE of each
        ends = starts + total
        if ends[-1] == n and (ends[:-1] == starts[1:]).all() and (total >= RECORD_HEAD_MIN).all():
            slow = (total < record_overhead(0)) | (arr[starts + _POS_SYSFLAG_LOW] & _COLUMN_SLOW_FLAGS != 0)
            return starts, np.flatnonzero(slow).astype(np.int64)
    return _walked_np(np, buf)


def at_every_byte(arr, dtype: str):
    """The numpy uint8 array `arr` read as `dtype` (a fixed-size int, its byte order in the
    string) starting at every byte offset, without a copy: a field of any record is then
    one gather (record_starts_np here, the Spark reader's framing and name checks)."""
    import numpy as np

    size = np.dtype(dtype).itemsize
    return np.ndarray((len(arr) - size + 1,), dtype, arr, strides=(1,))


def _walked_np(np, buf):
    walked = record_starts(buf)
    return None if walked is None else (np.array(walked[0], np.int64), np.array(walked[1], np.int64))


def head_struct(sys_flag: int) -> struct.Struct:
    """The Struct of a record's fixed head (TOTALSIZE .. BODYLENGTH) for its host sizes."""
    return _HEADS_BY_BITS[(sys_flag >> _HOST_BITS_SHIFT) & 3]


@lru_cache(maxsize=256)
def record_struct(host_bits: int, body_length: int, topic_length: int, properties_length: int) -> struct.Struct:
    """A whole stored record of these lengths as one Struct (`host_bits`: (sys_flag >> 4) & 3):
    the fixed head's fields as head_struct's, then BODY, TOPICLENGTH, TOPIC,
    PROPERTIESLENGTH, PROPERTIES (22 fields: _HEAD_FIELDS' 17, then body, topic length, topic,
    properties length, properties). Its iter_unpack reads a
    run of records of one layout column by column (a slave checking what it replicates)."""
    return struct.Struct(">" + _FIRST_FMT + _MIDDLE_FMT % _ADDR_LENS_BY_BITS[host_bits]
                         + f"i{body_length}sb{topic_length}sh{properties_length}s")



def head_struct_at(buf, pos: int) -> struct.Struct:
    """head_struct of the record at buf[pos:] (needs RECORD_HEAD_MIN bytes there)."""
    return _HEADS_BY_BITS[(buf[pos + _POS_SYSFLAG_LOW] >> _HOST_BITS_SHIFT) & 3]


def sys_flag_at(buf, pos: int = 0) -> int:
    return _I.unpack_from(buf, pos + POS_SYSFLAG)[0]


def queue_offset_at(buf, pos: int = 0) -> int:
    """QUEUEOFFSET of the record at buf[pos:]."""
    return _Q.unpack_from(buf, pos + POS_QUEUE_OFFSET)[0]


def store_timestamp_pos(sys_flag: int) -> int:
    """Offset of STORETIMESTAMP inside a record."""
    return POS_BORN_HOST + (_HOST_V6_SIZE if sys_flag & MessageSysFlag.BORNHOST_V6_FLAG else _HOST_V4_SIZE)


def store_timestamp_at(buf, pos: int = 0, size: int | None = None) -> int:
    """STORETIMESTAMP of the record at buf[pos:], or -1 when `size` (default: what buf
    holds from pos) is too short to hold it."""
    if size is None:
        size = len(buf) - pos
    if size < RECORD_HEAD_MIN:
        return -1
    ts_pos = store_timestamp_pos(_I.unpack_from(buf, pos + POS_SYSFLAG)[0])
    if size < ts_pos + 8:
        return -1
    return _Q.unpack_from(buf, pos + ts_pos)[0]


_HEAD_SIZES_BY_BITS = [h.size for h in _HEADS_BY_BITS]


def properties_at(buf, pos: int = 0, _sizes=_HEAD_SIZES_BY_BITS, _int=_I.unpack_from,
                  _short=_H.unpack_from) -> bytes:
    """The PROPERTIES (UTF-8 bytes) of the stored record at buf[pos:] (bytes or a
    memoryview), found from the length fields without decoding anything else: what the
    broker's SQL92 filter reads for every record it scans (hence the bound helpers). The
    record must be whole (the store hands out only records it wrote)."""
    i = pos + _sizes[buf[pos + _POS_SYSFLAG_LOW] >> _HOST_BITS_SHIFT & 3]
    i += _int(buf, i - 4)[0] + 1            # BODYLENGTH (the head's last field), body, TOPICLENGTH
    i += buf[i - 1]                         # TOPIC
    n = _short(buf, i)[0]
    if n <= 0:
        return b""
    i += 2
    props = buf[i:i + n]
    return props if type(props) is bytes else props.tobytes()


def index_fields_at(buf, pos: int = 0, _heads=_HEADS_BY_BITS, _short=_H.unpack_from) -> tuple[int, int, bytes, bytes]:
    """(SYSFLAG, STORETIMESTAMP, TOPIC, PROPERTIES) of the whole stored record at buf[pos:],
    topic and properties as stored (bytes), from one unpack of the head: what the store's
    message index reads of every record it indexes."""
    head = _heads[buf[pos + _POS_SYSFLAG_LOW] >> _HOST_BITS_SHIFT & 3]
    f = head.unpack_from(buf, pos)
    i = pos + head.size + f[16] + 1         # past BODYLENGTH (the head's last field), body, TOPICLENGTH
    tlen = buf[i - 1]
    topic = bytes(buf[i:i + tlen])
    i += tlen
    n = _short(buf, i)[0]
    return f[7], f[11], topic, (bytes(buf[i + 2:i + 2 + n]) if n > 0 else b"")


# TOTALSIZE, SYSFLAG's low byte (the host bits), BODYLENGTH of a record with two IPv4 hosts
_SIZE_FLAGS_BODYLEN = struct.Struct(">i" + "x" * (_POS_SYSFLAG_LOW - 4) + "B" + "x" * (_HEADS_BY_BITS[0].size - 4 - _POS_SYSFLAG_LOW - 1) + "i")
_OK_HOST_BITS = frozenset(b for b in range(256) if not b & HOST_V6_FLAGS)


def properties_at_many(buf, starts: Sequence[int], sizes: Sequence[int], base: int = 0) -> list[bytes]:
    """[properties_at(buf, p - base) for p in starts] for the whole records of ONE topic
    (one consume queue's) at `starts` (offsets of buf[0] + base), `sizes` their TOTALSIZEs
    as the consume queue holds them: one unpack per record (TOTALSIZE, host bits,
    BODYLENGTH) and one slice ending at the record's end, instead of properties_at's three
    reads. The topic length is the first record's; a record whose TOTALSIZE is not its
    unit's size, any IPv6 host, or a buf that is not bytes-like with bytes slices (a
    memoryview) takes properties_at for all."""
    n = len(starts)
    if not n:
        return []
    if type(buf) is memoryview:
        return [properties_at(buf, p - base) for p in starts]
    unpack = _SIZE_FLAGS_BODYLEN.unpack_from
    heads = list(map(unpack, _repeat(buf), map(_sub, starts, _repeat(base)) if base else starts))
    totals, bits, body_lens = zip(*heads)
    if totals != tuple(sizes) or not _OK_HOST_BITS.issuperset(bits):
        return [properties_at(buf, p - base) for p in starts]
    head = _HEADS_BY_BITS[0].size
    # BODYLENGTH is the head's last field; then body, TOPICLENGTH, TOPIC, PROPERTIESLENGTH
    k = head + 1 + buf[starts[0] - base + head + body_lens[0]] + 2 - base
    return [buf[p + bl + k:p + s - base] for p, bl, s in zip(starts, body_lens, sizes)]


def record_overhead(sys_flag: int) -> int:
    """Fixed bytes of a record (everything but body, topic, properties)."""
    return head_struct(sys_flag).size + 3


def record_size(body_len: int, topic_len: int, props_len: int, sys_flag: int = 0) -> int:
    return head_struct(sys_flag).size + body_len + 1 + topic_len + 2 + props_len


def body_crc(body) -> int:
    """RocketMQ's UtilAll.crc32: zlib's CRC-32 as a positive int. The BODYCRC of a
    (stored, possibly compressed) body, and REGISTER_BROKER's bodyCrc32 header."""
    return _crc32(body) & MAX_INT


def pack_blank_marker(buf, pos: int, remaining: int) -> None:
    """Close a commit-log segment: the filler saying `remaining` bytes are unused."""
    _II.pack_into(buf, pos, remaining, BLANK_MAGIC_CODE)


def host_flags(sys_flag: int, born_addr_len: int, store_addr_len: int) -> int | None:
    """sys_flag with its host-v6 bits set from the address lengths (4 or 16); None when
    a length is neither."""
    sys_flag &= ~HOST_V6_FLAGS
    if born_addr_len == 16:
        sys_flag |= MessageSysFlag.BORNHOST_V6_FLAG
    elif born_addr_len != 4:
        return None
    if store_addr_len == 16:
        sys_flag |= MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
    elif store_addr_len != 4:
        return None
    return sys_flag


def _host_flags(sys_flag: int, born_addr: bytes, store_addr: bytes) -> int:
    checked = host_flags(sys_flag, len(born_addr), len(store_addr))
    if checked is None:
        which = "born" if len(born_addr) not in (4, 16) else "store"
        raise ValueError(f"{which} host address must be 4 or 16 bytes")
    return checked


def topic_field(topic_b: bytes) -> bytes:
    """TOPICLENGTH + TOPIC (the caller has checked the length)."""
    return bytes((len(topic_b),)) + topic_b


def join_records(queue_id: int, queue_offset: int, physical_offset: int, sys_flag: int, born_timestamp: int,
                 born_host: tuple[bytes, int], store_timestamp: int, store_host: tuple[bytes, int],
                 reconsume_times: int, prepared_transaction_offset: int, topic_part: bytes, elements) -> bytes:
    """THE record writer: consecutive stored records of one queue, back to back (a batch;
    a single record is a batch of one), from elements [(size, flag, body, props_b)] where
    size = record_overhead(sys_flag) + body + topic + properties bytes. QUEUEOFFSET and
    PHYSICALOFFSET count up from the given ones; the other header fields are shared.
    sys_flag must already carry the host bits (host_flags); topic_part is topic_field's.
    Every record the store, the memory store and encode_record write comes from here."""
    bits = (sys_flag >> _HOST_BITS_SHIFT) & 3
    born_addr, born_port = born_host
    store_addr, store_port = store_host
    if len(elements) == 1:
        # one record (the single-send hot path): its whole fixed head in one pack
        ((size, flag, body, props_b),) = elements
        return _join((_HEADS_BY_BITS[bits].pack(
            size, MESSAGE_MAGIC_CODE, _crc32(body) & MAX_INT, queue_id, flag, queue_offset, physical_offset,
            sys_flag, born_timestamp, born_addr, born_port, store_timestamp, store_addr, store_port,
            reconsume_times, prepared_transaction_offset, len(body)), body, topic_part, _pack_h(len(props_b)),
            props_b))
    # a batch: the header fields its records share (SYSFLAG .. PREPAREDTRANSACTIONOFFSET)
    # packed once, then per record the ones before them and BODYLENGTH
    middle = _MIDDLES_BY_BITS[bits].pack(sys_flag, born_timestamp, born_addr, born_port, store_timestamp,
                                         store_addr, store_port, reconsume_times, prepared_transaction_offset)
    parts: list = []
    extend = parts.extend
    for size, flag, body, props_b in elements:
        extend((_pack_first(size, MESSAGE_MAGIC_CODE, _crc32(body) & MAX_INT, queue_id, flag, queue_offset,
                            physical_offset),
                middle, _pack_i(len(body)), body, topic_part, _pack_h(len(props_b)), props_b))
        queue_offset += 1
        physical_offset += size
    return _join(parts)


def join_uniform_records(queue_id: int, queue_offset: int, physical_offset: int, sys_flag: int,
                         born_timestamp: int, born_host: tuple[bytes, int], store_timestamp: int,
                         store_host: tuple[bytes, int], reconsume_times: int, prepared_transaction_offset: int,
                         topic_part: bytes, size: int, flags: Sequence[int], bodies: Sequence[bytes],
                         props: Sequence[bytes], props_suffix: bytes = b"") -> bytes:
    """join_records for a batch whose records all have one size: bodies of one length,
    properties `props[i] + props_suffix` of one length (what a producer's batch of one
    body size gives; `size` = record_overhead(sys_flag) + body + topic + properties bytes).
    The same bytes, built column-wise: every record's first fields (TOTALSIZE .. PHYSICALOFFSET,
    its BODYCRC computed here) packed by one C-level map, then one join over the records'
    parts (first fields, the shared middle with BODYLENGTH, body, TOPIC with PROPERTIESLENGTH,
    properties, suffix), with no Python loop per record. Pinned to join_records by
    tests/unit/test_batch_uniform.py."""
    m = len(bodies)
    bits = (sys_flag >> _HOST_BITS_SHIFT) & 3
    born_addr, born_port = born_host
    store_addr, store_port = store_host
    mid = _MIDDLES_BY_BITS[bits].pack(sys_flag, born_timestamp, born_addr, born_port, store_timestamp,
                                      store_addr, store_port, reconsume_times,
                                      prepared_transaction_offset) + _pack_i(len(bodies[0]) if m else 0)
    tail = topic_part + _pack_h(len(props[0]) + len(props_suffix) if m else 0)
    firsts = map(_pack_first, _repeat(size, m), _repeat(MESSAGE_MAGIC_CODE),
                 map(_and, map(_crc32, bodies), _repeat(MAX_INT)), _repeat(queue_id), flags,
                 range(queue_offset, queue_offset + m), range(physical_offset, physical_offset + m * size, size))
    if props_suffix:
        parts = zip(firsts, _repeat(mid), bodies, _repeat(tail), props, _repeat(props_suffix))
    else:
        parts = zip(firsts, _repeat(mid), bodies, _repeat(tail), props)
    return _join(_chain.from_iterable(parts))


def encode_record(topic: str | bytes, queue_id: int, flag: int, body: bytes,
                  properties: str | bytes, sys_flag: int, born_timestamp: int,
                  born_host: tuple[bytes, int], store_host: tuple[bytes, int],
                  reconsume_times: int, prepared_transaction_offset: int,
                  queue_offset: int, physical_offset: int, store_timestamp: int) -> bytes:
    """Encode one stored record. The host-v6 bits of sys_flag are set from the address lengths.

    Raises ValueError when the topic (> 127 bytes) or properties (> 32767 bytes) do not fit.
    """
    topic_b = topic.encode() if isinstance(topic, str) else topic
    props_b = properties.encode() if isinstance(properties, str) else properties
    tl = len(topic_b)
    pl = len(props_b)
    if tl > TOPIC_LENGTH_BYTES_MAX:
        raise ValueError(f"topic is {tl} bytes, max {TOPIC_LENGTH_BYTES_MAX}")
    if pl > PROPERTIES_LENGTH_BYTES_MAX:
        raise ValueError(f"properties are {pl} bytes, max {PROPERTIES_LENGTH_BYTES_MAX}")
    sys_flag = _host_flags(sys_flag, born_host[0], store_host[0])
    size = record_overhead(sys_flag) + len(body) + tl + pl
    return join_records(queue_id, queue_offset, physical_offset, sys_flag, born_timestamp, born_host,
                        store_timestamp, store_host, reconsume_times, prepared_transaction_offset,
                        topic_field(topic_b), ((size, flag, body, props_b),))


def encode_record_into(buf, pos: int, topic_b: bytes, queue_id: int, flag: int, body: bytes,
                       props_b: bytes, sys_flag: int, born_timestamp: int,
                       born_host: tuple[bytes, int], store_host: tuple[bytes, int],
                       reconsume_times: int, prepared_transaction_offset: int,
                       queue_offset: int, physical_offset: int, store_timestamp: int) -> int:
    """Write one record straight into a writable buffer (bytearray, mmap) at pos; returns its size.

    Same rules as encode_record, but topic and properties must already be bytes and the
    caller has checked their lengths and that the record fits.
    """
    sys_flag = _host_flags(sys_flag, born_host[0], store_host[0])
    size = record_overhead(sys_flag) + len(body) + len(topic_b) + len(props_b)
    buf[pos:pos + size] = join_records(
        queue_id, queue_offset, physical_offset, sys_flag, born_timestamp, born_host, store_timestamp,
        store_host, reconsume_times, prepared_transaction_offset, topic_field(topic_b),
        ((size, flag, body, props_b),))
    return size


def patch_record(buf, pos: int, queue_offset: int, physical_offset: int, store_timestamp: int) -> None:
    """Overwrite QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP of the record at pos in place."""
    _QQ.pack_into(buf, pos + POS_QUEUE_OFFSET, queue_offset, physical_offset)
    (sys_flag,) = _I.unpack_from(buf, pos + POS_SYSFLAG)
    _Q.pack_into(buf, pos + store_timestamp_pos(sys_flag), store_timestamp)


# --------------------------------------------------------------------------- MessageExt

# The prefix of a group's retry topic. Owned here because MessageExt.from_raw / from_record
# give retried messages their topic back and protocol may import nothing of ours;
# common.constants re-exports it for everyone else.
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"

SYSTEM_PROPERTY_KEYS = frozenset({
    KEYS, TAGS, WAIT, DELAY, RETRY_TOPIC, REAL_TOPIC, REAL_QID, TRAN_MSG, PGROUP, MIN_OFFSET, MAX_OFFSET,
    BUYER_ID, ORIGIN_MESSAGE_ID, TRANSFER_FLAG, CORRECTION_FLAG, MQ2_FLAG, RECONSUME_TIME, MSG_REGION,
    TRACE_ON, UNIQ_KEY, MAX_RECONSUME_TIMES, CONSUME_START_TIME, TRAN_PREPARED_QUEUE_OFFSET,
    TRANSACTION_CHECK_TIMES, CHECK_IMMUNITY_TIME_IN_SECONDS, INSTANCE_ID, CORRELATION_ID, REPLY_TO_CLIENT,
    TTL, ARRIVE_TIME, PUSH_REPLY_TIME, CLUSTER, MSG_TYPE, INNER_MULTI_DISPATCH, INNER_MULTI_QUEUE_OFFSET,
    SHARDING_KEY, TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS, TIMER_OUT_MS, TIMER_ENQUEUE_MS,
    TIMER_DEQUEUE_MS, TIMER_DEL_UNIQKEY,
})


class FrozenProperties(dict):
    """Message properties: a dict whose mutators raise TypeError (a dict, not a
    MappingProxyType, so deepcopy, pickle, asdict and json.dumps work)."""
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


def frozen_properties(props) -> Mapping[str, str]:
    """props as FrozenProperties (keys and values as str); the shared empty one for none."""
    if type(props) is FrozenProperties:
        return props
    if not props:
        return _NO_PROPS
    return FrozenProperties({str(k): str(v) for k, v in props.items()})


def keys_tuple(keys) -> tuple[str, ...]:
    """KEYS as a tuple: "k1 k2" (the wire form) or an iterable of keys."""
    if not keys:
        return ()
    if isinstance(keys, str):
        return tuple(k for k in keys.split(KEY_SEPARATOR) if k)
    return tuple(str(k) for k in keys)


_FIELDS = ("topic", "body", "queue_id", "queue_offset", "properties", "flag", "sys_flag",
           "commit_log_offset", "born_timestamp", "born_host", "store_timestamp", "store_host",
           "reconsume_times", "prepared_transaction_offset", "body_crc", "store_size", "broker_name",
           "real_topic")
_tuple_new = tuple.__new__
_field = property  # readability below


def _host_text(raw) -> str:
    if type(raw) is str:
        return raw
    return format_host(raw[0], raw[1])


class MessageExt(tuple):
    """A stored record, decoded (RocketMQ's MessageExt, snake_case): what decode_record(s)
    return and what consumers receive. Immutable.

    `msg_id` is the producer-generated UNIQ_KEY when present (what SendResult.msg_id
    returned), else the broker's `offset_msg_id`. `topic` is the stored topic, except for
    messages the client redelivers from `%RETRY%<group>` (from_raw / from_record), which get
    their original topic back; `real_topic` is always the topic the record was read from.

    A tuple because a pull body becomes thousands of them per second and most listeners
    read a few fields: built straight from a decoded pull body (`from_raw`) without
    parsing what may never be read, `properties` is made from the stored properties text
    on first access, `born_host` / `store_host` are formatted on first access.
    Fields are read-only (assigning raises dataclasses.FrozenInstanceError); equality
    compares the field values; `dataclasses` sees the fields of _MessageExtFields (below),
    so is_dataclass(), fields(), asdict() and replace() work.
    """
    # Storage: a tuple in the field order of _FIELDS (properties and hosts possibly raw:
    # properties text, (address bytes, port)); values computed lazily are cached in the
    # instance __dict__.

    def __new__(cls, topic: str, body: bytes, queue_id: int, queue_offset: int, broker_name: str = "",
                properties: Mapping[str, str] | None = None, flag: int = 0, sys_flag: int = 0,
                commit_log_offset: int = 0, born_timestamp: int = 0, born_host: str = "",
                store_timestamp: int = 0, store_host: str = "", reconsume_times: int = 0,
                prepared_transaction_offset: int = 0, body_crc: int = 0, store_size: int = 0,
                real_topic: str = ""):
        return _tuple_new(cls, (topic, body, queue_id, queue_offset, frozen_properties(properties), flag,
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
        # From the stored text even when `properties` was built: the same value
        # (property_value's rule), and no instance dict materialised to look for it.
        p = self[4]
        if type(p) is str:
            return property_value(p, name) if p else None
        return p.get(name)

    @classmethod
    def from_raw(cls, t: tuple, broker_name: str = "") -> MessageExt:
        """From one tuple of decode_records_raw. Messages redelivered through
        `%RETRY%<group>` get their original topic back (RETRY_TOPIC)."""
        topic = t[0]
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            orig = property_value(t[4], RETRY_TOPIC) if t[4] else None
            if orig:
                return _tuple_new(cls, (orig,) + t[1:] + (broker_name, topic))
        return _tuple_new(cls, t + (broker_name, topic))

    @classmethod
    def from_record(cls, rec: MessageExt, broker_name: str = "") -> MessageExt:
        """A decoded record as a consumer sees it: with its broker name, and for messages
        redelivered through `%RETRY%<group>` the original topic (RETRY_TOPIC), like the
        Java client's resetRetryAndNamespace."""
        props = rec.properties
        topic = rec.real_topic or rec.topic
        shown = topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            shown = props.get(RETRY_TOPIC) or topic
        return cls(shown, rec.body, rec.queue_id, rec.queue_offset, broker_name, props, rec.flag, rec.sys_flag,
                   rec.commit_log_offset, rec.born_timestamp, rec.born_host, rec.store_timestamp, rec.store_host,
                   rec.reconsume_times, rec.prepared_transaction_offset, rec.body_crc, rec.store_size, topic)

    # -- immutable value semantics -------------------------------------------------------
    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def _values(self) -> tuple:
        return tuple(getattr(self, f) for f in _FIELDS)

    def __eq__(self, other):
        if not isinstance(other, MessageExt):
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
            addr, port = parse_host(raw)
        else:
            addr, port = raw
        return offset_msg_id(addr, port, self[7])

    @property
    def msg_id(self) -> str:
        """UNIQ_KEY (the id SendResult.msg_id returned) when present, else offset_msg_id."""
        return self._property(UNIQ_KEY) or self.offset_msg_id

    @property
    def tags(self) -> str | None:
        return self._property(TAGS)

    @property
    def keys(self) -> tuple[str, ...]:
        return keys_tuple(self._property(KEYS))

    @property
    def delay_level(self) -> int:
        """DELAY as a level (0 when absent or not a number)."""
        v = self._property(DELAY)
        return int(v) if v and v.isdigit() else 0

    delay_time_level = delay_level      # Java's getDelayTimeLevel

    @property
    def user_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k not in SYSTEM_PROPERTY_KEYS}

    @property
    def queue(self) -> MessageQueue:
        """The queue this message was read from."""
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



# A pulled record's head fields as read by _PulledMessageExt (IPv4 hosts: the only layout
# it holds), from the codec's own positions.
_V4_POS = _POSITIONS_BY_BITS[0]
_V4_BODY = _V4_POS["body"]
_i_at = _I.unpack_from
_q_at = _Q.unpack_from


def _int_field(name: str):
    at = _V4_POS[name]
    return property(lambda self: _i_at(self[1], self[2] + at)[0])


def _long_field(name: str):
    at = _V4_POS[name]
    return property(lambda self: _q_at(self[1], self[2] + at)[0])


def _v4_host(buf, at: int) -> str:
    return format_host(buf[at:at + 4], _i_at(buf, at + 4)[0])


class _PulledMessageExt(MessageExt):
    """A MessageExt that is a view of one record of a pull body (decode_messages' common
    record: IPv4 hosts, body not compressed), holding the body bytes and the record's
    position instead of its decoded fields: a consumer pays, per message, for finding and
    checking the record and for what its listener reads, not for decoding the 17 head
    fields and copying a body it may not keep. Behaves as the MessageExt of the same
    values (equal to it, pickles and copies to it, dataclasses.replace makes one); the
    whole pull body stays alive while any message of it is referenced.

    Tuple layout: (shown topic, pull body, record position, queue_offset, properties text,
    body end, broker_name, real topic): queue_offset (every consumer's bookkeeping reads it)
    and the properties text (decoded while checking the record, so a record whose
    properties are not UTF-8 is refused at decode time as before) are kept; index 4 is the
    properties text as in MessageExt's own layout."""
    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        # dataclasses.replace() and friends construct from field values: a plain MessageExt
        return MessageExt(*args, **kwargs)

    @property
    def body(self) -> bytes:
        return self[1][self[2] + _V4_BODY:self[5]]

    queue_id = _int_field("queue_id")
    flag = _int_field("flag")
    sys_flag = _int_field("sys_flag")
    commit_log_offset = _long_field("physical_offset")
    born_timestamp = _long_field("born_timestamp")
    store_timestamp = _long_field("store_timestamp")
    reconsume_times = _int_field("reconsume_times")
    prepared_transaction_offset = _long_field("prepared_transaction_offset")
    body_crc = _int_field("body_crc")
    store_size = _int_field("total_size")
    broker_name = _field(itemgetter(6))
    real_topic = _field(itemgetter(7))

    @property
    def born_host(self) -> str:
        return _v4_host(self[1], self[2] + _V4_POS["born_host"])

    @property
    def store_host(self) -> str:
        return _v4_host(self[1], self[2] + _V4_POS["store_host"])

    @property
    def offset_msg_id(self) -> str:
        buf, at = self[1], self[2] + _V4_POS["store_host"]
        return offset_msg_id(buf[at:at + 4], _i_at(buf, at + 4)[0], self.commit_log_offset)

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self[7], self[6], self.queue_id)


def decompress_body(data: bytes) -> bytes:
    try:
        return zlib.decompress(data)
    except zlib.error as e:
        raise ValueError(f"body does not inflate: {e}") from None


def compress_body(body: bytes, level: int = 5) -> bytes:
    """zlib with header, level 5 like the Java and C++ clients (sets nothing: the caller ORs
    MessageSysFlag.COMPRESSED_FLAG into sys_flag)."""
    return zlib.compress(body, level)


def maybe_compress(body: bytes, threshold_bytes: int = 4096, level: int = 5) -> tuple[bytes, int]:
    """Client rule: compress bodies >= threshold. Returns (body, sys_flag bits to OR in)."""
    if len(body) >= threshold_bytes:
        return compress_body(body, level), MessageSysFlag.COMPRESSED_FLAG
    return body, 0


def decode_record(buf, pos: int = 0, *, decompress: bool = True, check_crc: bool = False) -> MessageExt:
    """Decode the record at buf[pos:]. Raises ValueError (only) when the bytes are not a record."""
    n = len(buf)
    if pos < 0 or n - pos < RECORD_HEAD_MIN:
        raise ValueError("record truncated: no room for the fixed head")
    total, magic = _II.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC_CODE:
        raise ValueError(f"bad magic code {magic:#x} at {pos}")
    (sys_flag,) = _I.unpack_from(buf, pos + POS_SYSFLAG)
    head = head_struct(sys_flag)
    if total < head.size + 3:
        raise ValueError(f"record size {total} below the fixed overhead")
    if total > n - pos:
        raise ValueError(f"record size {total} exceeds the {n - pos} bytes available")
    (total, _magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
     born_ts, born_addr, born_port, store_ts, store_addr, store_port, reconsume_times,
     prepared_offset, bl) = head.unpack_from(buf, pos)
    end = pos + total
    p = pos + head.size
    if bl < 0 or p + bl + 3 > end:
        raise ValueError(f"body length {bl} does not fit in record of {total} bytes")
    body = bytes(buf[p:p + bl])
    p += bl
    tl = buf[p]
    if tl > TOPIC_LENGTH_BYTES_MAX:
        raise ValueError(f"topic length byte {tl} is negative")
    p += 1
    if p + tl + 2 > end:
        raise ValueError("topic does not fit in record")
    topic_raw = bytes(buf[p:p + tl])
    p += tl
    (pl,) = _H.unpack_from(buf, p)
    p += 2
    if pl < 0 or p + pl != end:
        raise ValueError(f"properties length {pl} does not match record size {total}")
    props_raw = bytes(buf[p:p + pl])
    if check_crc and body_crc(body) != crc:
        raise ValueError("BODYCRC mismatch")
    try:
        topic = topic_raw.decode()
        props = props_raw.decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"topic or properties not UTF-8: {e}") from None
    if decompress and sys_flag & MessageSysFlag.COMPRESSED_FLAG:
        ctype = sys_flag & MessageSysFlag.COMPRESSION_TYPE_MASK
        if ctype not in (0, MessageSysFlag.COMPRESSION_ZLIB):
            raise ValueError(f"unsupported compression type {ctype:#x}")
        body = decompress_body(body)
    # the stored topic as is (no retry-topic restore: that is from_raw's / from_record's)
    return _tuple_new(MessageExt, (topic, body, queue_id, queue_offset, props, flag, sys_flag, physical_offset,
                                   born_ts, (born_addr, born_port), store_ts, (store_addr, store_port),
                                   reconsume_times, prepared_offset, crc, total, "", topic))


def decode_records(buf, *, decompress: bool = True) -> list[MessageExt]:
    """Decode records laid back to back (a PULL response body): decode_record of each,
    in one pass (decode_records_raw)."""
    new = _tuple_new
    return [new(MessageExt, t + ("", t[0])) for t in decode_records_raw(buf, decompress=decompress)]


_FRAME_MIN = POS_QUEUE_OFFSET + 8       # TOTALSIZE .. QUEUEOFFSET: enough to name a bad record


def decode_records_skipping(body, decode=decode_records) -> tuple[list, list[tuple[int, str]]] | None:
    """A pull body record by record, tolerating records that do not decode (a body that
    does not inflate, properties that are not UTF-8...), so one poisoned message cannot
    stall its queue: (what `decode` gives for the good records, in order, [(queue_offset,
    error) of each skipped one]). None when the framing itself is broken (the record
    sizes make no sense): nothing can be trusted. `decode` is decode_records or
    decode_records_raw (called on one record's bytes)."""
    buf = bytes(body)
    n = len(buf)
    pos = 0
    out: list = []
    skipped: list[tuple[int, str]] = []
    while pos < n:
        if n - pos < _FRAME_MIN:
            return None
        (total,) = _I.unpack_from(buf, pos)
        if total < _FRAME_MIN or pos + total > n:
            return None
        try:
            out.extend(decode(buf[pos:pos + total]))
        except ValueError as e:
            skipped.append((_Q.unpack_from(buf, pos + POS_QUEUE_OFFSET)[0], str(e)))
        pos += total
    return out, skipped


def _bad_record(buf, pos: int, decompress: bool):
    """decode_record's ValueError for a record the fast loop rejected."""
    decode_record(buf, pos, decompress=decompress)
    raise ValueError(f"malformed record at {pos}")


def decode_records_raw(buf, *, decompress: bool = True) -> list[tuple]:
    """Records laid back to back (a PULL response body), decoded in one pass into plain tuples

        (topic, body, queue_id, queue_offset, properties_text, flag, sys_flag,
         commit_log_offset, born_timestamp, (born_addr, born_port), store_timestamp,
         (store_addr, store_port), reconsume_times, prepared_transaction_offset,
         body_crc, store_size)

    with the same values decode_records gives (hosts as address bytes + port,
    properties as their text, not yet a dict) and the same validation: any record
    the fast loop finds suspicious is handed to decode_record, which raises the
    ValueError naming the problem."""
    return _decode_pull_body(buf, decompress, None)


def decode_messages(buf, broker_name: str, *, decompress: bool = True) -> list[MessageExt]:
    """A PULL response body straight to the MessageExt a consumer receives, in one pass:
    equal to [MessageExt.from_raw(t, broker_name) for t in decode_records_raw(buf)]
    (properties kept as their text until first read, the retry topic restored), without
    the intermediate tuple per record. Same validation and ValueError.

    The common records (IPv4 hosts, body not compressed: what a pull body nearly always
    holds) go through _decode_v4_run, as views of the body (_PulledMessageExt); the records
    it does not take (another layout, or anything suspicious) go through the general loop,
    which decodes or rejects them exactly as decode_records_raw does, up to the next record
    of the common layout."""
    if type(buf) is not bytes:
        buf = bytes(buf)
    out: list = []
    n = len(buf)
    pos = _decode_v4_run(buf, broker_name, out, 0)
    while pos < n:      # records of another layout (or a bad one), then the fast loop again
        pos = _decode_pull_body(buf, decompress, broker_name, pos, out, until_fast=True)
        if pos < n:
            pos = _decode_v4_run(buf, broker_name, out, pos)
    return out


_V4_SLOW_FLAGS = MessageSysFlag.COMPRESSED_FLAG | HOST_V6_FLAGS


def _walk_struct(names: tuple[str, ...]) -> struct.Struct:
    """A Struct reading only the named int/long fields of an IPv4 head (pad bytes between
    them), laid out from the codec's own positions."""
    codes = dict(zip(_HEAD_FIELDS, re.findall(r"\d*[a-z]", _HEAD_V4_FORMAT)))
    fmt, at = ">", 0
    for name in names:
        pos = _V4_POS[name]
        if pos > at:
            fmt += f"{pos - at}x"
        fmt += codes[name]
        at = pos + struct.calcsize(">" + codes[name])
    return struct.Struct(fmt)


_HEAD_V4_FORMAT = _HEADS_BY_BITS[0].format.lstrip(">")
# TOTALSIZE, MAGICCODE, QUEUEOFFSET, SYSFLAG, BODYLENGTH: what _decode_v4_run checks and keeps
_V4_WALK = _walk_struct(("total_size", "magic_code", "queue_offset", "sys_flag", "body_length"))
assert _V4_WALK.size == _V4_BODY


def _decode_v4_run(buf: bytes, broker_name: str, out: list, pos: int) -> int:
    """decode_messages' loop for the common record: IPv4 born and store hosts, body not
    compressed. Appends a _PulledMessageExt (a view of the record) to `out` per record and
    returns the position of the first record from `pos` it did not take (len(buf) when it
    took them all): one of another layout, or one that fails any check of the general loop
    (which then decodes or rejects it). Per record: one unpack of the five fields the checks need,
    the topic recognised in place (decoded once per pull body: no slice, no hash), the
    properties length, the properties decoded (UTF-8 checked)."""
    append = out.append
    n = len(buf)
    unpack = _V4_WALK.unpack_from
    unpack_short = _H.unpack_from
    hs = _V4_BODY
    slow = _V4_SLOW_FLAGS
    magic_ok = MESSAGE_MAGIC_CODE
    new = _tuple_new
    view = _PulledMessageExt
    topic_field_b = b""         # TOPICLEN byte + topic bytes of the records seen so far
    topic = ""
    retry = False
    tl = 0
    try:
        while pos < n:
            total, magic, queue_offset, sys_flag, bl = unpack(buf, pos)
            end = pos + total
            p = pos + hs + bl           # TOPICLEN
            if magic != magic_ok or sys_flag & slow or bl < 0 or end > n:
                return pos
            if not buf.startswith(topic_field_b, p) or not topic_field_b:
                tl = buf[p]
                if tl > TOPIC_LENGTH_BYTES_MAX or p + 3 + tl > end:
                    return pos
                topic_field_b = buf[p:p + 1 + tl]
                topic = topic_field_b[1:].decode()
                retry = topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
            pp = p + 3 + tl             # PROPERTIES
            if pp > end or unpack_short(buf, pp - 2)[0] != end - pp:
                return pos
            props = buf[pp:end].decode()
            shown = topic
            if retry and props:
                # MessageExt.from_raw's shown topic: a %RETRY% record's original one
                shown = property_value(props, RETRY_TOPIC) or topic
            append(new(view, (shown, buf, pos, queue_offset, props, p, broker_name, topic)))
            pos = end
    except (struct.error, IndexError, UnicodeDecodeError):
        pass            # a short or undecodable record: the general loop names the problem
    return pos


def _decode_pull_body(buf, decompress: bool, broker_name: str | None, pos: int = 0,
                      out: list | None = None, until_fast: bool = False):
    """decode_records_raw (broker_name None) and decode_messages (from `pos`, appending to
    `out`): one loop for both. Returns `out`; with `until_fast`, the position of the first
    record after `pos` that _decode_v4_run may take (IPv4 hosts, not compressed), or len(buf)."""
    if type(buf) is not bytes:
        buf = bytes(buf)
    if out is None:
        out = []
    append = out.append
    n = len(buf)
    heads = _HEADS_BY_BITS
    unpack_int = _I.unpack_from
    unpack_short = _H.unpack_from
    topics: dict[bytes, str] = {}
    new = _tuple_new
    ext = MessageExt
    while pos < n:
        if n - pos < RECORD_HEAD_MIN:
            _bad_record(buf, pos, decompress)
        (sys_flag,) = unpack_int(buf, pos + POS_SYSFLAG)
        head = heads[(sys_flag >> _HOST_BITS_SHIFT) & 3]
        hs = head.size
        if n - pos < hs + 3:
            _bad_record(buf, pos, decompress)
        (total, magic, body_crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
         born_ts, born_addr, born_port, store_ts, store_addr, store_port, reconsume_times,
         prepared_offset, bl) = head.unpack_from(buf, pos)
        end = pos + total
        p = pos + hs + bl
        if (magic != MESSAGE_MAGIC_CODE or total < hs + 3 or end > n or bl < 0 or p + 3 > end
                or buf[p] > TOPIC_LENGTH_BYTES_MAX):
            _bad_record(buf, pos, decompress)
        tl = buf[p]
        tp = p + 1
        p = tp + tl
        if p + 2 > end:
            _bad_record(buf, pos, decompress)
        (pl,) = unpack_short(buf, p)
        p += 2
        if pl < 0 or p + pl != end:
            _bad_record(buf, pos, decompress)
        topic_raw = buf[tp:tp + tl]
        topic = topics.get(topic_raw)
        try:
            if topic is None:
                topic = topics[topic_raw] = topic_raw.decode()
            props = buf[p:end].decode()
        except UnicodeDecodeError:
            _bad_record(buf, pos, decompress)
        body = buf[pos + hs:pos + hs + bl]
        if decompress and sys_flag & MessageSysFlag.COMPRESSED_FLAG:
            body = decode_record(buf, pos, decompress=True).body
        if broker_name is None:
            append((topic, body, queue_id, queue_offset, props, flag, sys_flag, physical_offset,
                    born_ts, (born_addr, born_port), store_ts, (store_addr, store_port),
                    reconsume_times, prepared_offset, body_crc, total))
        else:
            # MessageExt.from_raw's shown topic: a %RETRY% record's original one
            shown = topic
            if props and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                shown = property_value(props, RETRY_TOPIC) or topic
            append(new(ext, (shown, body, queue_id, queue_offset, props, flag, sys_flag, physical_offset,
                             born_ts, (born_addr, born_port), store_ts, (store_addr, store_port),
                             reconsume_times, prepared_offset, body_crc, total, broker_name, topic)))
        pos = end
        if until_fast and n - pos >= RECORD_HEAD_MIN and not unpack_int(buf, pos + POS_SYSFLAG)[0] & _V4_SLOW_FLAGS:
            return pos
    return pos if until_fast else out


# --------------------------------------------------------------------------- message ids


def offset_msg_id(host: bytes, port: int, commit_log_offset: int) -> str:
    """STOREHOST address + int port + long offset, upper-case hex."""
    if len(host) not in (4, 16):
        raise ValueError("host address must be 4 or 16 bytes")
    return (bytes(host) + struct.pack(">iq", port, commit_log_offset)).hex().upper()


def offset_msg_id_prefix(host: bytes, port: int) -> str:
    """The constant first 16 (IPv4) / 40 (IPv6) hex chars of a store's offsetMsgIds;
    append format(offset, "016X") for a non-negative offset."""
    return (bytes(host) + _I.pack(port)).hex().upper()


def offset_msg_ids(prefix: str, offsets: list[int]) -> str:
    """The offsetMsgIds of records at these (non-negative) offsets, comma-joined (a batch's
    msgId), prefix from offset_msg_id_prefix: made by C-level bytes/str operations instead
    of a format() per message."""
    hexes = struct.pack(f">{len(offsets)}q", *offsets).hex(",", 8).upper()
    return prefix + hexes.replace(",", "," + prefix)


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """offsetMsgId -> (ip, port, commit-log offset). Raises ValueError naming the problem."""
    if not isinstance(msg_id, str):
        raise ValueError("message id must be a string")
    if len(msg_id) == 32:
        alen = 4
    elif len(msg_id) == 56:
        alen = 16
    else:
        raise ValueError(f"message id must be 32 (IPv4) or 56 (IPv6) hex chars, got {len(msg_id)}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ValueError(f"message id {msg_id!r} is not hexadecimal") from None
    port, offset = struct.unpack_from(">iq", raw, alen)
    if offset < 0:
        raise ValueError(f"message id {msg_id!r} holds a negative offset")
    if not 0 <= port <= PORT_MAX:
        raise ValueError(f"message id {msg_id!r} holds port {port} out of range")
    return _format_ip(raw[:alen]), port, offset


# --------------------------------------------------------------------------- batch bodies

_BATCH_HEAD = struct.Struct(">iiiii")
_BATCH_FLAG_BODYLEN = struct.Struct(">ii")      # FLAG, BODYLEN at +12 of an element
_BATCH_POS_FLAG = 12


def parse_batch_body(body: bytes, append_properties: bytes = b"",
                     body_bytes_max: int | None = None) -> list[tuple[int, memoryview, bytes]]:
    """THE SEND_BATCH_MESSAGE body parser: [(flag, body as a memoryview of `body`, properties
    as the UTF-8-checked bytes they came in)], so the broker's store can make each element a
    record with its body copied once (and a list, not a generator: the batch hot path).

    append_properties (encoded properties) are added to every element's, as the broker
    adds the batch-level ones; body_bytes_max refuses larger element bodies. Raises
    ValueError naming the first malformed element."""
    if type(body) is not bytes:
        body = bytes(body)
    n = len(body)
    if n == 0:
        raise ValueError("empty batch body")
    if body_bytes_max is None:
        body_bytes_max = n
    sep_append = b"\x02" + append_properties if append_properties else b""
    unpack_fb = _BATCH_FLAG_BODYLEN.unpack_from
    unpack_h = _H.unpack_from
    src = memoryview(body)
    head = _BATCH_HEAD.size
    out: list[tuple[int, memoryview, bytes]] = []
    append = out.append
    pos = 0
    while pos < n:
        if n - pos < head + 2:
            raise ValueError(f"batch element {len(out)} truncated at byte {pos}")
        flag, bl = unpack_fb(body, pos + _BATCH_POS_FLAG)
        bstart = pos + head
        pos = bstart + bl
        if bl < 0 or pos + 2 > n:
            raise ValueError(f"batch element {len(out)}: body length {bl} out of bounds")
        if bl > body_bytes_max:
            raise ValueError(f"batch element {len(out)}: body of {bl}B exceeds the limit {body_bytes_max}B")
        (pl,) = unpack_h(body, pos)
        pos += 2
        if pl < 0 or pos + pl > n:
            raise ValueError(f"batch element {len(out)}: properties length {pl} out of bounds")
        pb = body[pos:pos + pl]
        pos += pl
        if not pb.isascii():        # (ASCII is UTF-8: no decode needed to check it)
            try:
                pb.decode()
            except UnicodeDecodeError:
                raise ValueError(f"batch element {len(out)}: properties not UTF-8") from None
        if append_properties:
            pb = pb + sep_append if pb and pb[-1] != 2 else pb + append_properties
        append((flag, src[bstart:bstart + bl], pb))
    return out


@lru_cache(maxsize=256)
def _uniform_element(body_len: int, props_len: int) -> struct.Struct:
    """FLAG, BODYLEN and PROPERTIESLENGTH of a batch element with this body and
    properties length, in one unpack of the whole element."""
    return struct.Struct(f">{_BATCH_POS_FLAG}xii{body_len}xh{props_len}x")


def parse_uniform_batch_body(body: bytes, body_bytes_max: int | None = None
                             ) -> tuple[list[int], list[bytes], list[bytes]] | None:
    """parse_batch_body's fast path for a batch whose elements all have one body length and
    one (non-empty, ASCII) properties length, what one producer's batch of one body size
    is: (flags, bodies, properties) as columns (bytes), read with one iter_unpack of the
    whole body and C-level slicing, no Python loop per element. None for any other batch,
    and for anything parse_batch_body would refuse (it then decides and names the error):
    the element boundaries are the plain parser's exactly when every element's lengths
    are the first one's and the body is a whole number of such elements."""
    n = len(body)
    head = _BATCH_HEAD.size
    if n < head + 2:
        return None
    (bl,) = _I.unpack_from(body, head - 4)
    if bl < 0 or head + bl + 2 > n or (body_bytes_max is not None and bl > body_bytes_max):
        return None
    (pl,) = _H.unpack_from(body, head + bl)
    stride = head + bl + 2 + pl
    if pl <= 0 or n % stride:
        return None
    m = n // stride
    flags, bls, pls = zip(*_uniform_element(bl, pl).iter_unpack(body))
    if bls.count(bl) != m or pls.count(pl) != m:
        return None
    get = body.__getitem__
    props = list(map(get, map(slice, range(head + bl + 2, n, stride), range(stride, n + 1, stride))))
    if not _join(props).isascii():      # (ASCII is UTF-8; anything else: the plain parser checks it)
        return None
    bodies = list(map(get, map(slice, range(head, n, stride), range(head + bl, n, stride))))
    return list(flags), bodies, props


def decode_batch_body(body, *, raw_properties: bool = False, append_properties: bytes = b"",
                      body_bytes_max: int | None = None) -> list[tuple[int, bytes, str]]:
    """SEND_BATCH_MESSAGE body -> [(flag, body, properties_str)]. Raises ValueError when malformed.

    raw_properties=True returns the properties as the (UTF-8 checked) bytes they came in,
    for the broker's store path, which would only encode them again; append_properties and
    body_bytes_max as for parse_batch_body (append_properties needs raw_properties)."""
    if append_properties and not raw_properties:
        raise ValueError("append_properties needs raw_properties=True")
    if type(body) is not bytes:
        body = bytes(body)
    if raw_properties:
        return [(flag, bytes(data), pb) for flag, data, pb in parse_batch_body(body, append_properties, body_bytes_max)]
    return [(flag, bytes(data), pb.decode()) for flag, data, pb in parse_batch_body(body, b"", body_bytes_max)]


def encode_batch_elements(items) -> bytes:
    """THE SEND_BATCH_MESSAGE body writer: [(flag, body, properties as UTF-8 bytes)] ->
    batch body (Java layout, TOTALSIZE = 22 + n + m). The producer's batch hot path calls
    it with properties it has encoded and length-checked already."""
    parts = []
    append = parts.append
    head = _BATCH_HEAD.pack
    short = _H.pack
    for flag, data, pb in items:
        bl = len(data)
        pl = len(pb)
        append(head(BATCH_ELEMENT_OVERHEAD + bl + pl, 0, 0, flag, bl))
        append(data)
        append(short(pl))
        append(pb)
    return b"".join(parts)


class _ElementHeads(dict):
    """(flag, body length) -> the 20-byte element head of a run (encode_batch_run)."""
    __slots__ = ("flag", "tail_len")

    def __init__(self, flag: int, tail_len: int):
        super().__init__()
        self.flag = flag
        self.tail_len = tail_len

    def __missing__(self, bl: int) -> bytes:
        h = self[bl] = _BATCH_HEAD.pack(BATCH_ELEMENT_OVERHEAD + bl + self.tail_len, 0, 0, self.flag, bl)
        return h


# encode_batch_run's one-stride path copies the batch a few times (join, head insert, tail,
# bytes()): cheaper than one part per element up to this many body bytes, 10x dearer at
# 256 KiB (measured: 64 x 1 KiB 24 vs 41 µs, 64 x 4 KiB 459 vs 43 µs).
_STRIDED_BODIES_MAX = 64 * 1024


def encode_batch_run(flag: int, bodies: Sequence[bytes], props_prefix: bytes, suffixes: bytes,
                     suffix_len: int, body_lens: list[int] | None = None) -> bytes:
    """The SEND_BATCH_MESSAGE body writer for a run of elements of one shape: the same bytes
    as encode_batch_elements([(flag, bodies[i], props_prefix + suffixes[i * suffix_len:
    (i + 1) * suffix_len])]). The producer's send_batch: one template of properties per
    batch, the suffixes being the messages' UNIQ_KEY counters back to back.

    Why: encode_batch_elements runs Python code per element. Here bodies of one length (the
    common case; up to _STRIDED_BODIES_MAX bytes of them) are joined with a separator holding the next element's head, the previous
    one's properties and a gap for its suffix, and the suffixes are written into the gaps
    by one strided slice assignment per suffix byte: a handful of C calls whatever the
    number of elements. Bodies of different lengths are interleaved by slice assignments
    (loops in C; the head is shared by elements of one body length). `body_lens`: the
    bodies' lengths when the caller has them already."""
    n = len(bodies)
    if len(suffixes) != n * suffix_len:
        raise ValueError(f"{n} bodies but {len(suffixes)} bytes of {suffix_len}-byte properties suffixes")
    if not n:
        return b""
    pl = len(props_prefix) + suffix_len
    if pl > PROPERTIES_LENGTH_BYTES_MAX:
        raise ValueError("batch element properties longer than 32767 bytes")
    tail = _H.pack(pl) + props_prefix
    lens = list(map(len, bodies)) if body_lens is None else body_lens
    bl = lens[0]
    if lens.count(bl) == n and n * bl <= _STRIDED_BODIES_MAX:
        # [head body tail gap] * n: one stride, the gaps filled a column at a time
        head = _BATCH_HEAD.pack(BATCH_ELEMENT_OVERHEAD + bl + pl, 0, 0, flag, bl)
        gap = bytes(suffix_len)
        buf = bytearray(tail + gap + head).join(bodies)
        buf[0:0] = head
        buf += tail
        buf += gap
        stride = BATCH_ELEMENT_OVERHEAD + bl + pl
        first = len(head) + bl + len(tail)
        for k in range(suffix_len):
            buf[first + k::stride] = suffixes[k::suffix_len]
        return bytes(buf)
    # parts = [head, body, tail, suffix] * n, filled by slice assignment (C loops)
    parts = [None, None, tail, None] * n
    parts[0::4] = map(_ElementHeads(flag, pl).__getitem__, lens)
    parts[1::4] = bodies
    parts[3::4] = [suffixes[i:i + suffix_len] for i in range(0, n * suffix_len, suffix_len)] if suffix_len \
        else [b""] * n
    return b"".join(parts)


def encode_batch_body(items) -> bytes:
    """[(flag, body, properties str or dict)] -> batch body, properties length-checked."""
    elements = []
    for flag, data, props in items:
        if isinstance(props, dict):
            props = encode_properties(props)
        pb = props.encode()
        if len(pb) > PROPERTIES_LENGTH_BYTES_MAX:
            raise ValueError("batch element properties longer than 32767 bytes")
        elements.append((flag, data, pb))
    return encode_batch_elements(elements)
