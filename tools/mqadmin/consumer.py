"""Consumer commands: consumerProgress (one group's progress, or every group's summary)."""
from __future__ import annotations

from pocketmq.client.errors import BrokerError
from pocketmq.common.constants import RETRY_GROUP_TOPIC_PREFIX
from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.command import Command, Opt, Out, stripped
from pocketmq.tools.mqadmin.errors import AdminError
from pocketmq.tools.mqadmin.session import (
    AdminSession,
    object_keyed_table,
    route_masters,
    to_float,
    to_int,
)


async def consume_stats(s: AdminSession, group: str, topic: str | None,
                        masters: dict[str, str]) -> tuple[dict, float]:
    """({MessageQueue: stats} merged over `masters`, the summed consume TPS)."""
    merged, tps = {}, 0.0
    for name, addr in masters.items():
        d = await s.call(addr, s.api.consume_stats, group, topic,
                         what=f"consume stats of group {group}", where=f"broker {name} {addr}")
        merged.update(object_keyed_table(d, "consume stats", f"broker {addr}"))
        tps += to_float(d.get("consumeTps", 0) if isinstance(d, dict) else 0)
    return merged, tps


async def consumer_progress(s: AdminSession, a, out: Out) -> None:
    if not a.groupName:
        await list_groups(s, out)
        return
    group = a.groupName
    masters = route_masters(await s.route(a.topic)) if a.topic else await s.all_masters()
    if not masters:
        raise AdminError("no master broker is registered on the nameserver")
    merged, tps = await consume_stats(s, group, a.topic, masters)
    if not merged:
        on = f" on topic {a.topic}" if a.topic else ""
        raise AdminError(f"no consume progress for group {group}{on}: "
                         "the group has no committed offset (it may never have consumed)")
    rows, diff_total = [], 0
    for mq, v in sorted(merged.items()):
        broker_off, consumer_off = to_int(v.get("brokerOffset")), to_int(v.get("consumerOffset"))
        diff = broker_off - consumer_off
        diff_total += diff
        rows.append((mq.topic, mq.broker_name, mq.queue_id, broker_off, consumer_off, diff,
                     tables.human_ms(to_int(v.get("lastTimestamp")))))
    out(tables.format_table(["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset",
                             "#Diff", "#LastTime"], rows))
    out("")
    out(f"Consume TPS: {tps:.2f}")
    out(f"Diff Total: {diff_total}")


async def list_groups(s: AdminSession, out: Out) -> None:
    """Every group that has a %RETRY% topic: online clients, type, model, TPS, lag."""
    groups = sorted(t[len(RETRY_GROUP_TOPIC_PREFIX):] for t in await s.topic_list()
                    if t.startswith(RETRY_GROUP_TOPIC_PREFIX))
    masters = await s.all_masters() if groups else {}
    rows = []
    for g in groups:
        count, ctype, model = 0, "", ""
        for addr in masters.values():
            try:
                cc = await s.reach(addr, s.api.consumer_connection_list, g)
            except (AdminError, BrokerError):
                continue        # unreachable, or nobody of the group online there
            count += len(cc.get("connectionSet") or [])
            ctype = "PULL" if cc.get("consumeType") == "CONSUME_ACTIVELY" else "PUSH"
            model = str(cc.get("messageModel") or "")
        try:
            stats, tps = await consume_stats(s, g, None, masters)
            diff = sum(to_int(v.get("brokerOffset")) - to_int(v.get("consumerOffset")) for v in stats.values())
            diff_s, tps_s = str(diff), f"{tps:.2f}"
        except AdminError:
            diff_s, tps_s = "-", "-"
        rows.append((g, count, ctype if count else "", model if count else "", tps_s, diff_s))
    out(tables.format_table(["#Group", "#Count", "#Type", "#Model", "#TPS", "#Diff Total"], rows))


COMMANDS = [
    Command("consumerProgress", "Query consumers's progress, speed", [
        Opt("g", "groupName", "consumer group name (without it: list the groups)", type=stripped),
        Opt("t", "topicName", "only this topic", type=stripped, dest="topic"),
    ], consumer_progress),
]
