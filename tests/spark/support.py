"""Helpers of the Spark tier: topics on chosen brokers, sends to chosen queues (blocking
client facade), waiting for routes."""
from __future__ import annotations

import time

from pocketmq.client import Message, sync
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.bodies import MessageQueue, TopicConfig


def create_topic(cluster, topic: str, brokers: list[str], queues: int) -> None:
    async def go():
        inst = ClientInstance("127.0.0.1@spark-tests-admin", cluster.namesrv_addr)
        try:
            for b in brokers:
                await inst.api.create_topic(cluster.addr(b), TopicConfig(topic, queues, queues), "TBW102")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                route = await inst.api.get_route(topic)
                if route is not None and sorted(q.broker_name for q in route.queue_datas) == sorted(brokers):
                    return
                await _sleep(0.05)
            raise AssertionError(f"route of {topic} never showed brokers {brokers}")
        finally:
            await inst.close()
    sync.run(go(), 30)


async def _sleep(s):
    import asyncio
    await asyncio.sleep(s)


def queue_min_offset(cluster, topic: str, broker: str, queue_id: int) -> int:
    async def go():
        inst = ClientInstance("127.0.0.1@spark-tests-admin", cluster.namesrv_addr)
        try:
            return await inst.api.min_offset(cluster.addr(broker), MessageQueue(topic, broker, queue_id))
        finally:
            await inst.close()
    return sync.run(go(), 30)


def send_to(producer: sync.Producer, msgs: list[tuple[MessageQueue, Message]]):
    """Send each message to its queue; the SendResults in order."""
    return [producer.send(m, queue=q) for q, m in msgs]


def wait_head_deleted(cluster, topic: str, broker: str, queue_id: int, timeout_s: float = 40) -> int:
    """Poll until retention has deleted the head of the queue (min offset > 0; broker-lossy
    cleans every housekeeping period, there is no event to await); the new min offset."""
    deadline = time.monotonic() + timeout_s
    while (mn := queue_min_offset(cluster, topic, broker, queue_id)) == 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"{broker} never cleaned the expired segments of {topic} queue {queue_id}")
        time.sleep(0.5)
    return mn
