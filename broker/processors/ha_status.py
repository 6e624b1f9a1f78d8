"""The replication view, built in one place: GET_BROKER_HA_STATUS (907), the runtime info's
HA keys (processors/stats.py), /metrics (services/metrics.py) and mqadmin haStatus /
clusterList all read `ha_runtime_info`'s dict.

The dict is RocketMQ 5's HARuntimeInfo JSON, with its field names (fastjson's spelling of
the getters: `master`, `inSync`) plus pocketmq's additions, which a Java reader ignores:

    {"master": bool, "masterCommitLogMaxOffset": int, "inSyncSlaveNums": int,
     "haConnectionInfo": [{"addr", "slaveAckOffset", "diff", "inSync",
                           "transferredByteInSecond", "transferFromWhere",
                           + "lagMillis", "requestOffset", "connectedTimestamp", "lastAckTimestamp"}],
     "haClientRuntimeInfo": {"masterAddr", "transferredByteInSecond", "maxOffset",
                             "lastReadTimestamp", "lastWriteTimestamp", "masterFlushOffset",
                             "isActivated",
                             + "masterOffset", "lagBytes", "lagMillis", "state", "error",
                             "clientAddr", "bytesReceived"},
     + "brokerRole", "brokerId", "slaveFallBehindMuch", "slaveFallBehindMillis", "bytesSent"}

What the numbers mean:

* a master's `diff` per slave is Java's: commit-log max offset - the slave's last ack
  (bytes); `inSync` is Java's isInSyncSlave (diff < haMaxGapNotInSync, alias
  haSlaveFallbehindMax) and needs a first ack. `lagMillis` is the age, by the master's
  clock, of the oldest message the slave does not have: now - the store timestamp of the
  record at its ack offset (0 when it has everything, -1 before its first ack).
  `slaveFallBehindMuch` is Java's DefaultMessageStore.slaveFallBehindMuch (max offset -
  the best ack of any slave: what no slave has), `slaveFallBehindMillis` its age.
* a slave knows only what its master sent: `lagBytes` is the master's stream position it
  has seen - its own max offset; `lagMillis` is 0 while it is connected, at that position
  and heard from its master within two heartbeat intervals (haSendHeartbeatInterval), else
  the time since the last frame from its master (-1 before the first).
  A slave catching up from far behind therefore sees itself close to 0: the master's
  view (its `haConnectionInfo`, matched by the slave's `clientAddr`) is the authority.
  `masterFlushOffset` is 0: the stream does not carry it (as Java's classic HA).
* timestamps are wall-clock ms (0: never); rates are bytes in the last whole second.
"""
from __future__ import annotations

from collections.abc import Callable

from pocketmq.protocol import bodies
from pocketmq.protocol.codes import ResponseCode
from pocketmq.protocol.message import store_timestamp_at


def record_timestamp(store, offset: int, segment_size: int) -> int:
    """Store timestamp of the record at commit-log `offset`, -1 when none is there. An
    offset at a segment's blank tail is the next segment's first record."""
    offset = max(offset, store.commit_log_min_offset)
    raw = store.look_message_by_offset(offset)
    if raw is None and segment_size > 0:
        nxt = (offset // segment_size + 1) * segment_size
        if nxt < store.commit_log_max_offset:
            raw = store.look_message_by_offset(nxt)
    return store_timestamp_at(raw) if raw else -1


def lag_millis(store, ack: int, now_ms: int, segment_size: int) -> int:
    """Age of the oldest record past `ack` (0: none, -1: unknown)."""
    if ack < 0:
        return -1
    if ack >= store.commit_log_max_offset:
        return 0
    ts = record_timestamp(store, ack, segment_size)
    return max(0, now_ms - ts) if ts >= 0 else -1


def _client_info(**fields) -> dict:
    """HAClientRuntimeInfo with Java's defaults (a master's is all defaults)."""
    info = {"masterAddr": None, "transferredByteInSecond": 0, "maxOffset": 0, "lastReadTimestamp": 0,
            "lastWriteTimestamp": 0, "masterFlushOffset": 0, "isActivated": False}
    info.update(fields)
    return info


def ha_runtime_info(store, config, master, slave, now_ms: Callable[[], int]) -> dict:
    """The HARuntimeInfo dict of a broker: `master` is its HAMaster (None on a slave),
    `slave` its HASlave (None on a master); both are read, never changed."""
    now = now_ms()
    max_offset = store.commit_log_max_offset
    segment = config.mappedFileSizeCommitLog
    info = {"master": slave is None, "masterCommitLogMaxOffset": 0, "inSyncSlaveNums": 0,
            "haConnectionInfo": [], "haClientRuntimeInfo": _client_info(),
            "brokerRole": str(config.brokerRole), "brokerId": config.brokerId}
    if master is not None:
        mono = master.mono_ms()

        def wall(mono_then: int) -> int:
            return now - (mono - mono_then)

        rates = master.transfer_rates()
        conns = []
        for v in master.views():
            ack = v.ack_offset
            diff = max_offset - max(ack, 0)
            in_sync = ack >= 0 and diff < master.gap_max
            conns.append({"addr": v.remote, "slaveAckOffset": ack, "diff": diff, "inSync": in_sync,
                          "transferredByteInSecond": rates.get(v.remote, 0), "transferFromWhere": v.transferred,
                          "lagMillis": lag_millis(store, ack, now, segment), "requestOffset": v.request_offset,
                          "connectedTimestamp": wall(v.connected_ms),
                          "lastAckTimestamp": wall(v.last_report_ms) if ack >= 0 else 0})
        info.update(masterCommitLogMaxOffset=max_offset, inSyncSlaveNums=sum(c["inSync"] for c in conns),
                    haConnectionInfo=conns, slaveFallBehindMuch=max_offset - master.acked_max,
                    slaveFallBehindMillis=lag_millis(store, master.acked_max, now, segment),
                    bytesSent=master.bytes_sent)
    if slave is not None:
        mono = slave.mono_ms()
        lag = slave.lag_bytes()
        silent_ms = mono - slave.last_frame_ms if slave.last_frame_ms > 0 else -1
        # a master sends at least a heartbeat each haSendHeartbeatInterval (the slave's
        # report interval too): silence beyond two of them is lag as well
        fresh = 0 <= silent_ms <= 2000 * slave.report_s
        lag_ms = 0 if slave.connected and lag == 0 and fresh else silent_ms
        info["haClientRuntimeInfo"] = _client_info(
            masterAddr=slave.master_ha_addr, transferredByteInSecond=slave.receive_rate.per_second(),
            maxOffset=max_offset,
            lastReadTimestamp=now - (mono - slave.last_frame_ms) if slave.last_frame_ms > 0 else 0,
            lastWriteTimestamp=now - (mono - slave.last_report_ms) if slave.last_report_ms > 0 else 0,
            isActivated=slave.connected,
            masterOffset=slave.master_offset, lagBytes=lag, lagMillis=lag_ms, state=slave.state,
            error=slave.error, clientAddr=slave.local_addr if slave.connected else None,
            bytesReceived=slave.bytes_received)
    return info


# GET_BROKER_RUNTIME_INFO's HA keys (pocketmq's: Java's table has none). Per slave of a
# master, keyed like Java's commitLogDiskRatio_<path>: haSlaveLagBytes_<addr> and
# haSlaveLagMillis_<addr>, <addr> the slave's HA connection (its clientAddr).
SLAVE_LAG_BYTES = "haSlaveLagBytes_"
SLAVE_LAG_MILLIS = "haSlaveLagMillis_"


def runtime_keys(info: dict) -> dict:
    """The runtime info table's replication keys, from `ha_runtime_info`'s dict."""
    out = {"brokerRole": info["brokerRole"], "brokerId": info["brokerId"]}
    if info["master"]:
        conns = info["haConnectionInfo"]
        out.update(haSlaveNum=len(conns), haInSyncSlaveNum=info["inSyncSlaveNums"],
                   slaveFallBehindMuch=info.get("slaveFallBehindMuch", 0),
                   slaveFallBehindMillis=info.get("slaveFallBehindMillis", -1))
        for c in conns:
            out[SLAVE_LAG_BYTES + c["addr"]] = c["diff"]
            out[SLAVE_LAG_MILLIS + c["addr"]] = c["lagMillis"]
    else:
        hc = info["haClientRuntimeInfo"]
        out.update(haMasterAddr=hc["masterAddr"] or "", haState=hc["state"], haLagBytes=hc["lagBytes"],
                   haLagMillis=hc["lagMillis"], haClientAddr=hc["clientAddr"] or "")
    return out


def process_get_broker_ha_status(ctx, conn, cmd):
    """GET_BROKER_HA_STATUS: HARuntimeInfo as JSON (AdminBrokerProcessor.getBrokerHaStatus)."""
    if ctx.ha_status is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, "Can not get HARuntimeInfo")
    return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps(ctx.ha_status()))
