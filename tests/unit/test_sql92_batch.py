"""The SQL92 filter judging many records at once (Expression.match_records, the store's
_get_matching) against the per-record reference (Expression.match_record, the per-unit
loop): the same result for every record and every pull, on the SQL92 table's expressions
and property sets plus fuzzed property texts."""
from __future__ import annotations

import random
import types

import pytest

from pocketmq.broker.core.sql92 import _MEMO_KEY_MAX, _MEMO_MAX, compile_expression
from pocketmq.broker.store.api import MessageToStore
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.protocol.message import (MessageSysFlag, encode_properties, encode_record, properties_at,
                                       properties_at_many, property_getter, property_keys, property_slots,
                                       slot_names_ok, tags_code)

from tests.unit.test_sql92 import EQUIVALENT, TABLE

V6_BORN = MessageSysFlag.BORNHOST_V6_FLAG
V6_BOTH = MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG

EXPRESSIONS = sorted({t for t, _p, _w in TABLE} | {x for pair in EQUIVALENT for x in pair} | {
    "region = 'eu'", "a > 5", "a > 5 AND region = 'eu'",
    "a BETWEEN 3 AND 6 OR TAGS IN ('TagB', 'TagC', 'TagD', 'TagE', 'TagF')",
    "aa = 'x' OR a IS NULL", "NOT (ab <> '\x01')", "a = '' OR a IS NOT NULL", "b AND a > 1",
    "TAGS IS NULL", "a = 'x\x01y' OR aa IN ('1', '')", "a > ab"})

NAMES = ["a", "aa", "ab", "b", "region", "TAGS", "s", "neg", "x"]
VALUES = ["7", "3", "eu", "us", "", "x\x01y", "\x01", "\x03", "\x03\x03", "é", "7.5", "-5", "TRUE", "seven",
          "3000000000", " 7", "a\x01 7", "1", "x"]


def fuzzed_properties(rng: random.Random) -> bytes:
    """A properties text as a client may send it: repeated names (which one wins is the
    decoder's rule), names that are prefixes of others, \\x01 and \\x03 inside values, empty
    values, chunks without \\x01, stray separators, non-ASCII and broken UTF-8."""
    chunks = []
    for _ in range(rng.randrange(0, 7)):
        kind = rng.random()
        if kind < 0.75:
            chunks.append(rng.choice(NAMES).encode() + b"\x01" + rng.choice(VALUES).encode())
        elif kind < 0.85:
            chunks.append(rng.choice([b"", b"a", b"\x01a", b"a\x01", b"\x01"]))
        elif kind < 0.95:
            chunks.append(b"a\x01\xff\xfe" if rng.random() < 0.5 else "région\x01eu".encode())
        else:
            chunks.append(b"UNIQ_KEY\x01" + rng.randbytes(8).hex().encode())
    text = b"\x02".join(chunks)
    if rng.random() < 0.1:
        text += b"\x02"
    return text[:32767]


def property_texts(n: int, seed: int) -> list[bytes]:
    sets = [p for _t, p, _w in TABLE]
    rng = random.Random(seed)
    out = [encode_properties(p).encode() for p in sets]
    out += [fuzzed_properties(rng) for _ in range(n)]
    return out


def records(texts: list[bytes], seed: int, sys_flags=(0,)) -> tuple[bytes, list[int], list[int]]:
    """Records of topic T holding `texts`, back to back; bodies that look like properties."""
    rng = random.Random(seed)
    bodies = [b"", b"a\x017\x02region\x01eu", b"\x02a\x017\x02TAGS\x01TagB\x02", b"x" * 300, rng.randbytes(50)]
    buf, starts, sizes = bytearray(b"\0" * 3), [], []
    for i, t in enumerate(texts):
        flag = sys_flags[i % len(sys_flags)]
        born = (b"\0" * 15 + b"\1", 7) if flag & V6_BORN else (b"\x0a\0\0\7", 7)
        store = (b"\0" * 15 + b"\2", 9) if flag & MessageSysFlag.STOREHOSTADDRESS_V6_FLAG else (b"\x0a\0\0\1", 9)
        r = encode_record("T", 0, 0, bodies[i % len(bodies)], t, flag, 1, born, store, 0, 0, i, len(buf), 2)
        starts.append(len(buf))
        sizes.append(len(r))
        buf += r
    return bytes(buf), starts, sizes


def test_properties_at_many_is_properties_at():
    texts = property_texts(300, 1)
    for flags in [(0,), (0, V6_BORN), (V6_BOTH,)]:
        buf, starts, sizes = records(texts, 2, flags)
        want = [properties_at(buf, p) for p in starts]
        assert properties_at_many(buf, starts, sizes) == want
        assert properties_at_many(memoryview(buf), starts, sizes) == want
        # offsets of a segment that starts at commit-log offset 1000
        assert properties_at_many(buf, [p + 1000 for p in starts], sizes, 1000) == want
        assert properties_at_many(buf, starts[5:9], sizes[5:9]) == want[5:9]
    # a unit size that is not the record's TOTALSIZE: the length fields decide, as properties_at
    buf, starts, sizes = records(texts[:10], 3)
    assert properties_at_many(buf, starts, [s + 1 for s in sizes]) == [properties_at(buf, p) for p in starts]
    assert properties_at_many(buf, [], []) == []


@pytest.mark.parametrize("seed", [4, 5])
def test_property_keys_are_property_getters(seed):
    texts = property_texts(400, seed)
    for names in [["a"], ["aa"], ["a", "ab"], ["region", "TAGS", "a"], ["x"], ["missing"]]:
        getters = [property_getter(n) for n in names]
        want = [tuple(g(t) or b"" for g in getters) for t in texts]
        if len(names) == 1:
            want = [w[0] for w in want]
        assert property_keys(texts, names) == want, names
        # without the texts that hold \x03 or repeat a name: the regex path (same answers)
        clean = [t for t in texts if b"\x03" not in t]
        assert property_keys(clean, names) == [w for w, t in zip(want, texts) if b"\x03" not in t]
    assert property_keys([], ["a"]) == []


def layout_texts(n: int, seed: int, trap_rate: float = 0.12) -> list[bytes]:
    """Texts as one producer sends them (the same properties in the same order, values
    varying), with traps that keep the number of properties: a text where a name repeats
    in place of another property, one missing a name, a name moved to another place,
    values that are \x03 or hold \x01, an empty value."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        props = [("TAGS", rng.choice(["TagA", "TagB"])), ("UNIQ_KEY", rng.randbytes(8).hex()),
                 ("a", rng.choice(["3", "7", "x\x01y", "", "\x03"])), ("region", rng.choice(["eu", "us"])),
                 ("WAIT", "true")]
        trap = rng.random() * 0.12 / trap_rate if trap_rate else 1.0
        if trap < 0.03:
            props[1] = ("a", "9")                   # a twice: the last one counts
        elif trap < 0.06:
            props[2] = ("b", "1")                   # no a
        elif trap < 0.09:
            props[0], props[2] = props[2], props[0]     # a elsewhere
        elif trap < 0.12:
            props[4] = ("\x03", "")                 # a property that looks like the separator
        out.append(b"\x02".join(k.encode() + b"\x01" + v.encode() for k, v in props))
    return out


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_property_slots_read_what_property_getters_read(seed):
    texts = layout_texts(300, seed)
    regular = layout_texts(300, seed + 100, trap_rate=0)
    for names in [["a"], ["a", "TAGS"], ["region", "a", "WAIT"], ["TAGS", "b"]]:
        getters = [property_getter(n) for n in names]
        for batch in [texts[i:i + 46] for i in range(0, len(texts), 46)] + [regular[:50], regular[:1]]:
            keys = property_slots(batch, names)
            if keys is None or not all(slot_names_ok(k, names) for k in keys):
                continue                            # not one layout: the caller reads by name
            for key, text in zip(keys, batch):
                shown = key if len(names) == 1 else b"\x02".join(key)
                assert [g(shown) for g in getters] == [g(text) for g in getters], (names, text, key)
    # texts of one layout take the fast path; a trap in a batch makes it decline or fail the check
    clean = regular[:40]
    assert property_slots(clean, ["a", "TAGS"]) is not None
    moved = clean[:10] + [b"a\x01" + b"1\x02TAGS\x01TagA\x02UNIQ_KEY\x01x\x02region\x01eu\x02WAIT\x01true"]
    keys = property_slots(moved, ["a", "TAGS"])
    assert keys is None or not all(slot_names_ok(k, ["a", "TAGS"]) for k in keys)
    twice = clean[:10] + [b"TAGS\x01TagA\x02a\x019\x02a\x011\x02region\x01eu\x02WAIT\x01true"]
    assert property_slots(twice, ["a", "TAGS"]) is None
    assert property_slots([], ["a", "b"]) == []
    assert property_slots(clean, ["a\x01", "TAGS"]) is None


@pytest.mark.parametrize("text", ["a BETWEEN 3 AND 6 OR TAGS IN ('TagB', 'TagC')", "a > 5 AND region = 'eu'",
                                  "a IS NULL OR b = '1'", "a = 'x\x01y' AND TAGS <> 'TagA'",
                                  "a = '\x03' OR region IS NULL", "WAIT = 'true' AND a IS NOT NULL"])
def test_match_records_on_one_layout_is_match_record(text):
    e = compile_expression(text)
    texts = layout_texts(400, len(text), trap_rate=0.02)    # some pulls without a trap
    buf, starts, sizes = records(texts, 13)
    want = [e.match_record(buf, p) for p in starts]
    for step in (46, 7, 400):
        for _ in range(2):                          # the second time from the table
            got = []
            for i in range(0, len(starts), step):
                got += e.match_records(buf, starts[i:i + step], sizes[i:i + step])
            assert got == want, step
    # the one-layout path was taken (b is no property of the layout: never in every text)
    assert bool(e._memos[True]) is ("b" not in e.names)


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_match_records_is_match_record(text):
    e = compile_expression(text)
    texts = property_texts(250, hash(text) & 0xFFFF)
    for flags in [(0,), (0, V6_BOTH)]:
        buf, starts, sizes = records(texts, 7, flags)
        want = [e.match_record(buf, p) for p in starts]
        # twice: the second call answers from the results table
        assert e.match_records(buf, starts, sizes) == want
        assert e.match_records(buf, starts, sizes) == want
        assert e.match_record.match_many(buf, [p + 64 for p in starts], sizes, 64) == want
        # the same records in small pulls and alone
        for i in range(0, len(starts), 7):
            assert e.match_records(buf, starts[i:i + 7], sizes[i:i + 7]) == want[i:i + 7]


def test_results_table_is_bounded_and_high_cardinality_skips_it():
    e = compile_expression("k = 'v7' OR k > 5")
    texts = [b"k\x01v%d" % i for i in range(6000)]
    buf, starts, sizes = records(texts, 8)
    want = [e.match_record(buf, p) for p in starts]
    assert e.match_records(buf, starts, sizes) == want           # all different: judged one by one
    for i in range(0, 6000, 100):                                # 100 new values a call, table bounded
        assert e.match_records(buf, starts[i:i + 100], sizes[i:i + 100]) == want[i:i + 100]
    assert all(len(memo) <= _MEMO_MAX for memo in e._memos.values())


def _copy(f):
    """The per-record filter alone (no match_many): the store takes its per-unit loop."""
    return types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)


def _reference_and_counted(e):
    """(the per-record filter alone, the batch filter recording the size of every
    match_many call in the list returned third)."""
    f = _copy(e.match_record)
    calls = []

    def match_many(buf, starts, sizes, base, _m=e.match_records):
        calls.append(len(starts))
        return _m(buf, starts, sizes, base)
    f.match_many = match_many
    return _copy(e.match_record), f, calls


def _pull_outcome(r):
    return (r.status, r.next_begin_offset, r.min_offset, r.max_offset, r.message_count, r.buffer_total_size,
            [bytes(b) for b in r.buffers])


@pytest.mark.parametrize("max_bytes", [256 * 1024, 700])
def test_store_pulls_are_the_per_unit_loops(tmp_path, max_bytes):
    cfg = StoreConfig(str(tmp_path / "s"), mapped_file_size_commit_log=1 << 15,
                      store_host=(b"\x0a\0\0\1", 10911), total_physical_memory_bytes=1 << 34,
                      max_transfer_bytes_on_message_in_memory=max_bytes)
    store = MessageStore(cfg)
    store.open()
    try:
        rng = random.Random(9)
        texts = property_texts(600, 10)
        for i, t in enumerate(texts):
            props = t.decode("utf-8", "replace").replace("\x02\x02", "\x02")
            tags = ("TagA", "TagB")[i % 2]
            props = (props + "\x02" if props else "") + f"TAGS\x01{tags}"
            body = rng.randbytes(rng.choice([10, 100, 900]))
            # two queues written in turn: a queue's records are not back to back
            for q in (0, 1):
                r = store.put_message(MessageToStore("T", q, 0, body, props, 0, 1, (b"\x0a\0\0\7", 7), 1000 + i))
                assert r.wrote_offset >= 0
        store.reput()
        mx = store.get_max_offset_in_queue("T", 0)
        tag_b = tags_code("TagB")
        for text in ["a > 5", "a > 5 AND region = 'eu'", "TAGS = 'TagB' OR a IS NULL", "x = '1'", "FALSE",
                     "a BETWEEN 3 AND 6 OR TAGS IN ('TagB', 'TagC')"]:
            e = compile_expression(text)
            ref, f, judged = _reference_and_counted(e)
            for tag_filter in [None, lambda code: code == tag_b]:
                for max_nums in [1, 3, 32]:
                    off = 0
                    while off < mx:
                        got = store.get_message("T", 0, off, max_nums, tag_filter, f)
                        want = store.get_message("T", 0, off, max_nums, tag_filter, ref)
                        assert _pull_outcome(got) == _pull_outcome(want), (text, max_nums, off)
                        assert got.next_begin_offset > off
                        off = got.next_begin_offset
            assert sum(judged) >= mx        # the pulls went through the batch path
    finally:
        store.close()


def test_units_judged_ahead_serve_the_next_pulls_only_while_they_are_the_same(tmp_path):
    cfg = StoreConfig(str(tmp_path / "s"), mapped_file_size_commit_log=1 << 16,
                      store_host=(b"\x0a\0\0\1", 10911), total_physical_memory_bytes=1 << 34)
    store = MessageStore(cfg)
    store.open()
    rng = random.Random(31)

    def put(n):
        for _ in range(n):
            props = f"a\x01{rng.randrange(10)}\x02region\x01{rng.choice(['eu', 'us'])}"
            assert store.put_message(MessageToStore("T", 0, 0, b"b" * rng.choice([5, 60]), props, 0, 1,
                                                    (b"\x0a\0\0\7", 7), 1000)).wrote_offset >= 0
        store.reput()
    try:
        put(700)        # several 64 KiB segments: judging ahead stops at a segment's end
        e = compile_expression("a BETWEEN 3 AND 6 OR region = 'us'")
        ref, f, calls = _reference_and_counted(e)

        def check(off, max_nums=32):
            got = store.get_message("T", 0, off, max_nums, None, f)
            want = store.get_message("T", 0, off, max_nums, None, ref)
            assert _pull_outcome(got) == _pull_outcome(want), off
            return got.next_begin_offset
        off, pulls = 0, 0
        while off < store.get_max_offset_in_queue("T", 0):
            off = check(off)
            pulls += 1
            if pulls == 5:
                put(40)             # more messages while the consumer reads
        assert len(calls) < pulls * 0.7     # one judging call served several pulls
        for off in [rng.randrange(740) for _ in range(150)]:     # jumps, backwards too
            check(off, rng.choice([1, 7, 32]))
        # results judged ahead are taken only for the same units: judge ahead of offset 100,
        # then damage the kept results, first for other units, then for these ones
        check(100)
        (start, phys, sizes, flags), = store._judged.values()
        nxt = check(100)
        assert nxt - start < len(phys)              # the next pull starts inside them
        key, = store._judged
        wrong = [not x for x in flags]
        store._judged[key] = (start, tuple(p + 1 for p in phys), sizes, wrong)
        check(nxt)                                  # other units: judged again, same answer
        store._judged[key] = (start, phys, sizes, wrong)
        got = store.get_message("T", 0, nxt, 32, None, f)
        want = store.get_message("T", 0, nxt, 32, None, ref)
        assert _pull_outcome(got) != _pull_outcome(want)    # taken: the same units
    finally:
        store.close()


def test_long_values_are_judged_not_remembered():
    e = compile_expression("k = 'x' OR k > 5")
    long_v = [b"9" * (_MEMO_KEY_MAX + 1), b"x" * (_MEMO_KEY_MAX + 5), b"y" * 300]
    texts = [b"k\x01" + long_v[i % 3] for i in range(30)] + [b"k\x01x", b"k\x017", b"k\x013"] * 10
    buf, starts, sizes = records(texts, 11)
    want = [e.match_record(buf, p) for p in starts]
    assert e.match_records(buf, starts, sizes) == want
    assert e.match_records(buf, starts, sizes) == want           # the second time from the table
    assert e._memos[False] and all(len(k) <= _MEMO_KEY_MAX for k in e._memos[False])
    e2 = compile_expression("k = 'x' AND j IS NULL")
    texts = [b"k\x01x\x02j\x01" + b"z" * 100, b"k\x01x", b"k\x01" + b"w" * 70] * 5
    buf, starts, sizes = records(texts, 12)
    want = [e2.match_record(buf, p) for p in starts]
    assert e2.match_records(buf, starts, sizes) == want == [False, True, False] * 5
    assert all(sum(map(len, k)) <= _MEMO_KEY_MAX for memo in e2._memos.values() for k in memo)


def _store_with_filler(tmp_path):
    cfg = StoreConfig(str(tmp_path / "s"), mapped_file_size_commit_log=1 << 16,
                      store_host=(b"\x0a\0\0\1", 10911), total_physical_memory_bytes=1 << 34)
    store = MessageStore(cfg)
    store.open()

    def put(v):
        r = store.put_message(MessageToStore("T", 0, 0, b"body", f"a\x01{v}", 0, 1, (b"\x0a\0\0\7", 7), 1000))
        assert r.wrote_offset >= 0
    for _ in range(15):
        put("0")
    put("9")                                    # unit 15: the only match of the first chunk
    store._cq_table["T"][0]._write_fillers(2)   # units 16, 17: a gap in the queue
    for v in ["9", "0", "9"] * 200:
        put(v)
    store.reput()
    return store


def test_fillers_after_the_last_taken_are_stepped_over_and_chunks_bounded(tmp_path):
    store = _store_with_filler(tmp_path)
    try:
        e = compile_expression("a > 5")
        ref, f, judged = _reference_and_counted(e)
        mx = store.get_max_offset_in_queue("T", 0)
        for max_nums in [1, 2, 32, 400]:
            for off in range(mx):
                got = store.get_message("T", 0, off, max_nums, None, f)
                want = store.get_message("T", 0, off, max_nums, None, ref)
                assert _pull_outcome(got) == _pull_outcome(want), (max_nums, off)
        first = store.get_message("T", 0, 0, 1, None, f)
        assert (first.message_count, first.next_begin_offset) == (1, 18)    # past both fillers
        assert judged and max(judged) <= 256
    finally:
        store.close()


def test_a_batch_reader_failure_leaves_the_pull_to_the_loop(tmp_path):
    import struct
    store = _store_with_filler(tmp_path)
    try:
        e = compile_expression("a > 5")
        ref = _copy(e.match_record)
        f = _copy(e.match_record)

        def broken(buf, starts, sizes, base):
            raise struct.error("damaged record")
        f.match_many = broken
        for off in (0, 20, 100):
            got = store.get_message("T", 0, off, 32, None, f)
            want = store.get_message("T", 0, off, 32, None, ref)
            assert _pull_outcome(got) == _pull_outcome(want)
    finally:
        store.close()
