"""bench/bench_client.py's `apis` phase against the in-process fake cluster (real TCP on
127.0.0.1): every row sends and is counted, the per-round ratios are the rows' own, and
the py-store floor (the harness's pyserver.py, when this checkout sits next to it) is
started, answered and stopped."""
import asyncio
import os
import shutil
import tempfile

import pytest

from bench import bench_client
from tests.support.fake_broker import FakeCluster


async def _pairs(floor_port=None):
    async with asyncio.timeout(60):
        async with FakeCluster() as cluster:
            cluster.create_topic("Apis", 1)
            out = await bench_client.bench_api_pairs(cluster.namesrv_addr, "Apis", 0.1, 2, batch=8, inflight=4,
                                                     floor_port=floor_port)
            stored = sum(len(recs) for (t, _), recs in cluster.brokers[0].queues.items() if t == "Apis")
    return out, stored


async def test_apis_rows_send_and_ratios_are_their_own():
    out, stored = await _pairs()
    rows = out["rows"]
    assert sorted(rows) == ["batch_bodies", "batch_messages", "batch_prebuilt", "inflight_message"]
    assert all(len(r) == 2 and r[0]["msgs"] > 0 and r[0]["client_cpu_us_per_msg"] >= 0 for r in rows.values())
    # warm-up and measured rows all stored (the first send too)
    assert stored >= 1 + sum(x["msgs"] for r in rows.values() for x in r)
    assert out["messages_vs_bodies"] == [a["msgs_per_s"] / b["msgs_per_s"]
                                         for a, b in zip(rows["batch_messages"], rows["batch_bodies"])]
    assert "inflight_vs_floor" not in out


@pytest.mark.skipif(not os.path.exists(bench_client.PYSERVER),
                    reason="the harness's pyserver.py is not beside this checkout")
async def test_apis_floor_row_against_the_py_store_server():
    root = tempfile.mkdtemp(prefix="apis-floor-")
    proc, port = bench_client.start_pyserver_store(root)
    try:
        out, _ = await _pairs(port)
    finally:
        proc.stdin.close()
        proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    assert len(out["rows"]["floor_window"]) == 2 and out["rows"]["floor_window"][0]["msgs"] > 0
    assert len(out["inflight_vs_floor"]) == 2 and proc.returncode is not None
