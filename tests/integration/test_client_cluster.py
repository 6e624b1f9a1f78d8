"""The client against real `mqnamesrv` / `mqbroker` processes (tests/support/daemons.py).

Every test is bounded by asyncio timeouts; waits are bounded polling loops.
"""
from __future__ import annotations

import asyncio
import collections
import os
import time

import pytest

from pocketmq.client import CONSUME_SUCCESS, LitePullConsumer, Message, Producer, PushConsumer
from pocketmq.client import errors
from pocketmq.client.api import ResetOffsetRequest
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.bodies import MessageQueue, TopicConfig
from pocketmq.protocol.headers.typed import SendMessageRequestHeader
from pocketmq.protocol.message import decode_offset_msg_id, encode_properties
from tests.support.daemons import Cluster
from tests.support.workloads import produce_around_a_timestamp, run_mqadmin

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("client-it")))
    c.start()
    yield c
    c.stop()


async def wait_for(pred, timeout_s=15.0, what="condition"):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not pred():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def create_topic(cluster, topic: str, queues: int) -> None:
    inst = ClientInstance("127.0.0.1@create-topic", cluster.namesrv_addr)
    try:
        await wait_topic(inst.api, cluster, topic, queues)
    finally:
        await inst.close()


async def wait_topic(api, cluster, topic: str, queues: int) -> None:
    """Create `topic` on the broker, then wait until the nameserver's route shows it (the
    broker re-registers on its own schedule: nothing to await but the route itself)."""
    await api.create_topic(cluster.broker_addr, TopicConfig(topic, queues, queues), "TBW102")
    for _ in range(200):
        route = await api.get_route(topic)
        if route is not None and [q.write_queue_nums for q in route.queue_datas] == [queues]:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"route of {topic} never showed {queues} queues")


def uniq(name: str) -> str:
    return f"{name}{os.getpid()}x{int(time.time() * 1000) % 100000}"


async def drain_lite(addr, group, mqs, n, timeout_s=15):
    c = LitePullConsumer(group, addr, consume_from_where="FIRST_OFFSET", auto_commit=False,
                         max_poll_records=100)
    c.assign(mqs)
    got = []
    async with c:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while len(got) < n and loop.time() < end:
            got.extend(await c.poll(0.5))
        extra = await c.poll(0.3)
    return got + extra


async def test_every_send_mode_round_trips(cluster):
    async with asyncio.timeout(60):
        topic = uniq("SendModes")
        await create_topic(cluster, topic, 4)
        mqs = [MessageQueue(topic, "broker-a", i) for i in range(4)]
        async with Producer("ItProducer", cluster.namesrv_addr, instance_name=uniq("p")) as p:
            sent = {}
            r = await p.send(Message(topic, b"plain", tags="TagA", keys=("k1", "k2"), properties={"u": "1"}))
            assert r.ok and len(r.offset_msg_id) == 32
            sent[r.msg_id] = ("plain", "TagA")
            big = b"z" * 10000
            r = await p.send(Message(topic, big, tags="Big"))
            sent[r.msg_id] = ("big", "Big")
            r = await p.send(Message(topic, b"queued"), queue=mqs[2])
            assert r.queue == mqs[2]
            sent[r.msg_id] = ("queued", None)
            r1 = await p.send(Message(topic, b"sharded-1"), sharding_key="order-7")
            r2 = await p.send(Message(topic, b"sharded-2"), sharding_key="order-7")
            assert r1.queue == r2.queue and r2.queue_offset == r1.queue_offset + 1
            sent[r1.msg_id] = ("sharded-1", None)
            sent[r2.msg_id] = ("sharded-2", None)
            rs = await p.send_batch([Message(topic, f"batch-{i}".encode(), tags="B") for i in range(10)])
            for res in rs:
                for j, mid in enumerate(res.msg_id.split(",")):
                    sent[mid] = (None, "B")
            await p.send_oneway(Message(topic, b"oneway"))
            r = await p.send(Message(topic, b"delayed", delay_level=1))      # 1 s
            sent[r.msg_id] = ("delayed", None)
        got = await drain_lite(cluster.namesrv_addr, uniq("Reader"), mqs, len(sent) + 1)
        by_id = {m.msg_id: m for m in got}
        assert set(sent) <= set(by_id)
        assert any(m.body == b"oneway" for m in got)
        for mid, (body, tags) in sent.items():
            m = by_id[mid]
            if body == "big":
                assert m.body == big
            elif body is not None:
                assert m.body == body.encode()
            assert m.tags == tags
        plain = next(m for m in got if m.body == b"plain")
        assert plain.keys == ("k1", "k2") and plain.user_properties.get("u") == "1"
        assert plain.topic == topic


async def test_concurrent_sends_coalesced_round_trip(cluster):
    """200 concurrent sends: the producer merges them into SEND_BATCH_MESSAGE requests, and
    each SendResult still names the stored message (queue, queue offset, both ids)."""
    async with asyncio.timeout(60):
        topic = uniq("Coalesced")
        await create_topic(cluster, topic, 4)
        mqs = [MessageQueue(topic, "broker-a", i) for i in range(4)]
        groups = []

        class CountingProducer(Producer):
            async def _send_group(self, inst, key, items):
                groups.append(len(items))
                return await super()._send_group(inst, key, items)

        async with CountingProducer("ItCoalesce", cluster.namesrv_addr, instance_name=uniq("pc")) as p:
            msgs = [Message(topic, f"c-{i}".encode(), tags=f"T{i % 2}", keys=(f"k{i}",), properties={"i": str(i)})
                    for i in range(200)]
            results = await asyncio.gather(*(p.send(m) for m in msgs))
        assert max(groups) > 1 and sum(groups) < 200
        got = await drain_lite(cluster.namesrv_addr, uniq("CoalesceReader"), mqs, 200)
        assert len(got) == 200
        at = {(m.queue_id, m.queue_offset): m for m in got}
        for i, r in enumerate(results):
            m = at[(r.queue.queue_id, r.queue_offset)]
            assert m.body == f"c-{i}".encode() and m.msg_id == r.msg_id and m.offset_msg_id == r.offset_msg_id
            assert m.tags == f"T{i % 2}" and m.keys == (f"k{i}",) and m.user_properties == {"i": str(i)}


async def test_three_push_consumers_split_and_rebalance(cluster):
    async with asyncio.timeout(90):
        topic = uniq("Split")
        group = uniq("SplitGroup")
        await create_topic(cluster, topic, 8)
        got = []

        def make(name):
            async def listener(msg):
                got.append((name, msg.body))
                return CONSUME_SUCCESS
            c = PushConsumer(group, cluster.namesrv_addr, listener=listener, instance_name=name,
                             consume_from_where="FIRST_OFFSET", handover_delay_ms=300)
            c.subscribe(topic)
            return c

        cs = [make(f"{group}-c{i}") for i in range(3)]
        for c in cs:
            await c.start()

        def split_ok(n):
            owned = [{mq.queue_id for mq in c.pqs if mq.topic == topic} for c in cs if c.state == "RUNNING"]
            return len(owned) == n and sum(map(len, owned)) == 8 and len(set().union(*owned)) == 8

        await wait_for(lambda: split_ok(3), 20, "a disjoint 3-way split")
        async with Producer("ItProducer", cluster.namesrv_addr, instance_name=uniq("p")) as p:
            for i in range(160):
                await p.send(Message(topic, f"a{i}".encode()))
            await wait_for(lambda: len({b for _, b in got}) == 160, 20, "160 messages")
            assert len({name for name, _ in got}) == 3
            await cs[0].close()                                  # remove one
            await wait_for(lambda: split_ok(2), 20, "a 2-way split")
            for i in range(80):
                await p.send(Message(topic, f"b{i}".encode()))
            cs[0] = make(f"{group}-c3")                          # add one
            await cs[0].start()
            await wait_for(lambda: split_ok(3), 20, "a 3-way split again")
            for i in range(80):
                await p.send(Message(topic, f"c{i}".encode()))
            await wait_for(lambda: len({b for _, b in got}) == 320, 30, "320 messages, none lost")
        for c in cs:
            await c.close()


async def test_closed_and_restarted_consumer_gets_no_duplicates(cluster):
    async with asyncio.timeout(60):
        topic = uniq("Restart")
        group = uniq("RestartGroup")
        await create_topic(cluster, topic, 4)
        seen = collections.Counter()

        async def listener(msg):
            seen[msg.body] += 1
            await asyncio.sleep(0.001)

        async with Producer("ItProducer", cluster.namesrv_addr, instance_name=uniq("p")) as p:
            for i in range(300):
                await p.send(Message(topic, f"m{i}".encode()))
        for round_ in range(3):
            c = PushConsumer(group, cluster.namesrv_addr, listener=listener, instance_name=f"{group}-r",
                             consume_from_where="FIRST_OFFSET", consume_concurrency=4)
            c.subscribe(topic)
            await c.start()
            target = min(300, 100 * (round_ + 1))
            await wait_for(lambda target=target: len(seen) >= target, 20, f"{target} messages")
            assert await c.drain(15)
        assert len(seen) == 300
        assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1][:5]


async def test_lite_pull_seeks_and_resumes_at_committed_offsets(cluster):
    async with asyncio.timeout(60):
        topic = uniq("Lite")
        group = uniq("LiteGroup")
        await create_topic(cluster, topic, 1)
        mq = MessageQueue(topic, "broker-a", 0)
        async with Producer("ItProducer", cluster.namesrv_addr, instance_name=uniq("p")) as p:
            t_mid = None
            for i in range(30):
                if i == 15:     # a timestamp much closer to message 15 than to 14
                    await asyncio.sleep(0.2)
                    t_mid = int(time.time() * 1000)
                    await asyncio.sleep(0.01)
                await p.send(Message(topic, f"m{i}".encode()), queue=mq)
        c = LitePullConsumer(group, cluster.namesrv_addr, consume_from_where="FIRST_OFFSET",
                             auto_commit=False, max_poll_records=10)
        c.assign([mq])
        async with c:
            first = await c.poll(5)
            assert [m.queue_offset for m in first] == list(range(10))
            await c.commit()
            assert await c.committed(mq) == 10
            off = await c.offset_for_timestamp(mq, t_mid)
            assert off == 15
            c.seek(mq, off)
            assert (await c.poll(5))[0].body == b"m15"
            await c.seek_to_begin(mq)
            assert (await c.poll(5))[0].queue_offset == 0
            await c.seek_to_end(mq)
            assert await c.poll(0.3) == []
        c2 = LitePullConsumer(group, cluster.namesrv_addr, consume_from_where="FIRST_OFFSET", max_poll_records=10)
        c2.assign([mq])
        async with c2:
            assert (await c2.poll(5))[0].queue_offset == 10     # resumes at the committed offset


async def test_broker_restart_mid_stream(tmp_path):
    async with asyncio.timeout(120):
        root = str(tmp_path)
        cl = Cluster(root)
        cl.start()
        try:
            topic = "RestartTopic"
            await create_topic(cl, topic, 2)
            got = set()

            async def listener(msg):
                got.add(msg.body)

            c = PushConsumer("RestartGroup", cl.namesrv_addr, listener=listener,
                             consume_from_where="FIRST_OFFSET", pull_error_delay_ms=200)
            c.subscribe(topic)
            async with Producer("RestartProducer", cl.namesrv_addr) as p, c:
                sent = set()
                stop = asyncio.Event()

                async def produce():
                    i = 0
                    while not stop.is_set():
                        body = f"m{i}".encode()
                        try:
                            await p.send(Message(topic, body))
                            sent.add(body)
                            i += 1
                        except Exception:
                            await asyncio.sleep(0.1)
                        await asyncio.sleep(0.005)
                task = asyncio.create_task(produce())
                await wait_for(lambda: len(got) >= 50, 20, "messages before the restart")
                await asyncio.to_thread(cl.restart_broker)
                n = len(sent)
                await wait_for(lambda: len(sent) >= n + 50, 30, "sends after the restart")
                stop.set()
                await task
                await wait_for(lambda: sent <= got, 40, "every sent message consumed")
        finally:
            cl.stop()



async def test_reset_offset_by_time_rewinds_online_and_offline_consumers(cluster):
    """mqadmin resetOffsetByTime -> INVOKE_BROKER_TO_RESET_OFFSET -> the broker commits and
    pushes RESET_CONSUMER_CLIENT_OFFSET: a running push consumer and a running lite pull
    consumer consume again from the timestamp, an offline group starts there."""
    async with asyncio.timeout(90):
        topic = uniq("Reset")
        await create_topic(cluster, topic, 4)
        ns = cluster.namesrv_addr
        t_mid = await produce_around_a_timestamp(ns, topic)
        new = {f"new-{i}".encode() for i in range(10)}
        everything = new | {f"old-{i}".encode() for i in range(10)}

        async def reset(group, *extra, ts=t_mid):
            r = await asyncio.to_thread(run_mqadmin, "resetOffsetByTime", "-n", ns, "-g", group, "-t", topic,
                                        "-s", str(ts), *extra)
            assert r.returncode == 0, r.stderr
            rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("broker-a")]
            return {int(q): int(o) for _, q, o in rows}

        # a push consumer that has consumed everything
        seen = collections.Counter()

        async def listener(msg):
            seen[msg.body] += 1
        push_group = uniq("ResetPush")
        c = PushConsumer(push_group, ns, listener=listener, instance_name=uniq("rp"),
                         consume_from_where="FIRST_OFFSET", persist_interval_s=0.2)
        c.subscribe(topic)
        # a lite pull consumer (subscribe mode) that has polled everything
        lite_group = uniq("ResetLite")
        lite = LitePullConsumer(lite_group, ns, instance_name=uniq("rl"), consume_from_where="FIRST_OFFSET",
                                auto_commit_interval_s=0.2, max_poll_records=100)
        lite.subscribe(topic)
        polled = []
        async with c, lite:
            await wait_for(lambda: set(seen) == everything, 20, "20 messages pushed")
            while len(polled) < 20:
                polled.extend(m.body for m in await lite.poll(1))
            await asyncio.sleep(0.6)        # both have committed the end of every queue
            table = await reset(push_group)
            assert len(table) == 4 and sum(table.values()) == 10   # the 10 old messages stay behind
            await wait_for(lambda: all(seen[b] == 2 for b in new), 20, "the new messages once more")
            await asyncio.sleep(0.3)
            assert all(seen[b] == 1 for b in everything - new), seen
            assert await reset(lite_group) == table
            again = []
            end = asyncio.get_running_loop().time() + 20
            while len(again) < 10 and asyncio.get_running_loop().time() < end:
                again.extend(m.body for m in await lite.poll(1))
            assert sorted(again) == sorted(new)

        # an offline group: committed everything, then left
        off_group = uniq("ResetOffline")
        mqs = [MessageQueue(topic, "broker-a", i) for i in range(4)]
        got = await drain_lite(ns, off_group, mqs, 20)
        done = LitePullConsumer(off_group, ns, auto_commit=False)
        done.assign(mqs)
        async with done:
            await done.commit({m.queue: m.queue_offset + 1 for m in got})
        # without force a reset only moves offsets back: to t_mid, then not forward to the end
        assert await reset(off_group, "-f", "false") == table
        assert await reset(off_group, "-f", "false", ts=-1) == table
        later = []

        async def listener2(msg):
            later.append(msg.body)
        c2 = PushConsumer(off_group, ns, listener=listener2, instance_name=uniq("ro"),
                          consume_from_where="FIRST_OFFSET")
        c2.subscribe(topic)
        async with c2:
            await wait_for(lambda: len(later) >= 10, 20, "the offline group's new messages")
            await asyncio.sleep(0.3)
        assert sorted(later) == sorted(new)

        r = await asyncio.to_thread(run_mqadmin, "resetOffsetByTime", "-n", ns, "-g", uniq("NoSuchGroup"), "-t", topic,
                                    "-s", "now")
        assert r.returncode == 1 and "not exist" in r.stderr and "Traceback" not in r.stderr, r.stderr


async def test_client_api_serves_an_admin_without_producers_or_consumers(cluster):
    """What mqadmin needs, through ClientInstance(...).api alone (never started: no timers,
    no heartbeats): cluster info, topic create/list/route/stats/delete, send, view by id,
    offsets, consume stats, connections, runtime info, offset reset."""
    topic, group = uniq("ApiTopic"), uniq("api_group")
    inst = ClientInstance("127.0.0.1@api-admin", cluster.namesrv_addr)
    api = inst.api
    try:
        async with asyncio.timeout(60):
            brokers, clusters = await api.cluster_info()
            [(name, bd)] = brokers.items()
            assert bd.master_addr() == cluster.broker_addr and name in clusters["DefaultCluster"]
            assert "brokerVersionDesc" in (await api.broker_runtime_info(cluster.broker_addr))["table"]
            await wait_topic(api, cluster, topic, 2)
            assert topic in await api.topic_list(cluster.namesrv_addr)
            assert (await api.get_route_json(topic))["brokerDatas"][0]["brokerName"] == name
            h = SendMessageRequestHeader("api_producer", topic, "TBW102", 4, 1, 0, 1_700_000_000_000, 0,
                                         encode_properties({"TAGS": "A", "UNIQ_KEY": "U1"}), 0, False, False, None)
            resp = await api.send_message(cluster.broker_addr, h, b"hello api")
            assert resp.ext_fields["queueId"] == "1"
            ip, port, commit_log_offset = decode_offset_msg_id(resp.ext_fields["msgId"])
            msg = await api.view_message(f"{ip}:{port}", commit_log_offset)
            assert (msg.body, msg.topic, msg.properties["TAGS"]) == (b"hello api", topic, "A")
            mq = MessageQueue(topic, name, 1)
            assert await api.max_offset(cluster.broker_addr, mq) == 1
            # no stored offset: -1 (QUERY_NOT_FOUND), or 0 when the queue still starts at 0 (Java's rule)
            assert await api.query_consumer_offset(cluster.broker_addr, group, mq) in (-1, 0)
            await api.update_consumer_offset(cluster.broker_addr, group, mq, 1)
            assert await api.query_consumer_offset(cluster.broker_addr, group, mq) == 1
            stats = await api.topic_stats(cluster.broker_addr, topic)
            assert stats["offsetTable"]
            consume = await api.consume_stats(cluster.broker_addr, group, topic)
            assert "offsetTable" in consume
            with pytest.raises(errors.BrokerError):
                await api.consumer_connection_list(cluster.broker_addr, group)   # nobody online
            table = await api.reset_offset(cluster.broker_addr, ResetOffsetRequest(topic, group, 0))
            assert table.get(mq) == 0
            assert await api.query_consumer_offset(cluster.broker_addr, group, mq) == 0
            await api.delete_topic_in_broker(cluster.broker_addr, topic)
            await api.delete_topic_in_namesrv(topic)
            assert await api.get_route(topic) is None
            assert not inst.started and not inst._tasks
    finally:
        await inst.close()
