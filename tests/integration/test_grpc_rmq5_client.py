"""The gRPC endpoint (mqbroker --enable-proxy) driven by the REAL official RocketMQ 5.x
Python client, rocketmq-python-client 5.1.2, from its own venv in a subprocess
(tests/support/rmq5.py), against real nameserver and broker processes. What it sends is
consumed over the 4.x remoting protocol by our LitePullConsumer: mixed protocols.

Also, with our own generated stubs as the client: the client registry (mqadmin's
producerConnection/consumerConnection, /metrics), statuses of what is not served, and
hostile input on the port.
"""
from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

grpc = pytest.importorskip("grpc", reason="the grpc extra (pip install pocketmq[grpc]) is not installed")

from pocketmq.broker.proxy.pb import definition_pb2 as pb  # noqa: E402
from pocketmq.broker.proxy.pb import service_pb2 as spb  # noqa: E402
from pocketmq.broker.proxy.pb import service_pb2_grpc  # noqa: E402
from pocketmq.client.instance import ClientInstance  # noqa: E402
from pocketmq.client.lite_pull_consumer import LitePullConsumer  # noqa: E402
from pocketmq.protocol import message as msgcodec  # noqa: E402
from pocketmq.protocol.bodies import MessageQueue  # noqa: E402
from tests.integration.test_client_cluster import uniq  # noqa: E402
from tests.support.daemons import Cluster, free_port  # noqa: E402
from tests.support.rmq5 import rmq5_python_fixture  # noqa: E402,F401 (the fixture rmq5_python)
from tests.support.rmq5 import run_driver  # noqa: E402

pytestmark = pytest.mark.slow
QUEUES = 8     # defaultTopicQueueNums: what QueryRoute's auto-creation gives a topic


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    grpc_port, metrics_port = free_port(), free_port()
    c = Cluster(str(tmp_path_factory.mktemp("grpc")), broker_args=[
        "--enable-proxy", f"--grpcServerPort={grpc_port}", f"--metricsPort={metrics_port}",
        # the check-back scenario: half messages older than 1 s are checked every 0.5 s
        "--transactionCheckInterval=500", "--transactionTimeOut=1000"])
    c.grpc_endpoint = f"127.0.0.1:{grpc_port}"
    c.metrics_port = metrics_port
    c.start()
    yield c
    c.stop()


async def driver(python, cluster, scenario, **args):
    return await asyncio.to_thread(run_driver, python, cluster.grpc_endpoint, scenario, **args)


async def consume(cluster, topic, count, timeout_s=20.0):
    """`count` messages of `topic` from its first offset, over remoting."""
    got = []
    consumer = LitePullConsumer(uniq("CG"), cluster.namesrv_addr, consume_from_where="FIRST_OFFSET")
    consumer.subscribe(topic, "*")
    async with consumer:
        deadline = time.monotonic() + timeout_s
        while len(got) < count and time.monotonic() < deadline:
            got.extend(await consumer.poll(timeout_s=1.0))
    assert len(got) >= count, f"{len(got)} of {count} messages of {topic} consumed: {got}"
    return got


async def max_offsets(cluster, topic) -> int:
    admin = ClientInstance(uniq("127.0.0.1@grpc-admin"), cluster.namesrv_addr)
    try:
        return sum([await admin.api.max_offset(cluster.broker_addr, MessageQueue(topic, "broker-a", q))
                    for q in range(QUEUES)])
    finally:
        await admin.close()


async def test_producer_sends_normal_messages_consumed_over_remoting(cluster, rmq5_python):
    topic = uniq("Rmq5Normal")
    specs = [{"body": f"normal-{i}", "tag": "TagA", "keys": [f"key{i}"], "props": {"color": f"c{i}"}}
             for i in range(3)]
    sent = await driver(rmq5_python, cluster, "send", topic=topic, messages=specs)
    assert [e["event"] for e in sent] == ["sent"] * 3
    got = {m.body.decode(): m for m in await consume(cluster, topic, 3)}
    for e, spec in zip(sent, specs):
        m = got[spec["body"]]
        assert m.msg_id == e["message_id"] and m.properties[msgcodec.UNIQ_KEY] == e["message_id"]
        assert (m.tags, list(m.keys), m.properties["color"]) == ("TagA", spec["keys"], spec["props"]["color"])
        assert m.queue_offset == e["offset"]      # the receipt's offset is the consume-queue offset


async def test_fifo_message_groups_go_to_one_queue_each(cluster, rmq5_python):
    topic = uniq("Rmq5Fifo")
    groups = ["order-1", "order-2", "order-3", "order-4"]
    specs = [{"body": f"{g}#{i}", "group": g} for i in range(3) for g in groups]
    await driver(rmq5_python, cluster, "send", topic=topic, messages=specs)
    got = await consume(cluster, topic, len(specs))
    by_group: dict[str, list] = {}
    for m in got:
        assert m.properties[msgcodec.SHARDING_KEY] == m.body.decode().split("#")[0]
        by_group.setdefault(m.properties[msgcodec.SHARDING_KEY], []).append(m)
    assert sorted(by_group) == groups
    for g, msgs in by_group.items():
        assert {m.queue_id for m in msgs} == {msgcodec.java_string_hash(g) % QUEUES}, g
        # in send order within the group's queue
        assert [m.body.decode() for m in sorted(msgs, key=lambda m: m.queue_offset)] == [f"{g}#{i}" for i in range(3)]
    assert len({msgs[0].queue_id for msgs in by_group.values()}) > 1     # groups spread over queues


async def test_delay_message_carries_timer_deliver_ms_and_waits_for_it(cluster, rmq5_python):
    topic = uniq("Rmq5Delay")
    sent_at = time.time()
    [e] = await driver(rmq5_python, cluster, "send", topic=topic, messages=[{"body": "later", "deliver_in_s": 2}])
    [m] = await consume(cluster, topic, 1)
    due = int(m.properties[msgcodec.TIMER_DELIVER_MS])
    # the client sends whole seconds: due is a second boundary 1-2 s after the send
    assert due % 1000 == 0 and sent_at * 1000 - 1000 <= due - 2000 <= sent_at * 1000 + 1000
    assert m.msg_id == e["message_id"] and m.body == b"later"
    assert m.store_timestamp >= due          # delivered by the timer, not before its time


async def test_transaction_commit_and_rollback(cluster, rmq5_python):
    topic = uniq("Rmq5Tx")
    committed = await driver(rmq5_python, cluster, "transaction", topic=topic, body="tx-commit", end="commit")
    rolled_back = await driver(rmq5_python, cluster, "transaction", topic=topic, body="tx-rollback", end="rollback")
    for events, resolution in ((committed, "commit"), (rolled_back, "rollback")):
        assert events[0]["event"] == "sent" and events[0]["transaction_id"] == events[0]["message_id"]
        assert events[1] == {"event": "ended", "resolution": resolution}
    [m] = await consume(cluster, topic, 1)
    assert m.body == b"tx-commit" and m.msg_id == committed[0]["message_id"]
    assert m.properties[msgcodec.PGROUP] == topic      # the producer group is the topic, as Java's proxy's
    # EndTransaction answered before the driver returned: the rollback stored nothing
    assert await max_offsets(cluster, topic) == 1


async def test_transaction_check_back_over_telemetry(cluster, rmq5_python):
    """No EndTransaction from the producer: the broker's check-back service asks it over its
    Telemetry stream (recover_orphaned_transaction_command), its checker answers COMMIT."""
    topic = uniq("Rmq5TxCheck")
    events = await driver(rmq5_python, cluster, "transaction", topic=topic, body="tx-checked", end="check",
                          wait_s=30, timeout_s=60)
    sent, checked = events
    assert checked == {"event": "checked", "message_id": sent["message_id"], "body": "tx-checked"}
    [m] = await consume(cluster, topic, 1)
    assert m.body == b"tx-checked" and m.msg_id == sent["message_id"]


# ---- our own stubs as the client --------------------------------------------------------------

def stub(cluster):
    return service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.grpc_endpoint))


def md(client_id):
    return [("x-mq-client-id", client_id), ("authorization", "MQv2-HMAC-SHA1 Credential=, Signature=x")]


async def test_client_registry_shows_grpc_clients(cluster):
    s = stub(cluster)
    topic, group = uniq("Rmq5Reg"), uniq("Rmq5Group")
    producer_id, consumer_id = uniq("py-producer"), uniq("node-consumer")
    assert s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=md(producer_id)).status.code \
        == pb.OK
    producer = pb.Settings(client_type=pb.PRODUCER, user_agent=pb.UA(language=pb.PYTHON, version="5.1.2"))
    producer.publishing.topics.add().name = topic
    consumer = pb.Settings(client_type=pb.SIMPLE_CONSUMER, user_agent=pb.UA(language=pb.NODE_JS, version="1.0.8"))
    consumer.subscription.group.name = group
    consumer.subscription.subscriptions.add(topic=pb.Resource(name=topic),
                                            expression=pb.FilterExpression(type=pb.TAG, expression="TagA"))
    streams = []
    for settings, client_id in ((producer, producer_id), (consumer, consumer_id)):
        call = s.Telemetry(iter([spb.TelemetryCommand(settings=settings)]), metadata=md(client_id))
        reply = next(call)
        assert reply.status.code == pb.OK and reply.HasField("settings")
        streams.append((call, reply.settings))
    assert streams[0][1].publishing.max_body_size > 0
    assert streams[1][1].subscription.receive_batch_size == 32
    hb = s.Heartbeat(spb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER, group=pb.Resource(name=group)),
                     metadata=md(consumer_id))
    assert hb.status.code == pb.OK
    admin = ClientInstance(uniq("127.0.0.1@grpc-admin"), cluster.namesrv_addr)
    try:
        pconns = (await admin.api.producer_connection_list(cluster.broker_addr, topic))["connectionSet"]
        assert [(c["clientId"], c["language"]) for c in pconns] == [(producer_id, "PYTHON")]
        assert pconns[0]["version"] == msgcodec_version("V5_1_2")
        cc = await admin.api.consumer_connection_list(cluster.broker_addr, group)
        assert [(c["clientId"], c["language"]) for c in cc["connectionSet"]] == [(consumer_id, "OTHER")]
        assert cc["consumeType"] == "CONSUME_POP" and cc["subscriptionTable"][topic]["subString"] == "TagA"
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10).read()
        rows = [line for line in metrics.decode().splitlines() if line.startswith("pocketmq_grpc_clients{")]
        for kind, lang, version in (("PRODUCER", "PYTHON", "5.1.2"), ("SIMPLE_CONSUMER", "NODE_JS", "1.0.8")):
            assert any(f'client_type="{kind}"' in r and f'language="{lang}"' in r and f'version="{version}"' in r
                       for r in rows), rows
        # NotifyClientTermination takes the client out of the registry
        for client_id in (producer_id, consumer_id):
            assert s.NotifyClientTermination(spb.NotifyClientTerminationRequest(), metadata=md(client_id)) \
                .status.code == pb.OK
        with pytest.raises(Exception, match="not exist"):
            await admin.api.producer_connection_list(cluster.broker_addr, topic)
    finally:
        await admin.close()
        for call, _ in streams:
            call.cancel()


def msgcodec_version(name: str) -> int:
    from pocketmq.protocol.codes import VERSION_NAMES
    return VERSION_NAMES.index(name)


async def test_statuses_of_what_is_not_served_and_bad_topics(cluster):
    s = stub(cluster)
    cid = uniq("probe")
    [frame] = list(s.ReceiveMessage(spb.ReceiveMessageRequest(group=pb.Resource(name="G")), metadata=md(cid)))
    assert frame.status.code == pb.ILLEGAL_TOPIC             # POP is served (test_grpc_pop.py): no topic named
    assert s.AckMessage(spb.AckMessageRequest(), metadata=md(cid)).status.code == pb.ILLEGAL_TOPIC
    assert s.PullMessage(spb.PullMessageRequest(), metadata=md(cid)).next().status.code == pb.NOT_IMPLEMENTED
    assert s.SyncLiteSubscription(spb.SyncLiteSubscriptionRequest(), metadata=md(cid)).status.code == pb.UNSUPPORTED
    assert s.RecallMessage(spb.RecallMessageRequest(), metadata=md(cid)).status.code == pb.UNSUPPORTED
    bad = s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="no spaces")), metadata=md(cid)).status
    assert bad.code == pb.ILLEGAL_TOPIC
    missing = uniq("NeverCreated")
    st = s.QueryAssignment(spb.QueryAssignmentRequest(topic=pb.Resource(name=missing), group=pb.Resource(name="G")),
                           metadata=md(cid)).status
    assert st.code == pb.TOPIC_NOT_FOUND and missing in st.message
    no_id = s.SendMessage(spb.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="T"), body=b"x")]))
    assert no_id.status.code == pb.CLIENT_ID_REQUIRED


async def test_hostile_input_leaves_other_clients_served(cluster):
    channel = grpc.insecure_channel(cluster.grpc_endpoint)
    raw = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage")   # bytes in, bytes out
    with pytest.raises(grpc.RpcError) as e:
        raw(b"\xff\xff\xff\xff garbage that is no protobuf", metadata=md("hostile"), timeout=10)
    assert e.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
    with pytest.raises(grpc.RpcError) as e:      # beyond maxFrameSize: refused before decoding
        raw(b"\x0a" + b"\xff" * 17_000_000, metadata=md("hostile"), timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # a Telemetry stream whose client never reads what it is sent
    idle = stub(cluster).Telemetry(iter([spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER))] * 500),
                                   metadata=md("never-reads"))
    s = stub(cluster)
    topic = uniq("Rmq5Hostile")
    r = s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=md("polite"))
    assert r.status.code == pb.OK and len(r.message_queues) == QUEUES
    m = pb.Message(topic=pb.Resource(name=topic), body=b"still served")
    m.system_properties.message_id = "POLITE-1"
    m.system_properties.message_type = pb.NORMAL
    sent = s.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=md("polite"))
    assert sent.status.code == pb.OK and sent.entries[0].message_id == "POLITE-1"
    idle.cancel()


async def test_readme_rmq5_example_runs(cluster, rmq5_python, tmp_path):
    """The README's "RocketMQ 5.x clients" example (fenced `python rmq5`), run with the
    official client against this broker; what it sent without a delay is consumed over 4.x."""
    import pathlib
    import re
    import subprocess
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    [block] = re.findall(r"```python rmq5\n(.*?)```", readme, re.S)
    topic = uniq("OrderTopic")
    code = block.replace("127.0.0.1:8081", cluster.grpc_endpoint).replace('"OrderTopic"', repr(topic))
    p = await asyncio.to_thread(subprocess.run, [rmq5_python, "-c", code], cwd=tmp_path, capture_output=True,
                                text=True, timeout=60, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, f"README example failed:\n{p.stderr[-3000:]}"
    got = {m.body: m for m in await consume(cluster, topic, 3)}
    assert set(got) == {b"order created", b"order paid", b"order shipped"}
    assert got[b"order paid"].properties[msgcodec.SHARDING_KEY] == "order-42"
    assert got[b"order created"].properties["region"] == "eu" and list(got[b"order created"].keys) == ["order-42"]
    # the consumer examples, each with a group of its own: the SimpleConsumer's tag filter
    # takes "created" and "paid"; the PushConsumer (10 s cut to 3) gets the three
    for fence, group, expect in (("rmq5-simple", uniq("ReadmeSimple"), [b"order created", b"order paid"]),
                                 ("rmq5-push", uniq("ReadmePush"), [b"order created", b"order paid",
                                                                    b"order shipped"])):
        [block] = re.findall(rf"```python {fence}\n(.*?)```", readme, re.S)
        code = (block.replace("127.0.0.1:8081", cluster.grpc_endpoint).replace('"OrderTopic"', repr(topic))
                .replace('"OrderGroup"', repr(group)).replace("time.sleep(10)", "time.sleep(3)"))
        p = await asyncio.to_thread(subprocess.run, [rmq5_python, "-c", code], cwd=tmp_path, capture_output=True,
                                    text=True, timeout=60, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
        assert p.returncode == 0, f"README {fence} example failed:\n{p.stderr[-3000:]}"
        assert all(repr(body) in p.stdout for body in expect), (fence, p.stdout)


async def test_end_transaction_after_a_broker_restart_finds_the_half_message(cluster):
    # the half message was sent before a restart: EndTransaction finds it through the message
    # index by its id (the in-process table of the endpoint was lost with the process)
    s = stub(cluster)
    topic = uniq("Rmq5TxRestart")
    assert s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=md("tx")).status.code == pb.OK
    ids = {}
    for name in ("commit", "rollback"):
        m = pb.Message(topic=pb.Resource(name=topic), body=name.encode())
        m.system_properties.message_id = ids[name] = uniq(f"TXR{name.upper()}")
        m.system_properties.message_type = pb.TRANSACTION
        sent = s.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=md("tx"))
        assert sent.status.code == pb.OK, sent
    assert await max_offsets(cluster, topic) == 0                  # half messages: nothing to consume yet
    await asyncio.to_thread(cluster.restart_broker)
    s = stub(cluster)
    for name, resolution in (("commit", pb.COMMIT), ("rollback", pb.ROLLBACK)):
        r = s.EndTransaction(spb.EndTransactionRequest(topic=pb.Resource(name=topic), message_id=ids[name],
                                                       transaction_id=ids[name], resolution=resolution,
                                                       source=pb.SOURCE_CLIENT), metadata=md("tx"))
        assert r.status.code == pb.OK, r
    got = await consume(cluster, topic, 1)
    assert [m.body for m in got] == [b"commit"]
    # an id no half message has is still refused, naming it
    r = s.EndTransaction(spb.EndTransactionRequest(topic=pb.Resource(name=topic), message_id="NO-SUCH-ID",
                                                   transaction_id="NO-SUCH-ID", resolution=pb.COMMIT),
                         metadata=md("tx"))
    assert r.status.code == pb.INVALID_TRANSACTION_ID and "NO-SUCH-ID" in r.status.message
