"""The message index fed by the put path (IndexHint, broker/store/index.py): a batch stored
column-wise hands the index its columns, and the index takes them instead of reading the
records back. Pinned to the walk: two stores fed the same operations, one with its hints
(the default) and one without (`_index_hints = None`: every record walked), must leave
byte-identical index files, whatever the batches' shapes (uniform or not, with and
without the broker's batch properties, KEYS words, IPv6 hosts, single puts between them,
a batch that rolls the commit log, index files filling mid-batch) and however the index
is stepped (the pump's bounded steps that stop before a hint they cannot take whole, the
flush thread's pass, a query). Plus: hints that do not describe the records at their
offset are not used, and the event loop's steps never hand the GIL over with a sleep."""
from __future__ import annotations

import os
import random
import sys
from collections import deque

import pytest

from pocketmq.broker.store import index as index_mod
from pocketmq.broker.store.api import MessageToStore
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.protocol.message import encode_batch_elements

HOST4 = (bytes([10, 0, 0, 7]), 40000)
HOST6 = (bytes(range(1, 17)), 40001)
STORE_HOST = (bytes([10, 0, 0, 1]), 10911)
CLUSTER = b"CLUSTER\x01DefaultCluster"


def opened(root, name: str, hints: bool, **kw) -> MessageStore:
    cfg = dict(mapped_file_size_commit_log=48 * 1024, mapped_file_size_consume_queue=20 * 256,
               store_host=STORE_HOST, total_physical_memory_bytes=1 << 34, max_hash_slot_num=11,
               max_index_num=90, message_index_enable=True, index_build_batch=7)
    cfg.update(kw)
    s = MessageStore(StoreConfig(str(root / name), **cfg))
    s.open()
    if not hints:
        s._index_hints = None
    return s


def snapshot(s: MessageStore) -> dict[str, bytes]:
    d = s.config.index_dir
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as fh:
            out[name] = fh.read()
    return out


def uniq(i: int) -> bytes:
    return b"UNIQ_KEY\x01C0A8000A1F2E5A3B9C4D%012X" % i


def batch(rnd: random.Random, first: int) -> tuple[bytes, bytes, int]:
    """A SEND_BATCH body (mostly one shape: the column-wise path), its batch-level
    properties, and its element count."""
    m = rnd.choice([1, 2, 5, 16, 40])
    bl = rnd.choice([3, 64, 128])
    shape = rnd.random()
    elements = []
    for j in range(m):
        i = first + j
        if shape < 0.55:
            props = b"WAIT\x01true\x02" + uniq(i)
        elif shape < 0.7:
            props = b"KEYS\x01k%04d w%02d\x02" % (i % 9999, i % 97) + uniq(i)   # KEYS words, one layout
        elif shape < 0.8:
            props = uniq(i) + b"\x02"                                          # Java's / C++'s ending
        elif shape < 0.9:
            props = b"TAGS\x01t%d\x02" % (i % 3) + uniq(i)
        else:
            props = uniq(i) + (b"\x02X\x01%d" % i if j % 2 else b"")           # not one shape: the loop
            bl = rnd.choice([3, 64])                                           # ...and sizes differ
        elements.append((0, bytes([i % 256]) * bl, props))
    return encode_batch_elements(elements), rnd.choice([CLUSTER, CLUSTER, b""]), m


def operate(s: MessageStore, rnd: random.Random, steps: int) -> None:
    """Puts and index steps, drawn from rnd (both stores draw the same)."""
    now = 1_700_000_000_000
    i = 0
    for _ in range(steps):
        now += rnd.choice([0, 1, 3, 1000])
        r = rnd.random()
        if r < 0.7:
            body, extra, m = batch(rnd, i)
            host = HOST6 if rnd.random() < 0.1 else HOST4
            res = s.put_batch_body("TopicH" if rnd.random() < 0.8 else "Other", rnd.randrange(2), 0, now - 3,
                                   host, now, body, extra)
            assert res.status.name == "PUT_OK", res
            i += m
        else:
            res = s.put_message(MessageToStore("TopicH", 0, 0, b"single", (b"KEYS\x01s%d\x02" % i + uniq(i)).decode(),
                                               0, now - 3, HOST4, now))
            assert res.wrote_offset >= 0, res
            i += 1
        r = rnd.random()
        if r < 0.5:
            # the pump's steps (drawn up front: how many records a step takes must not
            # change what the two stores draw next)
            for step in [rnd.choice([1, 3, 32, 64]) for _ in range(rnd.randint(1, 4))]:
                s.index_some(step)
        elif r < 0.6:
            s.flush_consume_queues()                               # the flush thread's pass
        elif r < 0.65:
            s.query_message("TopicH", "s1", 8, 0, 1 << 62)         # a query catches up first
    s._index_catch_up()


@pytest.mark.parametrize("seed", range(8))
def test_hinted_index_is_the_walked_index(tmp_path, monkeypatch, seed):
    held = []
    real = index_mod._hint_holds
    monkeypatch.setattr(index_mod, "_hint_holds", lambda *a: real(*a) and not held.append(a[3]))
    shots = []
    for hints in (True, False):
        s = opened(tmp_path, f"s-{hints}", hints)
        try:
            operate(s, random.Random(seed), 120)
            shots.append(snapshot(s))
            if hints:
                taken = sum(held)
                assert not s._index_hints       # every hint taken or passed by the walk
        finally:
            s.close()
    assert len(shots[0]) > 1                    # index files filled and rolled over
    assert shots[0] == shots[1]
    assert taken > 200                          # most batches' records came from their hints


@pytest.mark.parametrize("change", ["size", "store time", "offset", "count", "nothing (control)"])
def test_a_hint_that_does_not_describe_its_records_is_not_used(tmp_path, change):
    """A hint whose records are not where, what size or what store time it says: the walk
    reads them. The hint carries wrong keys, so had it been used the index would differ:
    the control (a hint right in all it says) shows that it would."""
    s = opened(tmp_path, "bad", True)
    t = opened(tmp_path, "plain", False)
    try:
        body = encode_batch_elements([(0, b"abc", b"WAIT\x01true\x02" + uniq(i)) for i in range(8)])
        now = 1_700_000_000_000
        for st in (s, t):
            # (a fresh store's first batch takes the per-element path: no hint)
            st.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(10_000).decode(), 0, now, HOST4, now))
            assert st.put_batch_body("TopicH", 0, 0, now, HOST4, now, body, CLUSTER).status.name == "PUT_OK"
            st.put_message(MessageToStore("TopicH", 0, 0, b"after it" * 30, uniq(10_001).decode(), 0, now, HOST4,
                                          now))
        (phys0, size, m, topic, props, ts), = s._index_hints
        wrong = [p.replace(b"C0A8", b"FFFF") for p in props]
        hint = {"size": (phys0, size - 1, m, topic, wrong, ts),
                "store time": (phys0, size, m, topic, wrong, ts + 1),
                "offset": (phys0 + 10, size, m, topic, wrong, ts),                 # not a record boundary
                "count": (phys0, size, m + 2, topic, wrong + wrong[:2], ts),    # the last is not one of them
                "nothing (control)": (phys0, size, m, topic, wrong, ts)}[change]
        s._index_hints.clear()
        s._index_hints.append(hint)
        s._index_catch_up()
        t._index_catch_up()
        assert not s._index_hints
        if change == "nothing (control)":
            assert snapshot(s) != snapshot(t)
        else:
            assert snapshot(s) == snapshot(t)
    finally:
        s.close()
        t.close()


def counter(i: int, head: bytes = b"C0A8000A1F2E5A3B9C4D0000") -> bytes:
    return head + b"%04X" % (i & 0xFFFF)     # a producer's ids: a head and a 16-bit counter


COUNTER_RUNS = {
    # one text but the UNIQ_KEY's last four bytes: hashed at once (index._counter_run)
    "producer batch": (True, lambda i: b"WAIT\x01true\x02UNIQ_KEY\x01" + counter(i)),
    "KEYS words, the same in each": (True, lambda i: b"KEYS\x01a  bb c\x02UNIQ_KEY\x01" + counter(i)),
    "Java's ending": (True, lambda i: b"UNIQ_KEY\x01" + counter(i) + b"\x02"),
    "UNIQ_KEY first, properties after": (True, lambda i: b"UNIQ_KEY\x01" + counter(i) + b"\x02TAGS\x01t"),
    "the later UNIQ_KEY wins": (True, lambda i: b"UNIQ_KEY\x01first\x02UNIQ_KEY\x01" + counter(i)),
    "a head of one byte": (True, lambda i: b"UNIQ_KEY\x01Z" + b"%04X" % (i & 0xFFFF)),
    # anything else: per key (_keys_of_run), the same bytes
    "a separator in the last bytes of some": (False, lambda i: b"UNIQ_KEY\x01" + (
        counter(i) if i % 3 else b"C0A8000A1F2E5A3B9C4D0000\x02X\x01y")),
    "the later, empty UNIQ_KEY wins": (False, lambda i: b"UNIQ_KEY\x01" + counter(i) + b"\x02UNIQ_KEY\x01"),
    "a UNIQ_KEY of four bytes": (False, lambda i: b"WAIT\x01true\x02UNIQ_KEY\x01" + b"%04X" % (i & 0xFFFF)),
    "heads differ": (False, lambda i: b"UNIQ_KEY\x01" + counter(i, b"C0A8000A1F2E5A3B9C4D%04X" % i)),
    "other KEYS in each": (False, lambda i: b"KEYS\x01k%04d\x02UNIQ_KEY\x01" % i + counter(i)),
    "other KEYS after it in each": (False, lambda i: b"UNIQ_KEY\x01" + counter(i) + b"\x02KEYS\x01k%d" % (i % 10)),
    "no UNIQ_KEY": (False, lambda i: b"KEYS\x01k%04d" % (i % 3)),
}


@pytest.mark.parametrize("shape", sorted(COUNTER_RUNS))
def test_a_producer_batch_hashed_at_once_is_the_walked_index(tmp_path, monkeypatch, shape):
    """A batch whose properties are one text but the last four bytes of its UNIQ_KEY (the
    producer's coalesced sends) has its keys hashed at once from the hint; the bytes are
    the walked index's, and texts that only look alike are not taken that way."""
    taken, text = COUNTER_RUNS[shape]
    runs = []
    real = index_mod._counter_run
    monkeypatch.setattr(index_mod, "_counter_run", lambda *a: runs.append(real(*a)) or runs[-1])
    shots = []
    for hints in (True, False):
        st = opened(tmp_path, f"c-{hints}", hints, max_index_num=50)
        try:
            now = 1_700_000_000_000
            st.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(10_000).decode(), 0, now, HOST4, now))
            for k, m in enumerate((1, 2, 40, 64, 33)):      # the index files fill and roll mid-batch
                # (batch 2's counter runs over 0xFFFF back to 0 within the batch)
                body = encode_batch_elements([(0, b"abc", text(100 * k + i + 0xFF2D)) for i in range(m)])
                assert st.put_batch_body("TopicH", 0, 0, now, HOST4, now + k, body,
                                         CLUSTER).status.name == "PUT_OK"
                if k % 2:
                    st.index_some(32)
            st._index_catch_up()
            shots.append(snapshot(st))
        finally:
            st.close()
    assert shots[0] == shots[1]
    assert len(shots[0]) > 1 or shape == "the later, empty UNIQ_KEY wins"     # (no keys: one file)
    assert runs and all((r is not None) == taken for r in runs), runs


def test_a_failure_after_a_batch_hashed_at_once_does_not_index_it_twice(tmp_path):
    """A batch hashed at once is written at once: the progress point moves past it then, so
    a walk that fails later in the same call (the next commit-log segment cannot be
    mapped) and is retried does not write its entries again."""
    shots = []
    for hints in (True, False):
        st = opened(tmp_path, f"f-{hints}", hints, max_index_num=5000, mapped_file_size_commit_log=8 * 1024)
        try:
            now = 1_700_000_000_000
            st.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(1).decode(), 0, now, HOST4, now))
            cl = st._commitlog
            first = cl.queue.find(cl.wrote_offset).start
            i = 0
            while cl.queue.find(cl.wrote_offset).start == first:
                body = encode_batch_elements([(0, b"x" * 100, b"UNIQ_KEY\x01" + counter(i + j)) for j in range(8)])
                assert st.put_batch_body("TopicH", 0, 0, now, HOST4, now, body, CLUSTER).status.name == "PUT_OK"
                i += 8
            real = cl.queue.find
            failed = []

            def find(offset):
                mf = real(offset)
                if mf is not None and mf.start != first and not failed:
                    failed.append(offset)
                    raise OSError(24, "Too many open files (injected)")
                return mf
            cl.queue.find = find
            with pytest.raises(OSError):
                st._index_catch_up()
            cl.queue.find = real
            st._index_catch_up()
            assert failed
            shots.append((snapshot(st), st._index.keys_added))
        finally:
            st.close()
    assert shots[0] == shots[1]


def test_counter_run_refuses_what_it_cannot_hash_at_once():
    # guards the store's put path never reaches (it hands over ASCII texts only): the
    # answer is None (the per-record path), or hashes equal to Java's
    memo = index_mod._topic_hashes(b"TopicH")
    cases = [
        [b"UNIQ_KEY\x01C0A80001", b"UNIQ_KEY\x01C0A8\xc3\xa9\xc3\xa9"],     # non-ASCII last bytes
        [b"UNIQ_KEY\x01" + "\u00e9".encode() + b"0001", b"UNIQ_KEY\x01" + "\u00e9".encode() + b"0002"],
        [b"UNIQ_KEY\x010001", b"UNIQ_KEY\x010002"],                            # no head
        [b"UNIQ_KEY\x01A0001", b"UNIQ_KEY\x01A0002"],                          # a head of one byte
        [b"UNIQ_KEY\x01AB\x01001", b"UNIQ_KEY\x01AB\x01002"],                  # \x01 in the value
        [b"KEYS\x01a b\x02UNIQ_KEY\x01AB0001", b"KEYS\x01a b\x02UNIQ_KEY\x01AB0002"],
    ]
    taken = []
    for texts in cases:
        run = index_mod._counter_run(memo, texts, len(texts))
        taken.append(run is not None)
        if run is not None:
            hashes, c = run
            want = [index_mod.index_key_hash("TopicH#" + k.decode()) for t in texts
                    for k in index_mod._raw_keys(t)]
            assert hashes == want and c * len(texts) == len(want), texts
    assert taken == [False, False, False, True, True, True]


def test_a_bounded_step_stops_before_a_hint_it_cannot_take_whole(tmp_path):
    s = opened(tmp_path, "steps", True)
    try:
        now = 1_700_000_000_000
        s.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(10_000).decode(), 0, now, HOST4, now))
        body = encode_batch_elements([(0, b"abc", uniq(i)) for i in range(20)])   # (column-wise: not a first put)
        s.put_batch_body("TopicH", 0, 0, now, HOST4, now, body, CLUSTER)
        assert len(s._index_hints) == 1
        assert s.index_some(8) == 1             # the single record, then the 20 wait for the next step
        assert len(s._index_hints) == 1
        assert s.index_some(8) == 20            # taken whole, over the step's bound
        assert not s._index_hints and s.index_backlog_bytes() == 0
    finally:
        s.close()


def test_only_the_flush_pass_hands_the_gil_over(tmp_path, monkeypatch):
    """A sleep(0) costs ~80 µs of wall time here: fine on the flush thread (it hands the
    GIL to the event loop), a stall on the event loop itself (IndexPump's steps, queries)
    and at open (before anything else runs)."""
    sleeps = []
    monkeypatch.setattr(index_mod, "_sleep", lambda s: sleeps.append(s))
    for hints in (True, False):
        s = opened(tmp_path, f"gil-{hints}", hints, index_build_batch=1000)
        try:
            now = 1_700_000_000_000
            s.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(10_000).decode(), 0, now, HOST4, now))
            for k in range(4):
                body = encode_batch_elements([(0, b"abc", uniq(100 * k + i)) for i in range(64)])
                s.put_batch_body("TopicH", 0, 0, now, HOST4, now, body, CLUSTER)
            sleeps.clear()
            assert s.index_some(1000) == 257
            for k in range(4, 8):
                body = encode_batch_elements([(0, b"abc", uniq(100 * k + i)) for i in range(64)])
                s.put_batch_body("TopicH", 0, 0, now, HOST4, now, body, CLUSTER)
            s.query_message("TopicH", "x", 8, 0, 1 << 62)   # a query catches up first, on the loop
            assert sleeps == []
            for k in range(8, 12):
                body = encode_batch_elements([(0, b"abc", uniq(100 * k + i)) for i in range(64)])
                s.put_batch_body("TopicH", 0, 0, now, HOST4, now, body, CLUSTER)
            s._flush_index()                    # the flush thread's pass
            assert len(sleeps) == 4             # one per 64 records
        finally:
            s.close()
        sleeps.clear()
        s = opened(tmp_path, f"gil-{hints}", hints, index_build_batch=1000)     # reopen: nothing to rebuild
        s.close()
        for name in os.listdir(s.config.index_dir):
            os.unlink(os.path.join(s.config.index_dir, name))
        s = opened(tmp_path, f"gil-{hints}", hints, index_build_batch=1000)     # the whole index at open
        try:
            assert s._index.keys_added == 769 and sleeps == []
        finally:
            s.close()


def test_a_step_that_takes_a_hint_whole_stops_there(tmp_path):
    """A step bounded below a hint's size that starts at it takes it whole, and no more:
    the records after it wait for the next step."""
    s = opened(tmp_path, "whole", True, mapped_file_size_commit_log=1 << 20)
    try:
        now = 1_700_000_000_000
        s.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(10_000).decode(), 0, now, HOST4, now))
        assert s.index_some(8) == 1
        s.put_batch_body("TopicH", 0, 0, now, HOST4, now,
                         encode_batch_elements([(0, b"abc", uniq(i)) for i in range(20)]), CLUSTER)
        for i in range(50):
            s.put_message(MessageToStore("TopicH", 0, 0, b"after", uniq(20_000 + i).decode(), 0, now, HOST4, now))
        assert s.index_some(8) == 20
        assert s.index_some(8) == 8
    finally:
        s.close()


@pytest.mark.parametrize("bound, walked", [(20, 20), (19, 1)])
def test_a_hint_that_just_fits_the_step_is_taken_one_more_waits(tmp_path, bound, walked):
    """A single record, then a hint of 19: a step of 20 takes both; a step of 19 stops
    before the hint (the next step takes it whole)."""
    s = opened(tmp_path, f"fit-{bound}", True, mapped_file_size_commit_log=1 << 20)
    try:
        now = 1_700_000_000_000
        s.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(10_000).decode(), 0, now, HOST4, now))
        assert s.index_some(8) == 1
        s.put_message(MessageToStore("TopicH", 0, 0, b"two", uniq(10_001).decode(), 0, now, HOST4, now))
        s.put_batch_body("TopicH", 0, 0, now, HOST4, now,
                         encode_batch_elements([(0, b"abc", uniq(i)) for i in range(19)]), CLUSTER)
        assert len(s._index_hints) == 1
        assert s.index_some(bound) == walked
        assert len(s._index_hints) == (0 if walked == 20 else 1)
        assert s.index_some(bound) == 20 - walked
        assert s.index_backlog_bytes() == 0
    finally:
        s.close()


class RacyHints(deque):
    """What a put on the event loop does between two of the flush thread's reads of the
    hints (a GIL switch): after the `at`-th read by the index, one more hint is appended
    to the full deque, dropping the oldest."""

    def __init__(self, items, maxlen, extra, at):
        super().__init__(items, maxlen)
        self.extra = extra
        self.reads = 0
        self.at = at

    def __getitem__(self, i):
        value = deque.__getitem__(self, i)
        if sys._getframe(1).f_code.co_name == "_index_records":
            self.reads += 1
            if self.reads == self.at:
                self.append(self.extra)
        return value


@pytest.mark.parametrize("at", [1, 2, 3, 4, 5])
def test_a_hint_dropped_by_a_put_while_the_index_reads_it(tmp_path, at):
    """(From a review: the hint was read twice, and a put between the reads made the second
    read the next hint, whose keys then went to the first batch's offsets.) Batches of one
    shape stored in one millisecond, the deque full; whichever read the put falls after,
    the index is the walk's."""
    shots = []
    for hints in (True, False):
        s = opened(tmp_path, f"race-{at}-{hints}", hints, mapped_file_size_commit_log=1 << 20,
                   max_index_num=100_000, max_hash_slot_num=1000)
        try:
            now = 1_700_000_000_000
            s.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(10 ** 6).decode(), 0, now, HOST4, now))
            s.index_some(1000)
            if hints:
                s._index_hints = deque()        # every hint, in order
            for k in range(index_mod.INDEX_HINTS_MAX + 1):
                s.put_batch_body("TopicH", 0, 0, now, HOST4, now,
                                 encode_batch_elements([(0, b"abc", uniq(1000 * k + i)) for i in range(8)]), CLUSTER)
            if hints:
                every = list(s._index_hints)
                s._index_hints = RacyHints(every[:-1], index_mod.INDEX_HINTS_MAX, every[-1], at)
            s._index_catch_up()
            shots.append(snapshot(s))
        finally:
            s.close()
    assert shots[0] == shots[1]


def test_hints_are_bounded_and_off_with_the_index(tmp_path):
    s = opened(tmp_path, "bound", True)
    try:
        now = 1_700_000_000_000
        body = encode_batch_elements([(0, b"a", uniq(i)) for i in range(2)])
        s.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(10_000).decode(), 0, now, HOST4, now))
        for _ in range(index_mod.INDEX_HINTS_MAX + 50):     # nobody steps the index
            s.put_batch_body("TopicH", 0, 0, now, HOST4, now, body, CLUSTER)
        assert len(s._index_hints) == index_mod.INDEX_HINTS_MAX
        s._index_catch_up()                     # the oldest were dropped: walked instead
        assert not s._index_hints and s.index_backlog_bytes() == 0
    finally:
        s.close()
    big = opened(tmp_path, "big", True, mapped_file_size_commit_log=1 << 20)
    try:
        now = 1_700_000_000_000
        big.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(10_000).decode(), 0, now, HOST4, now))
        pad = b"\x02P\x01" + b"p" * 2000                  # 40 texts of ~2 KiB: over INDEX_HINT_BYTES_MAX
        for texts, hinted in (([uniq(i) + pad for i in range(40)], 0), ([uniq(i) for i in range(40)], 1)):
            assert big.put_batch_body("TopicH", 0, 0, now, HOST4, now, encode_batch_elements(
                [(0, b"a", t) for t in texts]), CLUSTER).status.name == "PUT_OK"
            assert len(big._index_hints) == hinted
    finally:
        big.close()
    v6 = opened(tmp_path, "v6", True)
    try:
        v6.put_message(MessageToStore("TopicH", 0, 0, b"one", uniq(10_000).decode(), 0, 1, HOST4, 1))
        v6.put_batch_body("TopicH", 0, 0, 1, HOST6, 1, encode_batch_elements([(0, b"a", uniq(1))] * 3), CLUSTER)
        assert not v6._index_hints            # the index reads records with IPv6 hosts itself
        v6.put_batch_body("TopicH", 0, 0, 1, HOST4, 1, encode_batch_elements([(0, b"a", uniq(1))] * 3), CLUSTER)
        assert len(v6._index_hints) == 1
    finally:
        v6.close()
    off = opened(tmp_path, "off", True, message_index_enable=False)
    try:
        off.put_batch_body("TopicH", 0, 0, 1, HOST4, 1, encode_batch_elements([(0, b"a", uniq(1))]), CLUSTER)
        assert off._index_hints is None
    finally:
        off.close()
