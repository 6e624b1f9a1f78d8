"""The broker's queue lock table (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ, broker/core/locks.py) under
Apache C++ orderly push consumers (rocketmq==0.4.4 wheel, C++ client 1.2.x, `cpp_agent.py push
--orderly`), read two ways: `mqadmin consumerStatus` (each client's ProcessQueueInfo
`locked=true`: the C++ client sets it only when the broker's LOCK_BATCH_MQ answer named the
queue) and a raw LOCK_BATCH_MQ from a third, Python-side client id of the same group (the
broker must refuse it every queue another client holds).

What the C++ client does (1.2.x source): it locks a queue before each pull while it does not
hold it, renews every lock every 20 s, and at a clean shutdown sends UNLOCK_BATCH_MQ for its
queues before closing its connection; its `unlockAll` leaves out the first queue of each
broker in its table (a vector created empty for it), so one lock per broker is left for the
broker to release when the connection closes.

The rule tested for a consumer that dies (SIGKILL): pocketmq releases a client's locks at once
when the connection it locked them over closes (broker/core/locks.py, docs/client.md). Java
4.9 never does: its RebalanceLockManager only lets a lock expire 60 s after its last renewal
(`-Drocketmq.broker.rebalance.lockMaxLiveTime`). pocketmq keeps that 60 s expiry too, with
nothing in the broker config to shorten it, so the expiry path is not tested here (it would
take a minute); the close path is, well inside that minute.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import time
from types import SimpleNamespace

import pytest

from pocketmq.broker.core.locks import LOCK_MAX_LIVE_MS
from pocketmq.client import MessageQueue, Producer
from pocketmq.client.instance import ClientInstance
from tests.integration.test_client_cluster import create_topic, uniq
from tests.integration.test_consumer_running_info import mqadmin
from tests.interop.test_cpp_admin import (BROKER, QUEUES, cpp_consumers, mq_detail, retry_topic, send_per_queue,
                                          status_sections, until_mqadmin)
from tests.interop.test_cpp_features import msgs
from tests.support.workloads import poll_until

pytestmark = [pytest.mark.interop, pytest.mark.slow]

PROBE = "127.0.0.1@pocketmq-lock-probe"
PER_QUEUE = 12          # messages sent to each queue once one consumer is left


async def probe_lock(inst, cluster, group: str, topic: str) -> set[int]:
    """A raw LOCK_BATCH_MQ of every queue of `topic` for `group` as client PROBE: the queue ids
    the broker granted, unlocked again at once (UNLOCK_BATCH_MQ): the probe takes nothing."""
    mqs = [MessageQueue(topic, BROKER, q) for q in range(QUEUES)]
    got = await inst.api.lock_batch(cluster.broker_addr, group, PROBE, mqs)
    if got:
        await inst.api.unlock_batch(cluster.broker_addr, group, PROBE, got)
    return {mq.queue_id for mq in got}


def status_locks(stdout: str, topics) -> dict[str, dict[tuple[str, int], bool]]:
    """consumerStatus (whole group): {clientId: {(topic, qid): locked}} of `topics`' queues."""
    return {cid: {k: pqi["locked"] == "true" for k, pqi in mq_detail(section, topics).items()}
            for cid, section in status_sections(stdout).items()}


async def until_locked(cluster, group: str, topic: str, members, timeout_s: float = 20):
    """Poll `mqadmin consumerStatus -g group` until the group is exactly `members` (clientIds),
    each showing every queue it has of `topic` and of the retry topic locked=true, and those
    queues are disjoint and cover all QUEUES of `topic` and the retry topic's one queue. Returns
    (the mqadmin result, {clientId: queue ids of `topic`}, {clientId: count of locked queues})."""
    topics = (topic, retry_topic(group))
    want = sorted([(topic, q) for q in range(QUEUES)] + [(topics[1], 0)])

    def settled(r):
        if r.returncode != 0:
            return False        # e.g. a member the broker lists has not answered yet
        locks = status_locks(r.stdout, topics)
        held = [k for table in locks.values() for k in table]
        return (set(locks) == set(members) and all(all(t.values()) for t in locks.values())
                and sorted(held) == want)
    r = await until_mqadmin(settled, "consumerStatus", "-n", cluster.namesrv_addr, "-g", group,
                            timeout_s=timeout_s)
    locks = status_locks(r.stdout, topics) if r.returncode == 0 else r.stderr
    assert settled(r), f"the locks of {sorted(members)} never settled: {locks}"
    return (r, {cid: {q for t, q in table if t == topic} for cid, table in locks.items()},
            {cid: len(table) for cid, table in locks.items()})


async def released_at_close(cluster, client_id: str, group: str, timeout_s: float = 10) -> int:
    """How many queue locks the broker logged releasing when `client_id`'s connection closed
    (broker/processors/client_manage.py connection_closed), once it did."""
    pat = re.compile(rf"released (\d+) queue locks of {re.escape(client_id)} in {re.escape(group)} "
                     r"\(connection closed\)")
    m = await asyncio.to_thread(poll_until, lambda: pat.search(cluster.broker.log_text()), timeout_s, 0.1)
    assert m, f"the broker never logged releasing the locks of {client_id} at its connection's close"
    return int(m.group(1))


async def send_and_consume(cluster, g, *sends) -> set[str]:
    """Each (topic, counts, prefix) of `sends` through `send_per_queue`, awaited until the C++
    consumers delivered every one; their bodies."""
    bodies = set()
    async with Producer(uniq("CppOrdAdmPG"), cluster.namesrv_addr, instance_name=uniq("ordadm")) as prod:
        for topic, counts, prefix in sends:
            bodies |= await send_per_queue(prod, topic, counts, prefix)
    await g.events.until(lambda s: bodies <= {m["body"] for m in msgs(s)})
    return bodies


async def survivor_takes_over(cluster, pair, stays: str, timeout_s: float) -> None:
    """`stays`, the group's only member now, locks every queue within timeout_s (the broker's
    locks of the other member must be gone: the 60 s expiry is far off), a third client id is
    refused them all, and PER_QUEUE messages sent to each queue now reach it once each, in
    send (and offset) order."""
    _, held, _ = await until_locked(cluster, pair.group, pair.topic, [stays], timeout_s=timeout_s)
    assert held == {stays: set(range(QUEUES))}, held
    assert await probe_lock(pair.inst, cluster, pair.group, pair.topic) == set()

    await send_and_consume(cluster, pair.g, (pair.topic, [PER_QUEUE] * QUEUES, "after"))
    per_queue = collections.defaultdict(list)
    for m in msgs(pair.g.events):
        head, q, i = m["body"].rsplit("-", 2)
        if head == "after":
            assert m["queue_id"] == int(q), m
            per_queue[int(q)].append((int(i), m["queue_offset"]))
    for q in range(QUEUES):
        got = per_queue[q]
        assert [i for i, _ in got] == list(range(PER_QUEUE)), (q, got)
        assert [o for _, o in got] == sorted({o for _, o in got}), (q, got)


@contextlib.asynccontextmanager
async def orderly_pair(agent, cluster, tmp_path, name: str):
    """Two C++ orderly consumers (adm0, adm1, `cpp_consumers`) of a new group on a new
    QUEUES-queue topic, entered once until_locked holds for both, and a ClientInstance for
    probe_lock. Yields .g, .inst, .topic, .group and until_locked's .status, .held, .counts.

    The group's retry topic is created first: the C++ client looks its route up at its start,
    before its first heartbeat creates it, and would take its queue only at its next
    rebalance (every 10 s). Once locked, a message to each queue of the topic and of the retry
    topic is sent and consumed: it ends the pulls the broker still holds for a member that
    gave a queue up at the start (the first to start takes every queue until the other
    joins); C++ 1.2.x, given such a queue again, blocks its rebalance thread (and its
    running-info answers, and its shutdown) until that pull returns, up to its 15 s suspend."""
    topic, group = uniq(f"CppOrdAdm{name}T"), uniq(f"CppOrdAdm{name}G")
    await create_topic(cluster, topic, QUEUES)
    await create_topic(cluster, retry_topic(group), 1)
    inst = ClientInstance(uniq("127.0.0.1@cpp-ord-adm"), cluster.namesrv_addr)
    try:
        async with cpp_consumers(agent, cluster, tmp_path, topic, group, orderly=True) as g:
            async with asyncio.timeout(30):
                status, held, counts = await until_locked(cluster, group, topic, g.ids.values())
                await send_and_consume(cluster, g, (topic, [1] * QUEUES, "wake"),
                                       (retry_topic(group), [1], "wakeretry"))
            yield SimpleNamespace(g=g, inst=inst, topic=topic, group=group, status=status, held=held,
                                  counts=counts)
    finally:
        await inst.close()


# -- 1. two members: disjoint locks over every queue -----------------------------------------

async def test_two_cpp_orderly_consumers_hold_disjoint_locks_that_refuse_a_third_client(agent, cluster, tmp_path):
    async with orderly_pair(agent, cluster, tmp_path, "Lock") as pair:
        async with asyncio.timeout(30):
            r, held, group, topic = pair.status, pair.held, pair.group, pair.topic
            # the average allocation: two queues each, every one locked by exactly one client
            assert sorted(len(qs) for qs in held.values()) == [2, 2], held
            assert r.stderr == "", r.stderr
            # Java's analyzeProcessQueue flags an orderly queue not locked; none is
            assert "can't lock for a while" not in r.stdout, r.stdout
            for cid, section in status_sections(r.stdout).items():
                props = dict(re.findall(r"^(PROP_\w+)\s+: (.*)$", section, re.M))
                assert props["PROP_CONSUMEORDERLY"] == "true", (cid, section)

            # the broker's table: a third client id of the group is refused every queue ...
            assert await probe_lock(pair.inst, cluster, group, topic) == set()
            # ... each held by a C++ member: the same client id gets them all in another group
            assert await probe_lock(pair.inst, cluster, uniq("CppOrdAdmOtherG"), topic) == set(range(QUEUES))
            # one client (-i) shows its own queues locked, the same as in the group's listing
            for cid, qs in held.items():
                r = await mqadmin("consumerStatus", "-n", cluster.namesrv_addr, "-g", group, "-i", cid)
                assert r.returncode == 0 and r.stderr == "", r.stderr
                detail = mq_detail(r.stdout, (topic,))
                assert {q for _, q in detail} == qs, (cid, r.stdout)
                assert all(pqi["locked"] == "true" for pqi in detail.values()), r.stdout


# -- 2. a member stops cleanly: its queues go to the survivor --------------------------------

async def test_cleanly_stopped_cpp_orderly_consumer_unlocks_and_the_survivor_takes_every_queue(
        agent, cluster, tmp_path):
    async with orderly_pair(agent, cluster, tmp_path, "Stop") as pair:
        async with asyncio.timeout(40):
            gone, stays = pair.g.ids["adm0"], pair.g.ids["adm1"]
            assert pair.held[gone] and pair.counts[gone] >= 2, (pair.held, pair.counts)

            await pair.g.stop("adm0")
            assert sum(e["event"] == "done" for e in pair.g.events) == 1, "adm0 did not stop cleanly"
            # Its shutdown's UNLOCK_BATCH_MQ freed all but the one queue C++ 1.2.x's unlockAll
            # leaves out; the connection's close released that one. A broker ignoring the
            # UNLOCK would release them all here.
            assert await released_at_close(cluster, gone, pair.group) == 1, (pair.counts, gone)

            await survivor_takes_over(cluster, pair, stays, timeout_s=15)


# -- 3. a member is killed: its connection's close releases its locks ------------------------

async def test_sigkilled_cpp_orderly_consumer_locks_are_released_when_its_connection_closes(
        agent, cluster, tmp_path):
    async with orderly_pair(agent, cluster, tmp_path, "Kill") as pair:
        async with asyncio.timeout(40):
            gone, stays = pair.g.ids["adm0"], pair.g.ids["adm1"]
            assert pair.held[gone], pair.held
            assert await probe_lock(pair.inst, cluster, pair.group, pair.topic) == set()

            killed = pair.g.procs["adm0"]
            killed.kill()                                   # SIGKILL: no UNLOCK_BATCH_MQ, no unregister
            await asyncio.to_thread(killed.wait, 10)
            t_kill = time.monotonic()
            # every lock it held (its topic queues, and the retry queue if it had it), at once
            assert await released_at_close(cluster, gone, pair.group) == pair.counts[gone], pair.counts

            await survivor_takes_over(cluster, pair, stays, timeout_s=20)
            assert time.monotonic() - t_kill < LOCK_MAX_LIVE_MS / 2000, "not the close: as slow as the expiry"
