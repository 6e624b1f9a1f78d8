"""The index's few-records path (broker/store/index.py `_index_few`, `_put_key`): a catch-up
over a few records (the IndexPump's step after each dispatch under sync sends) indexes them
one record and one key at a time instead of through the walk's column-wise machinery.
Pinned to the plain builder (tests/support/index_reference.py): the same puts and steps
must leave byte-identical index files, whatever the records (KEYS words, non-ASCII and
one-byte keys, IPv6 hosts and transaction halves, which the path leaves to the walk),
the files (rolling over mid-record, slots shared within one record, store times going
back) and the steps (1 to 32 records, a step bounded below the records waiting). Plus:
when it declines, it has changed nothing."""
from __future__ import annotations

import random

import pytest

from pocketmq.broker.store import index as index_mod
from pocketmq.broker.store.api import MessageToStore
from pocketmq.broker.store.store import MessageStore
from tests.support.index_reference import reference_catch_up
from tests.unit.test_index_fast import (HALVES, HOST4, HOST6, config, keyed_props, one_layout_props,
                                        random_props, snapshot)


def run(root, seed: int, props_of, **cfg_kw) -> list[dict[str, bytes]]:
    """Puts of one to three records, each followed by a few index steps, now and then a
    flush pass; the index files after every tenth round and at the end."""
    rnd = random.Random(seed)
    cfg = config(root, **cfg_kw)
    s = MessageStore(cfg)
    s.open()
    shots = []
    now = 1_700_000_000_000
    i = 0
    try:
        for rnd_no in range(120):
            for _ in range(rnd.choice([1, 1, 1, 2, 3])):
                now += rnd.choice([0, 1, 7, 999, 1000, 2500, -1500])
                host = HOST6 if rnd.random() < 0.05 else HOST4
                body = b"b" * rnd.choice([0, 5, 128, 300])
                r = s.put_message(MessageToStore(rnd.choice(["T", "T", "T", "Topic2", "tôpic"]), i % 3, 0, body,
                                                 props_of(rnd, i), rnd.choice(HALVES if rnd.random() < 0.1 else [0]),
                                                 now - 5, host, now))
                assert r.wrote_offset >= 0, r
                i += 1
            for step in [rnd.choice([1, 2, 8, 32]) for _ in range(rnd.randint(1, 2))]:
                s.index_some(step)
            if rnd.random() < 0.05:
                s.flush_consume_queues()
            if rnd_no % 10 == 9:
                shots.append(snapshot(cfg))
        s._index_catch_up()
        shots.append(snapshot(cfg))
    finally:
        s.close()
    return shots


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("props_of", [random_props, one_layout_props, keyed_props])
@pytest.mark.parametrize("geometry", [dict(max_hash_slot_num=7, max_index_num=10),
                                      dict(max_hash_slot_num=2, max_index_num=500),
                                      dict(max_hash_slot_num=5003, max_index_num=40)])
def test_few_records_path_writes_the_plain_builders_bytes(tmp_path, monkeypatch, seed, props_of, geometry):
    taken = []
    real = index_mod._index_few
    monkeypatch.setattr(index_mod, "_index_few", lambda *a: taken.append(real(*a)) or taken[-1])
    few = run(tmp_path / "few", seed, props_of, **geometry)
    with monkeypatch.context() as m:
        m.setattr(MessageStore, "_index_catch_up", reference_catch_up)
        plain = run(tmp_path / "plain", seed, props_of, **geometry)
    assert [sorted(s) for s in few] == [sorted(s) for s in plain]       # the same file names
    for a, b in zip(few, plain):
        for name in a:
            assert a[name] == b[name], name
    used = [n for n in taken if n is not None]
    assert len(used) > 60, "the few-records path was hardly taken"
    assert None in taken, "no declined step: IPv6 hosts and halves should go to the walk"
    if geometry["max_index_num"] == 10:
        assert len(few[-1]) > 3                                          # files rolled over


def few_and_plain(tmp_path, monkeypatch, body) -> list[dict[str, bytes]]:
    """body(store, few) on a store indexed by this code (few=True) and on one indexed by the
    plain builder; the index files of each."""
    shots = []
    for name, catch_up in (("few", None), ("plain", reference_catch_up)):
        with monkeypatch.context() as m:
            if catch_up:
                m.setattr(MessageStore, "_index_catch_up", catch_up)
            s = MessageStore(config(tmp_path / name, max_hash_slot_num=3, max_index_num=50))
            s.open()
            try:
                body(s, catch_up is None)
                shots.append(snapshot(s.config))
            finally:
                s.close()
    return shots


def test_a_damaged_slot_is_read_as_the_walk_reads_it(tmp_path, monkeypatch):
    # a slot pointing ahead of the entries, or negative as a Java int: no chain (0)
    def body(s, few):
        for i in range(4):
            s.put_message(MessageToStore("T", 0, 0, b"x", f"UNIQ_KEY\x01U{i}", 0, 1, HOST4, 1000 + i))
            s.index_some(1)
        f = s._index.files[-1]
        f.mm[index_mod.INDEX_HEADER_SIZE:index_mod.INDEX_HEADER_SIZE + 8] = \
            (40).to_bytes(4, "big") + (0xFFFFFFF0).to_bytes(4, "big")
        for i in range(4, 12):
            s.put_message(MessageToStore("T", 0, 0, b"x", f"KEYS\x01a{i} b{i}\x02UNIQ_KEY\x01U{i}", 0, 1,
                                         HOST4, 1000 + i))
            s.index_some(1)
    shots = few_and_plain(tmp_path, monkeypatch, body)
    assert shots[0] == shots[1]


def _declines_unchanged(s: MessageStore, max_records: int = index_mod.FEW_RECORDS_MAX) -> None:
    svc = s._index
    before = (s._index_from, snapshot(s.config), svc.keys_added)
    with svc.lock:
        got = index_mod._index_few(s, svc, s._commitlog.queue.find, s._index_from, s._reput_from, max_records,
                                   s._index_hashers, s._index_hints)
    assert got is None
    assert (s._index_from, snapshot(s.config), svc.keys_added) == before


@pytest.mark.parametrize("case", ["ipv6", "half", "too_many", "bounded"])
def test_the_path_declines_without_changing_anything(tmp_path, case):
    s = MessageStore(config(tmp_path / "s", max_index_num=100))
    s.open()
    try:
        s.put_message(MessageToStore("T", 0, 0, b"x", "UNIQ_KEY\x01U0", 0, 1, HOST4, 1000))
        s.index_some(1)
        count = {"too_many": index_mod.FEW_RECORDS_MAX + 1, "bounded": 3}.get(case, 1)
        for i in range(count):
            host = HOST6 if case == "ipv6" else HOST4
            flag = HALVES[3] if case == "half" else 0
            s.put_message(MessageToStore("T", 0, 0, b"x", f"UNIQ_KEY\x01U{i + 1}", flag, 1, host, 1001 + i))
        _declines_unchanged(s, 2 if case == "bounded" else index_mod.FEW_RECORDS_MAX)
        assert s.index_some(32) == count                    # the walk takes them
        assert s.index_backlog_bytes() == 0
    finally:
        s.close()


def test_a_few_records_across_two_segments_go_to_the_walk(tmp_path):
    s = MessageStore(config(tmp_path / "s", mapped_file_size_commit_log=4096, max_index_num=100))
    s.open()
    try:
        i = 0
        while s._commitlog.queue.find(s._reput_from) is s._commitlog.queue.find(0):
            s.put_message(MessageToStore("T", 0, 0, b"y" * 200, f"UNIQ_KEY\x01U{i}", 0, 1, HOST4, 1000 + i))
            i += 1
            if s._commitlog.queue.find(s._reput_from) is s._commitlog.queue.find(0):
                s.index_some(32)
        # the last put rolled the segment: what waits now spans the blank at the first's end
        assert s.index_backlog_bytes() > 0
        _declines_unchanged(s)
        s.index_some(32)
        assert s.index_backlog_bytes() == 0
        assert s.query_message("T", f"U{i - 1}", 4, 0, 1 << 62).offsets
    finally:
        s.close()


def test_edges_the_random_mixes_miss(tmp_path, monkeypatch):
    # keys whose hash is Integer.MIN_VALUE (Java's abs() leaves it negative: 0), a damaged
    # slot pointing at the entry about to be written, a store time 70 years after the
    # file's first (timeDiff clamped); and every file written is left to the flush
    assert index_mod.index_key_hash("T#jllgx0D") == 0

    def body(s, few):
        t = 1_700_000_000_000
        for i, key in enumerate(["jllgx0D", "a", "jllgx0D"]):
            s.put_message(MessageToStore("T", 0, 0, b"x", f"UNIQ_KEY\x01{key}", 0, 1, HOST4, t + i))
            s.index_some(1)
        f = s._index.files[-1]
        slot = index_mod.INDEX_HEADER_SIZE + (index_mod.index_key_hash("T#b") % 3) * 4
        f.mm[slot:slot + 4] = f.index_count.to_bytes(4, "big")      # = the next entry's number
        s.put_message(MessageToStore("T", 0, 0, b"x", "UNIQ_KEY\x01b", 0, 1, HOST4, t + 5))
        s.index_some(1)
        s.put_message(MessageToStore("T", 0, 0, b"x", "UNIQ_KEY\x01late", 0, 1, HOST4, t + 70 * 366 * 86_400_000))
        s.index_some(1)
        if few:
            assert s._index._dirty == [f]             # the flush syncs what the path wrote
    shots = few_and_plain(tmp_path, monkeypatch, body)
    assert shots[0] == shots[1]
