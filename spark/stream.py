"""Structured Streaming for the pocketmq source: `spark.readStream.format("pocketmq")` and
`df.writeStream.format("pocketmq")` (pyspark.sql.datasource's stream reader and writer).

The stream's offset is the offsets JSON of the startingOffsets option,
`{"topic": {"brokerName:queueId": offset}}` (options.offsets_to_json, canonical order),
and Spark keeps it in the query's checkpoint: a restart resumes exactly there. Each
micro-batch [start, end) becomes one QueueRange per queue that moved (split like a batch
read by minPartitions) and executors read it with read.read_range, as a batch read does.

Driver side (one Python process per query, which keeps this reader between calls):
- initialOffset: startingTimestamp / startingOffsets (default `latest`, Kafka's stream
  default) for every queue subscribed to at the first start.
- latestOffset(start, limit): the queues subscribed to now (subscribePattern re-matched,
  routes refreshed), so new topics and queues join; a new queue starts at offset 0, like
  Kafka's new partitions (a min offset above 0 is reported as data loss); a queue gone
  from the routes keeps its last offset; a queue whose max fell below the stream's offset
  (deleted and created again) is data loss, like Kafka's offsets going back. ReadMaxRows (maxOffsetsPerTrigger) is split over
  the queues by plan.admit; ReadAllAvailable reads up to the max offsets.
- prepareForTriggerAvailableNow: the max offsets at that moment are the query's target;
  later messages and queues wait for the next run.
- groupId: each queue's offset after a committed micro-batch is stored as the group's
  consumer offset (UPDATE_CONSUMER_OFFSET), so `mqadmin consumerProgress -g G` shows the
  lag. Spark calls commit(end) for a batch only when it plans the next one, so the start
  handed to latestOffset (always the end of a batch the sink has committed) is stored too:
  an availableNow run leaves its final ends. Spark's checkpoint stays the truth: a failure
  there is logged, never fails the query.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceStreamReader, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from pocketmq.spark.options import (
    offsets_from_json,
    offsets_to_json,
    parse_reader_options,
    parse_writer_options,
)
from pocketmq.spark.plan import (
    DataLossError,
    QueueKey,
    QueueRange,
    admit,
    queue_bounds,
    resolve_range,
    split_ranges,
    starting_offsets,
)

log = logging.getLogger("pocketmq.spark")

DRIVER_CALL_TIMEOUT_S = 120.0


class PocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options, columns: tuple[str, ...] | None = None):
        self.opts = parse_reader_options(dict(options), streaming=True, environ=os.environ)
        self.columns = columns                               # schema.projection: None = every column
        self._inst = None                                    # the driver's ClientInstance, opened on use
        self._target: dict[QueueKey, int] | None = None      # availableNow: the max offsets at its start
        self._latest: dict[QueueKey, int] | None = None      # the true latest offsets, for progress
        self._bounds: dict[QueueKey, tuple[int, int]] = {}   # (min, max) seen by the last latestOffset
        self._stored: dict[QueueKey, int] | None = None     # groupId: the offsets last stored

    def __getstate__(self):
        # Spark pickles the reader into the executors' read tasks: only the options travel
        return {"opts": self.opts, "columns": self.columns, "_inst": None, "_target": None, "_latest": None,
                "_bounds": {}, "_stored": None}

    # -- the driver's connection ------------------------------------------------------------
    def _run(self, fn):
        from pocketmq.client import sync
        from pocketmq.client.instance import ClientInstance, default_instance_name, local_ip

        async def go():
            if self._inst is None or self._inst.closed:
                self._inst = ClientInstance(f"{local_ip()}@spark-stream-{default_instance_name()}",
                                            self.opts.namesrv_addr, credentials=self.opts.credentials,
                                            tls=self.opts.tls or None)
            return await fn(self._inst)
        return sync.run(go(), DRIVER_CALL_TIMEOUT_S)

    def _refresh_bounds(self) -> dict[QueueKey, tuple[int, int]]:
        self._bounds = self._run(lambda inst: queue_bounds(inst, self.opts))
        return self._bounds

    # -- offsets ----------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        return offsets_to_json(self._run(lambda inst: starting_offsets(inst, self.opts)))

    def getDefaultReadLimit(self):
        n = self.opts.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: mx for k, (_, mx) in self._refresh_bounds().items()}

    def latestOffset(self, start: dict, limit) -> dict:
        starts = offsets_from_json(start)
        self._store_group_offsets(starts)
        bounds = self._refresh_bounds()
        self._latest = {**starts, **{k: mx for k, (_, mx) in bounds.items()}}
        if isinstance(limit, ReadAllAvailable):
            cap = None
        elif isinstance(limit, ReadMaxRows):
            cap = limit.max_rows
        else:
            raise ValueError(f"pocketmq stream: unsupported read limit {limit!r} "
                             "(maxOffsetsPerTrigger gives ReadMaxRows)")
        targets: dict[QueueKey, int] = {}
        begin: dict[QueueKey, int] = {}
        ends = dict(starts)                 # queues gone from the routes keep their offsets
        for k, (mn, mx) in bounds.items():
            if k in starts and mx < starts[k]:
                ends[k] = self._went_back(k, starts[k], mn, mx)
                continue
            if self._target is not None:
                if k not in self._target:
                    continue                # appeared after availableNow's start: the next run's
                mx = min(mx, self._target[k])
            # offsets retention deleted cost nothing from the cap (they are skipped or fail)
            begin[k] = max(starts.get(k, 0), mn)
            targets[k] = mx
        for k, e in admit(begin, targets, cap).items():
            if e > starts.get(k, 0):
                ends[k] = e
        return offsets_to_json(ends)

    def _went_back(self, k: QueueKey, offset: int, mn: int, mx: int) -> int:
        """A queue whose max offset fell below the stream's offset (its topic was deleted and
        created again): Kafka's rule, data loss. The stream moves back to the queue's min
        offset, and the next micro-batch reads from there."""
        msg = (f"pocketmq: topic {k[0]} broker {k[1]} queue {k[2]} now ends at offset {mx}, before the "
               f"stream's offset {offset} (was the topic deleted and created again?); messages may have "
               "been missed")
        if self.opts.fail_on_data_loss:
            raise DataLossError(f"{msg}. Set failOnDataLoss=false to read the queue again from its min "
                                "offset with a warning.")
        log.warning("%s; reading it again from its min offset %d (failOnDataLoss=false)", msg, mn)
        return mn

    def reportLatestOffset(self):
        return None if self._latest is None else offsets_to_json(self._latest)

    # -- planning and reading ---------------------------------------------------------------
    def partitions(self, start: dict, end: dict):
        from pocketmq.spark.source import QueuePartition

        starts, ends = offsets_from_json(start), offsets_from_json(end)
        wanted = [QueueRange(t, b, q, starts.get((t, b, q), 0), e)
                  for (t, b, q), e in sorted(ends.items()) if e > starts.get((t, b, q), 0)]
        if not wanted:
            return []
        mins = self._min_offsets([r for r in wanted if (r.topic, r.broker_name, r.queue_id) not in self._bounds])
        ranges = []
        for r in wanted:
            k = (r.topic, r.broker_name, r.queue_id)
            mn = mins.get(k, self._bounds.get(k, (None,))[0])
            if mn is None:                  # unknown now: the executor checks for loss when it pulls
                ranges.append(r)
                continue
            got = resolve_range(r.topic, r.broker_name, r.queue_id, mn, r.end, r.start, r.end,
                                self.opts.fail_on_data_loss)
            if got is not None:
                ranges.append(r._replace(start=got[0], end=got[1]))
        return [QueuePartition(r) for r in split_ranges(ranges, self.opts.min_partitions)]

    def _min_offsets(self, ranges: list[QueueRange]) -> dict[QueueKey, int]:
        """Min offsets of queues the last latestOffset did not see (a batch replayed after a
        restart); a queue that cannot be asked is left to the executor's check."""
        if not ranges:
            return {}
        from pocketmq.protocol.bodies import MessageQueue

        async def go(inst):
            out = {}
            for r in ranges:
                try:
                    addr = await inst.master_addr_refreshing(r.broker_name, r.topic)
                    out[(r.topic, r.broker_name, r.queue_id)] = await inst.api.min_offset(
                        addr, MessageQueue(r.topic, r.broker_name, r.queue_id))
                except Exception as e:      # noqa: BLE001 - the executor's pull reports it
                    log.warning("pocketmq stream: min offset of %s %s queue %d unknown: %s",
                                r.topic, r.broker_name, r.queue_id, e)
            return out
        return self._run(go)

    def read(self, partition):
        from pocketmq.spark.read import read_range

        return read_range(self.opts.namesrv_addr, partition.value, self.opts.sub_expression,
                          self.opts.fail_on_data_loss, self.columns, credentials=self.opts.credentials,
                          tls=self.opts.tls)

    # -- after a micro-batch ----------------------------------------------------------------
    def commit(self, end: dict) -> None:
        self._store_group_offsets(offsets_from_json(end))

    def _store_group_offsets(self, offsets: dict[QueueKey, int]) -> None:
        """Store the offsets that moved since the last store. A failed queue is not retried
        until its offset moves again: the group's offsets only mirror the checkpoint, and a
        queue whose topic was deleted would otherwise warn at every trigger."""
        if self.opts.group_id is None:
            return
        stored = self._stored if self._stored is not None else {}
        changed = {k: off for k, off in offsets.items() if stored.get(k) != off}
        if not changed:
            return
        try:
            self._run(lambda inst: commit_group_offsets(inst, self.opts.group_id, changed))
        except Exception as e:              # noqa: BLE001 - the checkpoint is the truth
            log.warning("pocketmq stream: storing offsets of group %s failed: %s", self.opts.group_id, e)
        self._stored = {**stored, **changed}

    def stop(self) -> None:
        inst, self._inst = self._inst, None
        if inst is not None and not inst.closed:
            from pocketmq.client import sync

            try:
                sync.run(inst.close(), 30)
            except Exception as e:          # noqa: BLE001 - the query is over either way
                log.warning("pocketmq stream: closing the client failed: %s", e)


async def commit_group_offsets(inst, group: str, offsets: dict[QueueKey, int]) -> int:
    """Store `offsets` as `group`'s consumer offsets (what a consumer's commit does), every
    queue concurrently; failures are logged per queue. Returns how many were stored."""
    from pocketmq.protocol.bodies import MessageQueue

    async def one(k: QueueKey, off: int) -> bool:
        topic, broker, qid = k
        try:
            addr = await inst.master_addr_refreshing(broker, topic)
            await inst.api.update_consumer_offset(addr, group, MessageQueue(topic, broker, qid), off)
            return True
        except Exception as e:              # noqa: BLE001 - logged, never fails the query
            log.warning("pocketmq stream: storing offset %d of group %s on %s %s queue %d failed: %s",
                        off, group, topic, broker, qid, e)
            return False
    return sum(await asyncio.gather(*(one(k, off) for k, off in sorted(offsets.items()))))


@dataclass
class StreamWriteResult(WriterCommitMessage):
    messages: int
    batches: int


class PocketMQStreamWriter(DataSourceStreamWriter):
    """Each micro-batch's rows are sent like a batch write (write.write_rows). Sends are
    durable once acknowledged, so commit has nothing to publish and abort cannot take them
    back: at-least-once, like Kafka's sink (a replayed batch is sent again)."""

    def __init__(self, options):
        self.opts = parse_writer_options(dict(options), environ=os.environ)

    def write(self, iterator):
        from pocketmq.spark.write import write_rows

        messages, batches = write_rows(self.opts, iterator)
        return StreamWriteResult(messages, batches)

    def commit(self, messages, batchId) -> None:
        n = sum(m.messages for m in messages if m is not None)
        log.info("pocketmq stream writer: batch %d committed, %d messages", batchId, n)

    def abort(self, messages, batchId) -> None:
        n = sum(m.messages for m in messages if m is not None)
        log.warning("pocketmq stream writer: batch %d aborted; %d messages were already sent", batchId, n)
