"""Consume timeout (PushConsumer consume_timeout_min, Java's consumeTimeout) against real
`mqnamesrv` / `mqbroker` processes: a listener call that outlives the timeout has its
message sent back (redelivered with reconsume_times 1) and its late result ignored."""
from __future__ import annotations

import asyncio

import pytest

from pocketmq.client import CONSUME_SUCCESS
from pocketmq.client.instance import ClientInstance
from tests.integration.test_client_cluster import create_topic, uniq, wait_for
from tests.integration.test_client_real_broker import send_one, start_consumer
from tests.support.daemons import Cluster
from tests.support.events import Sink

pytestmark = pytest.mark.slow

LEVELS = "--messageDelayLevel=1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("consume-timeout")), broker_args=[LEVELS]).start()
    yield c
    c.stop()


async def test_a_stuck_listener_call_is_sent_back_and_its_late_result_ignored(cluster):
    async with asyncio.timeout(60):
        topic, group = uniq("Stuck"), uniq("StuckGroup")
        await create_topic(cluster, topic, 1)
        seen = Sink()
        release = asyncio.Event()

        async def listener(msg):
            seen.append((msg.body, msg.reconsume_times, msg.topic))
            if msg.reconsume_times == 0:
                await release.wait()          # stuck until the redelivery arrived
            return CONSUME_SUCCESS

        c = await start_consumer(cluster, group, topic, listener, consume_timeout_min=1 / 60)
        try:
            await send_one(cluster, topic, b"slow")
            await seen.until(lambda s: len(s) == 1)
            mq = next(mq for mq in c.pqs if mq.topic == topic)
            await wait_for(lambda: c.in_flight_ages().get(mq, 0) >= 200, 5, "the stuck call to age")
            await seen.until(lambda s: len(s) == 2)
            assert seen[1] == (b"slow", 1, topic)      # original topic restored, counted once
            assert c.stats["expired"] == 1
            release.set()
            await wait_for(lambda: c.stats["late_results"] == 1, 5, "the late result")
            await wait_for(lambda: all(a == 0 for a in c.in_flight_ages().values()), 5, "nothing in flight")
            assert c.stats["consumed"] == 1 and c.stats["sent_back"] == 1
        finally:
            await c.close()
        assert len(seen) == 2
        inst = ClientInstance(uniq("127.0.0.1@q"), cluster.namesrv_addr)
        try:
            assert await inst.api.query_consumer_offset(cluster.broker_addr, group, mq) == 1
        finally:
            await inst.close()
