"""bench/bench_client.py's phases against the in-process fake cluster (real TCP on
127.0.0.1): `floor` (requests of an unserved code are answered REQUEST_CODE_NOT_SUPPORTED
with no handler's work, alternated with as many sync sends, each row counted) and
`inflight`'s group size (`--coalesce-max`)."""
import asyncio
import os

from bench import bench_client
from tests.support.fake_broker import FakeCluster


async def test_floor_phase_times_unserved_requests_against_sync_sends():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("Floor", 1)
            # the fake broker runs in this process: its "broker CPU" is ours, enough to
            # exercise the accounting
            out = await bench_client.bench_request_floor(cluster.namesrv_addr, "Floor", 30, None,
                                                         broker_pid=os.getpid())
            assert sorted(out) == ["send", "unserved"]
            for rows in out.values():
                assert len(rows) == 2
                for row in rows:
                    assert row["per_s"] > 0 and row["client_cpu_us"] >= 0 and row["broker_cpu_us"] >= 0
            stored = sum(len(recs) for (t, _), recs in cluster.brokers[0].queues.items() if t == "Floor")
            assert stored == 200 + 2 * 30          # the warm-up and both send rows stored; unserved nothing


def test_proc_cpu_reads_this_process():
    assert bench_client._proc_cpu_s(None) is None
    t = bench_client._proc_cpu_s(os.getpid())
    assert t is not None and t > 0


async def test_inflight_phase_takes_the_group_size():
    """`--coalesce-max N` reaches the producer: no stored batch holds more than N sends."""
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("Inflight", 1)
            b = cluster.brokers[0]
            out = await bench_client.bench_inflight_send(cluster.namesrv_addr, "Inflight", 400, None,
                                                         coalesce_max=5)
            assert out["coalesce_max_messages"] == 5 and out["msgs_per_s"] > 0
            assert b.batch_sizes and max(b.batch_sizes) <= 5
            stored = sum(len(recs) for (t, _), recs in b.queues.items() if t == "Inflight")
            assert stored == 1 + 400
