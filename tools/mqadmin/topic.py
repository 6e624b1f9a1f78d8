"""Topic commands: updateTopic, deleteTopic, topicList, topicRoute, topicStatus,
updateTopicPerm, topicClusterList."""
from __future__ import annotations

from pocketmq.client.errors import BrokerError, TopicNotExistError
from pocketmq.common.constants import AUTO_CREATE_TOPIC_KEY_TOPIC
from pocketmq.protocol.bodies import TopicConfig
from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.command import (
    Command,
    Opt,
    Out,
    java_bool,
    perm,
    positive_int,
    rw_perm,
    stripped,
)
from pocketmq.tools.mqadmin.errors import AdminError, UsageError, failed
from pocketmq.tools.mqadmin.session import (
    AdminSession,
    object_keyed_table,
    route_masters,
    to_int,
)

ORDER_TOPIC_CONFIG_NAMESPACE = "ORDER_TOPIC_CONFIG"
TOPIC_FILTER_TYPE = "SINGLE_TAG"


async def update_topic(s: AdminSession, a, out: Out) -> None:
    if not a.brokerAddr and not a.clusterName:
        raise UsageError("updateTopic needs -c clusterName or -b brokerAddr")
    sys_flag = (1 if a.unit else 0) | (2 if a.hasUnitSub else 0)
    config = TopicConfig(a.topic, a.readQueueNums, a.writeQueueNums, a.perm, TOPIC_FILTER_TYPE, sys_flag, a.order)
    if a.brokerAddr:
        targets = {None: a.brokerAddr}
    else:
        targets = await s.cluster_masters(a.clusterName)
    for addr in targets.values():
        await s.call(addr, s.api.create_topic, config, AUTO_CREATE_TOPIC_KEY_TOPIC,
                     what=f"create topic {a.topic}", where=f"broker {addr}")
        out(f"create topic to {addr} success.")
    if a.order:
        if a.brokerAddr:
            brokers, _ = await s.cluster_info()
            names = [n for n, bd in brokers.items() if a.brokerAddr in bd.broker_addrs.values()]
            if not names:
                raise AdminError(f"broker {a.brokerAddr} is not registered on the nameserver; "
                                 f"cannot set the order config of {a.topic}")
            conf = f"{names[0]}:{a.writeQueueNums}"
        else:
            conf = ";".join(f"{n}:{a.writeQueueNums}" for n in sorted(targets))
        await s.every_namesrv(s.api.put_kv_config, ORDER_TOPIC_CONFIG_NAMESPACE, a.topic, conf,
                              what=f"set order config of {a.topic}")
        out(f"set {'broker' if a.brokerAddr else 'cluster'} orderConf. isOrder=true, orderConf=[{conf}]")
    out(tables.topic_config_line(a.topic, a.readQueueNums, a.writeQueueNums, a.perm, TOPIC_FILTER_TYPE,
                                 sys_flag, a.order))


async def delete_topic(s: AdminSession, a, out: Out) -> None:
    masters = await s.cluster_masters(a.clusterName)
    for name, addr in masters.items():
        await s.call(addr, s.api.delete_topic_in_broker, a.topic,
                     what=f"delete topic {a.topic}", where=f"broker {name} {addr}")
    out(f"delete topic [{a.topic}] from cluster [{a.clusterName}] success.")
    await s.every_namesrv(s.api.delete_topic_in_namesrv, a.topic, what=f"delete topic {a.topic}")
    out(f"delete topic [{a.topic}] from NameServer success.")


async def topic_list(s: AdminSession, a, out: Out) -> None:
    for t in sorted(await s.topic_list()):
        out(t)


async def topic_route(s: AdminSession, a, out: Out) -> None:
    out(tables.format_json(await s.route_json(a.topic)))


async def topic_status(s: AdminSession, a, out: Out) -> None:
    masters = route_masters(await s.route(a.topic))
    if not masters:
        raise AdminError(f"topic {a.topic} has no master broker in its route")
    merged = {}
    for name, addr in masters.items():
        try:
            stats = await s.reach(addr, s.api.topic_stats, a.topic)
        except TopicNotExistError:
            raise AdminError(f"topic {a.topic} does not exist on broker {name} {addr} (TOPIC_NOT_EXIST)") from None
        except BrokerError as e:
            raise failed(e, f"topic stats of {a.topic}", f"broker {name} {addr}") from None
        merged.update(object_keyed_table(stats, "topic stats", f"broker {addr}"))
    rows = [(mq.broker_name, mq.queue_id, to_int(v.get("minOffset")), to_int(v.get("maxOffset")),
             tables.human_ms(to_int(v.get("lastUpdateTimestamp"))))
            for mq, v in sorted(merged.items())]
    out(tables.format_table(["#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"], rows))


async def update_topic_perm(s: AdminSession, a, out: Out) -> None:
    """Each target broker's queues of the topic keep their counts (from the route) and take
    the new perm; the brokers re-register, so the route follows."""
    route = await s.route(a.topic)
    queue_datas = {qd.broker_name: qd for qd in route.queue_datas}
    masters = route_masters(route)
    if a.brokerAddr:
        names = [n for n, addr in masters.items() if addr == a.brokerAddr]
        if not names:
            raise AdminError(f"broker {a.brokerAddr} is not a master of topic {a.topic} "
                             f"(its masters: {', '.join(sorted(masters.values())) or 'none'})")
        targets = {names[0]: a.brokerAddr}
    elif a.clusterName:
        in_cluster = await s.cluster_masters(a.clusterName)
        targets = {n: addr for n, addr in in_cluster.items() if n in queue_datas}
        if not targets:
            raise AdminError(f"topic {a.topic} has no queues on cluster {a.clusterName}")
    else:
        raise UsageError("updateTopicPerm needs -b brokerAddr or -c clusterName")
    for name, addr in targets.items():
        qd = queue_datas.get(name)
        if qd is None:
            raise AdminError(f"topic {a.topic} has no queues on broker {name} {addr}")
        if qd.perm == a.perm:
            out(f"new perm equals to the old one! ({addr})")
            continue
        config = TopicConfig(a.topic, qd.read_queue_nums, qd.write_queue_nums, a.perm, TOPIC_FILTER_TYPE,
                             qd.topic_sys_flag, False)
        await s.call(addr, s.api.create_topic, config, AUTO_CREATE_TOPIC_KEY_TOPIC,
                     what=f"update perm of topic {a.topic}", where=f"broker {name} {addr}")
        out(f"update topic perm from {qd.perm} to {a.perm} in {addr} success.")
        out(tables.topic_config_line(a.topic, qd.read_queue_nums, qd.write_queue_nums, a.perm,
                                     TOPIC_FILTER_TYPE, qd.topic_sys_flag))


async def topic_cluster_list(s: AdminSession, a, out: Out) -> None:
    route = await s.route(a.topic)
    names = {bd.broker_name for bd in route.broker_datas}
    _, clusters = await s.cluster_info()
    for cluster in sorted(c for c, members in clusters.items() if names & set(members)):
        out(cluster)


COMMANDS = [
    Command("updateTopic", "Update or create topic", [
        Opt("b", "brokerAddr", "create topic to which broker", metavar="ip:port"),
        Opt("c", "clusterName", "create topic to which cluster"),
        Opt("t", "topic", "topic name", required=True, type=stripped),
        Opt("r", "readQueueNums", "set read queue nums (default 8)", type=positive_int, default=8),
        Opt("w", "writeQueueNums", "set write queue nums (default 8)", type=positive_int, default=8),
        Opt("p", "perm", "set topic's permission(2|4|6), intro[2:W 4:R; 6:RW] (default 6)", type=perm, default=6),
        Opt("o", "order", "set topic's order(true|false)", type=java_bool, default=False),
        Opt("u", "unit", "is unit topic (true|false)", type=java_bool, default=False),
        Opt("s", "hasUnitSub", "has unit sub (true|false)", type=java_bool, default=False),
    ], update_topic),
    Command("deleteTopic", "Delete topic from broker and NameServer.", [
        Opt("t", "topic", "topic name", required=True, type=stripped),
        Opt("c", "clusterName", "delete topic from which cluster", required=True, type=stripped),
    ], delete_topic),
    Command("topicList", "Fetch all topic list from name server", [], topic_list),
    Command("topicRoute", "Examine topic route info", [
        Opt("t", "topic", "topic name", required=True, type=stripped),
    ], topic_route),
    Command("topicStatus", "Examine topic Status info", [
        Opt("t", "topic", "topic name", required=True, type=stripped),
    ], topic_status),
    Command("updateTopicPerm", "Update topic perm", [
        Opt("b", "brokerAddr", "update the topic's perm on which broker", type=stripped, metavar="ip:port"),
        Opt("c", "clusterName", "update the topic's perm on which cluster", type=stripped),
        Opt("t", "topic", "topic name", required=True, type=stripped),
        Opt("p", "perm", "set topic's permission(2|4|6), intro[2:W; 4:R; 6:RW]", required=True, type=rw_perm),
    ], update_topic_perm),
    Command("topicClusterList", "Get cluster info for topic", [
        Opt("t", "topic", "topic name", required=True, type=stripped),
    ], topic_cluster_list),
]
