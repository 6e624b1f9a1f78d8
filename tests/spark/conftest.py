"""The Spark tier: one local[2] SparkSession and one nameserver with three brokers for the
whole session (tests/support/daemons.py processes).

broker-a and broker-b carry the topics read back exactly; broker-lossy has tiny commit-log
and consume-queue segments and cleans expired files at every hour with no retention, so
its queues lose their heads within the housekeeping period (10 s) for the failOnDataLoss
tests. `format("pocketmq")` is found through the pyspark_pocketmq shim, no register call.
"""
from __future__ import annotations

import os
import sys
import time

import pytest

from tests.support.daemons import READY_BROKER, Cluster, Daemon, free_port
from tests.support import spark_jvm

pyspark = pytest.importorskip("pyspark")

ALL_HOURS = ";".join(f"{h:02d}" for h in range(24))


class SparkCluster(Cluster):
    """Cluster's nameserver and broker-a, plus broker-b and broker-lossy."""

    def __init__(self, root: str):
        super().__init__(root)
        self.b_port = free_port()
        self.lossy_port = free_port()
        self.broker_b = self._extra("broker-b", self.b_port, [])
        self.lossy = self._extra("broker-lossy", self.lossy_port, [
            "--mappedFileSizeCommitLog=4096", "--mappedFileSizeConsumeQueue=200",
            f"--deleteWhen={ALL_HOURS}", "--fileReservedTime=0"])

    def _extra(self, name: str, port: int, args: list[str]) -> Daemon:
        return Daemon("mqbroker", ["-n", self.namesrv_addr, f"--listenPort={port}", f"--haListenPort={free_port()}",
                                   "--brokerIP1=127.0.0.1",
                                   f"--brokerName={name}", f"--storePathRootDir={self.root}/{name}",
                                   "--mappedFileSizeCommitLog=67108864", *args],
                      READY_BROKER, os.path.join(self.root, f"{name}.log"))

    def addr(self, broker_name: str) -> str:
        port = {"broker-a": self.broker_port, "broker-b": self.b_port, "broker-lossy": self.lossy_port}[broker_name]
        return f"127.0.0.1:{port}"

    def start(self) -> "SparkCluster":
        super().start()
        try:
            self.broker_b.start()
            self.lossy.start()
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for d in (self.broker_b, self.lossy):
            try:
                d.stop()
            except Exception:
                d.kill()
        super().stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = SparkCluster(str(tmp_path_factory.mktemp("spark-cluster"))).start()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    s = (SparkSession.builder.master("local[2]").appName("pocketmq-tests")
         .config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.session.timeZone", "UTC")
         .config(map=spark_jvm.session_config())
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


def uniq(name: str) -> str:
    return f"{name}{os.getpid()}x{int(time.time() * 1000) % 1000000}"
