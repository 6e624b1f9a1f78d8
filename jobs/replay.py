"""Replay a Parquet dataset (an ingest job's output) into a topic.

    python -m jobs.replay --namesrv 127.0.0.1:9876 --input /data/orders --topic OrdersReplay \\
        [--where "dt = '2026-11-23' AND tags = 'TagA'"] [--batch-size 256] [--master URL]

Reads the dataset with spark.read.parquet (which lists a streaming sink's files from its
`_spark_metadata` log, so files of a crashed, uncommitted micro-batch are not replayed),
keeps the rows matching --where (Spark SQL over the dataset's columns, dt included), and
writes body, tags, keys and properties into the topic with the pocketmq writer (batched
SEND_BATCH per task). Prints the rows to write, the tasks done while it runs, and a summary.
Exit status: 0 done, 1 the Spark job failed (the reason is printed), 2 bad arguments.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from pocketmq.jobs._common import (
    describe_failure,
    is_local_path,
    namesrv_addr,
    positive_int,
    prog_name,
    start_spark,
)

REPLAYED_COLUMNS = ("body", "tags", "keys", "properties")
PROGRESS_EVERY_S = 2.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog_name("replay"),
        description="Write a Parquet dataset of pocketmq messages (an ingest job's output) into a topic.")
    p.add_argument("--namesrv", required=True, type=namesrv_addr, help="nameserver host:port[;host:port]")
    p.add_argument("--input", required=True, help="the dataset's directory (an ingest --output)")
    p.add_argument("--topic", required=True, help="the topic to write into")
    p.add_argument("--where", help="a Spark SQL condition over the dataset's columns, e.g. \"dt >= '2026-11-01'\"")
    p.add_argument("--batch-size", type=positive_int, default=256, help="messages per SEND_BATCH (default 256)")
    p.add_argument("--master", help="Spark master URL (default local[*], or spark-submit's)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.topic.strip():
        parser.error("--topic must not be empty")
    if is_local_path(args.input) and not os.path.isdir(args.input):
        parser.error(f"--input {args.input} is not a directory")
    return args


class TaskProgress:
    """Prints the write's finished tasks every few seconds from Spark's status tracker (the
    writer's own counts come back to Spark's commit, not to this process)."""

    def __init__(self, sc, out):
        self.sc, self.out = sc, out
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="replay-progress", daemon=True)

    def _run(self) -> None:
        last = None
        while not self.stop.wait(PROGRESS_EVERY_S):
            tracker = self.sc.statusTracker()
            done = total = 0
            for sid in tracker.getActiveStageIds():
                info = tracker.getStageInfo(sid)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if total and (done, total) != last:
                last = (done, total)
                print(f"replay: {done}/{total} tasks done", file=self.out, flush=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def run(args: argparse.Namespace, out=sys.stdout) -> int:
    spark = start_spark("replay", args.master)
    if spark is None:
        return 1
    try:
        df = spark.read.parquet(args.input)
        missing = [c for c in REPLAYED_COLUMNS if c not in df.columns]
        if missing:
            print(f"replay: {args.input} has no column(s) {', '.join(missing)}: not a pocketmq dataset",
                  file=sys.stderr)
            return 1
        if args.where:
            try:
                df = df.where(args.where)
            except Exception as e:      # a parse or analysis error: Spark checks it eagerly
                print(f"replay: bad --where {args.where!r}: {describe_failure(e)}", file=sys.stderr, flush=True)
                return 2
        df = df.select(*REPLAYED_COLUMNS)
        # the DataFrame holds the file listing taken above: the count and the write see the
        # same files even if an ingest job appends meanwhile
        rows = df.count()
        print(f"replay: {rows} rows from {args.input}"
              + (f" where {args.where}" if args.where else "") + f" -> topic {args.topic}", file=out, flush=True)
        started = time.monotonic()
        if rows:
            with TaskProgress(spark.sparkContext, out):
                (df.write.format("pocketmq").option("namesrvAddr", args.namesrv).option("topic", args.topic)
                 .option("batchSize", str(args.batch_size)).mode("append").save())
        took = time.monotonic() - started
        rate = f", {rows / took:.0f} rows/s" if took > 0 and rows else ""
        print(f"replay: wrote {rows} rows into topic {args.topic} in {took:.1f} s{rate}", file=out, flush=True)
        return 0
    except Exception as e:
        print(f"replay failed: {describe_failure(e)}", file=sys.stderr, flush=True)
        return 1
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
