"""The server's read path without sockets: requests handled in slices, reading paused for
write backpressure and for the shared partial-frame budget (remoting/read_budget.py)."""
from __future__ import annotations

import asyncio
import struct

import pytest

from pocketmq.protocol.command import RemotingCommand, encode
from pocketmq.remoting.connection import DISPATCH_SLICE, Connection
from pocketmq.remoting.read_budget import SMALL_FRAME_BYTES, ReadBudget


class Transport:
    def __init__(self):
        self.reading = True
        self.pauses = 0
        self.written = []
        self.aborted = False
        self.buffered = 0

    def get_extra_info(self, _k):
        return None

    def writelines(self, parts):
        self.written.append(b"".join(parts))

    def write(self, data):
        self.written.append(data)

    def is_closing(self):
        return self.aborted

    def get_write_buffer_size(self):
        return self.buffered

    def pause_reading(self):
        assert self.reading, "paused twice"
        self.reading = False
        self.pauses += 1

    def resume_reading(self):
        assert not self.reading, "resumed while reading"
        self.reading = True

    def abort(self):
        self.aborted = True

    def close(self):
        self.aborted = True


def server_conn(handler, budget=None) -> tuple[Connection, Transport]:
    conn = Connection(handler, pause_reading_on_backpressure=True, read_budget=budget)
    t = Transport()
    conn.connection_made(t)
    return conn, t


def frames(n: int) -> bytes:
    return b"".join(encode(RemotingCommand(105, opaque=i)) for i in range(1, n + 1))


class FakeConn:
    def __init__(self):
        self.closed = False
        self.budget_wanted = 0
        self.granted = []

    def budget_granted(self, n):
        self.budget_wanted = 0
        self.granted.append(n)


# -- ReadBudget: who may read --------------------------------------------------------------

def test_budget_admits_in_order_and_always_one_frame():
    b = ReadBudget(100, 1000)
    a, c, d = FakeConn(), FakeConn(), FakeConn()
    assert b.reserve(a, 250)              # alone: admitted even over the budget
    c.budget_wanted = 10
    assert not b.reserve(c, 10)           # nothing fits beside it
    d.budget_wanted = 60
    assert not b.reserve(d, 60)
    b.release(250)
    assert c.granted == [10] and d.granted == [60] and b.reserved == 70
    e = FakeConn()
    e.budget_wanted = 40
    assert not b.reserve(e, 40)           # 70 + 40 > 100
    b.release(60)
    assert e.granted == [40] and b.reserved == 50


def test_budget_skips_waiters_that_closed():
    b = ReadBudget(100, 1000)
    a, c, d = FakeConn(), FakeConn(), FakeConn()
    b.reserve(a, 100)
    for w in (c, d):
        w.budget_wanted = 80
        assert not b.reserve(w, 80)
    c.closed = True
    b.forget(c)
    b.release(100)
    assert c.granted == [] and d.granted == [80]


def test_budget_rejects_nonsense():
    with pytest.raises(ValueError, match="bytes_max"):
        ReadBudget(0, 1000)


# -- Connection: slices ----------------------------------------------------------------------

async def test_pipelined_requests_are_handled_one_slice_per_loop_turn(clock):
    handled = []
    done = asyncio.Event()
    n = 2 * DISPATCH_SLICE + 10

    def handler(conn, cmd):
        handled.append(cmd.opaque)
        if len(handled) == n:
            done.set()
        return cmd.response(0)
    conn, t = server_conn(handler)
    conn.data_received(frames(n))            # (the fake clock stands still: slices by count)
    assert len(handled) == DISPATCH_SLICE and not t.reading      # one slice, then yield
    assert len(t.written) == 1                                   # its answers in one write
    await asyncio.wait_for(done.wait(), 5)
    assert handled == list(range(1, n + 1))
    await asyncio.sleep(0)                  # the last continuation resumes reading
    assert t.reading and t.pauses == 1


async def test_requests_wait_while_the_peer_does_not_read_its_answers():
    handled = []
    conn, t = server_conn(lambda c, cmd: handled.append(cmd.opaque) or cmd.response(0))
    conn.pause_writing()                    # write buffer over its high-water mark
    assert not t.reading
    conn.data_received(frames(5))           # read before the pause took effect
    await asyncio.sleep(0)
    assert handled == []                    # not handled: its answers would pile up
    resumed = asyncio.Event()
    conn.handler = lambda c, cmd: (handled.append(cmd.opaque), resumed.set())[0] or cmd.response(0)
    conn.resume_writing()
    await asyncio.wait_for(resumed.wait(), 5)
    assert handled == [1, 2, 3, 4, 5] and t.reading


# -- Connection: the budget ------------------------------------------------------------------

def big_frame_prefix(total: int) -> bytes:
    return struct.pack(">ii", total - 4, 2)


async def test_large_partial_frames_reserve_the_budget_and_wait_for_it():
    budget = ReadBudget(3 * SMALL_FRAME_BYTES, 60_000)
    size = 2 * SMALL_FRAME_BYTES
    got = []
    a, ta = server_conn(lambda c, cmd: got.append(("a", len(cmd.body))) or None, budget)
    b, tb = server_conn(lambda c, cmd: got.append(("b", len(cmd.body))) or None, budget)
    frame = encode(RemotingCommand(105, opaque=1, body=b"z" * (size - 200)))
    a.data_received(frame[:SMALL_FRAME_BYTES + 10])
    assert a.budget_reserved == len(frame) and budget.reserved == len(frame) and ta.reading
    b.data_received(frame[:SMALL_FRAME_BYTES + 10])
    assert b.budget_wanted == len(frame) and not tb.reading      # would pass the budget
    b.data_received(frame[SMALL_FRAME_BYTES + 10:SMALL_FRAME_BYTES + 20])   # already read: kept
    a.data_received(frame[SMALL_FRAME_BYTES + 10:])              # a's frame completes
    assert got == [("a", size - 200)] and a.budget_reserved == 0
    assert b.budget_reserved == len(frame) and tb.reading        # b admitted
    b.data_received(frame[SMALL_FRAME_BYTES + 20:])
    assert got[-1] == ("b", size - 200) and budget.reserved == 0
    a.connection_lost(None)
    b.connection_lost(None)
    budget.close()


async def test_a_closed_connection_gives_its_reservation_back():
    budget = ReadBudget(SMALL_FRAME_BYTES * 2, 60_000)
    a, _ = server_conn(lambda c, cmd: None, budget)
    b, tb = server_conn(lambda c, cmd: None, budget)
    prefix = big_frame_prefix(10 * SMALL_FRAME_BYTES)
    a.data_received(prefix + b"\0" * SMALL_FRAME_BYTES)
    b.data_received(prefix + b"\0" * SMALL_FRAME_BYTES)
    assert not tb.reading
    a.connection_lost(None)
    assert tb.reading and budget.reserved == 10 * SMALL_FRAME_BYTES
    b.connection_lost(None)
    assert budget.reserved == 0 and not budget.waiters
    budget.close()


@pytest.fixture
def clock(monkeypatch):
    """One fake monotonic clock (seconds) for the connections and the budget's sweep."""
    from pocketmq.remoting import connection, read_budget
    now = [1000.0]
    monkeypatch.setattr(read_budget, "monotonic", lambda: now[0])
    monkeypatch.setattr(connection, "_monotonic", lambda: now[0])
    return now


def sweep(budget: ReadBudget) -> None:
    budget.close()                          # the timer's sweep, run by hand at the fake time
    budget._sweep()


async def test_a_frame_that_does_not_complete_in_time_closes_its_connection(clock):
    now = clock
    budget = ReadBudget(10 * SMALL_FRAME_BYTES, 2000)
    slow, ts = server_conn(lambda c, cmd: None, budget)
    busy, tb = server_conn(lambda c, cmd: cmd.response(0), budget)
    slow.data_received(b"\0\0")             # two bytes of a length, then nothing
    one = frames(1)
    busy.data_received(one[:10])
    assert budget.partial == {slow, busy}
    now[0] = 1001.5
    busy.data_received(one[10:] + one[:5])  # a frame completed: the next one's clock starts
    now[0] = 1002.5
    sweep(budget)
    assert ts.aborted and not tb.aborted and budget.timeouts == 1
    busy.data_received(one[5:])             # nothing partial any more: dropped from the sweep
    sweep(budget)
    assert budget.partial == set()
    budget.close()


async def test_a_connection_we_stopped_reading_is_not_timed(clock):
    now = clock
    budget = ReadBudget(10 * SMALL_FRAME_BYTES, 2000)
    conn, t = server_conn(lambda c, cmd: cmd.response(0), budget)
    conn.data_received(frames(1)[:5])
    conn.pause_writing()                    # its peer does not read: we stop reading it
    now[0] = 1010.0
    sweep(budget)
    assert not t.aborted
    conn.resume_writing()                   # its clock restarts when we read again
    now[0] = 1011.0
    sweep(budget)
    assert not t.aborted
    now[0] = 1012.5
    sweep(budget)
    assert t.aborted
    budget.close()


async def test_a_slice_cut_by_write_backpressure_resumes_reading_when_the_peer_catches_up(clock):
    # The slice ends exactly at the last request read and the answers pass the
    # high-water mark: nothing is left in the decoder, yet reading must resume later.
    handled = []
    conn, t = server_conn(lambda c, cmd: handled.append(cmd.opaque) or cmd.response(0))
    conn.data_received(frames(DISPATCH_SLICE))
    assert len(handled) == DISPATCH_SLICE and not t.reading
    conn.pause_writing()
    await asyncio.sleep(0)                  # the continuation sees the backpressure
    assert not t.reading and conn.decoder.buffered_bytes == 0
    conn.resume_writing()
    await asyncio.sleep(0)
    assert t.reading and handled == list(range(1, DISPATCH_SLICE + 1))


async def test_a_slice_also_ends_when_its_time_is_up(clock):
    handled = []

    def slow_handler(conn, cmd):
        handled.append(cmd.opaque)
        clock[0] += 0.001                   # each request takes 1 ms
        return cmd.response(0)
    conn, t = server_conn(slow_handler)
    conn.data_received(frames(100))
    assert len(handled) == 16 and not t.reading     # 5 ms passed at the first check
