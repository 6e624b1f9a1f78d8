"""Operating automatic failover (issue 31 item 4) against real processes: a real etcd, a
nameserver and broker replicas in controller mode (tests/support/failover_group.py), and
the real `mqadmin` command line.

* getSyncStateSet / getBrokerEpoch show the master, its epoch, the SyncStateSet {1, 2}
  and every replica; each replica's /metrics its epoch and role;
* electMaster -i <the slave> hands mastership over: the epoch rises, the new master's
  /metrics and the nameserver's route follow;
* electMaster to a live replica outside the SyncStateSet is refused (the master deletes
  the request) and says why; a group whose only in-sync replica died says it stays
  unavailable for writes;
* an unknown group, an unreachable etcd: one clear line, exit 1.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from pocketmq.client.instance import ClientInstance
from tests.support.daemons import free_port
from tests.support.etcd import SKIP_REASON, EtcdServer, etcd_available
from tests.support.failover_group import CLUSTER, GROUP, FailoverGroup
from tests.support.fault_proxy import Fault

pytestmark = [pytest.mark.asyncio, pytest.mark.skipif(not etcd_available(), reason=SKIP_REASON)]


@pytest.fixture
def etcd(tmp_path):
    with EtcdServer(str(tmp_path / "etcd")) as e:
        yield e


async def mqadmin(*args: str) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "pocketmq.tools.mqadmin", *args],
                                   capture_output=True, text=True, timeout=60)


def labels_of(block: str) -> dict[str, str]:
    """The `#Label  value` lines of a block (the table rows start with a digit)."""
    out = {}
    for line in block.splitlines():
        if line.startswith("#") and "  " in line:
            k, v = line.split(None, 1)
            out[k] = v.strip()
    return out


def rows_of(block: str, header: str = "#ReplicaId") -> dict[int, list[str]]:
    """The table under the header line starting with `header`: first cell -> the row's cells."""
    out, inside = {}, False
    for line in block.splitlines():
        if line.startswith("#"):
            inside = line.startswith(header)
        elif inside and line[:1].isdigit():
            out[int(line.split()[0])] = line.split()
        else:
            inside = False
    return out


def scrape(port: int) -> dict[str, float]:
    """`name{labels}` -> value of the pocketmq_failover_* samples."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("pocketmq_failover_"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def sample(samples: dict[str, float], name: str, **want: str) -> float:
    for key, value in samples.items():
        if key.split("{", 1)[0] == name and all(f'{k}="{v}"' in key for k, v in want.items()):
            return value
    raise AssertionError(f"no {name} {want} in {sorted(samples)}")


async def until(check, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = check()
            if inspect.isawaitable(got):
                got = await got
            if got:
                return got
        except (OSError, AssertionError):
            pass
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.1)


async def in_sync(g: FailoverGroup, want: set[int]):
    async def check():
        st = await g.state()
        return st is not None and set(st.sync_state_set) == want and st
    return await until(check, f"SyncStateSet {want}")


async def master_addr_on_namesrv(g: FailoverGroup) -> str | None:
    inst = ClientInstance(f"127.0.0.1@failover-admin-{os.getpid()}", g.namesrv_addr)
    try:
        brokers, _ = await inst.api.cluster_info(g.namesrv_addr)
    finally:
        await inst.close()
    bd = brokers.get(GROUP)
    return bd.broker_addrs.get(0) if bd is not None else None


async def test_sync_state_set_epoch_metrics_and_a_planned_switchover(tmp_path, etcd):
    ports = {1: free_port(), 2: free_port()}
    g = FailoverGroup(str(tmp_path), etcd.endpoint, replicas=2, extra_args=["--slaveSyncIntervalMillis=1000"],
                      replica_args={rid: [f"--metricsPort={p}"] for rid, p in ports.items()})
    await g.start()
    try:
        m = await g.master_id()
        s = 2 if m == 1 else 1
        await in_sync(g, {1, 2})
        a = etcd.endpoint
        r = await mqadmin("getSyncStateSet", "-a", a, "-b", GROUP)
        assert r.returncode == 0, r.stderr
        head = labels_of(r.stdout)
        assert head["#ClusterName"] == CLUSTER and head["#BrokerName"] == GROUP
        assert head["#MasterId"] == str(m) and head["#MasterAddr"] == g.replicas[m].addr
        assert head["#MasterEpoch"] == "1" and head["#SyncStateSet"] == "[1, 2]"
        assert head["#SyncStateSetNums"] == "2"
        rows = rows_of(r.stdout)
        assert rows[m][1:3] == ["MASTER", g.replicas[m].addr] and rows[s][1:3] == ["SLAVE", g.replicas[s].addr]
        assert rows[m][4:6] == ["true", "true"] and rows[s][4:6] == ["true", "true"]
        assert "NO MASTER" not in r.stdout
        # -c and no -b: every group of the cluster (the one here)
        r = await mqadmin("getSyncStateSet", "-a", a, "-c", CLUSTER)
        assert r.returncode == 0 and labels_of(r.stdout)["#BrokerName"] == GROUP, r.stderr
        r = await mqadmin("getBrokerEpoch", "-a", a, "-b", GROUP, "-c", CLUSTER)
        assert r.returncode == 0, r.stderr
        assert labels_of(r.stdout)["#MasterEpoch"] == "1"
        assert rows_of(r.stdout, "#Epoch")[1][:2] == ["1", "0"]            # epoch 1 from offset 0 (an empty log)
        # /metrics on each replica: its epoch and role
        for rid, role in ((m, "master"), (s, "slave")):
            got = await until(lambda rid=rid: asyncio.to_thread(scrape, ports[rid]), f"metrics of replica {rid}")
            assert sample(got, "pocketmq_failover_epoch") == 1
            assert sample(got, "pocketmq_failover_role", role=role, replica=str(rid)) == 1
            assert sample(got, "pocketmq_failover_lease_valid") == 1
            assert sample(got, "pocketmq_failover_sync_state_set_size") == 2
        assert sample(scrape(ports[m]), "pocketmq_failover_elections_won_total") == 0   # bootstrapped, not elected

        # the planned switchover to the slave
        r = await mqadmin("electMaster", "-a", a, "-b", GROUP, "-i", str(s))
        assert r.returncode == 0, r.stderr
        assert f"replica {s} is the master of {GROUP} now (was replica {m}, epoch 1 -> 2" in r.stdout
        out = labels_of(r.stdout)
        assert out["#BrokerMasterAddr"] == g.replicas[s].addr and out["#MasterEpoch"] == "2"
        st = await g.state()
        assert st.master == s and st.epoch == 2 and await g.master_id() == s
        await until(lambda: master_addr_on_namesrv(g), "anything on the nameserver")
        assert await until(lambda: _is(master_addr_on_namesrv(g), g.replicas[s].addr),
                           "the route names the new master")
        got = await until(lambda: _scraped_role(ports[s], "master"), "the new master's metrics")
        assert sample(got, "pocketmq_failover_epoch") == 2
        assert sample(got, "pocketmq_failover_epoch_changes_total") >= 2        # 0 -> 1 -> 2
        # the old master follows: a slave of epoch 2, back in the SyncStateSet
        got = await until(lambda: _scraped_role(ports[m], "slave"), "the old master's metrics as a slave")
        await in_sync(g, {1, 2})
        r = await mqadmin("getSyncStateSet", "-a", a, "-b", GROUP)
        assert labels_of(r.stdout)["#MasterId"] == str(s) and labels_of(r.stdout)["#MasterEpoch"] == "2"
        # electing the master again, or a replica nobody knows: refused, clearly
        r = await mqadmin("electMaster", "-a", a, "-b", GROUP, "-i", str(s))
        assert r.returncode == 1 and f"replica {s} is already the master of {GROUP} (epoch 2)" in r.stderr
        r = await mqadmin("electMaster", "-a", a, "-b", GROUP, "-i", "9", "-t", "10")
        assert r.returncode == 1, r.stdout
        assert "electMaster refused by the master" in r.stderr and "replica 9 is not alive" in r.stderr, r.stderr
        assert "master's log" in r.stderr
        assert (await g.state()).epoch == 2
        assert not g.tracebacks()
    finally:
        await g.stop()


async def _is(coro, want) -> bool:
    return await coro == want


async def _scraped_role(port: int, role: str):
    got = await asyncio.to_thread(scrape, port)
    return got if sample(got, "pocketmq_failover_role", role=role) == 1 else None


async def test_a_replica_outside_the_sync_state_set_is_refused_and_a_dead_set_is_said(tmp_path, etcd):
    g = FailoverGroup(str(tmp_path), etcd.endpoint, replicas=2, proxies=True,
                      extra_args=["--slaveSyncIntervalMillis=1000"])
    await g.start()
    try:
        m = await g.master_id()
        s = 2 if m == 1 else 1
        await in_sync(g, {1, 2})
        # the slave loses its HA link to the master (it copies through the master's HA proxy),
        # not its lease: alive, but out of the SyncStateSet
        proxy = g.replicas[m].ha_proxy
        proxy.set_fault(Fault.RESET)
        proxy.set_fault(Fault.BLACKHOLE)
        await in_sync(g, {m})
        a = etcd.endpoint
        r = await mqadmin("getSyncStateSet", "-a", a, "-b", GROUP)
        rows = rows_of(r.stdout)
        assert rows[s][4:6] == ["true", "false"], r.stdout          # alive, not in sync
        r = await mqadmin("electMaster", "-a", a, "-b", GROUP, "-i", str(s), "-t", "10")
        assert r.returncode == 1, r.stdout
        assert f"electMaster refused by the master of {GROUP} (replica {m})" in r.stderr, r.stderr
        assert f"replica {s} is not in the SyncStateSet [{m}]" in r.stderr, r.stderr
        st = await g.state()
        assert st.master == m and st.epoch == 1 and not (await g.snapshot()).requests
        # the master dies with the set of itself alone: no election, and mqadmin says so
        g.kill(m)
        await until(lambda: _no_leader(g), "the master's lease expires", timeout_s=15)
        r = await mqadmin("getSyncStateSet", "-a", a, "-b", GROUP)
        assert r.returncode == 0, r.stderr
        assert labels_of(r.stdout)["#MasterId"] == "-"
        text = " ".join(r.stdout.split())
        assert f"NO MASTER: replica {m} (master of epoch 1) lost its lease and no member of the SyncStateSet " \
               f"[{m}] is alive (alive: [{s}]): the group stays unavailable for writes" in text, r.stdout
        assert "enableElectUncleanMaster=true" in text
        r = await mqadmin("electMaster", "-a", a, "-b", GROUP, "-i", str(s))
        assert r.returncode == 1 and "has no master to hand over from" in r.stderr, r.stderr
        proxy.set_fault(Fault.PASS)
        assert not g.tracebacks()
    finally:
        await g.stop()


async def _no_leader(g: FailoverGroup) -> bool:
    return (await g.snapshot()).leader is None


async def test_unknown_group_and_unreachable_etcd_are_one_clear_line(tmp_path, etcd):
    g = FailoverGroup(str(tmp_path), etcd.endpoint, replicas=1)
    await g.start()
    try:
        r = await mqadmin("getSyncStateSet", "-a", etcd.endpoint, "-b", "no-such-group")
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.strip() == (f"mqadmin: broker group no-such-group not found in the controller (etcd "
                                    f"{etcd.endpoint}): known groups: {CLUSTER}/{GROUP} (is enableControllerMode "
                                    f"on?)")
        r = await mqadmin("getBrokerEpoch", "-a", etcd.endpoint, "-b", GROUP, "-c", "OtherCluster")
        assert r.returncode == 1 and "broker group broker-a in cluster OtherCluster not found" in r.stderr
        dead = f"127.0.0.1:{free_port()}"
        r = await mqadmin("electMaster", "-a", dead, "-b", GROUP, "-i", "1")
        assert r.returncode == 1
        assert r.stderr.strip() == f"mqadmin: cannot reach controller (etcd) {dead} (connection refused)"
        # a second endpoint that answers is used
        r = await mqadmin("getSyncStateSet", "-a", f"{dead};{etcd.endpoint}", "-b", GROUP)
        assert r.returncode == 0 and labels_of(r.stdout)["#MasterId"] == "1", r.stderr
    finally:
        await g.stop()
