"""Stream pocketmq topics into a Parquet dataset partitioned by day, exactly once.

    python -m jobs.ingest --namesrv 127.0.0.1:9876 --subscribe Orders,Payments \\
        --output /data/mq --checkpoint /data/mq-checkpoint \\
        [--available-now] [--max-offsets-per-trigger N] [--trigger-interval SECONDS] \\
        [--group-id G] [--starting-offsets earliest|latest] [--fail-on-data-loss true|false] \\
        [--master URL]

readStream.format("pocketmq") -> every column of the source's schema plus `dt`, the UTC
date of store_timestamp (`yyyy-MM-dd`) -> writeStream parquet partitioned by dt
(`OUTPUT/dt=2026-11-23/part-....parquet`).

Exactly once across crashes is Spark's file sink protocol, which this job leaves intact:
before a micro-batch runs, its per-queue offset range is logged in the checkpoint
(`offsets/N`); the sink writes the batch's files, then lists them in one atomic entry of
`OUTPUT/_spark_metadata/N`; then `commits/N` is written. A job killed anywhere in between is
restarted with the same checkpoint: batch N is planned again from `offsets/N` (the same
offsets, so the same messages), and if `_spark_metadata/N` already exists the sink skips it.
Files written by the killed attempt stay on disk but are in no log entry, and every reader
that goes through the log (spark.read.parquet(OUTPUT), replay) ignores them. So there is no
foreachBatch here, nothing written outside the sink; readers must read OUTPUT through Spark
(not by globbing part files).

Prints one line per micro-batch (batch id, rows, end offsets, backlog, rows/s) and a
summary. Exit status: 0 done, 130 stopped by Ctrl-C or SIGTERM, 1 the query failed (the
reason is printed), 2 bad arguments.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from pocketmq.jobs._common import (
    describe_failure,
    is_local_path,
    namesrv_addr,
    positive_int,
    prog_name,
    positive_seconds,
    start_spark,
)

# pocketmq.spark (which imports pyspark) is imported inside the functions that use it: the
# job modules import without the `spark` extra (argument errors, the wheel's import check)
if TYPE_CHECKING:
    from pocketmq.spark.plan import QueueKey

QUERY_NAME = "pocketmq_ingest"
# queues listed one by one in a progress line up to this many; beyond it, a count
LIST_QUEUES_UP_TO = 6
# the listener bus delivers events asynchronously: how long the summary waits for the last ones
LAST_EVENTS_WAIT_S = 30.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog_name("ingest"),
        description="Stream pocketmq topics into a Parquet dataset partitioned by dt (UTC date of "
                    "store_timestamp), exactly once across crashes (Spark checkpoint + file sink log).")
    p.add_argument("--namesrv", required=True, type=namesrv_addr, help="nameserver host:port[;host:port]")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--subscribe", help="comma-separated topics")
    src.add_argument("--subscribe-pattern", help="a regex matched against the whole topic name; "
                                                 "new matching topics are picked up")
    p.add_argument("--output", required=True, help="the Parquet dataset's directory")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory (keep it: it is "
                                                       "where a restart resumes)")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--available-now", action="store_true",
                      help="read what exists now (in capped batches) and stop")
    when.add_argument("--trigger-interval", type=positive_seconds, metavar="SECONDS",
                      help="start a micro-batch every SECONDS (default: as soon as the previous ends)")
    p.add_argument("--max-offsets-per-trigger", type=positive_int, metavar="N",
                   help="at most N messages per micro-batch, over all queues")
    p.add_argument("--group-id", help="after each committed batch, store the progress as this consumer "
                                      "group's offsets on the brokers (mqadmin consumerProgress shows the lag)")
    p.add_argument("--starting-offsets", choices=("earliest", "latest"), default="earliest",
                   help="where a new query starts (default earliest); a restart resumes from the checkpoint")
    p.add_argument("--fail-on-data-loss", choices=("true", "false"), default="true",
                   help="fail when wanted offsets were deleted by retention (default), or skip them with a warning")
    p.add_argument("--master", help="Spark master URL (default local[*], or spark-submit's)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.subscribe is not None:
        topics = [t.strip() for t in args.subscribe.split(",") if t.strip()]
        if not topics:
            parser.error(f"--subscribe names no topic: {args.subscribe!r}")
        args.subscribe = ",".join(dict.fromkeys(topics))
    else:
        try:
            re.compile(args.subscribe_pattern)
        except re.error as e:
            parser.error(f"--subscribe-pattern is not a valid regex: {e}")
    out, ckpt = args.output, args.checkpoint
    if is_local_path(out) and is_local_path(ckpt):
        o, c = os.path.abspath(out), os.path.abspath(ckpt)
        if o == c or c.startswith(o + os.sep) or o.startswith(c + os.sep):
            parser.error("--output and --checkpoint must be separate directories, neither inside the other")
        for flag, path in (("--output", out), ("--checkpoint", ckpt)):
            if os.path.exists(path) and not os.path.isdir(path):
                parser.error(f"{flag} {path} exists and is not a directory")
    return args


# --------------------------------------------------------------------------- progress (pure)

def queue_offsets(text: str | None) -> dict[QueueKey, int] | None:
    """A source offset as Spark hands it over (the offsets JSON text, whose owner is
    pocketmq.spark.options) as {(topic, broker_name, queue_id): offset}; None when absent or
    not that JSON."""
    from pocketmq.spark.options import offsets_from_json

    if not text:
        return None
    try:
        return offsets_from_json(json.loads(text), "progress offset")
    except ValueError:          # not JSON, or OptionError (a ValueError): not our offsets
        return None


def backlog(end: dict[QueueKey, int] | None, latest: dict[QueueKey, int] | None) -> int | None:
    """Messages the source reported as available past the batch's end offsets: the sum over
    queues of latest - end (a queue absent from the end offsets has all of its latest)."""
    if latest is None or end is None:
        return None
    return sum(max(0, off - end.get(q, 0)) for q, off in latest.items())


def offsets_summary(end: dict[QueueKey, int] | None) -> str:
    """`end T[broker-a:0=5 broker-b:1=7]` (queues grouped by topic) up to LIST_QUEUES_UP_TO
    queues, else a count and the sum."""
    if end is None:
        return "end offsets n/a"
    if len(end) > LIST_QUEUES_UP_TO:
        return f"end offsets of {len(end)} queues (sum {sum(end.values())})"
    from pocketmq.spark.options import queue_key

    by_topic: dict[str, list[str]] = {}
    for (topic, broker, qid), off in sorted(end.items()):
        by_topic.setdefault(topic, []).append(f"{queue_key(broker, qid)}={off}")
    return "end " + " ".join(f"{t}[{' '.join(qs)}]" for t, qs in by_topic.items())


def progress_line(batch_id: int, rows: int, rows_per_s: float, end_text: str | None,
                  latest_text: str | None) -> str:
    end = queue_offsets(end_text)
    lag = backlog(end, queue_offsets(latest_text))
    return (f"batch {batch_id}: {rows} rows, {rows_per_s:.0f} rows/s, {offsets_summary(end)}, "
            f"backlog {'n/a' if lag is None else lag}")


# --------------------------------------------------------------------------- the query

def _progress_printer(out):
    """A StreamingQueryListener (Spark calls it on a Py4J callback thread) printing one line
    per finished micro-batch and counting batches and rows for the summary."""
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressPrinter(StreamingQueryListener):
        def __init__(self):
            self.batches = 0
            self.rows = 0
            self.first_batch: int | None = None
            self.last_batch: int | None = None
            self.last_end: str | None = None
            self.last_latest: str | None = None
            self.terminated = threading.Event()

        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            p = event.progress
            src = p.sources[0] if p.sources else None
            end = src.endOffset if src is not None else None
            latest = src.latestOffset if src is not None else None
            self.batches += 1
            self.rows += p.numInputRows
            if self.first_batch is None:
                self.first_batch = p.batchId
            self.last_batch = p.batchId
            self.last_end, self.last_latest = end, latest
            rate = p.processedRowsPerSecond      # NaN for a batch that took no measurable time
            print(progress_line(p.batchId, p.numInputRows, 0.0 if math.isnan(rate) else rate, end, latest),
                  file=out, flush=True)

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            self.terminated.set()

    return ProgressPrinter()


def build_stream_reader(spark, args: argparse.Namespace):
    r = (spark.readStream.format("pocketmq").option("namesrvAddr", args.namesrv)
         .option("startingOffsets", args.starting_offsets).option("failOnDataLoss", args.fail_on_data_loss))
    r = r.option("subscribe", args.subscribe) if args.subscribe is not None \
        else r.option("subscribePattern", args.subscribe_pattern)
    if args.max_offsets_per_trigger is not None:
        r = r.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    if args.group_id:
        r = r.option("groupId", args.group_id)
    return r


def start_query(spark, args: argparse.Namespace):
    from pyspark.sql import functions as F

    df = build_stream_reader(spark, args).load()
    # the session time zone is UTC (spark_session), so this is the UTC calendar date
    df = df.withColumn("dt", F.date_format(F.col("store_timestamp"), "yyyy-MM-dd"))
    w = (df.writeStream.format("parquet").queryName(QUERY_NAME).outputMode("append")
         .option("path", args.output).option("checkpointLocation", args.checkpoint).partitionBy("dt"))
    if args.available_now:
        w = w.trigger(availableNow=True)
    elif args.trigger_interval is not None:
        w = w.trigger(processingTime=f"{args.trigger_interval} seconds")
    return w.start()


class _Stop(Exception):
    """SIGTERM: stop the query like Ctrl-C does."""


def _on_sigterm(signum, frame):
    raise _Stop()


def run(args: argparse.Namespace, out=sys.stdout) -> int:
    spark = start_spark("ingest", args.master)
    if spark is None:
        return 1
    printer = _progress_printer(out)
    query = None
    started = time.monotonic()
    status = 0
    try:
        spark.streams.addListener(printer)
        query = start_query(spark, args)
        started = time.monotonic()
        source = args.subscribe if args.subscribe is not None else f"pattern {args.subscribe_pattern}"
        # handled before the started line: a supervisor may signal as soon as it reads it, and
        # a SIGTERM before the handler is the default action (killed, no summary)
        signal.signal(signal.SIGTERM, _on_sigterm)
        print(f"ingest: query {query.id} reading {source} from {args.namesrv} into {args.output} "
              f"(checkpoint {args.checkpoint})", file=out, flush=True)
        # awaitTermination in slices: a Python signal handler runs between them
        while not query.awaitTermination(1):
            pass
    except (KeyboardInterrupt, _Stop):
        print("ingest: stopping (the checkpoint keeps the progress of committed batches)", file=out, flush=True)
        status = 130
        if query is not None:
            try:
                query.stop()
            except Exception as e:   # Ctrl-C reaches the JVM too, which may be shutting down already
                print(f"ingest: stopping the query: {describe_failure(e)}", file=sys.stderr, flush=True)
    except Exception as e:
        print(f"ingest failed: {describe_failure(e)}", file=sys.stderr, flush=True)
        status = 1
    if query is not None:
        printer.terminated.wait(LAST_EVENTS_WAIT_S)
    took = time.monotonic() - started
    if printer.batches:
        rate = printer.rows / took if took > 0 else 0.0
        lag = backlog(queue_offsets(printer.last_end), queue_offsets(printer.last_latest))
        print(f"ingest: {printer.batches} batches ({printer.first_batch}..{printer.last_batch}), "
              f"{printer.rows} rows in {took:.1f} s ({rate:.0f} rows/s), backlog "
              f"{'n/a' if lag is None else lag}; output {args.output}", file=out, flush=True)
    else:
        print(f"ingest: no batch ran in {took:.1f} s; output {args.output}", file=out, flush=True)
    try:
        spark.stop()
    except Exception:
        pass
    return status


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
