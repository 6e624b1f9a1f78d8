"""The server's per-request shortcuts (remoting/connection.py, protocol/command.py) pinned to
the plain path: the same bytes on the wire, the same budget and backpressure decisions.

* _dispatch queues a reply for the read's one writelines itself (no send() call) unless a
  subclass overrides send() (the client's ClientConnection does);
* after a read whose frames were all complete, _account_partial is not called: the state
  it would leave (nothing tracked, nothing reserved) is set directly;
* the write-buffer limit is checked inline after the writelines;
* FrameDecoder.next_command checks the frame length inline;
* a read of exactly one whole frame with nothing buffered is decoded from the read's bytes
  (FrameDecoder.whole_frame), not through the buffer.
"""
from __future__ import annotations

import struct

import pytest

from pocketmq.protocol.codes import FLAG_ONEWAY, SerializeType
from pocketmq.protocol.command import FrameDecoder, RemotingCommand, encode, encode_parts
from pocketmq.protocol.errors import ProtocolError
from pocketmq.remoting.connection import Connection
from pocketmq.remoting.read_budget import SMALL_FRAME_BYTES, ReadBudget
from tests.unit.test_read_budget import Transport

EXT = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true", "msgId": "7F000001000022BE0000000000000000",
       "queueId": "3", "queueOffset": "41"}


def _reply(conn, cmd):
    return cmd.response(0, None, dict(EXT))


def _requests(n, stype):
    return [RemotingCommand(310, opaque=i + 1, ext_fields={"a": "g", "b": "T"}, body=b"x" * 128,
                            serialize_type=stype) for i in range(n)]


@pytest.mark.parametrize("stype", [SerializeType.JSON, SerializeType.MSGPACK, SerializeType.ROCKETMQ])
@pytest.mark.parametrize("table", [True, False])
def test_replies_are_the_plain_encoders_bytes(stype, table):
    # A processor table (the broker) and a handler (other roles), one request per read and
    # several per read: what is written equals encode_parts of each reply, in order.
    reqs = _requests(3, stype)
    expected = b"".join(b"".join(encode_parts(_reply(None, r))) for r in reqs)
    for split in (1, 3):
        conn = Connection(None if table else _reply, processors={310: _reply} if table else None,
                          pause_reading_on_backpressure=True)
        t = Transport()
        conn.connection_made(t)
        frames = [encode(r) for r in reqs]
        if split == 1:
            for f in frames:
                conn.data_received(f)
            assert len(t.written) == 3
        else:
            conn.data_received(b"".join(frames))
            assert len(t.written) == 1            # one writelines for the read
        assert b"".join(t.written) == expected


def test_oneway_requests_get_no_reply():
    conn = Connection(processors={310: _reply}, pause_reading_on_backpressure=True)
    t = Transport()
    conn.connection_made(t)
    cmd = _requests(1, SerializeType.MSGPACK)[0]
    cmd.flag |= FLAG_ONEWAY
    conn.data_received(encode(cmd))
    assert t.written == []


def test_a_subclass_send_is_still_called():
    # ClientConnection overrides send(): replies it produces inside a read go through it.
    class Counting(Connection):
        sent = 0

        def send(self, cmd):
            Counting.sent += 1
            super().send(cmd)

    conn = Counting(processors={310: _reply}, pause_reading_on_backpressure=True)
    t = Transport()
    conn.connection_made(t)
    req = _requests(1, SerializeType.MSGPACK)[0]
    conn.data_received(encode(req))
    assert Counting.sent == 1
    assert t.written == [b"".join(encode_parts(_reply(None, req)))]


def test_no_reply_after_the_connection_closed_inside_the_read():
    def closing(conn, cmd):
        conn.closed = True      # as connection_lost would leave it
        return _reply(conn, cmd)

    conn = Connection(processors={310: closing}, pause_reading_on_backpressure=True)
    t = Transport()
    conn.connection_made(t)
    conn.data_received(encode(_requests(1, SerializeType.MSGPACK)[0]))
    assert t.written == []


def test_write_buffer_limit_still_closes_a_peer_that_does_not_read():
    conn = Connection(processors={310: _reply}, pause_reading_on_backpressure=True)
    conn.write_buffer_bytes_max = 1000
    t = Transport()
    conn.connection_made(t)
    conn.data_received(encode(_requests(1, SerializeType.MSGPACK)[0]))
    assert not t.aborted                    # under the limit
    t.buffered = 1001
    conn.data_received(encode(_requests(1, SerializeType.MSGPACK)[0]))
    assert t.aborted


@pytest.mark.asyncio
async def test_budget_state_after_complete_and_partial_reads():
    budget = ReadBudget(1 << 20, 10_000, "test")
    conn = Connection(processors={310: _reply}, pause_reading_on_backpressure=True, read_budget=budget)
    t = Transport()
    conn.connection_made(t)
    frame = encode(_requests(1, SerializeType.MSGPACK)[0])
    conn.data_received(frame)               # complete: nothing tracked or reserved
    assert conn.partial_since is None and conn.budget_reserved == 0
    conn.data_received(frame[:10])          # a partial frame starts: timed (the plain path)
    assert conn.partial_since is not None
    conn.data_received(frame[10:])          # completed: not timed any more
    assert conn.partial_since is None and conn.budget_reserved == 0
    big = encode(RemotingCommand(310, opaque=9, body=b"y" * (4 * SMALL_FRAME_BYTES)))
    conn.data_received(big[:2 * SMALL_FRAME_BYTES])    # a large partial frame reserves it whole
    assert conn.budget_reserved == len(big)
    conn.data_received(big[2 * SMALL_FRAME_BYTES:])    # done: the reservation is released
    assert conn.budget_reserved == 0 and conn.partial_since is None
    assert budget.reserved == 0
    budget.close()


@pytest.mark.parametrize("length", [0, 3, -1, 1 << 30])
def test_frame_length_bounds_still_refused(length):
    dec = FrameDecoder(1 << 20)
    dec.feed(struct.pack(">ii", length, 0) + b"\0" * 16)
    with pytest.raises(ProtocolError, match="frame length"):
        dec.next_command()
    with pytest.raises(ProtocolError):
        dec.next_command()                  # broken for good


@pytest.mark.parametrize("stype", [SerializeType.JSON, SerializeType.MSGPACK, SerializeType.ROCKETMQ])
def test_whole_frame_reads_and_buffered_reads_interleave(stype):
    """Reads of one whole frame (decoded from the read) between reads that split frames or
    carry several: every request is handled once, in order, with its own body."""
    reqs = [RemotingCommand(310, opaque=i + 1, ext_fields={"a": "g", "b": str(i)}, body=bytes([i]) * (50 + i),
                            serialize_type=stype) for i in range(7)]
    f = [encode(r) for r in reqs]
    reads = [f[0],                              # whole
             f[1][:9], f[1][9:] + f[2],         # split, then its rest with a whole one
             f[3],                              # whole again (the buffer is empty)
             f[4] + f[5][:3],                   # one and the start of the next
             f[5][3:],                          # the rest: through the buffer
             f[6]]                              # whole
    seen = []

    def proc(conn, cmd):
        seen.append((cmd.opaque, cmd.ext_fields["b"], bytes(cmd.body)))
        return cmd.response(0, None, {"queueOffset": str(cmd.opaque)})
    taken = []

    class Decoder(FrameDecoder):
        __slots__ = ()

        def whole_frame(self, data):
            cmd = super().whole_frame(data)
            if cmd is not None:
                taken.append(cmd.opaque)
            return cmd
    conn = Connection(processors={310: proc}, pause_reading_on_backpressure=True)
    conn.decoder = Decoder()
    t = Transport()
    conn.connection_made(t)
    for r in reads:
        conn.data_received(r)
    assert taken == [1, 4, 7]          # the three whole reads took the shortcut
    assert seen == [(r.opaque, r.ext_fields["b"], r.body) for r in reqs]
    assert b"".join(t.written) == b"".join(encode(r.response(0, None, {"queueOffset": str(r.opaque)}))
                                           for r in reqs)
    assert conn.decoder.buffered_bytes == 0 and not conn.closed
