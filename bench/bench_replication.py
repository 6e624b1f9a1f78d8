"""Replication benchmarks (issue 30 "Speed"): a master and its slave on one host.

    python -m bench.bench_replication                  # all phases, ~2 minutes
    python -m bench.bench_replication --phases lag --seconds 10

Starts mqnamesrv, a master and a slave (processes, tests/support/replica_pair.ProcessGroup)
in a temp dir, topics of one queue, and measures:

  lag        the master's highest ingest: send_batch of 64 x 128 B bodies, 64 batches in
             flight (ASYNC_MASTER). Replication lag per batch = when the slave's consume
             queue first shows the batch's last offset (GET_MAX_OFFSET on the slave every
             `--sample-ms`, default 5) minus when the master acknowledged it; p50/p99/max,
             and whether the slave kept up (its end equal to the master's within 1 s of the
             last ack). The master's CPU per MiB ingested with the slave attached and, in a
             second run, without one: the difference is what serving the slave costs.
  sync       ASYNC_MASTER against SYNC_MASTER, rounds interleaved (A, S, A, S...): 64
             sends in flight (coalesced, the producer's default) msgs/s, and one sync send
             at a time p50/p99. Targets: SYNC >= 0.6x ASYNC throughput, SYNC p99 <= 2x ASYNC.

Every phase talks to 127.0.0.1 only; the calibration (bench_broker's loopback echo round
trip) is printed before and after, as in the other benches.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pocketmq.client import Message, Producer
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.bodies import MessageQueue
from tests.support.replica_pair import ProcessGroup

PHASES = ("lag", "catchup", "sync")
BODY = b"x" * 128


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


BROKER_ARGS: list[str] = []
PIN = ["none"]


def pin_group(g: ProcessGroup) -> None:
    """--pin slave: the slave on the last CPU, the nameserver, the master and this client on
    the others (the slave as on its own host); none: the scheduler's choice."""
    if PIN[0] == "none":
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return
    rest, last = set(cpus[:-1]), {cpus[-1]}
    for d, where in ((g.ns, rest), (g.master, rest), (g.slave, last)):
        if d is not None and d.proc is not None:
            for tid in os.listdir(f"/proc/{d.proc.pid}/task"):
                os.sched_setaffinity(int(tid), where)
    os.sched_setaffinity(0, rest)


def start_group(role: str, with_slave: bool = True) -> tuple[ProcessGroup, str]:
    root = tempfile.mkdtemp(prefix="bench-repl-")
    g = ProcessGroup(root, role, ["--defaultTopicQueueNums=1", "--mappedFileSizeConsumeQueue=6000000"]
                     + BROKER_ARGS, segment=1 << 30)
    g.ns.start()
    g.master = g._broker("m", g.master_dir)
    g.master.start(30)
    if with_slave:
        g.slave = g._broker("s", g.slave_dir)
        g.slave.start(30)
    pin_group(g)
    return g, root


def stop_group(g: ProcessGroup, root: str) -> None:
    g.stop()
    if os.environ.get("BENCH_KEEP"):
        print("kept", root, flush=True)
    else:
        shutil.rmtree(root, ignore_errors=True)


async def slave_max(inst: ClientInstance, addr: str, mq: MessageQueue) -> int:
    try:
        return await inst.api.max_offset(addr, mq)
    except Exception:
        return -1


async def ingest(g: ProcessGroup, seconds: float, sample_ms: float, with_slave: bool, rate: int = 0) -> dict:
    topic = f"LagT{int(time.time() * 1000) % 100000}"
    mq = MessageQueue(topic, "broker-a", 0)
    slave_addr = f"127.0.0.1:{g.s_port}"
    acks: list[tuple[int, float]] = []      # (last queue offset + 1 of a batch, ack time)
    seen: list[tuple[int, float]] = []      # (slave's max offset, time seen)
    inst = ClientInstance("127.0.0.1@bench-repl-probe", g.namesrv_addr)
    bodies = [BODY] * 64
    async with Producer("BenchRepl", g.namesrv_addr, instance_name="bench-repl") as p:
        await p.send_batch(bodies, topic=topic)
        stop = asyncio.Event()

        # --rate: batches paced to `rate` messages a second over the 64 senders
        interval = 64 * 64 / rate if rate else 0.0

        async def sender(i):
            due = time.perf_counter() + (interval * i / 64 if interval else 0)
            while not stop.is_set():
                if interval:
                    wait = due - time.perf_counter()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    due += interval
                r = await p.send_batch(bodies, topic=topic)
                acks.append((r[0].queue_offset + 64, time.perf_counter()))

        async def sampler():
            while not stop.is_set():
                seen.append((await slave_max(inst, slave_addr, mq), time.perf_counter()))
                await asyncio.sleep(sample_ms / 1000)

        cpu0 = proc_cpu_s(g.master.proc.pid)
        scpu0 = proc_cpu_s(g.slave.proc.pid) if with_slave else 0.0
        ccpu0 = time.process_time()
        t0 = time.perf_counter()
        t_stop = t0 + seconds
        tasks = [asyncio.create_task(sender(i)) for i in range(64)]
        samp = asyncio.create_task(sampler()) if with_slave else None
        await asyncio.sleep(seconds)
        stop.set()
        t_stop = time.perf_counter()
        await asyncio.gather(*tasks)
        dt = time.perf_counter() - t0
        cpu = proc_cpu_s(g.master.proc.pid) - cpu0
        ccpu = time.process_time() - ccpu0
        if samp is not None:
            await samp
            # every batch is acknowledged now: sample until the slave has them all (or 10 s)
            last = max(e for e, _ in acks)
            while time.perf_counter() - t_stop < 10:
                seen.append((await slave_max(inst, slave_addr, mq), time.perf_counter()))
                if seen[-1][0] >= last:
                    break
                await asyncio.sleep(sample_ms / 1000)
        scpu = proc_cpu_s(g.slave.proc.pid) - scpu0 if with_slave else 0.0
    await inst.close()
    msgs = len(acks) * 64
    mib = msgs * (128 + 91 + len(topic) + 60) / (1 << 20)     # record bytes, ~60 B of properties
    out = {"msgs_per_s": round(msgs / dt), "mib_per_s": round(mib / dt, 2),
           "master_cpu_ms_per_mib": round(1000 * cpu / mib, 1),
           "cpu_share": {"master": round(cpu / dt, 2), "client": round(ccpu / dt, 2)}}
    if with_slave:
        lags = []
        j = 0
        for end, t_ack in acks:          # acks arrive in any order: the offsets decide
            while j < len(seen) and seen[j][0] < end:
                j += 1
            k = j
            # the first sample at or after the ack that shows the batch
            while k < len(seen) and (seen[k][0] < end or seen[k][1] < t_ack):
                if seen[k][0] >= end and seen[k][1] >= t_ack:
                    break
                k += 1
            if k < len(seen) and seen[k][0] >= end:
                lags.append(max(0.0, seen[k][1] - t_ack) * 1000)
                if os.environ.get("BENCH_SPIKES") and lags[-1] > 50:
                    print(f"spike {lags[-1]:.0f} ms at t={t_ack - t0:.3f} s", flush=True)
        caught = seen and seen[-1][0] >= max(e for e, _ in acks)
        out["cpu_share"]["slave_incl_catch_up"] = round(scpu / dt, 2)
        out["slave_cpu_ms_per_mib"] = round(1000 * scpu / mib, 1)
        out.update({"lag_p50_ms": round(pct(lags, 50), 1), "lag_p99_ms": round(pct(lags, 99), 1),
                    "lag_max_ms": round(max(lags), 1), "batches_measured": len(lags),
                    "slave_caught_up": bool(caught)})
    return out


async def catch_up(g: ProcessGroup, seconds: float) -> dict:
    """Fill the master alone for `seconds`, then start the slave: how fast it copies (no
    ingest competing for the CPU)."""
    await ingest(g, seconds, 5, False)
    inst = ClientInstance("127.0.0.1@bench-repl-catchup", g.namesrv_addr)
    try:
        g.slave = g._broker("s", g.slave_dir)
        t0 = time.perf_counter()
        await asyncio.to_thread(g.slave.start, 30)
        pin_group(g)
        cpu0 = proc_cpu_s(g.slave.proc.pid)
        master = f"127.0.0.1:{g.m_port}"
        slave = f"127.0.0.1:{g.s_port}"
        target = None
        while True:
            st = await inst.api.broker_ha_status(master)
            target = st["masterCommitLogMaxOffset"]
            sst = await inst.api.broker_ha_status(slave)
            got = sst.get("haClientRuntimeInfo", {}).get("maxOffset", 0)
            if got >= target:
                break
            if time.perf_counter() - t0 > 120:
                break
            await asyncio.sleep(0.05)
        dt = time.perf_counter() - t0
        cpu = proc_cpu_s(g.slave.proc.pid) - cpu0
    finally:
        await inst.close()
    mib = target / (1 << 20)
    return {"mib": round(mib, 1), "seconds": round(dt, 2), "mib_per_s": round(mib / dt, 1),
            "slave_cpu_ms_per_mib": round(1000 * cpu / mib, 1)}


async def sync_round(g: ProcessGroup, n_inflight: int, n_single: int) -> dict:
    topic = f"SyncT{int(time.time() * 1000) % 100000}"
    async with Producer("BenchSync", g.namesrv_addr, instance_name=f"bench-sync-{topic}") as p:
        await p.send(Message(topic, BODY))
        left = n_inflight

        async def worker():
            nonlocal left
            while left > 0:
                left -= 1
                r = await p.send(Message(topic, BODY))
                assert r.ok, r
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(64)))
        rate = n_inflight / (time.perf_counter() - t0)
        lat = []
        for _ in range(n_single):
            s = time.perf_counter_ns()
            r = await p.send(Message(topic, BODY))
            lat.append((time.perf_counter_ns() - s) / 1000)
            assert r.ok, r
    return {"inflight_msgs_per_s": round(rate), "single_p50_us": round(pct(lat, 50)),
            "single_p99_us": round(pct(lat, 99))}


def run(args) -> dict:
    result = {}
    if "lag" in args.phases:
        g, root = start_group("ASYNC_MASTER")
        try:
            # paced rates first: a run at the highest ingest leaves both brokers an index backlog
            # to work off, which would land on the runs after it
            for rate in args.rates:
                result[f"lag_at_{rate}_msgs_per_s"] = asyncio.run(ingest(g, args.seconds, args.sample_ms, True, rate))
            result["lag_with_slave"] = asyncio.run(ingest(g, args.seconds, args.sample_ms, True))
        finally:
            stop_group(g, root)
        g, root = start_group("ASYNC_MASTER", with_slave=False)
        try:
            result["ingest_without_slave"] = asyncio.run(ingest(g, args.seconds, args.sample_ms, False))
        finally:
            stop_group(g, root)
        w, wo = result["lag_with_slave"], result["ingest_without_slave"]
        result["serving_the_slave_cpu_ms_per_mib"] = round(w["master_cpu_ms_per_mib"] - wo["master_cpu_ms_per_mib"], 1)
        print(json.dumps(result, indent=1), flush=True)
    if "catchup" in args.phases:
        g, root = start_group("ASYNC_MASTER", with_slave=False)
        try:
            result["catch_up"] = asyncio.run(catch_up(g, args.seconds))
        finally:
            stop_group(g, root)
        print(json.dumps(result["catch_up"], indent=1), flush=True)
    if "sync" in args.phases:
        rounds = {"ASYNC_MASTER": [], "SYNC_MASTER": []}
        groups = {role: start_group(role) for role in rounds}
        try:
            for _ in range(args.rounds):
                for role in rounds:
                    r = asyncio.run(sync_round(groups[role][0], args.n_inflight, args.n_single))
                    rounds[role].append(r)
                    print(role, r, flush=True)
        finally:
            for g, root in groups.values():
                stop_group(g, root)

        def med(role, key):
            return sorted(r[key] for r in rounds[role])[len(rounds[role]) // 2]
        a_rate, s_rate = med("ASYNC_MASTER", "inflight_msgs_per_s"), med("SYNC_MASTER", "inflight_msgs_per_s")
        a_p99, s_p99 = med("ASYNC_MASTER", "single_p99_us"), med("SYNC_MASTER", "single_p99_us")
        result["sync"] = {"rounds": rounds, "inflight_ratio_sync_over_async": round(s_rate / a_rate, 2),
                          "single_p99_ratio_sync_over_async": round(s_p99 / a_p99, 2)}
        print(json.dumps(result["sync"], indent=1), flush=True)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--seconds", type=float, default=10.0, help="lag: seconds of ingest")
    ap.add_argument("--sample-ms", type=float, default=5.0, help="lag: how often the slave's end is read")
    ap.add_argument("--rates", type=int, nargs="*", default=[50_000, 100_000, 200_000],
                    help="lag: also at these paced ingest rates (messages a second)")
    ap.add_argument("--rounds", type=int, default=3, help="sync: interleaved rounds per role")
    ap.add_argument("--n-inflight", type=int, default=20000)
    ap.add_argument("--n-single", type=int, default=3000)
    ap.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                    help="extra mqbroker flag for the master and the slave (repeatable)")
    ap.add_argument("--pin", choices=["none", "slave"], default="none",
                    help="slave: the slave alone on the last CPU, everything else on the others")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    args.phases = set(args.phases.split(","))
    BROKER_ARGS.extend(args.broker_arg)
    PIN[0] = args.pin
    if args.phases - set(PHASES):
        ap.error(f"unknown phases {sorted(args.phases - set(PHASES))}; known: {','.join(PHASES)}")
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    from bench.bench_broker import calibrated
    calibrated(lambda: run(args), args.json)


if __name__ == "__main__":
    main()
