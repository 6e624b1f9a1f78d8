"""bench/bench_client.py's phases against the in-process fake cluster (real TCP on
127.0.0.1): `floor` (requests of an unserved code are answered REQUEST_CODE_NOT_SUPPORTED
with no handler's work, alternated with as many sync sends, each row counted),
`inflight`'s group size (`--coalesce-max`) and `layers` (a sync send through each layer
of the client, from a prebuilt frame on a minimal protocol to Producer.send); and
bench/bench_reads.py's in-process read costs."""
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


async def test_layers_phase_sends_through_every_layer():
    """`--phases layers`: every row's sends reach the broker (the minimal protocol's frames
    included) and each row is counted."""
    async with asyncio.timeout(60):
        async with FakeCluster() as cluster:
            cluster.create_topic("Layers", 1)
            out = await bench_client.bench_send_layers(cluster.namesrv_addr, "Layers", 0.05, 2,
                                                       broker_pid=os.getpid())
            assert list(out) == ["frame", "codec", "conn", "api", "producer"]
            for rows in out.values():
                assert len(rows) == 2
                for row in rows:
                    assert row["sends"] >= 100 and row["per_s"] > 0
                    assert row["client_cpu_us"] >= 0 and row["broker_cpu_us"] >= 0
            stored = sum(len(recs) for (t, _), recs in cluster.brokers[0].queues.items() if t == "Layers")
            measured = sum(row["sends"] for rows in out.values() for row in rows)
            # the warm-up send, send_layer_fns' own two (its first, the prebuilt frame's
            # check), 200 warm-up calls a layer, the rows
            assert stored == 1 + 2 + 5 * 200 + measured


async def test_layer_fns_return_the_send_results():
    """The `codec` layer decodes the broker's reply into the SendResult the producer would
    give: same queue, the next queue offset."""
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("LayerFns", 1)
            async with bench_client.Producer("LayerFnsG", cluster.namesrv_addr) as p:
                loop = asyncio.get_running_loop()
                r0 = await p.send(bench_client.Message("LayerFns", b"a"))
                host, port = p.instance.brokers.master(r0.queue.broker_name).rsplit(":", 1)
                _, raw = await loop.create_connection(bench_client._RawClient, host, int(port))
                try:
                    fns = await bench_client.send_layer_fns(p, raw.request, "LayerFns", b"b" * 10)
                    results = [await fns[k]() for k in ("codec", "conn", "api", "producer")]
                finally:
                    raw.transport.close()
            offsets = [r.queue_offset for r in results]
            # (after r0: send_layer_fns' first send and its check of the prebuilt frame)
            assert offsets == list(range(r0.queue_offset + 3, r0.queue_offset + 7))
            assert all(r.queue == r0.queue and r.status.name == "SEND_OK" for r in results)


async def test_raw_client_splits_frames_and_fails_waiters_on_loss():
    """The layers phase's minimal protocol: replies in order across split and joined reads;
    waiters still open when the connection goes fail instead of hanging."""
    class T:
        def write(self, data):
            pass
    c = bench_client._RawClient()
    c.transport, c.loop = T(), asyncio.get_running_loop()
    futs = [c.request(b"") for _ in range(4)]
    frame = lambda payload: len(payload).to_bytes(4, "big") + payload    # noqa: E731
    data = frame(b"one") + frame(b"two") + frame(b"three")
    c.data_received(data[:5])                   # part of the first frame
    assert not futs[0].done()
    c.data_received(data[5:])                   # the rest and two more frames
    assert [f.result() for f in futs[:3]] == [b"one", b"two", b"three"]
    c.connection_lost(None)
    assert isinstance(futs[3].exception(), ConnectionError)


def test_bench_reads_times_handled_reads():
    """bench/bench_reads.py: both reads are timed doing their work (it checks that every
    request was handled and the reply matched, and raises otherwise)."""
    from bench import bench_reads
    out = bench_reads.read_costs(200, 2)
    assert sorted(out) == ["client_reply_us", "server_request_us"] and all(v > 0 for v in out.values())
