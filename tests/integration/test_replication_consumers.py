"""Consumers and replication, end to end with pocketmq's client and brokers:

* slave reads (the seeds' suggestion): with slaveReadEnable and a consumer further behind the
  log's end than the in-memory limit (totalPhysicalMemoryBytes set small), the master tells
  it to pull from the slave, it does (pulls counted on the slave's side too), and once caught
  up it is sent back; with slaveReadEnable=false it never is;
* a dead master (SIGKILL, real processes): a push consumer goes on from the slave within 5 s,
  commits there, and after the master returns (taking the slave's newer offsets back before
  it serves) a new consumer of the group starts where the old one stopped: nothing is
  delivered twice beyond what was in flight at the kill (counted).
"""
from __future__ import annotations

import asyncio
import time

import pytest

from pocketmq.client import CONSUME_SUCCESS, Message, Producer, PushConsumer
from pocketmq.client.instance import ClientInstance
from pocketmq.client.process_queue import FlowLimits
from pocketmq.protocol.bodies import TopicConfig
from tests.integration.test_client_cluster import create_topic
from tests.support.events import Sink
from tests.support.replica_pair import LocalPair, ProcessGroup

pytestmark = pytest.mark.asyncio


async def _route_members(ns: str, topic: str, members: int) -> None:
    admin = ClientInstance("127.0.0.1@route-wait", ns)
    try:
        while True:
            route = await admin.api.get_route(topic)
            if route is not None and route.broker_datas and len(route.broker_datas[0].broker_addrs) >= members:
                return
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


async def _one_queue_topic(pair: LocalPair, topic: str) -> None:
    """`topic` with one queue on the master, in the route with both members."""
    admin = ClientInstance(f"127.0.0.1@{topic}", pair.namesrv_addr)
    try:
        await admin.api.create_topic(pair.master.addr, TopicConfig(topic, 1, 1), "TBW102")
    finally:
        await admin.close()
    await _route_members(pair.namesrv_addr, topic, 2)


def _recording_consumer(pair: LocalPair, group: str, topic: str, seen: Sink, what, **options) -> PushConsumer:
    async def listener(msg):
        seen.append(what(msg))
        return CONSUME_SUCCESS
    c = PushConsumer(group, pair.namesrv_addr, listener=listener, instance_name=group.lower(),
                     consume_from_where="FIRST_OFFSET", **options)
    c.subscribe(topic)
    return c


async def _slave_read_run(tmp_path, slave_read: bool) -> tuple[dict, int, int]:
    common = ["--slaveSyncIntervalMillis=200", "--totalPhysicalMemoryBytes=262144",
              "--accessMessageInMemoryMaxRatio=40", f"--slaveReadEnable={str(slave_read).lower()}"]
    async with asyncio.timeout(60), LocalPair(tmp_path, common_args=common) as pair:
        await _one_queue_topic(pair, "SlaveReadT")
        async with Producer("SRP", pair.namesrv_addr, instance_name="srp") as p:
            # ~1 MiB: far more than the 100 KiB the master keeps "in memory"
            for _ in range(40):
                await p.send_batch([b"r" * 1000] * 25, topic="SlaveReadT")
        await pair.caught_up()
        while pair.slave.topics.get("SlaveReadT") is None:
            await asyncio.sleep(0.05)
        seen = Sink()
        c = _recording_consumer(pair, "SRG", "SlaveReadT", seen, lambda m: m.queue_offset, pull_batch_size=32)
        async with c:
            await seen.until(lambda s: len(s) >= 1000)
        # what the slave served, counted on its side
        served = sum(cn.msgs for cn in pair.slave.stats.get.get("SlaveReadT", {}).values())
        return dict(c.stats["pulls_by_broker_id"]), len(set(seen)), served


async def test_a_lagging_consumer_is_sent_to_the_slave_and_back(tmp_path):
    pulls, unique, served = await _slave_read_run(tmp_path / "on", True)
    assert unique == 1000
    assert pulls.get(1, 0) > 0 and served > 0, (pulls, served)   # told to read from the slave while far behind
    assert pulls.get(0, 0) > 0, pulls        # and back to the master once caught up
    pulls, unique, served = await _slave_read_run(tmp_path / "off", False)
    assert unique == 1000
    assert set(pulls) == {0} and served == 0, (pulls, served)    # slaveReadEnable=false: never


async def test_dead_master_consumption_from_the_slave_and_back(tmp_path):
    g = ProcessGroup(str(tmp_path), "ASYNC_MASTER", ["--slaveSyncIntervalMillis=200", "--defaultTopicQueueNums=4"])
    topic, n1, n2 = "DeadT", 600, 50
    await asyncio.to_thread(g.start)
    try:
        await create_topic(g, topic, 4)
        async with Producer("DP", g.namesrv_addr, instance_name="dp") as p:
            for i in range(n1):
                assert (await p.send(Message(topic, b"a%d" % i))).ok
        delivered = Sink()
        times: list[float] = []

        async def slow(msg):
            await asyncio.sleep(0.004)          # ~250/s: the kill lands mid-stream
            delivered.append(msg.body)
            times.append(time.monotonic())
            return CONSUME_SUCCESS
        c = PushConsumer("DG", g.namesrv_addr, listener=slow, instance_name="dc1", consume_from_where="FIRST_OFFSET",
                         persist_interval_s=0.5, consume_concurrency=1, pull_batch_size=8,
                         flow_limits=FlowLimits(pull_threshold_for_queue=16))
        c.subscribe(topic)
        async with c:
            await delivered.until(lambda s: len(s) >= n1 // 3)
            g.master.kill()
            t_kill = time.monotonic()
            at_kill = len(delivered)
            # in flight at the kill: what was delivered in the last two commit intervals
            in_flight = sum(1 for t in times if t > t_kill - 1.0)
            async with asyncio.timeout(5 + 30):
                await delivered.until(lambda s: len(set(s)) >= n1)
            # past what the consumer had cached at the kill (4 queues x (16 + a pull of 8)):
            # pulled after it, from the slave
            resumed_s = times[at_kill + 4 * (16 + 8)] - t_kill
            assert c.stats["pulls_by_broker_id"].get(1, 0) > 0
            # the master comes back on its own store; it takes the slave's newer offsets back
            g.master = g._broker("m", g.master_dir)
            await asyncio.to_thread(g.master.start, 30)
            await _route_members(g.namesrv_addr, topic, 2)
        # a new member of the group starts from the group's offsets: at the master
        async with Producer("DP", g.namesrv_addr, instance_name="dp2") as p:
            for i in range(n2):
                assert (await p.send(Message(topic, b"b%d" % i))).ok
        c2 = PushConsumer("DG", g.namesrv_addr, listener=slow, instance_name="dc2", persist_interval_s=0.5)
        c2.subscribe(topic)
        async with c2:
            await delivered.until(lambda s: sum(1 for b in s if b.startswith(b"b")) >= n2)
            await asyncio.sleep(1.0)            # anything replayed from old offsets would arrive now
        dupes = len(delivered) - len(set(delivered))
        print(f"\nresumed from the slave {resumed_s:.2f} s after the kill; duplicates {dupes} "
              f"(in flight at the kill: {in_flight})")
        assert resumed_s < 5.0
        assert len(set(delivered)) == n1 + n2
        assert dupes <= in_flight
    finally:
        g.stop()


async def test_a_consumer_ahead_of_its_slave_is_not_sent_back(tmp_path):
    """The master served what its slave has not copied yet; the master goes away: the slave
    answers the consumer's pulls past its end by holding them at the consumer's offset (not
    PULL_OFFSET_MOVED to the queue's start, which would replay the whole queue), and serves
    them when the copy arrives. With offsetCheckInSlave=true it corrects the offset as a
    master would."""
    from pocketmq.protocol.codes import ResponseCode as C
    from pocketmq.remoting.client import RemotingClient
    from tests.integration.test_broker import pull_cmd
    async with asyncio.timeout(90), LocalPair(tmp_path, common_args=["--slaveSyncIntervalMillis=200"]) as pair:
        await _one_queue_topic(pair, "AheadT")
        seen = Sink()
        c = _recording_consumer(pair, "AheadG", "AheadT", seen, lambda m: m.body, persist_interval_s=0.5)
        async with Producer("AheadP", pair.namesrv_addr, instance_name="aheadp") as p, c:
            for i in range(100):
                assert (await p.send(Message("AheadT", b"a%d" % i))).ok
            await pair.caught_up()
            while pair.slave.topics.get("AheadT") is None:
                await asyncio.sleep(0.05)
            await pair.slave.ha_slave.close()          # the slave stops copying: it falls behind
            for i in range(5):
                assert (await p.send(Message("AheadT", b"b%d" % i))).ok
            await seen.until(lambda s: len(s) >= 105)
            rc = RemotingClient()
            try:
                r = await rc.invoke(pair.slave.addr, pull_cmd("AheadT", 0, 105))
                assert (r.code, r.ext_fields["nextBeginOffset"]) == (C.PULL_NOT_FOUND, "105"), (r.code, r.remark)
            finally:
                await rc.close()
            await asyncio.sleep(1.2)                   # the consumer's offsets reach the master
            await pair.stop_master()
            # the consumer now pulls from the slave, which holds its pull at offset 105
            async with asyncio.timeout(10):
                while pair.slave.held_pulls.count == 0:
                    await asyncio.sleep(0.05)
            await asyncio.sleep(1)
            assert len(seen) == 105 and len(set(seen)) == 105, (len(seen), len(set(seen)))
    async with LocalPair(tmp_path / "check", common_args=["--offsetCheckInSlave=true"]) as pair:
        async with Producer("AheadP2", pair.namesrv_addr, instance_name="aheadp2") as p:
            assert (await p.send(Message("AheadT2", b"x"))).ok
        await pair.caught_up()
        while pair.slave.topics.get("AheadT2") is None:
            await asyncio.sleep(0.05)
        rc = RemotingClient()
        try:
            r = await rc.invoke(pair.slave.addr, pull_cmd("AheadT2", 0, 50))
            assert r.code == C.PULL_OFFSET_MOVED, (r.code, r.remark)
        finally:
            await rc.close()
