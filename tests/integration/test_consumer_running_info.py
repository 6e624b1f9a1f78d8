"""GET_CONSUMER_RUNNING_INFO relayed by a real broker to our push consumers, and mqadmin's
consumerStatus / consumerConnection against real `mqnamesrv` / `mqbroker` processes.
mqadmin runs in a thread: the consumers answering the relayed request share this loop."""
from __future__ import annotations

import asyncio

import pytest

from pocketmq.client import PushConsumer
from pocketmq.client.errors import BrokerError
from pocketmq.client.instance import ClientInstance
from tests.integration.test_client_cluster import create_topic, uniq, wait_for
from tests.support.daemons import Cluster
from tests.support.workloads import run_mqadmin

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("running-info"))).start()
    yield c
    c.stop()


async def mqadmin(*args):
    return await asyncio.to_thread(run_mqadmin, *args)


async def test_consumer_status_and_connection_for_concurrent_and_orderly_consumers(cluster):
    async with asyncio.timeout(90):
        topic, g_conc, g_ord = uniq("RunInfo"), uniq("RunConc"), uniq("RunOrd")
        await create_topic(cluster, topic, 4)

        async def listener(msg):
            return None
        conc = PushConsumer(g_conc, cluster.namesrv_addr, listener=listener, instance_name=uniq("conc"))
        conc.subscribe(topic, "TagA || TagB")
        orderly = PushConsumer(g_ord, cluster.namesrv_addr, listener=listener, instance_name=uniq("ord"),
                               orderly=True)
        orderly.subscribe(topic)
        inst = ClientInstance(uniq("127.0.0.1@admin"), cluster.namesrv_addr)
        await conc.start()
        await orderly.start()
        try:
            await wait_for(lambda: len([mq for mq in conc.pqs if mq.topic == topic]) == 4, 20, "4 queues")
            await wait_for(lambda: len([mq for mq, pq in orderly.pqs.items() if mq.topic == topic and pq.locked])
                           == 4, 20, "4 locked queues")
            # the client API through the broker
            info = await inst.api.consumer_running_info(cluster.broker_addr, g_ord, orderly.client_id)
            assert info["properties"]["PROP_CONSUMEORDERLY"] == "true"
            mine = {mq: p for mq, p in info["mqTable"].items() if mq.topic == topic}
            assert len(mine) == 4 and all(p["locked"] is True for p in mine.values())
            info = await inst.api.consumer_running_info(cluster.broker_addr, g_conc, conc.client_id)
            assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
            assert {s.topic: s.sub_string for s in info["subscriptionSet"]}[topic] == "TagA || TagB"
            with pytest.raises(BrokerError, match="not online"):
                await inst.api.consumer_running_info(cluster.broker_addr, g_conc, "127.0.0.1@nobody")

            r = await mqadmin("consumerStatus", "-n", cluster.namesrv_addr, "-g", g_ord, "-i", orderly.client_id)
            assert r.returncode == 0, r.stderr
            assert "#Consumer MQ Detail#" in r.stdout
            assert "PROP_CONSUMEORDERLY                     : true" in r.stdout
            detail = [ln for ln in r.stdout.splitlines() if ln.startswith(topic) and "ProcessQueueInfo [" in ln]
            assert len(detail) == 4 and all("locked=true" in ln for ln in detail)

            r = await mqadmin("consumerStatus", "-n", cluster.namesrv_addr, "-g", g_conc)
            assert r.returncode == 0, r.stderr
            assert conc.client_id in r.stdout and "Same subscription in the same group of consumer" in r.stdout
            assert "locked=false" in r.stdout

            r = await mqadmin("consumerConnection", "-n", cluster.namesrv_addr, "-g", g_conc)
            assert r.returncode == 0, r.stderr
            first = r.stdout.splitlines()[0].split()
            assert first[:2] == ["001", conc.client_id] and first[3] == "PYTHON" and first[4] == "V4_9_4"
            assert f"Topic: {topic}" in r.stdout and "SubExpression: TagA || TagB" in r.stdout
            assert "ConsumeType: CONSUME_PASSIVELY" in r.stdout and "MessageModel: CLUSTERING" in r.stdout

            for cmd in (["consumerStatus", "-g", uniq("Nobody")], ["consumerConnection", "-g", uniq("Nobody")],
                        ["consumerStatus", "-g", g_conc, "-i", "127.0.0.1@nobody"]):
                r = await mqadmin(cmd[0], "-n", cluster.namesrv_addr, *cmd[1:])
                assert r.returncode == 1 and "not online" in r.stderr, (cmd, r.stdout, r.stderr)
        finally:
            await conc.close()
            await orderly.close()
            await inst.close()
