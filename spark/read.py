"""Executor side of a batch read: pull one queue range and yield Arrow record batches.

Uses ClientAPI.pull_message (raw records, protocol.message.decode_records_raw) instead of a
LitePullConsumer: a range read must stop exactly at its end offset, and the consumer's
fetcher prefetches past it and rebalances; a pull request asks for at most `end - offset`
messages and every record at or past `end` is dropped.

Columns are built as Python lists per column (one pass over the raw tuples) and handed to
pyarrow once per pull; properties are decoded once per record (tags, keys, UNIQ_KEY and the
user properties all come from that text).
"""
from __future__ import annotations

import logging

import pyarrow as pa

from pocketmq.client.api import PullResult
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.message import (
    KEYS,
    SYSTEM_PROPERTY_KEYS,
    TAGS,
    UNIQ_KEY,
    decode_properties,
    format_host,
    offset_msg_id,
    property_value,
)
from pocketmq.spark.options import tag_set
from pocketmq.spark.plan import DataLossError, QueueRange, data_loss_message, pull_raw
from pocketmq.spark.schema import ARROW_SCHEMA

log = logging.getLogger("pocketmq.spark")

PULL_BATCH = 512


def records_to_batch(records: list[tuple], broker_name: str) -> pa.RecordBatch:
    """decode_records_raw tuples -> one RecordBatch of ARROW_SCHEMA. The fixed fields are
    transposed in C (zip(*records)) and handed to pyarrow as columns; only the properties
    text (tags, keys, UNIQ_KEY, user properties) and the hosts need a Python step per row."""
    n = len(records)
    cols = list(zip(*records)) if n else [()] * 16
    props_texts = cols[4]
    msg_ids, tags, keys, born_hosts = [], [], [], []
    map_offsets = [0]
    map_keys: list[str] = []
    map_vals: list[str] = []
    hosts: dict[tuple, str] = {}
    system = SYSTEM_PROPERTY_KEYS
    for i in range(n):
        text = props_texts[i]
        props = decode_properties(text) if text else {}
        uniq = props.get(UNIQ_KEY)
        if uniq:
            msg_ids.append(uniq)
        else:
            r = records[i]
            msg_ids.append(offset_msg_id(r[11][0], r[11][1], r[7]))
        tags.append(props.get(TAGS))
        keys.append(props.get(KEYS))
        h = cols[9][i]
        host = hosts.get(h)
        if host is None:
            host = hosts[h] = format_host(h[0], h[1])
        born_hosts.append(host)
        for k, v in props.items():
            if k not in system:
                map_keys.append(k)
                map_vals.append(v)
        map_offsets.append(len(map_keys))
    ts = pa.timestamp("us", tz="UTC")
    ms = pa.timestamp("ms", tz="UTC")
    arrays = [
        pa.array(cols[0], pa.string()),
        pa.array([broker_name] * n, pa.string()),
        pa.array(cols[2], pa.int32()),
        pa.array(cols[3], pa.int64()),
        pa.array(msg_ids, pa.string()),
        pa.array(tags, pa.string()),
        pa.array(keys, pa.string()),
        pa.array(cols[1], pa.binary()),
        pa.MapArray.from_arrays(pa.array(map_offsets, pa.int32()), pa.array(map_keys, pa.string()),
                                pa.array(map_vals, pa.string())),
        pa.array(cols[8], pa.int64()).cast(ms).cast(ts),
        pa.array(cols[10], pa.int64()).cast(ms).cast(ts),
        pa.array(born_hosts, pa.string()),
        pa.array(cols[12], pa.int32()),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


async def _pull(inst, r: QueueRange, offset: int, sub_expression: str) -> PullResult:
    mq = MessageQueue(r.topic, r.broker_name, r.queue_id)
    addr = await inst.master_addr_refreshing(r.broker_name, r.topic)
    return await pull_raw(inst.api, addr, mq, offset, min(PULL_BATCH, r.end - offset), sub_expression)


def read_range(namesrv_addr: str, r: QueueRange, sub_expression: str, fail_on_data_loss: bool):
    """Yield RecordBatches of the messages of `r` (exactly [start, end), tag-filtered)."""
    for records in pull_range(namesrv_addr, r, sub_expression, fail_on_data_loss):
        yield records_to_batch(records, r.broker_name)


def pull_range(namesrv_addr: str, r: QueueRange, sub_expression: str, fail_on_data_loss: bool):
    """Yield the decode_records_raw tuples of `r`, one non-empty list per pull (exactly
    [start, end), tag-filtered): read_range without the Arrow step (bench_spark times it)."""
    from pocketmq.spark.session import run_with_instance

    wanted = tag_set(sub_expression)
    offset = r.start
    while offset < r.end:
        res = run_with_instance(namesrv_addr, lambda inst, o=offset: _pull(inst, r, o, sub_expression))
        if res.status == PullResult.OFFSET_ILLEGAL or (res.min_offset > offset and res.status != PullResult.FOUND):
            if res.min_offset > offset:
                msg = data_loss_message(r.topic, r.broker_name, r.queue_id, offset, res.min_offset)
                if fail_on_data_loss:
                    raise DataLossError(msg)
                log.warning("%s; skipping them (failOnDataLoss=false)", msg)
                offset = res.min_offset
                continue
            raise RuntimeError(f"pocketmq: offset {offset} of {r.topic} {r.broker_name} queue {r.queue_id} "
                               f"is illegal (queue holds {res.min_offset}..{res.max_offset})")
        if res.status == PullResult.NO_NEW_MSG:
            # the range was planned below the max offset: nothing new means the data vanished
            raise RuntimeError(f"pocketmq: {r.topic} {r.broker_name} queue {r.queue_id} has no message at "
                               f"offset {offset} (max {res.max_offset}) though {r.end} was planned")
        records = res.records
        if records:
            first = records[0][3]
            if first > offset and wanted is None:
                # with `*` the broker skips nothing: a gap is data that retention deleted
                msg = data_loss_message(r.topic, r.broker_name, r.queue_id, offset, first)
                if fail_on_data_loss:
                    raise DataLossError(msg)
                log.warning("%s; skipping them (failOnDataLoss=false)", msg)
            keep = [t for t in records if t[3] < r.end and t[3] >= offset]
            if wanted is not None:
                keep = [t for t in keep if _tags_of(t[4]) in wanted]
            if keep:
                yield keep
        if res.next_begin_offset <= offset:
            raise RuntimeError(f"pocketmq: pull of {r.topic} {r.broker_name} queue {r.queue_id} at {offset} "
                               f"made no progress ({res})")
        offset = res.next_begin_offset


def _tags_of(props_text: str) -> str | None:
    # the broker filters by tag hash code only (RocketMQ's rule); the exact check is the client's
    return property_value(props_text, TAGS) if props_text else None
