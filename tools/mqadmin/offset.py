"""Offset commands: resetOffsetByTime, cloneGroupOffset."""
from __future__ import annotations

import argparse
import time

from pocketmq.client.api import ResetOffsetRequest
from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.command import Command, Opt, Out, java_bool, stripped
from pocketmq.tools.mqadmin.errors import AdminError
from pocketmq.tools.mqadmin.session import AdminSession, route_masters


def reset_timestamp(s: str) -> int:
    """Java's resetOffsetByTime -s: now | milliseconds | yyyy-MM-dd#HH:mm:ss:SSS (local
    time); -1 means the end of each queue."""
    v = s.strip()
    if v == "now":
        return int(time.time() * 1000)
    try:
        n = int(v)
    except ValueError:
        pass
    else:
        if n < -1:
            raise argparse.ArgumentTypeError(f"bad timestamp {s!r}: milliseconds must be >= -1")
        return n
    try:
        day, _, clock = v.partition("#")
        hms, _, millis = clock.rpartition(":")
        t = time.mktime(time.strptime(f"{day} {hms}", "%Y-%m-%d %H:%M:%S"))
        return int(t) * 1000 + int(millis)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"bad timestamp {s!r}: use now, milliseconds or yyyy-MM-dd#HH:mm:ss:SSS") from None


async def reset_offset_by_time(s: AdminSession, a, out: Out) -> None:
    masters = route_masters(await s.route(a.topic))
    if not masters:
        raise AdminError(f"topic {a.topic} has no master broker in its route")
    req = ResetOffsetRequest(a.topic, a.group, a.timestamp, a.force)
    rows = []
    for name, addr in masters.items():
        table = await s.call(addr, s.api.reset_offset, req,
                             what=f"reset offsets of {a.group} on {a.topic}", where=f"broker {name} {addr}")
        rows.extend((mq.broker_name, mq.queue_id, off) for mq, off in sorted(table.items()))
    out(f"rollback consumer offset by specified group[{a.group}], topic[{a.topic}], "
        f"force[{'true' if a.force else 'false'}], timestamp(long)[{a.timestamp}]")
    out(tables.format_table(["#brokerName", "#queueId", "#offset"], rows))


async def clone_group_offset(s: AdminSession, a, out: Out) -> None:
    """CLONE_GROUP_OFFSET on every master of the topic (Java's tool copies the broker offsets
    through UPDATE_CONSUMER_OFFSET instead; the broker's own clone copies the group's
    committed offsets, which is what the command promises)."""
    masters = route_masters(await s.route(a.topic))
    if not masters:
        raise AdminError(f"topic {a.topic} has no master broker in its route")
    cloned, known = 0, False
    for name, addr in masters.items():
        n = await s.call(addr, s.api.clone_group_offset, a.srcGroup, a.destGroup, a.topic, a.offline,
                         what=f"clone offsets of {a.srcGroup} to {a.destGroup}", where=f"broker {name} {addr}")
        if n is not None:
            known = True
            cloned += n
    if known and not cloned:
        raise AdminError(f"group {a.srcGroup} has no committed offset on topic {a.topic}: nothing to clone")
    out(f"clone group offset success. srcGroup[{a.srcGroup}], destGroup=[{a.destGroup}], topic[{a.topic}]")


COMMANDS = [
    Command("resetOffsetByTime", "Reset consumer offset by timestamp(without client restart).", [
        Opt("g", "group", "set the consumer group", required=True, type=stripped),
        Opt("t", "topic", "set the topic", required=True, type=stripped),
        Opt("s", "timestamp", "set the timestamp[now|currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]; -1: the end",
            required=True, type=reset_timestamp),
        Opt("f", "force", "set the force rollback by timestamp switch[true|false] (default true; false only "
                          "moves offsets back)", type=java_bool, default=True),
    ], reset_offset_by_time),
    Command("cloneGroupOffset", "clone offset from other group.", [
        Opt("s", "srcGroup", "set source consumer group", required=True, type=stripped),
        Opt("d", "destGroup", "set destination consumer group", required=True, type=stripped),
        Opt("t", "topic", "set the topic", required=True, type=stripped),
        Opt("o", "offline", "the group or the topic is offline: clone even a topic the online source "
                            "group no longer subscribes to (true|false, default false)",
            type=java_bool, default=False),
    ], clone_group_offset),
]
