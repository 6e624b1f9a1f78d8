"""client.fetcher's flow-control wait: ends when the consumer makes room
(wake_fetcher), else after the delay; a wake with nobody waiting does nothing."""
from __future__ import annotations

import asyncio

from pocketmq.client.fetcher import _wait_for_room, wake_fetcher
from pocketmq.client.subscription_state import QueueState
from pocketmq.protocol.bodies import MessageQueue


def queue_state() -> QueueState:
    return QueueState(MessageQueue("T", "b", 0))


async def test_room_made_ends_the_wait_at_once():
    qs = queue_state()
    wait = asyncio.ensure_future(_wait_for_room(qs, 60.0))
    await asyncio.sleep(0)
    assert qs.room is not None and not wait.done()
    wake_fetcher(qs)
    assert await asyncio.wait_for(wait, 5.0) is True
    assert qs.room is None                      # nothing left behind for the next wake


async def test_without_room_the_wait_ends_after_the_delay():
    qs = queue_state()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await _wait_for_room(qs, 0.02) is False
    assert loop.time() - t0 >= 0.019 and qs.room is None


async def test_a_wake_without_a_waiter_or_twice_is_harmless():
    qs = queue_state()
    wake_fetcher(qs)                            # nobody waits: no error, nothing kept
    assert qs.room is None
    wait = asyncio.ensure_future(_wait_for_room(qs, 60.0))
    await asyncio.sleep(0)
    wake_fetcher(qs)
    wake_fetcher(qs)
    assert await wait is True


async def test_a_cancelled_wait_clears_its_future():
    qs = queue_state()
    wait = asyncio.ensure_future(_wait_for_room(qs, 60.0))
    await asyncio.sleep(0)
    wait.cancel()
    await asyncio.gather(wait, return_exceptions=True)
    assert qs.room is None
    wake_fetcher(qs)
