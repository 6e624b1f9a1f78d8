"""CONSUME_MESSAGE_DIRECTLY (309) end to end against real `mqnamesrv` / `mqbroker` processes: an
admin asks the broker to hand one stored message to one client of a group; the broker forwards
it with the record to that client's connection; our PushConsumer runs its listener once and
answers a ConsumeMessageDirectlyResult. Nothing is committed and nothing is sent back. Also
mqadmin's `queryMsgById -g -d` and `queryMsgByUniqueKey -g -d` (Java's way to ask it), and the
errors: a client that is gone, a bad or unknown message id.

The messages live in a topic the groups do not subscribe to (the broker and the client do not
check subscriptions, like Java's), so the groups' offsets on that topic after the consumers have
closed (which commits everything they hold) show whether anything was committed; one message of
the subscribed topic, consumed through the queues, shows that the check can see a commit."""
from __future__ import annotations

import asyncio

import pytest

from pocketmq.client import ConsumeStatus, Message, Producer, PushConsumer
from pocketmq.client.errors import BrokerError
from pocketmq.client.instance import ClientInstance
from tests.integration.test_client_cluster import create_topic, uniq, wait_for
from tests.integration.test_consumer_running_info import mqadmin
from tests.support.daemons import Cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("consume-directly"))).start()
    yield c
    c.stop()


async def test_push_consumer_consumes_directly_without_committing(cluster):
    async with asyncio.timeout(60):
        sub_topic, other, group, g_ord = uniq("CmdSub"), uniq("CmdOther"), uniq("CmdG"), uniq("CmdOrd")
        await create_topic(cluster, sub_topic, 1)
        await create_topic(cluster, other, 1)
        seen, answers = [], {"a": None, "b": ConsumeStatus.RECONSUME_LATER}

        def listener(msg):                      # a plain function: runs in the consumer's executor
            seen.append(msg)
            a = answers.get(msg.body.decode())
            if isinstance(a, Exception):
                raise a
            return a
        conc = PushConsumer(group, cluster.namesrv_addr, listener=listener, instance_name=uniq("cmd"))
        conc.subscribe(sub_topic)
        orderly = PushConsumer(g_ord, cluster.namesrv_addr, listener=listener, instance_name=uniq("cmdo"),
                               orderly=True)
        orderly.subscribe(sub_topic)
        producer = Producer(uniq("CmdP"), cluster.namesrv_addr)
        inst = ClientInstance(uniq("127.0.0.1@cmd-admin"), cluster.namesrv_addr)
        await producer.start()
        await conc.start()
        await orderly.start()
        try:
            # one message through the queues: each group consumes and (at close) commits it
            await producer.send(Message(sub_topic, b"s"))
            await wait_for(lambda: conc.stats["consumed"] == 1 and orderly.stats["consumed"] == 1, 20,
                           "the message of the subscribed topic")
            seen.clear()
            sent = {b: await producer.send(Message(other, b.encode(), tags="T", keys=f"k-{b}")) for b in "abc"}
            answers["c"] = ValueError("listener broke")
            api = inst.api

            r = await api.consume_message_directly(cluster.broker_addr, group, conc.client_id, sent["a"].offset_msg_id)
            assert (r.consume_result, r.order, r.auto_commit, r.remark) == ("CR_SUCCESS", False, True, None)
            assert r.spent_time_mills >= 0
            m = seen[-1]
            assert (m.topic, m.body, m.tags, m.keys, m.msg_id) == (other, b"a", "T", ("k-a",), sent["a"].msg_id)
            assert m.broker_name == sent["a"].queue.broker_name and m.queue_offset == sent["a"].queue_offset

            r = await api.consume_message_directly(cluster.broker_addr, group, conc.client_id, sent["b"].offset_msg_id)
            assert r.consume_result == "CR_LATER" and seen[-1].body == b"b"
            r = await api.consume_message_directly(cluster.broker_addr, group, conc.client_id, sent["c"].offset_msg_id)
            assert r.consume_result == "CR_THROW_EXCEPTION" and "ValueError: listener broke" in r.remark
            # the orderly consumer says so
            r = await api.consume_message_directly(cluster.broker_addr, g_ord, orderly.client_id,
                                                   sent["a"].offset_msg_id)
            assert (r.consume_result, r.order) == ("CR_SUCCESS", True)
            assert len(seen) == 4
            # a failure is not sent back, nothing was consumed through the queues
            assert conc.stats["sent_back"] == 0 and conc.stats["consumed"] == 1
            assert conc.stats["consumed_directly"] == 3 and orderly.stats["consumed_directly"] == 1

            # the errors: the client must belong to the group; unknown and bad message ids
            with pytest.raises(BrokerError, match="not online"):
                await api.consume_message_directly(cluster.broker_addr, g_ord, conc.client_id,
                                                   sent["a"].offset_msg_id)
            bad_offset = sent["a"].offset_msg_id[:16] + "%016X" % (1 << 40)
            with pytest.raises(BrokerError, match="can not find message"):
                await api.consume_message_directly(cluster.broker_addr, group, conc.client_id, bad_offset)
            with pytest.raises(BrokerError, match="bad message id"):
                await api.consume_message_directly(cluster.broker_addr, group, conc.client_id, "XYZ")
            assert len(seen) == 4

            # mqadmin (a subprocess; the consumers answer on this loop meanwhile)
            out = await mqadmin("queryMsgById", "-n", cluster.namesrv_addr, "-i", sent["a"].offset_msg_id,
                                "-g", group, "-d", conc.client_id)
            assert out.returncode == 0, out.stderr
            assert ("ConsumeMessageDirectlyResult [order=false, autoCommit=true, consumeResult=CR_SUCCESS, "
                    "remark=null, spentTimeMills=") in out.stdout
            out = await mqadmin("queryMsgByUniqueKey", "-n", cluster.namesrv_addr, "-i", sent["b"].msg_id,
                                "-t", other, "-g", group, "-d", conc.client_id)
            assert out.returncode == 0, out.stderr
            assert "consumeResult=CR_LATER" in out.stdout
            assert [m.body for m in seen[-2:]] == [b"a", b"b"]
            out = await mqadmin("queryMsgById", "-n", cluster.namesrv_addr, "-i", sent["a"].offset_msg_id,
                                "-g", group, "-d", "127.0.0.1@gone")
            assert out.returncode == 1 and "not online" in out.stderr, (out.stdout, out.stderr)
        finally:
            await conc.close()
            await orderly.close()
            await producer.close()
        try:
            # closed (every held queue committed), the consumers left offsets on their own topic
            # and none on the other (QUERY_TOPIC_CONSUME_BY_WHO: the groups with an offset there)
            assert {group, g_ord} <= set(await inst.api.query_topic_consume_by_who(cluster.broker_addr, sub_topic))
            assert await inst.api.query_topic_consume_by_who(cluster.broker_addr, other) == []
            # and a client that is gone is named in the error at once
            with pytest.raises(BrokerError, match="not online"):
                await inst.api.consume_message_directly(cluster.broker_addr, group, conc.client_id,
                                                        sent["a"].offset_msg_id)
        finally:
            await inst.close()
