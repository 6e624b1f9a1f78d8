"""controllerStore / pysyncobjEndpoints (broker/config.py): which consensus client the
failover agent builds, and controller mode refusing to start without the chosen store's
endpoints. No sockets: both clients connect on their first call."""
import pytest

from pocketmq.broker.config import ConfigError, ControllerStore, parse_args
from pocketmq.broker.services.consensus import EtcdConsensus
from pocketmq.broker.services.consensus_pso import PsoConsensus
from pocketmq.broker.services.failover import FailoverAgent

CONTROLLER = ["--enableControllerMode=true", "--brokerId=1", "--controllerLeaseSeconds=4"]


def agent(*args: str) -> FailoverAgent:
    config, _ = parse_args([*CONTROLLER, *args])
    return FailoverAgent(config, broker_factory=None)


def test_etcd_is_the_default_store():
    a = agent("--etcdEndpoints=127.0.0.1:2379;127.0.0.1:2380")
    assert a.config.controllerStore is ControllerStore.etcd
    assert isinstance(a.consensus, EtcdConsensus)
    assert [a.consensus.endpoint(i) for i in range(2)] == ["127.0.0.1:2379", "127.0.0.1:2380"]


def test_pysyncobj_store_builds_its_client_on_its_own_endpoints():
    a = agent("--controllerStore=pysyncobj", "--pysyncobjEndpoints=127.0.0.1:7001,127.0.0.1:7002;127.0.0.1:7003",
              "--etcdEndpoints=127.0.0.1:2379")
    assert isinstance(a.consensus, PsoConsensus)
    assert [a.consensus.endpoint(i) for i in range(3)] == ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
    assert a.consensus.timeout_s == 1.0          # the agent's rule: TTL / 4, as with etcd
    assert a.consensus.prefix == "/pocketmq"


@pytest.mark.parametrize("store, missing", [("etcd", "etcdEndpoints"), ("pysyncobj", "pysyncobjEndpoints")])
def test_controller_mode_needs_the_chosen_stores_endpoints(store, missing):
    other = "--pysyncobjEndpoints=127.0.0.1:7001" if store == "etcd" else "--etcdEndpoints=127.0.0.1:2379"
    with pytest.raises(ConfigError) as caught:
        parse_args([*CONTROLLER, f"--controllerStore={store}", other])
    assert caught.value.key == missing
    assert missing in str(caught.value)


def test_an_unknown_store_is_refused_naming_the_choices():
    with pytest.raises(ConfigError) as caught:
        parse_args([*CONTROLLER, "--controllerStore=zookeeper", "--etcdEndpoints=127.0.0.1:2379"])
    assert caught.value.key == "controllerStore"
    assert "etcd" in str(caught.value) and "pysyncobj" in str(caught.value)
