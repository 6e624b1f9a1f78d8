"""Subscription groups over TCP: the three request codes, persistence, `mqadmin
updateSubGroup` / `deleteSubGroup` against real daemons, and a group's retryMaxTimes
honoured end to end by our push consumer's retries."""
import asyncio
import json
import os
import time

import pytest

from pocketmq.client import RECONSUME_LATER, Message, Producer, PushConsumer
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.bodies import MessageQueue, SubscriptionGroupConfig, dumps
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import pull_cmd, send_cmd
from tests.support.daemons import Cluster
from tests.support.local import local_cluster
from tests.support.workloads import run_mqadmin

pytestmark = pytest.mark.asyncio

# Non-uniform: a retry uses level 3 + reconsume_times (1 s, then 2 s); levels 1 and 2 are
# long, so a wrong level shows as a long wait.
LEVELS = "--messageDelayLevel=6s 6s 1s 2s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s"


def update_cmd(body) -> RemotingCommand:
    return RemotingCommand(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                           body=body if isinstance(body, bytes) else dumps(body))


async def test_the_three_codes_over_tcp_and_persistence(tmp_path):
    root = str(tmp_path)
    async with local_cluster(root) as (ns, broker):
        c = RemotingClient()
        try:
            r = await c.invoke(broker.addr, update_cmd({"groupName": "WG", "retryMaxTimes": 3, "consumeEnable": False,
                                                        "retryQueueNums": 2}))
            assert r.code == C.SUCCESS, r.remark
            # durable when answered
            with open(os.path.join(root, "store", "config", "subscriptionGroup.json"), "rb") as f:
                assert json.load(f)["subscriptionGroupTable"]["WG"]["retryMaxTimes"] == 3
            r = await c.invoke(broker.addr, RemotingCommand(R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG))
            wrapper = json.loads(r.body)
            assert set(wrapper) == {"subscriptionGroupTable", "dataVersion"}
            assert set(wrapper["dataVersion"]) == {"timestamp", "counter"}
            assert wrapper["subscriptionGroupTable"]["WG"] == {
                "groupName": "WG", "consumeEnable": False, "consumeFromMinEnable": True,
                "consumeBroadcastEnable": True, "retryQueueNums": 2, "retryMaxTimes": 3, "brokerId": 0,
                "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True}
            # bad bodies and headers: a code and a remark naming the problem
            for body, needle in ((b"", "no SubscriptionGroupConfig body"), (b"[1,", "bad SubscriptionGroupConfig"),
                                 ({"groupName": "WG", "consumeEnable": "maybe"}, "bad consumeEnable"),
                                 ({"groupName": "W G"}, "illegal characters")):
                r = await c.invoke(broker.addr, update_cmd(body))
                assert r.code == C.SYSTEM_ERROR and needle in r.remark, (body, r.remark)
            r = await c.invoke(broker.addr, RemotingCommand(R.DELETE_SUBSCRIPTIONGROUP))
            assert r.code == C.SYSTEM_ERROR and "groupName" in r.remark
            # consumeEnable=false: pulls refused with Java's code and remark
            assert (await c.invoke(broker.addr, send_cmd("WT", b"x"))).code == C.SUCCESS
            r = await c.invoke(broker.addr, pull_cmd("WT", 0, 0, group="WG"))
            assert (r.code, r.remark) == (C.NO_PERMISSION, "subscription group no permission, WG")
            r = await c.invoke(broker.addr, update_cmd({"groupName": "Gone"}))
            r = await c.invoke(broker.addr, RemotingCommand(R.DELETE_SUBSCRIPTIONGROUP,
                                                            ext_fields={"groupName": "Gone"}))
            assert r.code == C.SUCCESS
        finally:
            await c.close()
    async with local_cluster(root, "--autoCreateSubscriptionGroup=false") as (ns, broker):
        assert broker.groups.table["WG"] == SubscriptionGroupConfig("WG", consumeEnable=False, retryQueueNums=2,
                                                                     retryMaxTimes=3)
        assert "Gone" not in broker.groups.table
        c = RemotingClient()
        try:
            r = await c.invoke(broker.addr, pull_cmd("WT", 0, 0, group="WG"))
            assert r.code == C.NO_PERMISSION
        finally:
            await c.close()


@pytest.fixture(scope="module", name="cluster")
def levels_cluster(tmp_path_factory):
    """mqnamesrv + mqbroker with LEVELS (also used by tests/interop/test_cpp_retry.py)."""
    c = Cluster(str(tmp_path_factory.mktemp("levels")), broker_args=[LEVELS])
    c.start()
    yield c
    c.stop()


async def groups_of(cluster) -> dict:
    inst = ClientInstance("test@subgroups", cluster.namesrv_addr)
    try:
        groups, _ = await inst.api.all_subscription_groups(cluster.broker_addr)
        return groups
    finally:
        await inst.close()


async def test_mqadmin_update_and_delete_sub_group_round_trip(cluster):
    r = await asyncio.to_thread(run_mqadmin, "updateSubGroup", "-n", cluster.namesrv_addr, "-c", "DefaultCluster",
                                "-g", "AdminG", "-r", "5", "-q", "2", "-s", "true")
    assert r.returncode == 0, r.stderr
    assert f"create subscription group to {cluster.broker_addr} success." in r.stdout
    assert "SubscriptionGroupConfig [groupName=AdminG, consumeEnable=true, consumeFromMinEnable=false, " \
           "consumeBroadcastEnable=false, retryQueueNums=2, retryMaxTimes=5," in r.stdout
    g = (await groups_of(cluster))["AdminG"]
    assert (g.retryMaxTimes, g.retryQueueNums, g.consumeBroadcastEnable, g.consumeFromMinEnable) == (5, 2, False, False)
    r = await asyncio.to_thread(run_mqadmin, "updateSubGroup", "-b", cluster.broker_addr, "-g", "AdminG", "-r", "7")
    assert r.returncode == 0, r.stderr
    assert (await groups_of(cluster))["AdminG"].retryMaxTimes == 7
    r = await asyncio.to_thread(run_mqadmin, "deleteSubGroup", "-b", cluster.broker_addr, "-g", "AdminG")
    assert r.returncode == 0, r.stderr
    assert f"delete subscription group [AdminG] from broker [{cluster.broker_addr}] success." in r.stdout
    assert "AdminG" not in await groups_of(cluster)
    # usage errors: exit 2, one line
    r = await asyncio.to_thread(run_mqadmin, "updateSubGroup", "-g", "AdminG")
    assert r.returncode == 2 and "-c clusterName or -b brokerAddr" in r.stderr
    r = await asyncio.to_thread(run_mqadmin, "updateSubGroup", "-b", cluster.broker_addr, "-g", "AdminG", "-r", "x")
    assert r.returncode == 2 and "not an integer" in r.stderr
    # a refusal from the broker: exit 1 with its remark
    r = await asyncio.to_thread(run_mqadmin, "updateSubGroup", "-b", cluster.broker_addr, "-g", "Bad:Name")
    assert r.returncode == 1 and "illegal characters" in r.stderr


async def test_retry_max_times_set_by_mqadmin_is_honoured_for_our_listener(cluster):
    group, topic = "RetryG", "RetryTopic"
    r = await asyncio.to_thread(run_mqadmin, "updateSubGroup", "-n", cluster.namesrv_addr, "-c", "DefaultCluster",
                                "-g", group, "-r", "2")
    assert r.returncode == 0, r.stderr
    seen = []
    dead = asyncio.Event()

    async def listener(msg):
        seen.append((time.monotonic(), msg.reconsume_times, msg.topic, msg.body))
        return RECONSUME_LATER

    async with Producer("RetryPG", cluster.namesrv_addr) as p:
        sent = await p.send(Message(topic, b"always fails"))
    c = PushConsumer(group, cluster.namesrv_addr, listener=listener, consume_from_where="FIRST_OFFSET")
    c.subscribe(topic)
    inst = ClientInstance("test@retry-dlq", cluster.namesrv_addr)
    try:
        async with c:
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                if await inst.api.max_offset(cluster.broker_addr, MessageQueue(f"%DLQ%{group}", "broker-a", 0)) >= 1:
                    dead.set()
                    break
                await asyncio.sleep(0.2)
            assert dead.is_set(), seen
            await asyncio.sleep(1.5)   # a 4th delivery would be due 1 s after the 3rd failure
        assert [(rt, t, b) for _, rt, t, b in seen] == [(0, topic, b"always fails"), (1, topic, b"always fails"),
                                                         (2, topic, b"always fails")]
        # level 3 (1 s) then level 4 (2 s): 3 + reconsume_times, not a fixed or shifted level
        assert seen[1][0] - seen[0][0] >= 0.9 and seen[2][0] - seen[1][0] >= 1.9, seen
        assert seen[2][0] - seen[0][0] < 12, seen      # not levels 1/2 (6 s each)
        # the dead letter is the message; the retry topic holds the two retries, both consumed
        rc = RemotingClient()
        try:
            got = await rc.invoke(cluster.broker_addr, pull_cmd(f"%DLQ%{group}", 0, 0, group="inspector"))
            from pocketmq.protocol.message import decode_records
            (letter,) = decode_records(got.body)
            assert letter.body == b"always fails" and letter.reconsume_times == 3
            assert letter.properties["RETRY_TOPIC"] == topic
        finally:
            await rc.close()
        retry_mq = MessageQueue(f"%RETRY%{group}", "broker-a", 0)
        assert await inst.api.max_offset(cluster.broker_addr, retry_mq) == 2
        assert await inst.api.query_consumer_offset(cluster.broker_addr, group, retry_mq) == 2
        assert sent.msg_id
        # deleteSubGroup -c: the group, its offsets, and (as Java's command) its retry and DLQ topics
        r = await asyncio.to_thread(run_mqadmin, "deleteSubGroup", "-n", cluster.namesrv_addr, "-c", "DefaultCluster",
                                    "-g", group, "-r", "true")
        assert r.returncode == 0, r.stderr
        assert f"delete topic [%DLQ%{group}] from cluster [DefaultCluster] success." in r.stdout
        assert group not in await groups_of(cluster)
        rc = RemotingClient()
        try:
            r = await rc.invoke(cluster.broker_addr, RemotingCommand(R.GET_ALL_CONSUMER_OFFSET))
            assert not [k for k in json.loads(r.body)["offsetTable"] if k.endswith("@" + group)]
        finally:
            await rc.close()
        assert await inst.api.get_route(f"%RETRY%{group}") is None
    finally:
        await inst.close()
