"""The index's batch builder (broker/store/index.py `_index_records`) against the plain
one it replaced (tests/support/index_reference.py): the same scenarios run once with each
must leave byte-identical index files — multi-file roll-over (a record's keys split
across two files), keys with spaces, non-ASCII keys and topics, one-byte and very long
keys, repeated property names, transaction halves, IPv6 hosts, store times going back,
several commit-log segments, bounded catch-ups, a crash and the rebuild after it, a
deleted index directory."""
from __future__ import annotations

import os
import random

import pytest

from pocketmq.broker.store import index as index_mod
from pocketmq.broker.store.api import MessageToStore
from pocketmq.broker.store.index import _raw_keys
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.protocol.message import MessageSysFlag
from tests.support.index_reference import reference_catch_up, reference_raw_keys

HOST4 = (bytes([10, 0, 0, 7]), 40000)
HOST6 = (bytes(range(1, 17)), 40001)
STORE_HOST = (bytes([10, 0, 0, 1]), 10911)
HALVES = [0, 0, 0, MessageSysFlag.TRANSACTION_PREPARED_TYPE, MessageSysFlag.TRANSACTION_ROLLBACK_TYPE,
          MessageSysFlag.TRANSACTION_COMMIT_TYPE]
WORDS = ["a", "b", "k", "order-1", "order-12345", "ORDER_ÉTÉ", "中文", "é", "x" * 300, "A1B2C3D4E5F6",
         "C0A8000A1F2E5A3B9C4D00012340", "polygenelubricants", "\x01in"]


def config(root, **kw) -> StoreConfig:
    base = dict(mapped_file_size_commit_log=16 * 1024, mapped_file_size_consume_queue=20 * 64,
                store_host=STORE_HOST, total_physical_memory_bytes=1 << 34,
                max_hash_slot_num=7, max_index_num=10, message_index_enable=True, index_build_batch=5)
    base.update(kw)
    return StoreConfig(str(root), **base)


def random_props(rnd: random.Random, i: int) -> str:
    parts = []
    if rnd.random() < 0.3:
        parts.append("TAGS\x01tag")
    if rnd.random() < 0.8:
        n = rnd.choice([1, 1, 2, 3])
        sep = rnd.choice([" ", " ", "  "])
        words = sep.join(rnd.choice(WORDS) for _ in range(n))
        if rnd.random() < 0.1:
            words = " " + words + " "
        parts.append(f"KEYS\x01{words}")
    if rnd.random() < 0.7:
        parts.append(f"UNIQ_KEY\x01C0A8000A1F2E5A3B9C4D{i // 8:08X}{i & 0xFFFF:04X}")
    if rnd.random() < 0.05:
        parts.append("KEYS\x01")                     # a later empty value wins: no KEYS
    if rnd.random() < 0.05:
        parts.append(f"KEYS\x01again-{i}")           # a later value wins
    rnd.shuffle(parts)
    return "\x02".join(parts)


def put_some(s: MessageStore, rnd: random.Random, first: int, count: int, now: int) -> int:
    for i in range(first, first + count):
        topic = rnd.choice(["T", "T", "Topic2", "tôpic"])
        now += rnd.choice([0, 1, 7, 999, 1000, 2500, -1500])
        host = HOST6 if rnd.random() < 0.1 else HOST4
        body = bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 5, 128, 900])))
        r = s.put_message(MessageToStore(topic, i % 3, 0, body, random_props(rnd, i), rnd.choice(HALVES),
                                         now - 5, host, now))
        assert r.wrote_offset >= 0, r
    return now


def snapshot(cfg: StoreConfig) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(cfg.index_dir)):
        with open(os.path.join(cfg.index_dir, name), "rb") as fh:
            out[name] = fh.read()
    return out


def scenario(root, seed: int) -> list[dict[str, bytes]]:
    """Puts, bounded flushes and queries, a crash, a rebuild, a deleted index: the index
    files after each step."""
    rnd = random.Random(seed)
    cfg = config(root)
    shots = []
    s = MessageStore(cfg)
    s.open()
    now = 1_700_000_000_000
    i = 0
    for _step in range(6):
        count = rnd.randint(1, 40)
        now = put_some(s, rnd, i, count, now)
        i += count
        if rnd.random() < 0.5:
            s.query_message("T", "k", 64, 0, 1 << 62)     # a query catches up too (bounded)
        s.flush_consume_queues()
        shots.append(snapshot(cfg))
    now = put_some(s, rnd, i, 30, now)
    i += 30
    s.flush()
    s.abandon()                                           # a crash: the last index work is lost
    s = MessageStore(cfg)
    s.open()                                              # recovery drops and rebuilds
    shots.append(snapshot(cfg))
    now = put_some(s, rnd, i, 25, now)
    i += 25
    s.close()
    shots.append(snapshot(cfg))
    for name in os.listdir(cfg.index_dir):
        os.unlink(os.path.join(cfg.index_dir, name))
    s = MessageStore(cfg)
    s.open()                                              # the whole index from the commit log
    shots.append(snapshot(cfg))
    s.close()
    return shots


@pytest.mark.parametrize("seed", range(6))
def test_batch_builder_writes_the_plain_builders_bytes(tmp_path, monkeypatch, seed):
    fast = scenario(tmp_path / "fast", seed)
    with monkeypatch.context() as m:
        m.setattr(MessageStore, "_index_catch_up", reference_catch_up)
        plain = scenario(tmp_path / "plain", seed)
    assert [sorted(s) for s in fast] == [sorted(s) for s in plain]       # the same file names
    for a, b in zip(fast, plain):
        for name in a:
            assert a[name] == b[name], name
    assert len(fast[-1]) > 3                                              # several files rolled over


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_chunk_size_does_not_change_the_bytes(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(index_mod, "GIL_YIELD_EVERY", 64)
    want = scenario(tmp_path / "base", 11)
    monkeypatch.setattr(index_mod, "GIL_YIELD_EVERY", chunk)
    assert scenario(tmp_path / "other", 11) == want


def test_java_geometry_one_file(tmp_path, monkeypatch):
    # Java's slot count (few collisions: the bulk path) on a few thousand records
    def run(root, builder):
        cfg = config(root, max_hash_slot_num=500_000, max_index_num=40_000, index_build_batch=0,
                     mapped_file_size_commit_log=1 << 20)
        s = MessageStore(cfg)
        s.open()
        with monkeypatch.context() as m:
            if builder is not None:
                m.setattr(MessageStore, "_index_catch_up", builder)
            put_some(s, random.Random(3), 0, 3000, 1_700_000_000_000)
            s.flush_consume_queues()
        shot = snapshot(cfg)
        s.close()
        return shot
    assert run(tmp_path / "fast", None) == run(tmp_path / "plain", reference_catch_up)


def test_raw_keys_match_the_property_getters():
    rnd = random.Random(5)
    names = ["KEYS", "UNIQ_KEY", "KEYSX", "XKEYS", "UNIQ_KEYS", "TAGS", "", "KEY"]
    values = ["", "a", "a b", " a  b ", "中 文", "x\x01y", "\x01", "k"]
    for _ in range(5000):
        chunks = []
        for _c in range(rnd.randint(0, 5)):
            r = rnd.random()
            if r < 0.8:
                chunks.append(f"{rnd.choice(names)}\x01{rnd.choice(values)}")
            elif r < 0.9:
                chunks.append(rnd.choice(values))               # no separator: dropped by Java
            else:
                chunks.append("")
        props = "\x02".join(chunks)
        if rnd.random() < 0.1:
            props = "\x02" + props
        if rnd.random() < 0.1:
            props += "\x02"
        b = props.encode()
        assert _raw_keys(b) == reference_raw_keys(b), props


def test_memo_bounds_do_not_change_the_bytes(tmp_path, monkeypatch):
    want = scenario(tmp_path / "base", 12)
    monkeypatch.setattr(index_mod, "_HEAD_HASHES_MAX", 3)      # memos cleared all the time
    monkeypatch.setattr(index_mod, "_TOPIC_MEMOS_MAX", 1)
    assert scenario(tmp_path / "small", 12) == want
