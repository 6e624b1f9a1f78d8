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


def one_layout_props(rnd: random.Random, i: int) -> str:
    """Mostly one producer's texts (one layout, an ASCII UNIQ_KEY, no KEYS value: the index's
    column-wise path), now and then a text that takes another of its paths."""
    uniq = f"C0A8000A1F2E5A3B9C4D{i // 8:08X}{i & 0xFFFF:04X}"
    r = rnd.random()
    if r < 0.75:
        return f"WAIT\x01true\x02UNIQ_KEY\x01{uniq}"
    if r < 0.80:
        return f"KEYS\x01\x02UNIQ_KEY\x01{uniq}"                   # an empty KEYS: still one key
    if r < 0.83:
        return f"UNIQ_KEY\x01{uniq}\x02WAIT\x01true"               # another layout, same keys
    if r < 0.86:
        return "WAIT\x01true\x02UNIQ_KEY\x01"                     # an empty UNIQ_KEY: no key
    if r < 0.88:
        return f"WAIT\x01true\x02UNIQ_KEY\x01{uniq}\x02UNIQ_KEY\x01"  # the later, empty one wins
    if r < 0.90:
        return f"WAIT\x01true\x02UNIQ_KEY\x01ÉTÉ{i}"               # non-ASCII
    if r < 0.92:
        return f"WAIT\x01true\x02UNIQ_KEY\x01{uniq[:1]}"            # one byte
    if r < 0.94:
        return f"KEYS\x01order-{i} a\x02UNIQ_KEY\x01{uniq}"          # KEYS words too
    if r < 0.96:
        return ""                                                   # no properties
    if r < 0.98:
        return "WAIT\x01true\x02TAGS\x01x"                          # no keys
    return random_props(rnd, i)


def keyed_props(rnd: random.Random, i: int) -> str:
    """Mostly texts with a UNIQ_KEY and one or two single-spaced KEYS words (the index's
    column-wise path for several keys a record), now and then another shape."""
    r = rnd.random()
    if r < 0.85:
        words = " ".join(rnd.choice(WORDS[:5] + WORDS[9:12]) for _ in range(rnd.choice([1, 2])))
        return f"KEYS\x01{words}\x02UNIQ_KEY\x01C0A8000A1F2E5A3B9C4D{i // 8:08X}{i & 0xFFFF:04X}"
    return one_layout_props(rnd, i)


def put_some(s: MessageStore, rnd: random.Random, first: int, count: int, now: int,
             props_of=random_props, topics=("T", "T", "Topic2", "tôpic"), halves=HALVES,
             v6_share: float = 0.1) -> int:
    for i in range(first, first + count):
        topic = rnd.choice(topics)
        now += rnd.choice([0, 1, 7, 999, 1000, 2500, -1500])
        host = HOST6 if rnd.random() < v6_share else HOST4
        body = bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 5, 128, 900])))
        r = s.put_message(MessageToStore(topic, i % 3, 0, body, props_of(rnd, i), rnd.choice(halves),
                                         now - 5, host, now))
        assert r.wrote_offset >= 0, r
    return now


def snapshot(cfg: StoreConfig) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(cfg.index_dir)):
        with open(os.path.join(cfg.index_dir, name), "rb") as fh:
            out[name] = fh.read()
    return out


def scenario(root, seed: int, count_max: int = 40, **shape) -> list[dict[str, bytes]]:
    """Puts, bounded flushes and queries, a crash, a rebuild, a deleted index: the index
    files after each step. `shape`: put_some's choice of records."""
    rnd = random.Random(seed)
    cfg = config(root, **({"max_index_num": 60} if count_max > 40 else {}))
    shots = []
    s = MessageStore(cfg)
    s.open()
    now = 1_700_000_000_000
    i = 0
    for _step in range(6):
        count = rnd.randint(1, count_max)
        now = put_some(s, rnd, i, count, now, **shape)
        i += count
        if rnd.random() < 0.5:
            s.query_message("T", "k", 64, 0, 1 << 62)     # a query catches up too (bounded)
        s.flush_consume_queues()
        shots.append(snapshot(cfg))
    now = put_some(s, rnd, i, 30, now, **shape)
    i += 30
    s.flush()
    s.abandon()                                           # a crash: the last index work is lost
    s = MessageStore(cfg)
    s.open()                                              # recovery drops and rebuilds
    shots.append(snapshot(cfg))
    now = put_some(s, rnd, i, 25, now, **shape)
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


ONE_LAYOUT = dict(props_of=one_layout_props, topics=("T",) * 12 + ("Topic2", "tôpic"), halves=[0] * 30 + HALVES,
                  v6_share=0.02)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("chunk", [5, 64])
@pytest.mark.parametrize("props_of", [one_layout_props, keyed_props])
def test_runs_of_one_layout_write_the_plain_builders_bytes(tmp_path, monkeypatch, seed, chunk, props_of):
    # long runs of the common record (_run_keys' column-wise paths), broken now and then by a
    # record of another layout, another topic, a half, an IPv6 host, another key shape
    monkeypatch.setattr(index_mod, "GIL_YIELD_EVERY", chunk)
    shape = dict(ONE_LAYOUT, props_of=props_of)
    fast = scenario(tmp_path / "fast", seed, count_max=150, **shape)
    with monkeypatch.context() as m:
        m.setattr(MessageStore, "_index_catch_up", reference_catch_up)
        plain = scenario(tmp_path / "plain", seed, count_max=150, **shape)
    assert fast == plain
    assert len(fast[-1]) > 3


UNIQ = "C0A8000A1F2E5A3B9C4D000000"


@pytest.mark.parametrize("texts,key", [
    # every text has two properties and the run as many UNIQ_KEYs as texts, but one text
    # holds two and another none: the second property is not a UNIQ_KEY in every text
    (["WAIT\x01true\x02UNIQ_KEY\x01%s0%d" % (UNIQ, i) for i in range(10)]
     + ["UNIQ_KEY\x01AAAA\x02UNIQ_KEY\x01BBBB", "WAIT\x01true\x02TAGS\x01a-long-tag"]
     + ["WAIT\x01true\x02UNIQ_KEY\x01%s1%d" % (UNIQ, i) for i in range(10)], "BBBB"),
    # the same with KEYS: one text holds two KEYS (the later wins), another none
    (["KEYS\x01w%d v\x02TAGS\x01t\x02UNIQ_KEY\x01%s0%d" % (i, UNIQ, i) for i in range(10)]
     + ["KEYS\x01first\x02KEYS\x01BBBB\x02UNIQ_KEY\x01%s20" % UNIQ,
        "TAGS\x01t\x02TAGS\x01a-long-tag\x02UNIQ_KEY\x01%s21" % UNIQ]
     + ["KEYS\x01w%d v\x02TAGS\x01t\x02UNIQ_KEY\x01%s1%d" % (i, UNIQ, i) for i in range(10)], "BBBB"),
])
def test_a_run_whose_keys_only_add_up_is_not_taken_as_one_layout(tmp_path, monkeypatch, texts, key):

    def run(root, builder):
        s = MessageStore(config(root, max_index_num=100, index_build_batch=0))
        s.open()
        with monkeypatch.context() as m:
            if builder is not None:
                m.setattr(MessageStore, "_index_catch_up", builder)
            put_some(s, random.Random(1), 0, len(texts), 1_700_000_000_000, props_of=lambda _rnd, i: texts[i],
                     topics=("T",), halves=[0], v6_share=0)
            s.flush_consume_queues()
            shot = snapshot(s.config)
            found = s.query_message("T", key, 64, 0, 1 << 62).offsets
        s.close()
        return shot, found
    fast, plain = run(tmp_path / "fast", None), run(tmp_path / "plain", reference_catch_up)
    assert fast == plain
    assert len(fast[1]) == 1                            # the later value of the text with two


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


@pytest.mark.parametrize("texts", [
    ["WAIT\x01true\x02UNIQ_KEY\x01%s%04d" % (UNIQ, i) for i in range(40)],                  # one producer's messages
    ["KEYS\x01order-%d x\x02UNIQ_KEY\x01%s%04d" % (i, UNIQ, i) for i in range(40)],          # with KEYS words
])
def test_runs_of_one_layout_take_the_split_not_the_regex(tmp_path, monkeypatch, texts):
    # the column-wise path is what makes the common case cheap: pin that it is taken (the
    # regex runs for no record of such a run) and that it finds every key
    s = MessageStore(config(tmp_path, max_index_num=200, index_build_batch=0))
    s.open()
    try:
        put_some(s, random.Random(2), 0, len(texts), 1_700_000_000_000, props_of=lambda _rnd, i: texts[i],
                 topics=("T",), halves=[0], v6_share=0)

        def no_regex(_props):
            raise AssertionError("the regex ran on a run of one layout")
        monkeypatch.setattr(index_mod, "_find_key_props", no_regex)
        s.flush_consume_queues()
        monkeypatch.undo()
        assert s.index_backlog_bytes() == 0
        for i in (0, 17, 39):
            assert len(s.query_message("T", "%s%04d" % (UNIQ, i), 64, 0, 1 << 62).offsets) == 1
        if "KEYS" in texts[0]:
            assert len(s.query_message("T", "x", 64, 0, 1 << 62).offsets) == len(texts)
    finally:
        s.close()
