"""TLS on real daemons (issue 32 item 7): `mqnamesrv` and `mqbroker` processes with
tlsServerMode enforcing (our client over TLS works, plaintext is refused) and permissive
(both on the same ports), the broker registering over TLS (useTLS), the certificate
self-signed by openssl in the test."""
from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess

import pytest

from pocketmq.client import LitePullConsumer, Message, Producer
from pocketmq.client.errors import MQClientError
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from pocketmq.remoting.connection import RemotingError
from pocketmq.remoting.tls import client_context
from tests.integration.test_client_cluster import uniq, wait_topic
from tests.support.daemons import Cluster

pytestmark = pytest.mark.slow


def make_cert(folder) -> tuple[str, str]:
    """A self-signed P-256 certificate for localhost / 127.0.0.1 and its key (PEM)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


def tls_cluster(root, mode: str, cert: str, key: str) -> Cluster:
    keys = [f"--tlsServerMode={mode}", f"--tlsServerCertPath={cert}", f"--tlsServerKeyPath={key}"]
    c = Cluster(str(root), broker_args=[*keys, "--useTLS=true"])
    c.namesrv.args += keys
    return c.start()


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return make_cert(tmp_path_factory.mktemp("tls-cert"))


@pytest.fixture(scope="module")
def enforcing(tmp_path_factory, cert):
    c = tls_cluster(tmp_path_factory.mktemp("tls-enforcing"), "enforcing", *cert)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def permissive(tmp_path_factory, cert):
    c = tls_cluster(tmp_path_factory.mktemp("tls-permissive"), "permissive", *cert)
    yield c
    c.stop()


async def roundtrip(cluster, tls, n: int = 20) -> list[bytes]:
    """Create a topic, send n messages and read them back, every connection with `tls`."""
    topic = uniq("TlsT")
    inst = ClientInstance(f"127.0.0.1@{uniq('adm')}", cluster.namesrv_addr, tls=tls)
    try:
        await wait_topic(inst.api, cluster, topic, 1)
    finally:
        await inst.close()
    bodies = [f"m{i}".encode() for i in range(n)]
    async with Producer(uniq("P"), cluster.namesrv_addr, instance_name=uniq("p"), tls=tls) as p:
        for b in bodies:
            await p.send(Message(topic, b))
    c = LitePullConsumer(uniq("C"), cluster.namesrv_addr, instance_name=uniq("c"), tls=tls,
                         consume_from_where="FIRST_OFFSET", auto_commit=False, max_poll_records=100)
    c.assign([MessageQueue(topic, "broker-a", 0)])
    got: list[bytes] = []
    async with c:
        for _ in range(100):
            got += [m.body for m in await c.poll(timeout_s=0.2)]
            if len(got) >= n:
                break
    return got


async def test_client_over_tls_in_enforcing_mode(enforcing):
    assert await roundtrip(enforcing, True) == [f"m{i}".encode() for i in range(20)]


async def test_client_verifying_the_certificate(enforcing, cert):
    ctx = client_context(verify=True, ca_path=cert[0])
    assert len(await roundtrip(enforcing, ctx, 3)) == 3
    # a CA that did not sign the server's certificate: the handshake fails, and says so
    other = ssl.create_default_context()
    with pytest.raises(MQClientError, match="cannot connect|CERTIFICATE_VERIFY_FAILED"):
        async with Producer(uniq("P"), enforcing.namesrv_addr, instance_name=uniq("p"), tls=other,
                            send_timeout_ms=1500) as p:
            await p.send(Message("AnyTopic", b"x"))


@pytest.mark.parametrize("which", ["namesrv", "broker"])
async def test_plaintext_refused_in_enforcing_mode(enforcing, which):
    addr = enforcing.namesrv_addr if which == "namesrv" else enforcing.broker_addr
    code = RequestCode.GET_BROKER_CLUSTER_INFO if which == "namesrv" else RequestCode.GET_BROKER_RUNTIME_INFO
    client = RemotingClient()
    try:
        with pytest.raises(RemotingError, match="closed"):
            await client.invoke(addr, RemotingCommand(code), 3)
    finally:
        await client.close()
    daemon = enforcing.namesrv if which == "namesrv" else enforcing.broker
    for _ in range(250):        # the daemon's log is read by a thread: wait for the line
        if "plaintext connection(s) refused (tlsServerMode=enforcing)" in daemon.log_text():
            break
        await asyncio.sleep(0.02)
    assert "plaintext connection(s) refused (tlsServerMode=enforcing)" in daemon.log_text()
    # and our client without tls=True gets no route (the nameserver closed on it)
    with pytest.raises(MQClientError):
        async with Producer(uniq("P"), enforcing.namesrv_addr, instance_name=uniq("p"), send_timeout_ms=1500) as p:
            await p.send(Message("AnyTopic", b"x"))


async def test_permissive_serves_both_on_the_same_ports(permissive):
    assert len(await roundtrip(permissive, True, 5)) == 5
    assert len(await roundtrip(permissive, None, 5)) == 5
    for tls in (None, client_context()):
        client = RemotingClient(ssl_context=tls)
        try:
            resp = await client.invoke(permissive.broker_addr, RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO), 3)
            assert resp.code == ResponseCode.SUCCESS
        finally:
            await client.close()


async def test_tls_client_against_a_plaintext_server_fails_clearly(tmp_path):
    c = Cluster(str(tmp_path)).start()
    try:
        client = RemotingClient(ssl_context=client_context(), connect_timeout_s=2)
        try:
            with pytest.raises(RemotingError):
                await client.invoke(c.namesrv_addr, RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO), 2)
        finally:
            await client.close()
    finally:
        c.stop()


def test_spark_source_and_sink_with_tls_enable(enforcing):
    """tlsEnable: the Spark connector's driver and executor paths (plan_read, pull_range,
    write_rows, without a Spark session) over TLS against enforcing daemons."""
    pytest.importorskip("pyarrow")
    from pocketmq.spark.options import parse_reader_options, parse_writer_options
    from pocketmq.spark.plan import plan_read
    from pocketmq.spark.read import pull_range
    from pocketmq.spark.write import write_rows
    topic = uniq("TlsSpark")

    async def create():
        inst = ClientInstance(f"127.0.0.1@{uniq('adm')}", enforcing.namesrv_addr, tls=True)
        try:
            await wait_topic(inst.api, enforcing, topic, 1)
        finally:
            await inst.close()
    asyncio.run(create())
    w = parse_writer_options({"namesrvAddr": enforcing.namesrv_addr, "topic": topic, "tlsEnable": "true",
                              "producerGroup": uniq("SparkW")})
    assert w.tls and write_rows(w, [{"body": f"s{i}".encode()} for i in range(7)]) == (7, 1)
    r = parse_reader_options({"namesrvAddr": enforcing.namesrv_addr, "subscribe": topic, "tlsEnable": "true"})
    got = sum(len(part) for rr in plan_read(r)
              for parts in pull_range(r.namesrv_addr, rr, "*", True, tls=r.tls) for part in parts)
    assert got == 7


@pytest.mark.parametrize("mode", ["permissive", "enforcing"])
async def test_hostile_first_bytes_leave_nothing_behind(cert, mode):
    """A RemotingServer in-process: a fake handshake (0x16 then junk), a plaintext frame in
    enforcing mode, a connection closed before its first byte and one closed mid-handshake
    are each closed and forgotten (no Connection left in the server's table), and the
    server goes on serving."""
    from pocketmq.protocol.command import encode
    from pocketmq.remoting.server import RemotingServer
    from pocketmq.remoting.tls import TlsGate, server_context

    def echo(conn, cmd):
        return cmd.response(ResponseCode.SUCCESS, "ok")
    gate = TlsGate(mode, server_context(*cert), "test")
    srv = RemotingServer({99: echo}, host="127.0.0.1", port=0, tls=gate)
    port = await srv.start()
    try:
        async def send_and_wait(data: bytes | None) -> bytes:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            if data is None:
                w.close()
                return b""
            w.write(data)
            try:
                got = await asyncio.wait_for(r.read(65536), 5)     # a reply, or b"" when closed
            finally:
                w.close()
            return got
        # a fake handshake: at most a TLS alert back, then the server closes
        junk = await send_and_wait(b"\x16\x03\x01\x00\x05hello, not a ClientHello" * 3)
        assert junk == b"" or junk[0] == 0x15
        await send_and_wait(None)
        r, w = await asyncio.open_connection("127.0.0.1", port, ssl=client_context())
        w.close()                                            # a TLS client that leaves at once
        plain = await send_and_wait(encode(RemotingCommand(99)))
        if mode == "enforcing":
            assert plain == b"" and gate.refused_plaintext == 1
        else:
            assert plain                                      # answered
        for _ in range(200):
            if not srv.connections:
                break
            await asyncio.sleep(0.02)
        assert not srv.connections
        client = RemotingClient(ssl_context=client_context())
        try:
            resp = await client.invoke(f"127.0.0.1:{port}", RemotingCommand(99), 3)
            assert resp.code == ResponseCode.SUCCESS
        finally:
            await client.close()
    finally:
        await srv.close()


def test_mqadmin_tls_flag(enforcing, capsys):
    from pocketmq.tools.mqadmin.cli import main as admin_main
    assert admin_main(["clusterList", "-n", enforcing.namesrv_addr, "--tls"]) == 0
    assert "broker-a" in capsys.readouterr().out
    assert admin_main(["clusterList", "-n", enforcing.namesrv_addr]) != 0
    assert "cannot reach nameserver" in capsys.readouterr().err
