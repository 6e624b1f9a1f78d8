"""Broker statistics commands: brokerStatus (a broker's runtime info, Java's "key: value"
lines sorted by key) and statsAll (per topic and consuming group: accumulation, in/out
TPS of the last minute and messages of the last 24 hours, from VIEW_BROKER_STATS_DATA)."""
from __future__ import annotations


from pocketmq.client.errors import BrokerError
from pocketmq.common.constants import (
    DLQ_GROUP_TOPIC_PREFIX,
    GROUP_GET_NUMS,
    RETRY_GROUP_TOPIC_PREFIX,
    TOPIC_PUT_NUMS,
)
from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.cluster import check_cluster, print_warnings
from pocketmq.tools.mqadmin.command import Command, Opt, Out, stripped
from pocketmq.tools.mqadmin.errors import AdminError, UsageError
from pocketmq.tools.mqadmin.session import AdminSession, object_keyed_table, route_masters, to_float, to_int


async def _runtime_table(s: AdminSession, addr: str, where: str) -> dict:
    d = await s.call(addr, s.api.broker_runtime_info, what="runtime info", where=where)
    table = d.get("table") if isinstance(d, dict) else None
    if not isinstance(table, dict):
        raise AdminError(f"unreadable runtime info from {where}: no table")
    return table


async def broker_status(s: AdminSession, a, out: Out) -> None:
    if bool(a.brokerAddr) == bool(a.clusterName):
        raise UsageError("brokerStatus: give either -b brokerAddr or -c clusterName "
                         "(see 'mqadmin help brokerStatus')")
    if a.brokerAddr:
        table = await _runtime_table(s, a.brokerAddr, f"broker {a.brokerAddr}")
        out("\n".join(f"{k:<32}: {v}" for k, v in sorted(table.items())))
        return
    brokers, clusters = await s.cluster_info()
    check_cluster(clusters, a.clusterName)
    lines, warnings = [], []
    for name in sorted(clusters[a.clusterName]):
        bd = brokers.get(name)
        for _, addr in sorted(bd.broker_addrs.items()) if bd is not None else ():
            try:
                table = await _runtime_table(s, addr, f"broker {name} {addr}")
            except AdminError as e:   # one broker down must not hide the others
                warnings.append(str(e))
                continue
            lines.extend(f"{addr:<24} {k:<32}: {v}" for k, v in sorted(table.items()))
    if lines:
        out("\n".join(lines))
    print_warnings(warnings)
    if not lines:
        raise AdminError(f"no broker of cluster {a.clusterName} answered")


def sum_24h(bsd: dict) -> int:
    """Java's compute24HourSum: the day window's sum, else the hour's, else the minute's."""
    for window in ("statsDay", "statsHour", "statsMinute"):
        w = bsd.get(window) if isinstance(bsd, dict) else None
        n = to_int(w.get("sum")) if isinstance(w, dict) else 0
        if n:
            return n
    return 0


def minute_tps(bsd: dict) -> float:
    w = bsd.get("statsMinute") if isinstance(bsd, dict) else None
    return to_float(w.get("tps")) if isinstance(w, dict) else 0.0


class _Stats:
    """VIEW_BROKER_STATS_DATA across masters: an item a broker does not have (it never
    counted anything for it: SYSTEM_ERROR "not exist") counts 0, as in Java; a broker that
    cannot be reached is warned about once and skipped."""

    def __init__(self, s: AdminSession) -> None:
        self.s = s
        self.down: dict[str, str] = {}

    async def _answers(self, masters: dict[str, str], method, *args):
        """method(addr, *args) on each master: an error answer is skipped, an unreachable
        broker remembered (and no longer asked)."""
        for addr in masters.values():
            if addr in self.down:
                continue
            try:
                yield addr, await self.s.reach(addr, method, *args)
            except BrokerError:
                continue
            except AdminError as e:
                self.down[addr] = str(e)

    async def read(self, masters: dict[str, str], stats_name: str, key: str) -> tuple[float, int]:
        tps, day = 0.0, 0
        async for _, bsd in self._answers(masters, self.s.api.view_broker_stats_data, stats_name, key):
            tps += minute_tps(bsd)
            day += sum_24h(bsd)
        return tps, day

    async def groups(self, masters: dict[str, str], topic: str) -> list[str]:
        out: set[str] = set()
        async for _, groups in self._answers(masters, self.s.api.query_topic_consume_by_who, topic):
            out.update(groups)
        return sorted(out)

    async def accumulation(self, masters: dict[str, str], group: str, topic: str) -> int:
        total = 0
        async for addr, d in self._answers(masters, self.s.api.consume_stats, group, topic):
            for v in object_keyed_table(d, "consume stats", f"broker {addr}").values():
                total += to_int(v.get("brokerOffset")) - to_int(v.get("consumerOffset"))
        return max(0, total)


async def stats_all(s: AdminSession, a, out: Out) -> None:
    if a.topic:
        await s.route(a.topic)   # an unknown topic is an error, not an empty table
        topics = [a.topic]
    else:
        topics = sorted(t for t in await s.topic_list()
                        if not t.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)))
    st = _Stats(s)
    rows = []
    for topic in topics:
        route = await s.find_route(topic)
        if route is None:
            continue
        masters = route_masters(route)
        in_tps, in_day = await st.read(masters, TOPIC_PUT_NUMS, topic)
        groups = await st.groups(masters, topic)
        if not groups:
            if not a.activeTopic or in_day > 0:
                rows.append((topic, "", 0, f"{in_tps:.2f}", "", in_day, "NO_CONSUMER"))
            continue
        for group in groups:
            out_tps, out_day = await st.read(masters, GROUP_GET_NUMS, f"{topic}@{group}")
            acc = await st.accumulation(masters, group, topic)
            if not a.activeTopic or in_day > 0 or out_day > 0:
                rows.append((topic, group, acc, f"{in_tps:.2f}", f"{out_tps:.2f}", in_day, out_day))
    out(tables.format_table(["#Topic", "#Consumer Group", "#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour",
                             "#OutMsg24Hour"], rows, right=(2, 3, 4, 5, 6)))
    print_warnings(st.down.values())


COMMANDS = [
    Command("brokerStatus", "Fetch broker runtime status data", [
        Opt("b", "brokerAddr", "Broker address", type=stripped),
        Opt("c", "clusterName", "which cluster", type=stripped),
    ], broker_status),
    Command("statsAll", "Topic and Consumer tps stats", [
        Opt("a", "activeTopic", "print active topic only", takes_value=False),
        Opt("t", "topic", "print select topic only", type=stripped),
    ], stats_all),
]
