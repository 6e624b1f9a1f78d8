"""jobs/ingest.py stops on SIGTERM as on Ctrl-C (exit 130, "ingest: stopping", the summary),
even when the signal comes the moment its started line is printed: a supervisor that stops
the job on reading that line. The job runs in a subprocess (a SIGTERM before the handler
kills the process) with Spark and the query replaced by stand-ins, so no JVM is started; the
signal is sent from within the print of the started line, leaving no window for a late
handler."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_JOB = """
import sys, time
import pocketmq.jobs.ingest as ingest
from tests.support.ready_signal import signal_on_print

class Streams:
    def __init__(self):
        self.listeners = []
    def addListener(self, listener):
        self.listeners.append(listener)

class Spark:
    def __init__(self):
        self.streams = Streams()
    def stop(self):
        print("stand-in: spark stopped", flush=True)

class Query:
    id = "q-stand-in"
    def __init__(self, spark):
        self.spark = spark
    def awaitTermination(self, timeout):
        time.sleep(timeout)
        return False
    def stop(self):
        print("stand-in: query stopped", flush=True)
        for listener in self.spark.streams.listeners:     # as Spark's listener bus does
            listener.onQueryTerminated(None)

ingest.start_spark = lambda job, master: Spark()
ingest.start_query = lambda spark, args: Query(spark)
signal_on_print(ingest, ("ingest: query ",))
sys.exit(ingest.main(sys.argv[1:]))
"""


def test_sigterm_on_the_started_line_stops_the_query_like_ctrl_c(tmp_path):
    args = ["--namesrv", "127.0.0.1:9876", "--subscribe", "T", "--output", str(tmp_path / "out"),
            "--checkpoint", str(tmp_path / "ckpt")]
    proc = subprocess.run([sys.executable, "-c", _JOB, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 130, out
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("ingest: query q-stand-in reading T from 127.0.0.1:9876"), out
    assert lines[1:] == ["ingest: stopping (the checkpoint keeps the progress of committed batches)",
                         "stand-in: query stopped",
                         lines[3], "stand-in: spark stopped"], out
    assert lines[3].startswith("ingest: no batch ran in ") and lines[3].endswith(f"; output {tmp_path / 'out'}"), out
