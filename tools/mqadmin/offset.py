"""Offset commands: resetOffsetByTime."""
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


COMMANDS = [
    Command("resetOffsetByTime", "Reset consumer offset by timestamp(without client restart).", [
        Opt("g", "group", "set the consumer group", required=True, type=stripped),
        Opt("t", "topic", "set the topic", required=True, type=stripped),
        Opt("s", "timestamp", "set the timestamp[now|currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]; -1: the end",
            required=True, type=reset_timestamp),
        Opt("f", "force", "set the force rollback by timestamp switch[true|false] (default true; false only "
                          "moves offsets back)", type=java_bool, default=True),
    ], reset_offset_by_time),
]
