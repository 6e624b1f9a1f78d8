"""A mixed orderly group: our PushConsumer(orderly=True) and the Apache C++ orderly push
consumer (rocketmq==0.4.4, `PushConsumer(group, orderly=True)`) on one topic. Both lock
their queues on the broker (LOCK_BATCH_MQ); they must split the queues disjointly and
keep every sharding key's messages in send order."""
from __future__ import annotations

import asyncio
import collections
import os

import pytest

from pocketmq.client import CONSUME_SUCCESS, Message, Producer, PushConsumer
from pocketmq.client.instance import ClientInstance
from tests.integration.test_client_cluster import create_topic, uniq, wait_for
from tests.support.events import Sink, pump_json_lines

pytestmark = [pytest.mark.interop, pytest.mark.slow]

KEYS = [f"key{i}" for i in range(8)]
PER_KEY = 20


async def test_mixed_orderly_group_splits_queues_disjointly_and_keeps_key_order(agent, cluster, tmp_path):
    topic, group = uniq("CppOrdT"), uniq("CppOrdG")
    await create_topic(cluster, topic, 4)
    ours = Sink()

    async def listener(msg):
        k, i = msg.body.decode().split(":")
        ours.append((k, int(i), msg.queue_id, msg.queue_offset))
        return CONSUME_SUCCESS

    c = PushConsumer(group, cluster.namesrv_addr, listener=listener, orderly=True, instance_name="py1",
                     consume_from_where="FIRST_OFFSET", handover_delay_ms=100)
    c.subscribe(topic)
    stop = str(tmp_path / "stop")
    cpp = Sink()
    proc = None
    inst = ClientInstance("127.0.0.1@cpp-orderly-check", cluster.namesrv_addr)
    try:
        async with asyncio.timeout(150):
            await c.start()
            await wait_for(lambda: len([m for m in c.pqs if m.topic == topic]) == 4, 20, "our consumer on 4 queues")
            proc = agent.start("push", "--ns", cluster.namesrv_addr, "--group", group, "--topic", topic,
                               "--orderly", "--instance", "cpp1", "--stop-file", stop, "--seconds", "140")
            reader = pump_json_lines(proc, cpp)
            await cpp.until(lambda s: any(e["event"] == "started" for e in s))
            # our member gives two queues up (commit, unlock); the C++ member locks them
            await wait_for(lambda: len([m for m in c.pqs if m.topic == topic]) == 2, 40, "our consumer on 2 queues")
            ids = await inst.api.consumer_id_list(cluster.broker_addr, group)
            assert len(ids) == 2 and any(i.endswith("@cpp1") for i in ids), ids
            mine = {m.queue_id for m in c.pqs if m.topic == topic}

            async with Producer("CppOrdPG", cluster.namesrv_addr, instance_name="cppord") as p:
                for i in range(PER_KEY):
                    for k in KEYS:
                        await p.send(Message(topic, f"{k}:{i}".encode(), keys=k), sharding_key=k)

            def cpp_msgs(s):
                return [e for e in s if e["event"] == "msg"]
            total = len(KEYS) * PER_KEY
            await cpp.until(lambda s: len(cpp_msgs(s)) + len(ours) >= total)
            open(stop, "w").close()
            await asyncio.to_thread(proc.wait, 30)
            reader.join(5)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        await c.close()
        await inst.close()
        if os.path.exists(stop):
            os.remove(stop)
    theirs = [(e["body"].split(":")[0], int(e["body"].split(":")[1]), e["queue_id"], e["queue_offset"])
              for e in cpp_msgs(cpp)]
    assert len(ours) + len(theirs) == total
    our_queues = {q for _, _, q, _ in ours}
    their_queues = {q for _, _, q, _ in theirs}
    # disjoint: each queue consumed by exactly one member, two each
    assert our_queues == mine and their_queues == {0, 1, 2, 3} - mine, (our_queues, their_queues)
    assert len({(q, o) for _, _, q, o in ours + theirs}) == total      # nothing twice
    seqs = collections.defaultdict(list)
    for k, i, _, _ in ours + theirs:
        seqs[k].append(i)
    for name, got in (("ours", ours), ("cpp", theirs)):
        per = collections.defaultdict(list)
        for k, i, _, _ in got:
            per[k].append(i)
        for k, v in per.items():
            assert v == list(range(PER_KEY)), (name, k, v)
    assert sorted(seqs) == sorted(KEYS)
