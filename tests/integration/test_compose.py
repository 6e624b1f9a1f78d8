"""docker-compose.yml, run without Docker: every service's command as a local process.

tests/support/compose_runner.py maps the containers onto free local ports
(service names -> 127.0.0.1, volumes -> temp dirs, conf/ files -> rewritten
copies), starts the services in depends_on order and waits for each one's
healthcheck, as `docker compose up` does. Here: both brokers register with both
nameservers, a message sent through ns1's route is consumed through ns2's, every
healthcheck passes while the cluster runs and a broker's fails once it stops.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from pocketmq.client import LitePullConsumer, Message, Producer
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.message import decode_offset_msg_id
from tests.support.compose_runner import ComposeRunner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPOSE = os.path.join(ROOT, "docker-compose.yml")
BROKERS = {"broker-a": 10911, "broker-b": 10921}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    runner = ComposeRunner(COMPOSE, str(tmp_path_factory.mktemp("compose")))
    runner.up()
    yield runner
    runner.down()


def mqadmin(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pocketmq.tools.mqadmin", *args],
                          capture_output=True, text=True, timeout=60)


async def cluster_of(namesrv_addr: str) -> tuple[dict[str, str], set[str]]:
    """({brokerName: master address}, DefaultCluster's members), as this one nameserver knows them."""
    inst = ClientInstance(f"127.0.0.1@compose-test-{os.getpid()}", namesrv_addr)
    try:
        brokers, clusters = await inst.api.cluster_info(namesrv_addr)
    finally:
        await inst.close()
    return {name: bd.broker_addrs[0] for name, bd in brokers.items()}, set(clusters.get("DefaultCluster", ()))


def test_both_brokers_register_with_both_nameservers(project):
    expected = {name: project.address(name, port) for name, port in BROKERS.items()}
    for ns in ("ns1", "ns2"):
        assert asyncio.run(cluster_of(project.address(ns, 9876))) == (expected, set(BROKERS)), ns


def test_sent_through_ns1_consumed_through_ns2(project):
    ns1, ns2 = project.address("ns1", 9876), project.address("ns2", 9876)
    created = mqadmin("updateTopic", "-t", "ComposeOrders", "-c", "DefaultCluster", "-r", "2", "-w", "2",
                      "-n", ns1)
    assert created.returncode == 0, created.stderr
    bodies = [f"order-{i}".encode() for i in range(12)]

    async def run() -> tuple[set, list]:
        async with Producer("ComposeProducer", ns1) as producer:
            results = [await producer.send(Message("ComposeOrders", b)) for b in bodies]
        stored_on = {r.queue.broker_name for r in results}
        consumer = LitePullConsumer("ComposeReaders", ns2, consume_from_where="FIRST_OFFSET")
        consumer.subscribe("ComposeOrders", "*")
        got = []
        async with asyncio.timeout(60):
            async with consumer:
                async for msg in consumer:
                    got.append((msg.broker_name, msg.body))
                    if len(got) == len(bodies):
                        break
        return stored_on, got

    stored_on, got = asyncio.run(run())
    assert stored_on == set(BROKERS)          # the producer's round robin used both brokers
    assert sorted(b for _, b in got) == sorted(bodies)
    assert {name for name, _ in got} == set(BROKERS)


def test_every_healthcheck_passes_then_a_stopped_broker_fails_its_own(project):
    for name in project.services:
        check = project.run_healthcheck(name)
        assert check.returncode == 0, f"{name}: {check.stdout}{check.stderr}"
    # The check is a real request: with broker-b stopped (it unregisters), its route is gone.
    assert project.stop("broker-b") == 0
    check = project.run_healthcheck("broker-b")
    assert check.returncode != 0 and "broker-b" in check.stderr
    assert project.run_healthcheck("broker-a").returncode == 0


def test_broker_ip_override_and_host_names(tmp_path):
    """POCKETMQ_BROKER_IP replaces the service name a broker advertises; a host name there
    (not an IP) is resolved for the records' store host, as Java's InetSocketAddress does."""
    runner = ComposeRunner(COMPOSE, str(tmp_path), env={"POCKETMQ_BROKER_IP": "localhost"})
    assert "--brokerIP1=localhost" in runner.local_command("broker-a")
    try:
        for name in ("ns1", "broker-a"):
            runner.start(name)
            runner.wait_healthy(name)
        ns1 = runner.address("ns1", 9876)
        port = runner.services["broker-a"].local_ports[10911]

        async def run():
            addrs, _ = await cluster_of(ns1)
            async with Producer("OverrideProducer", ns1) as producer:
                result = await producer.send(Message("OverrideTopic", b"x"))
            return addrs, result

        addrs, result = asyncio.run(run())
        assert addrs == {"broker-a": f"localhost:{port}"}
        ip, stored_port, _ = decode_offset_msg_id(result.offset_msg_id)
        assert (ip, stored_port) == ("127.0.0.1", port)
    finally:
        runner.down()

