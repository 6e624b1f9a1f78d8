"""Subscription group commands: updateSubGroup, deleteSubGroup (Java 4.9's
UpdateSubGroupSubCommand and DeleteSubscriptionGroupCommand, same flags; plus RocketMQ 5's
`-o consumeOrderly`: the group's POP consumers, 5.x gRPC clients among them, get FIFO
order per queue).

updateSubGroup sends a whole SubscriptionGroupConfig, as Java's does: flags not given
take Java's defaults, except consumeBroadcastEnable and consumeFromMinEnable, which the
Java command sets to false unless -d / -m say otherwise (the broker replaces the group's
config; nothing is merged with what it had).
"""
from __future__ import annotations

from pocketmq.common.constants import dlq_topic, retry_topic
from pocketmq.protocol.bodies import SubscriptionGroupConfig
from pocketmq.tools.mqadmin.command import Command, Opt, Out, java_bool, non_negative_int, stripped
from pocketmq.tools.mqadmin.errors import UsageError
from pocketmq.tools.mqadmin.session import AdminSession


def group_config_line(c: SubscriptionGroupConfig) -> str:
    """Java's SubscriptionGroupConfig.toString(), which the Java command prints."""
    def b(v: bool) -> str:
        return "true" if v else "false"
    return (f"SubscriptionGroupConfig [groupName={c.groupName}, consumeEnable={b(c.consumeEnable)}, "
            f"consumeFromMinEnable={b(c.consumeFromMinEnable)}, "
            f"consumeBroadcastEnable={b(c.consumeBroadcastEnable)}, retryQueueNums={c.retryQueueNums}, "
            f"retryMaxTimes={c.retryMaxTimes}, brokerId={c.brokerId}, "
            f"whichBrokerWhenConsumeSlowly={c.whichBrokerWhenConsumeSlowly}, "
            f"notifyConsumerIdsChangedEnable={b(c.notifyConsumerIdsChangedEnable)}"
            # RocketMQ 5's field, printed only when set: 4.9's line is unchanged otherwise
            + (", consumeMessageOrderly=true" if c.consumeMessageOrderly else "") + "]")


def config_from_flags(a) -> SubscriptionGroupConfig:
    c = SubscriptionGroupConfig(a.groupName, consumeBroadcastEnable=False, consumeFromMinEnable=False)
    for flag, field in (("consumeEnable", "consumeEnable"), ("consumeFromMinEnable", "consumeFromMinEnable"),
                        ("consumeBroadcastEnable", "consumeBroadcastEnable"), ("retryQueueNums", "retryQueueNums"),
                        ("retryMaxTimes", "retryMaxTimes"), ("brokerId", "brokerId"),
                        ("whichBrokerWhenConsumeSlowly", "whichBrokerWhenConsumeSlowly"),
                        ("notifyConsumerIdsChanged", "notifyConsumerIdsChangedEnable"),
                        ("consumeOrderly", "consumeMessageOrderly")):
        value = getattr(a, flag)
        if value is not None:
            setattr(c, field, value)
    return c


async def _targets(s: AdminSession, a, command: str) -> dict[str | None, str]:
    if a.brokerAddr:
        return {None: a.brokerAddr}
    if a.clusterName:
        if not s.namesrv_addrs:
            raise UsageError(f"{command} -c needs a nameserver (-n or $NAMESRV_ADDR)")
        return await s.cluster_masters(a.clusterName)
    raise UsageError(f"{command} needs -c clusterName or -b brokerAddr")


async def update_sub_group(s: AdminSession, a, out: Out) -> None:
    config = config_from_flags(a)
    for addr in (await _targets(s, a, "updateSubGroup")).values():
        await s.call(addr, s.api.update_subscription_group, config,
                     what=f"create subscription group {config.groupName}", where=f"broker {addr}")
        out(f"create subscription group to {addr} success.")
    out(group_config_line(config))


async def delete_sub_group(s: AdminSession, a, out: Out) -> None:
    group = a.groupName
    remove_offset = bool(a.removeOffset)
    targets = await _targets(s, a, "deleteSubGroup")
    for name, addr in targets.items():
        await s.call(addr, s.api.delete_subscription_group, group, remove_offset,
                     what=f"delete subscription group {group}", where=f"broker {addr}")
        if name is None:
            out(f"delete subscription group [{group}] from broker [{addr}] success.")
        else:
            out(f"delete subscription group [{group}] from broker [{addr}] in cluster [{a.clusterName}] success.")
    if a.clusterName and not a.brokerAddr:
        # As Java's command: the group's retry and dead-letter topics go too.
        for topic in (retry_topic(group), dlq_topic(group)):
            for name, addr in targets.items():
                await s.call(addr, s.api.delete_topic_in_broker, topic,
                             what=f"delete topic {topic}", where=f"broker {name} {addr}")
            await s.every_namesrv(s.api.delete_topic_in_namesrv, topic, what=f"delete topic {topic}")
            out(f"delete topic [{topic}] from cluster [{a.clusterName}] success.")


COMMANDS = [
    Command("updateSubGroup", "Update or create subscription group", [
        Opt("b", "brokerAddr", "create subscription group to which broker", metavar="ip:port", type=stripped),
        Opt("c", "clusterName", "create subscription group to which cluster", type=stripped),
        Opt("g", "groupName", "consumer group name", required=True, type=stripped),
        Opt("s", "consumeEnable", "consume enable", type=java_bool),
        Opt("m", "consumeFromMinEnable", "from min offset", type=java_bool),
        Opt("d", "consumeBroadcastEnable", "broadcast", type=java_bool),
        Opt("q", "retryQueueNums", "retry queue nums", type=non_negative_int),
        Opt("r", "retryMaxTimes", "retry max times", type=non_negative_int),
        Opt("i", "brokerId", "consumer from which broker id", type=non_negative_int),
        Opt("w", "whichBrokerWhenConsumeSlowly", "which broker id when consume slowly", type=non_negative_int),
        Opt("a", "notifyConsumerIdsChanged", "notify consumerId changed", type=java_bool),
        Opt("o", "consumeOrderly", "consume message orderly (RocketMQ 5: POP consumers get FIFO order)",
            type=java_bool),
    ], update_sub_group, needs_namesrv=False),
    Command("deleteSubGroup", "Delete subscription group from broker.", [
        Opt("b", "brokerAddr", "delete subscription group from which broker", metavar="ip:port", type=stripped),
        Opt("c", "clusterName", "delete subscription group from which cluster", type=stripped),
        Opt("g", "groupName", "subscription group name", required=True, type=stripped),
        Opt("r", "removeOffset", "remove offset", type=java_bool, default=False),
    ], delete_sub_group, needs_namesrv=False),
]
