"""Broker statistics on the wire: GET_BROKER_RUNTIME_INFO (28) and VIEW_BROKER_STATS_DATA (315).

The counters and windows are broker/core/stats.py's; this module reads them together
with the store's offsets into Java's shapes: the runtime info is a flat
{"table": {key: str(value)}} with AdminBrokerProcessor.prepareRuntimeInfo's key names
(only those we can compute honestly) plus pocketmq's own (heldPulls, and the replication
keys of processors/ha_status.py `runtime_keys`), the stats data a BrokerStatsData
{statsMinute, statsHour, statsDay: {sum, tps, avgpt}}.
"""
from __future__ import annotations

import os
import shutil

from pocketmq.broker.processors.admin import VERSION_DESC
# GET_BROKER_HA_STATUS is registered through this module (processors/__init__.py)
from pocketmq.broker.processors.ha_status import process_get_broker_ha_status, runtime_keys
from pocketmq.protocol import bodies
from pocketmq.protocol.codes import ResponseCode
from pocketmq.protocol.headers.typed import req_str
from pocketmq.protocol.message import store_timestamp_at

__all__ = ["commit_log_dir", "disk_used_ratio", "earliest_message_time", "format_runtime", "runtime_info",
           "process_get_broker_runtime_info", "process_view_broker_stats_data", "process_get_broker_ha_status"]


def disk_used_ratio(path: str) -> float:
    """Used / total of the partition holding `path` (Java's getDiskPartitionSpaceUsedPercent),
    -1 when it cannot be read."""
    try:
        u = shutil.disk_usage(path)
    except OSError:
        return -1.0
    return (u.total - u.free) / u.total if u.total > 0 else -1.0


def commit_log_dir(config) -> str:
    return config.storePathCommitLog or os.path.join(config.storePathRootDir, "commitlog")


def format_runtime(ms: int) -> str:
    """Java's BrokerController runtime string."""
    s = max(0, ms) // 1000
    return f"[ {s // 86400} days, {s % 86400 // 3600} hours, {s % 3600 // 60} minutes, {s % 60} seconds ]"


def earliest_message_time(store) -> int:
    """Store timestamp of the first record still in the commit log, -1 when there is none
    (Java's getEarliestMessageTime)."""
    raw = store.look_message_by_offset(store.commit_log_min_offset)
    return store_timestamp_at(raw) if raw else -1


def runtime_info(ctx) -> dict:
    """Every GET_BROKER_RUNTIME_INFO key (values before str())."""
    st, stats = ctx.store, ctx.stats
    now = ctx.now_ms()
    max_offset = st.commit_log_max_offset
    info = {"brokerVersionDesc": VERSION_DESC, "brokerVersion": 401,
            "bootTimestamp": stats.boot_timestamp, "runtime": format_runtime(now - stats.boot_timestamp),
            "commitLogMinOffset": st.commit_log_min_offset, "commitLogMaxOffset": max_offset,
            "earliestMessageTimeStamp": earliest_message_time(st),
            "commitLogDiskRatio": disk_used_ratio(commit_log_dir(ctx.config)),
            "consumeQueueDiskRatio": disk_used_ratio(ctx.config.storePathRootDir),
            "dispatchBehindBytes": max(0, max_offset - st.reput_from_offset),
            "remainHowManyDataToFlush": max(0, max_offset - st.flushed_offset),
            "heldPulls": ctx.held_pulls.count, "flushDiskType": ctx.config.flushDiskType}
    info.update(stats.runtime_counts())
    if ctx.ha_status is not None:
        info.update(runtime_keys(ctx.ha_status()))
    if ctx.busy_poll is not None:
        # pocketmq's own: the window the loop spins for now and what it follows
        # (remoting/busy_poll.py), e.g. busyPollWindowMicros, busyPollGapAvgMicros, busyPollCaught
        info.update({"busyPoll" + k[0].upper() + k[1:]: v for k, v in ctx.busy_poll.snapshot().items()})
    return info


def process_get_broker_runtime_info(ctx, conn, cmd):
    table = {k: str(v) for k, v in runtime_info(ctx).items()}
    return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps({"table": table}))


def process_view_broker_stats_data(ctx, conn, cmd):
    """VIEW_BROKER_STATS_DATA: header statsName, statsKey (TOPIC_PUT_NUMS + topic,
    GROUP_GET_NUMS + topic@group, BROKER_PUT_NUMS + cluster name...)."""
    name, key = req_str(cmd.ext_fields, "statsName"), req_str(cmd.ext_fields, "statsKey")
    item = ctx.stats.find(name, key, ctx.config.brokerClusterName)
    if item is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
    return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps(item.stats_data()))
