"""SYNC_FLUSH group commit (broker/services/flush.py): what a waiting send is told, with the
waiters' timeouts kept in one heap swept by one loop timer instead of a timer per send."""
from __future__ import annotations

import asyncio
import threading

import pytest

from pocketmq.broker.services.flush import FlushService


class FakeStore:
    """flush() makes `appended` durable; while `stall` is clear it blocks (a stuck disk)."""

    def __init__(self) -> None:
        self.appended = 0
        self.stall = threading.Event()
        self.stall.set()
        self.fail = False

    def flush(self) -> int:
        self.stall.wait()
        if self.fail:
            raise OSError("fdatasync failed")
        return self.appended

    def flush_consume_queues(self) -> int:
        return 0


@pytest.fixture
async def service():
    store = FakeStore()
    svc = FlushService(store, sync=True, interval_ms=1000, waiters_max=8)
    svc.start()
    yield svc, store
    store.stall.set()
    svc.stop()


async def test_a_waiter_is_answered_once_its_offset_is_flushed(service):
    svc, store = service
    store.appended = 100
    assert await svc.wait_flushed(100, 5.0) is True
    assert svc.flushed_offset == 100
    assert await svc.wait_flushed(50, 5.0) is True        # already durable: no wait


async def test_a_stuck_flush_times_the_waiters_out_and_later_ones_still_succeed(service):
    svc, store = service
    store.stall.clear()
    store.appended = 10
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    waits = asyncio.gather(*(svc.wait_flushed(10, 0.05) for _ in range(3)))
    assert await asyncio.wait_for(waits, 2.0) == [False] * 3
    assert loop.time() - t0 >= 0.049
    store.stall.set()
    store.appended = 20
    assert await svc.wait_flushed(20, 5.0) is True


async def test_a_shorter_timeout_behind_a_longer_one_fires_first(service):
    svc, store = service
    store.stall.clear()
    store.appended = 10
    long = asyncio.ensure_future(svc.wait_flushed(10, 30.0))
    await asyncio.sleep(0)
    assert await asyncio.wait_for(svc.wait_flushed(10, 0.05), 2.0) is False   # the timer was re-armed
    assert not long.done()
    store.stall.set()
    assert await asyncio.wait_for(long, 5.0) is True


async def test_a_failed_flush_answers_none(service):
    svc, store = service
    store.fail = True
    store.appended = 10
    assert await svc.wait_flushed(10, 5.0) is None
    assert await svc.wait_flushed(20, 5.0) is None          # sticky: never retried


async def test_waiters_are_bounded(service):
    svc, store = service
    store.stall.clear()
    store.appended = 10
    held = [asyncio.ensure_future(svc.wait_flushed(10, 30.0)) for _ in range(8)]
    await asyncio.sleep(0)
    assert await svc.wait_flushed(10, 30.0) is False        # over waiters_max: refused at once
    store.stall.set()
    assert await asyncio.gather(*held) == [True] * 8


async def test_a_cancelled_waiter_leaves_the_others_alone(service):
    svc, store = service
    store.stall.clear()
    store.appended = 10
    gone = asyncio.ensure_future(svc.wait_flushed(10, 0.05))
    kept = asyncio.ensure_future(svc.wait_flushed(10, 30.0))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0.1)                                  # past the cancelled one's deadline
    assert gone.cancelled() and not kept.done()
    store.stall.set()
    assert await kept is True


async def test_answered_waiters_do_not_pile_up_in_the_deadline_heap(service):
    svc, store = service
    for i in range(1, 200):
        store.appended = i
        assert await svc.wait_flushed(i, 5.0) is True
    assert len(svc._waiters._deadlines) <= 2                          # answered ones dropped as new ones come
