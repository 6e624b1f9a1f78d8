"""Store micro-benchmark: put_message / put_messages throughput and get_message (pull path)
throughput for 128-byte messages, on a temporary directory.

    python bench/bench_store.py [--messages 200000] [--segment-mib 1024] [--dir /path]

Prints one line per figure. Flushing is left to the OS (ASYNC_FLUSH without a flush thread);
a final flush() is timed separately.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pocketmq.broker.store.api import MessageBatchToStore, MessageToStore  # noqa: E402
from pocketmq.broker.store.store import MessageStore  # noqa: E402
from pocketmq.broker.store.store_config import StoreConfig  # noqa: E402
from pocketmq.protocol.message import encode_batch_body, tags_code  # noqa: E402

HOST = (bytes([192, 168, 0, 10]), 50000)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--segment-mib", type=int, default=1024)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="pocketmq-bench-")
    n = args.messages
    cfg = StoreConfig(os.path.join(root, "store"), mapped_file_size_commit_log=args.segment_mib << 20,
                      store_host=(bytes([192, 168, 0, 1]), 10911))
    store = MessageStore(cfg)
    store.open()
    body = os.urandom(128)
    props = "TAGS\x01TagA\x02UNIQ_KEY\x01C0A8000A00002A9F0000000000000000\x02WAIT\x01true"
    queues = args.queues
    try:
        msgs = [MessageToStore("BenchTopic", i % queues, 0, body, props, 0, 1_700_000_000_000, HOST,
                               1_700_000_000_000 + i) for i in range(n)]
        put = store.put_message
        t0 = time.perf_counter()
        for m in msgs:
            put(m)
        dt = time.perf_counter() - t0
        record_bytes = store.commit_log_max_offset // n
        print(f"put_message:   {n / dt:>12,.0f} msgs/s  ({n * record_bytes / dt / 1e6:,.1f} MB/s of "
              f"{record_bytes}-byte records, {dt * 1e6 / n:.2f} us/msg)")

        t0 = time.perf_counter()
        store.flush()
        print(f"flush():       {time.perf_counter() - t0:>12.3f} s for {store.commit_log_max_offset / 1e6:,.1f} MB")

        # put: the broker's single-send path (fields as arguments, properties already bytes)
        props_b = props.encode()
        put_fields = store.put
        t0 = time.perf_counter()
        for i in range(n):
            put_fields("BenchPut", i % queues, 0, body, props_b, 0, 1_700_000_000_000, HOST, 1_700_000_000_000 + i)
        dt = time.perf_counter() - t0
        print(f"put:           {n / dt:>12,.0f} msgs/s  ({dt * 1e6 / n:.2f} us/msg)")

        batch_n = 32
        batches = [MessageBatchToStore("BenchBatch", i % queues, 0, 1_700_000_000_000, HOST, 1_700_000_000_000 + i,
                                       [(0, body, props)] * batch_n) for i in range(n // batch_n)]
        t0 = time.perf_counter()
        for b in batches:
            store.put_messages(b)
        dt = time.perf_counter() - t0
        print(f"put_messages:  {len(batches) * batch_n / dt:>12,.0f} msgs/s  (batches of {batch_n})")

        # put_batch_body: the broker's SEND_BATCH path (the wire body parsed and stored in one pass)
        wire = encode_batch_body([(0, body, props)] * batch_n)
        put_body = store.put_batch_body
        t0 = time.perf_counter()
        for i in range(n // batch_n):
            put_body("BenchBody", i % queues, 0, 1_700_000_000_000, HOST, 1_700_000_000_000 + i, wire,
                     b"CLUSTER\x01DefaultCluster")
        dt = time.perf_counter() - t0
        print(f"put_batch_body:{(n // batch_n) * batch_n / dt:>12,.0f} msgs/s  (batches of {batch_n})")

        for label, max_nums, flt in (("get_message", 32, None),
                                     ("get_message+tag filter", 32, {tags_code("TagA")}.__contains__)):
            got = 0
            pulls = 0
            total_bytes = 0
            t0 = time.perf_counter()
            for q in range(queues):
                off = 0
                mx = store.get_max_offset_in_queue("BenchTopic", q)
                while off < mx:
                    r = store.get_message("BenchTopic", q, off, max_nums, flt)
                    got += r.message_count
                    total_bytes += r.buffer_total_size
                    pulls += 1
                    off = r.next_begin_offset
            dt = time.perf_counter() - t0
            print(f"{label + ':':<24}{got / dt:>12,.0f} msgs/s  ({pulls / dt:,.0f} pulls/s of {max_nums}, "
                  f"{total_bytes / dt / 1e6:,.0f} MB/s, zero-copy memoryviews)")
            assert got == n

        t0 = time.perf_counter()
        joined = 0
        for q in range(queues):
            off = 0
            mx = store.get_max_offset_in_queue("BenchTopic", q)
            while off < mx:
                r = store.get_message("BenchTopic", q, off, 32)
                joined += len(b"".join(r.buffers))
                off = r.next_begin_offset
        dt = time.perf_counter() - t0
        print(f"get_message + b''.join: {n / dt:>10,.0f} msgs/s  (what a transport that copies would see)")
        store.close()

        t0 = time.perf_counter()
        s2 = MessageStore(cfg)
        rep = s2.open()
        print(f"reopen (clean):{time.perf_counter() - t0:>12.3f} s  (scanned {rep.records_scanned} records)")
        s2.abandon()
        t0 = time.perf_counter()
        s3 = MessageStore(cfg)
        rep = s3.open()
        print(f"reopen (crash):{time.perf_counter() - t0:>12.3f} s  (scanned {rep.records_scanned} records "
              f"with full checks)")
        s3.close()
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
