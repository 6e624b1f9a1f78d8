"""`pocketmq dev` serves the gRPC endpoint for RocketMQ 5.x clients (--grpc-port), and says
why not when it cannot (the port taken: the 4.x ports still start)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

grpc = pytest.importorskip("grpc", reason="the grpc extra (pip install pocketmq[grpc]) is not installed")

from pocketmq.broker.proxy.pb import definition_pb2 as pb  # noqa: E402
from pocketmq.broker.proxy.pb import service_pb2 as spb  # noqa: E402
from pocketmq.broker.proxy.pb import service_pb2_grpc  # noqa: E402
from tests.support.daemons import free_broker_port, free_port  # noqa: E402


def dev(tmp_path, grpc_port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pocketmq", "dev", "--dir", str(tmp_path / "dev"),
                             "--namesrv-port", str(free_port()), "--broker-port", str(free_broker_port()),
                             "--grpc-port", str(grpc_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def lines_until_ready(proc) -> list[str]:
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("pocketmq dev: nameserver "):     # the gRPC line comes before it
            return seen
    raise AssertionError(f"pocketmq dev ended without its ready line: {seen}")


def stop(proc) -> None:
    proc.terminate()
    proc.wait(30)


def test_dev_serves_grpc(tmp_path):
    port = free_port()
    proc = dev(tmp_path, port)
    try:
        lines = lines_until_ready(proc)
        assert f"pocketmq dev: RocketMQ 5.x clients: endpoints 127.0.0.1:{port}\n" in lines
        stub = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        r = stub.QueryRoute(spb.QueryRouteRequest(topic=pb.Resource(name="DevTopic")),
                            metadata=[("x-mq-client-id", "dev-test")], timeout=10)
        assert r.status.code == pb.OK and r.message_queues[0].broker.endpoints.addresses[0].port == port
    finally:
        stop(proc)


def test_dev_with_the_grpc_port_taken_says_so_and_serves_the_rest(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        proc = dev(tmp_path, busy)
        try:
            lines = lines_until_ready(proc)
            assert any(f"gRPC endpoint (RocketMQ 5.x clients) off: cannot listen on 127.0.0.1:{busy}" in line
                       and "--grpc-port" in line for line in lines), lines
        finally:
            stop(proc)


def test_dev_steps_aside_when_the_grpc_port_is_taken_after_its_probe(tmp_path):
    # the probe passed, then another process took the port before the broker bound it (two
    # `pocketmq dev` starting at once): the endpoint steps aside as when the probe finds it
    # taken, instead of the whole command failing; _grpc_args is replaced by one that skips
    # its probe, so the bind itself meets the taken port
    code = (
        "import sys, pocketmq.cli as cli\n"
        "cli._grpc_args = lambda port, bind: ([\"--enableProxy=true\", f\"--grpcServerPort={port}\"], \"\")\n"
        "sys.exit(cli.main(sys.argv[1:]))\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        p = subprocess.run([sys.executable, "-c", code, "dev", "--demo", "--dir", str(tmp_path / "dev"),
                            "--namesrv-port", str(free_port()), "--broker-port", str(free_broker_port()),
                            "--grpc-port", str(busy)], capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert f"gRPC endpoint (RocketMQ 5.x clients) off: cannot listen on grpcServerPort {busy}" in p.stdout
    assert "5 messages consumed" in p.stdout


async def test_the_endpoint_names_a_taken_port():
    from pocketmq.broker.proxy.server import GrpcEndpoint, GrpcPortInUse
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ep = GrpcEndpoint(None, {}, host="127.0.0.1", port=busy, advertised_host="127.0.0.1",
                          max_message_bytes=1 << 20)
        with pytest.raises(GrpcPortInUse, match=f"cannot listen on grpcServerPort {busy}"):
            await ep.start()
