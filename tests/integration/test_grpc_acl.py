"""Plain ACL on the gRPC endpoint (broker/proxy/auth.py), against real nameserver and broker
processes with aclEnable=true and --enable-proxy: the official Python client 5.1.2 (its own
venv, tests/support/rmq5.py) sends and receives with the right credentials and is refused
with the right v2 status otherwise (nothing stored); a plain_acl.yml reload takes effect;
our own stub client for what the official one never sends (no header, a malformed one, no
date-time, an unsigned Telemetry stream).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

grpc = pytest.importorskip("grpc", reason="the grpc extra (pip install pocketmq[grpc]) is not installed")

from pocketmq.broker.proxy.auth import sign  # noqa: E402
from pocketmq.broker.proxy.pb import definition_pb2 as pb  # noqa: E402
from pocketmq.broker.proxy.pb import service_pb2 as spb  # noqa: E402
from pocketmq.broker.proxy.pb import service_pb2_grpc  # noqa: E402
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C  # noqa: E402
from pocketmq.protocol.command import RemotingCommand  # noqa: E402
from pocketmq.remoting.client import RemotingClient  # noqa: E402
from tests.integration.test_acl_broker import signed  # noqa: E402
from tests.integration.test_client_cluster import uniq  # noqa: E402
from tests.support.daemons import Cluster, free_broker_port, free_port  # noqa: E402
from tests.support.rmq5 import rmq5_python_fixture  # noqa: E402,F401 (the fixture rmq5_python)
from tests.support.rmq5 import run_driver  # noqa: E402

pytestmark = pytest.mark.slow

ADMIN = ("adminUser", "adminSecret1")
APP = ("appUser01", "appSecret01")
QUEUES = 8

ACL_YML = f"""\
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {APP[0]}
    secretKey: {APP[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [GAclT=PUB|SUB, GSubOnlyT=SUB{{extra}}]
    groupPerms: [GAclG=SUB]
"""


def write_acl(path: str, extra: str = "") -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(ACL_YML.format(extra=extra))
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("grpcacl"))
    grpc_port, metrics_port = free_port(), free_port()
    conf = os.path.join(root, "broker.conf")
    with open(conf, "w") as f:
        f.write(f"aclEnable=true\naccessKey={ADMIN[0]}\nsecretKey={ADMIN[1]}\nmetricsPort={metrics_port}\n")
    acl_path = os.path.join(root, "plain_acl.yml")
    write_acl(acl_path)
    c = Cluster(root, broker_args=["-c", conf, "--enable-proxy", f"--grpcServerPort={grpc_port}"])
    c.grpc_endpoint = f"127.0.0.1:{grpc_port}"
    c.metrics_port = metrics_port
    c.acl_path = acl_path
    c.start()
    yield c
    c.stop()


async def driver(python, cluster, scenario, creds, **args):
    return await asyncio.to_thread(run_driver, python, cluster.grpc_endpoint, scenario, ak=creds[0], sk=creds[1],
                                   **args)


async def stored(cluster, topic) -> int:
    """Messages stored in `topic` (the sum of its queues' max offsets), asked over remoting."""
    client = RemotingClient()
    try:
        total = 0
        for q in range(QUEUES):
            r = await client.invoke(cluster.broker_addr, signed(RemotingCommand(R.GET_MAX_OFFSET, ext_fields={
                "topic": topic, "queueId": str(q)}), ADMIN))
            total += int(r.ext_fields["offset"]) if r.code == C.SUCCESS else 0
        return total
    finally:
        await client.close()


def stub(cluster):
    return service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(cluster.grpc_endpoint))


def md(creds=None, client_id="stub-acl", date="20240101T000000Z", authorization=None, with_date=True):
    out = [("x-mq-client-id", client_id)]
    if with_date:
        out.append(("x-mq-date-time", date))
    if authorization is None and creds is not None:
        authorization = (f"MQv2-HMAC-SHA1 Credential={creds[0]}, SignedHeaders=x-mq-date-time, "
                         f"Signature={sign(creds[1], date)}")
    if authorization is not None:
        out.append(("authorization", authorization))
    return out


def send_request(topic, body=b"x"):
    m = pb.Message(topic=pb.Resource(name=topic), body=body)
    m.system_properties.message_id = uniq("ACLMSG")
    m.system_properties.message_type = pb.NORMAL
    return spb.SendMessageRequest(messages=[m])


def refusals(events) -> set:
    """The v2 codes the client met: those it raised, and those it only logged (the route
    query's, e.g. "query topic raise exception, 40100, ACL: ...")."""
    codes = {e["code"] for e in events if e["event"] == "error" and isinstance(e["code"], int)}
    for e in events:
        if e["event"] == "client_log":
            codes.update(int(w.rstrip(",")) for w in e["message"].split() if w.rstrip(",") in ("40100", "40300"))
    return codes


async def test_official_client_with_right_credentials_sends_and_receives(cluster, rmq5_python):
    specs = [{"body": f"acl-{i}", "tag": "T"} for i in range(3)]
    sent = await driver(rmq5_python, cluster, "send", APP, topic="GAclT", messages=specs)
    assert [e["event"] for e in sent] == ["sent"] * 3
    got = await driver(rmq5_python, cluster, "receive", APP, topic="GAclT", group="GAclG", expect=3)
    assert sorted(e["body"] for e in got if e["event"] == "msg") == [s["body"] for s in specs]
    assert [e["event"] for e in got if e["event"].startswith("ack")] == ["acked"] * 3


@pytest.mark.parametrize("case", ["wrong secret", "unknown key", "no PUB"])
async def test_official_client_refused_with_the_right_status(cluster, rmq5_python, case):
    topic, creds, code = {"wrong secret": ("GAclT", (APP[0], "notTheSecret"), pb.UNAUTHORIZED),
                          "unknown key": ("GAclT", ("strangerKey", "strangerSecret"), pb.UNAUTHORIZED),
                          "no PUB": ("GSubOnlyT", APP, pb.FORBIDDEN)}[case]
    before = await stored(cluster, topic)
    events = await driver(rmq5_python, cluster, "send", creds, topic=topic, catch=True,
                          messages=[{"body": "must not be stored"}])
    assert not [e for e in events if e["event"] == "sent"], events
    assert [e for e in events if e["event"] == "error"], events
    assert refusals(events) == {code}, events
    if case == "no PUB":      # the route is readable (SUB): the send itself is refused, with its status
        assert [(e["where"], e["type"], e["code"]) for e in events if e["event"] == "error"] == [
            ("send", "ForbiddenException", pb.FORBIDDEN)], events
    assert await stored(cluster, topic) == before


async def test_reload_grants_and_revokes_on_a_running_broker(cluster, rmq5_python):
    s = stub(cluster)
    topic = uniq("GReloadT")
    assert s.SendMessage(send_request(topic), metadata=md(APP)).status.code == pb.FORBIDDEN
    write_acl(cluster.acl_path, extra=f", {topic}=PUB")
    t0 = time.monotonic()
    while s.SendMessage(send_request(topic), metadata=md(APP)).status.code != pb.OK:
        assert time.monotonic() - t0 < 10, "the grant was not in force within 10 s"
        await asyncio.sleep(0.2)
    # the official client too, now
    events = await driver(rmq5_python, cluster, "send", APP, topic=topic, messages=[{"body": "granted"}])
    assert [e["event"] for e in events] == ["sent"]
    write_acl(cluster.acl_path)
    t0 = time.monotonic()
    while s.SendMessage(send_request(topic), metadata=md(APP)).status.code != pb.FORBIDDEN:
        assert time.monotonic() - t0 < 10, "the revocation was not in force within 10 s"
        await asyncio.sleep(0.2)


async def test_stub_client_missing_and_malformed_headers(cluster):
    s = stub(cluster)
    topic = "GAclT"
    before = await stored(cluster, topic)
    cases = {
        "no authorization": (md(), "authorization header is missing"),
        "no date-time": (md(APP, with_date=False), "x-mq-date-time"),
        "no method word": (md(authorization="Credential=appUser01"), "incorrect"),
        "not key=value": (md(authorization="MQv2-HMAC-SHA1 Credential"), "key=value"),
        "signature not hex": (md(authorization=f"MQv2-HMAC-SHA1 Credential={APP[0]}, Signature=xyz"), "not hex"),
        "no signature": (md(authorization=f"MQv2-HMAC-SHA1 Credential={APP[0]}"), "Check signature failed"),
        "empty credentials": (md(authorization="MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, "
                                 "Signature=00"), "No accessKey is configured"),
        "signed another date": (md(APP)[:1] + [("x-mq-date-time", "20240101T000001Z")] + md(APP)[2:],
                                "Check signature failed"),
    }
    for name, (metadata, words) in cases.items():
        st = s.SendMessage(send_request(topic), metadata=metadata).status
        assert st.code == pb.UNAUTHORIZED and words in st.message, (name, st)
    # the right signature, in upper case hex (Java decodes either)
    upper = f"MQv2-HMAC-SHA1 Credential={APP[0]}, Signature={sign(APP[1], '20240101T000000Z').upper()}"
    assert s.SendMessage(send_request(topic), metadata=md(authorization=upper)).status.code == pb.OK
    assert await stored(cluster, topic) == before + 1
    # a streamed answer and a stream: refused with a status frame
    [frame] = list(s.ReceiveMessage(spb.ReceiveMessageRequest(
        group=pb.Resource(name="OtherG"), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic))),
        metadata=md(APP)))
    assert frame.status.code == pb.FORBIDDEN and "group:OtherG" in frame.status.message
    [cmd] = list(s.Telemetry(iter([spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER))]),
                             metadata=md()))
    assert cmd.status.code == pb.UNAUTHORIZED
    # a signed stream whose settings name a topic without PUB: that command is refused, the
    # stream stays open for the next one
    done = threading.Event()

    def commands():
        for t in ("GSubOnlyT", topic):
            yield spb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(
                topics=[pb.Resource(name=t)])))
        done.wait(10)       # the stream stays open until both answers are read
    call = s.Telemetry(commands(), metadata=md(APP, client_id=uniq("stub-tel")), timeout=10)
    cmds = [next(call), next(call)]
    done.set()
    call.cancel()
    assert [c.status.code for c in cmds] == [pb.FORBIDDEN, pb.OK]


async def test_denies_are_in_metrics(cluster):
    s = stub(cluster)
    s.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="GAclT")), metadata=md(("strangerKey", "x" * 8)))
    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10).read().decode()
    assert any(line.startswith("pocketmq_acl_denied_total{") and 'code="QueryRoute"' in line
               and 'reason="unknown_key"' in line for line in text.splitlines()), text[-2000:]
    assert any(line.startswith("pocketmq_grpc_calls_total{") and 'rpc="QueryRoute"' in line
               and 'code="40100"' in line for line in text.splitlines())


def test_dev_with_credentials_serves_grpc_with_acl(tmp_path):
    from tests.integration.test_grpc_dev import lines_until_ready, stop
    port = free_port()
    creds = ("devUser01", "devSecret01")
    proc = subprocess.Popen([sys.executable, "-m", "pocketmq", "dev", "--dir", str(tmp_path / "dev"),
                             "--namesrv-port", str(free_port()), "--broker-port", str(free_broker_port()),
                             "--grpc-port", str(port), "--console-port", "0",
                             "--accessKey", creds[0], "--secretKey", creds[1]],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        lines = lines_until_ready(proc)
        assert f"pocketmq dev: RocketMQ 5.x clients: endpoints 127.0.0.1:{port}\n" in lines, lines
        s = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        route = spb.QueryRouteRequest(topic=pb.Resource(name="DevAclTopic"))
        assert s.QueryRoute(route, metadata=md(), timeout=10).status.code == pb.UNAUTHORIZED
        assert s.QueryRoute(route, metadata=md(creds), timeout=10).status.code == pb.OK
    finally:
        stop(proc)
