"""Message-index build benchmark: the CPU per record of `_index_catch_up` (what the flush
thread runs every second, and a query before it answers), in-process.

    python bench/bench_index.py [--messages 100000] [--batch 20000] [--keys 2] [--reference]
                                [--slots 5000000] [--entries 20000000] [--rounds 3]
                                [--behind N [--batch-put]] [--walk]

Stores `--messages` records shaped like the peers benchmark's with keys: a 128-byte body,
TAGS, KEYS with `--keys` space-separated words and a client UNIQ_KEY (32 hex digits, 64
per millisecond as from a batch send), so `--keys + 1` index entries per record. Then it
builds the index with `_index_catch_up(--batch)` calls (indexBuildBatchNums, 20,000)
until it has caught up, and prints the process CPU time (`time.process_time`: other
processes on a shared host do not inflate it) per record and per entry. Java's geometry
by default (5M slots, 20M entries: a 420 MB sparse file; its page faults are counted,
as the broker pays them).

`--behind N` indexes as the broker's IndexPump does under load instead: after every N
puts, a catch-up over those N records only (the CPU of the catch-ups alone is
counted). N=1 is a sync send's step while the broker has its CPU to itself: such few
records take the store's few-records path (`_index_few`, at most 8 records / 2 KiB);
N=16 is about the 4 KiB group of a shared CPU, through the walk. `--batch-put` with
`--behind 32` stores each 32 records as one SEND_BATCH body (the index takes the hint the
put leaves instead of reading them back): a window of 64 sends, coalesced by the
producer into batches of about 32, with `--keys 0` (a UNIQ_KEY only, as `send(Message)`).

`--reference` builds a second, identical store with the plain builder of before
(tests/support/index_reference.py), alternating which goes first over `--rounds` fresh
builds, and checks that both wrote the same index bytes. `--walk` likewise times the
walk alone (the few-records path off). The calibration line is the CPU
cost of one Python function call right now: read the figures against it.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pocketmq.broker.store import index as index_mod  # noqa: E402
from pocketmq.broker.store.api import MessageToStore  # noqa: E402
from pocketmq.broker.store.index import INDEX_HEADER_SIZE, INDEX_ENTRY_SIZE, INDEX_SLOT_SIZE  # noqa: E402
from pocketmq.broker.store.store import MessageStore  # noqa: E402
from pocketmq.broker.store.store_config import StoreConfig  # noqa: E402
from pocketmq.protocol.message import encode_batch_elements  # noqa: E402

HOST = (bytes([192, 168, 0, 10]), 50000)
STORE_HOST = (bytes([192, 168, 0, 1]), 10911)
T0 = 1_700_000_000_000


def messages(n: int, keys: int) -> list[MessageToStore]:
    body = os.urandom(128)
    out = []
    for i in range(n):
        ms = i // 64                          # 64 ids per millisecond, as a batch send makes them
        uniq = f"C0A8000A1F2E5A3B9C4D{ms:08X}{i & 0xFFFF:04X}"
        words = " ".join(f"order-{(i * 7 + j) % 50_000}" for j in range(keys))
        props = f"TAGS\x01TagA\x02KEYS\x01{words}\x02UNIQ_KEY\x01{uniq}\x02WAIT\x01true"
        out.append(MessageToStore("BenchIndex", i % 4, 0, body, props, 0, T0 + ms, HOST, T0 + ms))
    return out


def filled(root: str, name: str, msgs, slots: int, entries: int) -> MessageStore:
    path = os.path.join(root, name)
    shutil.rmtree(path, ignore_errors=True)
    cfg = StoreConfig(path, store_host=STORE_HOST, message_index_enable=True,
                      max_hash_slot_num=slots, max_index_num=entries)
    s = MessageStore(cfg)
    s.open()
    put = s.put_message
    for m in msgs:
        put(m)
    return s


def walk_catch_up(s: MessageStore, max_records: int) -> int:
    """_index_catch_up with the few-records path off: every catch-up through the walk."""
    saved = index_mod.FEW_BYTES_MAX
    index_mod.FEW_BYTES_MAX = -1
    try:
        return MessageStore._index_catch_up(s, max_records)
    finally:
        index_mod.FEW_BYTES_MAX = saved


def build_behind(root: str, name: str, msgs, slots: int, entries: int, behind: int,
                 catch_up, batch_put: bool = False) -> tuple[MessageStore, float, int]:
    """A store filled `behind` records at a time, each group indexed right after its puts
    (batch_put: each group put as one SEND_BATCH body): (the store, CPU seconds of the
    catch-ups, records walked)."""
    path = os.path.join(root, name)
    shutil.rmtree(path, ignore_errors=True)
    s = MessageStore(StoreConfig(path, store_host=STORE_HOST, message_index_enable=True,
                                 max_hash_slot_num=slots, max_index_num=entries))
    s.open()
    put = s.put_message
    cpu = 0.0
    walked = 0
    clock = time.process_time
    for i in range(0, len(msgs), behind):
        group = msgs[i:i + behind]
        if batch_put:               # one SEND_BATCH body (its records leave the index a hint)
            m0 = group[0]
            body = encode_batch_elements([(0, m.body, m.properties_str.encode()) for m in group])
            r = s.put_batch_body(m0.topic, m0.queue_id, 0, m0.born_timestamp, m0.born_host,
                                 m0.now_ms, body, b"WAIT\x01true")
            assert r.status.name == "PUT_OK", r
        else:
            for m in group:
                put(m)
        t0 = clock()
        walked += catch_up(s, 0)
        cpu += clock() - t0
    return s, cpu, walked


def build(s: MessageStore, batch: int, catch_up) -> tuple[float, int]:
    """CPU seconds to index everything in `batch`-record calls; records walked."""
    walked = 0
    t0 = time.process_time()
    while True:
        n = catch_up(s, batch)
        walked += n
        if n == 0:
            break
    return time.process_time() - t0, walked


def digest(s: MessageStore) -> str:
    """A hash of every index file's header, slots and written entries."""
    h = hashlib.sha256()
    svc = s._index
    for f in svc.files:
        f.map()
        used = INDEX_HEADER_SIZE + f.slot_num * INDEX_SLOT_SIZE + f.index_count * INDEX_ENTRY_SIZE
        h.update(os.path.basename(f.path).encode())
        h.update(f.mm[:used])
    return h.hexdigest()


def calibration_ns() -> float:
    def f():
        pass
    t0 = time.process_time()
    for _ in range(1_000_000):
        f()
    return (time.process_time() - t0) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=20_000, help="records per _index_catch_up call (0: all)")
    ap.add_argument("--keys", type=int, default=2, help="KEYS words per record (plus the UNIQ_KEY)")
    ap.add_argument("--slots", type=int, default=5_000_000)
    ap.add_argument("--entries", type=int, default=20_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reference", action="store_true", help="also time the plain builder and compare bytes")
    ap.add_argument("--walk", action="store_true",
                    help="also time the walk alone (the few-records path off) and compare bytes")
    ap.add_argument("--behind", type=int, default=0,
                    help="index after every N puts, as the broker's pump does (0: fill, then index)")
    ap.add_argument("--batch-put", action="store_true",
                    help="with --behind N: each N puts as one SEND_BATCH body (the index takes its "
                         "hint), as a window of sends coalesced by the producer")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="pocketmq-bench-index-")
    n = args.messages
    builders = {"fast": MessageStore._index_catch_up}
    if args.reference:
        from tests.support.index_reference import reference_catch_up
        builders["reference"] = reference_catch_up
    if args.walk:
        builders["walk"] = walk_catch_up
    try:
        print(f"calibration: {calibration_ns():.0f} ns CPU per no-op Python call; "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        msgs = messages(n, args.keys)
        per_entry = args.keys + 1
        results: dict[str, list[float]] = {k: [] for k in builders}
        for r in range(args.rounds):
            order = list(builders) if r % 2 == 0 else list(reversed(builders))
            digests = {}
            for name in order:
                if args.behind > 0:
                    s, cpu, walked = build_behind(root, name, msgs, args.slots, args.entries, args.behind,
                                                  builders[name], args.batch_put)
                else:
                    s = filled(root, name, msgs, args.slots, args.entries)
                try:
                    if args.behind <= 0:
                        cpu, walked = build(s, args.batch, builders[name])
                    assert walked == n, (walked, n)
                    results[name].append(cpu)
                    print(f"round {r + 1} {name:9}: {cpu * 1e6 / n:6.2f} us CPU per record, "
                          f"{cpu * 1e6 / (n * per_entry):5.2f} per entry ({n:,} records, {per_entry} entries each, "
                          + (f"indexed every {args.behind} puts{' of one batch' if args.batch_put else ''})"
                             if args.behind > 0
                             else f"batches of {args.batch or 'all'})"), flush=True)
                    if len(builders) > 1:
                        digests[name] = digest(s)
                finally:
                    s.close()
                    shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            if len(set(digests.values())) > 1:
                print("MISMATCH: the builders wrote different index bytes", digests)
                sys.exit(1)
        for name, cpus in results.items():
            best = min(cpus)
            print(f"{name:9} best: {best * 1e6 / n:.2f} us CPU per record "
                  f"(median {sorted(cpus)[len(cpus) // 2] * 1e6 / n:.2f})")
        if len(builders) > 1:
            print("index bytes identical: yes")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
