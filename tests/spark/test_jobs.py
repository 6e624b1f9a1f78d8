"""The Spark jobs (jobs/ingest.py, jobs/replay.py) run as subprocesses against the session's
nameserver and brokers: `python -m jobs.ingest` from the checkout's root, each in its own
process group so a SIGKILL reaches its JVM and Python workers too.

What they show: an availableNow ingest lands every message exactly once with the batch
reader's columns and the right dt; a job killed with SIGKILL while a micro-batch is being
written and restarted leaves every message exactly once; replay reproduces the bodies;
bad arguments fail before Spark starts. (SIGTERM on the started line: tests/unit/test_ingest_sigterm.py.)
"""
from __future__ import annotations

import datetime
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from pocketmq.client import Message, sync
from pocketmq.jobs.ingest import backlog, offsets_summary, progress_line, queue_offsets
from pocketmq.jobs._common import describe_failure
from pocketmq.protocol.bodies import MessageQueue
from tests.spark.conftest import uniq
from tests.spark.support import create_topic
from tests.support import spark_jvm

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUEUES = [("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)]
JOB_TIMEOUT_S = 240
BATCH_LINE = re.compile(r"^batch (\d+): (\d+) rows, ")


# --------------------------------------------------------------------------- helpers

def _env() -> dict:
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYTHONUNBUFFERED"] = "1"
    return spark_jvm.job_env(env)


def _start(module: str, args: list[str], log_path: str) -> subprocess.Popen:
    """The job as `python -m jobs.<module>` from the checkout's root, output to a file, in
    its own session (process group) so os.killpg reaches the JVM it starts."""
    log = open(log_path, "w")
    try:
        return subprocess.Popen([sys.executable, "-m", f"jobs.{module}", *args], cwd=ROOT, env=_env(),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


def _run(module: str, args: list[str], log_path: str) -> tuple[int, str]:
    proc = _start(module, args, log_path)
    try:
        rc = proc.wait(JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"jobs.{module} did not finish in {JOB_TIMEOUT_S}s:\n{_read(log_path)[-4000:]}")
    return rc, _read(log_path)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _message(topic: str, i: int) -> Message:
    return Message(topic, f"m{i:05d}-".encode() + bytes([i % 256]) * (i % 7), tags=f"T{i % 3}",
                   keys=(f"k{i}", f"g{i % 4}"), properties={"n": str(i), "even": str(i % 2 == 0).lower()})


def _send(cluster, topic: str, lo: int, hi: int) -> dict[int, Message]:
    """Messages lo..hi-1 spread over QUEUES round robin (send_batch per queue)."""
    msgs = {i: _message(topic, i) for i in range(lo, hi)}
    with sync.Producer(f"jobs_pg_{os.getpid()}", cluster.namesrv_addr) as p:
        for qi, (broker, qid) in enumerate(QUEUES):
            mine = [msgs[i] for i in range(lo, hi) if i % len(QUEUES) == qi]
            for k in range(0, len(mine), 100):
                p.send_batch(mine[k:k + 100], queue=MessageQueue(topic, broker, qid))
    return msgs


def _topic(cluster, name: str) -> str:
    t = uniq(name)
    create_topic(cluster, t, ["broker-a", "broker-b"], 2)
    return t


def _ingest_args(cluster, topic: str, out: str, ckpt: str, *extra: str) -> list[str]:
    return ["--namesrv", cluster.namesrv_addr, "--subscribe", topic, "--output", out, "--checkpoint", ckpt,
            *extra]


def _dataset(spark, path: str):
    # spark.read.parquet lists a streaming sink's files from its _spark_metadata log
    return spark.read.parquet(path)


def _batches(log: str) -> list[tuple[int, int]]:
    return [(int(m.group(1)), int(m.group(2))) for m in map(BATCH_LINE.match, log.splitlines()) if m]


def _identity(row) -> tuple:
    return (row.topic, row.broker_name, row.queue_id, row.queue_offset)


def _assert_exactly_once(rows, msgs: dict[int, Message]) -> None:
    ids = [_identity(r) for r in rows]
    assert len(ids) == len(set(ids)), "a message is in the dataset twice"
    assert len(rows) == len(msgs)
    assert sorted(r.body for r in rows) == sorted(m.body for m in msgs.values())


def _committed_files(out: str) -> set[str]:
    """Part files listed in the sink's log (each _spark_metadata entry: a version line, then
    one JSON line per file)."""
    names = set()
    for entry in glob.glob(os.path.join(out, "_spark_metadata", "*")):
        if os.path.basename(entry).startswith("."):
            continue
        with open(entry, encoding="utf-8") as f:
            for line in f.read().splitlines()[1:]:
                if line.strip():
                    names.add(os.path.basename(json.loads(line)["path"]))
    return names


def _part_files(out: str) -> set[str]:
    return {os.path.basename(p) for p in glob.glob(os.path.join(out, "dt=*", "part-*.parquet"))}


# --------------------------------------------------------------------------- pure parts

def test_progress_line_offsets_and_backlog():
    end = json.dumps({"T": {"broker-a:0": 5, "broker-b:1": 7}})
    latest = json.dumps({"T": {"broker-a:0": 9, "broker-b:1": 7, "broker-b:2": 3}})
    assert queue_offsets(end) == {("T", "broker-a", 0): 5, ("T", "broker-b", 1): 7}
    assert backlog(queue_offsets(end), queue_offsets(latest)) == 4 + 0 + 3
    assert progress_line(3, 12, 250.4, end, latest) == \
        "batch 3: 12 rows, 250 rows/s, end T[broker-a:0=5 broker-b:1=7], backlog 7"
    assert progress_line(0, 0, 0.0, None, None) == "batch 0: 0 rows, 0 rows/s, end offsets n/a, backlog n/a"
    assert offsets_summary({("A", "b", 0): 1, ("B", "b", 0): 2, ("A", "b", 1): 3}) == "end A[b:0=1 b:1=3] B[b:0=2]"
    many = {("T", "b", i): i for i in range(10)}
    assert offsets_summary(many) == "end offsets of 10 queues (sum 45)"
    assert queue_offsets("not json") is None and queue_offsets('{"T": "x"}') is None


def test_describe_failure_keeps_the_python_reason():
    text = ("[STREAM_FAILED] Query [id = 1] terminated with exception: boom\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
            "pocketmq.spark.plan.DataLossError: topic T broker b queue 0: offsets 0..5 were deleted\n"
            "\n\nJVM stacktrace:\n" + "\tat org.Foo\n" * 300)
    assert describe_failure(RuntimeError(text)) == (
        "[STREAM_FAILED] Query [id = 1] terminated with exception: boom\n"
        "  caused by pocketmq.spark.plan.DataLossError: topic T broker b queue 0: offsets 0..5 were deleted")
    long = describe_failure(RuntimeError("\n".join(f"line {i}" for i in range(100))))
    assert long.splitlines()[-1] == "  ... (88 more lines)" and len(long.splitlines()) == 13


def test_the_session_and_the_jobs_start_their_jvms_with_the_tests_options(spark):
    # the session's JVM got them from the builder (spark-submit starts the driver with them)...
    args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                .getInputArguments())
    assert spark_jvm.JVM_OPTIONS in args, args
    # ...and a job's launch carries the same (pyspark splits PYSPARK_SUBMIT_ARGS with shlex)
    assert shlex.split(_env()["PYSPARK_SUBMIT_ARGS"]) == \
        ["--driver-java-options", spark_jvm.JVM_OPTIONS, "pyspark-shell"]


# --------------------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("run_as, args, error", [
    (["-m", "jobs.ingest"], ["--namesrv", "nohost", "--subscribe", "T", "--output", "o", "--checkpoint", "c"],
     "argument --namesrv: must be host:port"),
    (["-m", "pocketmq.jobs.ingest"], ["--namesrv", "h:1", "--subscribe", "T", "--subscribe-pattern", "T.*",
                                      "--output", "o", "--checkpoint", "c"],
     "argument --subscribe-pattern: not allowed with argument --subscribe"),
    (["jobs/ingest.py"], ["--namesrv", "h:1", "--subscribe-pattern", "(", "--output", "o", "--checkpoint", "c"],
     "--subscribe-pattern is not a valid regex"),
    (["-m", "jobs.ingest"], ["--namesrv", "h:1", "--subscribe", "T", "--output", "o", "--checkpoint", "o/ck"],
     "--output and --checkpoint must be separate directories"),
    (["-m", "jobs.ingest"], ["--namesrv", "h:1", "--subscribe", "T", "--output", "o", "--checkpoint", "c",
                             "--available-now", "--trigger-interval", "5"],
     "argument --trigger-interval: not allowed with argument --available-now"),
    (["-m", "jobs.ingest"], ["--namesrv", "h:1", "--subscribe", "T", "--output", "o", "--checkpoint", "c",
                             "--max-offsets-per-trigger", "0"],
     "argument --max-offsets-per-trigger: must be a positive integer, got 0"),
    (["-m", "jobs.ingest"], ["--namesrv", "h:1", "--output", "o", "--checkpoint", "c"],
     "one of the arguments --subscribe --subscribe-pattern is required"),
    (["-m", "jobs.replay"], ["--namesrv", "h:1", "--input", "no-such-dir", "--topic", "T"],
     "--input no-such-dir is not a directory"),
    (["jobs/replay.py"], ["--namesrv", "h:1", "--input", "."], "the following arguments are required: --topic"),
])
def test_bad_arguments_fail_before_spark_starts(tmp_path, run_as, args, error):
    # the three ways to run a job; cwd is the checkout's root (relative paths resolve under tmp_path
    # for the ones checked on disk, through absolute paths below)
    args = [str(tmp_path / a) if a in ("o", "c", "o/ck", "no-such-dir") else a for a in args]
    error = error.replace("no-such-dir", str(tmp_path / "no-such-dir"))
    started = time.monotonic()
    r = subprocess.run([sys.executable, *run_as, *args], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert error in r.stderr and "usage:" in r.stderr
    assert "Traceback" not in r.stderr and "SparkSession" not in r.stderr
    assert not os.path.exists(tmp_path / "o") and not os.path.exists(tmp_path / "c")
    assert time.monotonic() - started < 30      # no JVM was started (it alone takes ~6 s)


# --------------------------------------------------------------------------- ingest

def test_a_failed_query_exits_1_with_its_reason(tmp_path):
    # no nameserver on that port: the source's first planning call fails in the driver
    rc, log = _run("ingest", ["--namesrv", "127.0.0.1:1", "--subscribe", "T", "--output", str(tmp_path / "o"),
                              "--checkpoint", str(tmp_path / "c"), "--available-now"], str(tmp_path / "ingest.log"))
    assert rc == 1, log[-4000:]
    failed = [ln for ln in log.splitlines() if ln.startswith("ingest failed: ")]
    assert len(failed) == 1, log[-4000:]
    reason = log[log.index(failed[0]):].splitlines()
    assert "caused by pocketmq.client.errors.RemotingFailure: no nameserver answered (127.0.0.1:1)" in reason[1]
    # the reason, not Spark's stacks: no JVM frame and no Python frame anywhere in the output
    assert not re.search(r"^\s+at (org|java|scala)\.", log, re.M) and 'File "' not in log, log[-4000:]
    assert "ingest: no batch ran" in log


@pytest.fixture(scope="module")
def ingested(cluster, tmp_path_factory):
    """An availableNow ingest of 480 messages over 4 queues on 2 brokers, capped at 150
    messages per micro-batch."""
    d = tmp_path_factory.mktemp("jobs-ingest")
    topic = _topic(cluster, "JobsIngest")
    msgs = _send(cluster, topic, 0, 480)
    out, ckpt = str(d / "out"), str(d / "ckpt")
    rc, log = _run("ingest", _ingest_args(cluster, topic, out, ckpt, "--available-now",
                                          "--max-offsets-per-trigger", "150"), str(d / "ingest.log"))
    assert rc == 0, log[-4000:]
    return topic, msgs, out, ckpt, log


def test_available_now_ingest_lands_every_message_once(spark, cluster, ingested):
    topic, msgs, out, _, log = ingested
    batches = _batches(log)
    # capped batches: at least ceil(480 / 150) of them, none above the cap, every row counted once
    assert len(batches) >= 4 and all(rows <= 150 for _, rows in batches), log
    assert sum(rows for _, rows in batches) == 480, log
    assert "backlog 0" in [ln for ln in log.splitlines() if BATCH_LINE.match(ln)][-1]
    assert re.search(r"^ingest: \d+ batches .*, 480 rows in ", log, re.M), log

    ds = _dataset(spark, out)
    rows = ds.collect()
    _assert_exactly_once(rows, msgs)
    for r in rows:
        assert r.dt == r.store_timestamp.astimezone(datetime.timezone.utc).date()
    # the files sit under dt=YYYY-MM-DD directories
    assert {os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(out, "dt=*", "*.parquet"))} == \
        {f"dt={d}" for d in {r.dt.isoformat() for r in rows}}

    # every column of the source's schema, equal to a batch read of the same topic
    batch = spark.read.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr) \
        .option("subscribe", topic).load()
    assert ds.drop("dt").columns == batch.columns
    want = sorted((r.asDict() for r in batch.collect()), key=lambda d: _identity_d(d))
    got = sorted((r.asDict() for r in ds.drop("dt").collect()), key=lambda d: _identity_d(d))
    assert got == want


def _identity_d(d: dict) -> tuple:
    return (d["topic"], d["broker_name"], d["queue_id"], d["queue_offset"])


def test_sigkill_in_a_micro_batch_then_restart_is_exactly_once(spark, cluster, tmp_path):
    topic = _topic(cluster, "JobsKill")
    msgs = _send(cluster, topic, 0, 4000)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    log_path = str(tmp_path / "ingest-1.log")
    proc = _start("ingest", _ingest_args(cluster, topic, out, ckpt, "--max-offsets-per-trigger", "400",
                                         "--trigger-interval", "0.5"), log_path)
    # wait for a micro-batch caught mid-write: its offsets are logged in the checkpoint, no
    # commit for it yet, and part files on disk that the sink's log does not list
    deadline = time.monotonic() + JOB_TIMEOUT_S
    orphans: set[str] = set()
    in_flight = None
    try:
        while True:
            assert proc.poll() is None, f"the job ended on its own:\n{_read(log_path)[-4000:]}"
            assert time.monotonic() < deadline, f"never caught a batch mid-write:\n{_read(log_path)[-4000:]}"
            logged = {int(n) for n in os.listdir(os.path.join(ckpt, "offsets")) if n.isdigit()} \
                if os.path.isdir(os.path.join(ckpt, "offsets")) else set()
            committed = {int(n) for n in os.listdir(os.path.join(ckpt, "commits")) if n.isdigit()} \
                if os.path.isdir(os.path.join(ckpt, "commits")) else set()
            running = logged - committed
            # after some committed batches (the restart then resumes mid-stream), a batch whose
            # part files are on disk but not in the sink's log
            if running and committed and _part_files(out) - _committed_files(out):
                in_flight = max(running)
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.02)      # the poll's interval; the condition above is the synchronisation
    finally:
        if proc.poll() is None and in_flight is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL
    first = _read(log_path)
    # files of the killed attempt that no committed batch lists
    orphans = _part_files(out) - _committed_files(out)
    assert orphans, first[-4000:]
    before = _dataset(spark, out).count()
    assert 0 < before < 4000 and before >= sum(rows for _, rows in _batches(first))

    rc, log = _run("ingest", _ingest_args(cluster, topic, out, ckpt, "--available-now",
                                          "--max-offsets-per-trigger", "1000"), str(tmp_path / "ingest-2.log"))
    assert rc == 0, log[-4000:]
    # the restart ran the killed batch again (same id, same offsets from the checkpoint) and the rest
    assert _batches(log)[0][0] == in_flight, log
    rows = _dataset(spark, out).collect()
    _assert_exactly_once(rows, msgs)
    by_identity = {(r.broker_name, r.queue_id, r.queue_offset): r for r in rows}
    assert len(by_identity) == 4000
    # the killed attempt's files are still on disk, in no log entry, and read by no one
    assert orphans <= _part_files(out) and not orphans & _committed_files(out)


# --------------------------------------------------------------------------- replay

def test_replay_reproduces_the_ingested_messages(spark, cluster, ingested, tmp_path):
    _, msgs, out, _, _ = ingested
    target = _topic(cluster, "JobsReplay")
    rc, log = _run("replay", ["--namesrv", cluster.namesrv_addr, "--input", out, "--topic", target,
                              "--batch-size", "64"], str(tmp_path / "replay.log"))
    assert rc == 0, log[-4000:]
    assert f"replay: 480 rows from {out} -> topic {target}" in log
    assert f"replay: wrote 480 rows into topic {target}" in log
    got = spark.read.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr) \
        .option("subscribe", target).load().collect()

    def key(body, tags, keys, props):
        return (body, tags, keys, tuple(sorted(props.items())))
    assert sorted(key(r.body, r.tags, r.keys, r.properties) for r in got) == \
        sorted(key(m.body, m.tags, " ".join(m.keys), m.properties) for m in msgs.values())


def test_replay_where_filters(spark, cluster, ingested, tmp_path):
    _, msgs, out, _, _ = ingested
    target = _topic(cluster, "JobsReplayW")
    rc, log = _run("replay", ["--namesrv", cluster.namesrv_addr, "--input", out, "--topic", target,
                              "--where", "tags = 'T1' AND properties['even'] = 'true'"],
                   str(tmp_path / "replay.log"))
    assert rc == 0, log[-4000:]
    want = sorted(m.body for i, m in msgs.items() if i % 3 == 1 and i % 2 == 0)
    got = spark.read.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr) \
        .option("subscribe", target).load().collect()
    assert sorted(r.body for r in got) == want and len(want) == 80
    # a bad condition is a bad argument, named
    rc, log = _run("replay", ["--namesrv", cluster.namesrv_addr, "--input", out, "--topic", target,
                              "--where", "no_such_column = 1"], str(tmp_path / "replay-bad.log"))
    assert rc == 2 and "bad --where" in log and "no_such_column" in log and "JVM stacktrace" not in log
