"""Cluster commands: clusterList (with each member's role and replication lag when the
cluster replicates) and haStatus (RocketMQ 5's: a broker's GET_BROKER_HA_STATUS)."""
from __future__ import annotations

import asyncio
import sys
from typing import NamedTuple

from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.command import Command, Opt, Out, positive_int, stripped
from pocketmq.tools.mqadmin.errors import PROG, AdminError, UsageError
from pocketmq.tools.mqadmin.session import AdminSession, to_float, to_int


class RuntimeNumbers(NamedTuple):
    """What clusterList shows of a broker's runtime info; None where the broker does not say."""

    version: str
    in_tps: float | None          # putTps, its 10 s figure (Java's clusterList reads the first)
    out_tps: float | None         # getTransferedTps
    in_today: int | None          # msgPutTotalTodayNow - msgPutTotalTodayMorning
    out_today: int | None
    in_yesterday: int | None      # msgPutTotalTodayMorning - msgPutTotalYesterdayMorning
    out_yesterday: int | None


def runtime_numbers(t: dict) -> RuntimeNumbers:
    """The clusterList numbers of a broker's runtime info table."""
    version = str(t.get("brokerVersionDesc", "")) or "?"
    in_tps = to_float(t["putTps"]) if "putTps" in t else None
    out_tps = to_float(t["getTransferedTps"]) if "getTransferedTps" in t else None

    def diff(later, earlier):
        if later not in t:
            return None
        return to_int(t[later]) - to_int(t.get(earlier), 0)

    return RuntimeNumbers(version, in_tps, out_tps,
                          diff("msgPutTotalTodayNow", "msgPutTotalTodayMorning"),
                          diff("msgGetTotalTodayNow", "msgGetTotalTodayMorning"),
                          diff("msgPutTotalTodayMorning", "msgPutTotalYesterdayMorning"),
                          diff("msgGetTotalTodayMorning", "msgGetTotalYesterdayMorning"))


def check_cluster(clusters: dict, cluster: str) -> None:
    """AdminError naming the known clusters when `cluster` is not one of them."""
    if cluster not in clusters:
        known = ", ".join(sorted(clusters)) or "none"
        raise AdminError(f"cluster {cluster} not found on the nameserver (known clusters: {known})")


def print_warnings(warnings) -> None:
    """One `mqadmin: warning:` line each on stderr (a broker that did not answer)."""
    for w in warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)


def _cell(v, fmt: str = "{}") -> str:
    return "-" if v is None else fmt.format(v)


class Member(NamedTuple):
    """One broker address of a cluster and its runtime info table (None: it did not answer)."""

    cluster: str
    name: str
    bid: int
    addr: str
    table: dict | None


# the runtime info's replication keys (broker/processors/ha_status.py runtime_keys)
_SLAVE_LAG_BYTES = "haSlaveLagBytes_"
_SLAVE_LAG_MILLIS = "haSlaveLagMillis_"


def _lag_cell(v) -> str:
    """A lag figure: '-' when absent or unknown (negative)."""
    if v is None or str(v).strip() == "":
        return "-"
    n = to_int(v, -1)
    return "-" if n < 0 else str(n)


def replication_cells(m: Member, master_table: dict | None) -> tuple[str, str, str]:
    """(role, lag bytes, lag ms) of a member. A master's lag is what none of its slaves has
    (slaveFallBehindMuch, '-' without a connected slave); a slave's is its master's view of
    it (the master's haSlaveLag*_<addr> keys for the slave's HA connection, haClientAddr),
    else the slave's own (haLagBytes/haLagMillis: relative to what the master sent it)."""
    t = m.table
    if t is None:
        return "-", "-", "-"
    role = str(t.get("brokerRole") or "-")
    if role != "SLAVE" and m.bid == 0:
        if to_int(t.get("haSlaveNum"), 0) <= 0:
            return role, "-", "-"
        return role, _lag_cell(t.get("slaveFallBehindMuch")), _lag_cell(t.get("slaveFallBehindMillis"))
    client = t.get("haClientAddr")
    if master_table and client and _SLAVE_LAG_BYTES + client in master_table:
        return (role, _lag_cell(master_table.get(_SLAVE_LAG_BYTES + client)),
                _lag_cell(master_table.get(_SLAVE_LAG_MILLIS + client)))
    return role, _lag_cell(t.get("haLagBytes")), _lag_cell(t.get("haLagMillis"))


def is_replicated(members) -> bool:
    """A listing with a slave, a SYNC_MASTER or a master serving slaves: clusterList then
    shows the #Role and lag columns (a cluster without replication prints what it always did)."""
    for m in members:
        t = m.table or {}
        if m.bid != 0 or t.get("brokerRole") in ("SYNC_MASTER", "SLAVE") or to_int(t.get("haSlaveNum"), 0) > 0:
            return True
    return False


async def cluster_members(s: AdminSession, cluster_name: str | None) -> tuple[list[Member], list[str]]:
    """Every broker address of the cluster (or all clusters) with its runtime info, sorted by
    cluster, broker name and id; the warnings of those that did not answer."""
    brokers, clusters = await s.cluster_info()
    if cluster_name:
        check_cluster(clusters, cluster_name)
    members, warnings = [], []
    for cluster in sorted(clusters):
        if cluster_name and cluster != cluster_name:
            continue
        for name in sorted(clusters[cluster]):
            bd = brokers.get(name)
            if bd is None:
                continue
            for bid, addr in sorted(bd.broker_addrs.items()):
                table = None
                try:
                    d = await s.call(addr, s.api.broker_runtime_info,
                                     what="runtime info", where=f"broker {name} {addr}")
                    table = (d.get("table") if isinstance(d, dict) else None) or {}
                except AdminError as e:
                    # one broker down must not hide the others: a row of '-' and a warning
                    warnings.append(str(e))
                members.append(Member(cluster, name, bid, addr, table))
    return members, warnings


async def cluster_list(s: AdminSession, a, out: Out) -> None:
    members, warnings = await cluster_members(s, a.clusterName)
    replicated = not a.moreStats and is_replicated(members)
    masters = {(m.cluster, m.name): m.table for m in members if m.bid == 0}
    rows = []
    for m in members:
        n = runtime_numbers(m.table) if m.table is not None else RuntimeNumbers("-", None, None, None, None,
                                                                                None, None)
        totals = (_cell(n.in_yesterday), _cell(n.out_yesterday), _cell(n.in_today), _cell(n.out_today))
        if a.moreStats:   # Java's -m view: the day totals only
            rows.append((m.cluster, m.name) + totals)
            continue
        repl = replication_cells(m, masters.get((m.cluster, m.name))) if replicated else ()
        rows.append((m.cluster, m.name, m.bid, m.addr) + repl
                    + (n.version, _cell(n.in_tps, "{:.2f}"), _cell(n.out_tps, "{:.2f}")) + totals)
    totals_head = ["#InTotalYest", "#OutTotalYest", "#InTotalToday", "#OutTotalToday"]
    if a.moreStats:
        out(tables.format_table(["#Cluster Name", "#Broker Name"] + totals_head, rows))
    else:
        repl_head = ["#Role", "#LagBytes", "#LagMs"] if replicated else []
        out(tables.format_table(["#Cluster Name", "#Broker Name", "#BID", "#Addr"] + repl_head
                                + ["#Version", "#InTPS", "#OutTPS"] + totals_head, rows))
    print_warnings(warnings)


# ------------------------------------------------------------------------------ haStatus

def _kv(pairs) -> list[str]:
    width = max(len(k) for k, _ in pairs) + 2
    return [f"{k:<{width}}{v}".rstrip() for k, v in pairs]


def _kbps(v) -> str:
    return f"{to_int(v) / 1024:.2f}"


def _time(v) -> str:
    return tables.human_ms(to_int(v)) or "-"


def format_ha_status(addr: str, info: dict) -> str:
    """One broker's GET_BROKER_HA_STATUS answer as RocketMQ 5's haStatus prints it (its
    labels and columns), with pocketmq's additions: the broker's role, the lag in ms of each
    slave (and on a slave: the master's stream position it saw, its lag, state and error)."""
    role = str(info.get("brokerRole") or ("SLAVE" if not info.get("master") else "MASTER"))
    head = [("#BrokerAddr", addr), ("#Role", role)]
    if info.get("master"):
        conns = [c for c in info.get("haConnectionInfo") or () if isinstance(c, dict)]
        lines = _kv(head + [("#MasterAddr", addr),
                            ("#MasterCommitLogMaxOffset", to_int(info.get("masterCommitLogMaxOffset"))),
                            ("#SlaveNum", len(conns)), ("#InSyncSlaveNum", to_int(info.get("inSyncSlaveNums"))),
                            ("#SlaveFallBehindBytes", _lag_cell(info.get("slaveFallBehindMuch"))
                             if conns else "-"),
                            ("#SlaveFallBehindMs", _lag_cell(info.get("slaveFallBehindMillis")) if conns else "-")])
        rows = [(c.get("addr", "?"), to_int(c.get("slaveAckOffset"), -1), to_int(c.get("diff")),
                 _lag_cell(c.get("lagMillis")), _kbps(c.get("transferredByteInSecond")),
                 "OK" if c.get("inSync") else "Fall Behind", to_int(c.get("transferFromWhere"), -1))
                for c in conns]
        lines.append(tables.format_table(["#SlaveAddr", "#SlaveAckOffset", "#Diff", "#LagMs",
                                          "#TransferSpeed(KB/s)", "#Status", "#TransferFromWhere"], rows,
                                         right=(1, 2, 3, 4, 6)))
        return "\n".join(lines)
    hc = info.get("haClientRuntimeInfo")
    hc = hc if isinstance(hc, dict) else {}
    pairs = head + [("#MasterAddr", hc.get("masterAddr") or "-"),
                    ("#CommitLogMaxOffset", to_int(hc.get("maxOffset"))),
                    ("#TransferSpeed(KB/s)", _kbps(hc.get("transferredByteInSecond"))),
                    ("#LastReadTime", _time(hc.get("lastReadTimestamp"))),
                    ("#LastWriteTime", _time(hc.get("lastWriteTimestamp"))),
                    ("#MasterFlushOffset", to_int(hc.get("masterFlushOffset"))),
                    ("#MasterOffset", _lag_cell(hc.get("masterOffset"))),
                    ("#LagBytes", _lag_cell(hc.get("lagBytes"))), ("#LagMs", _lag_cell(hc.get("lagMillis"))),
                    ("#State", hc.get("state") or "-")]
    if hc.get("error"):
        pairs.append(("#Error", hc["error"]))
    return "\n".join(_kv(pairs))


async def ha_status(s: AdminSession, a, out: Out) -> None:
    if bool(a.brokerAddr) == bool(a.clusterName):
        raise UsageError("haStatus: give either -b brokerAddr or -c clusterName (see 'mqadmin help haStatus')")
    if a.brokerAddr:
        targets = [a.brokerAddr]
    else:   # every member, slaves too (Java's -c lists the masters only)
        brokers, clusters = await s.cluster_info()
        check_cluster(clusters, a.clusterName)
        targets = [addr for name in sorted(clusters[a.clusterName]) if name in brokers
                   for _, addr in sorted(brokers[name].broker_addrs.items())]
    while True:
        blocks, warnings = [], []
        for addr in targets:
            try:
                info = await s.call(addr, s.api.broker_ha_status, what="HA status", where=f"broker {addr}")
            except AdminError as e:
                if a.brokerAddr:
                    raise
                warnings.append(str(e))   # one broker down must not hide the others
                continue
            blocks.append(format_ha_status(addr, info if isinstance(info, dict) else {}))
        if blocks:
            out("\n\n".join(blocks))
        print_warnings(warnings)
        if not blocks:
            raise AdminError(f"no broker of cluster {a.clusterName} answered")
        if not a.interval:
            return
        await asyncio.sleep(a.interval)
        out("")


COMMANDS = [
    Command("clusterList", "List all of clusters", [
        Opt("c", "clusterName", "which cluster", type=stripped),
        Opt("m", "moreStats", "Print more stats (the day totals only, as Java's -m)", takes_value=False),
    ], cluster_list, epilog="With replication (a slave, a SYNC_MASTER) the #Role, #LagBytes and #LagMs "
                            "columns follow #Addr: a master's lag is what none of its slaves has yet, a "
                            "slave's how far it is behind its master."),
    Command("haStatus", "Fetch ha runtime status data", [
        Opt("c", "clusterName", "which cluster (every member, slaves too)", type=stripped),
        Opt("b", "brokerAddr", "which broker to fetch", type=stripped),
        Opt("i", "interval", "print again every N seconds until interrupted", type=positive_int),
    ], ha_status),
]
