"""Sync sends through the gRPC endpoint (the official RocketMQ 5.x Python client,
rocketmq-python-client 5.1.2, in its own venv: tests/support/rmq5.py) against our remoting
Producer's sync sends, one after the other against the same broker (issue 33's target: the
5.x producer at >= 0.5x ours). Both send `--count` messages of `--size` bytes, one at a
time, each waiting for its answer, from one thread, after a warm-up.

    python3 bench/bench_grpc_send.py                  # 5000 sends of 100 bytes each, 3 rounds
    python3 bench/bench_grpc_send.py --count 2000 --rounds 1
    python3 bench/bench_grpc_send.py --stub           # also: our generated stubs as a sync grpc
                                                      # client, Heartbeat (no work) and SendMessage

What a call costs without the broker's work (a no-op server, several server set-ups) and
the official client's own CPU per send: bench/bench_grpc_floor.py.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_broker import print_calibration, temp_cluster  # noqa: E402
from bench.bench_grpc_floor import stub_us  # noqa: E402
from pocketmq.client import Message, Producer  # noqa: E402
from tests.support.rmq5 import ensure_venv, proxy_cluster, run_driver  # noqa: E402


async def remoting_rate(namesrv: str, topic: str, count: int, size: int) -> float:
    async with Producer("bench_grpc_pg", namesrv) as p:
        m = Message(topic, b"x" * size)
        for _ in range(50):
            await p.send(m)
        t0 = time.perf_counter()
        for _ in range(count):
            await p.send(m)
        return count / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stub", action="store_true", help="also time our own stubs as the client")
    a = ap.parse_args()
    python = ensure_venv()
    with temp_cluster("bench-grpc", proxy_cluster) as c:
        print_calibration("before")
        for r in range(a.rounds):
            topic = f"BenchGrpc{os.getpid()}x{r}"
            [ev] = run_driver(python, c.grpc_endpoint, "bench", timeout_s=600, topic=topic, count=a.count,
                              size=a.size)
            ours = asyncio.run(remoting_rate(c.namesrv_addr, topic, a.count, a.size))
            print(f"round {r}: 5.x Python producer over gRPC {ev['per_s']:.0f} sends/s, "
                  f"pocketmq Producer over remoting {ours:.0f} sends/s, ratio {ev['per_s'] / ours:.2f}", flush=True)
            if a.stub:
                us = stub_us(c.grpc_endpoint, a.count, a.size, c.broker.proc.pid)
                print(f"round {r}: our stubs, sync grpc client: " + ", ".join(
                    f"{name} {w:.0f} us/call (broker CPU {s:.0f}, client CPU {cl:.0f})"
                    for name, (w, s, cl) in us.items()), flush=True)
        print_calibration("after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
