"""Spark source benchmark: batch read of a topic, phase by phase (issue 9, "Speed").

    python -m bench.bench_spark                        # starts mqnamesrv + mqbroker in a temp dir
    python -m bench.bench_spark --messages 1000000     # the issue's figure
    python -m bench.bench_spark --namesrv 127.0.0.1:9876
    python -m bench.bench_spark --messages 1000000 --repeat 2 --schema "queue_offset long"
    python -m bench.bench_spark --ceilings --messages 1000000   # no broker: Spark's own cost
    python -m bench.bench_spark --messages 1000000 --repeat 3 --no-index --with-ceilings
                                    # the prebuilt-batch source after each round, same session: ratios
    python -m bench.bench_spark --messages 1000000 --repeat 3 --no-index --with-ceilings --alternate 10
                                    # then count() of both alternating 10 times (the JIT settled)

Loads N messages of 128 B (a tag, two keys, a user property and the producer's UNIQ_KEY;
send_batch) into a fresh topic, then times four phases over all of it:

  pull      the executor's pull loop alone (spark.read.pull_range: ClientAPI.pull_message
            raw=PULL_BODY over every queue and the column-wise decode of the bodies, in
            this process)
  +arrow    the same plus the Arrow batches (spark.read.read_range: segments_to_batch)
  count     spark.read.format("pocketmq")...load().count() on local[2]
  parquet   the same DataFrame written to Parquet
  stream    (--stream-cap N) readStream, trigger(availableNow=True), maxOffsetsPerTrigger=N,
            noop sink: the overhead per micro-batch against the batch count()

For each: rows/s (wall) and CPU µs per row: this process (all threads; getrusage) for
the in-process phases, the Spark JVM and its Python workers (/proc) for the Spark phases,
and the broker's (/proc). The split says where a row's CPU goes: pull (request, broker
reply, frame; the reader's column-wise decode is measured on its own and taken out),
decode (and decode_records_raw on the same bodies, the per-record path it replaced, for
reference), Arrow (segments_to_batch), Spark (the JVM and the worker's share besides our read).
The machine's speed drifts: the loopback calibration line (bench_broker's) comes first,
and CPU per row is steadier than wall time when other work shares the cores.

--ceilings measures the host instead of the source (no broker): the JVM alone (spark.range,
a Parquet file of the row schema: count(), full scan, rewrite into Parquet) and a Python
source yielding one prebuilt batch over and over with 13, 12 and 3 columns (count(), noop
sink, Parquet): what Spark costs per row whatever a source does.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_broker import cpu_seconds, loopback_echo_rtt_us  # noqa: E402
from pocketmq.client import Message, Producer  # noqa: E402
from pocketmq.client.instance import ClientInstance  # noqa: E402
from pocketmq.protocol import message as msgcodec  # noqa: E402
from pocketmq.protocol.bodies import TopicConfig  # noqa: E402

BODY_SIZE = 128
SEND_BATCH = 100
SEND_IN_FLIGHT = 8


def process_cpu_seconds(pid: int, reaped: bool = False) -> float:
    """utime+stime of a process (/proc), plus cutime+cstime (its children it reaped) with
    `reaped`."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root_pid: int) -> float:
    """CPU of a process and all its descendants (the Spark JVM and its Python workers): the
    live ones' utime+stime plus what each reaped of its children (a worker that exits
    during a phase moves its CPU into its parent's cutime, so the sum is kept)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    total = 0.0
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        try:
            total += process_cpu_seconds(pid, reaped=True)
        except OSError:
            continue
        todo.extend(children.get(pid, ()))
    return total


# -- load --------------------------------------------------------------------------------

async def create_topic(namesrv: str, topic: str, queues: int) -> list[str]:
    inst = ClientInstance("127.0.0.1@bench-spark-admin", namesrv)
    try:
        brokers, _clusters = await inst.api.cluster_info()
        addrs = sorted(b.broker_addrs[0] for b in brokers.values() if 0 in b.broker_addrs)
        for addr in addrs:
            await inst.api.create_topic(addr, TopicConfig(topic, queues, queues), "TBW102")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if await inst.subscribe_queues(topic, refresh=True):
                return addrs
            await asyncio.sleep(0.05)
        raise RuntimeError(f"no route for {topic}")
    finally:
        await inst.close()


async def load(namesrv: str, topic: str, n: int) -> float:
    """Send n messages (send_batch of 100, 8 in flight); returns msgs/s."""
    body = os.urandom(BODY_SIZE)
    async with Producer("BenchSparkLoad", namesrv, instance_name="bench-spark-load") as p:
        left = n
        seq = 0

        async def worker():
            nonlocal left, seq
            while left > 0:
                k = min(SEND_BATCH, left)
                left -= k
                first = seq
                seq += k
                await p.send_batch([Message(topic, body, tags="TagA", keys=(f"k{i}", f"order-{i % 997}"),
                                            properties={"color": "red" if i % 2 else "blue"})
                                    for i in range(first, first + k)])
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(SEND_IN_FLIGHT)))
        return n / (time.perf_counter() - t0)


# -- phases ------------------------------------------------------------------------------

class Meter:
    """Wall time, this process's CPU (all threads), and other processes' CPU over a phase."""

    def __init__(self, pids: dict[str, callable]):
        self.pids = pids

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()
        self.o0 = {k: f() for k, f in self.pids.items()}
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.c0
        self.other = {k: f() - self.o0[k] for k, f in self.pids.items()}


def plan(namesrv: str, topic: str):
    from pocketmq.spark.options import parse_reader_options
    from pocketmq.spark.plan import plan_read

    return plan_read(parse_reader_options({"namesrvAddr": namesrv, "subscribe": topic}))


def phase_pull(namesrv, ranges) -> int:
    from pocketmq.spark.read import pull_range

    return sum(len(part) for r in ranges for parts in pull_range(namesrv, r, "*", True) for part in parts)


def phase_arrow(namesrv, ranges, columns=None) -> int:
    from pocketmq.spark.read import read_range

    return sum(b.num_rows for r in ranges for b in read_range(namesrv, r, "*", True, columns))


def schema_columns(ddl: str | None) -> tuple[str, ...] | None:
    """The reader's columns for a --schema DDL of plain `name type` pairs (the Spark phases
    check the types: schema.projection)."""
    return tuple(part.split()[0] for part in ddl.split(",")) if ddl else None


def decode_cost_us(namesrv, ranges, rounds: int = 3) -> tuple[float, float]:
    """CPU per row of the reader's decode of one batch's pull bodies of this topic's shape
    (pull_range's _batch_parts: record_starts_np and the numpy/pyarrow framing, over the
    batch's joined bodies when every body is kept whole), and of decode_records_raw on the
    same bodies (the per-record tuples the reader used before, for reference); both happen
    inside pull_range, so they are timed apart here."""
    from pocketmq.protocol.bodies import MessageQueue
    from pocketmq.spark.read import BATCH_ROWS, _batch_parts, _pulls
    from pocketmq.spark.session import run_with_instance

    r = ranges[0]
    addr, results = run_with_instance(namesrv, lambda inst: _pulls(inst, r, r.start, "*", BATCH_ROWS))
    bodies = [res.body for res in results if res.body]
    mq = MessageQueue(r.topic, r.broker_name, r.queue_id)
    rows = sum(len(msgcodec.decode_records_raw(b)) for b in bodies)
    out = []
    for decode in (lambda: _batch_parts(results, r, r.start, None, True, mq, addr),
                   lambda: [msgcodec.decode_records_raw(b) for b in bodies]):
        best = float("inf")
        for _ in range(rounds):
            c0 = time.process_time()
            decode()
            best = min(best, time.process_time() - c0)
        out.append(best / rows * 1e6)
    return out[0], out[1]


SPARK_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
              "spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"}


def spark_session(master: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("pocketmq-bench")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    s = builder.getOrCreate()
    s.sparkContext.setLogLevel("ERROR")
    return s


def reader(spark, namesrv, topic, ending: dict | None = None, schema: str | None = None):
    r = spark.read.format("pocketmq").option("namesrvAddr", namesrv).option("subscribe", topic)
    if schema:
        r = r.schema(schema)
    if ending is not None:
        r = r.option("endingOffsets", json.dumps(ending))
    return r.load()


def phase_stream(spark, namesrv, topic, cap: int, out_dir: str, meters):
    """readStream with trigger(availableNow=True) and maxOffsetsPerTrigger=cap into the
    noop sink: (rows, micro-batches, Meter), or None when this tree has no streaming reader."""
    try:
        df = (spark.readStream.format("pocketmq").option("namesrvAddr", namesrv).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(cap)).load())
    except Exception as e:      # the batch-only source: pyspark says the source cannot stream
        print(f"stream: not measured ({type(e).__name__}: {str(e).splitlines()[0][:160]})", flush=True)
        return None
    with Meter(meters) as m:
        q = (df.writeStream.format("noop").trigger(availableNow=True)
             .option("checkpointLocation", os.path.join(out_dir, "checkpoint")).start())
        q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"stream failed: {q.exception()}")
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    return sum(p["numInputRows"] for p in progress), len(progress), m


def row(name, n, m: Meter, cpu_us: float) -> dict:
    out = {"phase": name, "rows": n, "wall_s": round(m.wall, 3), "rows_per_s": round(n / m.wall),
           "cpu_us_per_row": round(cpu_us, 2)}
    for k, v in m.other.items():
        out[f"{k}_cpu_us_per_row"] = round(v / max(n, 1) * 1e6, 2)
    if "spark" in m.other and "jvm" in m.other:     # the Spark tree's CPU: the JVM, its Python workers
        out["workers_cpu_us_per_row"] = round((m.other["spark"] - m.other["jvm"]) / max(n, 1) * 1e6, 2)
    print(" ".join(f"{k}={v}" for k, v in out.items()), flush=True)
    return out


TINY_ROWS = 40          # a query this small costs what any query costs before its rows
TINY_TIMES = 3


def fixed_cost(name: str, rows: int, action, phases: list) -> None:
    """--with-ceilings: the median wall of TINY_TIMES runs of `action` (a count() of
    TINY_ROWS rows): planning, scheduling, the tasks' start and end. A rate over N rows mixes
    it in; the per-row comparison takes it out (ceiling_ratios' "marginal" ratios)."""
    walls = []
    for _ in range(TINY_TIMES):
        t0 = time.perf_counter()
        got = action()
        walls.append(time.perf_counter() - t0)
        assert got == rows, f"{name}: {got} rows"
    walls.sort()
    p = {"phase": name, "rows": rows, "wall_s": round(walls[len(walls) // 2], 3)}
    print(" ".join(f"{k}={v}" for k, v in p.items()), flush=True)
    phases.append(p)


def run(namesrv: str, broker_pids: list[int], args) -> dict:
    topic = f"BenchSpark{os.getpid()}x{int(time.time()) % 100000}"
    asyncio.run(create_topic(namesrv, topic, args.queues))
    rate = asyncio.run(load(namesrv, topic, args.messages))
    print(f"loaded {args.messages} messages of {BODY_SIZE} B into {topic} ({args.queues} queues) "
          f"at {rate:,.0f} msgs/s", flush=True)
    broker_cpu = {"broker": lambda: sum(cpu_seconds(p) for p in broker_pids)} if broker_pids else {}
    ranges = plan(namesrv, topic)
    total = sum(r.end - r.start for r in ranges)
    assert total == args.messages, f"planned {total} rows, sent {args.messages}"
    out = {"messages": args.messages, "queues": args.queues, "load_msgs_per_s": round(rate)}
    phases = []

    decode_us, tuples_us = decode_cost_us(namesrv, ranges)
    columns = schema_columns(args.schema)
    for name, fn in (("pull", phase_pull), ("pull+arrow", lambda ns, rs: phase_arrow(ns, rs, columns))):
        fn(namesrv, [ranges[0]._replace(end=min(ranges[0].end, ranges[0].start + 100))])   # warm-up
        with Meter(broker_cpu) as m:
            n = fn(namesrv, ranges)
        assert n == args.messages, f"{name}: {n} rows"
        phases.append(row(name, n, m, m.cpu / n * 1e6))

    if not args.no_spark:
        spark = spark_session(args.master)
        jvm = spark.sparkContext._gateway.proc.pid
        meters = dict(broker_cpu, spark=lambda: tree_cpu_seconds(jvm), jvm=lambda: process_cpu_seconds(jvm))
        per_queue = max(1, TINY_ROWS // len(ranges))
        small = {topic: {f"{r.broker_name}:{r.queue_id}": r.start + per_queue for r in ranges}}
        out_dir = tempfile.mkdtemp(prefix="bench-spark-parquet-")
        try:
            # the first Python-source query of a session starts the workers: not timed
            reader(spark, namesrv, topic, small, args.schema).count()
            reader(spark, namesrv, topic, small, args.schema).write.mode("overwrite").parquet(
                os.path.join(out_dir, "warm"))
            ceiling = ceiling_phases(spark, args, meters, out_dir, phases) if args.with_ceilings else None
            for k in range(args.repeat):
                # the JVM's JIT warms over the first full-size runs: later rounds are faster
                suffix = "" if k == 0 else f" #{k + 1}"
                with Meter(meters) as m:
                    n = reader(spark, namesrv, topic, schema=args.schema).count()
                assert n == args.messages, f"count() gave {n}"
                phases.append(row("spark count()" + suffix, n, m, m.other["spark"] / n * 1e6))
                with Meter(meters) as m:
                    reader(spark, namesrv, topic, schema=args.schema).write.mode("overwrite").parquet(
                        os.path.join(out_dir, "out"))
                n = spark.read.parquet(os.path.join(out_dir, "out")).count()
                assert n == args.messages, f"parquet holds {n} rows"
                phases.append(row("spark parquet" + suffix, n, m, m.other["spark"] / n * 1e6))
                if ceiling is not None:
                    fixed_cost(f"fixed: spark count() of {TINY_ROWS} rows{suffix}", per_queue * len(ranges),
                               lambda: reader(spark, namesrv, topic, small, args.schema).count(), phases)
                    ceiling(suffix)
            if args.stream_cap:
                got = phase_stream(spark, namesrv, topic, args.stream_cap, out_dir, meters)
                if got is not None:
                    n, batches, m = got
                    p = row("spark stream availableNow", n, m, m.other["spark"] / n * 1e6)
                    count = next(x for x in phases if x["phase"] == "spark count()")
                    p["micro_batches"] = batches
                    p["overhead_ms_per_micro_batch"] = round((m.wall - count["wall_s"]) / batches * 1000, 1)
                    p["overhead_cpu_ms_per_micro_batch"] = round(
                        (m.other["spark"] - count["cpu_us_per_row"] * n / 1e6) / batches * 1000, 1)
                    print(f"stream: {batches} micro-batches of <= {args.stream_cap}: "
                          f"{p['overhead_ms_per_micro_batch']} ms wall and {p['overhead_cpu_ms_per_micro_batch']} "
                          "ms Spark CPU per micro-batch beyond the batch count()", flush=True)
                    phases.append(p)
            if args.alternate:
                out["alternate"] = alternate_counts(spark, args, namesrv, topic)
        finally:
            spark.stop()
            shutil.rmtree(out_dir, ignore_errors=True)

    by = {p["phase"]: p for p in phases}
    pull_us = by["pull"]["cpu_us_per_row"]
    arrow_us = by["pull+arrow"]["cpu_us_per_row"] - pull_us
    split = {"broker": by["pull"].get("broker_cpu_us_per_row"), "pull (client, without decode)": pull_us - decode_us,
             "decode (column-wise: record_starts + framing)": decode_us,
             "arrow (segments_to_batch)": arrow_us,
             "for reference: decode_records_raw on the same bodies": tuples_us}
    for name in (p["phase"] for p in phases if p["phase"].startswith(("spark count()", "spark parquet"))):
        split[f"spark, {name[6:]} (JVM + workers beyond our read)"] = \
            by[name]["cpu_us_per_row"] - by["pull+arrow"]["cpu_us_per_row"]
    print("CPU µs per row: " + ", ".join(f"{k} {v:.2f}" for k, v in split.items() if v is not None), flush=True)
    if args.with_ceilings and not args.no_spark:
        out["ratios_to_ceiling"] = ceiling_ratios(phases, args.repeat)
    out.update(phases=phases, split_cpu_us_per_row={k: None if v is None else round(v, 2) for k, v in split.items()})
    return out


# -- ceilings: what Spark costs with no broker and no read ----------------------------------

CEILING_PARTITIONS = 4
CEILING_BATCH_ROWS = 8192
# the schema variants a Python source yields (column names of spark.schema.COLUMNS)
CEILING_VARIANTS = {
    "13 columns (the source's schema)": None,
    "12 columns (no properties map)": ("topic", "broker_name", "queue_id", "queue_offset", "msg_id", "tags", "keys",
                                       "body", "born_timestamp", "store_timestamp", "born_host", "reconsume_times"),
    "3 columns (queue_id, queue_offset, store_timestamp)": ("queue_id", "queue_offset", "store_timestamp"),
}


def prebuilt_batch(rows: int, columns: tuple[str, ...] | None):
    """One RecordBatch shaped like the reader's (values as bench load() sends them; the
    properties map holds the user property only, as the reader's), of `columns` (None: all)."""
    import numpy as np
    import pyarrow as pa

    from pocketmq.spark.schema import ARROW_SCHEMA

    ids = np.arange(rows)
    body = os.urandom(BODY_SIZE)
    ms = 1_763_900_000_000 + ids
    ts = pa.array(ms, pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))
    colors = ["red" if i % 2 else "blue" for i in range(rows)]
    data = {
        "topic": pa.array(["BenchSparkCeiling"] * rows, pa.string()),
        "broker_name": pa.repeat(pa.scalar("broker-a", pa.string()), rows),
        "queue_id": pa.array(ids % 4, pa.int32()),
        "queue_offset": pa.array(ids, pa.int64()),
        "msg_id": pa.array([f"7F00000100002A9F0000{i:012X}" for i in range(rows)], pa.string()),
        "tags": pa.array(["TagA"] * rows, pa.string()),
        "keys": pa.array([f"k{i} order-{i % 997}" for i in range(rows)], pa.string()),
        "body": pa.array([body] * rows, pa.binary()),
        "properties": pa.MapArray.from_arrays(pa.array(np.arange(rows + 1), pa.int32()),
                                              pa.array(["color"] * rows, pa.string()), pa.array(colors, pa.string())),
        "born_timestamp": ts,
        "store_timestamp": ts,
        "born_host": pa.array(["127.0.0.1:51234"] * rows, pa.string()),
        "reconsume_times": pa.array(np.zeros(rows, np.int32)),
    }
    names = columns or tuple(ARROW_SCHEMA.names)
    schema = pa.schema([ARROW_SCHEMA.field(c) for c in names])
    return pa.RecordBatch.from_arrays([data[c] for c in names], schema=schema)


def ceiling_source():
    """A Python data source `pocketmq_ceiling` (option `columns`: a comma list, `rows`)
    that yields one prebuilt batch over and over: Spark's own cost for the reader's shape
    of data (no broker, no pull, no conversion)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from pocketmq.spark.schema import COLUMNS

    def wanted(options) -> tuple[str, ...] | None:
        cols = options.get("columns")
        return tuple(cols.split(",")) if cols else None

    class CeilingReader(DataSourceReader):
        def __init__(self, options):
            self.columns = wanted(options)
            self.rows = int(options["rows"])
            self.batch_rows = int(options.get("batchRows", CEILING_BATCH_ROWS))

        def partitions(self):
            per, extra = divmod(self.rows, CEILING_PARTITIONS)
            return [InputPartition(per + (i < extra)) for i in range(CEILING_PARTITIONS)]

        def read(self, partition):
            batch = prebuilt_batch(self.batch_rows, self.columns)
            left = partition.value
            while left > 0:
                yield batch if left >= batch.num_rows else batch.slice(0, left)
                left -= batch.num_rows

    class CeilingSource(DataSource):
        @classmethod
        def name(cls):
            return "pocketmq_ceiling"

        def schema(self):
            kinds = dict(COLUMNS)
            return ", ".join(f"{c} {kinds[c]}" for c in wanted(self.options) or kinds)

        def reader(self, schema):
            return CeilingReader(self.options)

    return CeilingSource


def ceiling_phases(spark, args, meters, out_dir, phases):
    """--with-ceilings: registers the prebuilt-batch Python source (run_ceilings'), starts its
    workers, and returns a function timing its 13-column count() and Parquet write of
    --messages rows (phases "ceiling count()" / "ceiling parquet" + suffix): called after
    each round of the source's own phases, so the ratios compare rows/s in one session,
    under the same load and JIT."""
    if __name__ != "__main__":          # workers must unpickle the source by value
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(ceiling_source())
    n = args.messages

    def source(rows=n):
        r = spark.read.format("pocketmq_ceiling").option("rows", str(rows))
        return r.option("batchRows", str(args.batch_rows)).load()

    source().limit(10).count()      # starts its workers: not timed

    def timed(suffix: str) -> None:
        with Meter(meters) as m:
            got = source().count()
        assert got == n, f"ceiling count() gave {got}"
        phases.append(row("ceiling count()" + suffix, n, m, m.other["spark"] / n * 1e6))
        with Meter(meters) as m:
            source().write.mode("overwrite").parquet(os.path.join(out_dir, "ceiling"))
        phases.append(row("ceiling parquet" + suffix, n, m, m.other["spark"] / n * 1e6))
        fixed_cost(f"fixed: ceiling count() of {TINY_ROWS} rows{suffix}", TINY_ROWS,
                   lambda: source(TINY_ROWS).count(), phases)
    return timed


def alternate_counts(spark, args, namesrv: str, topic: str) -> dict:
    """--alternate N: after the other phases, count() of ours and of the prebuilt-batch source
    alternating N times each in this session; the median wall of each over the last half (the
    JVM's JIT settles over the first ~10 full-size queries of a session: the rounds above are
    still in it) and the ratio of the prebuilt source's to ours (issue 35 item 4)."""
    spark.dataSource.register(ceiling_source())
    walls: dict[str, list[float]] = {"ours": [], "prebuilt": []}
    actions = {"ours": lambda: reader(spark, namesrv, topic, schema=args.schema).count(),
               "prebuilt": lambda: spark.read.format("pocketmq_ceiling").option("rows", str(args.messages))
               .option("batchRows", str(args.batch_rows)).load().count()}
    for _ in range(args.alternate):
        for name, action in actions.items():
            t0 = time.perf_counter()
            got = action()
            walls[name].append(time.perf_counter() - t0)
            assert got == args.messages, f"{name} count() gave {got}"
    half = args.alternate // 2
    med = {name: statistics.median(w[half:]) for name, w in walls.items()}
    out = {"walls_s": {k: [round(x, 3) for x in v] for k, v in walls.items()},
           "median_s_last_half": {k: round(v, 3) for k, v in med.items()},
           "ratio": round(med["prebuilt"] / med["ours"], 3)}
    print(f"count() alternating {args.alternate} times: median of the last {args.alternate - half} ours "
          f"{med['ours']:.3f} s, prebuilt {med['prebuilt']:.3f} s: ratio {out['ratio']:.3f}x", flush=True)
    return out


def ceiling_ratios(phases: list[dict], repeat: int) -> dict:
    """Our rows/s over the prebuilt source's, per action and round (issue 35 item 4: count()
    >= 0.5, Parquet >= 0.8), printed and returned."""
    by = {p["phase"]: p for p in phases}
    out = {}
    for k in range(repeat):
        suffix = "" if k == 0 else f" #{k + 1}"
        for action in ("count()", "parquet"):
            ours, ceiling = by[f"spark {action}{suffix}"], by[f"ceiling {action}{suffix}"]
            out[f"{action}{suffix}"] = round(ours["rows_per_s"] / ceiling["rows_per_s"], 3)
    print("rows/s against the prebuilt-batch source, same session: "
          + ", ".join(f"{k} {v:.2f}x" for k, v in out.items()), flush=True)
    # the same with each side's fixed cost taken out: wall per row beyond a TINY_ROWS count()
    marginal = {}
    for k in range(repeat):
        suffix = "" if k == 0 else f" #{k + 1}"
        ours, ceiling = by[f"spark count(){suffix}"], by[f"ceiling count(){suffix}"]
        f_ours = by[f"fixed: spark count() of {TINY_ROWS} rows{suffix}"]
        f_ceiling = by[f"fixed: ceiling count() of {TINY_ROWS} rows{suffix}"]
        us_ours = (ours["wall_s"] - f_ours["wall_s"]) / ours["rows"] * 1e6
        us_ceiling = (ceiling["wall_s"] - f_ceiling["wall_s"]) / ceiling["rows"] * 1e6
        marginal[f"count(){suffix}"] = {
            "fixed_ms": [round(f_ours["wall_s"] * 1e3), round(f_ceiling["wall_s"] * 1e3)],
            "wall_us_per_row": [round(us_ours, 3), round(us_ceiling, 3)],
            "ratio": round(us_ceiling / us_ours, 3) if us_ours > 0 else None}
    print(f"count() beyond a {TINY_ROWS}-row count() (fixed ms ours / prebuilt; wall µs a row ours / prebuilt; ratio): "
          + ", ".join(f"{k} {v['fixed_ms'][0]} / {v['fixed_ms'][1]} ms; {v['wall_us_per_row'][0]:.2f} / "
                      f"{v['wall_us_per_row'][1]:.2f} µs; {v['ratio']}x" for k, v in marginal.items()), flush=True)
    out["marginal"] = marginal
    return out


def run_ceilings(args) -> dict:
    """--ceilings: on args.master, with no broker: (a) the JVM alone (spark.range count; a
    Parquet file of the 13-column data: count() from its metadata, a full scan into the noop
    sink, a rewrite into Parquet), (b) a Python source yielding a prebuilt batch of the
    13-column schema, (c) the same with narrower schemas (CEILING_VARIANTS): count(), noop
    sink, Parquet. CPU per row: the JVM alone and its Python workers apart."""
    if __name__ != "__main__":          # workers must unpickle the source by value
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    n = args.messages
    spark = spark_session(args.master)
    jvm = spark.sparkContext._gateway.proc.pid
    meters = {"jvm": lambda: process_cpu_seconds(jvm),
              "workers": lambda: tree_cpu_seconds(jvm) - process_cpu_seconds(jvm)}
    spark.dataSource.register(ceiling_source())
    out_dir = tempfile.mkdtemp(prefix="bench-spark-ceilings-")
    phases = []

    def timed(name, rows, action):
        with Meter(meters) as m:
            got = action()
        if got is not None:
            assert got == rows, f"{name}: {got} rows"
        p = row(name, rows, m, (m.other["jvm"] + m.other["workers"]) / rows * 1e6)
        phases.append(p)

    def source(columns):
        r = spark.read.format("pocketmq_ceiling").option("rows", str(n)).option("batchRows", str(args.batch_rows))
        return r.option("columns", ",".join(columns)).load() if columns else r.load()

    try:
        # warm-up: JIT and the Python workers, not timed
        source(None).limit(10).count()
        spark.range(n).count()
        data = os.path.join(out_dir, "data")
        source(None).write.parquet(data)
        for k in range(2):
            timed(f"jvm: spark.range({n}).count()", n, lambda: spark.range(n).count())
            timed("jvm: parquet (13 columns) count() [row-group metadata]", n,
                  lambda: spark.read.parquet(data).count())
            timed("jvm: parquet (13 columns) full scan -> noop", n,
                  lambda: spark.read.parquet(data).write.format("noop").mode("overwrite").save())
            timed("jvm: parquet (13 columns) -> parquet", n,
                  lambda: spark.read.parquet(data).write.mode("overwrite").parquet(os.path.join(out_dir, f"j{k}")))
            for label, cols in CEILING_VARIANTS.items():
                timed(f"python source, {label}: count()", n, lambda: source(cols).count())
                timed(f"python source, {label}: -> noop", n,
                      lambda: source(cols).write.format("noop").mode("overwrite").save())
                timed(f"python source, {label}: -> parquet", n,
                      lambda: source(cols).write.mode("overwrite").parquet(os.path.join(out_dir, f"p{k}")))
    finally:
        spark.stop()
        shutil.rmtree(out_dir, ignore_errors=True)
    return {"rows": n, "master": args.master, "ceilings": phases}


@contextlib.contextmanager
def cluster_or(namesrv: str | None, broker_args: list[str] | None = None):
    """(nameserver address, broker pids): the given cluster (its broker's CPU unknown), or
    a fresh mqnamesrv + mqbroker in a temp dir, stopped and removed afterwards."""
    if namesrv:
        yield namesrv, []
        return
    from tests.support.daemons import Cluster

    root = tempfile.mkdtemp(prefix="bench-spark-")
    cluster = Cluster(root, broker_args).start()
    try:
        yield cluster.namesrv_addr, [cluster.broker.proc.pid]
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--queues", type=int, default=4, help="queues of the topic (one Spark partition each)")
    ap.add_argument("--namesrv", help="use a running cluster (broker CPU is then not measured)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--no-spark", action="store_true", help="only the in-process phases")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the count() and Parquet phases")
    ap.add_argument("--schema", help="read with .schema(DDL): a subset of the columns (the pull+arrow and "
                                     "Spark phases build only those)")
    ap.add_argument("--no-index", action="store_true",
                    help="broker messageIndexEnable=false: no index build competing with the read phases")
    ap.add_argument("--stream-cap", type=int, default=0,
                    help="also time a readStream availableNow run with maxOffsetsPerTrigger=N (noop sink)")
    ap.add_argument("--ceilings", action="store_true",
                    help="no broker: Spark's own cost (JVM-only baseline, a Python source of prebuilt batches)")
    ap.add_argument("--batch-rows", type=int, default=CEILING_BATCH_ROWS,
                    help="rows per prebuilt batch (the reader's batches are ~16,384 rows)")
    ap.add_argument("--with-ceilings", action="store_true",
                    help="after the source's Spark phases, the prebuilt-batch source's count() and Parquet "
                         "(13 columns, --messages rows) in the same session, and the ratios; also each "
                         "source's 40-row count() (the fixed cost of a query) and the ratio per row beyond it")
    ap.add_argument("--alternate", type=int, default=0,
                    help="after the other Spark phases, count() of ours and the prebuilt-batch source "
                         "alternating N times in the session; medians of the last half and their ratio")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    # a kill (timeout, ^C from a wrapper) still stops the daemons and removes the temp dirs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    calibration = {"before": loopback_echo_rtt_us()}
    print(f"calibration before: loopback_echo_rtt_us={calibration['before']:.1f}", flush=True)
    if args.ceilings:
        result = run_ceilings(args)
    else:
        # the message index is built behind the dispatcher (indexBuildBatchNums a second):
        # after a 1,000,000-message load it runs for a minute, through the read phases
        broker_args = ["--messageIndexEnable=false"] if args.no_index else []
        with cluster_or(args.namesrv, broker_args) as (namesrv, broker_pids):
            result = run(namesrv, broker_pids, args)
    calibration["after"] = loopback_echo_rtt_us()
    print(f"calibration after: loopback_echo_rtt_us={calibration['after']:.1f}", flush=True)
    result["calibration_rtt_us"] = calibration
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)

if __name__ == "__main__":
    main()
