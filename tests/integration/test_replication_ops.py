"""Operating replication against real brokers (in-process master and slave, real TCP on
loopback): GET_BROKER_HA_STATUS from both ends, the runtime info's replication keys,
mqadmin haStatus and clusterList, and the /metrics families, while the slave keeps up,
while its stream is held back (a fault proxy swallowing what the master sends) and once
its master is gone.

The slave copies asynchronously and nothing outside the brokers announces progress, so
what the views show is polled within a bound.
"""
from __future__ import annotations

import asyncio
import os
import re
import sys

from pocketmq.client import Message, Producer
from pocketmq.client.instance import ClientInstance
from tests.integration.test_metrics import scrape, value
from tests.support.daemons import free_port
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.replica_pair import LocalPair
from tests.support.workloads import ROOT, run_mqadmin


async def mqadmin(*args: str):
    return await asyncio.to_thread(run_mqadmin, *args, timeout_s=60)


async def until(fn, pred, what: str, timeout_s: float = 15.0):
    """fn() (a coroutine function) until pred(result), within timeout_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        got = await fn()
        if pred(got):
            return got
        assert loop.time() < deadline, f"timed out waiting for {what}; last: {got}"
        await asyncio.sleep(0.05)


def by_bid(text: str) -> dict[str, dict[str, str]]:
    """clusterList's rows by #BID, each {column: cell} (split on 2+ spaces: a cell never holds two)."""
    header, *rows = [re.split(r"\s{2,}", ln.strip()) for ln in text.splitlines() if ln.strip()]
    return {r[header.index("#BID")]: dict(zip(header, r)) for r in rows}


async def send(ns: str, n: int, topic: str = "OpsTopic") -> None:
    async with Producer(f"ops_pg_{os.getpid()}", ns) as p:
        for i in range(n):
            assert (await p.send(Message(topic, f"m{i}".encode()))).ok


async def test_a_sync_master_and_its_slave_in_step(tmp_path):
    m_metrics, s_metrics = free_port(), free_port()
    async with LocalPair(tmp_path, role="SYNC_MASTER", master_args=[f"--metricsPort={m_metrics}"],
                         slave_args=[f"--metricsPort={s_metrics}"]) as pair:
        ns, m_addr, s_addr = pair.namesrv_addr, pair.master.addr, pair.slave.addr
        await send(ns, 5)                      # each acknowledged once the slave has it
        end = await pair.caught_up()
        inst = ClientInstance(f"127.0.0.1@ops-{os.getpid()}", ns)
        try:
            master = await inst.api.broker_ha_status(m_addr)
            slave = await inst.api.broker_ha_status(s_addr)
            m_table = (await inst.api.broker_runtime_info(m_addr))["table"]
            s_table = (await inst.api.broker_runtime_info(s_addr))["table"]
        finally:
            await inst.close()
        # the master's view: Java's HARuntimeInfo fields, one slave with everything
        assert master["master"] is True and master["brokerRole"] == "SYNC_MASTER"
        assert master["masterCommitLogMaxOffset"] == end and master["inSyncSlaveNums"] == 1
        (conn,) = master["haConnectionInfo"]
        assert (conn["slaveAckOffset"], conn["diff"], conn["inSync"], conn["lagMillis"]) == (end, 0, True, 0)
        assert conn["transferFromWhere"] == end and conn["requestOffset"] == 0
        assert master["slaveFallBehindMuch"] == 0 and master["bytesSent"] == end
        # the slave's view: its master's HA address, its end, connected, and the same connection
        hc = slave["haClientRuntimeInfo"]
        assert slave["master"] is False and slave["brokerRole"] == "SLAVE" and slave["brokerId"] == 1
        assert hc["masterAddr"] == f"127.0.0.1:{pair.ports['m'][1]}"
        assert (hc["maxOffset"], hc["isActivated"], hc["lagBytes"], hc["lagMillis"]) == (end, True, 0, 0)
        assert hc["clientAddr"] == conn["addr"] and hc["state"].startswith("replicating from")
        assert hc["lastReadTimestamp"] > 0 and hc["bytesReceived"] == end
        # the runtime info carries the same, for clusterList's one request per broker
        assert (m_table["brokerRole"], m_table["brokerId"], m_table["haSlaveNum"]) == ("SYNC_MASTER", "0", "1")
        assert m_table[f"haSlaveLagBytes_{conn['addr']}"] == "0" and m_table["slaveFallBehindMuch"] == "0"
        assert (s_table["brokerRole"], s_table["brokerId"], s_table["haClientAddr"]) == ("SLAVE", "1", conn["addr"])

        # mqadmin haStatus: -b on each end, -c for every member
        r = await mqadmin("haStatus", "-n", ns, "-b", m_addr)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["#BrokerAddr", m_addr] and lines[1].split() == ["#Role", "SYNC_MASTER"]
        assert ["#SlaveNum", "1"] in [ln.split() for ln in lines]
        row = lines[-1].split()
        assert row[:4] + row[5:] == [conn["addr"], str(end), "0", "0", "OK", str(end)]
        assert float(row[4]) <= end / 1024            # KB/s in the last whole second
        r = await mqadmin("haStatus", "-n", ns, "-b", s_addr)
        assert r.returncode == 0, r.stderr
        kv = {ln.split()[0]: ln.split(None, 1)[1] for ln in r.stdout.splitlines()}
        assert kv["#Role"] == "SLAVE" and kv["#MasterAddr"] == hc["masterAddr"]
        assert (kv["#CommitLogMaxOffset"], kv["#LagBytes"], kv["#LagMs"]) == (str(end), "0", "0")
        assert kv["#State"].startswith("replicating from")
        r = await mqadmin("haStatus", "-n", ns, "-c", "DefaultCluster")
        assert r.returncode == 0, r.stderr
        assert [b.splitlines()[0].split()[1] for b in r.stdout.split("\n\n")] == [m_addr, s_addr]

        # clusterList: the role and lag columns, the slave's lag as its master sees it
        r = await mqadmin("clusterList", "-n", ns)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0].split()[:10] == ["#Cluster", "Name", "#Broker", "Name", "#BID", "#Addr",
                                                         "#Role", "#LagBytes", "#LagMs", "#Version"]
        t = by_bid(r.stdout)
        assert (t["0"]["#Addr"], t["0"]["#Role"], t["0"]["#LagBytes"], t["0"]["#LagMs"]) == (
            m_addr, "SYNC_MASTER", "0", "0")
        assert (t["1"]["#Addr"], t["1"]["#Role"], t["1"]["#LagBytes"], t["1"]["#LagMs"]) == (s_addr, "SLAVE", "0", "0")
        assert t["0"]["#InTotalToday"] == "5"

        # /metrics on both ends
        m = await scrape(f"http://127.0.0.1:{m_metrics}/metrics")
        assert value(m, "pocketmq_ha_slaves") == 1 and value(m, "pocketmq_ha_in_sync_slaves") == 1
        assert value(m, "pocketmq_ha_slave_lag_bytes", slave=conn["addr"]) == 0
        assert value(m, "pocketmq_ha_slave_lag_seconds", slave=conn["addr"]) == 0
        assert value(m, "pocketmq_ha_sent_bytes_total") == end
        assert value(m, "pocketmq_ha_sync_wait_seconds_count") == 5      # one wait per SYNC_MASTER send
        assert value(m, "pocketmq_ha_sync_wait_seconds_bucket", le="+Inf") == 5
        s = await scrape(f"http://127.0.0.1:{s_metrics}/metrics")
        assert value(s, "pocketmq_ha_connected") == 1 and value(s, "pocketmq_ha_lag_bytes") == 0
        assert value(s, "pocketmq_ha_received_bytes_total") == end
        assert value(s, "pocketmq_ha_slaves") is None


async def test_ha_status_repeats_with_an_interval_and_refuses_bad_use(tmp_path):
    async with LocalPair(tmp_path) as pair:
        ns = pair.namesrv_addr
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pocketmq.tools.mqadmin", "haStatus", "-n", ns, "-b", pair.master.addr,
            "-i", "1", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=ROOT, env=env)
        try:
            seen = 0
            async with asyncio.timeout(30):
                while seen < 2:          # printed again after the interval
                    line = await proc.stdout.readline()
                    assert line, (await proc.stderr.read()).decode()
                    seen += line.startswith(b"#BrokerAddr")
        finally:
            proc.terminate()
            await proc.wait()
        r = await mqadmin("haStatus", "-n", ns)
        assert r.returncode == 2 and "-b brokerAddr or -c clusterName" in r.stderr
        r = await mqadmin("haStatus", "-n", ns, "-c", "NoSuchCluster")
        assert r.returncode == 1 and "cluster NoSuchCluster not found" in r.stderr
        dead = f"127.0.0.1:{free_port()}"
        r = await mqadmin("haStatus", "-n", ns, "-b", dead)
        assert r.returncode == 1 and f"cannot reach broker {dead}" in r.stderr
        assert "Traceback" not in r.stderr


async def test_lag_while_the_stream_is_held_back_then_without_a_master(tmp_path):
    """The slave dials its master's HA port through a proxy (haMasterAddress), which then
    swallows what the master sends: the master's view shows the slave behind by what was
    sent since, and its age; the slave, hearing nothing for two heartbeats, shows its own
    silence; clusterList shows both (the proxy hides the slave's address from the master,
    so the slave row is the slave's own view). Released, the slave catches up to 0."""
    proxy_port = free_port()
    pair = LocalPair(tmp_path, common_args=["--haSendHeartbeatInterval=200"],
                     slave_args=[f"--haMasterAddress=127.0.0.1:{proxy_port}"], start_slave=False)
    async with pair:
        async with FaultProxy("127.0.0.1", pair.ports["m"][1], port=proxy_port) as proxy:
            await pair.start_slave()
            ns, m_addr, s_addr = pair.namesrv_addr, pair.master.addr, pair.slave.addr
            await send(ns, 3)
            before = await pair.caught_up()
            inst = ClientInstance(f"127.0.0.1@ops-lag-{os.getpid()}", ns)
            try:
                proxy.set_fault(Fault.BLACKHOLE, direction="to_client")
                await send(ns, 4)
                end = pair.master.store.commit_log_max_offset
                master = await until(lambda: inst.api.broker_ha_status(m_addr),
                                     lambda d: d["haConnectionInfo"][0]["lagMillis"] >= 300,
                                     "the master to see its slave 300 ms behind")
                (conn,) = master["haConnectionInfo"]
                assert conn["slaveAckOffset"] == before and conn["diff"] == end - before
                assert master["slaveFallBehindMuch"] == end - before
                slave = await until(lambda: inst.api.broker_ha_status(s_addr),
                                    lambda d: d["haClientRuntimeInfo"]["lagMillis"] > 400,
                                    "the slave to notice two heartbeats of silence")
                assert slave["haClientRuntimeInfo"]["isActivated"] is True     # the connection is up
                r = await mqadmin("clusterList", "-n", ns)
                assert r.returncode == 0, r.stderr
                t = by_bid(r.stdout)
                assert t["0"]["#LagBytes"] == str(end - before) and int(t["0"]["#LagMs"]) >= 300
                assert t["1"]["#Role"] == "SLAVE" and int(t["1"]["#LagMs"]) > 400
                r = await mqadmin("haStatus", "-n", ns, "-b", m_addr)
                assert r.stdout.splitlines()[-1].split()[:3] == [conn["addr"], str(before), str(end - before)]

                # released (the swallowed bytes broke the stream: the slave reconnects)
                proxy.clear_fault()
                proxy.reset_all()
                assert await pair.caught_up(20) == end
                master = await until(lambda: inst.api.broker_ha_status(m_addr),
                                     lambda d: [c["diff"] for c in d["haConnectionInfo"]] == [0],
                                     "the master to see its slave caught up")
                assert master["haConnectionInfo"][0]["lagMillis"] == 0 and master["inSyncSlaveNums"] == 1

                # the master goes: the slave says so and counts the silence
                await pair.stop_master()
                slave = await until(lambda: inst.api.broker_ha_status(s_addr),
                                    lambda d: not d["haClientRuntimeInfo"]["isActivated"],
                                    "the slave to lose its master")
                hc = slave["haClientRuntimeInfo"]
                assert hc["lagMillis"] >= 0 and hc["maxOffset"] == end and hc["clientAddr"] is None
                assert not hc["state"].startswith("replicating")
                r = await mqadmin("clusterList", "-n", ns)
                assert r.returncode == 0, r.stderr
                assert list(by_bid(r.stdout)) == ["1"] and by_bid(r.stdout)["1"]["#Role"] == "SLAVE"
            finally:
                await inst.close()
