"""The broker logs its store recovery once at start, as one readable line: INFO after a
clean shutdown, WARNING after a crash (abort file found) naming what recovery did (issue 12,
newcomer polish; issue 11 item 7: the recovery time)."""
from __future__ import annotations

import re

import pytest

from pocketmq.client import Message, Producer
from tests.integration.test_client_cluster import create_topic
from tests.support.daemons import Cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

LINE = re.compile(r"^\S+ \S+ (\w+)\s+pocketmq\.broker - (store recovery: .*)$", re.M)


def recovery_lines(cluster: Cluster) -> list[tuple[str, str]]:
    return LINE.findall(cluster.broker.log_text())


async def test_recovery_report_is_one_line_warning_after_a_crash_info_after_a_clean_stop(tmp_path):
    cluster = Cluster(str(tmp_path)).start()
    try:
        [(level, line)] = recovery_lines(cluster)           # a new store: clean, nothing found
        assert level == "INFO" and line.startswith("store recovery: clean shutdown")
        await create_topic(cluster, "RecLogT", 2)
        async with Producer("RecLogP", cluster.namesrv_addr, instance_name="reclog") as p:
            for i in range(20):
                assert (await p.send(Message("RecLogT", b"m%d" % i))).ok

        cluster.restart_broker(kill=True)                    # SIGKILL: the abort file stays
        [(level, line)] = recovery_lines(cluster)
        assert level == "WARNING", line
        m = re.match(r"store recovery: abnormal shutdown \(abort file found\), recovered in (\d+) ms, "
                     r"commit log \[0, (\d+)\), (\d+) records scanned from (\d+), 0 bytes truncated, "
                     r"consume queues: (\d+) loaded, 0 truncated \(0 units dropped\), (\d+) re-dispatched "
                     r"\((\d+) units from (\d+)\)$", line)
        assert m, line
        assert int(m.group(2)) > 0 and int(m.group(5)) >= 2
        assert "store opened" not in cluster.broker.log_text()   # the old raw-object line is gone

        cluster.restart_broker(kill=False)                   # SIGTERM: a clean shutdown
        [(level, line)] = recovery_lines(cluster)
        assert level == "INFO" and line.startswith("store recovery: clean shutdown, recovered in "), line
        assert " 0 records scanned" in line
    finally:
        cluster.stop()
