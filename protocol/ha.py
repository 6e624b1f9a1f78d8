"""The HA stream between a master and its slaves (RocketMQ 4.x HAService / HAConnection).

PURE module: stdlib only, no I/O, no clock. Raw TCP on the master's ``haListenPort``
(default listenPort + 1), no remoting framing; all integers big-endian, signed (Java).

| direction       | layout                                             | meaning                                   |
|-----------------|----------------------------------------------------|-------------------------------------------|
| slave -> master | [offset int64]                                     | the slave's CommitLog max offset: the     |
|                 |                                                    | first one is where to start, later ones   |
|                 |                                                    | are acks (after each append, >= every 5 s)|
| master -> slave | [phyOffset int64][size int32][size bytes]          | CommitLog bytes at phyOffset: at most     |
|                 |                                                    | haTransferBatchSize (32 KiB), never across|
|                 |                                                    | a segment, not record-aligned             |
| master -> slave | [phyOffset int64][size int32 = 0]                  | heartbeat while idle (phyOffset = where   |
|                 |                                                    | the next bytes will start)                |

Controller mode (automatic failover, broker/core/failover.py) adds an epoch handshake and
the confirm offset (RocketMQ 5's AutoSwitchHAService carries the same facts):

| direction       | layout                                             | meaning                                   |
|-----------------|----------------------------------------------------|-------------------------------------------|
| slave -> master | [magic int32 "PMQ1"][replicaId int32][epoch int32] | first, before any report: who it is, the  |
|                 |                                                    | newest master epoch it knows              |
| master -> slave | [magic int32][epoch int32][maxOffset int64]        | first: the master's epoch, its log's end  |
|                 | [n int32] n x [epoch int32][startOffset int64]     | and its epoch entries (store/epoch.py)    |
| master -> slave | [phyOffset int64][size int32][confirmOffset int64] | every frame then carries the master's     |
|                 | [size bytes]                                       | confirm offset (slaves serve reads only   |
|                 |                                                    | below it)                                 |

A master reads only the last complete report in what arrived (Java does the same);
either side closes after haHousekeepingInterval (20 s) of silence. The frame body is a
byte range of the master's CommitLog: records and blank markers exactly as they lie in
its segments (protocol/message.py's layout), so a slave that appends them has a
byte-identical log.
"""
from __future__ import annotations

import struct

__all__ = ["REPORT_SIZE", "FRAME_HEAD_SIZE", "FRAME_BODY_MAX", "encode_report", "encode_frame_head",
           "ReportDecoder", "FrameDecoder", "HAProtocolError", "HELLO_SIZE", "encode_hello", "decode_hello",
           "encode_epoch_reply", "EpochReplyDecoder", "encode_confirm_frame_head"]

_REPORT = struct.Struct(">q")
_FRAME_HEAD = struct.Struct(">qi")
REPORT_SIZE = _REPORT.size          # 8
FRAME_HEAD_SIZE = _FRAME_HEAD.size  # 12
# A slave cannot know its master's haTransferBatchSize; Java's default is 32 KiB and a
# master sends at most one segment's remainder. Anything above this bound is a broken
# or hostile peer, not a frame to buffer.
FRAME_BODY_MAX = 64 * 1024 * 1024


class HAProtocolError(ValueError):
    """The peer sent something that is not the HA stream (the connection is closed)."""


def encode_report(offset: int) -> bytes:
    return _REPORT.pack(offset)


def encode_frame_head(offset: int, size: int) -> bytes:
    return _FRAME_HEAD.pack(offset, size)


class ReportDecoder:
    """The master's side: the slave's offset reports, 8 bytes each."""

    __slots__ = ("_rest",)

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[int]:
        """Every complete report in `data` (after what was left over), in order."""
        buf = self._rest + data if self._rest else data
        n = len(buf) // REPORT_SIZE
        out = [_REPORT.unpack_from(buf, i * REPORT_SIZE)[0] for i in range(n)]
        self._rest = bytes(buf[n * REPORT_SIZE:])
        for offset in out:
            if offset < 0:
                raise HAProtocolError(f"negative offset {offset} reported")
        return out


class FrameDecoder:
    """The slave's side: frames ``(phy_offset, body)``; a heartbeat has an empty body.
    ConfirmFrameDecoder (controller mode) is the same loop over a longer head.

    Bodies are memoryviews of what was read (no copy: a slave replicating at its master's
    ingest moves ~100 MiB/s through here); only a frame cut by a read is assembled."""

    __slots__ = ("_rest", "_body_max")
    _head = _FRAME_HEAD

    def __init__(self, body_max: int = FRAME_BODY_MAX) -> None:
        self._rest = b""
        self._body_max = body_max

    @property
    def buffered(self) -> int:
        return len(self._rest)

    def feed(self, data: bytes) -> list[tuple]:
        buf = self._rest + data if self._rest else data
        view = memoryview(buf)
        out = []
        pos = 0
        end = len(buf)
        unpack = self._head.unpack_from
        head = self._head.size
        while end - pos >= head:
            # (offset, size) or (offset, size, confirm): every field is a non-negative long
            fields = unpack(buf, pos)
            size = fields[1]
            if min(fields) < 0 or size > self._body_max:
                raise HAProtocolError(f"bad frame header: {self._describe(fields)}")
            if end - pos - head < size:
                break
            start = pos + head
            body = view[start:start + size]
            out.append((fields[0], body) if head == FRAME_HEAD_SIZE else (fields[0], body, *fields[2:]))
            pos = start + size
        self._rest = bytes(view[pos:]) if pos < end else b""
        return out

    @staticmethod
    def _describe(fields: tuple) -> str:
        return ", ".join(f"{name} {value}" for name, value in zip(("offset", "size", "confirm"), fields))


# -- controller mode ------------------------------------------------------------------------

_MAGIC = 0x504D5131          # "PMQ1"
_HELLO = struct.Struct(">iii")
HELLO_SIZE = _HELLO.size     # 12
_REPLY_HEAD = struct.Struct(">iiqi")
_ENTRY = struct.Struct(">iq")
_CONFIRM_HEAD = struct.Struct(">qiq")
CONFIRM_FRAME_HEAD_SIZE = _CONFIRM_HEAD.size    # 20
# more entries than this is not a master of ours (the group's history keeps 64)
EPOCH_ENTRIES_MAX = 4096


def encode_hello(replica_id: int, epoch: int) -> bytes:
    return _HELLO.pack(_MAGIC, replica_id, epoch)


def decode_hello(data: bytes) -> tuple[int, int]:
    """(replica id, epoch) of a slave's hello (HELLO_SIZE bytes)."""
    magic, rid, epoch = _HELLO.unpack(data)
    if magic != _MAGIC or rid < 0 or epoch < 0:
        raise HAProtocolError(f"not a controller-mode hello (magic {magic & 0xFFFFFFFF:#x}, replica {rid}, "
                              f"epoch {epoch}): is the slave's enableControllerMode the master's?")
    return rid, epoch


def encode_epoch_reply(epoch: int, max_offset: int, entries: list[tuple[int, int]]) -> bytes:
    return _REPLY_HEAD.pack(_MAGIC, epoch, max_offset, len(entries)) + b"".join(
        _ENTRY.pack(e, s) for e, s in entries)


class EpochReplyDecoder:
    """The slave's side of the handshake: feed bytes until `feed` returns
    (epoch, max offset, entries, bytes left over for the frame decoder)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes):
        buf = self._buf = self._buf + data
        if len(buf) < _REPLY_HEAD.size:
            return None
        magic, epoch, max_offset, n = _REPLY_HEAD.unpack_from(buf, 0)
        if magic != _MAGIC or epoch < 0 or max_offset < 0 or not 0 <= n <= EPOCH_ENTRIES_MAX:
            raise HAProtocolError(f"not a controller-mode master reply (magic {magic & 0xFFFFFFFF:#x}, epoch "
                                  f"{epoch}, {n} entries): is the master's enableControllerMode the slave's?")
        end = _REPLY_HEAD.size + n * _ENTRY.size
        if len(buf) < end:
            return None
        entries = [_ENTRY.unpack_from(buf, _REPLY_HEAD.size + i * _ENTRY.size) for i in range(n)]
        self._buf = b""
        return epoch, max_offset, entries, buf[end:]


def encode_confirm_frame_head(offset: int, size: int, confirm: int) -> bytes:
    return _CONFIRM_HEAD.pack(offset, size, confirm)


class ConfirmFrameDecoder(FrameDecoder):
    """FrameDecoder for controller mode: (phy_offset, body, confirm_offset) triples."""

    __slots__ = ()
    _head = _CONFIRM_HEAD
