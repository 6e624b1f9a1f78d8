"""Driver-side planning of batch reads and stream micro-batches: which queues, which offset
range of each, split into Spark partitions. Runs over the client's public request API
(pocketmq.client's ClientInstance.api: routes, GET_MIN/MAX_OFFSET,
SEARCH_OFFSET_BY_TIMESTAMP), on the blocking facade's private loop
(pocketmq.client.sync.run).

`split_ranges`, `resolve_range` and `admit` (a stream's admission control) are plain
functions of their inputs (tested without a broker); `plan_read`, `queue_bounds` and
`starting_offsets` are the shells that ask the cluster.
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import NamedTuple

from pocketmq.spark.options import EARLIEST, LATEST, OptionError, ReaderOptions

log = logging.getLogger("pocketmq.spark")


class QueueRange(NamedTuple):
    """[start, end) of one queue, plus the queue's min offset when planned (for the
    executor's data-loss check). Picklable: this is what a Spark partition carries."""
    topic: str
    broker_name: str
    queue_id: int
    start: int
    end: int


QueueKey = tuple[str, str, int]     # (topic, broker_name, queue_id)


class DataLossError(RuntimeError):
    pass


def data_loss_message(topic: str, broker_name: str, queue_id: int, wanted: int, min_offset: int,
                      lost_end: int | None = None) -> str:
    """lost_end: the end (exclusive) of the lost part when the wanted range ends before min."""
    last = (min_offset if lost_end is None else min(lost_end, min_offset)) - 1
    return (f"pocketmq: offsets {wanted}..{last} of topic {topic} broker {broker_name} "
            f"queue {queue_id} are gone (the queue's min offset is {min_offset}; retention deleted "
            f"them). Set failOnDataLoss=false to skip lost messages with a warning.")


def _spec_offset(spec, topic: str, broker: str, qid: int, default: int) -> int:
    if isinstance(spec, dict):
        table = spec.get(topic)
        if table is None:
            return default
        return table.get((broker, qid), default)
    return spec


def resolve_range(topic: str, broker: str, qid: int, min_off: int, max_off: int,
                  start: int, end: int, fail_on_data_loss: bool) -> tuple[int, int] | None:
    """The [start, end) to read given the wanted bounds (EARLIEST/LATEST or offsets) and the
    queue's [min, max); None when nothing is left. Raises DataLossError (or warns and
    skips) when the wanted start is below min."""
    s = min_off if start == EARLIEST else max_off if start == LATEST else start
    e = min_off if end == EARLIEST else max_off if end == LATEST else min(end, max_off)
    if s < min_off:
        if s < e:
            msg = data_loss_message(topic, broker, qid, s, min_off, e)
            if fail_on_data_loss:
                raise DataLossError(msg)
            log.warning("%s; skipping them (failOnDataLoss=false)", msg)
        s = min_off
    if s >= e:
        return None
    return s, e


def split_ranges(ranges: list[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Split the largest ranges in offset halves until there are at least `min_partitions`
    (or every range holds one message). Order: by topic, broker, queue, start."""
    out = list(ranges)
    if min_partitions is not None:
        while len(out) < min_partitions:
            big = max(range(len(out)), key=lambda i: out[i].end - out[i].start, default=None)
            if big is None or out[big].end - out[big].start < 2:
                break
            r = out.pop(big)
            mid = r.start + (r.end - r.start) // 2
            out += [r._replace(end=mid), r._replace(start=mid)]
    return sorted(out, key=lambda r: (r.topic, r.broker_name, r.queue_id, r.start))


def admit(starts: dict[QueueKey, int], targets: dict[QueueKey, int], max_offsets: int | None) -> dict[QueueKey, int]:
    """A stream's admission control: the end offset of each queue of `targets` for the next
    micro-batch, reading from `starts` (a queue missing there starts at 0) towards
    `targets`, at most `max_offsets` offsets in all (None: everything).

    The cap is split in proportion to each queue's backlog (Kafka's rule, so lagging queues
    catch up together), rounded down, and the few offsets the rounding leaves are handed
    one each, first to queues the rounding left at zero (no queue with a backlog starves
    while the cap allows one offset per queue), then to the largest remainders. Unlike
    Kafka's ceiling the total never exceeds the cap, and it always equals it when the
    backlog is larger: every batch makes progress. An end never goes below its start."""
    begin = {k: starts.get(k, 0) for k in targets}
    backlog = {k: max(0, targets[k] - begin[k]) for k in targets}
    total = sum(backlog.values())
    if max_offsets is None or total <= max_offsets:
        return {k: begin[k] + backlog[k] for k in targets}
    share = {k: max_offsets * b // total for k, b in backlog.items()}
    spare = max_offsets - sum(share.values())
    # spare < the number of queues with a backlog (each lost less than one to rounding)
    order = sorted((k for k, b in backlog.items() if b > share[k]),
                   key=lambda k: (share[k] > 0, -(max_offsets * backlog[k] % total), k))
    for k in order[:spare]:
        share[k] += 1
    return {k: begin[k] + share[k] for k in targets}


async def _topics(api, opts: ReaderOptions) -> list[str]:
    if opts.pattern is None:
        return list(opts.topics)
    rx = re.compile(opts.pattern)
    return sorted(t for t in await api.topic_list() if rx.fullmatch(t))


READ_GROUP = "spark-pocketmq-reader"   # the pull header needs a group; no offsets are committed
PULL_TIMEOUT_S = 10.0


async def pull_raw(api, addr: str, mq, offset: int, max_nums: int, sub_expression: str = "*"):
    """One PULL_MESSAGE of raw records (protocol.message.decode_records_raw tuples), the
    subscription carried in the request (nothing is registered on the broker)."""
    from pocketmq.client.api import PullRequest, pull_sys_flag

    return await api.pull_message(PullRequest(addr, READ_GROUP, mq, offset, max_nums,
                                              pull_sys_flag(False, False, True), 0, 0, sub_expression, 0,
                                              PULL_TIMEOUT_S, raw=True))


async def first_offset_at_or_after(api, addr: str, mq, timestamp_ms: int, min_off: int, max_off: int) -> int:
    """Kafka's timestamp rule (the first offset whose store timestamp is >= timestamp_ms;
    max_off when there is none) over SEARCH_OFFSET_BY_TIMESTAMP, which answers the offset
    whose store time is *nearest* (RocketMQ's rule): step from that answer to the boundary."""
    async def ts_at(off: int) -> int | None:
        res = await pull_raw(api, addr, mq, off, 1)
        return res.records[0][10] if res.records and res.records[0][3] == off else None

    o = max(min_off, min(await api.search_offset(addr, mq, timestamp_ms), max_off))
    while o > min_off:                      # equal or later timestamps to the left
        t = await ts_at(o - 1)
        if t is None or t < timestamp_ms:
            break
        o -= 1
    while o < max_off:                      # earlier timestamps at o: move right
        res = await pull_raw(api, addr, mq, o, 32)
        if not res.records:
            break
        for rec in res.records:
            if rec[3] >= o and rec[10] >= timestamp_ms:
                return rec[3]
        o = max(res.next_begin_offset, o + 1)
    return o


async def _each_queue(inst, opts: ReaderOptions, strict: bool):
    """(topic, MessageQueue, master address) of every queue the options subscribe to, the
    routes refreshed. strict: a subscribed topic without a route is a NoRouteError (a
    batch read, a stream's start); otherwise it has no queues (a running stream keeps its
    offsets)."""
    from pocketmq.client.errors import NoRouteError

    for topic in await _topics(inst.api, opts):
        queues = await inst.subscribe_queues(topic, refresh=True)
        if not queues and strict and opts.pattern is None:
            raise NoRouteError(f"pocketmq: topic {topic} has no route on the nameserver {opts.namesrv_addr}")
        for mq in sorted(queues, key=lambda q: (q.broker_name, q.queue_id)):
            yield topic, mq, await inst.master_addr_refreshing(mq.broker_name, topic)


async def plan_read_async(inst, opts: ReaderOptions) -> list[QueueRange]:
    api = inst.api
    ranges: list[QueueRange] = []
    async for topic, mq, addr in _each_queue(inst, opts, strict=True):
        min_off = await api.min_offset(addr, mq)
        max_off = await api.max_offset(addr, mq)
        start = _spec_offset(opts.starting, topic, mq.broker_name, mq.queue_id, EARLIEST)
        end = _spec_offset(opts.ending, topic, mq.broker_name, mq.queue_id, LATEST)
        if opts.starting_timestamp is not None:
            start = await first_offset_at_or_after(api, addr, mq, opts.starting_timestamp, min_off, max_off)
        if opts.ending_timestamp is not None:
            end = await first_offset_at_or_after(api, addr, mq, opts.ending_timestamp, min_off, max_off)
        r = resolve_range(topic, mq.broker_name, mq.queue_id, min_off, max_off, start, end,
                          opts.fail_on_data_loss)
        if r is not None:
            ranges.append(QueueRange(topic, mq.broker_name, mq.queue_id, r[0], r[1]))
    return split_ranges(ranges, opts.min_partitions)


async def queue_bounds(inst, opts: ReaderOptions, strict: bool = False) -> dict[QueueKey, tuple[int, int]]:
    """(min offset, max offset) of every queue the options subscribe to now: a stream's
    view of the cluster at each trigger (new topics and queues appear here)."""
    api = inst.api
    queues = [(topic, mq, addr) async for topic, mq, addr in _each_queue(inst, opts, strict)]

    async def bounds(mq, addr):
        return await api.min_offset(addr, mq), await api.max_offset(addr, mq)
    # every queue at once: this runs at each trigger, and brokers may be a network hop away
    got = await asyncio.gather(*(bounds(mq, addr) for _, mq, addr in queues))
    return {(topic, mq.broker_name, mq.queue_id): b for (topic, mq, _), b in zip(queues, got)}


async def starting_offsets(inst, opts: ReaderOptions) -> dict[QueueKey, int]:
    """A new stream's first offsets: startingTimestamp (Kafka's rule) or startingOffsets
    (earliest -> the queue's min, latest -> its max, JSON -> as given, queues it does not
    name at earliest as in a batch read) for every queue subscribed to now. An offset below the min is left as
    given: the first micro-batch reports the loss (failOnDataLoss)."""
    api = inst.api
    out: dict[QueueKey, int] = {}
    async for topic, mq, addr in _each_queue(inst, opts, strict=True):
        min_off = await api.min_offset(addr, mq)
        max_off = await api.max_offset(addr, mq)
        if opts.starting_timestamp is not None:
            start = await first_offset_at_or_after(api, addr, mq, opts.starting_timestamp, min_off, max_off)
        else:
            start = _spec_offset(opts.starting, topic, mq.broker_name, mq.queue_id, EARLIEST)
            start = min_off if start == EARLIEST else max_off if start == LATEST else start
        out[(topic, mq.broker_name, mq.queue_id)] = start
    return out


def plan_read(opts: ReaderOptions) -> list[QueueRange]:
    from pocketmq.spark.session import run_with_instance

    if opts.pattern is None and not opts.topics:
        raise OptionError("option subscribe names no topic")
    return run_with_instance(opts.namesrv_addr, lambda inst: plan_read_async(inst, opts),
                             credentials=opts.credentials, tls=opts.tls)
