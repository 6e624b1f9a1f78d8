"""Master/slave broker groups against the in-process fake cluster (tests/support/fake_broker.py:
slaves share their master's messages, refuse sends, keep their own offsets; a stopped
master leaves the route at once). Waits await the listeners' sinks or the fake brokers'
state (re-checked after every request they handle); every test is bounded by a timeout,
and the ones that need it by the 5 s the client has to move on to a slave."""
import asyncio
import contextlib
from collections import deque

import pytest

from pocketmq.client.lite_pull_consumer import LitePullConsumer
from pocketmq.client.message import Message, SendStatus
from pocketmq.client.producer import Producer
from pocketmq.client.push_consumer import CONSUME_SUCCESS, PushConsumer
from pocketmq.client.transaction_producer import (
    LocalTransactionState,
    TransactionProducer,
)
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.codes import PullSysFlag, RequestCode, ResponseCode
from tests.support.events import Sink
from tests.support.fake_broker import FakeCluster

MQ0 = MessageQueue("T", "broker-a", 0)


async def produce(addr, topic, n, start=0):
    async with Producer("PG", addr, instance_name="prod") as p:
        for i in range(start, start + n):
            await p.send(Message(topic, f"m{i}".encode()))


def push(cluster, group, got, **kw):
    async def listener(msg):
        got.append(msg.body.decode())
        return CONSUME_SUCCESS
    kw.setdefault("consume_from_where", "FIRST_OFFSET")
    c = PushConsumer(group, cluster.namesrv_addr, listener=listener, instance_name=group, **kw)
    c.subscribe("T")
    return c


@contextlib.asynccontextmanager
async def one_group(queues: int, produced: int):
    """A cluster of one master and its slave, topic T with `queues` queues and `produced`
    messages m0.. in it; the test bounded by 30 s."""
    async with asyncio.timeout(30), FakeCluster(slaves=1) as cluster:
        cluster.create_topic("T", queues)
        await produce(cluster.namesrv_addr, "T", produced)
        yield cluster, cluster.brokers[0], cluster.slaves[0]


async def until(pred, what: str, step_s: float = 0.01) -> None:
    """Client-side state nothing signals: polled (bound it with the test's timeout)."""
    while not pred():
        await asyncio.sleep(step_s)


# -- 1. pulls follow the broker's suggestion ------------------------------------------------------

async def test_pulls_follow_the_suggestion_to_the_slave_and_a_slave_pull_carries_no_commit_offset():
    async with one_group(queues=2, produced=20) as (cluster, master, slave):
        got = Sink()
        c = push(cluster, "CG", got)
        async with c:
            await got.until(lambda s: len(s) == 20)
            await master.until(lambda: master.caught_up("CG", "T"))
            assert slave.pulls == deque() and c.stats["pulls_by_broker_id"] == {0: 2}
            # "you lag far behind: read from the slave" (the slave says the same)
            master.suggest = slave.suggest = 1
            await produce(cluster.namesrv_addr, "T", 2, start=20)
            await got.until(lambda s: len(s) == 22)
            await slave.until(lambda: slave.caught_up("CG", "T"))
            to_slave = [h for h in slave.pulls if h.topic == "T"]
            # caught up: back to the master
            master.suggest = slave.suggest = 0
            await produce(cluster.namesrv_addr, "T", 2, start=22)
            await got.until(lambda s: len(s) == 24)
            await master.until(lambda: master.caught_up("CG", "T"))
        assert sorted(got) == sorted(f"m{i}" for i in range(24))
        # the pulls after the suggestion went to the slave, carrying the consumer's commit
        # point but not the flag that would make a broker store it
        assert len(to_slave) == 2 and all(h.commit_offset > 0 for h in to_slave)
        assert not any(h.sys_flag & PullSysFlag.COMMIT_OFFSET for h in to_slave)
        # answered: master 2 + 2 (the held pulls the suggestion came with), slave 2
        assert c.stats["pulls_by_broker_id"] == {0: 4, 1: 2}
        assert sum(master.committed("CG", "T").values()) == 24 and slave.committed("CG", "T") == {}


# -- 2. a dead master ---------------------------------------------------------------------------------

async def test_a_dead_masters_queues_are_pulled_from_the_slave_within_5s_and_offsets_return_to_the_master():
    async with one_group(queues=1, produced=5) as (cluster, master, slave):
        got = Sink()
        c = push(cluster, "CG", got, persist_interval_s=0.2)
        async with c:
            await got.until(lambda s: len(s) == 5)
            await master.until(lambda: master.committed("CG", "T") == {0: 5})
            await master.stop()
            for i in range(5, 8):                 # replicated before the master died
                slave.store("T", 0, f"m{i}".encode())
            async with asyncio.timeout(5):
                await got.until(lambda s: len(s) == 8)
            # the commits go to the slave while the group has no master...
            await slave.until(lambda: slave.committed("CG", "T") == {0: 8})
            assert c.stats["pulls_by_broker_id"].get(1, 0) >= 1
            # ...and to the master again once it is back (its offsets are the old ones)
            await master.start()
            await c.instance.refresh_routes()     # what the 30 s timer does
            await master.until(lambda: master.committed("CG", "T") == {0: 8})
        assert got == [f"m{i}" for i in range(8)]


async def test_lite_consumer_polls_commits_and_reads_bounds_on_the_slave_while_the_master_is_down():
    async with one_group(queues=1, produced=3) as (cluster, master, slave):
        c = LitePullConsumer("LG", cluster.namesrv_addr, auto_commit=False, instance_name="lite")
        c.assign([MQ0])
        async with c:
            c.seek(MQ0, 0)
            assert [m.body for m in await c.poll(5)] == [b"m0", b"m1", b"m2"]
            await c.commit()
            assert master.committed("LG", "T") == {0: 3}
            await master.stop()
            slave.store("T", 0, b"m3")
            msgs = []
            async with asyncio.timeout(5):
                while not msgs:
                    msgs = await c.poll(5)
            assert [m.body for m in msgs] == [b"m3"]
            await c.commit()
            assert slave.committed("LG", "T") == {0: 4}
            assert await c.committed(MQ0) == 4                 # asked of the slave
            await c.seek_to_end(MQ0)
            assert c.position(MQ0) == 4
            assert await c.offset_for_timestamp(MQ0, 0) == 0
            assert c.stats["pulls_by_broker_id"].get(1, 0) >= 1


# -- 3. orderly consumers: locks live on the master -----------------------------------------------------

async def test_orderly_consumer_stops_without_master_and_resumes_in_order_once_it_is_back():
    async with one_group(queues=1, produced=3) as (cluster, master, slave):
        got = Sink()
        c = push(cluster, "OG", got, orderly=True)
        async with c:
            await got.until(lambda s: len(s) == 3)
            pq = c.subscription_state.get(MQ0).pq
            qs = c.subscription_state.get(MQ0)
            await master.stop()
            async with asyncio.timeout(5):        # at once, not at the next renewal (20 s)
                await until(lambda: not pq.locked, "the queue's lock dropped")
            for i in range(3, 6):
                slave.store("T", 0, f"m{i}".encode())
            # the queue's pull loop asks again and again and is refused (no lock)
            await until(lambda: qs.room is not None, "a refused pull")
            first = qs.room
            await until(lambda: qs.room is not None and qs.room is not first, "another refused pull")
            assert got == ["m0", "m1", "m2"]
            await master.start()
            await c.instance.refresh_routes()     # what the 30 s timer does
            async with asyncio.timeout(5):        # relocked at once, not at the next renewal
                await got.until(lambda s: len(s) == 6)
        assert got == [f"m{i}" for i in range(6)]


# -- 4. heartbeats at once to addresses a route shows for the first time ----------------------------------

async def test_a_newly_seen_slave_and_master_get_a_heartbeat_at_once():
    async with asyncio.timeout(30):
        async with FakeCluster(brokers=2) as cluster:
            a, b = cluster.brokers
            a.topics["T"] = 1
            got = Sink()
            c = push(cluster, "CG", got)
            async with c, TransactionProducer("TxG", cluster.namesrv_addr, instance_name="tx",
                                              checker=lambda m: LocalTransactionState.COMMIT) as p:
                await p.send(Message("T", b"x"))
                slave = await cluster.add_slave(0)
                b.topics["T"] = 1
                await c.instance.refresh_routes()
                await p.instance.refresh_routes()
                async with asyncio.timeout(5):        # the heartbeat timer would take 30 s
                    await slave.until(lambda: "CG" in slave.groups)
                    await b.until(lambda: "TxG" in b.producer_groups and "CG" in b.groups)
                assert "TxG" not in slave.producer_groups      # producers heartbeat masters only


# -- 5. stored, but not as durably as asked: the status goes to the caller --------------------------------

STATUSES = [(ResponseCode.FLUSH_DISK_TIMEOUT, SendStatus.FLUSH_DISK_TIMEOUT),
            (ResponseCode.SLAVE_NOT_AVAILABLE, SendStatus.SLAVE_NOT_AVAILABLE),
            (ResponseCode.FLUSH_SLAVE_TIMEOUT, SendStatus.FLUSH_SLAVE_TIMEOUT)]


@pytest.mark.parametrize(("code", "status"), STATUSES, ids=[s.name for _, s in STATUSES])
async def test_a_send_stored_without_the_replica_returns_its_status_and_is_never_resent(code, status):
    async with asyncio.timeout(30):
        async with FakeCluster(brokers=2) as cluster:
            cluster.create_topic("T", 2)
            for broker in cluster.brokers:
                broker.store_status = code

            def stored() -> int:
                return sum(b.message_count("T") for b in cluster.brokers)

            def sends() -> int:
                return sum(b.sends for b in cluster.brokers)

            def check(r, n_ids=1):
                assert r.status is status
                assert r.msg_id and len(r.msg_id.split(",")) == n_ids
                assert r.offset_msg_id and r.queue.topic == "T" and r.queue_offset >= 0

            async with Producer("PG", cluster.namesrv_addr, instance_name="p") as p:
                check(await p.send(Message("T", b"one")))
                assert (stored(), sends()) == (1, 1)

                results = await p.send_batch([Message("T", f"b{i}".encode()) for i in range(3)])
                assert len(results) == 1
                check(results[0], 3)
                assert (stored(), sends()) == (4, 2)
                results = await p.send_batch([b"x", b"y"], topic="T")
                check(results[0], 2)
                assert (stored(), sends()) == (6, 3)

                # coalesced: many sends, few SEND_BATCH_MESSAGEs, each caller its own result
                many = await asyncio.gather(*(p.send(Message("T", f"c{i}".encode())) for i in range(20)))
                for r in many:
                    check(r)
                assert len({r.offset_msg_id for r in many}) == 20
                assert len({(r.queue, r.queue_offset) for r in many}) == 20
                assert stored() == 26 and sends() < 3 + 20

                # orderly sends: the chosen queue, once
                r = await p.send(Message("T", b"k"), sharding_key="order-1")
                check(r)
                q = MessageQueue("T", "broker-b", 1)
                r = await p.send(Message("T", b"q"), queue=q)
                check(r)
                assert r.queue == q
                r = await p.send(Message("T", b"s"), selector=lambda qs, arg: qs[arg], arg=0)
                check(r)
                assert stored() == 29
            assert RequestCode.SEND_BATCH_MESSAGE in cluster.brokers[0].requests + cluster.brokers[1].requests


# -- 6. producers route around a group without master --------------------------------------------------------

async def test_sends_go_on_to_the_other_groups_when_a_master_dies():
    async with asyncio.timeout(30):
        async with FakeCluster(brokers=2, slaves=1) as cluster:
            a, b = cluster.brokers
            cluster.create_topic("T", 2)
            async with Producer("PG", cluster.namesrv_addr, instance_name="p") as p:
                first = [await p.send(Message("T", f"m{i}".encode())) for i in range(8)]
                assert {r.queue.broker_name for r in first} == {"broker-a", "broker-b"}
                await a.stop()
                before = b.message_count("T")
                later = [await p.send(Message("T", f"n{i}".encode())) for i in range(8)]
                assert all(r.status is SendStatus.SEND_OK for r in later)
                assert {r.queue.broker_name for r in later} == {"broker-b"}
                assert b.message_count("T") == before + 8
                # the lost connection refreshed the route: broker-a is out of the publish queues
                async with asyncio.timeout(5):
                    await until(lambda: {q.broker_name for q in p.instance.publish["T"].queues} == {"broker-b"},
                                "broker-a out of the publish queues")
