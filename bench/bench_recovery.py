"""Recovery benchmark (issue 11 item 7): how long a store takes to open after a crash, and
how many file-backed pages recovery touches, for a given segment size.

    python bench/bench_recovery.py [--segment-mib 1024] [--fill-mib 256] [--unflushed-kib 512]
                                   [--body-bytes 512] [--queues 8] [--runs 3] [--dir /path]

Fill phase (this process): puts `fill-mib` of messages the way an ASYNC_FLUSH broker does
(flush() every 4 MiB, flush_consume_queues() every 16 MiB: the checkpoint lags behind),
then `unflushed-kib` more without any flush, then `abandon()`: the abort file stays, the
last writes are only in the page cache, like a SIGKILLed broker's.

Open phase: the crashed store is kept aside (a sparse copy) and restored before each run;
a fresh child process per run (so RSS starts from nothing) opens it and prints the wall
time of open(), the process CPU time, RssFile (file-backed resident pages) before and after
open, and the recovery report's counts. With `--broker` a real `mqbroker` is also started
on a restored copy and its RssFile read once it says "boot success" (its own libraries
included: compare it with the figure of a broker on an empty store, also printed).

The page cache is warm (the files were just written): the figures are the CPU and
page-touching cost of recovery, not the disk's read speed; on a cold cache the old
behaviour also read the whole active segment from disk.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pocketmq.broker.store.api import MessageToStore  # noqa: E402
from pocketmq.broker.store.store import MessageStore  # noqa: E402
from pocketmq.broker.store.store_config import StoreConfig  # noqa: E402

HOST = (bytes([192, 168, 0, 10]), 50000)
STORE_HOST = (bytes([192, 168, 0, 1]), 10911)


def _config(root: str, segment_mib: int) -> StoreConfig:
    return StoreConfig(os.path.join(root, "store"), mapped_file_size_commit_log=segment_mib << 20,
                       store_host=STORE_HOST)


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    return -1


def fill(root: str, segment_mib: int, fill_mib: int, unflushed_kib: int, body_bytes: int, queues: int) -> dict:
    store = MessageStore(_config(root, segment_mib))
    store.open()
    body = os.urandom(body_bytes)
    props = "TAGS\x01TagA\x02UNIQ_KEY\x01C0A8000A00002A9F0000000000000000\x02WAIT\x01true"
    i = 0
    ts = 1_700_000_000_000
    last_flush = last_cq = 0

    def put() -> int:
        nonlocal i
        r = store.put_message(MessageToStore("BenchTopic", i % queues, 0, body, props, 0, ts, HOST, ts + i))
        assert r.ok, r
        i += 1
        return r.end_offset

    end = 0
    while end < fill_mib << 20:
        end = put()
        if end - last_flush >= 4 << 20:
            store.flush()
            last_flush = end
        if end - last_cq >= 16 << 20:
            store.flush_consume_queues()
            last_cq = end
    store.flush()
    flushed = store.flushed_offset
    while end < flushed + (unflushed_kib << 10):
        end = put()
    store.abandon()
    return {"messages": i, "end_offset": end, "flushed_offset": flushed}


def open_child(root: str, segment_mib: int) -> dict:
    rss0 = _rss_file_kib()
    store = MessageStore(_config(root, segment_mib))
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    rep = store.open()
    wall_ms = (time.perf_counter() - t0) * 1000
    cpu_ms = (time.process_time() - cpu0) * 1000
    rss1 = _rss_file_kib()
    store.abandon()
    out = {"wall_ms": round(wall_ms, 1), "cpu_ms": round(cpu_ms, 1), "rss_file_kib_before": rss0,
           "rss_file_kib_after": rss1, "records_scanned": rep.records_scanned,
           "scan_from": rep.scan_from_offset, "end": rep.commit_log_max_offset,
           "records_dispatched": rep.records_dispatched}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--segment-mib", type=int, default=1024)
    ap.add_argument("--fill-mib", type=int, default=256)
    ap.add_argument("--unflushed-kib", type=int, default=512)
    ap.add_argument("--body-bytes", type=int, default=512)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--broker", action="store_true", help="also start mqbroker on the crashed store")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(open_child(args.child, args.segment_mib)))
        return
    root = args.dir or tempfile.mkdtemp(prefix="pocketmq-bench-recovery-")
    try:
        t0 = time.perf_counter()
        info = fill(root, args.segment_mib, args.fill_mib, args.unflushed_kib, args.body_bytes, args.queues)
        print(f"fill: {info['messages']} messages, {info['end_offset'] / 2**20:.1f} MiB "
              f"({(info['end_offset'] - info['flushed_offset']) / 1024:.0f} KiB unflushed) in "
              f"{time.perf_counter() - t0:.1f} s; segment {args.segment_mib} MiB; load average "
              f"{os.getloadavg()[0]:.2f}")
        os.sync()       # the fill's writeback is not recovery's cost
        snapshot = root + ".crashed"
        subprocess.run(["cp", "-a", "--sparse=always", root, snapshot], check=True)
        for run in range(args.runs):
            _restore(snapshot, root)
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", root,
                                  "--segment-mib", str(args.segment_mib)], capture_output=True, text=True,
                                 check=True)
            r = json.loads(res.stdout.strip().splitlines()[-1])
            print(f"open #{run + 1}: {r['wall_ms']:.1f} ms wall, {r['cpu_ms']:.1f} ms CPU, RssFile "
                  f"{r['rss_file_kib_before'] / 1024:.1f} -> {r['rss_file_kib_after'] / 1024:.1f} MiB, "
                  f"{r['records_scanned']} records scanned from {r['scan_from']}, "
                  f"{r['records_dispatched']} units re-dispatched, end {r['end']}")
        if args.broker:
            empty = tempfile.mkdtemp(prefix="pocketmq-bench-recovery-empty-")
            try:
                print(f"mqbroker on an empty store: RssFile {_broker_rss(empty, args.segment_mib) / 1024:.1f} MiB")
            finally:
                shutil.rmtree(empty, ignore_errors=True)
            _restore(snapshot, root)
            print(f"mqbroker after the crash: RssFile {_broker_rss(root, args.segment_mib) / 1024:.1f} MiB")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(root + ".crashed", ignore_errors=True)


def _restore(snapshot: str, root: str) -> None:
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run(["cp", "-a", "--sparse=always", snapshot, root], check=True)
    os.sync()


def _broker_rss(root: str, segment_mib: int) -> int:
    """Start mqbroker on `root`/store, wait for "boot success", return its RssFile (KiB)."""
    import socket
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "pocketmq.broker", "-n", "127.0.0.1:9",
                             f"--listenPort={port}", "--brokerIP1=127.0.0.1", f"--storePathRootDir={root}/store",
                             f"--mappedFileSizeCommitLog={segment_mib << 20}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "store recovery:" in line:
                print("  " + line.strip())
            if "boot success" in line:
                with open(f"/proc/{proc.pid}/status") as f:
                    for st in f:
                        if st.startswith("RssFile:"):
                            return int(st.split()[1])
                break
        raise RuntimeError("mqbroker did not boot")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
