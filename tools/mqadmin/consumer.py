"""Client commands: consumerProgress (one group's progress, or every group's summary),
consumerConnection (the group's online clients and subscriptions), consumerStatus
(each client's ConsumerRunningInfo, relayed by the broker: GET_CONSUMER_RUNNING_INFO)
and producerConnection (a producer group's clients, from the brokers of a topic)."""
from __future__ import annotations

import time

from pocketmq.client.errors import BrokerError
from pocketmq.common.constants import RETRY_GROUP_TOPIC_PREFIX
from pocketmq.protocol.bodies import (
    PROCESS_QUEUE_INFO_FIELDS,
    PROP_CONSUME_ORDERLY,
    PROP_CONSUME_TYPE,
    PROP_CLIENT_VERSION,
)
from pocketmq.protocol.codes import version_desc as _mq_version_desc
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


# -- consumerConnection / consumerStatus ------------------------------------------------------

async def group_connections(s: AdminSession, group: str) -> tuple[dict, dict[str, str]]:
    """The group's ConsumerConnection merged over every master (one entry per clientId) and
    {clientId: the broker address it is connected to}. AdminError when no broker has the
    group online."""
    masters = await s.all_masters()
    if not masters:
        raise AdminError("no master broker is registered on the nameserver")
    merged: dict = {}
    where: dict[str, str] = {}
    for addr in masters.values():
        try:
            cc = await s.reach(addr, s.api.consumer_connection_list, group)
        except (AdminError, BrokerError):
            continue      # unreachable, or the group is not online on this broker
        if not isinstance(cc, dict):
            continue
        if not merged:
            merged = dict(cc, connectionSet=[])
        for conn in cc.get("connectionSet") or []:
            cid = str(conn.get("clientId", ""))
            if cid and cid not in where:
                where[cid] = addr
                merged["connectionSet"].append(conn)
    if not where:
        raise AdminError(f"the consumer group[{group}] not online")
    merged["connectionSet"].sort(key=lambda c: str(c.get("clientId", "")))
    return merged, where


def version_desc(version) -> str:
    """A client's announced version as Java's tools print it (V3_1_8 for the C++ client)."""
    v = to_int(version, None)
    return "" if v is None else _mq_version_desc(v)


async def consumer_connection(s: AdminSession, a, out: Out) -> None:
    cc, _ = await group_connections(s, a.groupName)
    for i, c in enumerate(cc["connectionSet"], 1):
        out(connection_line(i, c))
    out("")
    out("Below is subscription:")
    subs = cc.get("subscriptionTable") or {}
    for i, (topic, sd) in enumerate(sorted(subs.items()), 1):
        expr = sd.get("subString", "") if isinstance(sd, dict) else ""
        out(f"{i:03d}  Topic: {topic:<40} SubExpression: {expr}")
    out("")
    out(f"ConsumeType: {cc.get('consumeType', '')}")
    out(f"MessageModel: {cc.get('messageModel', '')}")
    out(f"ConsumeFromWhere: {cc.get('consumeFromWhere', '')}")


def connection_line(i: int, c: dict, index_width: int = 3) -> str:
    """Java's `%03d  %-32s %-22s %-8s %s` connection line (index, clientId, address,
    language, version); producerConnection numbers with 4 digits."""
    return (f"{i:0{index_width}d}  {str(c.get('clientId', '')):<32} {str(c.get('clientAddr', '')):<22} "
            f"{str(c.get('language', '')):<8} {version_desc(c.get('version'))}")


async def producer_connection(s: AdminSession, a, out: Out) -> None:
    """The group's producers merged over the topic's masters (Java asks the first one only:
    a producer heartbeats to every broker it sends to, not necessarily the first)."""
    masters = route_masters(await s.route(a.topic))
    conns: dict[str, dict] = {}
    for name, addr in masters.items():
        try:
            pc = await s.reach(addr, s.api.producer_connection_list, a.group)
        except BrokerError:
            continue        # the group has no producer connected to this broker
        for c in (pc.get("connectionSet") or []) if isinstance(pc, dict) else []:
            conns.setdefault(str(c.get("clientId", "")), c)
    if not conns:
        raise AdminError(f"the producer group[{a.group}] not online on the brokers of topic {a.topic}")
    for i, cid in enumerate(sorted(conns), 1):
        out(connection_line(i, conns[cid], index_width=4))


def process_queue_info_line(pqi: dict) -> str:
    """Java's ProcessQueueInfo.toString (timestamps human-readable), plus pocketmq's
    oldestInFlightAgeMs when the client reports it."""
    parts = []
    for f in PROCESS_QUEUE_INFO_FIELDS:
        # a field the client left out (the C++ client sends no cachedMsgSizeInMiB) reads as
        # Java's default, as fastjson fills it in for Java's tools
        v = pqi.get(f, False if f in ("locked", "droped") else 0)
        if f.endswith("Timestamp"):
            v = tables.human_ms(to_int(v))
        elif isinstance(v, bool):
            v = "true" if v else "false"
        parts.append(f"{f}={v}")
    if "oldestInFlightAgeMs" in pqi:
        parts.append(f"oldestInFlightAgeMs={pqi['oldestInFlightAgeMs']}")
    return "ProcessQueueInfo [" + ", ".join(parts) + "]"


def format_running_info(info: dict) -> str:
    """Java's ConsumerRunningInfo.formatString layout."""
    lines = ["#Consumer Properties#"]
    lines += [f"{k:<40}: {v}" for k, v in sorted(info["properties"].items())]
    lines += ["", "", "#Consumer Subscription#"]
    for i, sd in enumerate(info["subscriptionSet"], 1):
        lines.append(f"{i:03d} Topic: {sd.topic:<40} ClassFilter: {str(sd.class_filter_mode).lower():<8} "
                     f"SubExpression: {sd.sub_string}")
    lines += ["", "", "#Consumer Offset#", f"{'#Topic':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#Consumer Offset':<20}"]
    for mq, pqi in info["mqTable"].items():
        lines.append(f"{mq.topic:<32}  {mq.broker_name:<32}  {mq.queue_id:<4}  {to_int(pqi.get('commitOffset')):<20}")
    lines += ["", "", "#Consumer MQ Detail#", f"{'#Topic':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#ProcessQueueInfo':<20}"]
    for mq, pqi in info["mqTable"].items():
        lines.append(f"{mq.topic:<64}  {mq.broker_name:<32}  {mq.queue_id:<4}  {process_queue_info_line(pqi)}")
    lines += ["", "", "#Consumer RT&TPS#",
              f"{'#Topic':<64}  {'#Pull RT':>14} {'#Pull TPS':>14} {'#Consume RT':>14} {'#ConsumeOK TPS':>14} "
              f"{'#ConsumeFailed TPS':>18} {'#ConsumeFailedMsgsInHour':>25}"]
    for topic, st in sorted(info["statusTable"].items()):
        lines.append(f"{topic:<32}  {to_float(st.get('pullRT')):>14.2f} {to_float(st.get('pullTPS')):>14.2f} "
                     f"{to_float(st.get('consumeRT')):>14.2f} {to_float(st.get('consumeOKTPS')):>14.2f} "
                     f"{to_float(st.get('consumeFailedTPS')):>18.2f} {to_int(st.get('consumeFailedMsgs')):>25}")
    if info.get("jstack"):
        lines += ["", "", "#Consumer jstack#", str(info["jstack"])]
    return "\n".join(lines)


def analyze_process_queues(client_id: str, info: dict, now_ms: int) -> list[str]:
    """Java's ConsumerRunningInfo.analyzeProcessQueue: orderly queues not locked, concurrent
    queues with cached messages and no consumption for a minute."""
    props = info["properties"]
    if props.get(PROP_CONSUME_TYPE) != "CONSUME_PASSIVELY":
        return []
    orderly = props.get(PROP_CONSUME_ORDERLY, "").lower() == "true"
    out = []
    for mq, pqi in info["mqTable"].items():
        if orderly:
            if not pqi.get("locked"):
                out.append(f"{client_id} {mq} can't lock for a while, "
                           f"{now_ms - to_int(pqi.get('lastLockTimestamp'))}ms")
        else:
            diff = now_ms - to_int(pqi.get("lastConsumeTimestamp"))
            if diff > 60_000 and to_int(pqi.get("cachedMsgCount")) > 0:
                out.append(f"{client_id} {mq} can't consume for a while, maybe blocked, {diff}ms")
    return out


async def running_info(s: AdminSession, addr: str, group: str, client_id: str, jstack: bool) -> dict:
    return await s.call(addr, s.api.consumer_running_info, group, client_id, jstack,
                        what=f"running info of consumer {client_id} of group {group}", where=f"broker {addr}")


async def consumer_status(s: AdminSession, a, out: Out) -> None:

    group = a.groupName
    cc, where = await group_connections(s, group)
    if a.clientId:
        if a.clientId not in where:
            raise AdminError(f"consumer {a.clientId} of group {group} is not online "
                             f"(online: {', '.join(sorted(where)) or 'none'})")
        out(format_running_info(await running_info(s, where[a.clientId], group, a.clientId, a.jstack)))
        return
    infos, rows = {}, []
    for i, c in enumerate(cc["connectionSet"], 1):
        cid = str(c.get("clientId", ""))
        info = await running_info(s, where[cid], group, cid, a.jstack)
        infos[cid] = info
        props = info["properties"]
        rows.append((f"{i:03d}", cid, props.get(PROP_CLIENT_VERSION, version_desc(c.get("version"))),
                     len(info["mqTable"]), sum(to_int(p.get("cachedMsgCount")) for p in info["mqTable"].values()),
                     max((to_int(p.get("oldestInFlightAgeMs")) for p in info["mqTable"].values()), default=0)))
    out(tables.format_table(["#Index", "#ClientId", "#Version", "#Queues", "#Cached", "#OldestInFlightMs"], rows))
    out("")
    subs = [sorted((sd.topic, sd.sub_string, sd.expression_type) for sd in v["subscriptionSet"])
            for v in infos.values()]
    if all(x == subs[0] for x in subs):
        out("Same subscription in the same group of consumer")
    else:
        out("WARN: Different subscription in the same group of consumer!!!")
    out("")
    out("Rebalance OK")
    now = int(time.time() * 1000)
    for cid, info in infos.items():
        for line in analyze_process_queues(cid, info, now):
            out(line)
    for cid, info in infos.items():
        out("")
        out(f"#ClientId# {cid}")
        out(format_running_info(info))


COMMANDS = [
    Command("consumerConnection", "Query consumer's socket connection, client version and subscription", [
        Opt("g", "groupName", "consumer group name", required=True, type=stripped),
    ], consumer_connection),
    Command("consumerStatus", "Query consumer's internal data structure", [
        Opt("g", "groupName", "consumer group name", required=True, type=stripped),
        Opt("i", "clientId", "the consumer's clientId (without it: every client of the group)", type=stripped),
        Opt("s", "jstack", "ask for the jstack (Java clients; pocketmq has none)", takes_value=False),
    ], consumer_status),
    Command("producerConnection", "Query producer's socket connection and client version", [
        Opt("g", "producerGroup", "producer group name", required=True, type=stripped, dest="group"),
        Opt("t", "topic", "topic name", required=True, type=stripped),
    ], producer_connection),
    Command("consumerProgress", "Query consumers's progress, speed", [
        Opt("g", "groupName", "consumer group name (without it: list the groups)", type=stripped),
        Opt("t", "topicName", "only this topic", type=stripped, dest="topic"),
    ], consumer_progress),
]
