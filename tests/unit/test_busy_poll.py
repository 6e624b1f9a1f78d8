"""BusyPoll keeps the loop polling for its window after a kick, then lets it sleep."""
import asyncio
import time

import pytest

from pocketmq.remoting.busy_poll import BusyPoll

pytestmark = pytest.mark.asyncio


async def test_window_then_idle():
    bp = BusyPoll(2000)   # 2 ms
    bp.kick()
    assert bp._scheduled
    t0 = time.perf_counter()
    while bp._scheduled and time.perf_counter() - t0 < 1:
        await asyncio.sleep(0)
    elapsed = time.perf_counter() - t0
    assert not bp._scheduled and 0.0015 <= elapsed < 0.5


async def test_off_when_zero():
    bp = BusyPoll(0)
    bp.kick()
    assert not bp._scheduled


async def test_adaptive_spins_only_for_frequent_kicks():
    slow = BusyPoll(200, adaptive=True)
    for _ in range(5):
        slow.kick()
        slow._last -= 0.001          # pretend 1 ms passed between kicks
    assert not slow._scheduled       # gaps of 1 ms > 200 us window: no spinning
    fast = BusyPoll(200, adaptive=True)
    for _ in range(20):              # the average forgets the cold start within ~10 kicks
        fast.kick()                  # back-to-back kicks: gaps far below the window
    assert fast._scheduled


async def test_adaptive_does_not_spin_after_long_work():
    bp = BusyPoll(200, adaptive=True)
    for _ in range(20):
        bp.kick(work_s=0.000150)     # frequent, but each read took 150 us > half the window
    assert not bp._scheduled
    for _ in range(20):
        bp.kick(work_s=0.000010)     # short request/response work: spin
    assert bp._scheduled


async def test_server_spins_only_after_answering():
    from pocketmq.protocol.command import RemotingCommand, encode
    from pocketmq.remoting.connection import Connection

    class Transport:
        def get_extra_info(self, _k):
            return None

        def writelines(self, parts):
            pass

        def is_closing(self):
            return False

        def get_write_buffer_size(self):
            return 0

    bp = BusyPoll(2000)
    conn = Connection(lambda c, cmd: cmd.response(0), pause_reading_on_backpressure=True, busy_poll=bp)
    conn.connection_made(Transport())
    frame = encode(RemotingCommand(11, opaque=1, body=b"x" * 100))
    conn.data_received(frame[:40])      # part of a frame: nothing answered, no spinning
    assert not bp._scheduled
    conn.data_received(frame[40:])      # answered: the peer's next request may follow at once
    assert bp._scheduled
