"""What the jobs share: their SparkSession, argument checks that need no Spark, and turning
a failed Spark call into one readable reason.

Nothing here (or in the job modules) is shipped to executors: the jobs use SQL expressions
and the pocketmq source only, never Python UDFs, so executors need `pocketmq` installed but
never the `jobs` package (which a spark-submit script run could not import there).
"""
from __future__ import annotations

import argparse
import os
import sys

TRACEBACK_HEAD = "Traceback (most recent call last):"
MAX_REASON_LINES = 12


def under_spark_submit() -> bool:
    """True when spark-submit started this driver (its JVM is already up and handed its
    gateway to Python): then spark-submit's --master applies unless --master is given."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def start_spark(job: str, master: str | None):
    """The job's session, or None after printing why Spark could not start (a bad --master,
    no Java)."""
    try:
        return spark_session(f"pocketmq-{job}", master)
    except Exception as e:
        print(f"{job} failed: cannot start Spark: {describe_failure(e)}", file=sys.stderr, flush=True)
        return None


def spark_session(app_name: str, master: str | None):
    """The job's session: `master` (default local[*], or spark-submit's), UTC session time
    zone (the dt partition is a UTC date), no console progress bar (the jobs print their own
    progress), and the pocketmq source registered (the discovery shim is not visible to
    every install; registering again is harmless)."""
    # Executors (and the driver-side planner workers) run the pocketmq reader and writer in
    # Python processes started from PYSPARK_PYTHON, `python3` on the PATH when unset: often
    # another interpreter than this one (a venv) that has no pocketmq. This interpreter has
    # it. On a cluster the workers' interpreter is set by the operator (README).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pocketmq.spark import PocketMQDataSource

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif not under_spark_submit():
        builder = builder.master("local[*]")
    spark = (builder.config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.pyspark.jvmStacktrace.enabled", "false")
             .getOrCreate())
    if not _source_known(spark):
        spark.dataSource.register(PocketMQDataSource)
    _quiet_query_termination(spark)
    return spark


# logs a failed query's error with its whole JVM stack; the jobs print its reason instead
QUERY_TERMINATION_LOGGER = "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution"


def _quiet_query_termination(spark) -> None:
    try:
        jvm = spark.sparkContext._jvm
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            QUERY_TERMINATION_LOGGER, jvm.org.apache.logging.log4j.Level.FATAL)
    except Exception:       # another logging backend: the stack stays in the log, nothing else changes
        pass


def _source_known(spark) -> bool:
    """Whether Spark already found `pocketmq` through the shim (registering over a found
    source works but logs a warning per session). Asks the JVM's data source manager; any
    failure (another Spark version) means register."""
    try:
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("pocketmq"))
    except Exception:
        return False


def describe_failure(exc: BaseException) -> str:
    """A failed query or action as a short reason: the first line of Spark's message, and
    when the failure came from Python code (the pocketmq reader or writer, on an executor or
    in the driver's data source worker), the exception Python raised there: the last line
    of its traceback, not the traceback."""
    text = str(exc).strip() or type(exc).__name__
    text = text.split("\n\nJVM stacktrace:", 1)[0]
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    py_errors = []
    in_traceback = False
    for ln in lines:
        if ln.endswith(TRACEBACK_HEAD):
            in_traceback = True
        elif in_traceback and not ln[:1].isspace():
            # the first unindented line after the frames: "pkg.SomeError: message"
            py_errors.append(ln)
            in_traceback = False
    head = lines[0]
    if py_errors:
        reason = py_errors[-1]
        return head if reason in head else f"{head.removesuffix(TRACEBACK_HEAD).rstrip()}\n  caused by {reason}"
    kept = lines[:MAX_REASON_LINES]
    if len(lines) > len(kept):
        kept.append(f"  ... ({len(lines) - len(kept)} more lines)")
    return "\n".join(kept)


def prog_name(job: str) -> str:
    """How this job was started, for usage lines: `python -m jobs.ingest`, `python -m
    pocketmq.jobs.ingest` or the script's path (spark-submit, python jobs/ingest.py)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.endswith(f"jobs.{job}"):
        return f"python -m {spec.name}"
    if sys.argv and sys.argv[0].endswith(f"{job}.py"):
        return sys.argv[0]
    return f"python -m pocketmq.jobs.{job}"


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return v


def namesrv_addr(text: str) -> str:
    """`host:port[;host:port]`, checked here so a typo fails before a JVM starts."""
    parts = [p.strip() for p in text.split(";")]
    for p in parts:
        host, sep, port = p.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise argparse.ArgumentTypeError(f"must be host:port[;host:port], got {text!r}")
    return ";".join(parts)


def is_local_path(path: str) -> bool:
    """A plain filesystem path (no scheme such as hdfs:// or s3a://, which only Spark can check)."""
    return "://" not in path and not path.startswith("file:")
