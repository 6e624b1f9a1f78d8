"""docker-compose.yml and conf/ without Docker: the compose specification's schema,
the file's own promises (issue 12), and the runner's mapping rules.

The cluster itself runs in tests/integration/test_compose.py.
"""
from __future__ import annotations

import copy
import http.server
import json
import os
import threading

import jsonschema
import pytest
import yaml

from pocketmq.broker import config as broker_config
from pocketmq.nameserver import config as namesrv_config
from tests.support.compose_runner import (
    ComposeError,
    ComposeRunner,
    etcdctl_health,
    interpolate,
    load_compose,
    start_order,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPOSE = os.path.join(ROOT, "docker-compose.yml")
SCHEMA = os.path.join(ROOT, "tests", "support", "compose-spec.json")
BROKERS = {"broker-a": 10911, "broker-b": 10921}
SLAVES = {"broker-a-s": ("broker-a", 10915), "broker-b-s": ("broker-b", 10925)}   # profile replicas
REPLICAS = {"broker-c-1": 10931, "broker-c-2": 10935, "broker-c-3": 10939}       # profile failover (+ etcd)


@pytest.fixture(scope="module")
def validator():
    with open(SCHEMA) as f:
        schema = json.load(f)
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def doc():
    return load_compose(COMPOSE)


def errors(validator, document) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_file_follows_the_compose_specification(validator, doc):
    assert errors(validator, doc) == []
    # as written too, before variables are substituted (what `docker compose config` reads)
    with open(COMPOSE) as f:
        assert errors(validator, yaml.safe_load(f)) == []


@pytest.mark.parametrize("mutate", [
    lambda d: d["services"]["ns1"].update(portz=["9876:9876"]),
    lambda d: d["services"]["broker-a"]["healthcheck"].update(interval=10),
    lambda d: d["services"]["broker-a"].update(depends_on={"ns1": {"condition": "when_ready"}}),
    lambda d: d.update(volumes=["broker-a-store"]),
])
def test_the_schema_catches_a_broken_file(validator, doc, mutate):
    broken = copy.deepcopy(doc)
    mutate(broken)
    assert errors(validator, broken) != []


def test_two_nameservers_two_brokers_one_image(doc):
    services = {n: s for n, s in doc["services"].items() if not s.get("profiles")}
    assert set(services) == {"ns1", "ns2", *BROKERS}
    for name, s in doc["services"].items():
        assert s["healthcheck"]["test"][0] == "CMD", name
        if name == "etcd":      # the one service from another image (profile failover)
            continue
        assert s["build"] == "." and s["image"] == "pocketmq:local", name
        assert s["command"][0] == ("mqnamesrv" if name.startswith("ns") else "mqbroker")
    assert services["ns1"]["ports"] == ["9876:9876"] and services["ns2"]["ports"] == ["9877:9876"]
    for name, port in BROKERS.items():
        s = services[name]
        assert s["ports"] == [f"{port}:{port}"]       # the same port inside and out (see the conf)
        assert f"{name}-store:/home/pocketmq/store" in s["volumes"]
        assert f"./conf/{name}.conf:/etc/pocketmq/broker.conf:ro" in s["volumes"]
        assert s["depends_on"] == {"ns1": {"condition": "service_healthy"},
                                   "ns2": {"condition": "service_healthy"}}
        assert f"--brokerIP1={name}" in s["command"]    # POCKETMQ_BROKER_IP unset
    assert set(doc["volumes"]) == {"ns1-kv", "ns2-kv", "broker-a-store", "broker-b-store",
                                   "broker-a-s-store", "broker-b-s-store", "etcd-data",
                                   *(f"{r}-store" for r in REPLICAS)}


def test_the_replicas_profile_adds_one_slave_per_broker(doc):
    services = doc["services"]
    assert {n for n, s in services.items() if s.get("profiles") == ["replicas"]} == set(SLAVES)
    assert {n for n, s in services.items() if s.get("profiles")} == {*SLAVES, *REPLICAS, "etcd"}
    for name, (master, port) in SLAVES.items():
        s = services[name]
        assert s["profiles"] == ["replicas"]
        assert s["ports"] == [f"{port}:{port}"]
        assert f"{name}-store:/home/pocketmq/store" in s["volumes"]
        assert f"./conf/{name}.conf:/etc/pocketmq/broker.conf:ro" in s["volumes"]
        assert s["depends_on"] == {"ns1": {"condition": "service_healthy"}, "ns2": {"condition": "service_healthy"},
                                   master: {"condition": "service_healthy"}}
        assert f"--brokerIP1={name}" in s["command"]
        assert s["healthcheck"]["test"][:4] == ["CMD", "mqadmin", "haStatus", "-b"]
        assert s["healthcheck"]["test"][4] == f"127.0.0.1:{port}"
    for master, port in BROKERS.items():      # the HA port: on the compose network, not published
        assert services[master]["expose"] == [str(port + 1)]


@pytest.mark.parametrize("name", sorted(SLAVES))
def test_slave_conf_follows_its_master(name):
    """conf/broker-X-s.conf: a SLAVE (brokerId 1) of broker-X's brokerName and cluster, its own
    port, the master's segment size (its commit log is a byte copy); the master registers
    its HA port under its service name (brokerIP2), whatever brokerIP1 the host override sets."""
    master_name, port = SLAVES[name]
    slave, report = broker_config.load_config(os.path.join(ROOT, "conf", f"{name}.conf"))
    master, _ = broker_config.load_config(os.path.join(ROOT, "conf", f"{master_name}.conf"))
    assert report.unused_keys == ()
    assert slave.brokerRole == broker_config.BrokerRole.SLAVE and slave.brokerId == 1
    assert (slave.brokerName, slave.brokerClusterName) == (master.brokerName, master.brokerClusterName)
    assert slave.namesrvAddr == master.namesrvAddr and slave.brokerIP1 == name
    assert slave.listenPort == port and slave.storePathRootDir == master.storePathRootDir
    assert slave.mappedFileSizeCommitLog == master.mappedFileSizeCommitLog
    assert slave.haMasterAddress is None      # learnt from the nameservers
    assert master.haListenPort == master.listenPort + 1 and master.brokerIP2 == master_name


def test_the_failover_profile_runs_etcd_and_a_group_of_three_replicas(doc):
    services = doc["services"]
    etcd = services["etcd"]
    assert etcd["profiles"] == ["failover"] and etcd["image"].startswith("quay.io/coreos/etcd:v3.5.")
    assert "build" not in etcd and etcd["networks"] == ["pocketmq"]
    assert etcd["command"][0] == "etcd" and "--advertise-client-urls=http://etcd:2379" in etcd["command"]
    assert "--listen-client-urls=http://0.0.0.0:2379" in etcd["command"]
    assert etcd["healthcheck"]["test"] == ["CMD", "etcdctl", "--endpoints=http://127.0.0.1:2379", "endpoint",
                                           "health"]
    assert "etcd-data:/etcd-data" in etcd["volumes"] and "--data-dir=/etcd-data" in etcd["command"]
    for name, port in REPLICAS.items():
        s = services[name]
        assert s["profiles"] == ["failover"] and s["build"] == "."
        assert s["ports"] == [f"{port}:{port}"] and s["expose"] == [str(port + 1), "5557"]
        assert f"{name}-store:/home/pocketmq/store" in s["volumes"]
        assert f"./conf/{name}.conf:/etc/pocketmq/broker.conf:ro" in s["volumes"]
        assert s["depends_on"] == {"ns1": {"condition": "service_healthy"}, "ns2": {"condition": "service_healthy"},
                                   "etcd": {"condition": "service_healthy"}}
        assert f"--brokerIP1={name}" in s["command"]
        assert s["healthcheck"]["test"][:5] == ["CMD", "mqadmin", "haStatus", "-b", f"127.0.0.1:{port}"]


@pytest.mark.parametrize("name", sorted(REPLICAS))
def test_replica_conf_is_controller_mode(name):
    """conf/broker-c-N.conf: replica N (brokerId N) of broker-c in controller mode on the etcd
    service, SYNC_MASTER with every SyncStateSet member acknowledging, its own ports (HA =
    listen + 1) advertised under its service name, the group's shared segment size."""
    config, report = broker_config.load_config(os.path.join(ROOT, "conf", f"{name}.conf"))
    assert report.unused_keys == ()
    assert config.enableControllerMode and config.etcdEndpoints == "etcd:2379"
    assert (config.brokerName, config.brokerClusterName) == ("broker-c", "DefaultCluster")
    assert config.brokerId == int(name[-1])
    assert config.brokerRole == broker_config.BrokerRole.SYNC_MASTER and config.allAckInSyncStateSet
    assert config.listenPort == REPLICAS[name] and config.haListenPort == REPLICAS[name] + 1
    assert config.brokerIP1 == name and config.brokerIP2 == name and config.metricsPort == 5557
    assert config.namesrvAddr == "ns1:9876;ns2:9876" and config.storePathRootDir == "/home/pocketmq/store"
    first, _ = broker_config.load_config(os.path.join(ROOT, "conf", "broker-c-1.conf"))
    assert config.mappedFileSizeCommitLog == first.mappedFileSizeCommitLog


def test_runner_maps_etcd_and_the_failover_replicas(tmp_path):
    runner = ComposeRunner(COMPOSE, str(tmp_path), profiles=["failover"])
    assert set(runner.services) == {"ns1", "ns2", *BROKERS, "etcd", *REPLICAS}
    order = start_order(runner.services)
    assert all(order.index("etcd") < order.index(r) for r in REPLICAS)
    client, peer = runner.address("etcd", 2379), runner.address("etcd", 2380)
    cmd = runner.local_command("etcd")
    assert f"--listen-client-urls=http://{client}" in cmd and f"--advertise-client-urls=http://{client}" in cmd
    assert f"--initial-cluster=etcd=http://{peer}" in cmd and f"--listen-peer-urls=http://{peer}" in cmd
    assert f"--data-dir={tmp_path}/volumes/etcd-data" in cmd
    check = runner.local_healthcheck("etcd")
    assert f"--endpoints=http://{client}" in check and check[-2:] == ["endpoint", "health"]
    s = runner.services["broker-c-2"]
    runner._materialise_mounts(s)
    conf = open(runner.local_command("broker-c-2")[2]).read()
    assert f"etcdEndpoints={client}\n" in conf and f"listenPort={s.local_ports[10935]}\n" in conf
    assert f"haListenPort={s.local_ports[10936]}\n" in conf and f"metricsPort={s.local_ports[5557]}\n" in conf
    assert "brokerIP2=127.0.0.1\n" in conf and "brokerId=2\n" in conf


def test_the_etcdctl_stand_in_asks_health(tmp_path, capsys):
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"health":"true"}' if self.path == "/health" else b"{}"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        assert etcdctl_health([f"--endpoints={url}", "endpoint", "health"]) == 0
        assert capsys.readouterr().out == f"{url} is healthy\n"
        assert etcdctl_health([f"--endpoints={url},127.0.0.1:1", "endpoint", "health"]) == 1
        assert etcdctl_health(["get", "x"]) == 2
    finally:
        server.shutdown()


@pytest.mark.parametrize("name", sorted(BROKERS))
def test_broker_conf_is_a_real_broker_conf(name):
    """conf/broker-X.conf loads with mqbroker's own loader, every key known and acted on (brokerRole too)."""
    config, report = broker_config.load_config(os.path.join(ROOT, "conf", f"{name}.conf"))
    assert config.brokerName == name and config.brokerClusterName == "DefaultCluster"
    assert config.brokerId == 0
    assert config.namesrvAddr == "ns1:9876;ns2:9876"
    assert config.brokerIP1 == name
    assert config.listenPort == BROKERS[name]
    assert config.storePathRootDir == "/home/pocketmq/store"
    assert report.unused_keys == ()                  # every key is one pocketmq acts on


def test_nameserver_command_line_loads(doc):
    for ns in ("ns1", "ns2"):
        config, _ = namesrv_config.parse_args(doc["services"][ns]["command"][1:])
        assert config.listenPort == 9876
        assert config.kvConfigPath == "/home/pocketmq/namesrv/kvConfig.json"


def test_interpolation_follows_compose():
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("${SET:-d} ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} $SET $$SET", env) == "v d d  v $SET"
    assert interpolate({"a": ["${UNSET}x"]}, env) == {"a": ["x"]}
    with pytest.raises(ComposeError, match="REQUIRED"):
        interpolate("${REQUIRED:?set it}", env)


def test_runner_maps_addresses_ports_volumes_and_the_broker_ip_override(tmp_path):
    runner = ComposeRunner(COMPOSE, str(tmp_path))
    assert start_order(runner.services)[-2:] == ["broker-a", "broker-b"]
    ns1, ns2 = runner.address("ns1", 9876), runner.address("ns2", 9876)
    a_port = runner.services["broker-a"].local_ports[10911]
    assert runner.local_command("ns1")[1:] == [f"--listenPort={ns1.split(':')[1]}",
                                               f"--kvConfigPath={tmp_path}/volumes/ns1-kv/kvConfig.json"]
    assert runner.local_command("broker-a")[-1] == "--brokerIP1=127.0.0.1"
    assert runner.local_healthcheck("broker-a")[1:] == ["topicStatus", "-t", "broker-a", "-n", f"{ns1};{ns2}"]
    assert runner.local_healthcheck("ns2")[-1] == ns2        # 127.0.0.1:9876 inside ns2 is ns2 itself
    runner._materialise_mounts(runner.services["broker-a"])
    conf = open(runner.local_command("broker-a")[2]).read()
    assert f"namesrvAddr={ns1};{ns2}\n" in conf and f"listenPort={a_port}\n" in conf
    assert f"storePathRootDir={tmp_path}/volumes/broker-a-store\n" in conf
    assert "brokerIP1=127.0.0.1\n" in conf and "brokerName=broker-a\n" in conf
    override = ComposeRunner(COMPOSE, str(tmp_path / "o"), env={"POCKETMQ_BROKER_IP": "127.0.0.1"})
    assert override.local_command("broker-b")[-1] == "--brokerIP1=127.0.0.1"


def test_runner_runs_a_profile_only_when_it_is_active(tmp_path):
    assert not set(SLAVES) & set(ComposeRunner(COMPOSE, str(tmp_path / "d")).services)
    for runner in (ComposeRunner(COMPOSE, str(tmp_path / "p"), profiles=["replicas"]),
                   ComposeRunner(COMPOSE, str(tmp_path / "e"), env={"COMPOSE_PROFILES": "other,replicas"})):
        assert set(runner.services) == {"ns1", "ns2", *BROKERS, *SLAVES}
        order = start_order(runner.services)
        assert order.index("broker-a") < order.index("broker-a-s")
        assert order.index("broker-b") < order.index("broker-b-s")


def test_runner_maps_the_ha_port_and_the_slave(tmp_path):
    runner = ComposeRunner(COMPOSE, str(tmp_path), profiles=["replicas"])
    ha = runner.services["broker-a"].local_ports[10912]      # exposed: mapped like a published port
    runner._materialise_mounts(runner.services["broker-a"])
    conf = open(runner.local_command("broker-a")[2]).read()
    assert f"haListenPort={ha}\n" in conf and "brokerIP2=127.0.0.1\n" in conf
    runner._materialise_mounts(runner.services["broker-a-s"])
    conf = open(runner.local_command("broker-a-s")[2]).read()
    assert f"listenPort={runner.services['broker-a-s'].local_ports[10915]}\n" in conf
    assert "brokerIP1=127.0.0.1\n" in conf and "brokerRole=SLAVE\n" in conf
    assert f"storePathRootDir={tmp_path}/volumes/broker-a-s-store\n" in conf
    assert runner.local_healthcheck("broker-a-s")[1:4] == ["haStatus", "-b", runner.address("broker-a-s", 10915)]


def test_runner_refuses_a_dependency_on_an_inactive_profile(tmp_path):
    compose = tmp_path / "docker-compose.yml"
    compose.write_text("services:\n  a:\n    command: [x]\n    profiles: [p]\n"
                       "  b:\n    command: [x]\n    depends_on: [a]\n")
    with pytest.raises(ComposeError, match="service a of an inactive profile"):
        ComposeRunner(str(compose), str(tmp_path))
    assert set(ComposeRunner(str(compose), str(tmp_path / "p"), profiles=["p"]).services) == {"a", "b"}


def test_runner_refuses_a_port_it_cannot_move(tmp_path):
    compose = tmp_path / "docker-compose.yml"
    compose.write_text("services:\n  ns:\n    command: [mqnamesrv]\n    ports: ['9876:9876']\n")
    with pytest.raises(ComposeError, match="sets no listenPort=9876"):
        ComposeRunner(str(compose), str(tmp_path))
