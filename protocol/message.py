"""RocketMQ messages: the stored record codec, properties, batch bodies, message ids.

PURE module: stdlib only, no I/O, no clock.

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

import ipaddress
import struct
import zlib
from dataclasses import dataclass, field
from functools import lru_cache

__all__ = [
    "MESSAGE_MAGIC_CODE", "BLANK_MAGIC_CODE", "MessageSysFlag",
    "MessageExt", "java_string_hash", "tags_code", "encode_properties",
    "decode_properties", "encode_record", "encode_record_into", "patch_record",
    "record_size", "decode_record", "decode_records", "decode_records_raw", "offset_msg_id",
    "decode_offset_msg_id", "decode_batch_body", "encode_batch_body",
    "compress_body", "decompress_body", "parse_host", "format_host",
    "store_timestamp_pos", "property_value", "tags_code_of_properties",
]

# --------------------------------------------------------------------------- constants

MESSAGE_MAGIC_CODE = -626843481          # 0xDAA320A7 as a signed int
BLANK_MAGIC_CODE = -875286124            # 0xCBD43194 as a signed int
TOPIC_LENGTH_BYTES_MAX = 127
PROPERTIES_LENGTH_BYTES_MAX = 32767
BATCH_ELEMENT_OVERHEAD = 22              # 4+4+4+4+4 + 2 (+ body + properties)
MAX_INT = 0x7FFFFFFF

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
        return sys_flag & 0xC

    @staticmethod
    def reset_transaction_value(sys_flag: int, tran_type: int) -> int:
        return (sys_flag & ~0xC) | tran_type


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
    if not 0 <= port <= 0xFFFF:
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

# Fixed head up to and including BODYLENGTH, one Struct per (born v6, store v6).
_HEADS = {
    (b4, s4): struct.Struct(">iiiiiqqiq%dsiq%dsiiqi" % (4 if not b4 else 16, 4 if not s4 else 16))
    for b4 in (False, True) for s4 in (False, True)
}
_HEAD_V4 = _HEADS[(False, False)]
_POS_QUEUE_OFFSET = 20
_POS_PHYSICAL_OFFSET = 28
_POS_SYSFLAG = 36
_POS_BORN_HOST = 48
_HEAD_MIN = 40  # enough to read TOTALSIZE .. SYSFLAG


_HEADS_BY_BITS = [_HEADS[(False, False)], _HEADS[(True, False)], _HEADS[(False, True)], _HEADS[(True, True)]]


def head_struct(sys_flag: int) -> struct.Struct:
    return _HEADS_BY_BITS[(sys_flag >> 4) & 3]


def store_timestamp_pos(sys_flag: int) -> int:
    """Offset of STORETIMESTAMP inside a record."""
    return 68 if sys_flag & 0x10 else 56


def record_overhead(sys_flag: int) -> int:
    """Fixed bytes of a record (everything but body, topic, properties)."""
    return head_struct(sys_flag).size + 3


def record_size(body_len: int, topic_len: int, props_len: int, sys_flag: int = 0) -> int:
    return head_struct(sys_flag).size + body_len + 1 + topic_len + 2 + props_len


def _host_flags(sys_flag: int, born_addr: bytes, store_addr: bytes) -> int:
    sys_flag &= ~0x30
    if len(born_addr) == 16:
        sys_flag |= 0x10
    elif len(born_addr) != 4:
        raise ValueError("born host address must be 4 or 16 bytes")
    if len(store_addr) == 16:
        sys_flag |= 0x20
    elif len(store_addr) != 4:
        raise ValueError("store host address must be 4 or 16 bytes")
    return sys_flag


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
    born_addr, born_port = born_host
    store_addr, store_port = store_host
    sys_flag = _host_flags(sys_flag, born_addr, store_addr)
    head = head_struct(sys_flag)
    bl = len(body)
    total = head.size + bl + 3 + tl + pl
    return b"".join((
        head.pack(total, MESSAGE_MAGIC_CODE, zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag,
                  queue_offset, physical_offset, sys_flag, born_timestamp, born_addr, born_port,
                  store_timestamp, store_addr, store_port, reconsume_times,
                  prepared_transaction_offset, bl),
        body, _B.pack(tl), topic_b, _H.pack(pl), props_b,
    ))


def encode_record_into(buf, pos: int, topic_b: bytes, queue_id: int, flag: int, body: bytes,
                       props_b: bytes, sys_flag: int, born_timestamp: int,
                       born_host: tuple[bytes, int], store_host: tuple[bytes, int],
                       reconsume_times: int, prepared_transaction_offset: int,
                       queue_offset: int, physical_offset: int, store_timestamp: int,
                       body_crc: int | None = None) -> int:
    """Write one record straight into a writable buffer (bytearray, mmap) at pos; returns its size.

    Same rules as encode_record, but topic and properties must already be bytes and the
    caller has checked their lengths and that the record fits. body_crc may be passed
    when already known.
    """
    tl = len(topic_b)
    pl = len(props_b)
    born_addr, born_port = born_host
    store_addr, store_port = store_host
    sys_flag = _host_flags(sys_flag, born_addr, store_addr)
    head = head_struct(sys_flag)
    bl = len(body)
    hs = head.size
    total = hs + bl + 3 + tl + pl
    if body_crc is None:
        body_crc = zlib.crc32(body) & 0x7FFFFFFF
    head.pack_into(buf, pos, total, MESSAGE_MAGIC_CODE, body_crc, queue_id, flag,
                   queue_offset, physical_offset, sys_flag, born_timestamp, born_addr, born_port,
                   store_timestamp, store_addr, store_port, reconsume_times,
                   prepared_transaction_offset, bl)
    p = pos + hs
    buf[p:p + bl] = body
    p += bl
    buf[p] = tl
    buf[p + 1:p + 1 + tl] = topic_b
    p += 1 + tl
    _H.pack_into(buf, p, pl)
    buf[p + 2:p + 2 + pl] = props_b
    return total


def patch_record(buf, pos: int, queue_offset: int, physical_offset: int, store_timestamp: int) -> None:
    """Overwrite QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP of the record at pos in place."""
    _QQ.pack_into(buf, pos + _POS_QUEUE_OFFSET, queue_offset, physical_offset)
    (sys_flag,) = _I.unpack_from(buf, pos + _POS_SYSFLAG)
    _Q.pack_into(buf, pos + store_timestamp_pos(sys_flag), store_timestamp)


# --------------------------------------------------------------------------- MessageExt


@dataclass(frozen=True, slots=True)
class MessageExt:
    """A decoded stored record (RocketMQ's MessageExt, snake_case)."""

    topic: str
    queue_id: int
    flag: int
    body: bytes
    properties: dict[str, str] = field(hash=False)
    sys_flag: int
    born_timestamp: int
    born_host: str
    store_timestamp: int
    store_host: str
    reconsume_times: int
    prepared_transaction_offset: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    body_crc: int

    @property
    def tags(self) -> str | None:
        return self.properties.get(TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(KEYS)

    @property
    def offset_msg_id(self) -> str:
        addr, port = parse_host(self.store_host)
        return offset_msg_id(addr, port, self.commit_log_offset)

    @property
    def msg_id(self) -> str:
        """UNIQ_KEY when present (the id users see), else the offsetMsgId."""
        return self.properties.get(UNIQ_KEY) or self.offset_msg_id

    @property
    def delay_time_level(self) -> int:
        v = self.properties.get(DELAY)
        try:
            return int(v) if v else 0
        except ValueError:
            return 0


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
    if pos < 0 or n - pos < _HEAD_MIN:
        raise ValueError("record truncated: no room for the fixed head")
    total, magic = struct.unpack_from(">ii", buf, pos)
    if magic != MESSAGE_MAGIC_CODE:
        raise ValueError(f"bad magic code {magic:#x} at {pos}")
    (sys_flag,) = _I.unpack_from(buf, pos + _POS_SYSFLAG)
    head = head_struct(sys_flag)
    if total < head.size + 3:
        raise ValueError(f"record size {total} below the fixed overhead")
    if total > n - pos:
        raise ValueError(f"record size {total} exceeds the {n - pos} bytes available")
    (total, _magic, body_crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
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
    if check_crc and (zlib.crc32(body) & 0x7FFFFFFF) != body_crc:
        raise ValueError("BODYCRC mismatch")
    try:
        topic = topic_raw.decode()
        props = decode_properties(props_raw.decode())
    except UnicodeDecodeError as e:
        raise ValueError(f"topic or properties not UTF-8: {e}") from None
    if decompress and sys_flag & MessageSysFlag.COMPRESSED_FLAG:
        ctype = sys_flag & MessageSysFlag.COMPRESSION_TYPE_MASK
        if ctype not in (0, MessageSysFlag.COMPRESSION_ZLIB):
            raise ValueError(f"unsupported compression type {ctype:#x}")
        body = decompress_body(body)
    return MessageExt(
        topic=topic, queue_id=queue_id, flag=flag, body=body, properties=props,
        sys_flag=sys_flag, born_timestamp=born_ts, born_host=format_host(born_addr, born_port),
        store_timestamp=store_ts, store_host=format_host(store_addr, store_port),
        reconsume_times=reconsume_times, prepared_transaction_offset=prepared_offset,
        queue_offset=queue_offset, commit_log_offset=physical_offset, store_size=total,
        body_crc=body_crc,
    )


def decode_records(buf, *, decompress: bool = True) -> list[MessageExt]:
    """Decode records laid back to back (a PULL response body)."""
    out = []
    pos = 0
    n = len(buf)
    while pos < n:
        m = decode_record(buf, pos, decompress=decompress)
        out.append(m)
        pos += m.store_size
    return out


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
    if type(buf) is not bytes:
        buf = bytes(buf)
    out = []
    append = out.append
    n = len(buf)
    pos = 0
    heads = _HEADS_BY_BITS
    unpack_int = _I.unpack_from
    unpack_short = _H.unpack_from
    topics: dict[bytes, str] = {}
    while pos < n:
        if n - pos < _HEAD_MIN:
            _bad_record(buf, pos, decompress)
        (sys_flag,) = unpack_int(buf, pos + _POS_SYSFLAG)
        head = heads[(sys_flag >> 4) & 3]
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
        append((topic, body, queue_id, queue_offset, props, flag, sys_flag, physical_offset,
                born_ts, (born_addr, born_port), store_ts, (store_addr, store_port),
                reconsume_times, prepared_offset, body_crc, total))
        pos = end
    return out


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
    if not 0 <= port <= 0xFFFF:
        raise ValueError(f"message id {msg_id!r} holds port {port} out of range")
    return _format_ip(raw[:alen]), port, offset


# --------------------------------------------------------------------------- batch bodies

_BATCH_HEAD = struct.Struct(">iiiii")


def decode_batch_body(body, *, raw_properties: bool = False, append_properties: bytes = b"",
                      body_bytes_max: int | None = None) -> list[tuple[int, bytes, str]]:
    """SEND_BATCH_MESSAGE body -> [(flag, body, properties_str)]. Raises ValueError when malformed.

    raw_properties=True returns the properties as the (UTF-8 checked) bytes they came in,
    for the broker's store path, which would only encode them again; append_properties
    (encoded properties, with raw_properties) are added to every element's, as the broker
    adds the batch-level ones; body_bytes_max refuses larger element bodies. Doing this
    here keeps the broker's batch path to one pass over the elements."""
    if append_properties and not raw_properties:
        raise ValueError("append_properties needs raw_properties=True")
    sep_append = b"\x02" + append_properties if append_properties else b""
    out: list[tuple[int, bytes, str]] = []
    n = len(body)
    if n == 0:
        raise ValueError("empty batch body")
    pos = 0
    while pos < n:
        if n - pos < _BATCH_HEAD.size + 2:
            raise ValueError(f"batch element {len(out)} truncated at byte {pos}")
        _total, _magic, _crc, flag, bl = _BATCH_HEAD.unpack_from(body, pos)
        pos += _BATCH_HEAD.size
        if bl < 0 or pos + bl + 2 > n:
            raise ValueError(f"batch element {len(out)}: body length {bl} out of bounds")
        if body_bytes_max is not None and bl > body_bytes_max:
            raise ValueError(f"batch element {len(out)}: body of {bl}B exceeds the limit {body_bytes_max}B")
        data = bytes(body[pos:pos + bl])
        pos += bl
        (pl,) = _H.unpack_from(body, pos)
        pos += 2
        if pl < 0 or pos + pl > n:
            raise ValueError(f"batch element {len(out)}: properties length {pl} out of bounds")
        pb = bytes(body[pos:pos + pl])
        try:
            props = pb.decode()
        except UnicodeDecodeError:
            raise ValueError(f"batch element {len(out)}: properties not UTF-8") from None
        pos += pl
        if not raw_properties:
            out.append((flag, data, props))
        elif append_properties:
            out.append((flag, data, pb + sep_append if pb and pb[-1] != 2 else pb + append_properties))
        else:
            out.append((flag, data, pb))
    return out


def encode_batch_body(items) -> bytes:
    """[(flag, body, properties str or dict)] -> batch body (Java layout, TOTALSIZE = 22 + n + m)."""
    parts = []
    for flag, data, props in items:
        if isinstance(props, dict):
            props = encode_properties(props)
        pb = props.encode()
        if len(pb) > PROPERTIES_LENGTH_BYTES_MAX:
            raise ValueError("batch element properties longer than 32767 bytes")
        parts.append(_BATCH_HEAD.pack(BATCH_ELEMENT_OVERHEAD + len(data) + len(pb), 0, 0, flag, len(data)))
        parts.append(data)
        parts.append(_H.pack(len(pb)))
        parts.append(pb)
    return b"".join(parts)
