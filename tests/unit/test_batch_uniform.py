"""The batch send's column-wise path (a batch of one record size) pinned to the plain one:
protocol.message's parse_uniform_batch_body / join_uniform_records / tags_codes_of_properties
against parse_batch_body / join_records / tags_code_of_properties, and the store's
put_batch_body with the fast path against the same store with it turned off (the
per-element loop): the same commit-log bytes, consume-queue units, results and refusals."""
from __future__ import annotations

import os
import random

import pytest

import pocketmq.broker.store.append as append_mod
from pocketmq.broker.store.api import PutMessageStatus as PS
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.protocol import message as m
from pocketmq.protocol.message import encode_batch_elements

HOST = (bytes([10, 0, 0, 7]), 40000)
HOST6 = (bytes(15) + b"\x07", 40000)
STORE_HOST = (bytes([10, 0, 0, 1]), 10911)
STORE_HOST6 = (bytes(15) + b"\x01", 10911)


def uniq(i: int) -> bytes:
    return b"UNIQ_KEY\x01%032X" % (0xC0A8000A00002A9F0000000000000000 + i)


def plain_columns(body: bytes):
    parsed = m.parse_batch_body(body)
    return [f for f, _d, _p in parsed], [bytes(d) for _f, d, _p in parsed], [p for _f, _d, p in parsed]


# ---------------------------------------------------------------------------- protocol


def test_uniform_parse_is_the_plain_parse_on_fuzzed_batches():
    rnd = random.Random(7)
    seen_uniform = seen_other = 0
    for trial in range(1500):
        count = rnd.randint(1, 70)
        body_len = rnd.choice([0, 1, 5, 128, 300])
        noise = rnd.choice([0, 0, 0.01, 0.1])    # how often an element breaks the batch's shape
        items = []
        for i in range(count):
            b = os.urandom(body_len if rnd.random() >= noise else rnd.randint(0, 10))
            p = b"TAGS\x01T%d\x02" % rnd.randint(0, 9) + uniq(rnd.getrandbits(64))
            r = rnd.random() / max(noise, 1e-9)
            if r < 0.3:
                p = p[:-1]                       # one text shorter
            elif r < 0.5:
                p = "é".encode() * 20             # not ASCII (the plain parser checks UTF-8)
            elif r < 0.6:
                p = b""
            items.append((rnd.randint(0, 3), b, p))
        body = encode_batch_elements(items)
        if rnd.random() < 0.05:
            body = body[:-rnd.randint(1, 30)]    # truncated
        got = m.parse_uniform_batch_body(body)
        try:
            want = plain_columns(body)
        except ValueError:
            assert got is None, trial            # whatever the plain parser refuses
            continue
        if got is None:
            seen_other += 1
        else:
            seen_uniform += 1
            assert got == want, trial
    assert seen_uniform > 500 and seen_other > 100     # both kinds were exercised


def test_uniform_parse_declines_what_the_plain_parser_must_decide():
    same = [(0, b"x" * 8, uniq(i)) for i in range(4)]
    body = encode_batch_elements(same)
    assert m.parse_uniform_batch_body(body) == plain_columns(body)
    assert m.parse_uniform_batch_body(body, body_bytes_max=8) is not None
    assert m.parse_uniform_batch_body(body, body_bytes_max=7) is None      # the limit: plain names it
    with pytest.raises(ValueError, match="exceeds the limit 7B"):
        m.parse_batch_body(body, body_bytes_max=7)
    assert m.parse_uniform_batch_body(encode_batch_elements([(0, b"x", b"")] * 3)) is None   # no properties
    assert m.parse_uniform_batch_body(body + body[:5]) is None             # not whole elements
    assert m.parse_uniform_batch_body(b"") is None
    # one element's lengths differ though the total still divides: the plain walk decides
    odd = encode_batch_elements([(0, b"x" * 9, uniq(0)[:-1])] + same[1:])
    assert len(odd) == len(body) and m.parse_uniform_batch_body(odd) is None
    # the body lengths agree, the properties lengths do not (the total still divides)
    shifted = encode_batch_elements([same[0], (0, b"x" * 8, uniq(1) + b"+"), (0, b"x" * 8, uniq(2)[:-1]), same[3]])
    assert len(shifted) == len(body) and m.parse_uniform_batch_body(shifted) is None
    # an element whose properties hold what reads as one more element of the first's shape
    # (every byte ASCII): only the properties lengths tell the walks apart
    first = encode_batch_elements([(0, b"x" * 8, b"k\x01v")])
    fake = b"AAAAAAAAAAAAAAAA" + first[16:]
    hidden = encode_batch_elements([(0, b"x" * 8, b"k\x01v"), (0, b"y" * 8, b"k\x01v" + fake)])
    assert len(hidden) == 3 * len(first) and len(plain_columns(hidden)[0]) == 2
    assert m.parse_uniform_batch_body(hidden) is None
    # a body length that points past the end
    bad = bytearray(body)
    bad[16:20] = (1 << 30).to_bytes(4, "big")
    assert m.parse_uniform_batch_body(bytes(bad)) is None


@pytest.mark.parametrize("born,store", [(HOST, STORE_HOST), (HOST6, STORE_HOST), (HOST, STORE_HOST6),
                                        (HOST6, STORE_HOST6)])
@pytest.mark.parametrize("suffix", [b"", b"\x02CLUSTER\x01DefaultCluster"])
def test_uniform_join_is_join_records(born, store, suffix):
    sys_flag = m.host_flags(0x8, len(born[0]), len(store[0]))
    topic_part = m.topic_field(b"TopicA")
    flags = [0, 3, 1, 7, 0]
    bodies = [os.urandom(100) for _ in flags]
    props = [uniq(i) + b"\x02WAIT\x01true" for i in range(len(flags))]
    size = m.record_overhead(sys_flag) + 100 + len(b"TopicA") + len(props[0]) + len(suffix)
    want = m.join_records(2, 40, 8192, sys_flag, 1700000000000, born, 1700000000777, store, 3, 0, topic_part,
                          [(size, f, b, p + suffix) for f, b, p in zip(flags, bodies, props)])
    got = m.join_uniform_records(2, 40, 8192, sys_flag, 1700000000000, born, 1700000000777, store, 3, 0,
                                 topic_part, size, flags, bodies, props, suffix)
    assert got == want and len(got) == size * len(flags)
    assert [r.queue_offset for r in m.decode_records(got)] == [40, 41, 42, 43, 44]


def test_tags_codes_of_properties_is_the_per_text_rule():
    texts = [uniq(i) for i in range(5)]
    assert m.tags_codes_of_properties(texts) == [0] * 5
    tagged = [b"TAGS\x01TagA\x02" + uniq(0), uniq(1) + b"\x02TAGS\x01TagB", uniq(2), b"TAGS\x01", b"XTAGS\x01q"]
    assert m.tags_codes_of_properties(tagged) == [m.tags_code_of_properties(t) for t in tagged]
    assert m.tags_codes_of_properties(tagged)[:2] == [m.tags_code("TagA"), m.tags_code("TagB")]
    assert m.tags_codes_of_properties([]) == []


# ---------------------------------------------------------------------------- store


def opened(path, **kw) -> MessageStore:
    cfg = dict(mapped_file_size_commit_log=1 << 16, mapped_file_size_consume_queue=20 * 64, store_host=STORE_HOST,
               total_physical_memory_bytes=1 << 34)
    cfg.update(kw)
    s = MessageStore(StoreConfig(str(path / "store"), **cfg))
    s.open()
    return s


def stored(s: MessageStore, topic: str = "TopicA", queue_id: int = 0):
    """Everything a put leaves behind: the commit log's bytes and the queue's units."""
    d = os.path.join(s.config.store_path_root_dir, "commitlog")
    log = b""
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:     # (the mapping's pages: the same page cache)
            log += f.read()
    cq = s._find_cq(topic, queue_id)
    units = [cq.unit(i) for i in range(cq.min_offset, cq.max_offset)] if cq is not None else []
    return log[:s.commit_log_max_offset], units


def both_ways(tmp_path, monkeypatch, name, puts, **kw):
    """Run `puts(store)` on a store with the column-wise path and on one without (the
    per-element loop); return (results, what was stored) of each, and how many batches
    the first store wrote column-wise."""
    out = []
    written = []
    for fast in (True, False):
        if fast:
            real = append_mod.join_uniform_records
            monkeypatch.setattr(append_mod, "join_uniform_records",
                                lambda *a, **k: written.append(1) or real(*a, **k))
        else:
            monkeypatch.setattr(append_mod, "parse_uniform_batch_body", lambda *a, **k: None)
        s = opened(tmp_path / f"{name}-{fast}", **kw)
        try:
            results = puts(s)
            out.append((results, stored(s)))
        finally:
            s.close()
        monkeypatch.undo()
    return (*out, len(written))


# the cases the per-element loop must decide (the others are written column-wise)
LOOP_CASES = {"some texts ending in a separator", "texts ending in a zero byte",
              "batch properties ending in a zero byte"}
CASES = {
    # name: (elements, batch-level properties)
    "untagged": ([(0, b"b" * 64, uniq(i) + b"\x02WAIT\x01true") for i in range(64)], b"CLUSTER\x01DefaultCluster"),
    "tagged": ([(i % 3, b"%04d" % i, b"TAGS\x01T%d\x02" % (i % 2) + uniq(i)) for i in range(9)], b"CLUSTER\x01C"),
    "tags in the batch properties": ([(0, b"abc", uniq(i)) for i in range(5)], b"TAGS\x01Batch\x02CLUSTER\x01C"),
    "no batch properties": ([(0, b"abc", uniq(i)) for i in range(5)], b""),
    "texts ending in a separator (Java's, C++'s)": ([(0, b"abc", uniq(i) + b"\x02") for i in range(5)],
                                                    b"CLUSTER\x01C"),
    "some texts ending in a separator": ([(0, b"abc", uniq(i) + (b"\x02" if i % 2 else b"+")) for i in range(5)],
                                         b"CLUSTER\x01C"),
    "texts ending in a zero byte": ([(0, b"abc", b"k\x01%d\x00" % i) for i in range(5)], b""),
    "batch properties ending in a zero byte": ([(0, b"abc", uniq(i)) for i in range(5)], b"k\x01v\x00"),
    "one element": ([(5, b"solo", uniq(0))], b"CLUSTER\x01C"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_store_puts_the_same_records_units_and_results(tmp_path, monkeypatch, case):
    elements, extra = CASES[case]
    body = encode_batch_elements(elements)
    calls = []

    def puts(s):
        s.on_dispatch = lambda *a: calls.append(a)
        s.put_batch_body("TopicA", 0, 0, 5, HOST, 6, encode_batch_elements([(0, b"warm", uniq(99))]), extra)
        return [s.put_batch_body("TopicA", 0, 0, 5, HOST, 6 + k, body, extra, k) for k in range(3)]
    (fast_results, fast_stored), (plain_results, plain_stored), written = both_ways(
        tmp_path, monkeypatch, "s", puts, mapped_file_size_commit_log=1 << 20)
    # the case's three batches (the first put of a store, which opens its segment, goes the loop's way)
    assert written == (0 if case in LOOP_CASES else 3)
    assert fast_results == plain_results and all(r.ok for r in fast_results)
    assert fast_stored == plain_stored
    assert fast_results[-1].msg_count == len(elements)
    half = len(calls) // 2
    assert calls[:half] == calls[half:]          # the same wake-ups (tag codes, offsets)


@pytest.mark.parametrize("what", ["properties too long", "record over maxMessageSize"])
def test_store_refuses_what_the_loop_refuses(tmp_path, monkeypatch, what):
    if what == "properties too long":     # 32,762 bytes + the batch's 12: over 32,767
        elements, kw, status = [(0, b"x", b"a\x01" + b"b" * 32760)] * 2, {}, PS.PROPERTIES_SIZE_EXCEEDED
    else:
        elements, kw, status = [(0, b"x" * 900, uniq(i)) for i in range(3)], {"max_message_size": 800}, \
            PS.MESSAGE_ILLEGAL

    def puts(s):
        # (a first put opens the segment: a batch goes the column-wise way only into room it has)
        assert s.put_batch_body("TopicA", 0, 0, 5, HOST, 6, encode_batch_elements([(0, b"w", uniq(9))]), b"").ok
        assert s.put_batch_body("TopicA", 0, 0, 5, HOST, 6, encode_batch_elements([(0, b"w", uniq(8))]), b"").ok
        return [s.put_batch_body("TopicA", 0, 0, 5, HOST, 6, encode_batch_elements(elements), b"CLUSTER\x01C"),
                s.put_batch_body("TopicA", 0, 0, 5, HOST, 6, encode_batch_elements(elements[:1]), b"CLUSTER\x01C")]
    (fast, fast_stored), (plain, plain_stored), written = both_ways(tmp_path, monkeypatch, "r", puts,
                                                                    mapped_file_size_commit_log=1 << 21, **kw)
    assert written == 1                          # the second warm-up only: the refusals are the loop's
    assert [r.status for r in fast] == [r.status for r in plain] == [status, status]
    assert fast_stored == plain_stored and len(fast_stored[1]) == 2       # only the warm-ups' units


def test_store_batch_that_does_not_fit_the_segment_rolls_as_before(tmp_path, monkeypatch):
    elements = [(0, b"z" * 300, uniq(i)) for i in range(10)]        # ~3.7 KB a batch, 64 KiB segments
    body = encode_batch_elements(elements)

    def puts(s):
        return [s.put_batch_body("TopicA", 0, 0, 5, HOST, 6, body, b"CLUSTER\x01C") for _ in range(30)]
    (fast, _fs), (plain, _ps), written = both_ways(tmp_path, monkeypatch, "roll", puts)
    assert fast == plain and all(r.ok for r in fast)
    assert 0 < written < len(fast)               # the batches that did not fit went the other way
    assert len({r.wrote_offset >> 16 for r in fast}) > 1                  # it did roll


def outcome(call):
    """A put's result, or the error it raised (type and message)."""
    try:
        return call()
    except ValueError as e:
        return ("ValueError", str(e))


# a record's bytes besides its body: head, topic "TopicA", a UNIQ_KEY property
LIMIT_REST = m.record_overhead(0) + len(b"TopicA") + len(uniq(0))

# Batches of one shape at the edges of what the store takes: the two paths must agree
# (result or error, bytes, units), and `fast` says whether the column-wise one may write.
EDGES = {
    # name: (topic, elements, batch properties, body_bytes_max, store settings, born host, fast)
    "body over body_bytes_max": ("TopicA", [(0, b"b" * 700, uniq(i)) for i in range(3)], b"CLUSTER\x01C", 5, {},
                                 HOST, False),
    "body at body_bytes_max": ("TopicA", [(0, b"b" * 700, uniq(i)) for i in range(3)], b"CLUSTER\x01C", 700, {},
                               HOST, True),
    "properties not UTF-8": ("TopicA", [(0, b"b", b"k\x01\xff\xfe" + b"%02d" % i) for i in range(3)], b"", None, {},
                             HOST, False),
    "properties UTF-8, not ASCII": ("TopicA", [(0, b"b", "k\x01é%02d".encode() % i) for i in range(3)], b"", None,
                                    {}, HOST, False),
    "delayed messages' topic": ("SCHEDULE_TOPIC_XXXX", [(0, b"b", uniq(i) + b"\x02TAGS\x01T") for i in range(3)],
                                b"CLUSTER\x01C", None, {}, HOST, False),
    # stored properties: the element's + "\x02C\x01D" (4 bytes)
    "properties of 32,767 bytes": ("TopicA", [(0, b"b", b"a\x01%05d" % i + b"b" * (32767 - 4 - 7)) for i in range(2)],
                                   b"C\x01D", None, {}, HOST, True),
    "properties of 32,768 bytes": ("TopicA", [(0, b"b", b"a\x01%05d" % i + b"b" * (32768 - 4 - 7)) for i in range(2)],
                                   b"C\x01D", None, {}, HOST, False),
    "record at the size limit": ("TopicA", [(0, b"b" * (800 - LIMIT_REST), uniq(i)) for i in range(2)], b"", None,
                                 {"max_message_size": 800}, HOST, True),
    "record one byte over": ("TopicA", [(0, b"b" * (801 - LIMIT_REST), uniq(i)) for i in range(2)], b"", None,
                             {"max_message_size": 800}, HOST, False),
    "IPv6 born host": ("TopicA", [(2, b"b" * 40, uniq(i)) for i in range(5)], b"CLUSTER\x01C", None, {}, HOST6, True),
    "IPv6 store host": ("TopicA", [(2, b"b" * 40, uniq(i)) for i in range(5)], b"CLUSTER\x01C", None,
                        {"store_host": STORE_HOST6}, HOST, True),
}


@pytest.mark.parametrize("edge", sorted(EDGES))
def test_store_agrees_at_the_edges(tmp_path, monkeypatch, edge):
    topic, elements, extra, body_max, settings, born, fast = EDGES[edge]
    body = encode_batch_elements(elements)

    def puts(s):
        # (a first put opens the segment: a batch goes the column-wise way only into room it has)
        assert s.put_batch_body(topic, 0, 0, 5, born, 6, encode_batch_elements([(0, b"w", uniq(9))]), b"").ok
        return [outcome(lambda: s.put_batch_body(topic, 0, 0, 5, born, 7 + k, body, extra, 0, body_max))
                for k in range(2)]
    (fast_out, fast_stored), (plain_out, plain_stored), written = both_ways(
        tmp_path, monkeypatch, "e", puts, mapped_file_size_commit_log=1 << 20, **settings)
    assert fast_out == plain_out and fast_stored == plain_stored
    assert written == (2 if fast else 0)
    refused = {"body over body_bytes_max": ("ValueError", "batch element 0: body of 700B exceeds the limit 5B"),
               "properties not UTF-8": ("ValueError", "batch element 0: properties not UTF-8"),
               "properties of 32,768 bytes": PS.PROPERTIES_SIZE_EXCEEDED,
               "record one byte over": PS.MESSAGE_ILLEGAL}
    if edge in refused:
        want = refused[edge]
        assert [o if type(o) is tuple else o.status for o in fast_out] == [want, want]
    else:
        assert all(r.ok for r in fast_out)
