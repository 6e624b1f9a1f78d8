"""Broker figures with the Apache C++ client (rocketmq==0.4.4) as load generator.

    python bench/bench_cpp.py [--seconds 5] [--procs 1]

Each phase runs in its own C++ client process(es) (HOME in a temp dir):
sync sends (one in flight per process: sends/s, p50/p99 in µs measured around
send_sync), batched sends (64 x 128 B per send_batch) msgs/s, and push
consumption msgs/s of everything sent. Broker CPU µs per message comes from
/proc/<broker pid>/stat.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_broker import cpu_seconds  # noqa: E402
from tests.support.daemons import Cluster  # noqa: E402

WORKER = r'''
import json, sys, time, threading
from rocketmq.client import Producer, Message, PushConsumer
mode, ns, topic, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
body = b"x" * 128
if mode in ("sync", "batch"):
    p = Producer("bench_pg_" + mode)
    p.set_namesrv_addr(ns)
    p.start()
    m = Message(topic); m.set_body(body); m.set_tags("TagA")
    p.send_sync(m)  # warm-up: route + connection
    lat = []; n = 0
    end = time.perf_counter() + seconds
    t_start = time.perf_counter()
    while time.perf_counter() < end:
        if mode == "sync":
            m = Message(topic); m.set_body(body); m.set_tags("TagA")
            t0 = time.perf_counter(); p.send_sync(m); lat.append(time.perf_counter() - t0); n += 1
        else:
            msgs = []
            for i in range(64):
                m = Message(topic); m.set_body(body); m.set_tags("TagA"); msgs.append(m)
            t0 = time.perf_counter(); p.send_batch(msgs); lat.append(time.perf_counter() - t0); n += 64
    dt = time.perf_counter() - t_start
    p.shutdown()
    lat.sort()
    print(json.dumps({"msgs": n, "seconds": dt, "p50_us": lat[len(lat)//2]*1e6, "p99_us": lat[int(len(lat)*.99)]*1e6}))
else:
    expect = int(sys.argv[5])
    c = PushConsumer("bench_cg"); c.set_namesrv_addr(ns); c.set_thread_count(4)
    c.set_message_batch_max_size(32)
    lock = threading.Lock(); st = {"n": 0, "first": None, "last": None}
    def on(msg):
        with lock:
            now = time.perf_counter()
            if st["first"] is None: st["first"] = now
            st["n"] += 1; st["last"] = now
    c.subscribe(topic, on); c.start()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end and st["n"] < expect:
        time.sleep(0.05)
    c.shutdown()
    dt = (st["last"] or 1) - (st["first"] or 0)
    print(json.dumps({"msgs": st["n"], "seconds": dt}))
'''


def run_workers(home, procs, args):
    env = dict(os.environ, HOME=home)
    ps = [subprocess.Popen([sys.executable, "-c", WORKER, *args], stdout=subprocess.PIPE, text=True, env=env)
          for _ in range(procs)]
    return [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in ps]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--flush", default="ASYNC_FLUSH")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="pocketmq-bench-cpp-")
    home = os.path.join(root, "home")
    os.makedirs(home)
    c = Cluster(root, broker_args=[f"--flushDiskType={args.flush}", "--defaultTopicQueueNums=4"]).start()
    try:
        pid = c.broker.proc.pid
        total_sent = 0
        for mode, topic in (("sync", "CppBench"), ("batch", "CppBench")):
            c0 = cpu_seconds(pid)
            res = run_workers(home, args.procs, [mode, c.namesrv_addr, topic, str(args.seconds)])
            dc = cpu_seconds(pid) - c0
            n = sum(r["msgs"] for r in res)
            total_sent += n
            rate = sum(r["msgs"] / r["seconds"] for r in res)
            print(json.dumps({"phase": f"cpp_{mode}", "procs": args.procs, "msgs": n, "msgs_per_s": round(rate),
                              "p50_us": round(res[0]["p50_us"], 1), "p99_us": round(res[0]["p99_us"], 1),
                              "broker_cpu_us_per_msg": round(dc / n * 1e6, 1)}), flush=True)
        c0 = cpu_seconds(pid)
        res = run_workers(home, 1, ["push", c.namesrv_addr, "CppBench", "120", str(total_sent)])
        dc = cpu_seconds(pid) - c0
        r = res[0]
        print(json.dumps({"phase": "cpp_push_consume", "msgs": r["msgs"], "expected": total_sent,
                          "msgs_per_s": round(r["msgs"] / max(r["seconds"], 1e-9)),
                          "broker_cpu_us_per_msg": round(dc / max(r["msgs"], 1) * 1e6, 1)}), flush=True)
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
