"""Timer messages: how late they fire under load (issue 33's target: 100,000 scheduled over
60 s fire with p99 lateness under 100 ms).

Starts mqnamesrv + mqbroker processes (tests/support/daemons.py). This process sends
`--count` timer messages (Producer.send with Message(deliver_at_ms=...)) paced evenly over
`--seconds`, each due a uniform `--delay-min-ms`..`--delay-max-ms` after it is sent, so
sends, parking and deliveries overlap. A consumer process (LitePullConsumer, every queue,
long polling) receives them and records, per message:

- *consumable lateness*: the delivered copy's STORETIMESTAMP - TIMER_OUT_MS (the broker's
  clock: when the message became consumable against when it was due);
- *received lateness*: the consumer's clock on receipt - TIMER_OUT_MS (one host, one clock:
  adds the held pull's wake-up, the transfer and the client's decode).

A negative value would be an early delivery (counted separately; must be 0). Prints
p50/p99/max of both, duplicates, the broker's CPU seconds, and the calibration
`loopback_echo_rtt_us` (the shared host's speed). Run:

    python3 bench/bench_timer.py                 # 100,000 over 60 s, due 1..20 s after sending
    python3 bench/bench_timer.py --count 20000 --seconds 20
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import shutil
import struct
import tempfile
import time

from bench.bench_replication import pct, proc_cpu_s
from pocketmq.client import LitePullConsumer, Message, Producer

TOPIC = "BenchTimer"


def consumer_main(namesrv: str, count: int, timeout_s: float, out_path: str, ready) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def run():
        consumable, received, seen, dup = [], [], set(), 0
        c = LitePullConsumer("BenchTimerC", namesrv, instance_name="bench-timer-c",
                             consume_from_where="FIRST_OFFSET", auto_commit=False)
        async with c:
            c.assign(await c.fetch_message_queues(TOPIC))
            ready.set()
            deadline = time.monotonic() + timeout_s
            while len(seen) < count and time.monotonic() < deadline:
                batch = await c.poll(timeout_s=1.0, max_records=256)
                now = time.time() * 1000
                for m in batch:
                    due = m.properties.get("TIMER_OUT_MS")
                    if due is None:
                        continue              # the message that created the topic
                    (i,) = struct.unpack_from(">q", m.body)
                    if i in seen:
                        dup += 1
                        continue
                    seen.add(i)
                    consumable.append(m.store_timestamp - int(due))
                    received.append(now - int(due))
        with open(out_path, "w") as f:
            json.dump({"consumable": consumable, "received": received, "duplicates": dup}, f)

    asyncio.run(run())


async def produce(namesrv: str, count: int, seconds: float, dmin: int, dmax: int) -> dict:
    rnd = random.Random(1)
    errors = 0
    async with Producer("BenchTimerP", namesrv, instance_name="bench-timer-p") as p:
        t0 = time.perf_counter()
        tick = 0.01
        per_tick = count * tick / seconds
        sent, owed = 0, 0.0
        lag_max = 0.0
        while sent < count:
            target = t0 + (sent / count) * seconds
            ahead = target - time.perf_counter()
            if ahead > 0:
                await asyncio.sleep(ahead)
            lag_max = max(lag_max, -ahead)
            owed += per_tick
            n = min(count - sent, max(1, int(owed)))
            owed -= n
            now = int(time.time() * 1000)
            msgs = [Message(TOPIC, struct.pack(">q", sent + k), deliver_at_ms=now + rnd.randint(dmin, dmax))
                    for k in range(n)]
            results = await asyncio.gather(*(p.send(m) for m in msgs), return_exceptions=True)
            errors += sum(1 for r in results if isinstance(r, BaseException) or not r.ok)
            sent += n
        took = time.perf_counter() - t0
    return {"sent": count, "send_errors": errors, "send_seconds": took, "pacing_lag_max_s": lag_max}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--delay-min-ms", type=int, default=1000)
    ap.add_argument("--delay-max-ms", type=int, default=20_000)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--broker-arg", action="append", default=[])
    args = ap.parse_args(argv)
    from bench.bench_broker import loopback_echo_rtt_us
    from tests.support.daemons import Cluster
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    print(f"calibration before: loopback_echo_rtt_us={loopback_echo_rtt_us():.1f}", flush=True)
    root = tempfile.mkdtemp(prefix="bench-timer-")
    cluster = Cluster(root, [f"--defaultTopicQueueNums={args.queues}"] + args.broker_arg).start()
    try:
        async def create_topic():
            async with Producer("BenchTimerInit", cluster.namesrv_addr, instance_name="bench-timer-init") as p:
                await p.send(Message(TOPIC, struct.pack(">q", -1)))
        asyncio.run(create_topic())
        out = os.path.join(root, "consumer.json")
        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        timeout_s = args.seconds + args.delay_max_ms / 1000 + 60
        cons = ctx.Process(target=consumer_main, args=(cluster.namesrv_addr, args.count, timeout_s, out, ready))
        cons.start()
        if not ready.wait(60):
            raise SystemExit("the consumer did not start")
        cpu0 = proc_cpu_s(cluster.broker.proc.pid)
        prod = asyncio.run(produce(cluster.namesrv_addr, args.count, args.seconds, args.delay_min_ms,
                                   args.delay_max_ms))
        cons.join(timeout_s + 30)
        cpu = proc_cpu_s(cluster.broker.proc.pid) - cpu0
        with open(out) as f:
            res = json.load(f)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    cons_l, recv_l = res["consumable"], res["received"]
    print(f"timers: {prod['sent']} sent over {prod['send_seconds']:.1f} s (send errors {prod['send_errors']}, "
          f"pacing lag max {prod['pacing_lag_max_s'] * 1000:.0f} ms), due {args.delay_min_ms}..{args.delay_max_ms} "
          f"ms after sending; {len(cons_l)} received, {res['duplicates']} duplicates", flush=True)
    for name, v in (("consumable (store time - due)", cons_l), ("received (consumer clock - due)", recv_l)):
        if not v:
            print(f"  {name}: nothing received", flush=True)
            continue
        early = sum(1 for x in v if x < 0)
        print(f"  {name}: p50 {pct(v, 50):.0f} ms, p99 {pct(v, 99):.0f} ms, max {max(v):.0f} ms,"
              f" early {early}", flush=True)
    print(f"  broker CPU {cpu:.1f} s over the run", flush=True)
    print(f"calibration after: loopback_echo_rtt_us={loopback_echo_rtt_us():.1f}", flush=True)


if __name__ == "__main__":
    main()
