"""Consumer behaviour that tests/integration/test_client_push_consumer.py checks against the
in-process fake broker, here against real `mqnamesrv` / `mqbroker` processes: broadcasting
with local offsets across a restart, the local fallback when the broker refuses a
send-back, the pull's commit-offset flag, and pulls without a subscription (as Java
consumers send them) served from the heartbeat's subscription."""
from __future__ import annotations

import asyncio

import pytest

from pocketmq.client import CONSUME_SUCCESS, RECONSUME_LATER, Message, Producer, PushConsumer
from pocketmq.client.instance import ClientInstance
from pocketmq.common.constants import retry_topic
from pocketmq.protocol import bodies
from pocketmq.protocol.bodies import MessageQueue, TopicConfig
from pocketmq.protocol.codes import PermName, PullSysFlag, RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.message import decode_records
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import send_cmd
from tests.integration.test_client_cluster import create_topic, uniq, wait_for
from tests.support.daemons import Cluster
from tests.support.events import Sink

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("real-broker"))).start()
    yield c
    c.stop()


async def start_consumer(cluster, group: str, topic: str, listener, **options) -> PushConsumer:
    """A started clustering PushConsumer of `group` on `topic` from its first offset."""
    c = PushConsumer(group, cluster.namesrv_addr, listener=listener, instance_name=uniq("c"),
                     consume_from_where="FIRST_OFFSET", **options)
    c.subscribe(topic)
    await c.start()
    return c


async def send_one(cluster, topic: str, body: bytes) -> None:
    async with Producer(uniq("P"), cluster.namesrv_addr, instance_name=uniq("p")) as p:
        await p.send(Message(topic, body))


def raw_pull(group, topic, offset, *, subscription=None, sub_version=0, commit=None):
    flag = (PullSysFlag.SUBSCRIPTION if subscription is not None else 0) | (
        PullSysFlag.COMMIT_OFFSET if commit is not None else 0)
    ext = {"consumerGroup": group, "topic": topic, "queueId": "0", "queueOffset": str(offset),
           "maxMsgNums": "32", "sysFlag": str(flag), "commitOffset": str(commit or 0),
           "suspendTimeoutMillis": "0", "subVersion": str(sub_version)}
    if subscription is not None:
        ext["subscription"] = subscription
    return RemotingCommand(R.PULL_MESSAGE, ext_fields=ext)


async def test_broadcasting_each_member_gets_everything_and_a_restarted_one_resumes_locally(cluster, tmp_path):
    async with asyncio.timeout(90):
        topic, group = uniq("Bcast"), uniq("BcastGroup")
        await create_topic(cluster, topic, 4)
        sinks = [Sink() for _ in range(3)]
        names = [uniq(f"b{i}") for i in range(3)]

        def make(i):
            async def listener(msg):
                sinks[i].append(msg.body)
                return CONSUME_SUCCESS
            c = PushConsumer(group, cluster.namesrv_addr, listener=listener, instance_name=names[i],
                             message_model="BROADCASTING", consume_from_where="FIRST_OFFSET",
                             broadcast_offset_dir=str(tmp_path))
            c.subscribe(topic)
            return c

        cs = [make(i) for i in range(3)]
        for c in cs:
            await c.start()
        async with Producer(uniq("BP"), cluster.namesrv_addr, instance_name=uniq("bp")) as p:
            for i in range(40):
                await p.send(Message(topic, f"a{i}".encode()))
            for s in sinks:
                await s.until(lambda s: len(s) >= 40)
            first = {f"a{i}".encode() for i in range(40)}
            assert all(sorted(s) == sorted(first) for s in sinks)    # everything, once each
            await cs[0].close()                                      # commits to its offsets file
            for i in range(10):
                await p.send(Message(topic, f"b{i}".encode()))
            for s in sinks[1:]:
                await s.until(lambda s: len(s) >= 50)
        sinks[0].clear()
        cs[0] = make(0)
        await cs[0].start()
        await sinks[0].until(lambda s: len(s) >= 10)
        # caught up: every queue's commit point is past its last message (offsets sum to 50)
        await wait_for(lambda: sum(pq.commit_offset() for mq, pq in cs[0].pqs.items() if mq.topic == topic) == 50,
                       20, "the restarted member to catch up")
        assert sorted(sinks[0]) == sorted(f"b{i}".encode() for i in range(10))
        for c in cs:
            await c.close()
        assert all(len(s) == 50 for s in sinks[1:])


async def test_a_refused_send_back_is_consumed_again_locally_after_5s(cluster):
    async with asyncio.timeout(60):
        topic, group = uniq("Refuse"), uniq("RefuseGroup")
        await create_topic(cluster, topic, 1)
        inst = ClientInstance(uniq("127.0.0.1@admin"), cluster.namesrv_addr)
        # %RETRY%<group> read-only: the broker answers CONSUMER_SEND_MSG_BACK with NO_PERMISSION
        await inst.api.create_topic(cluster.broker_addr, TopicConfig(retry_topic(group), 1, 1, PermName.READ),
                                    "TBW102")
        loop = asyncio.get_running_loop()
        seen = Sink()

        async def listener(msg):
            seen.append((loop.time(), msg.topic, msg.msg_id, msg.reconsume_times))
            return RECONSUME_LATER if len(seen) == 1 else CONSUME_SUCCESS

        c = await start_consumer(cluster, group, topic, listener)
        try:
            await send_one(cluster, topic, b"again")
            await seen.until(lambda s: len(s) == 2)
            (t0, topic0, id0, _), (t1, topic1, id1, _) = seen
            assert topic0 == topic1 == topic and id0 == id1          # the same message, not a retry copy
            assert t1 - t0 >= 4.5, t1 - t0                           # the local fallback waits 5 s
            assert (c.stats["failed"], c.stats["sent_back"], c.stats["consumed"]) == (1, 0, 1)
        finally:
            await c.close()
        try:
            name = (await inst.api.get_route(topic)).broker_datas[0].broker_name
            assert await inst.api.query_consumer_offset(cluster.broker_addr, group, MessageQueue(topic, name, 0)) == 1
        finally:
            await inst.close()
        assert len(seen) == 2


async def test_commit_offset_flag_of_a_pull_stores_the_offset_on_the_broker(cluster):
    async with asyncio.timeout(30):
        topic, group = uniq("PullCommit"), uniq("PullCommitGroup")
        await create_topic(cluster, topic, 1)
        client = RemotingClient()
        inst = ClientInstance(uniq("127.0.0.1@q"), cluster.namesrv_addr)
        try:
            for i in range(5):
                assert (await client.invoke(cluster.broker_addr, send_cmd(topic, f"m{i}".encode()))).code == C.SUCCESS
            name = (await inst.api.get_route(topic)).broker_datas[0].broker_name
            mq = MessageQueue(topic, name, 0)
            p = await client.invoke(cluster.broker_addr, raw_pull(group, topic, 3, subscription="*", commit=3))
            assert p.code == C.SUCCESS and [m.body for m in decode_records(p.body)] == [b"m3", b"m4"]
            assert await inst.api.query_consumer_offset(cluster.broker_addr, group, mq) == 3
            # commitOffset without the flag is not stored
            p = await client.invoke(cluster.broker_addr, raw_pull(group, topic, 4, subscription="*"))
            assert p.code == C.SUCCESS
            assert await inst.api.query_consumer_offset(cluster.broker_addr, group, mq) == 3
            p = await client.invoke(cluster.broker_addr, raw_pull(group, topic, 5, subscription="*", commit=5))
            assert await inst.api.query_consumer_offset(cluster.broker_addr, group, mq) == 5
        finally:
            await client.close()
            await inst.close()


async def test_a_pull_without_subscription_is_served_from_the_heartbeat(cluster):
    async with asyncio.timeout(30):
        topic, group = uniq("HbSub"), uniq("HbSubGroup")
        await create_topic(cluster, topic, 1)
        client = RemotingClient()
        try:
            for i in range(6):
                r = await client.invoke(cluster.broker_addr, send_cmd(topic, f"m{i}".encode(),
                                                                      tags="TagA" if i % 2 == 0 else "TagB"))
                assert r.code == C.SUCCESS
            # no heartbeat yet: Java's answer
            p = await client.invoke(cluster.broker_addr, raw_pull(group, topic, 0))
            assert p.code == C.SUBSCRIPTION_NOT_EXIST, p.remark
            hb = bodies.HeartbeatData(uniq("127.0.0.1@hb"), consumer_data_set=[bodies.ConsumerData(
                group, subscription_data_set=[bodies.build_subscription(topic, "TagA", sub_version=7)])])
            r = await client.invoke(cluster.broker_addr, RemotingCommand(R.HEART_BEAT, body=bodies.dumps(hb.to_json())))
            assert r.code == C.SUCCESS
            p = await client.invoke(cluster.broker_addr, raw_pull(group, topic, 0, sub_version=7))
            assert p.code == C.SUCCESS, p.remark
            assert [m.body for m in decode_records(p.body)] == [b"m0", b"m2", b"m4"]
            # a pull naming a newer subscription than the heartbeat's is refused
            p = await client.invoke(cluster.broker_addr, raw_pull(group, topic, 0, sub_version=8))
            assert p.code == C.SUBSCRIPTION_NOT_LATEST
        finally:
            await client.close()
