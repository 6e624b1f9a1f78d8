"""RemotingCommand and the frame codec (sans-IO: bytes in, commands out).

Frame layout (big-endian):

| offset | size | content                                                  |
|--------|------|----------------------------------------------------------|
| 0      | 4    | length = 4 + header length + body length (excludes itself) |
| 4      | 4    | (serialize type << 24) | header length (low 24 bits)       |
| 8      | h    | header (JSON, ROCKETMQ binary or msgpack)                 |
| 8 + h  | rest | body (opaque bytes, may be empty)                         |

`FrameDecoder.feed(data)` accepts any split of the byte stream;
`next_command()` returns a RemotingCommand or None when more bytes are needed
and raises ProtocolError on a malformed frame, after which the decoder is
unusable and the connection must be closed. `whole_frame(data)` is the same decode
for a read that is exactly one frame while nothing is buffered (most reads: a sync
request or its reply), taken from the read's bytes without the buffer's copies.
"""
from __future__ import annotations

import struct

from pocketmq.protocol.codes import (CURRENT_VERSION, FLAG_ONEWAY, FLAG_RESPONSE,
                            LanguageCode, SerializeType)
from pocketmq.protocol.errors import ProtocolError
from pocketmq.protocol.headers.codec import DECODERS, ENCODERS, pack_msgpack, sanitize

FRAME_SIZE_BYTES_MAX_DEFAULT = 16 * 1024 * 1024
_PREFIX = struct.Struct(">ii")
_LENGTH = struct.Struct(">i")     # the length prefix alone
_VALID_TYPES = frozenset(int(t) for t in SerializeType)
_JAVA = int(LanguageCode.JAVA)
_MSGPACK = int(SerializeType.MSGPACK)
_MSGPACK_TYPE_BITS = _MSGPACK << 24
_VERSION = CURRENT_VERSION


class RemotingCommand:
    """One request or response. `ext_fields` values are always strings.

    `body` is bytes, or for outgoing frames a list of buffers (memoryviews of
    store segments) that are written back to back without being joined.
    """

    __slots__ = ("code", "language", "version", "opaque", "flag", "remark",
                 "ext_fields", "body", "serialize_type")

    # Positional parameters (in this order) are allowed for the hot paths (frame decoding,
    # responses): a positional call is cheaper than nine keywords.
    def __init__(self, code: int, opaque: int = 0, flag: int = 0, remark: str | None = None,
                 ext_fields: dict | None = None, body=b"",
                 language: int = LanguageCode.JAVA, version: int = CURRENT_VERSION,
                 serialize_type: int = SerializeType.JSON):
        self.code = code
        self.language = language
        self.version = version
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self.ext_fields = ext_fields if ext_fields is not None else {}
        self.body = body
        self.serialize_type = serialize_type

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response(self, code: int, remark: str | None = None, ext_fields: dict | None = None,
                 body=b"") -> "RemotingCommand":
        """A reply in this request's serialize type carrying its opaque."""
        return RemotingCommand(code, self.opaque, FLAG_RESPONSE, remark, ext_fields, body,
                               _JAVA, _VERSION, self.serialize_type)

    def body_bytes(self) -> bytes:
        b = self.body
        if isinstance(b, (list, tuple)):
            return b"".join(b)
        return bytes(b)

    def __repr__(self) -> str:
        kind = "response" if self.is_response else "request"
        blen = sum(len(x) for x in self.body) if isinstance(self.body, (list, tuple)) else len(self.body)
        return (f"RemotingCommand({kind} code={self.code} opaque={self.opaque} flag={self.flag} "
                f"remark={self.remark!r} ext_fields={self.ext_fields!r} body={blen}B)")


# A bytes body up to this size is joined to the prefix and header in the msgpack fast path:
# one small copy is cheaper than one more buffer for writelines to gather.
_JOIN_BODY_MAX = 2048
_NOT_ALL_STR = object()


def encode_parts(cmd: RemotingCommand) -> list:
    """Encode to a list of buffers: [prefix + header, *body buffers].

    The one frame encoder (servers and clients). Fast path: a msgpack header
    whose ext_fields values are all str (every request the Python client
    builds, every response the broker builds) with a bytes body is packed here,
    without the codec table, and a body of at most _JOIN_BODY_MAX bytes is
    joined to the header. The bytes are the plain path's
    (tests/unit/test_protocol_frames.py pins it); only the split may differ.
    """
    body = cmd.body
    if cmd.serialize_type == _MSGPACK and type(body) is bytes:
        ext = cmd.ext_fields
        if ext:
            for v in ext.values():
                if type(v) is not str:
                    ext = _NOT_ALL_STR
                    break
        else:
            ext = None
        if ext is not _NOT_ALL_STR:
            try:
                header = pack_msgpack([cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag,
                                       cmd.remark, ext])
            except UnicodeEncodeError:   # a lone surrogate: written as U+FFFD (codec.sanitize)
                header = pack_msgpack([cmd.code, cmd.language, cmd.version, cmd.opaque, cmd.flag,
                                       sanitize(cmd.remark), sanitize(ext)])
            hlen = len(header)
            prefix = _PREFIX.pack(4 + hlen + len(body), _MSGPACK_TYPE_BITS | hlen) + header
            if not body:
                return [prefix]
            if len(body) <= _JOIN_BODY_MAX:
                return [prefix + body]
            return [prefix, body]
    header = ENCODERS[cmd.serialize_type](cmd.code, cmd.language, cmd.version, cmd.opaque,
                                          cmd.flag, cmd.remark, cmd.ext_fields)
    if isinstance(body, (list, tuple)):
        blen = 0
        for b in body:
            blen += len(b)
        parts = [None]
        parts.extend(body)
    else:
        blen = len(body)
        parts = [None, body] if blen else [None]
    hlen = len(header)
    parts[0] = _PREFIX.pack(4 + hlen + blen, (int(cmd.serialize_type) << 24) | hlen) + header
    return parts


def encode(cmd: RemotingCommand) -> bytes:
    return b"".join(encode_parts(cmd))


# A frame longer than this that a read leaves incomplete is gathered as the reads' own
# bytes and joined once whole (its body: one copy out of the reads), instead of growing the
# buffer read by read (reallocations copying what it holds) and copying the body out of it
# again: a pull reply of 256 KiB comes in 2-3 reads (docs/benchmarks.md, issue 35 item 4).
GATHER_FRAME_BYTES = 32 * 1024
# Reads of a gathered frame smaller than this are appended to one bytearray part.
GATHER_PART_BYTES = 16 * 1024


class FrameDecoder:
    """Incremental frame decoder. Bound: frames over `frame_size_bytes_max` are errors."""

    __slots__ = ("_buf", "_pos", "frame_size_bytes_max", "_broken", "_parts", "_rest", "_glen")

    def __init__(self, frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT):
        self._buf = bytearray()
        self._pos = 0
        self.frame_size_bytes_max = frame_size_bytes_max
        self._broken = False
        self._parts: list | None = None     # the large frame being gathered (GATHER_FRAME_BYTES)
        self._rest = 0                      # ... bytes of it still to come
        self._glen = 0                      # ... its size, length prefix included

    def feed(self, data) -> None:
        rest = self._rest
        if rest:
            n = len(data)
            if n <= rest:
                self._gathered_part(data)
                self._rest = rest - n
                return
            # the frame's last bytes, then the next frames' (the buffer is empty: the
            # gathered frame's start was taken out of it)
            view = memoryview(data)
            self._gathered_part(view[:rest])
            self._rest = 0
            data = view[rest:]
        elif self._pos == len(self._buf):
            if self._pos:
                self._buf.clear()
                self._pos = 0
            if self._parts is None and self._gather(data):
                return
        self._buf += data

    def _gathered_part(self, data) -> None:
        """One more read of the gathered frame: kept as it is when large; small ones are
        appended to a bytearray part, so a frame trickled in tiny reads holds a few parts,
        not an object per read (the frame's bytes stay its memory, as in the buffer)."""
        parts = self._parts
        if len(data) >= GATHER_PART_BYTES:
            parts.append(data if type(data) is bytes else bytes(data))
        elif type(parts[-1]) is bytearray:
            parts[-1] += data
        else:
            parts.append(bytearray(data))

    def _gather(self, data) -> bool:
        """Start gathering when `data` (nothing buffered before it) opens a large frame it
        does not complete; lengths next_command would refuse are left to it."""
        n = len(data)
        if n < 8:
            return False
        length = _LENGTH.unpack_from(data, 0)[0]
        if length <= GATHER_FRAME_BYTES or length + 4 <= n or length > self.frame_size_bytes_max:
            return False
        self._parts = [data if type(data) is bytes else bytes(data)]
        self._glen = length + 4
        self._rest = length + 4 - n
        return True

    @property
    def buffered_bytes(self) -> int:
        held = len(self._buf) - self._pos
        if self._parts is not None:
            held += self._glen - self._rest
        return held

    def pending_frame_bytes(self) -> int:
        """Size of the frame being received (length prefix included) once its length has
        arrived, else 0. For a reader's memory budget; the length is checked by next_command."""
        if self._parts is not None:
            return self._glen
        if len(self._buf) - self._pos < 4:
            return 0
        return 4 + _LENGTH.unpack_from(self._buf, self._pos)[0]

    def next_command(self) -> RemotingCommand | None:
        if self._broken:
            raise ProtocolError("decoder already failed")
        parts = self._parts
        if parts is not None:
            if self._rest:
                return None
            self._parts = None
            return self._gathered(parts)
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < 8:
            if avail >= 4:
                self._check_length(_LENGTH.unpack_from(buf, pos)[0])
            return None
        length, ori = _PREFIX.unpack_from(buf, pos)
        if length < 4 or length > self.frame_size_bytes_max:
            self._check_length(length)      # raises
        if avail < 4 + length:
            if length > GATHER_FRAME_BYTES:
                # the rest is gathered (feed): what the buffer holds of the frame leaves it,
                # and with it everything left in it (the bytes before pos were consumed)
                with memoryview(buf) as view:
                    self._parts = [view[pos:].tobytes()]
                buf.clear()
                self._pos = 0
                self._glen = length + 4
                self._rest = length + 4 - avail
            return None
        cmd = self._frame_at(buf, pos, length, ori)
        end = pos + 4 + length
        # Compact lazily: dropping consumed bytes from the front of a large
        # buffer on every frame would be quadratic.
        self._pos = end
        if end > 1 << 20 and end * 2 > len(buf):
            del buf[:end]
            self._pos = 0
        return cmd

    def _gathered(self, parts: list) -> RemotingCommand:
        """The gathered frame's command: its header read from the first part, its body one
        join of the rest (the whole frame joined first when its header spans parts)."""
        first = parts[0]
        length, ori = _PREFIX.unpack_from(first, 0)
        bstart = 8 + (ori & 0xFFFFFF)
        if bstart > len(first) or bstart > length + 4:
            # the header spans reads (or is longer than the frame: _frame_at refuses it)
            return self._frame_at(b"".join(parts), 0, length, ori)
        with memoryview(first) as view:
            parts[0] = view[bstart:]
            body = b"".join(parts)
            parts[0] = None
            return self._frame_at(first, 0, length, ori, body)

    def whole_frame(self, data) -> RemotingCommand | None:
        """The command of `data` when it is exactly one complete frame and the decoder holds
        nothing (a sync request or its reply: most reads), decoded from `data` itself instead
        of passing through the buffer; None otherwise (then feed() it). Checked and failing
        as next_command would (a bad frame raises ProtocolError and breaks the decoder)."""
        pos = self._pos
        if pos != len(self._buf) or len(data) < 8 or self._broken or self._parts is not None:
            return None
        length, ori = _PREFIX.unpack_from(data, 0)
        if length + 4 != len(data) or length > self.frame_size_bytes_max:
            return None
        if pos:
            # every buffered byte consumed: free them, as the next feed() would (a large
            # frame read in pieces would otherwise stay allocated while reads come whole)
            self._buf.clear()
            self._pos = 0
        return self._frame_at(data, 0, length, ori)

    def _frame_at(self, buf, pos: int, length: int, ori: int, body: bytes | None = None) -> RemotingCommand:
        """The complete frame at `pos` of `buf` (its length checked) as a command (`body`:
        its body when already cut out, _gathered's)."""
        stype = (ori >> 24) & 0xFF
        hlen = ori & 0xFFFFFF
        if stype not in _VALID_TYPES:
            self._broken = True
            raise ProtocolError(f"unknown serialize type {stype}")
        if hlen > length - 4:
            self._broken = True
            raise ProtocolError(f"header length {hlen} exceeds frame length {length}")
        hstart = pos + 8
        bstart = hstart + hlen
        try:
            code, language, version, opaque, flag, remark, ext = DECODERS[stype](
                memoryview(buf)[hstart:bstart])
        except ProtocolError:
            self._broken = True
            raise
        if body is None:
            # One copy of the body whether `buf` is a read's bytes or the decoder's bytearray: a
            # bytearray slice would be a copy and bytes() of it another (a pull reply of 256 KiB:
            # 2 allocations and copies instead of 1). The view is released before the buffer
            # can be resized again (feed, compaction).
            with memoryview(buf) as view:
                body = view[bstart:pos + 4 + length].tobytes()
        return RemotingCommand(code, opaque, flag, remark, ext, body, language, version, stype)

    def _check_length(self, length: int) -> None:
        if length < 4 or length > self.frame_size_bytes_max:
            self._broken = True
            raise ProtocolError(f"frame length {length} outside [4, {self.frame_size_bytes_max}]")

    def commands(self):
        while True:
            cmd = self.next_command()
            if cmd is None:
                return
            yield cmd
