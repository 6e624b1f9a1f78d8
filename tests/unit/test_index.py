"""The message index (broker/store/index.py): format, chains, roll-over, time filter,
recovery after crashes and torn files, and the file store against MemoryStore."""
from __future__ import annotations

import os
import random
import struct

import pytest

from pocketmq.broker.store.api import MessageToStore
from pocketmq.broker.store.checkpoint import read_checkpoint
from pocketmq.broker.store.index import (INDEX_HEADER_SIZE, IndexFile, index_file_name, index_file_size,
                                         index_key_hash, message_index_keys)
from pocketmq.broker.store.memory_store import MemoryStore
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.protocol.message import MessageSysFlag, java_string_hash

HOST = (bytes([10, 0, 0, 7]), 40000)
STORE_HOST = (bytes([10, 0, 0, 1]), 10911)


def config(tmp_path, **kw) -> StoreConfig:
    base = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 64,
                store_host=STORE_HOST, total_physical_memory_bytes=1 << 34,
                max_hash_slot_num=16, max_index_num=64, message_index_enable=True)
    base.update(kw)
    return StoreConfig(str(tmp_path / "store"), **base)


def opened(cfg, cls=MessageStore) -> MessageStore:
    s = cls(cfg)
    s.open()
    return s


def props(keys=None, uniq=None) -> str:
    parts = []
    if keys is not None:
        parts.append(f"KEYS\x01{keys}")
    if uniq is not None:
        parts.append(f"UNIQ_KEY\x01{uniq}")
    return "\x02".join(parts)


def put(s, topic="T", keys=None, uniq=None, now=1_000_000, sys_flag=0, qid=0):
    r = s.put_message(MessageToStore(topic, qid, 0, b"body", props(keys, uniq), sys_flag, now - 1, HOST, now))
    assert r.wrote_offset >= 0, r
    return r.wrote_offset


ALL = (0, 1 << 62)


def filled(cfg, n, step=1, start=1_000_000, uniq=False):
    """An open store holding n messages with key "k" (and UNIQ_KEY U<i> if asked), stored
    `step` ms apart; returns (store, offsets)."""
    s = opened(cfg)
    return s, [put(s, keys="k", uniq=f"U{i}" if uniq else None, now=start + i * step) for i in range(n)]


def q(s, key, topic="T", max_num=64, begin=ALL[0], end=ALL[1]):
    return s.query_message(topic, key, max_num, begin, end).offsets


# ---------------------------------------------------------------- format


def test_key_hash_is_javas_abs_hashcode():
    assert index_key_hash("T#k") == abs(java_string_hash("T#k"))
    # a string whose hashCode is Integer.MIN_VALUE: "polygenelubricants" (a known one)
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert index_key_hash("polygenelubricants") == 0


def test_fast_key_hash_equals_javas():
    # the build hashes raw key bytes in C loops with per-topic memos of `topic#head`
    from pocketmq.broker.store.index import _key_hash_slow, _key_hashes, _topic_hashes
    rnd = random.Random(7)
    for _ in range(1500):
        topic = "".join(rnd.choice("abXY%_-09é") for _ in range(rnd.randint(1, 30)))
        memo = _topic_hashes(topic.encode())
        keys = []
        for _k in range(rnd.randint(1, 6)):
            n = rnd.choice([1, 2, 3, 12, 16, 17, 32, 255, 256, 257, 258, 270])
            keys.append("".join(rnd.choice("ABCDEF0123456789 x") for _ in range(n)))
        for _twice in range(2):                          # the second time from the memo
            got = _key_hashes([k.encode() for k in keys], [memo] * len(keys))
            assert got == [index_key_hash(f"{topic}#{k}") for k in keys], (topic, keys)
        for k in ("é", "中文", "a中", "\udcff"):             # non-ASCII keys take the slow path
            b = k.encode("utf-8", "surrogateescape")
            assert _key_hash_slow(topic.encode(), b) == index_key_hash(f"{topic}#{b.decode('utf-8', 'replace')}")

def test_keys_sharing_a_head_hash_as_javas():
    # a producer's batch: one topic, keys that differ in their last four bytes (a head and a
    # counter's hex digits) take the shared-head path (a table of byte pairs); anything
    # else (two heads, two topics, short keys) the per-key path: both must be Java's
    from pocketmq.broker.store.index import _key_hashes, _topic_hashes
    shared = []
    rnd = random.Random(11)
    for _ in range(600):
        topic = "".join(rnd.choice("abXY%_-09é") for _ in range(rnd.randint(1, 30)))
        memo = _topic_hashes(topic.encode())
        head = "".join(rnd.choice("ABCDEF0123456789 x~") for _ in range(rnd.choice([1, 2, 20, 28, 300])))
        start = rnd.randrange(65536)
        m = rnd.choice([1, 2, 7, 32, 64])
        keys = [f"{head}{(start + i) % 65536:04X}" for i in range(m)]
        if rnd.random() < 0.2:              # tails of any ASCII, not hex
            keys = [head + "".join(rnd.choice("\x00\x7f!zZ09") for _ in range(4)) for _ in range(m)]
        kind = rnd.random()
        memos = [memo] * m
        if kind < 0.15 and m > 1:           # one key of another head: per key
            keys[rnd.randrange(m)] = head[:-1] + "Q0000"
        elif kind < 0.3 and m > 1:          # one key of another topic: per key
            j = rnd.randrange(m)
            memos = list(memos)
            memos[j] = _topic_hashes(b"other")
        elif kind < 0.4:                    # short keys (no head): per key
            keys = [k[-rnd.choice([1, 2, 3, 4]):] for k in keys]
        got = _key_hashes([k.encode() for k in keys], memos)
        topics = [topic if mm is memo else "other" for mm in memos]
        assert got == [index_key_hash(f"{t}#{k}") for t, k in zip(topics, keys)], (topic, keys)
        shared.append(len(set(k[:-4] for k in keys)) == 1 and len(keys[0]) > 4 and len(set(map(id, memos))) == 1)
    assert 200 < sum(shared) < 600         # both paths ran
    assert _key_hashes([], []) == []



def test_file_name_is_javas_human_string():
    name = index_file_name(1_700_000_000_123)
    assert len(name) == 17 and name.endswith("123") and name.isdigit()


def test_message_index_keys_order_and_split():
    assert message_index_keys("T", props("a  b", "U1")) == ["T#U1", "T#a", "T#b"]
    assert message_index_keys("T", "") == []


def test_golden_bytes(tmp_path):
    path = str(tmp_path / "f")
    f = IndexFile.create(path, 4, 8)
    h1 = index_key_hash("T#a")
    f.put_keys([h1], 1000, 5_000)
    f.put_keys([h1], 2000, 7_500)           # same slot: chained, timeDiff 2 s
    f.flush(os.fdatasync)
    f.unmap()
    data = open(path, "rb").read()
    assert len(data) == index_file_size(4, 8) == 40 + 16 + 160
    assert INDEX_HEADER_SIZE == 40
    assert data[:40] == struct.pack(">qqqqii", 5_000, 7_500, 1000, 2000, 1, 3)
    slot = 40 + (h1 % 4) * 4
    assert data[slot:slot + 4] == struct.pack(">i", 2)
    entries = 40 + 16
    assert data[entries:entries + 20] == bytes(20)                       # entry 0: never used
    assert data[entries + 20:entries + 40] == struct.pack(">iqii", h1, 1000, 0, 0)
    assert data[entries + 40:entries + 60] == struct.pack(">iqii", h1, 2000, 2, 1)


def test_collisions_in_one_slot_are_told_apart(tmp_path):
    s = opened(config(tmp_path, max_hash_slot_num=1))      # every key in one slot
    offs = {k: [put(s, keys=k, now=1_000_000 + i) for i in range(3)] for k in ("a", "b", "c")}
    for k, o in offs.items():
        assert q(s, k) == sorted(o, reverse=True)
    assert q(s, "d") == []
    assert q(s, "a", topic="Other") == []
    s.close()


def test_hash_collision_of_different_keys_is_filtered(tmp_path):
    # "Aa" and "BB" have the same Java hashCode, so "T#Aa" and "T#BB" too
    assert index_key_hash("T#Aa") == index_key_hash("T#BB")
    s = opened(config(tmp_path))
    a = put(s, keys="Aa")
    b = put(s, keys="BB")
    assert q(s, "Aa") == [a] and q(s, "BB") == [b]
    s.close()


def test_unique_key_and_keys_and_max_num(tmp_path):
    s = opened(config(tmp_path, max_msgs_num_batch=5))
    o = [put(s, keys="k other", uniq=f"U{i}", now=1_000_000 + i) for i in range(8)]
    assert q(s, "U3") == [o[3]]
    assert q(s, "other", max_num=3) == o[::-1][:3]
    assert q(s, "k") == o[::-1][:5]                  # capped at maxMsgsNumBatch
    assert q(s, "k", max_num=0) == []
    s.close()


def test_transaction_halves_are_not_indexed(tmp_path):
    s = opened(config(tmp_path))
    put(s, keys="k", sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE)
    put(s, keys="k", sys_flag=MessageSysFlag.TRANSACTION_ROLLBACK_TYPE)
    c = put(s, keys="k", sys_flag=MessageSysFlag.TRANSACTION_COMMIT_TYPE)
    assert q(s, "k") == [c]
    s.close()


def test_time_range_filter_is_exact(tmp_path):
    s = opened(config(tmp_path))
    o = {ts: put(s, keys="k", now=ts) for ts in (1_000_000, 1_000_400, 1_001_500, 1_005_000)}
    assert q(s, "k", begin=1_000_400, end=1_001_500) == [o[1_001_500], o[1_000_400]]
    assert q(s, "k", begin=1_000_401, end=1_001_499) == []
    assert q(s, "k", end=999_999) == []
    assert q(s, "k", begin=1_005_000) == [o[1_005_000]]
    res = s.query_message("T", "k", 64, *ALL)
    assert (res.index_last_update_timestamp, res.index_last_update_phyoffset) == (1_005_000, o[1_005_000])
    s.close()


def test_rollover_to_new_files_keeps_every_key(tmp_path):
    cfg = config(tmp_path, max_index_num=6)              # 5 entries per file
    s, offs = filled(cfg, 12, step=10, uniq=True)        # 24 entries
    s.flush_consume_queues()
    files = sorted(os.listdir(cfg.index_dir))
    assert len(files) == 5 and all(len(n) == 17 for n in files)
    assert q(s, "k") == offs[::-1]
    assert all(q(s, f"U{i}") == [o] for i, o in enumerate(offs))
    s.close()
    s = opened(cfg)                                      # and after a clean restart
    assert q(s, "k") == offs[::-1]
    assert sorted(os.listdir(cfg.index_dir)) == files
    s.close()


def test_bounded_open_mappings(tmp_path):
    cfg = config(tmp_path, max_index_num=3)
    s, offs = filled(cfg, 40)
    assert q(s, "k") == offs[::-1][:64]
    idx = s._index
    mapped = [f for f in idx.files if f.mm is not None]
    assert len(idx.files) == 20 and len(mapped) <= idx._max_open + 1
    s.close()


def test_build_batch_bounds_each_catch_up(tmp_path):
    cfg = config(tmp_path, index_build_batch=4, max_index_num=1000)
    s, offs = filled(cfg, 10)
    assert q(s, "k") == offs[:4][::-1]                  # a query indexes at most 4 more records
    res = s.query_message("T", "k", 64, *ALL)
    assert res.offsets == offs[:8][::-1] and res.index_last_update_phyoffset == offs[7]
    s.flush_consume_queues()                             # and so does each flush
    assert q(s, "k") == offs[::-1]
    s.close()
    s = opened(cfg)                                      # open indexes everything missing
    more = [put(s, keys="k", now=2_000_000 + i) for i in range(6)]
    s.abandon()
    s = opened(cfg)
    assert s.query_message("T", "k", 64, *ALL).offsets == (offs + more)[::-1]
    s.close()


def test_disabled_index(tmp_path):
    cfg = config(tmp_path, message_index_enable=False)
    s = opened(cfg)
    put(s, keys="k")
    assert q(s, "k") == []
    assert not os.path.exists(cfg.index_dir)
    s.close()


# ---------------------------------------------------------------- recovery


def test_index_rebuilt_after_crash(tmp_path):
    cfg = config(tmp_path, max_index_num=8)
    s, a = filled(cfg, 5)
    s.flush()
    s.flush_consume_queues()
    ck = read_checkpoint(cfg.checkpoint_path)
    assert ck.index_msg_timestamp == 1_000_004
    b = [put(s, keys="k", now=2_000_000 + i) for i in range(9)]
    s.flush()
    s.abandon()                                          # SIGKILL: no index flush, no checkpoint
    s = opened(cfg)
    assert q(s, "k") == (a + b)[::-1]
    s.close()


def test_index_directory_deleted_is_rebuilt(tmp_path, caplog):
    cfg = config(tmp_path)
    s, a = filled(cfg, 5)
    s.close()
    with caplog.at_level("INFO", logger="pocketmq.store"):
        s = opened(cfg)                  # a clean restart: the last record walked again, nothing added
    assert "index rebuilt" not in caplog.text
    s.close()
    for n in os.listdir(cfg.index_dir):
        os.unlink(os.path.join(cfg.index_dir, n))
    caplog.clear()
    with caplog.at_level("INFO", logger="pocketmq.store"):
        s = opened(cfg)
    assert "index rebuilt from offset 0: 5 records walked, 5 keys added" in caplog.text
    assert q(s, "k") == a[::-1]
    s.close()


def test_index_catch_up_over_keyless_records_is_logged(tmp_path, caplog):
    cfg = config(tmp_path)
    s = opened(cfg)
    for i in range(5):
        put(s, now=1_000_000 + i)                        # no KEYS, no UNIQ_KEY
    s.close()
    for n in os.listdir(cfg.index_dir):
        os.unlink(os.path.join(cfg.index_dir, n))
    with caplog.at_level("INFO", logger="pocketmq.store"):
        s = opened(cfg)
    assert "index rebuilt from offset 0: 5 records walked, 0 keys added" in caplog.text
    s.close()


@pytest.mark.parametrize("damage", ["zero_tail", "garbage_header", "short_file", "foreign_name"])
def test_torn_index_file_on_recovery(tmp_path, damage):
    cfg = config(tmp_path, max_index_num=8)
    s, a = filled(cfg, 10, step=1000, uniq=True)
    s.flush()
    s.flush_consume_queues()
    s.abandon()
    last = sorted(os.listdir(cfg.index_dir))[-1]
    path = os.path.join(cfg.index_dir, last)
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        if damage == "zero_tail":
            fh.seek(size - 8 * 20)
            fh.write(bytes(8 * 20))
            fh.seek(40)
            fh.write(bytes(cfg.max_hash_slot_num * 4))   # slots lost too
        elif damage == "garbage_header":
            fh.write(struct.pack(">qqqqii", 5, 1, 9, 2, -3, 10 ** 9))
        elif damage == "short_file":
            fh.truncate(size - 7)
    if damage == "foreign_name":
        open(os.path.join(cfg.index_dir, "notes.txt"), "w").write("x")
    if damage == "zero_tail":
        # torn after the checkpoint: the file's header claims a later time than the checkpoint
        with open(path, "r+b") as fh:
            fh.seek(8)
            fh.write(struct.pack(">q", 9_999_999))
    s = opened(cfg)
    assert q(s, "k") == a[::-1]
    assert all(q(s, f"U{i}") == [o] for i, o in enumerate(a))
    s.close()


def test_index_entries_past_a_truncated_log_are_dropped(tmp_path):
    cfg = config(tmp_path)
    s, a = filled(cfg, 2)
    s.flush()
    s.flush_consume_queues()
    # two more records, indexed (and the index flushed) but never flushed in the commit log:
    # the checkpoint's flushed offset stays at the cut, where recovery starts checking
    a += [put(s, keys="k", now=1_000_002 + i) for i in range(2)]
    s.flush_consume_queues()
    assert q(s, "k") == a[::-1]
    cut = a[2]
    s.abandon()
    seg = os.path.join(cfg.commit_log_dir, sorted(os.listdir(cfg.commit_log_dir))[0])
    with open(seg, "r+b") as fh:                         # the last two records never reached disk
        fh.seek(cut)
        fh.write(bytes(cfg.mapped_file_size_commit_log - cut))
    s = opened(cfg)
    assert s.commit_log_max_offset == cut
    assert q(s, "k") == a[:2][::-1]
    b = put(s, keys="k", now=3_000_000)                  # reuses the cut offset
    assert b == cut and q(s, "k") == [b] + a[:2][::-1]
    s.close()


# ---------------------------------------------------------------- against the reference model


@pytest.mark.parametrize("seed", range(4))
def test_file_store_matches_memory_store(tmp_path, seed):
    rnd = random.Random(seed)
    cfg = config(tmp_path, max_index_num=rnd.choice([4, 9, 50]), max_hash_slot_num=rnd.choice([1, 3, 64]),
                 mapped_file_size_commit_log=4096, max_msgs_num_batch=rnd.choice([3, 64]))
    fs, ms = opened(cfg), opened(cfg, MemoryStore)
    now = 1_000_000
    keys = ["a", "b", "c", "a b", "", "b c"]
    for step in range(300):
        op = rnd.random()
        if op < 0.75:
            now += rnd.choice([0, 1, 400, 999, 1000, 2500])
            k = rnd.choice(keys)
            topic = rnd.choice(["T", "T", "U"])
            tran = rnd.choice([0, 0, 0, MessageSysFlag.TRANSACTION_PREPARED_TYPE])
            m = MessageToStore(topic, 0, 0, b"x" * rnd.randint(0, 300),
                               props(k or None, f"U{step}" if rnd.random() < 0.7 else None), tran, now, HOST, now)
            assert fs.put_message(m).wrote_offset == ms.put_message(m).wrote_offset
        elif op < 0.9:
            key = rnd.choice(["a", "b", "c", f"U{rnd.randint(0, step + 1)}"])
            topic = rnd.choice(["T", "U"])
            lo = rnd.choice([0, now - 3000, now - 999])
            hi = rnd.choice([1 << 62, now - 1000, now])
            mx = rnd.choice([1, 2, 64])
            assert fs.query_message(topic, key, mx, lo, hi).offsets == ms.query_message(topic, key, mx, lo, hi).offsets
        elif op < 0.93:
            fs.flush()
            fs.flush_consume_queues()
        elif op < 0.95:
            assert fs.clean_expired_files(now, force=True) == ms.clean_expired_files(now, force=True)
        else:
            fs.flush()
            fs.abandon() if rnd.random() < 0.5 else fs.close()
            fs = opened(cfg)
    for key in ("a", "b", "c"):
        for topic in ("T", "U"):
            assert fs.query_message(topic, key, 64, *ALL).offsets == ms.query_message(topic, key, 64, *ALL).offsets
    fs.close()


@pytest.mark.parametrize("seed", range(4))
def test_put_entries_writes_what_put_key_writes(tmp_path, seed):
    # _put_entries' column-wise entries (offsets split into words by stride, one store time
    # taken once for a chunk) against Java's putKey one key at a time (_put_key): offsets
    # on both sides of 4 GiB and far past it, store times equal, rising, going back
    # before the file's first (clamped to 0) and 68 years on (clamped to MAX_INT)
    from pocketmq.broker.store.index import _put_entries, _put_key
    rnd = random.Random(seed)
    a = IndexFile.create(str(tmp_path / "a"), 13, 400)
    b = IndexFile.create(str(tmp_path / "b"), 13, 400)
    phy = (1 << 32) - 5_000
    ts = 1_700_000_000_000
    while a.index_count + 70 < a.index_num:
        m = rnd.choice([1, 2, 5, 32, 64])
        hashes = [rnd.randrange(1 << 31) for _ in range(m)]
        phys, tss = [], []
        for _ in range(m):
            phy += rnd.choice([180, 200, 1 << 20, 1 << 33])
            phys.append(phy)
        kind = rnd.random()
        if kind < 0.4:
            tss = [ts] * m                                   # one store time
        elif kind < 0.7:
            tss = [ts + 700 * j for j in range(m)]           # rising
        elif kind < 0.85:
            tss = [ts - rnd.choice([0, 5_000, 10 ** 6]) for _ in range(m)]   # back before the first
        else:
            tss = [ts + rnd.choice([0, 1 << 45]) for _ in range(m)]          # past MAX_INT seconds
        ts += rnd.choice([0, 1, 999, 1000, 60_000])
        _put_entries(a, hashes, phys, tss)
        for h, p, t in zip(hashes, phys, tss):
            _put_key(b, h, p, t)
    a.flush(os.fdatasync)
    b.flush(os.fdatasync)
    assert a.index_count == b.index_count > 300
    assert bytes(a.mm) == bytes(b.mm)
