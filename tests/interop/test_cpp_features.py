"""Features of the Apache C++ client (rocketmq==0.4.4 wheel, C++ client 1.2.x) not covered
elsewhere, against real mqnamesrv/mqbroker processes:

* BROADCASTING push consumers: every member of the group gets every message once, and
  the broker keeps no offset for the group (the C++ client keeps them in a local file);
* delay levels set by the C++ producer (set_delay_time_level), on a broker with short
  levels: delivered to the original topic and queue, never before the level's delay
  without DELAY and with WAIT=false (the rule in docs/broker.md; Java 4.x's bytes still
  carry the producer's DELAY and WAIT because messageTimeup encodes the properties before
  clearing them, a leak upstream treats as a bug: apache/rocketmq#11037);
* tag subscriptions of the C++ push consumer ("TagA || TagB", also as the broker
  filters with the subscription the C++ heartbeat registered) and pull consumer ("TagC");
* send_orderly / send_oneway_orderly with a queue selector: each message is stored in
  the queue the selector returned, in send order.

Each test has its own topic and group; the C++ side runs in cpp_agent.py subprocesses.
"""
from __future__ import annotations

import asyncio
import collections
import pathlib
import time

import pytest
from pocketmq.client import (
    CONSUME_SUCCESS,
    Message,
    MessageQueue,
    Producer,
    PushConsumer,
)
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.message import decode_records
from pocketmq.remoting.client import RemotingClient

from tests.integration.test_client_cluster import (
    create_topic,
    drain_lite,
    uniq,
    wait_for,
)
from tests.support.daemons import Cluster
from tests.support.events import Sink, pump_json_lines

pytestmark = [pytest.mark.interop, pytest.mark.slow]

BROKER = "broker-a"
# 18 levels, as Java parses messageDelayLevel. Level 1 = 1 s, level 2 = 2 s; level 3 and up
# are long, so a broker that used the next level would miss the upper bound below.
DELAYS_S = [1, 2] + [10] * 16
LEVELS = "--messageDelayLevel=" + " ".join(f"{d}s" for d in DELAYS_S)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One nameserver + broker for the module, with the short delay levels above."""
    c = Cluster(str(tmp_path_factory.mktemp("cpp-features")), broker_args=[LEVELS])
    c.start()
    yield c
    c.stop()


def msgs(events) -> list[dict]:
    return [e for e in events if e["event"] == "msg"]


def sent(events) -> list[dict]:
    return [e for e in events if e["event"] == "sent"]


async def stop_agents(procs, stop_file: str) -> None:
    await asyncio.to_thread(pathlib.Path(stop_file).touch)
    for p in procs:
        try:
            await asyncio.to_thread(p.wait, 30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


# -- 1. broadcasting ------------------------------------------------------------------------

async def test_cpp_broadcasting_consumers_each_receive_every_message_once(agent, cluster, tmp_path):
    topic, group = uniq("CppBcT"), uniq("CppBcG")
    n, members = 40, 3
    await create_topic(cluster, topic, 4)
    mqs = [MessageQueue(topic, BROKER, q) for q in range(4)]
    stop = str(tmp_path / "stop")
    sinks = [Sink() for _ in range(members)]
    procs, readers = [], []
    inst = ClientInstance("127.0.0.1@cpp-bc-check", cluster.namesrv_addr)
    try:
        async with asyncio.timeout(100):
            for i in range(members):
                p = agent.start("push", "--ns", cluster.namesrv_addr, "--group", group, "--topic", topic,
                                "--model", "broadcasting", "--instance", f"bc{i}", "--stop-file", stop,
                                "--seconds", "120")
                procs.append(p)
                readers.append(pump_json_lines(p, sinks[i]))
            for s in sinks:
                await s.until(lambda s: any(e["event"] == "started" for e in s))

            def warm_queues(s):
                return {m["queue_id"] for m in msgs(s) if m["body"].startswith("warm-")}

            async with Producer("CppBcPG", cluster.namesrv_addr, instance_name=uniq("bcp")) as prod:
                # A broadcasting member starts a queue at its max offset when it takes the queue
                # (CONSUME_FROM_LAST_OFFSET, no local offset yet): warm every queue up until
                # every member has received something from each, then it is surely pulling.
                for rnd in range(60):
                    for mq in mqs:
                        await prod.send(Message(topic, f"warm-{rnd}-{mq.queue_id}".encode()), queue=mq)
                    try:
                        async with asyncio.timeout(0.5):
                            for s in sinks:
                                await s.until(lambda s: len(warm_queues(s)) == 4)
                        break
                    except TimeoutError:
                        continue
                else:
                    raise AssertionError(f"members never took all queues: {[warm_queues(s) for s in sinks]}")

                ids = await inst.api.consumer_id_list(cluster.broker_addr, group)
                assert sorted(i.rsplit("@", 1)[1] for i in ids) == [f"bc{i}" for i in range(members)], ids

                results = [await prod.send(Message(topic, f"bc-{i}".encode(), tags="TagBc")) for i in range(n)]
                assert {r.queue.queue_id for r in results} == {0, 1, 2, 3}
                want = {f"bc-{i}" for i in range(n)}
                for s in sinks:
                    await s.until(lambda s: want <= {m["body"] for m in msgs(s)})
                # One fence per queue after the batch: a member that saw every fence has been
                # handed everything the broker gave it before them (duplicates included).
                for mq in mqs:
                    await prod.send(Message(topic, f"fence-{mq.queue_id}".encode()), queue=mq)
                fences = {f"fence-{q}" for q in range(4)}
                for s in sinks:
                    await s.until(lambda s: fences <= {m["body"] for m in msgs(s)})
            await stop_agents(procs, stop)
            for r in readers:
                r.join(5)
            # The C++ client keeps broadcasting offsets in a local file and sends no commit
            # flag / UPDATE_CONSUMER_OFFSET: the broker must store none for the group. (With
            # none stored, QUERY_CONSUMER_OFFSET answers 0 while the queue's first message is
            # still in memory, as Java does, else -1; a stored offset would be past the ~12
            # messages each queue got.)
            stored = [await inst.api.query_consumer_offset(cluster.broker_addr, group, mq) for mq in mqs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        await inst.close()
    by_id = {r.msg_id: r.queue.queue_id for r in results}
    for i, s in enumerate(sinks):
        assert [e for e in s if e["event"] == "done"], f"member bc{i} did not finish"
        got = msgs(s)
        real = [m for m in got if m["body"].startswith("bc-")]
        dups = [b for b, c in collections.Counter(m["body"] for m in got).items() if c > 1]
        assert not dups, f"member bc{i} got duplicates: {dups}"
        assert sorted(m["body"] for m in real) == sorted(f"bc-{j}" for j in range(n)), f"member bc{i}"
        for m in real:
            assert m["topic"] == topic and m["tags"] == "TagBc" and m["reconsume_times"] == 0
            assert by_id[m["props"]["UNIQ_KEY"]] == m["queue_id"]
        # within a queue, offsets never repeat (the fence bounds what it saw)
        per_q = collections.Counter((m["queue_id"], m["queue_offset"]) for m in got)
        assert max(per_q.values()) == 1, f"member bc{i} got an offset twice"
    assert all(o in (-1, 0) for o in stored), f"broker stored offsets for a broadcasting group: {stored}"


# -- 2. delay levels from the C++ producer ---------------------------------------------------

SLACK_S = 0.3          # the most a delivery may come before its level's delay (clock granularity)
LATE_S = 4.0           # generous: delivery within level delay + LATE_S (level 3 is 10 s)
PROMPT_S = 1.5         # an undelayed message arrives within this


@pytest.fixture(scope="module")
def delayed_run(agent, cluster):
    """The C++ producer sends 12 messages cycling delay levels 2, 0, 1 while our push
    consumer listens; returns (topic, sent events by idx, [(recv wall time, MessageExt)])."""
    topic, group = uniq("CppDelayT"), uniq("CppDelayG")

    async def run():
        await create_topic(cluster, topic, 4)
        got = Sink()

        async def listener(msg):
            got.append((time.time(), msg))
            return CONSUME_SUCCESS
        c = PushConsumer(group, cluster.namesrv_addr, listener=listener, consume_from_where="FIRST_OFFSET",
                         instance_name=uniq("delay"))
        c.subscribe(topic)
        try:
            async with asyncio.timeout(60):
                await c.start()
                await wait_for(lambda: len([m for m in c.pqs if m.topic == topic]) == 4, 20, "4 queues")
                ev = await asyncio.to_thread(agent.run, "produce", "--ns", cluster.namesrv_addr, "--topic", topic,
                                             "--mode", "sync", "--count", "12", "--prefix", "delay",
                                             "--delay-level", "2,0,1", "--group", uniq("CppDelayPG"))
                out = {e["idx"]: e for e in sent(ev)}
                assert len(out) == 12 and all(e["status"] == 0 for e in out.values()), ev
                await got.until(lambda s: len(s) >= 12)
                # Fences: a level-1 and a level-2 message per queue, sent now. Each level's
                # schedule queue is delivered in order, so a second delivery of anything
                # parked before would be stored before these.
                async with Producer("CppDelayFencePG", cluster.namesrv_addr, instance_name=uniq("fence")) as p:
                    for q in range(4):
                        for level in (1, 2):
                            await p.send(Message(topic, f"fence-{level}-{q}".encode(), delay_level=level),
                                         queue=MessageQueue(topic, BROKER, q))
                await got.until(lambda s: sum(m.body.startswith(b"fence-") for _, m in s) >= 8)
        finally:
            await c.close()
        return out, list(got)

    out, got = asyncio.run(run())
    fences = [m for _, m in got if m.body.startswith(b"fence-")]
    assert sorted(m.body for m in fences) == sorted(f"fence-{lv}-{q}".encode() for lv in (1, 2) for q in range(4))
    return topic, out, [(t, m) for t, m in got if not m.body.startswith(b"fence-")]


def test_cpp_delay_levels_are_delivered_to_the_original_topic_after_their_delay(delayed_run):
    topic, out, got = delayed_run
    bodies = [m.body.decode() for _, m in got]
    assert sorted(bodies) == sorted(f"delay-{i}" for i in range(12)), "lost or duplicated"
    for recv_t, m in got:
        i = int(m.body.decode().split("-")[1])
        e = out[i]
        level = e["level"]
        assert level == [2, 0, 1][i % 3]
        assert m.topic == topic and m.msg_id == e["msg_id"], (m.topic, m.msg_id, e)
        assert m.tags == "TagA" and m.keys == (f"key-{i}",)
        assert m.properties["idx"] == str(i) and m.properties["origin"] == "cpp"
        assert m.reconsume_times == 0
        if level:
            delay = DELAYS_S[level - 1]
            early = recv_t - e["t0"]
            assert early >= delay - SLACK_S, f"level {level} message {i} delivered after {early:.3f}s"
            assert recv_t - e["t1"] <= delay + LATE_S, f"level {level} message {i} late: {recv_t - e['t1']:.3f}s"
            # the delivered copy: stored again in the real topic and queue the delay parked
            assert m.properties["REAL_TOPIC"] == topic and m.properties["REAL_QID"] == str(m.queue_id)
            assert m.store_timestamp - m.born_timestamp >= delay * 1000 - SLACK_S * 1000, \
                (m.store_timestamp, m.born_timestamp)
        else:
            assert recv_t - e["t1"] < PROMPT_S, f"undelayed message {i} took {recv_t - e['t1']:.3f}s"
            assert "DELAY" not in m.properties and "REAL_TOPIC" not in m.properties
    # per queue, offsets distinct (each delivery stored once)
    assert len({(m.queue_id, m.queue_offset) for _, m in got}) == 12


def test_cpp_delayed_message_is_delivered_without_its_delay_level(delayed_run):
    """The delivered copy does not carry DELAY (a consumer forwarding it would park it
    again) and is stored with WAIT=false, as the schedule service documents; a Java 4.x
    broker leaks the producer's DELAY and WAIT into that copy (apache/rocketmq#11037)."""
    _, out, got = delayed_run
    delayed = 0
    for _, m in got:
        i = int(m.body.decode().split("-")[1])
        if out[i]["level"]:
            delayed += 1
            assert "DELAY" not in m.properties, (i, dict(m.properties))
            assert m.properties.get("WAIT") == "false", (i, dict(m.properties))
    assert delayed == 8


# -- 3. tag filtering for C++ consumers ------------------------------------------------------

TAG_PLAN = ["TagA"] * 7 + ["TagB"] * 5 + ["TagC"] * 9 + [None] * 3   # None: no tag at all


def registered_subscription_pull(group: str, topic: str, queue_id: int, offset: int) -> RemotingCommand:
    """PULL_MESSAGE without the SUBSCRIPTION flag: the broker filters with the subscription
    the group's consumer registered in its heartbeat."""
    return RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields={
        "consumerGroup": group, "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
        "maxMsgNums": "64", "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0",
        "subVersion": "0"})


async def test_cpp_consumers_receive_exactly_the_tags_they_subscribed(agent, cluster, tmp_path):
    topic, push_group, pull_group = uniq("CppTagT"), uniq("CppTagPushG"), uniq("CppTagPullG")
    await create_topic(cluster, topic, 4)
    plan = [TAG_PLAN[(i * 5) % len(TAG_PLAN)] for i in range(len(TAG_PLAN))]    # interleaved
    assert sorted(plan, key=str) == sorted(TAG_PLAN, key=str)
    async with Producer("CppTagPG", cluster.namesrv_addr, instance_name=uniq("tagp")) as prod:
        for i, tag in enumerate(plan):
            await prod.send(Message(topic, f"t{i}-{tag}".encode(), tags=tag))
    want_ab = sorted(f"t{i}-{t}" for i, t in enumerate(plan) if t in ("TagA", "TagB"))
    want_c = sorted(f"t{i}-{t}" for i, t in enumerate(plan) if t == "TagC")
    assert (len(want_ab), len(want_c)) == (12, 9)

    stop = str(tmp_path / "stop")
    events = Sink()
    proc = agent.start("push", "--ns", cluster.namesrv_addr, "--group", push_group, "--topic", topic,
                       "--expr", "TagA || TagB", "--stop-file", stop, "--seconds", "60")
    reader = pump_json_lines(proc, events)
    broker_side = []
    c = RemotingClient()
    try:
        async with asyncio.timeout(50):
            await events.until(lambda s: len(msgs(s)) >= len(want_ab))
            # While the C++ member is online, the broker filters a pull of its group that
            # carries no expression with what the C++ heartbeat registered.
            for q in range(4):
                offset = 0
                while True:
                    r = await c.invoke(cluster.broker_addr, registered_subscription_pull(push_group, topic, q, offset),
                                       5)
                    assert r.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND,
                                      ResponseCode.PULL_RETRY_IMMEDIATELY), (r.code, r.remark)
                    if r.code == ResponseCode.SUCCESS:
                        broker_side.extend(decode_records(r.body))
                    nxt = int(r.ext_fields["nextBeginOffset"])
                    if nxt >= int(r.ext_fields["maxOffset"]) or nxt <= offset:
                        break
                    offset = nxt
            # fence: a TagA message sent now; once it is in, everything pulled before it is too
            async with Producer("CppTagPG2", cluster.namesrv_addr, instance_name=uniq("tagp2")) as prod:
                for q in range(4):
                    await prod.send(Message(topic, f"fence-{q}".encode(), tags="TagA"),
                                    queue=MessageQueue(topic, BROKER, q))
            await events.until(lambda s: {f"fence-{q}" for q in range(4)} <= {m["body"] for m in msgs(s)})
            await stop_agents([proc], stop)
            reader.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await c.close()
    got = [m for m in msgs(events) if not m["body"].startswith("fence-")]
    assert sorted(m["body"] for m in got) == want_ab, "TagC/untagged leaked, something missing, or a duplicate"
    assert all(m["tags"] == m["body"].split("-", 1)[1] for m in got)
    assert sorted(m.body.decode() for m in broker_side) == want_ab, "broker-side filter of the registered subscription"

    ev = await asyncio.to_thread(agent.run, "pull", "--ns", cluster.namesrv_addr, "--group", pull_group,
                                 "--topic", topic, "--expr", "TagC", "--expect", str(len(want_c)),
                                 "--seconds", "30", timeout=60)
    pulled = msgs(ev)
    assert sorted(m["body"] for m in pulled) == want_c
    assert {m["tags"] for m in pulled} == {"TagC"} and all(m["topic"] == topic for m in pulled)


# -- 4. orderly sends with a queue selector -------------------------------------------------

@pytest.mark.parametrize("mode,selector,orderly_arg", [
    ("orderly", "reverse", "triangle"),
    ("oneway_orderly", "hash", "triangle"),
])
async def test_cpp_orderly_sends_land_in_the_selected_queue_in_send_order(agent, cluster, mode, selector,
                                                                          orderly_arg):
    topic, group = uniq(f"CppSel{selector}T"), uniq(f"CppSel{selector}G")
    n = 30
    await create_topic(cluster, topic, 4)
    ev = await asyncio.to_thread(agent.run, "produce", "--ns", cluster.namesrv_addr, "--topic", topic,
                                 "--mode", mode, "--count", str(n), "--prefix", "sel", "--selector", selector,
                                 "--orderly-arg", orderly_arg, "--group", uniq("CppSelPG"), timeout=60)
    out = {e["idx"]: e for e in sent(ev)}
    assert sorted(out) == list(range(n)), ev
    for i, e in out.items():
        arg = i * (i + 1) // 2
        assert e["arg"] == arg and e["mq_size"] == 4
        assert e["queue"] == (arg % 4 if selector == "hash" else 3 - arg % 4)
        if mode == "orderly":
            assert e["status"] == 0
    expected_q = {i: e["queue"] for i, e in out.items()}
    assert set(expected_q.values()) == {0, 1, 2, 3}         # the plan uses every queue

    async with asyncio.timeout(40):
        got = await drain_lite(cluster.namesrv_addr, group, [MessageQueue(topic, BROKER, q) for q in range(4)], n)
    assert len(got) == n, f"{len(got)} of {n}: lost or duplicated"
    by_idx = {}
    for m in got:
        i = int(m.properties["idx"])
        assert i not in by_idx, f"message {i} twice"
        by_idx[i] = m
        assert m.queue_id == expected_q[i], f"message {i} in queue {m.queue_id}, selector chose {expected_q[i]}"
        assert m.body == f"sel-{i}".encode() and m.topic == topic
    for q in range(4):
        in_q = sorted((m for m in got if m.queue_id == q), key=lambda m: m.queue_offset)
        # queue offsets 0.. in send order
        assert [m.queue_offset for m in in_q] == list(range(len(in_q)))
        assert [int(m.properties["idx"]) for m in in_q] == sorted(i for i, qq in expected_q.items() if qq == q)
    if mode == "orderly":
        for i, e in out.items():
            # SendResult.offset is the queue offset, msg_id the UNIQ_KEY
            assert (by_idx[i].queue_offset, by_idx[i].msg_id) == (e["offset"], e["msg_id"]), (i, e)
