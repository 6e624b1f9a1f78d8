"""The console's cluster page with a master/slave pair (issue 34: "replication lag where
replicas exist"): both members listed with their roles, the master's per-slave bytes behind
and the slave's bytes/ms behind its master, as the brokers' runtime info reports them."""
from __future__ import annotations

import asyncio
import re

import pytest

pytest.importorskip("starlette")

from pocketmq.console.data import Cluster  # noqa: E402
from tests.support.replica_pair import LocalPair  # noqa: E402

pytestmark = pytest.mark.asyncio


async def test_cluster_page_shows_both_members_and_their_replication(tmp_path):
    async with asyncio.timeout(60), LocalPair(tmp_path) as pair:
        await pair.caught_up()
        console = Cluster(pair.namesrv_addr, cache_ttl_ms=0)
        try:
            rows = []
            # the slave registers within registerNameServerPeriod (1 s) and knows its lag from
            # the master's first frame (a heartbeat within haSendHeartbeatInterval, 5 s)
            deadline = asyncio.get_running_loop().time() + 20
            while asyncio.get_running_loop().time() < deadline:
                rows = (await console.cluster_page())["rows"]
                if len(rows) == 2 and all(r.get("replication") and "not known" not in r["replication"]
                                          for r in rows):
                    break
                console.invalidate()
                await asyncio.sleep(0.05)
            by_id = {r["id"]: r for r in rows}
            assert set(by_id) == {0, 1}, rows
            assert by_id[0]["role"] == "ASYNC_MASTER" and by_id[1]["role"] == "SLAVE", rows
            # the master names its slave and how far behind it is; the slave, its master
            assert by_id[0]["replication"].startswith("slave ") and " B behind" in by_id[0]["replication"], rows
            master_ha = f"127.0.0.1:{pair.ports['m'][1]}"
            assert re.fullmatch(rf"\d+ B / \d+ ms behind {re.escape(master_ha)}", by_id[1]["replication"]), rows
        finally:
            await console.close()
