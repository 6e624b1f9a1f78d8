"""docker-compose.yml, run without Docker: every service's command as a local process.

tests/support/compose_runner.py maps the containers onto free local ports
(service names -> 127.0.0.1, volumes -> temp dirs, conf/ files -> rewritten
copies), starts the services in depends_on order and waits for each one's
healthcheck, as `docker compose up` does. Here: both brokers register with both
nameservers, a message sent through ns1's route is consumed through ns2's, every
healthcheck passes while the cluster runs and a broker's fails once it stops. With the
`replicas` profile (`docker compose --profile replicas up -d`): each brokerName has its
slave as brokerId 1 on both nameservers, what is sent to a master is pulled from its
slave, and mqadmin haStatus / clusterList show the slaves in sync. With the `failover`
profile: etcd and broker-c's three controller-mode replicas are healthy, elect a master
that mqadmin getSyncStateSet, the nameservers' route and /metrics name, and replace it when
it is SIGKILLed.
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from pocketmq.client import LitePullConsumer, Message, Producer
from pocketmq.client.api import PullRequest, PullResult, pull_sys_flag
from pocketmq.client.errors import TopicNotExistError
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.message import decode_offset_msg_id
from tests.support.compose_runner import ComposeRunner
from tests.support.etcd import SKIP_REASON as ETCD_SKIP
from tests.support.etcd import etcd_available

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPOSE = os.path.join(ROOT, "docker-compose.yml")
BROKERS = {"broker-a": 10911, "broker-b": 10921}
SLAVES = {"broker-a-s": ("broker-a", 10915), "broker-b-s": ("broker-b", 10925)}


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



# ------------------------------------------------------------------ profile replicas

@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    runner = ComposeRunner(COMPOSE, str(tmp_path_factory.mktemp("compose-replicas")), profiles=["replicas"])
    runner.up()
    yield runner
    runner.down()


async def members_of(namesrv_addr: str) -> dict[str, dict[int, str]]:
    inst = ClientInstance(f"127.0.0.1@compose-replicas-{os.getpid()}", namesrv_addr)
    try:
        brokers, _ = await inst.api.cluster_info(namesrv_addr)
    finally:
        await inst.close()
    return {name: dict(bd.broker_addrs) for name, bd in brokers.items()}


def test_each_broker_name_has_its_slave_on_both_nameservers(replicas):
    expected = {master: {0: replicas.address(master, BROKERS[master]), 1: replicas.address(slave, port)}
                for slave, (master, port) in SLAVES.items()}
    for ns in ("ns1", "ns2"):
        assert asyncio.run(members_of(replicas.address(ns, 9876))) == expected, ns
    for name in SLAVES:
        check = replicas.run_healthcheck(name)
        assert check.returncode == 0, f"{name}: {check.stdout}{check.stderr}"


async def _pull_from(inst: ClientInstance, addr: str, mq: MessageQueue, offset: int, timeout_s: float = 30.0):
    """Pull `mq` at `offset` from the broker at `addr` until the message is there (the slave
    copies the log asynchronously and learns a new topic from its master's metadata a little
    later: bounded polling, there is nothing to wait on from outside)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            r = await inst.api.pull_message(PullRequest(addr, "ComposeSlaveReaders", mq, offset, 1,
                                                        pull_sys_flag(False, False, True), 0, 0, "*", 0, 5.0))
            if r.status == PullResult.FOUND:
                return r.records[0]
        except TopicNotExistError:
            pass
        assert asyncio.get_running_loop().time() < deadline, f"offset {offset} of {mq} never reached {addr}"
        await asyncio.sleep(0.1)


def test_sent_to_a_master_is_pulled_from_its_slave(replicas):
    ns1 = replicas.address("ns1", 9876)
    slave_of = {master: replicas.address(slave, port) for slave, (master, port) in SLAVES.items()}

    async def run():
        async with Producer("ComposeReplicaProducer", ns1) as producer:
            results = [await producer.send(Message("ComposeReplicated", f"r{i}".encode())) for i in range(6)]
        inst = ClientInstance(f"127.0.0.1@compose-slave-reader-{os.getpid()}", ns1)
        try:
            return results, [await _pull_from(inst, slave_of[r.queue.broker_name], r.queue, r.queue_offset)
                             for r in results]
        finally:
            await inst.close()

    results, copies = asyncio.run(run())
    assert {r.queue.broker_name for r in results} == set(BROKERS)     # both masters took some
    assert [m.body for m in copies] == [f"r{i}".encode() for i in range(6)]
    assert [m.offset_msg_id for m in copies] == [r.offset_msg_id for r in results]   # the same record


def test_ha_status_and_cluster_list_show_the_slaves(replicas):
    ns1 = replicas.address("ns1", 9876)
    r = mqadmin("haStatus", "-c", "DefaultCluster", "-n", ns1)
    assert r.returncode == 0, r.stderr
    blocks = r.stdout.split("\n\n")
    assert len(blocks) == 4
    for slave, (master, port) in SLAVES.items():
        master_block = next(b for b in blocks if b.splitlines()[0].split() == [
            "#BrokerAddr", replicas.address(master, BROKERS[master])])
        assert "#SlaveNum" in master_block and "OK" in master_block, master_block
        slave_block = next(b for b in blocks if b.splitlines()[0].split() == [
            "#BrokerAddr", replicas.address(slave, port)])
        assert "SLAVE" in slave_block and "replicating from" in slave_block, slave_block
    r = mqadmin("clusterList", "-n", ns1)
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0].split()
    assert header[:8] == ["#Cluster", "Name", "#Broker", "Name", "#BID", "#Addr", "#Role", "#LagBytes"]
    roles = {(row.split()[1], row.split()[2]): row.split()[4] for row in r.stdout.splitlines()[1:]}
    assert roles == {("broker-a", "0"): "ASYNC_MASTER", ("broker-a", "1"): "SLAVE",
                     ("broker-b", "0"): "ASYNC_MASTER", ("broker-b", "1"): "SLAVE"}


# ------------------------------------------------------------------ profile failover

REPLICAS = {"broker-c-1": 10931, "broker-c-2": 10935, "broker-c-3": 10939}


@pytest.fixture(scope="module")
def failover(tmp_path_factory):
    if not etcd_available():
        pytest.skip(ETCD_SKIP)
    runner = ComposeRunner(COMPOSE, str(tmp_path_factory.mktemp("compose-failover")), profiles=["failover"])
    runner.up()
    yield runner
    runner.down()


def sync_state_set(runner: ComposeRunner) -> dict[str, str]:
    """getSyncStateSet's `#Label value` lines for broker-c, through the etcd service."""
    r = mqadmin("getSyncStateSet", "-a", runner.address("etcd", 2379), "-b", "broker-c")
    assert r.returncode == 0, r.stderr
    return dict(line.split(None, 1) for line in r.stdout.splitlines() if line.startswith("#") and "  " in line)


def wait_for(check, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def failover_metric(runner: ComposeRunner, service: str, name: str) -> dict[str, float]:
    """The samples of one pocketmq_failover_* family of a replica's /metrics: labels text -> value."""
    with urllib.request.urlopen(f"http://{runner.address(service, 5557)}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(name + "{")}


def test_the_failover_group_elects_a_master_and_replaces_it_when_it_dies(failover):
    for name in ("etcd", *REPLICAS):
        check = failover.run_healthcheck(name)
        assert check.returncode == 0, f"{name}: {check.stdout}{check.stderr}"
    state = wait_for(lambda: (lambda s: s["#SyncStateSet"] == "[1, 2, 3]" and s)(sync_state_set(failover)),
                     "all three replicas in the SyncStateSet")
    master = f"broker-c-{state['#MasterId']}"
    assert state["#MasterAddr"] == failover.address(master, REPLICAS[master]) and state["#MasterEpoch"] == "1"
    ns1 = failover.address("ns1", 9876)
    assert asyncio.run(members_of(ns1))["broker-c"][0] == failover.address(master, REPLICAS[master])
    roles = failover_metric(failover, master, "pocketmq_failover_role")
    assert [k for k, v in roles.items() if v == 1] == [
        f'pocketmq_failover_role{{broker="broker-c",cluster="DefaultCluster",replica="{master[-1]}",role="master"}}']
    # a message stored on broker-c's master: the group acknowledges it once every member has it
    created = mqadmin("updateTopic", "-t", "ComposeFailover", "-b", failover.address(master, REPLICAS[master]),
                      "-r", "2", "-w", "2", "-n", ns1)
    assert created.returncode == 0, created.stderr

    async def send() -> str:
        async with Producer("ComposeFailoverProducer", ns1) as producer:
            r = await producer.send(Message("ComposeFailover", b"kept"))
        return r.status.name
    assert asyncio.run(send()) == "SEND_OK"
    # SIGKILL the master: another replica of the SyncStateSet takes over, the route follows
    failover.procs[master].kill()
    state = wait_for(lambda: (lambda s: s["#MasterId"] not in ("-", master[-1]) and s)(sync_state_set(failover)),
                     "a new master", timeout_s=30)
    new = f"broker-c-{state['#MasterId']}"
    assert state["#MasterEpoch"] == "2"
    wait_for(lambda: asyncio.run(members_of(ns1))["broker-c"].get(0) == failover.address(new, REPLICAS[new]),
             "the route names the new master", timeout_s=30)
    assert failover_metric(failover, new, "pocketmq_failover_epoch") == {
        f'pocketmq_failover_epoch{{broker="broker-c",cluster="DefaultCluster",replica="{new[-1]}"}}': 2.0}
