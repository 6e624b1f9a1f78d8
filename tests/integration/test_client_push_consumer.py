"""PushConsumer against the in-process fake cluster (bounded by timeouts; waits await the
listeners' sinks or the fake broker's state, tests/support/events.py)."""
import asyncio
import collections
import time

import pytest

from pocketmq.client.message import Message
from pocketmq.client.process_queue import FlowLimits
from pocketmq.client.producer import Producer
from pocketmq.client.push_consumer import CONSUME_SUCCESS, RECONSUME_LATER, PushConsumer
from tests.support.events import Sink
from tests.support.fake_broker import FakeCluster


async def wait_for(pred, timeout_s=10.0, what="condition"):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not pred():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def produce(addr, topic, n, tags=None, start=0):
    async with Producer("PG", addr, instance_name="prod") as p:
        for i in range(start, start + n):
            await p.send(Message(topic, f"m{i}".encode(), tags=tags(i) if tags else None))


def consumer(cluster, group, sink, name, **kw):
    async def listener(msg):
        sink.append((name, msg.body.decode(), msg.queue.queue_id))
        return CONSUME_SUCCESS
    kw.setdefault("handover_delay_ms", 100)
    c = PushConsumer(group, cluster.namesrv_addr, listener=listener, instance_name=name, **kw)
    return c


async def test_consumes_everything_and_commits_on_close():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 4)
            await produce(cluster.namesrv_addr, "T", 40)
            got = Sink()
            c = consumer(cluster, "CG", got, "c1", consume_from_where="FIRST_OFFSET")
            c.subscribe("T")
            async with c:
                await got.until(lambda s: len(s) == 40)
                await produce(cluster.namesrv_addr, "T", 10, start=40)   # woken long polls
                await got.until(lambda s: len(s) == 50)
            assert sorted(int(b[1:]) for _, b, _ in got) == list(range(50))
            assert sum(cluster.brokers[0].committed("CG", "T").values()) == 50
            assert c.state == "CLOSED"


async def test_tag_filter_and_sync_listener():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 2)
            await produce(cluster.namesrv_addr, "T", 30, tags=lambda i: "TagA" if i % 3 == 0 else "TagB")
            seen = Sink()

            def listener(msg):          # a plain function runs in the worker thread pool
                seen.append(msg.tags)

            c = PushConsumer("CG2", cluster.namesrv_addr, listener=listener, instance_name="c2",
                             consume_from_where="FIRST_OFFSET")
            c.subscribe("T", "TagA || TagC")
            broker = cluster.brokers[0]
            async with c:
                await seen.until(lambda s: len(s) == 10)
                # everything was pulled; close() consumes what is cached before the check below
                await broker.until(lambda: broker.caught_up("CG2", "T"))
            assert seen == ["TagA"] * 10
            # filtered-out messages still advance the committed offset
            assert sum(cluster.brokers[0].committed("CG2", "T").values()) == 30


async def test_failed_messages_are_sent_back_and_redelivered():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            await produce(cluster.namesrv_addr, "T", 3)
            attempts = collections.Counter()

            async def listener(msg):
                attempts[msg.body] += 1
                if msg.body == b"m1" and msg.reconsume_times == 0:
                    raise RuntimeError("boom")
                if msg.body == b"m2" and msg.reconsume_times == 0:
                    return RECONSUME_LATER
                assert msg.topic == "T"     # retry deliveries show the original topic

            c = PushConsumer("CG3", cluster.namesrv_addr, listener=listener, instance_name="c3",
                             consume_from_where="FIRST_OFFSET")
            c.subscribe("T")
            async with c:
                await wait_for(lambda: c.stats["sent_back"] == 2, what="send back")
                # the retry topic is picked up by the next rebalance
                c.instance.rebalance_now()
                await wait_for(lambda: attempts[b"m1"] == 2 and attempts[b"m2"] == 2, what="redelivery")
            assert attempts[b"m0"] == 1


async def test_three_consumers_split_disjointly_and_rebalance():
    async with asyncio.timeout(60):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 8)
            got = Sink()
            cs = [consumer(cluster, "G", got, f"c{i}", consume_from_where="FIRST_OFFSET") for i in range(3)]
            for c in cs:
                c.subscribe("T")
                await c.start()

            def owned():
                return [{mq.queue_id for mq in c.pqs if mq.topic == "T"} for c in cs if c.state == "RUNNING"]

            def split_ok(n):
                o = owned()
                return len(o) == n and sum(len(x) for x in o) == 8 and len(set().union(*o)) == 8

            await wait_for(lambda: split_ok(3), what="3-way split")
            assert sorted(len(x) for x in owned()) == [2, 3, 3]
            await produce(cluster.namesrv_addr, "T", 80)
            await got.until(lambda s: len(s) == 80)
            assert len({name for name, _, _ in got}) == 3
            # remove one consumer: the other two take over its queues
            await cs[0].close()
            await wait_for(lambda: split_ok(2), what="2-way split")
            await produce(cluster.namesrv_addr, "T", 40, start=80)
            await got.until(lambda s: len(s) == 120)
            # add one back
            cs[0] = consumer(cluster, "G", got, "c0b", consume_from_where="FIRST_OFFSET")
            cs[0].subscribe("T")
            await cs[0].start()
            await wait_for(lambda: split_ok(3), what="3-way split again")
            await produce(cluster.namesrv_addr, "T", 40, start=120)
            await got.until(lambda s: len({b for _, b, _ in s}) == 160)
            for c in cs:
                await c.close()
            bodies = [b for _, b, _ in got]
            assert len(set(bodies)) == 160


async def test_close_and_restart_gets_no_duplicates():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 4)
            got = []
            release = asyncio.Event()

            async def slow(msg):
                got.append(msg.body)
                if len(got) > 5:
                    await asyncio.sleep(0.01)

            c = PushConsumer("CG5", cluster.namesrv_addr, listener=slow, instance_name="c5",
                             consume_from_where="FIRST_OFFSET", consume_concurrency=4)
            c.subscribe("T")
            await c.start()
            await produce(cluster.namesrv_addr, "T", 200)
            await wait_for(lambda: len(got) >= 20, what="some messages")
            assert await c.drain(10)       # consumes what was cached, commits, unregisters
            first = list(got)
            got.clear()
            c2 = PushConsumer("CG5", cluster.namesrv_addr, listener=slow, instance_name="c5",
                              consume_from_where="FIRST_OFFSET")
            c2.subscribe("T")
            async with c2:
                await wait_for(lambda: len(first) + len(got) == 200, what="the rest")
            assert not set(first) & set(got)
            assert len(set(first) | set(got)) == 200
            release.set()


async def test_flow_control_bounds_the_process_queue():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            await produce(cluster.namesrv_addr, "T", 300)
            gate = asyncio.Event()
            got = []

            async def blocked(msg):
                await gate.wait()
                got.append(msg)

            c = PushConsumer("CG6", cluster.namesrv_addr, listener=blocked, instance_name="c6",
                             consume_from_where="FIRST_OFFSET", pull_batch_size=10,
                             flow_limits=FlowLimits(pull_threshold_for_queue=50))
            c.subscribe("T")
            async with c:
                await wait_for(lambda: sum(pq.msg_count for pq in c.pqs.values()) > 50, what="cache fill")
                await asyncio.sleep(0.3)
                cached = sum(pq.msg_count for pq in c.pqs.values())
                assert 50 < cached <= 60        # stops pulling once above the threshold
                gate.set()
                await wait_for(lambda: len(got) == 300, what="all after release")


async def test_a_full_process_queue_resumes_pulling_when_listeners_make_room(monkeypatch):
    """Flow control waits for room, not a fixed delay: with the delay made 60 s and a
    threshold of 10 messages (pulls of 16 fill it every time), 200 messages are still
    consumed in seconds, because each finished listener call wakes the queue's pull once
    the process queue is under its limits again. (Orderly: test_client_orderly.py, the
    fake cluster has no queue locks.)"""
    import pocketmq.client.fetcher as fetcher
    monkeypatch.setattr(fetcher, "FLOW_CONTROL_DELAY_MS", 60_000)
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            await produce(cluster.namesrv_addr, "T", 200)
            got = []

            async def listener(msg):
                await asyncio.sleep(0)
                got.append(msg.queue_offset)

            c = PushConsumer("CG7", cluster.namesrv_addr, listener=listener, instance_name="c7",
                             consume_from_where="FIRST_OFFSET", pull_batch_size=16,
                             flow_limits=FlowLimits(pull_threshold_for_queue=10))
            c.subscribe("T")
            async with c:
                await wait_for(lambda: len(got) == 200, timeout_s=20, what="all 200 consumed")
                st = c.fetcher.stats
                assert st["flow_control_waits"] > 0 and st["flow_control_timeouts"] == 0
            assert sorted(got) == list(range(200))


async def test_survives_broker_restart():
    async with asyncio.timeout(40):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 2)
            got = []
            c = consumer(cluster, "CG7", got, "c7", consume_from_where="FIRST_OFFSET",
                         pull_error_delay_ms=100)
            c.subscribe("T")
            async with Producer("PG", cluster.namesrv_addr, instance_name="prod7") as p:
                async with c:
                    for i in range(10):
                        await p.send(Message("T", f"a{i}".encode()))
                    await wait_for(lambda: len(got) == 10, what="before restart")
                    broker = cluster.brokers[0]
                    await broker.stop()
                    await asyncio.sleep(0.2)
                    await broker.start()          # same port, registrations lost
                    for i in range(10):
                        for _ in range(50):
                            try:
                                await p.send(Message("T", f"b{i}".encode()))
                                break
                            except Exception:
                                await asyncio.sleep(0.1)
                    await wait_for(lambda: len({b for _, b, _ in got}) == 20, timeout_s=20,
                                   what="after restart")


async def test_broadcasting_every_member_gets_everything_and_resumes_from_local_offsets(tmp_path):
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 2)
            await produce(cluster.namesrv_addr, "T", 20)
            a, b = Sink(), Sink()
            ca = consumer(cluster, "BG", a, "ba", message_model="BROADCASTING", consume_from_where="FIRST_OFFSET",
                          broadcast_offset_dir=str(tmp_path))
            cb = consumer(cluster, "BG", b, "bb", message_model="BROADCASTING", consume_from_where="FIRST_OFFSET",
                          broadcast_offset_dir=str(tmp_path))
            for c in (ca, cb):
                c.subscribe("T")
                await c.start()
            await a.until(lambda s: len(s) == 20)
            await b.until(lambda s: len(s) == 20)
            for c in (ca, cb):
                await c.close()
            assert not any(k[1] == "T" for k in cluster.brokers[0].offsets)   # nothing stored at the broker
            await produce(cluster.namesrv_addr, "T", 5, start=20)
            a.clear()
            ca2 = consumer(cluster, "BG", a, "ba", message_model="BROADCASTING", consume_from_where="FIRST_OFFSET",
                           broadcast_offset_dir=str(tmp_path))
            ca2.subscribe("T")
            async with ca2:
                await a.until(lambda s: len(s) == 5)
                broker = cluster.brokers[0]
                await broker.until(lambda: broker.caught_up("BG", "T"))   # nothing more to come
            assert sorted(int(x[1][1:]) for x in a) == list(range(20, 25))


async def test_client_instance_is_shared_per_client_id():
    async with asyncio.timeout(20):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 2)
            got = []
            async with Producer("PG", cluster.namesrv_addr, instance_name="shared") as p:
                c1 = consumer(cluster, "SG", got, "shared")
                c1.subscribe("T")
                async with c1:
                    assert c1.instance is p.instance
                    assert c1.client_id.endswith("@shared")
                    # a second member of the same group in this process gets its own clientId
                    c2 = PushConsumer("SG", cluster.namesrv_addr, listener=lambda m: None)
                    c2.subscribe("T")
                    c3 = PushConsumer("SG", cluster.namesrv_addr, listener=lambda m: None)
                    c3.subscribe("T")
                    async with c2, c3:
                        assert c2.instance is not c3.instance
                        assert c2.client_id != c3.client_id


@pytest.mark.parametrize("where", ["LAST_OFFSET", "FIRST_OFFSET", "TIMESTAMP"])
async def test_consume_from_where_for_a_new_group(where):
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            await produce(cluster.namesrv_addr, "T", 10)
            await asyncio.sleep(0.05)
            ts = time.time_ns() // 1_000_000
            await asyncio.sleep(0.05)
            await produce(cluster.namesrv_addr, "T", 5, start=10)
            got = []
            c = consumer(cluster, f"W{where}", got, f"w{where}", consume_from_where=where,
                         consume_timestamp_ms=ts)
            c.subscribe("T")
            async with c:
                await wait_for(lambda: len(c.pqs) >= 1, what="queue assigned")
                await produce(cluster.namesrv_addr, "T", 1, start=15)
                await wait_for(lambda: any(b == "m15" for _, b, _ in got), what="the new message")
                await asyncio.sleep(0.1)
            first = sorted(int(b[1:]) for _, b, _ in got)[0]
            assert first == {"LAST_OFFSET": 15, "FIRST_OFFSET": 0, "TIMESTAMP": 10}[where]


async def test_broadcast_offsets_survive_a_restart_without_instance_name(tmp_path):
    """The local offsets file must not depend on the process id (the default instance name)."""
    from pocketmq.client.offset_store import LocalOffsetStore

    class Inst:
        def __init__(self, cid):
            self.client_id = cid
    one = LocalOffsetStore(Inst("10.0.0.1@4242"), "BG", str(tmp_path))
    two = LocalOffsetStore(Inst("10.0.0.1@5353"), "BG", str(tmp_path))
    assert one.path == two.path and "10.0.0.1@DEFAULT" in one.path
    named = LocalOffsetStore(Inst("10.0.0.1@x"), "BG", str(tmp_path), "x")
    assert "10.0.0.1@x" in named.path


async def test_close_from_inside_a_listener_shuts_down_cleanly():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 2)
            await produce(cluster.namesrv_addr, "T", 10)
            seen = Sink()
            holder = {}

            async def listener(msg):
                seen.append(msg.queue_offset)
                if len(seen) == 3:
                    await holder["c"].close()   # must return at once (it cannot wait for itself)
                return CONSUME_SUCCESS
            c = PushConsumer("CG", cluster.namesrv_addr, listener=listener, instance_name="closer",
                             consume_from_where="FIRST_OFFSET", close_timeout_s=5)
            holder["c"] = c
            c.subscribe("T")
            await c.start()
            await seen.until(lambda s: len(s) >= 3)
            await c.drain()        # waits for the drain the listener started
            assert c.state == "CLOSED"
            # What was consumed is committed: a new member does not get those messages again.
            again = Sink()
            c2 = consumer(cluster, "CG", again, "after", consume_from_where="FIRST_OFFSET")
            c2.subscribe("T")
            broker = cluster.brokers[0]
            async with c2:
                await again.until(lambda s: len(seen) + len(s) >= 10)
                await broker.until(lambda: broker.caught_up("CG", "T"))   # nothing more to come
            assert len(seen) + len(again) == 10


async def test_plain_callable_returning_a_coroutine_is_awaited():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            await produce(cluster.namesrv_addr, "T", 3)
            got = Sink()

            async def handle(msg, sink):
                sink.append(msg.body)
                return CONSUME_SUCCESS
            c = PushConsumer("LG", cluster.namesrv_addr, listener=lambda m: handle(m, got),
                             instance_name="wrap", consume_from_where="FIRST_OFFSET")
            c.subscribe("T")
            async with c:
                await got.until(lambda s: len(s) == 3)
                broker = cluster.brokers[0]
                await broker.until(lambda: broker.caught_up("LG", "T"))
            assert len(got) == 3 and c.stats["failed"] == 0   # none failed (to come back later)


@pytest.mark.parametrize("where", ["pull", "decode"])
async def test_pulling_survives_an_unexpected_exception(monkeypatch, where):
    """A bug raising in the pull loop (in the pull itself, or while handling what came back)
    is logged and retried: the queue keeps being consumed."""
    from tests.integration.test_client_lite_pull import _fail_once
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            await produce(cluster.namesrv_addr, "T", 5)
            failed = _fail_once(monkeypatch, where)
            got = []
            all_in = asyncio.Event()

            async def listener(msg):
                got.append(msg.queue_offset)
                if len(got) >= 5:
                    all_in.set()
            c = PushConsumer("CGX", cluster.namesrv_addr, listener=listener, instance_name="cx",
                             consume_from_where="FIRST_OFFSET", pull_error_delay_ms=20)
            c.subscribe("T")
            async with c:
                await all_in.wait()
                assert failed.is_set()
                assert sorted(got) == list(range(5))
