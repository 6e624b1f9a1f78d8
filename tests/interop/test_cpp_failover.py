"""Failover with the Apache C++ client (rocketmq==0.4.4 wheel, C++ client 1.2.x) against
real mqnamesrv/mqbroker processes:

* two nameservers, the broker registered with both: C++ clients given "ns1;ns2" with the
  first one dead route through the second (C++ 1.2.x tries its list in order from the
  first, so each client is refused by ns1 before it asks ns2);
* a clean broker restart (same store and port) under a running C++ push consumer: every
  message before and after is consumed exactly once. The C++ consumer reports what it
  consumed to the broker (the commit flag of its next pull, and UPDATE_CONSUMER_OFFSET every
  5 s) and, across the outage, pulls on from the offsets it keeps in memory; only a dropped
  and re-taken queue makes it read the broker's offset again. The test waits until the
  broker holds the consumer's offsets for everything sent before the stop, so a correct
  broker (one that persists consumer offsets on shutdown) leaves no room for a duplicate
  either way; the offsets are also read back right after the restart. This test takes
  a few seconds or about 35 s, the difference the C++ client's: the broker answers the pulls it
  holds when it stops, but the C++ consumer re-pulls at once, and a pull still in flight
  when the connection closes is never failed by C++ 1.2.x (it fails nothing on a
  disconnect): that queue waits for its 30 s async pull timeout ("no response got for
  opaque" in its log), then pulls from the restarted broker;
* kill -9 of a SYNC_FLUSH broker while one C++ producer process sends synchronously in a
  loop: every send it saw SEND_OK for is in the store after the restart, at the queue
  offset the broker reported, and the same producer's sends succeed again (it re-routes
  to the restarted broker on its own). tests/interop/test_cpp_client.py's kill test uses
  separate producer runs before and after the kill; this one keeps one producer sending
  across it.
"""
from __future__ import annotations

import asyncio
import collections
import time

import pytest
from pocketmq.client import Message, MessageQueue, Producer
from pocketmq.client.instance import ClientInstance

from tests.integration.test_client_cluster import create_topic, drain_lite, uniq
from tests.integration.test_client_namesrv_failover import namesrv
from tests.interop.test_cpp_features import BROKER, msgs, sent, stop_agents
from tests.interop.test_cpp_retry import produce
from tests.support.daemons import Cluster, free_port
from tests.support.events import Sink, pump_json_lines

pytestmark = [pytest.mark.interop, pytest.mark.slow]

QUEUES = 4


class TwoNamesrvCluster(Cluster):
    """A Cluster with a second nameserver: `namesrv_addr` is "ns1;ns2" and the broker
    registers with both (`-n ns1;ns2`)."""

    def __init__(self, root: str, broker_args: list[str] | None = None):
        self.ns2_port = free_port()
        self.namesrv2 = namesrv(root, self.ns2_port, "namesrv2")
        super().__init__(root, broker_args)

    @property
    def ns2_addr(self) -> str:
        return f"127.0.0.1:{self.ns2_port}"

    @property
    def namesrv_addr(self) -> str:
        return f"{super().namesrv_addr};{self.ns2_addr}"

    def start(self) -> "TwoNamesrvCluster":
        self.namesrv2.start()
        try:
            super().start()
        except Exception:
            self.namesrv2.kill()
            raise
        return self

    def stop(self) -> None:
        super().stop()
        self.namesrv2.kill()


@pytest.fixture
def two_ns(tmp_path):
    c = TwoNamesrvCluster(str(tmp_path / "two-ns"))
    c.start()
    yield c
    c.stop()


def started(events) -> bool:
    return any(e["event"] == "started" for e in events)


def bodies(events) -> set[str]:
    return {m["body"] for m in msgs(events)}


async def fence_and_stop(namesrv_addr: str, topic: str, events: Sink, proc, stop: str) -> None:
    """One fence message per queue, then stop the C++ consumer: once it has seen every fence,
    it has been handed everything the broker gave it before them (a second delivery of an
    earlier message included)."""
    async with Producer("CppFailoverFencePG", namesrv_addr, instance_name=uniq("fence")) as p:
        for q in range(QUEUES):
            await p.send(Message(topic, f"fence-{q}".encode()), queue=MessageQueue(topic, BROKER, q))
    await events.until(lambda s: {f"fence-{q}" for q in range(QUEUES)} <= bodies(s))
    await stop_agents([proc], stop)


def assert_exactly_once(events, want: set[str]) -> None:
    assert [e for e in events if e["event"] == "done"], "the C++ consumer did not finish"
    got = [m["body"] for m in msgs(events) if not m["body"].startswith("fence-")]
    dups = sorted(b for b, n in collections.Counter(got).items() if n > 1)
    assert not dups, f"delivered twice: {dups}"
    assert set(got) == want, f"lost: {sorted(want - set(got))}, unexpected: {sorted(set(got) - want)}"


def kill_if_running(proc, reader) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    reader.join(5)


# -- 1. the first of two nameservers down -------------------------------------------------------

async def test_cpp_clients_route_through_the_second_nameserver_when_the_first_is_down(agent, two_ns, tmp_path):
    topic, group = uniq("CppNs2T"), uniq("CppNs2G")
    n = 40
    two_ns.namesrv.kill()
    # Created after ns1 died: the route the clients get comes from ns2 alone, so the broker
    # must have registered the new topic there (not stopped at the dead first address).
    await create_topic(two_ns, topic, QUEUES)
    inst = ClientInstance("127.0.0.1@cpp-ns2-check", two_ns.ns2_addr)
    try:
        route = await inst.api.get_route(topic, namesrv_addr=two_ns.ns2_addr)
    finally:
        await inst.close()
    assert [b.broker_addrs[0] for b in route.broker_datas] == [two_ns.broker_addr]

    stop = str(tmp_path / "stop")
    events = Sink()
    proc = agent.start("push", "--ns", two_ns.namesrv_addr, "--group", group, "--topic", topic,
                       "--stop-file", stop, "--seconds", "90")
    reader = pump_json_lines(proc, events)
    try:
        async with asyncio.timeout(50):
            await events.until(started)
            ev = await asyncio.to_thread(agent.run, "produce", "--ns", two_ns.namesrv_addr, "--topic", topic,
                                         "--mode", "sync", "--count", str(n), "--prefix", "ns2",
                                         "--group", uniq("CppNs2PG"), timeout=45)
            assert [e for e in ev if e["event"] == "error"] == []
            assert sorted(e["idx"] for e in sent(ev) if e["status"] == 0) == list(range(n)), ev
            want = {f"ns2-{i}" for i in range(n)}
            await events.until(lambda s: want <= bodies(s))
            await fence_and_stop(two_ns.ns2_addr, topic, events, proc, stop)
    finally:
        kill_if_running(proc, reader)
    assert_exactly_once(events, want)
    assert {m["queue_id"] for m in msgs(events)} == set(range(QUEUES))


# -- 2. a clean broker restart under a running C++ push consumer --------------------------------

async def broker_offsets(cluster, mqs, group: str | None = None) -> list[int]:
    """The broker's max offset of each queue, or with `group` the offset it holds for it."""
    inst = ClientInstance(f"127.0.0.1@{uniq('offsets')}", cluster.namesrv_addr)
    try:
        if group is None:
            return [await inst.api.max_offset(cluster.broker_addr, mq) for mq in mqs]
        return [await inst.api.query_consumer_offset(cluster.broker_addr, group, mq) for mq in mqs]
    finally:
        await inst.close()


async def test_cpp_push_consumer_gets_everything_once_across_a_clean_broker_restart(agent, cluster, tmp_path):
    topic, group = uniq("CppRestartT"), uniq("CppRestartG")
    n = 40
    await create_topic(cluster, topic, QUEUES)
    mqs = [MessageQueue(topic, BROKER, q) for q in range(QUEUES)]
    stop = str(tmp_path / "stop")
    events = Sink()
    proc = agent.start("push", "--ns", cluster.namesrv_addr, "--group", group, "--topic", topic,
                       "--stop-file", stop, "--seconds", "90")
    reader = pump_json_lines(proc, events)
    before = {f"before-{i}" for i in range(n)}
    after = {f"after-{i}" for i in range(n)}
    try:
        async with asyncio.timeout(60):
            await events.until(started)
            await produce(cluster, topic, [b.encode() for b in sorted(before)])
            await events.until(lambda s: before <= bodies(s))
            maxes = await broker_offsets(cluster, mqs)
            assert sum(maxes) == n and all(maxes), maxes
            # The broker holds the consumer's offsets for all of it (commit flag of the next
            # pull, or the C++ client's 5 s UPDATE_CONSUMER_OFFSET).
            loop = asyncio.get_running_loop()
            end = loop.time() + 15
            while (committed := await broker_offsets(cluster, mqs, group)) != maxes:
                assert loop.time() < end, f"the C++ consumer never committed {maxes}: {committed}"
                await asyncio.sleep(0.2)
            await asyncio.to_thread(cluster.restart_broker)
            # Persisted on shutdown and read back (the consumer can only commit these again:
            # nothing new was sent).
            assert await broker_offsets(cluster, mqs, group) == maxes
            await produce(cluster, topic, [b.encode() for b in sorted(after)])
            # up to the C++ client's 30 s pull timeout (see the module docstring)
            await events.until(lambda s: after <= bodies(s))
            await fence_and_stop(cluster.namesrv_addr, topic, events, proc, stop)
    finally:
        kill_if_running(proc, reader)
    assert_exactly_once(events, before | after)


# -- 3. kill -9 under SYNC_FLUSH while one C++ producer sends in a loop --------------------------

async def test_cpp_sync_sends_acknowledged_across_a_sigkill_are_stored_and_sending_resumes(agent, cluster):
    """The conftest cluster runs SYNC_FLUSH. SIGKILL keeps what the broker wrote (the page
    cache survives the process): what this pins is that SEND_OK never comes before the
    write, that recovery after an unclean stop keeps every such message at the queue offset
    it was acknowledged with, and that a producer keeps working across it."""
    topic = uniq("CppKillLoopT")
    await create_topic(cluster, topic, QUEUES)
    events = Sink()
    # Far more sends than the test lets happen: the producer is killed once it has resumed.
    proc = agent.start("produce", "--ns", cluster.namesrv_addr, "--topic", topic, "--mode", "sync",
                       "--count", "10000000", "--prefix", "loop", "--group", uniq("CppKillLoopPG"),
                       "--timeout-ms", "3000")
    reader = pump_json_lines(proc, events)

    def acked(s):
        return [e for e in sent(s) if e["status"] == 0]
    try:
        async with asyncio.timeout(50):
            await events.until(lambda s: len(acked(s)) >= 100)
            t_kill = time.time()
            await asyncio.to_thread(cluster.restart_broker, True)
            t_up = time.time()
            await events.until(lambda s: sum(e["t0"] >= t_up for e in acked(s)) >= 50)
    finally:
        kill_if_running(proc, reader)
    ok = acked(events)
    assert len([e for e in ok if e["t1"] < t_kill]) >= 100

    mqs = [MessageQueue(topic, BROKER, q) for q in range(QUEUES)]
    total = sum(await broker_offsets(cluster, mqs))
    async with asyncio.timeout(40):
        stored = await drain_lite(cluster.namesrv_addr, uniq("CppKillLoopDrain"), mqs, total, timeout_s=30)
    assert len(stored) == total
    by_id = collections.defaultdict(list)
    for m in stored:
        by_id[m.msg_id].append(m)
    missing = [e["idx"] for e in ok if e["msg_id"] not in by_id]
    assert not missing, f"{len(missing)} of {len(ok)} acknowledged sends lost, e.g. {missing[:10]}"
    for e in ok:
        copies = by_id[e["msg_id"]]
        assert {m.body for m in copies} == {f"loop-{e['idx']}".encode()}, (e, copies)
        assert e["offset"] in {m.queue_offset for m in copies}, (e, [m.queue_offset for m in copies])
