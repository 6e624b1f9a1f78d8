"""Clients follow a broker failover without a restart (client/failover.py), against the
in-process fake cluster (tests/support/fake_broker.py) over real sockets. A failover is
made the way the nameserver shows one: the slave of broker-a becomes brokerId 0 and the
old master is gone (stopped) or demoted to brokerId 1 (it then refuses sends with
SERVICE_NOT_AVAILABLE, as a slave does). The clients must move to the new master well
before their 30 s route timer: each test allows 5 s, and the producer's sends 1 s.
Waits await sinks and the fake brokers' state; client-side state nothing signals is
polled (`until`). Every test is bounded by a timeout."""
import asyncio
import contextlib
import time

import pytest

from pocketmq.client import instance as instance_mod
from pocketmq.client.errors import RequestTimeoutError, ServiceNotAvailableError
from pocketmq.client.lite_pull_consumer import LitePullConsumer
from pocketmq.client.message import Message, SendStatus
from pocketmq.client.producer import Producer
from pocketmq.client.push_consumer import CONSUME_SUCCESS, PushConsumer
from pocketmq.protocol.bodies import MessageQueue
from tests.support.events import Sink
from tests.support.fake_broker import FakeCluster
from tests.support.fault_proxy import Fault, FaultProxy, RoutingNameServer

MQ0 = MessageQueue("T", "broker-a", 0)


async def until(pred, step_s: float = 0.01) -> None:
    """Client-side state nothing signals: polled (bound it with the test's timeout)."""
    while not pred():
        await asyncio.sleep(step_s)


def promote(slave, master=None) -> None:
    """The nameserver now shows `slave` as broker-a's master (brokerId 0) and `master`,
    when still running, as its slave: a slave refuses sends."""
    slave.broker_id = 0
    if master is not None:
        master.broker_id = 1


@contextlib.asynccontextmanager
async def one_group(queues: int = 2):
    """broker-a with one slave, topic T; the test bounded by 30 s."""
    async with asyncio.timeout(30), FakeCluster(slaves=1) as cluster:
        cluster.create_topic("T", queues)
        yield cluster, cluster.brokers[0], cluster.slaves[0]


async def produce(cluster, bodies, instance_name="feeder"):
    """Send from a client of its own (its refreshes do not help the client under test)."""
    async with Producer("FeedPG", cluster.namesrv_addr, instance_name=instance_name) as p:
        for b in bodies:
            await p.send(Message("T", b.encode()))


# -- the producer -------------------------------------------------------------------------------------

async def test_a_send_refused_by_a_demoted_master_is_retried_on_the_new_master_at_once():
    async with one_group() as (cluster, old, new):
        async with Producer("PG", cluster.namesrv_addr, instance_name="p") as p:
            assert (await p.send(Message("T", b"before"))).status is SendStatus.SEND_OK
            assert (old.sends, new.sends) == (1, 0)
            promote(new, old)
            routes = cluster.namesrv.route_requests
            t0 = time.monotonic()
            r = await p.send(Message("T", b"after"))
            assert time.monotonic() - t0 < 1.0
            # refused by the old master (SERVICE_NOT_AVAILABLE), stored by the new one
            assert r.status is SendStatus.SEND_OK and (old.sends, new.sends) == (2, 1)
            assert cluster.namesrv.route_requests > routes
            assert p.stats["route_refreshes_on_failure"] >= 1
            assert p.instance.brokers.master("broker-a") == new.addr
            for i in range(5):
                await p.send(Message("T", f"n{i}".encode()))
            assert (old.sends, new.sends) == (2, 6)


async def test_without_retries_the_refused_send_raises_and_the_next_goes_to_the_new_master():
    async with one_group() as (cluster, old, new):
        async with Producer("PG", cluster.namesrv_addr, instance_name="p", retry_times_when_send_failed=0) as p:
            await p.send(Message("T", b"before"))
            promote(new, old)
            with pytest.raises(ServiceNotAvailableError):
                await p.send(Message("T", b"refused"))
            r = await p.send(Message("T", b"next"))
            assert r.status is SendStatus.SEND_OK and (old.sends, new.sends) == (2, 1)


async def test_a_dead_master_sends_go_to_the_promoted_slave_within_a_second():
    async with one_group() as (cluster, old, new):
        async with Producer("PG", cluster.namesrv_addr, instance_name="p") as p:
            await p.send(Message("T", b"before"))
            await old.stop()                       # connections reset, new ones refused
            promote(new)
            t0 = time.monotonic()
            for i in range(3):
                r = await p.send(Message("T", f"n{i}".encode()))
                assert r.status is SendStatus.SEND_OK
            assert time.monotonic() - t0 < 1.0
            assert new.sends == 3 and p.instance.brokers.master("broker-a") == new.addr


async def test_a_send_timing_out_on_a_stalled_master_makes_the_next_send_go_to_the_new_master():
    """The old master stalls (a blackhole: connected, never answers) while the slave is
    promoted: the send times out, and that alone refreshes the route."""
    async with one_group() as (cluster, old, new):
        async with FaultProxy("127.0.0.1", old.port) as proxy, \
                RoutingNameServer(cluster.namesrv_addr, {old.addr: proxy.addr}) as ns:
            async with Producer("PG", ns.addr, instance_name="p", send_timeout_ms=500) as p:
                await p.send(Message("T", b"before"))
                assert old.sends == 1
                proxy.set_fault(Fault.BLACKHOLE)
                promote(new, old)
                with pytest.raises(RequestTimeoutError):
                    await p.send(Message("T", b"stalled"))
                t0 = time.monotonic()
                r = await p.send(Message("T", b"next"))
                assert time.monotonic() - t0 < 1.0
                assert r.status is SendStatus.SEND_OK and new.sends == 1
                assert p.stats["route_refreshes_on_failure"] >= 1


# -- consumers ----------------------------------------------------------------------------------------

def push(cluster, group, got, **kw):
    async def listener(msg):
        got.append(msg.body.decode())
        return CONSUME_SUCCESS
    c = PushConsumer(group, cluster.namesrv_addr, listener=listener, instance_name=group,
                     consume_from_where="FIRST_OFFSET", **kw)
    c.subscribe("T")
    return c


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrently", "orderly"])
async def test_a_push_consumer_goes_on_from_the_promoted_slave_within_5s(orderly):
    async with one_group() as (cluster, old, new):
        await produce(cluster, [f"m{i}" for i in range(4)])
        got = Sink()
        c = push(cluster, "CG", got, orderly=orderly)
        async with c:
            await got.until(lambda s: len(s) == 4)
            await old.stop()
            promote(new)
            async with asyncio.timeout(5):
                await produce(cluster, [f"m{i}" for i in range(4, 8)])
                await got.until(lambda s: len(s) == 8)
                await new.until(lambda: new.caught_up("CG", "T"))
            assert c.instance.brokers.master("broker-a") == new.addr
            assert c.stats["route_refreshes_on_failure"] >= 1
            if orderly:     # locked again, on the new master
                assert {q for (g, t, q) in new.locks if (g, t) == ("CG", "T")} == {0, 1}
        assert sorted(got) == [f"m{i}" for i in range(8)]
        if orderly:
            for q in (0, 1):
                mine = [b for b in got if int(b[1:]) % 2 == q]     # round robin over 2 queues
                assert mine == sorted(mine, key=lambda b: int(b[1:]))


async def test_a_lite_pull_consumer_goes_on_from_the_promoted_slave_within_5s():
    async with one_group(queues=1) as (cluster, old, new):
        await produce(cluster, ["m0", "m1"])
        c = LitePullConsumer("LG", cluster.namesrv_addr, instance_name="lite", auto_commit=False)
        c.assign([MQ0])
        async with c:
            c.seek(MQ0, 0)
            assert [m.body for m in await c.poll(5)] == [b"m0", b"m1"]
            await old.stop()
            promote(new)
            await produce(cluster, ["m2"])
            msgs = []
            async with asyncio.timeout(5):
                while not msgs:
                    msgs = await c.poll(5)
            assert [m.body for m in msgs] == [b"m2"]
            await c.commit()
            assert new.committed("LG", "T") == {0: 3}
            assert c.instance.brokers.master("broker-a") == new.addr


async def test_a_dead_broker_failing_every_pull_makes_few_route_requests():
    """A lone broker stays in the route while stopped: every pull of 4 queues fails at once
    (connection refused) and is retried every 10 ms; over 300 failures the nameserver sees
    about one request per topic (T, %RETRY%CG) per interval, not one per failure."""
    interval_s = instance_mod.ROUTE_REFRESH_AFTER_FAILURE_MIN_INTERVAL_S
    async with asyncio.timeout(30), FakeCluster() as cluster:
        cluster.create_topic("T", 4)
        broker = cluster.brokers[0]
        got = Sink()
        c = push(cluster, "CG", got, pull_error_delay_ms=10)
        async with c:
            await broker.until(lambda: broker.caught_up("CG", "T"))
            await broker.stop()
            before, t0 = cluster.namesrv.route_requests, time.monotonic()

            def failures() -> int:
                episode = c.fetcher.pull_failures._episodes.get("broker-a")
                return 0 if episode is None else episode.failures
            await until(lambda: failures() >= 300)
            requests = cluster.namesrv.route_requests - before
            elapsed = time.monotonic() - t0
            await broker.start()
        assert 2 <= requests <= 2 * (elapsed / interval_s + 2), (requests, elapsed)
        assert c.stats["route_refreshes_on_failure"] <= requests
