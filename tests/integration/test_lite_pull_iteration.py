"""`async for msg in consumer` (LitePullConsumer.__aiter__): the loop the README shows.
It yields what poll() returns, waits while nothing arrives, and ends when the consumer
is closed (from another task, or by leaving `async with`)."""
from __future__ import annotations

import asyncio

import pytest

from pocketmq.client.errors import ClientStateError
from pocketmq.client.lite_pull_consumer import LitePullConsumer
from pocketmq.client.message import Message
from pocketmq.client.producer import Producer
from tests.support.fake_broker import FakeCluster


async def send(addr: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer("IterProducer", addr, instance_name="iter-producer") as p:
        for body in bodies:
            await p.send(Message(topic, body))


async def test_iteration_waits_for_messages_and_ends_when_closed():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 2)
            await send(cluster.namesrv_addr, "T", [b"a", b"b"])
            consumer = LitePullConsumer("IterG", cluster.namesrv_addr, instance_name="iter",
                                        consume_from_where="FIRST_OFFSET")
            consumer.subscribe("T")
            got: list[bytes] = []
            two, three = asyncio.Event(), asyncio.Event()

            async def loop() -> str:
                async for msg in consumer:
                    got.append(msg.body)
                    (two if len(got) == 2 else three).set()
                return "ended"

            await consumer.start()
            task = asyncio.create_task(loop())
            await two.wait()
            await send(cluster.namesrv_addr, "T", [b"c"])     # arrives while the loop waits
            await three.wait()
            assert not task.done()                            # nothing more: it keeps waiting
            await consumer.close()
            assert await task == "ended"                      # close() ended the loop
            assert sorted(got) == [b"a", b"b", b"c"]


async def test_leaving_async_with_ends_a_loop_in_another_task():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            consumer = LitePullConsumer("IterG2", cluster.namesrv_addr, instance_name="iter2")
            consumer.subscribe("T")
            async def first():
                async for msg in consumer:
                    return msg
                return None

            async with consumer:
                task = asyncio.create_task(first())
                await asyncio.sleep(0)                        # the loop is waiting in poll()
            assert await task is None                         # no message, the iteration ended


def test_iterating_a_consumer_that_was_never_started_is_an_error():
    consumer = LitePullConsumer("IterG3", "127.0.0.1:9876")
    with pytest.raises(ClientStateError, match="not started"):
        aiter(consumer)
