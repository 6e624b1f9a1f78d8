"""Message bodies between the Apache C++ client (rocketmq==0.4.4, C++ client 1.2.x) and our
client through real mqnamesrv/mqbroker processes: compressed bodies both ways, the broker's
maxMessageSize, and the C++ push consumer's consumeMessageBatchMaxSize.

What the clients do (rocketmq-client-cpp 1.2.x DefaultMQProducer, client/producer.py):

* both zlib-compress a single message's body of 4096 bytes or more (C++'s
  compressMsgBodyOverHowmuch, our compress_over_bytes) and set sysFlag COMPRESSED; C++ at
  its compress_level (default 5; the level shows in the zlib header's FLEVEL bits), ours at
  level 5. The broker stores the body as sent, flag included; consumers inflate it;
* C++ refuses a body over its own max_message_size (default 128 KiB) before sending; a
  send the broker refuses is tried on the next queue, five attempts in all, then raised
  as "No route info of this topic" (the agent reports it as an `error` event);
* the broker's maxMessageSize bounds the body as sent (compressed if it is), as Java
  4.9.4+'s store does (MessageExtEncoder: bodyLength > maxMessageSize -> MESSAGE_ILLEGAL;
  up to 4.9.3 it bounded the whole record, and LIMIT_PLAN stays clear of that difference):
  a body far over the limit that compresses under it is accepted;
* consumeMessageBatchMaxSize is client-side only: C++ 1.2.x always pulls 32 (maxMsgNums),
  its concurrent service hands each pulled batch whole to the C API (which calls back one
  message at a time) and only its orderly service takes batch-max messages at a time;
  nothing of it reaches the broker.

The C API hands a received body over as a C string (cut at its first NUL), so bodies sent
to C++ consumers are NUL-free text; the C++ producer sends binary bodies (NULs, non-UTF-8
bytes) with SetByteMessageBody. Bodies are cpp_agent.make_body(prefix, i, size, kind):
every one different, so a body inflated from the wrong record or cut short cannot match.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import zlib

import pytest
from pocketmq.client import Message, MessageQueue, Producer
from pocketmq.client.errors import MessageIllegalError
from pocketmq.protocol.codes import ResponseCode
from pocketmq.protocol.message import MessageSysFlag, decode_records
from pocketmq.remoting.client import RemotingClient

from tests.integration.test_broker import pull_cmd
from tests.integration.test_client_cluster import create_topic, drain_lite, uniq
from tests.interop.cpp_agent import make_body
from tests.interop.test_cpp_features import msgs, sent, stop_agents
from tests.support.daemons import Cluster
from tests.support.events import Sink, pump_json_lines

pytestmark = [pytest.mark.interop, pytest.mark.slow]

BROKER = "broker-a"
MAX_MESSAGE_SIZE = 64 * 1024
COMPRESS_OVER = 4096
COMPRESSED = MessageSysFlag.COMPRESSED_FLAG
ZLIB_LEVEL_5, ZLIB_LEVEL_9 = b"\x78\x5e", b"\x78\xda"     # zlib headers (FLEVEL 1 and 3)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One nameserver + broker for the module, with a 64 KiB maxMessageSize."""
    c = Cluster(str(tmp_path_factory.mktemp("cpp-bodies")), broker_args=[f"--maxMessageSize={MAX_MESSAGE_SIZE}"])
    c.start()
    yield c
    c.stop()


async def stored_records(cluster, topic: str, queues: int = 4) -> list:
    """Every record of `topic` as stored (bodies not inflated), read up to each queue's max
    offset: after the sends were answered, this is everything the broker kept."""
    c = RemotingClient()
    out = []
    try:
        for q in range(queues):
            offset = 0
            while True:
                r = await c.invoke(cluster.broker_addr, pull_cmd(topic, q, offset, group="body-inspector"), 5)
                if r.code == ResponseCode.SUCCESS:
                    out.extend(decode_records(r.body, decompress=False))
                nxt = int(r.ext_fields["nextBeginOffset"])
                if nxt >= int(r.ext_fields["maxOffset"]) or nxt <= offset:
                    break
                offset = nxt
    finally:
        await c.close()
    return out


@contextlib.asynccontextmanager
async def cpp_push(agent, cluster, stop: str, *args: str):
    """A C++ push consumer (cpp_agent.py push ... args) whose events go to the Sink yielded;
    stopped through its stop file when the block ends."""
    events = Sink()
    proc = agent.start("push", "--ns", cluster.namesrv_addr, *args, "--stop-file", stop, "--seconds", "60")
    reader = pump_json_lines(proc, events)
    try:
        yield events
    finally:
        await stop_agents([proc], stop)
        reader.join(5)


def check_stored(records, expected: dict[int, bytes], zlib_header: bytes) -> None:
    """Each record holds its message's body, compressed (flag set, zlib at the producer's
    level) exactly when the body is 4096 bytes or more, and never over the broker's limit."""
    assert sorted(int(r.properties["idx"]) for r in records) == sorted(expected)
    for r in records:
        want = expected[int(r.properties["idx"])]
        assert len(r.body) <= MAX_MESSAGE_SIZE
        if len(want) >= COMPRESS_OVER:
            assert r.sys_flag & COMPRESSED, (len(want), r.sys_flag)
            assert r.body[:2] == zlib_header and zlib.decompress(r.body) == want, len(want)
        else:
            assert not r.sys_flag & COMPRESSED and r.body == want, (len(want), r.sys_flag)


# -- 1. compressed by the C++ producer, read by ours -----------------------------------------

# sizes and kinds of message i (i % 12): both sides of the 4096 threshold, binary bodies
# with NULs, an incompressible one, and a 300 kB text that compresses far under the limit
CPP_SIZES = [100, 4095, 4096, 4096, 5000, 20000, 60000, 60000, 300000, 64, 8192, 30000]
CPP_KINDS = ["text", "text", "text", "binary", "binary", "text", "text", "binary", "text", "binary", "binary",
             "random"]


async def test_cpp_compressed_bodies_reach_our_consumer_intact(agent, cluster):
    topic, group = uniq("CppZipT"), uniq("CppZipG")
    n = 2 * len(CPP_SIZES)
    await create_topic(cluster, topic, 4)
    ev = await asyncio.to_thread(agent.run, "produce", "--ns", cluster.namesrv_addr, "--topic", topic,
                                 "--count", str(n), "--prefix", "zip", "--sizes", ",".join(map(str, CPP_SIZES)),
                                 "--body", ",".join(CPP_KINDS), "--compress-level", "9",
                                 "--max-message-size", str(1 << 20), "--group", uniq("CppZipPG"), timeout=60)
    out = {e["idx"]: e for e in sent(ev)}
    assert sorted(out) == list(range(n)) and all(e["status"] == 0 for e in out.values()), ev
    expected = {i: make_body("zip", i, CPP_SIZES[i % 12], CPP_KINDS[i % 12]) for i in range(n)}
    assert all(out[i]["sha256"] == hashlib.sha256(b).hexdigest() for i, b in expected.items())
    assert len(set(expected.values())) == n

    # as stored: compressed by C++ at level 9 exactly for the bodies of 4096 bytes or more
    check_stored(await stored_records(cluster, topic), expected, ZLIB_LEVEL_9)

    async with asyncio.timeout(40):
        got = await drain_lite(cluster.namesrv_addr, group, [MessageQueue(topic, BROKER, q) for q in range(4)], n)
    assert len(got) == n, f"{len(got)} of {n}: lost or duplicated"
    seen = set()
    for m in got:
        i = int(m.properties["idx"])
        assert i not in seen, f"message {i} twice"
        seen.add(i)
        assert m.body == expected[i], f"message {i} ({CPP_SIZES[i % 12]} B {CPP_KINDS[i % 12]}) differs"
        assert bool(m.sys_flag & COMPRESSED) == (len(expected[i]) >= COMPRESS_OVER)
        assert m.topic == topic and m.tags == "TagA" and m.keys == (f"key-{i}",)
        assert m.properties["origin"] == "cpp" and m.msg_id == out[i]["msg_id"]
        assert (m.queue_offset, m.reconsume_times) == (out[i]["offset"], 0)


# -- 2. compressed by our producer, read by C++ -----------------------------------------------

PY_SIZES = [100, 4095, 4096, 5000, 20000, 60000, 300000, 8192]


async def test_our_compressed_bodies_reach_cpp_push_and_pull_consumers_intact(agent, cluster, tmp_path):
    topic, push_group, pull_group = uniq("PyZipT"), uniq("PyZipPushG"), uniq("PyZipPullG")
    n = 2 * len(PY_SIZES)
    await create_topic(cluster, topic, 4)
    expected = {i: make_body("pyzip", i, PY_SIZES[i % len(PY_SIZES)], "text") for i in range(n)}
    ids = {}
    async with Producer(uniq("PyZipPG"), cluster.namesrv_addr, instance_name=uniq("pyzip")) as prod:
        for i, body in expected.items():
            r = await prod.send(Message(topic, body, tags="TagZ", keys=f"key-{i}", properties={"idx": str(i)}))
            ids[i] = r.msg_id
        # as stored: compressed by our client at level 5 exactly for the bodies of 4096 bytes or more
        check_stored(await stored_records(cluster, topic), expected, ZLIB_LEVEL_5)

        def check(events, group):
            got = [m for m in msgs(events) if not m["body"].startswith("fence-")]
            idx = sorted(int(m["props"]["idx"]) for m in got)
            assert idx == list(range(n)), f"{group}: lost or duplicated: {idx}"
            for m in got:
                i = int(m["props"]["idx"])
                body = expected[i]
                assert (m["len"], m["sha256"]) == (len(body), hashlib.sha256(body).hexdigest()), \
                    f"{group}: message {i} ({len(body)} B) differs: {m['len']} B, head {m['body']!r}"
                assert m["body"] == body[:40].decode()
                assert m["topic"] == topic and m["tags"] == "TagZ" and m["keys"] == f"key-{i}"
                assert m["props"]["UNIQ_KEY"] == ids[i] and m["reconsume_times"] == 0

        async with asyncio.timeout(50), cpp_push(agent, cluster, str(tmp_path / "stop"), "--group", push_group,
                                                 "--topic", topic, "--body-head", "40") as events:
            await events.until(lambda s: len(msgs(s)) >= n)
            # fences: one per queue, sent after the C++ member consumed everything; a
            # redelivery of anything before them would come before them
            for q in range(4):
                await prod.send(Message(topic, f"fence-{q}".encode(), properties={"idx": "-1"}),
                                queue=MessageQueue(topic, BROKER, q))
            await events.until(lambda s: {f"fence-{q}" for q in range(4)} <= {m["body"] for m in msgs(s)})
    check(events, "push")

    ev = await asyncio.to_thread(agent.run, "pull", "--ns", cluster.namesrv_addr, "--group", pull_group,
                                 "--topic", topic, "--body-head", "40", "--expect", str(n + 4), "--seconds", "30",
                                 timeout=60)
    check(ev, "pull")
    assert sorted(m["body"] for m in msgs(ev) if m["body"].startswith("fence-")) == [f"fence-{q}" for q in range(4)]


# -- 3. the broker's maxMessageSize -----------------------------------------------------------

# (size, kind, stored?) of message i. "random" does not compress: C++ sends it a little
# larger than it is. The 300 kB text compresses to ~45 kB: under the limit, accepted.
LIMIT_PLAN = [
    (100, "text", True),
    (MAX_MESSAGE_SIZE + 64, "random", False),      # just over the limit
    (MAX_MESSAGE_SIZE - 1024, "random", True),     # just under it, record too (~30 B of zlib framing)
    (100 * 1024, "random", False),
    (300000, "text", True),
    (200, "binary", True),
]


async def test_broker_refuses_a_body_over_its_max_message_size_and_goes_on(agent, cluster):
    topic = uniq("CppLimitT")
    await create_topic(cluster, topic, 4)
    ev = await asyncio.to_thread(agent.run, "produce", "--ns", cluster.namesrv_addr, "--topic", topic,
                                 "--count", str(len(LIMIT_PLAN)), "--prefix", "lim",
                                 "--sizes", ",".join(str(s) for s, _, _ in LIMIT_PLAN),
                                 "--body", ",".join(k for _, k, _ in LIMIT_PLAN),
                                 "--max-message-size", str(1 << 20), "--group", uniq("CppLimitPG"), timeout=60)
    ok = {i for i, (_, _, stored) in enumerate(LIMIT_PLAN) if stored}
    assert {e["idx"] for e in sent(ev) if e["status"] == 0} == ok, ev
    errors = [e for e in ev if e["event"] == "error"]
    assert sorted(e["idx"] for e in errors) == sorted(set(range(len(LIMIT_PLAN))) - ok), ev
    assert {e["error_type"] for e in errors} == {"ProducerSendSyncFailed"}, errors
    assert ev[-1]["event"] == "done"

    # Our producer (with a larger limit of its own) gets the broker's answer itself.
    big = make_body("limpy", 0, MAX_MESSAGE_SIZE + 64, "random")
    async with Producer(uniq("PyLimitPG"), cluster.namesrv_addr, instance_name=uniq("pylim"),
                        max_message_size_bytes=1 << 20) as prod:
        with pytest.raises(MessageIllegalError) as e:
            await prod.send(Message(topic, big, properties={"idx": "100"}))
        assert e.value.code == ResponseCode.MESSAGE_ILLEGAL
        r = await prod.send(Message(topic, b"after the refusal", properties={"idx": "101"}))
        assert r.ok

    # Everything the broker stored, up to each queue's max offset: the accepted ones only.
    expected = {i: make_body("lim", i, s, k) for i, (s, k, stored) in enumerate(LIMIT_PLAN) if stored}
    expected[101] = b"after the refusal"
    check_stored(await stored_records(cluster, topic), expected, ZLIB_LEVEL_5)


# -- 4. consumeMessageBatchMaxSize of the C++ push consumer -----------------------------------

@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "orderly"])
async def test_cpp_consumer_with_batch_max_8_gets_every_message_once(agent, cluster, tmp_path, orderly):
    kind = "Ord" if orderly else "Conc"
    topic, group = uniq(f"CppBatch{kind}T"), uniq(f"CppBatch{kind}G")
    n = 64
    await create_topic(cluster, topic, 4)
    mqs = [MessageQueue(topic, BROKER, q) for q in range(4)]
    async with Producer(uniq("CppBatchPG"), cluster.namesrv_addr, instance_name=uniq("batchp")) as prod:
        for i in range(n):
            await prod.send(Message(topic, f"b{i}".encode()), queue=mqs[i % 4])
        async with asyncio.timeout(50), cpp_push(agent, cluster, str(tmp_path / "stop"), "--group", group,
                                                 "--topic", topic, "--batch-max", "8",
                                                 *(["--orderly"] if orderly else [])) as events:
            await events.until(lambda s: len(msgs(s)) >= n)
            for mq in mqs:
                await prod.send(Message(topic, f"fence-{mq.queue_id}".encode()), queue=mq)
            await events.until(lambda s: {f"fence-{q}" for q in range(4)} <= {m["body"] for m in msgs(s)})
    got = [m for m in msgs(events) if not m["body"].startswith("fence-")]
    assert sorted(m["body"] for m in got) == sorted(f"b{i}" for i in range(n)), "lost or duplicated"
    for m in got:
        i = int(m["body"][1:])
        assert (m["queue_id"], m["queue_offset"]) == (i % 4, i // 4)
    if orderly:
        for q in range(4):
            offsets = [m["queue_offset"] for m in msgs(events) if m["queue_id"] == q]
            assert offsets == list(range(n // 4 + 1)), (q, offsets)     # in order, fence last
