"""mqadmin's controller-mode commands without etcd (tools/mqadmin/controller.py): the keys
and values it reads are the broker's own (checked against broker/core/failover.py and
broker/services/consensus.py, which the tools may not import), what getSyncStateSet,
getBrokerEpoch and electMaster print, how a switchover's outcome is read, the flags, and
an unreachable etcd; and the failover families of the broker's /metrics."""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pocketmq.broker.core.failover import AliveInfo, GroupState
from pocketmq.broker.services import failover
from pocketmq.broker.services.consensus import EtcdConsensus
from pocketmq.broker.services.metrics import BrokerCollector
from pocketmq.tools.mqadmin import controller as C
from pocketmq.tools.mqadmin.cli import COMMANDS, build_parser, main
from pocketmq.tools.mqadmin.errors import AdminError, UsageError


def state(master=1, epoch=2, sss=(1, 2), sss_epoch=3, history=((1, 0), (2, 500))) -> tuple[str, bytes]:
    return "state", GroupState(master, epoch, frozenset(sss), sss_epoch, tuple(history)).encode()


def alive(rid, end, epoch=2) -> tuple[str, bytes]:
    return f"alive/{rid}", AliveInfo(rid, f"10.0.0.{rid}:10911", f"10.0.0.{rid}:10912", end, epoch).encode()


def leader(rid) -> tuple[str, bytes]:
    return "leader", f"{rid}:7587886ff6a3b01b".encode()


def view(*items) -> C.GroupView:
    return C.group_view("DefaultCluster", "broker-a", items)


# ------------------------------------------------------------------ the broker's keys and values

def test_the_key_layout_is_the_brokers():
    consensus = EtcdConsensus(["127.0.0.1:2379"])       # no connection until a call
    ctl = C.Controller("127.0.0.1:2379")
    assert inspect.signature(EtcdConsensus).parameters["prefix"].default == C.PREFIX
    assert ctl._base("DefaultCluster", "broker-a") == consensus._group("DefaultCluster", "broker-a")
    assert ctl.request_key("C", "g", C.SWITCHOVER) == consensus._request_key("C", "g", failover.SWITCHOVER)
    assert C.SWITCHOVER == failover.SWITCHOVER
    assert C.ELECT_WAIT_S > failover.SWITCHOVER_WAIT_S      # the master's wait for the target fits in ours


def test_the_values_are_read_as_the_broker_writes_them():
    v = view(state(), leader(1), alive(1, 900), alive(2, 700, epoch=1), ("request/switchover", b"2"))
    assert (v.master, v.epoch, v.sync_state_set, v.sync_state_set_epoch) == (1, 2, (1, 2), 3)
    assert v.history == ((1, 0), (2, 500)) and v.leader == 1 and v.has_state
    assert v.alive[2] == C.Replica(2, "10.0.0.2:10911", "10.0.0.2:10912", 700, 1)
    assert v.requests == {"switchover": "2"} and v.master_addr == "10.0.0.1:10911"
    assert not view(alive(1, 0)).has_state


@pytest.mark.parametrize("item, why", [
    (("state", b"{not json"), "unreadable state of broker group broker-a in the controller: not JSON"),
    (("state", b'{"master": 1, "epoch": "2", "syncStateSet": [1], "syncStateSetEpoch": 1}'),
     "field 'epoch' is not an integer: '2'"),
    (("state", b'{"master": 1, "epoch": 2, "syncStateSet": "1", "syncStateSetEpoch": 1}'),
     "syncStateSet is not a list of replica ids"),
    (("alive/3", b"[]"), "unreadable alive record 3 of broker group broker-a in the controller: not a JSON object"),
])
def test_an_unreadable_value_is_one_clear_error(item, why):
    with pytest.raises(AdminError, match=why.replace("(", r"\(").replace("[", r"\[")):
        view(item)


# ------------------------------------------------------------------ getSyncStateSet

def test_sync_state_set_of_a_group_with_its_master():
    text = C.format_sync_state_set(view(state(sss=(1, 2)), leader(1), alive(1, 900), alive(2, 700), alive(3, 100)))
    assert text == "\n".join([
        "#ClusterName        DefaultCluster",
        "#BrokerName         broker-a",
        "#MasterId           1",
        "#MasterAddr         10.0.0.1:10911",
        "#MasterEpoch        2",
        "#SyncStateSet       [1, 2]",
        "#SyncStateSetEpoch  3",
        "#SyncStateSetNums   2",
        "#ReplicaId  #Role   #Addr           #HaAddr         #Alive  #InSyncStateSet  #LogEnd  #LagBytes  #LastEpoch",
        "1           MASTER  10.0.0.1:10911  10.0.0.1:10912  true    true                 900          0           2",
        "2           SLAVE   10.0.0.2:10911  10.0.0.2:10912  true    true                 700        200           2",
        "3           SLAVE   10.0.0.3:10911  10.0.0.3:10912  true    false                100        800           2",
    ])


def test_a_dead_member_a_pending_switchover_and_a_log_end_past_the_masters():
    text = C.format_sync_state_set(view(state(sss=(1, 2, 3)), leader(1), alive(1, 900), alive(3, 950),
                                        ("request/switchover", b"3")))
    lines = text.splitlines()
    assert "#PendingSwitchover  to replica 3" in lines
    assert lines[-2].split() == ["2", "-", "-", "-", "false", "true", "-", "-", "-"]
    assert lines[-1].split()[-3:] == ["950", "0", "2"]        # ahead in its last report: no lag, never negative
    assert "NO MASTER" not in text


def test_no_master_while_a_live_member_can_be_elected():
    v = view(state(master=1, sss=(1, 2)), alive(2, 700))
    text = C.format_sync_state_set(v)
    assert "#MasterId           -" in text and "#MasterAddr         -" in text
    assert text.splitlines()[-1] == ("NO MASTER: replica 1 (master of epoch 2) lost its lease; the live members of "
                                     "the SyncStateSet [2] elect a new one (within a few seconds)")
    row = [r for r in text.splitlines() if r.startswith("2 ")][0].split()
    assert row[1] == "-" and row[-2] == "-"               # no master: no role, no lag to measure


def test_no_master_and_no_live_member_stays_unavailable_and_says_so():
    note = C.no_master_note(view(state(master=1, sss=(1,)), alive(2, 700), alive(3, 10)))
    assert note == ("NO MASTER: replica 1 (master of epoch 2) lost its lease and no member of the SyncStateSet [1] "
                    "is alive (alive: [2, 3]): the group stays unavailable for writes until one returns. The other "
                    "replicas may lack acknowledged messages: they are elected only with "
                    "enableElectUncleanMaster=true")
    assert C.no_master_note(view(state(), leader(2), alive(2, 0))) is None


# ------------------------------------------------------------------ getBrokerEpoch

def test_broker_epoch_history_and_each_replicas_last_epoch():
    text = C.format_broker_epoch(view(state(epoch=3, history=((1, 0), (2, 500), (3, 800))), leader(2),
                                      alive(2, 1000, epoch=3), alive(1, 800, epoch=2)))
    assert text == "\n".join([
        "#ClusterName  DefaultCluster",
        "#BrokerName   broker-a",
        "#MasterId     2",
        "#MasterEpoch  3",
        "#Epoch  #StartOffset  #EndOffset",
        "1                  0         500",
        "2                500         800",
        "3                800        1000",
        "#ReplicaId  #Role   #LastEpoch  #LogEnd",
        "1           SLAVE            2      800",
        "2           MASTER           3     1000",
    ])


def test_broker_epoch_without_a_live_master_leaves_the_last_epoch_open():
    lines = C.format_broker_epoch(view(state(epoch=2), alive(2, 600))).splitlines()
    assert lines[6].split() == ["2", "500", "-"]
    assert lines[-1].startswith("NO MASTER: replica 1 (master of epoch 2) lost its lease; the live members")


# ------------------------------------------------------------------ electMaster

def test_switchover_outcomes():
    before = view(state(epoch=2), leader(1), alive(1, 0), alive(2, 0), ("request/switchover", b"2"))
    pending = view(state(epoch=2), leader(1), ("request/switchover", b"2"))
    assert C.switchover_outcome(before, pending, 2) == C.PENDING
    assert C.switchover_outcome(before, view(state(master=2, epoch=3, sss=(2,))), 2) == C.DONE
    assert C.switchover_outcome(before, view(state(master=1, epoch=3, sss=(1,))), 2) == C.OTHER
    # carried out: the request goes in the same transaction as the new state; refused: alone
    assert C.switchover_outcome(before, view(state(epoch=2), leader(1)), 2) == C.REFUSED


def test_why_a_switchover_was_refused():
    v = view(state(sss=(1, 2)), leader(1), alive(1, 0), alive(2, 0), alive(3, 0))
    assert C.refusal_reason(v, 9) == "replica 9 is not alive (no live record in the controller; alive: [1, 2, 3])"
    assert C.refusal_reason(v, 3).startswith("replica 3 is not in the SyncStateSet [1, 2]: it may lack acknowledged")
    assert C.refusal_reason(v, 2).startswith("replica 2 was not connected to the master, did not catch up")


def test_elect_master_result():
    before = view(state(), leader(1), alive(1, 0), alive(2, 0))
    after = view(state(master=2, epoch=3, sss=(2,), sss_epoch=4), leader(2), alive(1, 0), alive(2, 0, epoch=3))
    assert C.format_elect_result(after, before, 0.4321) == "\n".join([
        "replica 2 is the master of broker-a now (was replica 1, epoch 2 -> 3, 0.43 s)",
        "#ClusterName        DefaultCluster",
        "#BrokerName         broker-a",
        "#BrokerMasterAddr   10.0.0.2:10911",
        "#MasterId           2",
        "#MasterEpoch        3",
        "#SyncStateSetEpoch  4",
        "#SyncStateSet       [2]",
        "\t#Broker\t1\t10.0.0.1:10911",
        "\t#Broker\t2\t10.0.0.2:10911",
    ])
    assert C._serving(after, 2) and not C._serving(after, 1)
    assert not C._serving(view(state(master=2, epoch=3), leader(2), alive(2, 0, epoch=2)), 2)


# ------------------------------------------------------------------ flags, endpoints, errors

def test_endpoints():
    assert C.parse_endpoints(" 10.0.0.1:2379; etcd:2379,http://h:1 ") == [("10.0.0.1", 2379), ("etcd", 2379),
                                                                         ("h", 1)]
    for bad in ("etcd", "etcd:", ":2379", "etcd:port", "etcd:70000", " ; "):
        with pytest.raises(UsageError):
            C.parse_endpoints(bad)


def test_etcd_reasons():
    assert C.etcd_reason(TimeoutError()) == "no answer within 3s"
    assert C.etcd_reason(OSError("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: "
                                 "Failed to connect to remote host: Connection refused")) == "connection refused"
    assert C.etcd_reason(OSError("errors resolving nope:2379: [Domain name not found]")) == "unknown host"


def test_flags_are_rocketmqs():
    p = build_parser(COMMANDS["electMaster"])
    a = p.parse_args(["-a", "etcd:2379", "-b", "broker-a", "-i", "2"])
    assert (a.controllerAddress, a.brokerName, a.brokerId, a.clusterName, a.timeout) == \
        ("etcd:2379", "broker-a", 2, None, 20)
    for argv in (["-b", "broker-a", "-i", "2"], ["-a", "e:1", "-i", "2"], ["-a", "e:1", "-b", "x", "-i", "two"]):
        with pytest.raises(UsageError):
            p.parse_args(argv)
    for name in ("getSyncStateSet", "getBrokerEpoch"):
        a = build_parser(COMMANDS[name]).parse_args(["-a", "e:1", "-c", "C", "-i", "5"])
        assert (a.brokerName, a.clusterName, a.interval) == (None, "C", 5)
        assert not COMMANDS[name].needs_namesrv


def test_an_unreachable_controller_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("NAMESRV_ADDR", raising=False)
    assert main(["getSyncStateSet", "-a", "127.0.0.1:1", "-b", "broker-a"]) == 1
    assert capsys.readouterr().err == "mqadmin: cannot reach controller (etcd) 127.0.0.1:1 (connection refused)\n"
    assert main(["electMaster", "-a", "127.0.0.1:1;127.0.0.1:2", "-b", "broker-a", "-i", "2"]) == 1
    assert capsys.readouterr().err == ("mqadmin: cannot reach any controller (etcd): 127.0.0.1:1 (connection "
                                       "refused); 127.0.0.1:2 (connection refused)\n")
    assert main(["getBrokerEpoch", "-a", "etcd", "-b", "broker-a"]) == 2
    assert "bad controller (etcd) address 'etcd'" in capsys.readouterr().err


# ------------------------------------------------------------------ /metrics under a FailoverAgent

def failover_samples(agent_status: dict, confirm, max_offset=1000, elections=0, epoch_changes=0) -> dict:
    agent = SimpleNamespace(replica_id=2, status=lambda: agent_status, elections_won=elections,
                            epoch_changes=epoch_changes)
    broker = SimpleNamespace(link=SimpleNamespace(agent=agent),
                             store=SimpleNamespace(confirm_offset=confirm, commit_log_max_offset=max_offset))
    collector = BrokerCollector.__new__(BrokerCollector)
    collector.broker = broker

    class Failover:
        def collect(self):
            return collector._failover("C", "broker-a")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Failover())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(generate_latest(registry).decode()) for s in fam.samples}


def test_failover_metrics():
    st = {"role": "master", "epoch": 4, "leaseValid": True, "syncStateSet": [1, 2, 3], "lastElectionMillis": 1500.0}
    m = failover_samples(st, confirm=800, elections=2, epoch_changes=3)
    one = (("broker", "broker-a"), ("cluster", "C"), ("replica", "2"))
    assert m[("pocketmq_failover_epoch", one)] == 4
    assert m[("pocketmq_failover_role", one + (("role", "master"),))] == 1
    assert m[("pocketmq_failover_role", one + (("role", "slave"),))] == 0
    assert m[("pocketmq_failover_role", one + (("role", "none"),))] == 0
    assert m[("pocketmq_failover_sync_state_set_size", one)] == 3
    assert m[("pocketmq_failover_last_election_seconds", one)] == 1.5
    assert m[("pocketmq_failover_lease_valid", one)] == 1
    assert m[("pocketmq_failover_confirm_offset", one)] == 800
    assert m[("pocketmq_failover_elections_won_total", one)] == 2
    assert m[("pocketmq_failover_epoch_changes_total", one)] == 3
    st = {"role": "none", "epoch": 0, "leaseValid": False, "syncStateSet": [], "lastElectionMillis": -1.0}
    m = failover_samples(st, confirm=None)
    assert m[("pocketmq_failover_role", one + (("role", "none"),))] == 1
    assert m[("pocketmq_failover_last_election_seconds", one)] == -1
    assert m[("pocketmq_failover_lease_valid", one)] == 0
    assert m[("pocketmq_failover_confirm_offset", one)] == 1000      # nothing awaited: the log's end


def test_no_failover_metrics_without_an_agent():
    collector = BrokerCollector.__new__(BrokerCollector)
    collector.broker = SimpleNamespace(link=None)
    assert list(collector._failover("C", "broker-a")) == []
