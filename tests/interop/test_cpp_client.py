"""The Apache C++ client (rocketmq==0.4.4) against real mqnamesrv/mqbroker processes."""
import asyncio
import json
import time

import pytest

from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient

pytestmark = pytest.mark.interop


def create_topic(broker_addr: str, topic: str, queues: int) -> None:
    async def go():
        c = RemotingClient()
        try:
            r = await c.invoke(broker_addr, RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields={
                "topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues),
                "writeQueueNums": str(queues), "perm": "6", "topicFilterType": "SINGLE_TAG"}), 5)
            assert r.code == ResponseCode.SUCCESS, r.remark
        finally:
            await c.close()
    asyncio.run(go())
    time.sleep(0.3)  # the broker re-registers with the nameserver after a topic change (debounced 50 ms)


def sent(events):
    return [e for e in events if e["event"] == "sent"]


def msgs(events):
    return [e for e in events if e["event"] == "msg"]


MODES = [("sync", 6), ("async", 6), ("oneway", 6), ("orderly", 6), ("batch", 12)]


@pytest.fixture(scope="module")
def produced(cluster, agent):
    """Every send mode to a pre-created topic and to an auto-created one."""
    create_topic(cluster.broker_addr, "CppPre", 4)
    out = {}
    for topic in ("CppPre", "CppAuto"):
        for mode, n in MODES:
            ev = agent.run("produce", "--ns", cluster.namesrv_addr, "--topic", topic, "--mode", mode,
                           "--count", str(n), "--prefix", f"{topic}-{mode}", "--group", f"pg_{mode}")
            if mode == "batch":
                assert sum(len(e["idx"]) for e in sent(ev)) == n
            else:
                assert len(sent(ev)) == n, ev
            assert all(e.get("status", 0) == 0 for e in sent(ev))
            out[(topic, mode)] = n
    return out


def expected_bodies(topic):
    return {f"{topic}-{mode}-{i}" for mode, n in MODES for i in range(n)}


@pytest.mark.parametrize("topic", ["CppPre", "CppAuto"])
def test_push_consumer_receives_every_message_exactly(cluster, agent, produced, topic):
    total = sum(n for _, n in MODES)
    ev = agent.run("push", "--ns", cluster.namesrv_addr, "--group", f"cg_{topic}", "--topic", topic,
                   "--expect", str(total), "--seconds", "60", "--linger", "3")
    got = msgs(ev)
    bodies = [m["body"] for m in got]
    assert sorted(bodies) == sorted(expected_bodies(topic)), f"missing {expected_bodies(topic) - set(bodies)}"
    for m in got:
        idx = m["body"].rsplit("-", 1)[1]
        assert m["tags"] == "TagA"
        assert m["keys"] == f"key-{idx}"
        assert m["props"]["idx"] == idx and m["props"]["origin"] == "cpp"
        assert m["topic"] == topic


def test_restarted_consumer_gets_nothing_twice(cluster, agent, produced):
    topic, group = "CppPre", "cg_restart"
    total = sum(n for _, n in MODES)
    first = msgs(agent.run("push", "--ns", cluster.namesrv_addr, "--group", group, "--topic", topic,
                           "--expect", str(total), "--seconds", "60", "--linger", "6"))
    assert len(first) == total
    agent.run("produce", "--ns", cluster.namesrv_addr, "--topic", topic, "--mode", "sync", "--count", "5",
              "--prefix", "after-restart")
    second = msgs(agent.run("push", "--ns", cluster.namesrv_addr, "--group", group, "--topic", topic,
                            "--expect", "5", "--seconds", "40", "--linger", "4"))
    assert sorted(m["body"] for m in second) == [f"after-restart-{i}" for i in range(5)]


def _read_events(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.startswith("{")]
    except FileNotFoundError:
        return []


def test_two_push_consumers_split_queues(cluster, agent, tmp_path):
    topic, group = "CppSplit", "cg_split"
    create_topic(cluster.broker_addr, topic, 8)
    stop = str(tmp_path / "stop")
    outs = [str(tmp_path / f"c{i}.jsonl") for i in range(2)]
    procs = [agent.start("push", "--ns", cluster.namesrv_addr, "--group", group, "--topic", topic,
                         "--instance", f"inst{i}", "--seconds", "120", "--stop-file", stop, out_path=outs[i])
             for i in range(2)]
    n = 80
    try:
        # Both members must have joined and rebalanced (C++ rebalances every 10 s and on notify).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
                any(e["event"] == "started" for e in _read_events(o)) for o in outs):
            time.sleep(0.2)
        time.sleep(11)
        agent.run("produce", "--ns", cluster.namesrv_addr, "--topic", topic, "--mode", "sync", "--count", str(n),
                  "--prefix", "split")
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            if sum(len(msgs(_read_events(o))) for o in outs) >= n:
                break
            time.sleep(0.3)
        time.sleep(2)  # anything extra (a duplicate) would show up now
    finally:
        open(stop, "w").close()
        for p in procs:
            p.communicate(timeout=30)
    per = [msgs(_read_events(o)) for o in outs]
    bodies = [m["body"] for lst in per for m in lst]
    assert sorted(bodies) == sorted(f"split-{i}" for i in range(n)), "duplicates or losses"
    queues = [{m["queue_id"] for m in lst} for lst in per]
    assert queues[0] and queues[1], "one consumer got no queue"
    assert not (queues[0] & queues[1]), f"queues not disjoint: {queues}"


def test_pull_consumer_reads_all(cluster, agent, produced):
    total = sum(n for _, n in MODES)
    ev = agent.run("pull", "--ns", cluster.namesrv_addr, "--group", "cpp_pull", "--topic", "CppAuto",
                   "--expect", str(total), "--seconds", "30")
    assert sorted(m["body"] for m in msgs(ev)) == sorted(expected_bodies("CppAuto"))


def test_sigkill_keeps_acknowledged_messages_under_sync_flush(cluster, agent, tmp_path):
    """Acknowledged SYNC_FLUSH sends survive kill -9; a consumer running across the kill carries on."""
    topic = "CppKill"
    create_topic(cluster.broker_addr, topic, 4)
    out = str(tmp_path / "consumer.jsonl")
    stop = str(tmp_path / "stop")
    consumer = agent.start("push", "--ns", cluster.namesrv_addr, "--group", "cg_kill", "--topic", topic,
                           "--seconds", "120", "--stop-file", stop, out_path=out)
    try:
        ev = agent.run("produce", "--ns", cluster.namesrv_addr, "--topic", topic, "--mode", "sync",
                       "--count", "30", "--prefix", "kill")
        acked = {f"kill-{e['idx']}" for e in sent(ev) if e["status"] == 0}
        assert len(acked) == 30
        cluster.restart_broker(kill=True)
        # Producers carry on after the restart too.
        ev = agent.run("produce", "--ns", cluster.namesrv_addr, "--topic", topic, "--mode", "sync",
                       "--count", "10", "--prefix", "after-kill")
        acked |= {f"after-kill-{e['idx']}" for e in sent(ev) if e["status"] == 0}
        assert len(acked) == 40
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if acked <= {m["body"] for m in msgs(_read_events(out))}:
                break
            time.sleep(0.5)
    finally:
        open(stop, "w").close()
        consumer.communicate(timeout=30)
    got = {m["body"] for m in msgs(_read_events(out))}
    assert acked <= got, f"lost after kill -9: {sorted(acked - got)}"


def test_large_batch_compressed_by_cpp_is_split_into_messages(cluster, agent):
    """C++ 1.2.x zlib-compresses a whole batch body over 4 KiB; each element must come out intact."""
    topic = "CppBigBatch"
    ev = agent.run("produce", "--ns", cluster.namesrv_addr, "--topic", topic, "--mode", "batch", "--count", "32",
                   "--batch-size", "16", "--size", "700", "--prefix", "big")
    assert sum(len(e["idx"]) for e in sent(ev)) == 32 and all(e["status"] == 0 for e in sent(ev))
    got = msgs(agent.run("push", "--ns", cluster.namesrv_addr, "--group", "cg_big", "--topic", topic,
                         "--expect", "32", "--seconds", "40", "--linger", "2"))
    assert sorted(m["body"] for m in got) == sorted(f"big-{i}".ljust(700, ".") for i in range(32))
    assert all(m["keys"] == f"key-{m['body'].split('-')[1].rstrip('.')}" for m in got)
