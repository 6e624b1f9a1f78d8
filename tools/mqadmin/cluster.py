"""Cluster commands: clusterList."""
from __future__ import annotations

import sys

from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.command import Command, Out
from pocketmq.tools.mqadmin.errors import PROG, AdminError
from pocketmq.tools.mqadmin.session import AdminSession, to_float, to_int


def runtime_numbers(t: dict) -> tuple[str, float | None, float | None, int | None, int | None]:
    """(version, in TPS, out TPS, messages in today, messages out today) of a broker's
    runtime info table; None where the broker does not say."""
    version = str(t.get("brokerVersionDesc", "")) or "?"
    in_tps = to_float(t["putTps"]) if "putTps" in t else None
    out_tps = to_float(t["getTransferedTps"]) if "getTransferedTps" in t else None

    def today(prefix):
        now = t.get(f"{prefix}TodayNow")
        if now is None:
            return None
        return to_int(now) - to_int(t.get(f"{prefix}TodayMorning"), 0)

    return version, in_tps, out_tps, today("msgPutTotal"), today("msgGetTotal")


async def cluster_list(s: AdminSession, a, out: Out) -> None:
    brokers, clusters = await s.cluster_info()
    rows = []
    warnings = []
    for cluster in sorted(clusters):
        for name in sorted(clusters[cluster]):
            bd = brokers.get(name)
            if bd is None:
                continue
            for bid, addr in sorted(bd.broker_addrs.items()):
                version, in_tps, out_tps, in_total, out_total = "-", None, None, None, None
                try:
                    d = await s.call(addr, s.api.broker_runtime_info,
                                     what="runtime info", where=f"broker {name} {addr}")
                    table = d.get("table") if isinstance(d, dict) else None
                    version, in_tps, out_tps, in_total, out_total = runtime_numbers(table or {})
                except AdminError as e:
                    # one broker down must not hide the others: a row of '-' and a warning
                    warnings.append(str(e))
                rows.append((cluster, name, bid, addr, version,
                             "-" if in_tps is None else f"{in_tps:.2f}",
                             "-" if out_tps is None else f"{out_tps:.2f}",
                             "-" if in_total is None else in_total,
                             "-" if out_total is None else out_total))
    out(tables.format_table(["#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTPS",
                             "#OutTPS", "#InTotalToday", "#OutTotalToday"], rows))
    for w in warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)


COMMANDS = [
    Command("clusterList", "List all of clusters", [], cluster_list),
]
