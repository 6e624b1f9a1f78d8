"""Other clients' latency while thousands of held pulls are taken in, expire, are woken
or dropped (issue 11, item 5; target: p99 under 50 ms).

Starts mqnamesrv + mqbroker as real processes (store in a temp dir). One connection
pipelines N long-poll PULLs on one empty queue; meanwhile another client sends one
SEND at a time (2 ms apart) and records each answer's latency:

    python bench/bench_held_pulls.py [--pulls 20000] [--suspend-ms 3000] [--connections 2000]

Phases (one line each: probes, p50/p99/max latency, broker CPU µs per held pull):
  expire   N pulls pipelined, suspend --suspend-ms, until all are answered (PULL_NOT_FOUND)
  wake     N pulls held (30 s), one SEND wakes them all, until all are answered (FOUND)
  close    --connections connections hold N pulls in all, all closed at once, until the
           broker holds none
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_broker import cpu_seconds  # noqa: E402
from tests.integration.test_broker import send_cmd  # noqa: E402
from tests.support.daemons import Cluster  # noqa: E402
from tests.support.raw_client import Prober, connect, pull_frame, until_held  # noqa: E402

TOPIC, PROBE_TOPIC = "BenchHeldT", "BenchProbeT"


async def phase(name: str, pid: int, pulls: int, prober: Prober, work) -> None:
    cpu0 = cpu_seconds(pid)
    t0 = time.perf_counter()
    task = asyncio.create_task(prober.run())
    try:
        await work()
    finally:
        prober.stop.set()
        await task
    wall = time.perf_counter() - t0
    cpu_us = (cpu_seconds(pid) - cpu0) * 1e6 / pulls
    print(f"phase={name} pulls={pulls} wall_s={wall:.2f} probes={len(prober.latencies)} "
          f"p50_ms={prober.quantile_ms(0.5):.1f} p99_ms={prober.quantile_ms(0.99):.1f} "
          f"max_ms={max(prober.latencies) * 1000:.1f} broker_cpu_us_per_pull={cpu_us:.1f}", flush=True)


async def run(addr: str, pid: int, n: int, suspend_ms: int, connections: int) -> None:
    admin = await connect(addr)
    for i, topic in enumerate((TOPIC, PROBE_TOPIC)):
        assert (await admin.call(send_cmd(topic, b"first"), i + 1)).code == 0

    # expire: taken in and expiring (the probes cover both)
    holder = await connect(addr)
    holder.want = n
    frames = b"".join(pull_frame(TOPIC, i, 1, suspend_ms) for i in range(1, n + 1))

    async def expire():
        holder.transport.write(frames)
        await asyncio.wait_for(holder.enough.wait(), 300)
    await phase("expire", pid, n, Prober(await connect(addr), PROBE_TOPIC), expire)
    holder.transport.close()

    # wake: held first (not measured), then one message wakes them all
    holder = await connect(addr)
    holder.want = n
    holder.transport.write(b"".join(pull_frame(TOPIC, i, 1, 30_000) for i in range(1, n + 1)))
    await until_held(admin, n, 300)

    async def wake():
        await asyncio.sleep(0.05)
        assert (await admin.call(send_cmd(TOPIC, b"wake"), 10)).code == 0
        await asyncio.wait_for(holder.enough.wait(), 300)
    await phase("wake", pid, n, Prober(await connect(addr), PROBE_TOPIC), wake)
    holder.transport.close()

    # close: many connections holding n pulls in all
    per = max(1, n // connections)
    conns = [await connect(addr) for _ in range(connections)]
    for c in conns:
        c.transport.write(b"".join(pull_frame(TOPIC, i, 2, 60_000) for i in range(1, per + 1)))
    await until_held(admin, per * connections, 300)

    async def close():
        await asyncio.sleep(0.05)
        for c in conns:
            c.transport.abort()
        await until_held(admin, 0, 300)
    await phase("close", pid, per * connections, Prober(await connect(addr), PROBE_TOPIC), close)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pulls", type=int, default=20_000)
    ap.add_argument("--suspend-ms", type=int, default=3000)
    ap.add_argument("--connections", type=int, default=2000)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-held-")
    cluster = Cluster(root, [f"--maxHeldPullsPerConnection={args.pulls}",
                             f"--maxHeldPulls={max(100_000, args.pulls)}"]).start()
    try:
        with open("/proc/loadavg") as f:
            print("loadavg", " ".join(f.read().split()[:3]), flush=True)
        asyncio.run(run(cluster.broker_addr, cluster.broker.proc.pid, args.pulls, args.suspend_ms,
                        args.connections))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
