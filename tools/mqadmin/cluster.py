"""Cluster commands: clusterList."""
from __future__ import annotations

import sys
from typing import NamedTuple

from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.command import Command, Opt, Out, stripped
from pocketmq.tools.mqadmin.errors import PROG, AdminError
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


async def cluster_list(s: AdminSession, a, out: Out) -> None:
    brokers, clusters = await s.cluster_info()
    if a.clusterName:
        check_cluster(clusters, a.clusterName)
    rows = []
    warnings = []
    for cluster in sorted(clusters):
        if a.clusterName and cluster != a.clusterName:
            continue
        for name in sorted(clusters[cluster]):
            bd = brokers.get(name)
            if bd is None:
                continue
            for bid, addr in sorted(bd.broker_addrs.items()):
                n = RuntimeNumbers("-", None, None, None, None, None, None)
                try:
                    d = await s.call(addr, s.api.broker_runtime_info,
                                     what="runtime info", where=f"broker {name} {addr}")
                    table = d.get("table") if isinstance(d, dict) else None
                    n = runtime_numbers(table or {})
                except AdminError as e:
                    # one broker down must not hide the others: a row of '-' and a warning
                    warnings.append(str(e))
                totals = (_cell(n.in_yesterday), _cell(n.out_yesterday), _cell(n.in_today), _cell(n.out_today))
                if a.moreStats:   # Java's -m view: the day totals only
                    rows.append((cluster, name) + totals)
                else:
                    rows.append((cluster, name, bid, addr, n.version, _cell(n.in_tps, "{:.2f}"),
                                 _cell(n.out_tps, "{:.2f}")) + totals)
    totals_head = ["#InTotalYest", "#OutTotalYest", "#InTotalToday", "#OutTotalToday"]
    if a.moreStats:
        out(tables.format_table(["#Cluster Name", "#Broker Name"] + totals_head, rows))
    else:
        out(tables.format_table(["#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTPS",
                                 "#OutTPS"] + totals_head, rows))
    print_warnings(warnings)


COMMANDS = [
    Command("clusterList", "List all of clusters", [
        Opt("c", "clusterName", "which cluster", type=stripped),
        Opt("m", "moreStats", "Print more stats (the day totals only, as Java's -m)", takes_value=False),
    ], cluster_list),
]
