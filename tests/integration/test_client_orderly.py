"""Orderly consumption (PushConsumer(orderly=True)) and the broker's queue locks, over TCP.

The lock table is checked on an in-process broker with a fake clock (expiry without
waiting 60 s); the consumers run against real `mqnamesrv` / `mqbroker` processes.
Waits for what listeners received await their sinks; what only the broker knows is
polled within a bound.
"""
from __future__ import annotations

import asyncio
import collections

import pytest

from pocketmq.broker.app import Broker
from pocketmq.broker.config import parse_args as broker_args
from pocketmq.nameserver.app import NameServer
from pocketmq.nameserver.config import parse_args as ns_args
from pocketmq.client import (
    CONSUME_SUCCESS,
    RECONSUME_LATER,
    SUSPEND_CURRENT_QUEUE_A_MOMENT,
    Message,
    Producer,
    PushConsumer,
)
from pocketmq.client.api import PullRequest, PullResult, pull_sys_flag
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.bodies import MessageQueue, TopicConfig
from tests.integration.test_client_cluster import create_topic, uniq, wait_for
from tests.support.daemons import Cluster
from tests.support.events import Sink

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("orderly"))).start()
    yield c
    c.stop()


# -- the broker's lock table over TCP ---------------------------------------------------------

async def test_lock_refused_to_others_until_released_expired_or_the_owner_disconnects(tmp_path):
    now = [1_000_000.0]
    cfg, _ = broker_args(["--listenPort=0", "--brokerIP1=127.0.0.1", f"--storePathRootDir={tmp_path}/store",
                          "--mappedFileSizeCommitLog=1048576", "--mappedFileSizeConsumeQueue=2000"])
    broker = Broker(cfg, clock=lambda: now[0])
    await broker.start()
    clients = {cid: ClientInstance(cid, "127.0.0.1:1") for cid in ("127.0.0.1@A", "127.0.0.1@B", "127.0.0.1@C")}
    a, b, c = clients.values()
    addr = broker.addr
    q0, q1 = MessageQueue("LockT", broker.config.brokerName, 0), MessageQueue("LockT", broker.config.brokerName, 1)
    try:
        async with asyncio.timeout(30):
            assert set(await a.api.lock_batch(addr, "LG", a.client_id, [q0, q1])) == {q0, q1}
            assert await b.api.lock_batch(addr, "LG", b.client_id, [q0, q1]) == []
            assert set(await a.api.lock_batch(addr, "LG", a.client_id, [q0])) == {q0}     # renewal
            # released by its owner only
            await b.api.unlock_batch(addr, "LG", b.client_id, [q0])
            assert await b.api.lock_batch(addr, "LG", b.client_id, [q0]) == []
            await a.api.unlock_batch(addr, "LG", a.client_id, [q0])
            assert await b.api.lock_batch(addr, "LG", b.client_id, [q0, q1]) == [q0]
            # expired 60 s after its last renewal
            now[0] += 60.0
            assert await c.api.lock_batch(addr, "LG", c.client_id, [q1]) == []
            now[0] += 0.002
            assert await c.api.lock_batch(addr, "LG", c.client_id, [q1]) == [q1]
            # the owner's connection closes: its locks go at once
            assert await b.api.lock_batch(addr, "LG", b.client_id, [q0]) == [q0]
            assert await c.api.lock_batch(addr, "LG", c.client_id, [q0]) == []
            await b.close()
            await wait_for(lambda: all(e[0] != b.client_id for e in broker.locks.table.get("LG", {}).values()),
                           what="B's locks released")
            assert await c.api.lock_batch(addr, "LG", c.client_id, [q0]) == [q0]
            # one client id over two connections (a reconnect whose old socket closes late):
            # the old connection's close leaves what was renewed over the new one
            a2 = clients["127.0.0.1@A2"] = ClientInstance(a.client_id, "127.0.0.1:1")
            assert set(await a.api.lock_batch(addr, "LG2", a.client_id, [q0, q1])) == {q0, q1}
            assert await a2.api.lock_batch(addr, "LG2", a.client_id, [q0]) == [q0]
            await a.close()
            await wait_for(lambda: q1 not in broker.locks.table.get("LG2", {}), what="the old connection's q1")
            assert await c.api.lock_batch(addr, "LG2", c.client_id, [q0, q1]) == [q1]
            assert broker.locks.table["LG2"][q0][0] == a.client_id
    finally:
        for inst in clients.values():
            await inst.close()
        await broker.close()


async def test_a_queue_whose_lock_another_client_took_is_given_up_at_renewal(tmp_path):
    """The broker's lock of our consumer expires (its clock jumps 61 s) and another client
    takes the queue: the next renewal gives the queue up (no commit, no unlock); once the
    other client releases it, a rebalance takes it back."""
    now = [1_000_000.0]
    ns_cfg, _ = ns_args(["--listenPort=0", f"--kvConfigPath={tmp_path}/kv.json"])
    ns = NameServer(ns_cfg)
    await ns.start()
    ns_addr = f"127.0.0.1:{ns.port}"
    cfg, _ = broker_args(["--listenPort=0", "--brokerIP1=127.0.0.1", f"--storePathRootDir={tmp_path}/store",
                          "--mappedFileSizeCommitLog=1048576", "--mappedFileSizeConsumeQueue=2000", "-n", ns_addr])
    broker = Broker(cfg, clock=lambda: now[0])
    await broker.start()
    thief = ClientInstance("127.0.0.1@thief", ns_addr)
    got = Sink()

    async def listener(msg):
        got.append(msg.body)

    c = PushConsumer("StealG", ns_addr, listener=listener, orderly=True, instance_name="owner",
                     consume_from_where="FIRST_OFFSET")
    c.subscribe("StealT")
    mq = MessageQueue("StealT", broker.config.brokerName, 0)
    try:
        async with asyncio.timeout(60):
            await thief.api.create_topic(broker.addr, TopicConfig("StealT", 1, 1), "TBW102")
            await wait_for(lambda: broker.topics.get("StealT") is not None, what="topic created")
            async with Producer("StealPG", ns_addr, instance_name="stealp") as p:
                await p.send(Message("StealT", b"one"))
            await c.start()
            await got.until(lambda s: s == [b"one"])
            assert mq in c.pqs and c.pqs[mq].holds_lock(c.orderly_service.now_ms())
            assert await thief.api.lock_batch(broker.addr, "StealG", thief.client_id, [mq]) == []
            now[0] += 61
            assert await thief.api.lock_batch(broker.addr, "StealG", thief.client_id, [mq]) == [mq]
            await c.orderly_service.renew()
            assert mq not in c.pqs
            await c.rebalance()                        # still the thief's: not taken
            assert mq not in c.pqs
            await thief.api.unlock_batch(broker.addr, "StealG", thief.client_id, [mq])
            await c.rebalance()
            assert mq in c.pqs
            async with Producer("StealPG", ns_addr, instance_name="stealp") as p:
                await p.send(Message("StealT", b"two"))
            await got.until(lambda s: b"two" in s)
            # "one" again unless its offset was committed before the give-up (at least once)
            assert got[-1] == b"two" and set(got[:-1]) == {b"one"}
    finally:
        await c.close()
        await thief.close()
        await broker.close()
        await ns.close()


# -- consumers ----------------------------------------------------------------------------------

KEYS = [f"k{i}" for i in range(8)]


async def produce_keyed(cluster, topic: str, start: int, n: int) -> None:
    """n messages per key (seq start..start+n-1), each key's sent in order to its hash queue."""
    async with Producer("OrderlyPG", cluster.namesrv_addr, instance_name=f"op{start}") as p:
        for i in range(start, start + n):
            for k in KEYS:
                await p.send(Message(topic, f"{k}:{i}".encode(), keys=k), sharding_key=k)


def orderly_consumer(cluster, group, name, sink, **kw):
    async def listener(msg):
        k, i = msg.body.decode().split(":")
        sink.append((name, k, int(i), msg.queue_id, msg.reconsume_times))
        await asyncio.sleep(0.001)       # a listener that takes a moment: rebalances land mid-message
        return CONSUME_SUCCESS
    kw.setdefault("handover_delay_ms", 100)
    kw.setdefault("consume_from_where", "FIRST_OFFSET")
    c = PushConsumer(group, cluster.namesrv_addr, listener=listener, instance_name=name, orderly=True, **kw)
    return c


def per_key(sink):
    out = collections.defaultdict(list)
    for _, k, i, _, _ in sink:
        out[k].append(i)
    return out


def held(consumer, topic):
    return sorted(mq.queue_id for mq in consumer.pqs if mq.topic == topic)


async def test_every_key_in_send_order_across_a_join_and_a_leave(cluster):
    topic, group = uniq("OrdT"), uniq("OrdG")
    await create_topic(cluster, topic, 4)
    got = Sink()
    n1, n2, n3 = 30, 30, 30
    async with asyncio.timeout(120):
        c1 = orderly_consumer(cluster, group, "c1", got)
        c1.subscribe(topic)
        await c1.start()
        c2 = None
        try:
            await wait_for(lambda: held(c1, topic) == [0, 1, 2, 3], what="c1 holding all queues")
            await produce_keyed(cluster, topic, 0, n1)
            await got.until(lambda s: len(s) >= len(KEYS) * 10)
            # a second member joins while messages are consumed and sent
            c2 = orderly_consumer(cluster, group, "c2", got)
            c2.subscribe(topic)
            await c2.start()
            await produce_keyed(cluster, topic, n1, n2)
            await wait_for(lambda: len(held(c1, topic)) == 2 and len(held(c2, topic)) == 2, 30,
                           "the queues split 2 + 2")
            assert set(held(c1, topic)).isdisjoint(held(c2, topic))
            await got.until(lambda s: len(s) >= len(KEYS) * (n1 + 10))
            # the first member leaves mid-stream
            sender = asyncio.create_task(produce_keyed(cluster, topic, n1 + n2, n3))
            await c1.close()
            await sender
            await wait_for(lambda: held(c2, topic) == [0, 1, 2, 3], 40, "c2 holding all queues")
            await got.until(lambda s: len(s) >= len(KEYS) * (n1 + n2 + n3))
        finally:
            await c1.close()
            if c2 is not None:
                await c2.close()
    seqs = per_key(got)
    for k in KEYS:
        assert seqs[k] == list(range(n1 + n2 + n3)), k
    assert {name for name, *_ in got} == {"c1", "c2"}
    # one queue per key
    assert all(len({q for _, kk, _, q, _ in got if kk == k}) == 1 for k in KEYS)


async def dead_letters(cluster, group: str) -> list:
    """The records of %DLQ%<group> queue 0 (read through ClientAPI.pull_message)."""
    inst = ClientInstance("127.0.0.1@orderly-dlq", cluster.namesrv_addr)
    try:
        mq = MessageQueue(f"%DLQ%{group}", "broker-a", 0)
        res = await inst.api.pull_message(PullRequest(cluster.broker_addr, "inspector", mq, 0, 32,
                                                      pull_sys_flag(False, False, True), 0, 0, "*", 0, 5.0))
        return list(res.records) if res.status == PullResult.FOUND else []
    finally:
        await inst.close()


async def test_a_poison_message_goes_to_the_dlq_after_max_reconsume_times_and_its_queue_moves_on(cluster):
    topic, group = uniq("OrdPoisonT"), uniq("OrdPoisonG")
    await create_topic(cluster, topic, 2)
    async with Producer("OrderlyPG", cluster.namesrv_addr, instance_name="poison") as p:
        for b in ("a", "poison", "b", "c"):
            await p.send(Message(topic, b.encode()), sharding_key="one-key")
    seen = Sink()

    async def listener(msg):
        seen.append((msg.body.decode(), msg.reconsume_times))
        if msg.body == b"poison":
            raise RuntimeError("cannot handle this one")
        return CONSUME_SUCCESS

    c = PushConsumer(group, cluster.namesrv_addr, listener=listener, orderly=True, max_reconsume_times=3,
                     suspend_current_queue_time_ms=50, consume_from_where="FIRST_OFFSET", instance_name="p1")
    c.subscribe(topic)
    async with asyncio.timeout(60):
        async with c:
            await seen.until(lambda s: ("c", 0) in s)
            assert c.stats["sent_back"] == 1
        dlq = await dead_letters(cluster, group)
    assert seen == [("a", 0), ("poison", 0), ("poison", 1), ("poison", 2), ("poison", 3), ("b", 0), ("c", 0)]
    assert [m.body for m in dlq] == [b"poison"]
    assert dlq[0].topic == f"%DLQ%{group}" and dlq[0].properties["RETRY_TOPIC"] == topic
    poison_id = dlq[0].properties["ORIGIN_MESSAGE_ID"]
    assert poison_id and poison_id == dlq[0].msg_id     # the producer's id, kept
    # the queue moved past it: everything is committed
    assert sum(await committed_offsets(cluster, group, topic, 2)) == 4


async def test_suspend_current_queue_a_moment_redelivers_the_same_messages_in_order(cluster):
    topic, group = uniq("OrdSuspT"), uniq("OrdSuspG")
    await create_topic(cluster, topic, 1)
    async with Producer("OrderlyPG", cluster.namesrv_addr, instance_name="susp") as p:
        for i in range(9):
            await p.send(Message(topic, str(i).encode()))
    calls = Sink()
    answers = collections.deque([SUSPEND_CURRENT_QUEUE_A_MOMENT, RECONSUME_LATER])

    async def batch_listener(msgs):
        calls.append([(int(m.body), m.reconsume_times) for m in msgs])
        return answers.popleft() if answers else CONSUME_SUCCESS

    c = PushConsumer(group, cluster.namesrv_addr, batch_listener=batch_listener, orderly=True,
                     consume_batch_size=3, suspend_current_queue_time_ms=100,
                     consume_from_where="FIRST_OFFSET", instance_name="s1")
    c.subscribe(topic)
    async with asyncio.timeout(60):
        async with c:
            await calls.until(lambda s: any(b and b[-1][0] == 8 for b in s))
        committed = await committed_offsets(cluster, group, topic, 1)
    flat = [i for batch in calls for i, _ in batch]
    first = calls[0]
    # the first batch twice more, with the local retry count, before anything after it
    assert calls[1] == [(i, 1) for i, _ in first] and calls[2] == [(i, 2) for i, _ in first]
    assert [i for batch in calls[2:] for i, _ in batch] == list(range(9))
    assert flat[:3 * len(first)] == [i for i, _ in first] * 3
    assert committed == [9]


async def test_a_full_orderly_queue_resumes_pulling_when_its_listener_makes_room(cluster, monkeypatch):
    """Flow control waits for room (client.fetcher), in orderly mode too: with the delay
    made 60 s and a threshold of 10 (pulls of 16 fill it every time), 200 messages are
    consumed in order in seconds, each finished batch waking the queue's pull."""
    import pocketmq.client.fetcher as fetcher
    from pocketmq.client.process_queue import FlowLimits
    monkeypatch.setattr(fetcher, "FLOW_CONTROL_DELAY_MS", 60_000)
    topic, group = uniq("OrdRoomT"), uniq("OrdRoomG")
    await create_topic(cluster, topic, 1)
    async with Producer("OrderlyPG", cluster.namesrv_addr, instance_name="room") as p:
        await p.send_batch([str(i).encode() for i in range(200)], topic=topic)
    got = Sink()

    async def listener(msg):
        got.append(int(msg.body))
        return CONSUME_SUCCESS

    c = PushConsumer(group, cluster.namesrv_addr, listener=listener, orderly=True, pull_batch_size=16,
                     flow_limits=FlowLimits(pull_threshold_for_queue=10), consume_from_where="FIRST_OFFSET",
                     instance_name="room1")
    c.subscribe(topic)
    async with asyncio.timeout(30):
        async with c:
            await got.until(lambda s: len(s) == 200)
            st = c.fetcher.stats
            assert st["flow_control_waits"] > 0 and st["flow_control_timeouts"] == 0
    assert list(got) == list(range(200))


async def committed_offsets(cluster, group, topic, queues):
    inst = ClientInstance("127.0.0.1@orderly-check", cluster.namesrv_addr)
    try:
        return [await inst.api.query_consumer_offset(cluster.broker_addr, group, MessageQueue(topic, "broker-a", q))
                for q in range(queues)]
    finally:
        await inst.close()


async def test_broadcasting_orderly_consumes_in_order_without_locks(cluster, tmp_path):
    topic, group = uniq("OrdBcT"), uniq("OrdBcG")
    await create_topic(cluster, topic, 2)
    sinks = [Sink(), Sink()]
    cs = [orderly_consumer(cluster, group, f"b{i}", sinks[i], message_model="BROADCASTING",
                           broadcast_offset_dir=str(tmp_path)) for i in range(2)]
    async with asyncio.timeout(60):
        for c in cs:
            c.subscribe(topic)
            await c.start()
        try:
            await produce_keyed(cluster, topic, 0, 10)
            for s in sinks:
                await s.until(lambda s: len(s) == len(KEYS) * 10)
        finally:
            for c in cs:
                await c.close()
    for s in sinks:
        assert all(v == list(range(10)) for v in per_key(s).values())


async def test_a_queue_changes_hands_only_after_its_running_listener_returned(cluster):
    """c1 consumes slowly; c2 joins. The queue c1 gives up is unlocked only after c1's running
    listener returned and its offset was committed, so c2 (whose first lock is refused
    meanwhile and retried) starts after c1's last message of that queue, at the next offset."""
    topic, group = uniq("OrdHandT"), uniq("OrdHandG")
    await create_topic(cluster, topic, 2)
    loop = asyncio.get_running_loop()
    spans = Sink()

    def listener_of(name, pause_s):
        async def listener(msg):
            start = loop.time()
            await asyncio.sleep(pause_s)
            spans.append((name, msg.queue_id, msg.queue_offset, start, loop.time()))
        return listener

    async with Producer("OrderlyPG", cluster.namesrv_addr, instance_name="hand") as p:
        for i in range(10):
            for q in (0, 1):
                await p.send(Message(topic, f"{q}:{i}".encode()), queue=MessageQueue(topic, "broker-a", q))
    c1 = PushConsumer(group, cluster.namesrv_addr, listener=listener_of("c1", 0.2), orderly=True,
                      instance_name="h1", consume_from_where="FIRST_OFFSET", handover_delay_ms=0)
    c2 = PushConsumer(group, cluster.namesrv_addr, listener=listener_of("c2", 0), orderly=True,
                      instance_name="h2", consume_from_where="FIRST_OFFSET", handover_delay_ms=0)
    c1.subscribe(topic)
    c2.subscribe(topic)
    async with asyncio.timeout(60):
        try:
            await c1.start()
            await spans.until(lambda s: len(s) >= 2)
            await c2.start()
            await spans.until(lambda s: len(s) == 20)
        finally:
            await c2.close()
            await c1.close()
    assert {name for name, *_ in spans} == {"c1", "c2"}
    for q in (0, 1):
        mine = sorted((s for s in spans if s[1] == q), key=lambda s: s[3])
        assert [s[2] for s in mine] == list(range(10)), q        # in order, nothing twice
        for a, b in zip(mine, mine[1:]):
            assert b[3] >= a[4], (a, b)                             # never two listeners at once
