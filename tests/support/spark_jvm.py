"""The JVM options of the tests' Spark JVMs: the Spark tier's session and every job the
tests start (`python -m jobs.ingest`, `jobs.replay`). One place, so the two stay the same.

Why C1 only (`-XX:TieredStopAtLevel=1`): the tests' queries read tens to thousands of rows
and their jobs live for seconds, so the JVM never earns back what its C2 compiler spends;
C2's compile threads were most of the tier's CPU. tests/spark/test_jobs.py alone, two
alternating pairs on this 2-core machine (2026-11-29): 300 / 281 s of machine CPU and 197 /
184 s wall with the JVM's default, against 193 / 195 s and 155 / 157 s with C1 only
(docs/testing.md). Tests only: the jobs and bench/bench_spark keep the default, since a
long ingest or a benchmark is where C2's code pays.
"""
from __future__ import annotations

import shlex

JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def session_config() -> dict[str, str]:
    """SparkSession.builder settings for a session started by the test process itself
    (pyspark passes them to spark-submit, which starts the driver's JVM with them)."""
    return {"spark.driver.extraJavaOptions": JVM_OPTIONS}


def job_env(env: dict) -> dict:
    """`env` with PYSPARK_SUBMIT_ARGS set for a job started as a subprocess (its builder
    takes its own settings; the driver's JVM options can only come from the launch)."""
    env["PYSPARK_SUBMIT_ARGS"] = f"--driver-java-options {shlex.quote(JVM_OPTIONS)} pyspark-shell"
    return env
