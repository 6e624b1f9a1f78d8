"""POP consumption over the gRPC endpoint (ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue) driven by the REAL official RocketMQ 5.x Python client,
rocketmq-python-client 5.1.2, from its own venv in a subprocess (tests/support/rmq5.py):
SimpleConsumer and PushConsumer (concurrent and FIFO) against real nameserver and broker
processes; our own generated stubs for what a client should not do (forged handles, huge
batches, a stream nobody reads) and for the frames' exact fields.

The broker's delay levels are all 1 s here, so the PushConsumer's retry backoff (the group's
customized backoff = the delay levels) is 1 s per attempt and a dead-lettering takes seconds.
"""
from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

grpc = pytest.importorskip("grpc", reason="the grpc extra (pip install pocketmq[grpc]) is not installed")

from pocketmq.broker.proxy.pb import definition_pb2 as pb  # noqa: E402
from pocketmq.broker.proxy.pb import service_pb2 as spb  # noqa: E402
from pocketmq.broker.proxy.pb import service_pb2_grpc  # noqa: E402
from pocketmq.client import Message, Producer  # noqa: E402
from pocketmq.client.instance import ClientInstance  # noqa: E402
from pocketmq.protocol.bodies import MessageQueue, SubscriptionGroupConfig  # noqa: E402
from tests.integration.test_client_cluster import uniq  # noqa: E402
from tests.support.rmq5 import rmq5_python_fixture  # noqa: E402,F401 (the fixture rmq5_python)
from tests.support.rmq5 import proxy_cluster, run_driver  # noqa: E402
from tests.support.workloads import run_mqadmin  # noqa: E402

pytestmark = pytest.mark.slow
QUEUES = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = proxy_cluster(str(tmp_path_factory.mktemp("grpcpop")), (
        "--enablePropertyFilter=true", "--messageDelayLevel=" + " ".join(["1s"] * 18)))
    c.start()
    yield c
    c.stop()


async def driver(python, cluster, scenario, timeout_s=60, **args):
    return await asyncio.to_thread(run_driver, python, cluster.grpc_endpoint, scenario, timeout_s=timeout_s, **args)


async def send_remoting(cluster, topic, messages: list[Message]) -> None:
    producer = Producer(uniq("PG"), cluster.namesrv_addr)
    async with producer:
        for m in messages:
            await producer.send(m)


async def create_group(cluster, group, **fields) -> None:
    admin = ClientInstance(uniq("127.0.0.1@grpc-admin"), cluster.namesrv_addr)
    try:
        await admin.api.update_subscription_group(cluster.broker_addr, SubscriptionGroupConfig(group, **fields))
    finally:
        await admin.close()


async def offsets(cluster, group, topic) -> tuple[int, int]:
    """(sum of the group's committed offsets, sum of max offsets) over the topic's queues."""
    admin = ClientInstance(uniq("127.0.0.1@grpc-admin"), cluster.namesrv_addr)
    try:
        committed = maxes = 0
        for q in range(QUEUES):
            mq = MessageQueue(topic, "broker-a", q)
            committed += max(0, await admin.api.query_consumer_offset(cluster.broker_addr, group, mq))
            maxes += await admin.api.max_offset(cluster.broker_addr, mq)
        return committed, maxes
    finally:
        await admin.close()


async def max_offset(cluster, topic, queue=0) -> int:
    admin = ClientInstance(uniq("127.0.0.1@grpc-admin"), cluster.namesrv_addr)
    try:
        return await admin.api.max_offset(cluster.broker_addr, MessageQueue(topic, "broker-a", queue))
    finally:
        await admin.close()


# ---- the official client --------------------------------------------------------------------------

async def test_simple_consumer_receives_acks_and_filters_by_tag_and_sql(cluster, rmq5_python):
    topic, group = uniq("PopSimple"), uniq("GSimple")
    specs = [{"body": f"m{i}", "tag": "TagA" if i % 2 == 0 else "TagB", "keys": [f"k{i}"],
              "props": {"color": "red" if i < 2 else "blue"}} for i in range(4)]
    sent = await driver(rmq5_python, cluster, "send", topic=topic, messages=specs)
    events = await driver(rmq5_python, cluster, "receive", topic=topic, group=group, expect=2, tag="TagA")
    msgs = [e for e in events if e["event"] == "msg"]
    assert sorted(m["body"] for m in msgs) == ["m0", "m2"]
    by_body = {m["body"]: m for m in msgs}
    m0 = by_body["m0"]
    assert m0["message_id"] == sent[0]["message_id"] and m0["attempt"] == 1 and m0["tag"] == "TagA"
    assert m0["keys"] == ["k0"] and m0["props"] == {"color": "red"} and not m0["corrupted"]
    assert [e["event"] for e in events].count("acked") == 2
    # the acked prefix is the group's consumer offset: what the filter passed over counts too
    committed, total = await offsets(cluster, group, topic)
    assert (committed, total) == (4, 4)
    events = await driver(rmq5_python, cluster, "receive", topic=topic, group=uniq("GSql"), expect=2,
                          sql="color = 'red'")
    assert sorted(e["body"] for e in events if e["event"] == "msg") == ["m0", "m1"]


async def test_change_invisible_duration_and_an_unacked_message_back_with_attempt_2(cluster, rmq5_python):
    topic, group = uniq("PopNack"), uniq("GNack")
    await driver(rmq5_python, cluster, "send", topic=topic, messages=[{"body": "again"}])
    events = await driver(rmq5_python, cluster, "nack", topic=topic, group=group)
    kinds = [e["event"] for e in events]
    assert kinds == ["msg", "changed", "ack_error", "msg", "acked", "ack_error"], events
    first, changed, stale_ack, again, _acked, double_ack = events
    assert first["attempt"] == 1 and changed["same_handle"] is False
    assert stale_ack["code"] == pb.INVALID_RECEIPT_HANDLE          # the handle before the change
    assert (again["body"], again["message_id"], again["attempt"]) == ("again", first["message_id"], 2)
    assert double_ack["code"] == pb.INVALID_RECEIPT_HANDLE         # acked already


async def test_push_consumer_consumes_and_acks(cluster, rmq5_python):
    topic, group = uniq("PopPush"), uniq("GPush")
    await driver(rmq5_python, cluster, "send", topic=topic, messages=[{"body": f"p{i}"} for i in range(10)])
    events = await driver(rmq5_python, cluster, "push", topic=topic, group=group, expect=10, linger_s=0.5)
    deliveries = [e for e in events if e["event"] == "delivery"]
    assert sorted(e["body"] for e in deliveries) == sorted(f"p{i}" for i in range(10))
    assert {e["attempt"] for e in deliveries} == {1}
    committed, total = await offsets(cluster, group, topic)
    assert committed == total == 10        # every message acked: the whole topic is the group's


async def test_push_consumer_retries_with_backoff_then_dead_letters(cluster, rmq5_python):
    topic, group = uniq("PopDlq"), uniq("GDlq")
    await create_group(cluster, group, retryMaxTimes=2)        # max attempts 3
    await driver(rmq5_python, cluster, "send", topic=topic, messages=[{"body": "poison"}])
    events = await driver(rmq5_python, cluster, "push", topic=topic, group=group, expect=3, fail_until=-1,
                          linger_s=0.5)
    deliveries = [e for e in events if e["event"] == "delivery"]
    assert [e["attempt"] for e in deliveries] == [1, 2, 3]
    assert len({e["message_id"] for e in deliveries}) == 1
    gaps = [b["t"] - a["t"] for a, b in zip(deliveries, deliveries[1:])]
    assert all(g >= 0.9 for g in gaps), gaps         # the 1 s backoff (ChangeInvisibleDuration)
    dlq = f"%DLQ%{group}"
    deadline = time.monotonic() + 15
    while await max_offset(cluster, dlq) < 1:       # the third lease runs out: to the DLQ, not back
        assert time.monotonic() < deadline, "the message never reached the DLQ"
        await asyncio.sleep(0.2)


async def test_fifo_push_consumer_keeps_order_per_message_group(cluster, rmq5_python):
    topic, group = uniq("PopFifo"), uniq("GFifo")
    r = await asyncio.to_thread(run_mqadmin, "updateSubGroup", "-b", cluster.broker_addr, "-g", group, "-o", "true")
    assert r.returncode == 0 and "consumeMessageOrderly=true" in r.stdout, r.stderr
    # two message groups per queue (8 queues), more messages than one receive takes (32), a
    # listener slow enough that the client receives again while it works
    groups = [f"order-{g}" for g in range(16)]
    n = 6
    specs = [{"body": f"{g}#{i}", "group": g} for i in range(n) for g in groups]
    await driver(rmq5_python, cluster, "send", topic=topic, messages=specs)
    events = await driver(rmq5_python, cluster, "push", topic=topic, group=group, expect=len(specs), linger_s=0.5,
                          sleep_ms=5)
    deliveries = [e for e in events if e["event"] == "delivery"]
    assert len(deliveries) == len(specs) and {e["attempt"] for e in deliveries} == {1}
    for g in groups:
        mine = [e for e in deliveries if e["message_group"] == g]
        assert [e["body"] for e in mine] == [f"{g}#{i}" for i in range(n)], mine
        assert all(a["t"] <= b["t"] for a, b in zip(mine, mine[1:]))


# ---- our own stubs: exact frames and hostile input ----------------------------------------------

def stub(cluster):
    return service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.grpc_endpoint))


def md(client_id):
    return [("x-mq-client-id", client_id), ("authorization", "MQv2-HMAC-SHA1 Credential=, Signature=x")]


def receive_request(topic, group, batch=32, invisible_s=30, poll_s=5, **kw):
    req = spb.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=batch,
                                    message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=0), **kw)
    req.invisible_duration.FromSeconds(invisible_s)
    req.long_polling_timeout.FromSeconds(poll_s)
    return req


async def test_receive_frames_fields_huge_batches_and_forged_handles(cluster):
    topic, group = uniq("PopFrames"), uniq("GFrames")
    bodies = [f"frame-{i}".encode() for i in range(40)]
    await send_remoting(cluster, topic, [Message(topic, b, tags="T", keys=f"K{i}", properties={"u": str(i)})
                                         for i, b in enumerate(bodies)])
    s = stub(cluster)
    frames = await asyncio.to_thread(
        lambda: list(s.ReceiveMessage(receive_request(topic, group, batch=1_000_000), metadata=md("frames"),
                                      timeout=30)))
    assert frames[0].WhichOneof("content") == "status" and frames[0].status.code == pb.OK
    assert frames[-1].WhichOneof("content") == "delivery_timestamp"
    msgs = [f.message for f in frames[1:-1]]
    assert len(msgs) == 32                       # a huge batch is served with 32
    for m in msgs:
        sp = m.system_properties
        i = int(m.user_properties["u"])
        assert m.body == bodies[i] and m.topic.name == topic and sp.tag == "T" and list(sp.keys) == [f"K{i}"]
        assert sp.body_digest.type == pb.MD5 and sp.body_digest.checksum == hashlib.md5(m.body).hexdigest().upper()
        assert sp.delivery_attempt == 1 and sp.receipt_handle and sp.invisible_duration.seconds == 30
        assert 0 <= sp.queue_id < QUEUES and sp.HasField("queue_offset") and sp.HasField("store_timestamp")
    first = msgs[0].system_properties
    ack = spb.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[
        spb.AckMessageEntry(message_id=first.message_id, receipt_handle=first.receipt_handle),
        spb.AckMessageEntry(message_id="forged", receipt_handle=first.receipt_handle.replace(" 0 ", " 1 ", 1)),
        spb.AckMessageEntry(message_id="junk", receipt_handle="not a handle")])
    r = s.AckMessage(ack, metadata=md("frames"))
    assert r.status.code == pb.MULTIPLE_RESULTS
    assert [e.status.code for e in r.entries] == [pb.OK, pb.INVALID_RECEIPT_HANDLE, pb.INVALID_RECEIPT_HANDLE]
    # another group may not use this group's handle; a forged one changes nothing
    other = s.ChangeInvisibleDuration(spb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name=uniq("GThief")), topic=pb.Resource(name=topic),
        receipt_handle=msgs[1].system_properties.receipt_handle, invisible_duration={"seconds": 1}),
        metadata=md("frames"))
    assert other.status.code == pb.INVALID_RECEIPT_HANDLE
    fwd = s.ForwardMessageToDeadLetterQueue(spb.ForwardMessageToDeadLetterQueueRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic), receipt_handle="1 2 3"), metadata=md("frames"))
    assert fwd.status.code == pb.INVALID_RECEIPT_HANDLE
    ok = s.AckMessage(spb.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[
        spb.AckMessageEntry(message_id=m.system_properties.message_id,
                            receipt_handle=m.system_properties.receipt_handle) for m in msgs[1:]]),
        metadata=md("frames"))
    assert ok.status.code == pb.OK and len(ok.entries) == 31
    # bad arguments: their codes, nothing leased
    for req, code in ((receive_request(topic, group, invisible_s=1), pb.ILLEGAL_INVISIBLE_TIME),
                      (receive_request(topic, group, batch=0), pb.BAD_REQUEST),
                      (receive_request(topic, "CID_RMQ_SYS_X"), pb.ILLEGAL_CONSUMER_GROUP),
                      (receive_request(topic, group, filter_expression=pb.FilterExpression(
                          type=pb.SQL, expression="a >")), pb.ILLEGAL_FILTER_EXPRESSION)):
        [frame] = list(s.ReceiveMessage(req, metadata=md("frames"), timeout=30))
        assert frame.status.code == code, (req, frame)
    # the 8 left, then an empty long poll: MESSAGE_NOT_FOUND (the poll is at least 5 s)
    rest = [f for f in s.ReceiveMessage(receive_request(topic, group), metadata=md("frames"), timeout=30)
            if f.WhichOneof("content") == "message"]
    assert len(rest) == 8
    t0 = time.monotonic()
    ack = spb.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[
        spb.AckMessageEntry(receipt_handle=f.message.system_properties.receipt_handle) for f in rest])
    assert s.AckMessage(ack, metadata=md("frames")).status.code == pb.OK
    empty = list(s.ReceiveMessage(receive_request(topic, group, poll_s=0), metadata=md("frames"), timeout=30))
    waited = time.monotonic() - t0
    assert [f.WhichOneof("content") for f in empty] == ["status", "delivery_timestamp"]
    assert empty[0].status.code == pb.MESSAGE_NOT_FOUND and 4.5 <= waited < 10, waited


async def test_a_stream_nobody_reads_holds_up_no_one(cluster, rmq5_python):
    """A ReceiveMessage whose client never reads (its flow-control window fills with 1 MiB
    messages): other clients' receives and acks are served meanwhile; once it is cancelled,
    the messages its stream never carried are visible again after 1 s (attempt 2), not at
    the end of their 30 s lease."""
    big_topic, topic, group, hostile_group = uniq("PopBig"), uniq("PopPolite"), uniq("GPolite"), uniq("GHostile")
    await send_remoting(cluster, big_topic, [Message(big_topic, bytes([65 + i]) * (1 << 20)) for i in range(16)])
    channel = grpc.insecure_channel(cluster.grpc_endpoint)
    hostile = service_pb2_grpc.MessagingServiceStub(channel).ReceiveMessage(
        receive_request(big_topic, hostile_group, batch=16), metadata=md("never-reads"))
    try:
        await driver(rmq5_python, cluster, "send", topic=topic, messages=[{"body": "served"}])
        events = await driver(rmq5_python, cluster, "receive", topic=topic, group=group, expect=1)
        assert [(e["event"], e.get("body")) for e in events] == [("msg", "served"), ("acked", None)]
    finally:
        hostile.cancel()
        channel.close()
    t0 = time.monotonic()
    back = [f.message for f in await asyncio.to_thread(lambda: list(stub(cluster).ReceiveMessage(
        receive_request(big_topic, hostile_group, batch=16, poll_s=10), metadata=md("reads"), timeout=30)))
        if f.WhichOneof("content") == "message"]
    assert 1 <= len(back) < 16 and time.monotonic() - t0 < 5      # some were in flight: still leased
    assert {m.system_properties.delivery_attempt for m in back} == {2}
