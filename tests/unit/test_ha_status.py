"""The replication view without sockets: HARuntimeInfo built from fake HA ends over the
reference store (broker/processors/ha_status.py), its runtime-info keys, the processor,
the per-second rate (broker/services/ha.py SecondRate), the /metrics families, and what
mqadmin makes of it (clusterList's role and lag cells, haStatus's text)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pocketmq.broker.config import BrokerConfig
from pocketmq.broker.core.replication import SlaveView
from pocketmq.broker.processors.ha_status import (
    ha_runtime_info,
    lag_millis,
    process_get_broker_ha_status,
    record_timestamp,
    runtime_keys,
)
from pocketmq.broker.services.ha import SecondRate
from pocketmq.broker.services.metrics import BrokerCollector
from pocketmq.broker.store.memory_store import MemoryStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.metrics import LatencyHistogram, RequestLatency
from pocketmq.tools.mqadmin.cluster import Member, format_ha_status, is_replicated, replication_cells

SEGMENT = 4096
HOST = (b"\x7f\x00\x00\x01", 5555)


class Clock:
    def __init__(self, ms: int = 0) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def store(tmp_path):
    s = MemoryStore(StoreConfig(str(tmp_path), mapped_file_size_commit_log=SEGMENT, store_host=HOST))
    s.open()
    return s


def put(store, body_size: int, ts: int):
    r = store.put("T", 0, 0, b"x" * body_size, b"", 0, ts, HOST, ts)
    return r.wrote_offset, r.wrote_offset + r.wrote_bytes


class FakeMaster:
    def __init__(self, views, acked_max: int, mono: Clock, gap_max: int = 1000) -> None:
        self._views = views
        self.acked_max = acked_max
        self.mono_ms = mono
        self.gap_max = gap_max
        self.bytes_sent = 12345

    def views(self):
        return self._views

    def transfer_rates(self):
        return {v.remote: 2048 for v in self._views}


class FakeSlave:
    def __init__(self, mono: Clock, **kw) -> None:
        self.mono_ms = mono
        self.master_ha_addr = "10.0.0.1:10912"
        self.connected = True
        self.master_offset = 500
        self.last_frame_ms = 0
        self.last_report_ms = 0
        self.local_addr = "10.0.0.2:40000"
        self.state = "replicating from 10.0.0.1:10912"
        self.error = None
        self.bytes_received = 777
        self.receive_rate = SimpleNamespace(per_second=lambda: 4096)
        self.own_end = 500
        self.report_s = 5.0
        self.__dict__.update(kw)

    def lag_bytes(self):
        return -1 if self.master_offset < 0 else max(0, self.master_offset - self.own_end)


# ---------------------------------------------------------------------------- the rate

def test_second_rate_is_the_last_whole_second():
    clock = Clock(10_000)
    r = SecondRate(clock)
    assert r.per_second() == 0
    r.add(100)
    clock.ms = 10_900
    r.add(50)
    assert r.per_second() == 0            # second 10 is not over: the one before carried nothing
    clock.ms = 11_000
    assert r.per_second() == 150          # second 10, whole
    r.add(7)
    clock.ms = 12_500
    assert r.per_second() == 7
    clock.ms = 14_000                     # a silent second in between: nothing in the last one
    assert r.per_second() == 0
    r.add(1)
    clock.ms = 15_000
    assert r.per_second() == 1


# ---------------------------------------------------------------------------- the view

def test_record_timestamp_steps_over_a_segment_tail(store):
    _, end1 = put(store, 3000, 1_000)
    start2, end2 = put(store, 3000, 2_000)        # does not fit: the next segment
    assert start2 == SEGMENT and end1 < SEGMENT
    assert record_timestamp(store, 0, SEGMENT) == 1_000
    assert record_timestamp(store, end1, SEGMENT) == 2_000      # the blank tail: the next record
    assert record_timestamp(store, end2, SEGMENT) == -1         # the end: nothing there
    assert lag_millis(store, end1, 5_000, SEGMENT) == 3_000
    assert lag_millis(store, end2, 5_000, SEGMENT) == 0         # has everything
    assert lag_millis(store, -1, 5_000, SEGMENT) == -1          # no ack yet


def test_master_view(store):
    _, a = put(store, 100, 1_000)
    _, b = put(store, 100, 4_000)
    mono = Clock(50_000)
    views = [SlaveView("10.0.0.2:40000", 0, a, b, 20_000, 49_000),     # one record behind
             SlaveView("10.0.0.3:40001", -1, -1, -1, 49_900, 49_900)]  # connected, no ack yet
    cfg = BrokerConfig(brokerRole="SYNC_MASTER", mappedFileSizeCommitLog=SEGMENT)
    info = ha_runtime_info(store, cfg, FakeMaster(views, acked_max=a, mono=mono, gap_max=b - a + 1),
                           None, now_ms=lambda: 1_000_000 + 10_000)
    assert info["master"] is True and info["brokerRole"] == "SYNC_MASTER" and info["brokerId"] == 0
    assert info["masterCommitLogMaxOffset"] == b
    c1, c2 = info["haConnectionInfo"]
    assert c1 == {"addr": "10.0.0.2:40000", "slaveAckOffset": a, "diff": b - a, "inSync": True,
                  "transferredByteInSecond": 2048, "transferFromWhere": b,
                  "lagMillis": 1_010_000 - 4_000, "requestOffset": 0,
                  "connectedTimestamp": 1_010_000 - 30_000, "lastAckTimestamp": 1_010_000 - 1_000}
    assert c2["diff"] == b and c2["inSync"] is False and c2["lagMillis"] == -1 and c2["lastAckTimestamp"] == 0
    assert info["inSyncSlaveNums"] == 1
    assert info["slaveFallBehindMuch"] == b - a and info["slaveFallBehindMillis"] == 1_010_000 - 4_000
    assert info["bytesSent"] == 12345
    # Java's HAClientRuntimeInfo shape, its defaults on a master
    assert info["haClientRuntimeInfo"] == {"masterAddr": None, "transferredByteInSecond": 0, "maxOffset": 0,
                                           "lastReadTimestamp": 0, "lastWriteTimestamp": 0,
                                           "masterFlushOffset": 0, "isActivated": False}
    keys = runtime_keys(info)
    assert keys == {"brokerRole": "SYNC_MASTER", "brokerId": 0, "haSlaveNum": 2, "haInSyncSlaveNum": 1,
                    "slaveFallBehindMuch": b - a, "slaveFallBehindMillis": 1_006_000,
                    "haSlaveLagBytes_10.0.0.2:40000": b - a, "haSlaveLagMillis_10.0.0.2:40000": 1_006_000,
                    "haSlaveLagBytes_10.0.0.3:40001": b, "haSlaveLagMillis_10.0.0.3:40001": -1}


def test_master_without_slaves_and_caught_up(store):
    _, a = put(store, 100, 1_000)
    info = ha_runtime_info(store, BrokerConfig(), FakeMaster([], acked_max=a, mono=Clock(1)), None,
                           now_ms=lambda: 9_000)
    assert info["haConnectionInfo"] == [] and info["inSyncSlaveNums"] == 0
    assert info["slaveFallBehindMuch"] == 0 and info["slaveFallBehindMillis"] == 0
    assert runtime_keys(info)["haSlaveNum"] == 0


def test_slave_view(store):
    _, end = put(store, 100, 1_000)
    mono = Clock(100_000)
    cfg = BrokerConfig(brokerRole="SLAVE", brokerId=1)
    slave = FakeSlave(mono, master_offset=end, own_end=end, last_frame_ms=99_000, last_report_ms=98_000)
    info = ha_runtime_info(store, cfg, None, slave, now_ms=lambda: 5_000_000)
    assert info["master"] is False and info["brokerRole"] == "SLAVE" and info["brokerId"] == 1
    assert info["haConnectionInfo"] == [] and info["masterCommitLogMaxOffset"] == 0
    assert info["haClientRuntimeInfo"] == {
        "masterAddr": "10.0.0.1:10912", "transferredByteInSecond": 4096, "maxOffset": end,
        "lastReadTimestamp": 4_999_000, "lastWriteTimestamp": 4_998_000, "masterFlushOffset": 0,
        "isActivated": True, "masterOffset": end, "lagBytes": 0, "lagMillis": 0,
        "state": "replicating from 10.0.0.1:10912", "error": None, "clientAddr": "10.0.0.2:40000",
        "bytesReceived": 777}
    assert runtime_keys(info) == {"brokerRole": "SLAVE", "brokerId": 1, "haMasterAddr": "10.0.0.1:10912",
                                  "haState": "replicating from 10.0.0.1:10912", "haLagBytes": 0,
                                  "haLagMillis": 0, "haClientAddr": "10.0.0.2:40000"}
    # connected, but nothing from the master for more than two heartbeat intervals: that is lag
    mono.ms = 99_000 + 10_001
    assert ha_runtime_info(store, cfg, None, slave, now_ms=lambda: 1)["haClientRuntimeInfo"]["lagMillis"] == 10_001
    mono.ms = 100_000
    # disconnected: its lag is the time since the master's last frame; its address is gone
    slave.connected = False
    slave.state = slave.error = "diverged: ..."
    hc = ha_runtime_info(store, cfg, None, slave, now_ms=lambda: 5_000_000)["haClientRuntimeInfo"]
    assert hc["lagMillis"] == 1_000 and hc["isActivated"] is False and hc["clientAddr"] is None
    assert hc["error"] == "diverged: ..."
    # never heard from a master
    fresh = FakeSlave(mono, master_offset=-1, connected=False, master_ha_addr=None)
    hc = ha_runtime_info(store, cfg, None, fresh, now_ms=lambda: 5_000_000)["haClientRuntimeInfo"]
    assert (hc["lagBytes"], hc["lagMillis"], hc["lastReadTimestamp"], hc["masterAddr"]) == (-1, -1, 0, None)
    assert runtime_keys(ha_runtime_info(store, cfg, None, fresh, now_ms=lambda: 1))["haMasterAddr"] == ""


def test_the_processor_answers_the_view_as_json():
    cmd = RemotingCommand(RequestCode.GET_BROKER_HA_STATUS)
    ctx = SimpleNamespace(ha_status=lambda: {"master": True, "inSyncSlaveNums": 1})
    r = process_get_broker_ha_status(ctx, None, cmd)
    assert r.code == ResponseCode.SUCCESS and json.loads(r.body) == {"master": True, "inSyncSlaveNums": 1}
    r = process_get_broker_ha_status(SimpleNamespace(ha_status=None), None, cmd)
    assert r.code == ResponseCode.SYSTEM_ERROR


# ---------------------------------------------------------------------------- /metrics

def scrape(info: dict, wait: LatencyHistogram | None = None) -> dict:
    broker = SimpleNamespace(ctx=SimpleNamespace(ha_status=lambda: info),
                             ha_master=SimpleNamespace(wait_latency=wait) if wait is not None else None)
    collector = BrokerCollector(broker, RequestLatency(), LatencyHistogram(), lambda: 0.5)

    class Replication:      # the collector's replication families only

        def collect(self):
            return collector._replication("C", "broker-a")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Replication())
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(generate_latest(registry).decode()) for s in fam.samples}


def test_metrics_of_a_master(store):
    _, a = put(store, 100, 1_000)
    _, b = put(store, 100, 4_000)
    views = [SlaveView("10.0.0.2:40000", 0, a, b, 0, 0)]
    info = ha_runtime_info(store, BrokerConfig(), FakeMaster(views, acked_max=a, mono=Clock(1)), None,
                           now_ms=lambda: 6_500)
    wait = LatencyHistogram()
    wait.observe(0.003)
    wait.observe(0.2)
    m = scrape(info, wait)
    one = (("broker", "broker-a"), ("cluster", "C"))
    per = (("broker", "broker-a"), ("cluster", "C"), ("slave", "10.0.0.2:40000"))
    assert m[("pocketmq_ha_slave_lag_bytes", per)] == b - a
    assert m[("pocketmq_ha_slave_lag_seconds", per)] == 2.5
    assert m[("pocketmq_ha_slave_in_sync", per)] == 1
    assert m[("pocketmq_ha_slaves", one)] == 1 and m[("pocketmq_ha_in_sync_slaves", one)] == 1
    assert m[("pocketmq_ha_unreplicated_bytes", one)] == b - a
    assert m[("pocketmq_ha_sent_bytes_total", one)] == 12345
    assert m[("pocketmq_ha_sync_wait_seconds_count", one)] == 2
    assert m[("pocketmq_ha_sync_wait_seconds_bucket", one + (("le", "0.005"),))] == 1
    assert not any(name.startswith("pocketmq_ha_lag") for name, _ in m)


def test_metrics_of_a_slave(store):
    slave = FakeSlave(Clock(10_000), master_offset=900, own_end=400, connected=False, last_frame_ms=7_500)
    m = scrape(ha_runtime_info(store, BrokerConfig(brokerRole="SLAVE", brokerId=1), None, slave,
                               now_ms=lambda: 1))
    one = (("broker", "broker-a"), ("cluster", "C"))
    assert m[("pocketmq_ha_lag_bytes", one)] == 500
    assert m[("pocketmq_ha_lag_seconds", one)] == 2.5
    assert m[("pocketmq_ha_connected", one)] == 0
    assert m[("pocketmq_ha_received_bytes_total", one)] == 777
    assert not any(name.startswith(("pocketmq_ha_slave", "pocketmq_ha_sync")) for name, _ in m)


# ---------------------------------------------------------------------------- mqadmin

MASTER_T = {"brokerRole": "SYNC_MASTER", "haSlaveNum": "1", "slaveFallBehindMuch": "300",
            "slaveFallBehindMillis": "40", "haSlaveLagBytes_10.0.0.2:40000": "120",
            "haSlaveLagMillis_10.0.0.2:40000": "15"}


def test_cluster_list_cells():
    master = Member("C", "broker-a", 0, "10.0.0.1:10911", MASTER_T)
    slave = Member("C", "broker-a", 1, "10.0.0.2:10911",
                   {"brokerRole": "SLAVE", "haClientAddr": "10.0.0.2:40000", "haLagBytes": "0", "haLagMillis": "0"})
    # a slave's lag is its master's view of its HA connection, else its own
    assert replication_cells(master, MASTER_T) == ("SYNC_MASTER", "300", "40")
    assert replication_cells(slave, MASTER_T) == ("SLAVE", "120", "15")
    assert replication_cells(slave, None) == ("SLAVE", "0", "0")
    lost = slave._replace(table={"brokerRole": "SLAVE", "haClientAddr": "", "haLagBytes": "-1",
                                 "haLagMillis": "-1"})
    assert replication_cells(lost, MASTER_T) == ("SLAVE", "-", "-")
    lonely = master._replace(table={"brokerRole": "ASYNC_MASTER", "haSlaveNum": "0", "slaveFallBehindMuch": "9"})
    assert replication_cells(lonely, None) == ("ASYNC_MASTER", "-", "-")
    assert replication_cells(master._replace(table=None), None) == ("-", "-", "-")
    # the columns appear with replication only: a lone ASYNC_MASTER keeps the old table
    assert not is_replicated([lonely, master._replace(name="b", table=None)])
    assert is_replicated([lonely, slave]) and is_replicated([master])
    assert is_replicated([lonely._replace(table={"brokerRole": "ASYNC_MASTER", "haSlaveNum": "1"})])


def test_ha_status_text():
    master = {"master": True, "brokerRole": "SYNC_MASTER", "masterCommitLogMaxOffset": 1000, "inSyncSlaveNums": 1,
              "slaveFallBehindMuch": 100, "slaveFallBehindMillis": 25,
              "haConnectionInfo": [{"addr": "10.0.0.2:40000", "slaveAckOffset": 900, "diff": 100, "inSync": True,
                                    "transferredByteInSecond": 2048, "transferFromWhere": 1000, "lagMillis": 25},
                                   {"addr": "10.0.0.3:40001", "slaveAckOffset": -1, "diff": 1000,
                                    "inSync": False, "transferredByteInSecond": 0, "transferFromWhere": -1,
                                    "lagMillis": -1}]}
    lines = format_ha_status("10.0.0.1:10911", master).splitlines()
    assert [ln.split()[0] for ln in lines[:8]] == ["#BrokerAddr", "#Role", "#MasterAddr",
                                                  "#MasterCommitLogMaxOffset", "#SlaveNum", "#InSyncSlaveNum",
                                                  "#SlaveFallBehindBytes", "#SlaveFallBehindMs"]
    assert lines[0].split() == ["#BrokerAddr", "10.0.0.1:10911"] and lines[1].split() == ["#Role", "SYNC_MASTER"]
    assert lines[4].split() == ["#SlaveNum", "2"] and lines[5].split() == ["#InSyncSlaveNum", "1"]
    assert lines[8].split() == ["#SlaveAddr", "#SlaveAckOffset", "#Diff", "#LagMs", "#TransferSpeed(KB/s)",
                                "#Status", "#TransferFromWhere"]
    assert lines[9].split() == ["10.0.0.2:40000", "900", "100", "25", "2.00", "OK", "1000"]
    assert lines[10].split() == ["10.0.0.3:40001", "-1", "1000", "-", "0.00", "Fall", "Behind", "-1"]
    slave = {"master": False, "brokerRole": "SLAVE",
             "haClientRuntimeInfo": {"masterAddr": "10.0.0.1:10912", "transferredByteInSecond": 1536,
                                     "maxOffset": 900, "lastReadTimestamp": 0, "lastWriteTimestamp": 0,
                                     "masterFlushOffset": 0, "isActivated": False, "masterOffset": 1000,
                                     "lagBytes": 100, "lagMillis": 3000, "state": "diverged: at 800",
                                     "error": "diverged: at 800"}}
    kv = {ln.split(None, 1)[0]: ln.split(None, 1)[1] for ln in format_ha_status("10.0.0.2:10911", slave).splitlines()}
    assert kv == {"#BrokerAddr": "10.0.0.2:10911", "#Role": "SLAVE", "#MasterAddr": "10.0.0.1:10912",
                  "#CommitLogMaxOffset": "900", "#TransferSpeed(KB/s)": "1.50", "#LastReadTime": "-",
                  "#LastWriteTime": "-", "#MasterFlushOffset": "0", "#MasterOffset": "1000", "#LagBytes": "100",
                  "#LagMs": "3000", "#State": "diverged: at 800", "#Error": "diverged: at 800"}
