"""The reader's column-wise path (pull body -> Arrow without per-record tuples), pinned to
the plain path: for the same pull bodies, _body_segments + _judge + parts_to_batches give
what decode_pull_body + _judge + records_to_batch give (the reader before the column-wise
path), rows, values, order, errors and data-loss decisions. No sockets, no Spark session."""
from __future__ import annotations

import logging
import random

import pytest

from pocketmq.client.api import PullResult
from pocketmq.client.errors import MQClientError
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.spark.plan import DataLossError, QueueRange

pytestmark = pytest.mark.spark
pa = pytest.importorskip("pyarrow")
np = pytest.importorskip("numpy")

from pocketmq.spark import read  # noqa: E402  (needs pyarrow and numpy)

TOPIC = "TopicCol"
MQ = MessageQueue(TOPIC, "broker-c", 2)
V4 = (b"\x7f\x00\x00\x01", 40123)
V4B = (b"\x0a\x01\x02\x03", 51000)
STORE = (b"\xc0\xa8\x01\x02", 10911)
V6 = (bytes(range(1, 17)), 10911)


def _props(i: int, text: str | None = None) -> str:
    if text is not None:
        return text
    return msgcodec.encode_properties({"TAGS": "TagA" if i % 3 else "TagB", "KEYS": f"k{i} o{i % 7}",
                                       "UNIQ_KEY": f"U{i:08X}" if i % 5 else None, "color": "red",
                                       "ключ": "значение" if i % 2 else None})


def _record(i: int, *, offset: int, text: str | None = None, body: bytes | None = None, topic: str = TOPIC,
            born=V4, store=STORE, compressed: bool = False) -> bytes:
    body = bytes([i % 251]) * (i % 40) + "é".encode() if body is None else body
    sys_flag = 0
    if compressed:
        body = msgcodec.compress_body(body)
        sys_flag = msgcodec.MessageSysFlag.COMPRESSED_FLAG
    return msgcodec.encode_record(topic, MQ.queue_id, 0, body, _props(i, text), sys_flag, 1_700_000_000_000 + i,
                                  born, store, i % 4, 0, offset, 1_000_000 + 400 * offset, 1_700_000_000_500 + i)


def _body(first: int, n: int, special: dict | None = None) -> bytes:
    """n records from queue offset `first`; special: {index: kwargs of _record}."""
    special = special or {}
    return b"".join(_record(first + k, offset=first + k, **special.get(k, {})) for k in range(n))


def _batch_body(first: int, n: int) -> bytes:
    """A stored batch (SEND_BATCH): join_records' shared-header form."""
    topic_b = TOPIC.encode()
    elements = []
    for k in range(n):
        body, props_b = b"batch-%d" % k, _props(first + k).encode()
        elements.append((msgcodec.record_overhead(0) + len(body) + len(topic_b) + len(props_b), 0, body, props_b))
    return msgcodec.join_records(MQ.queue_id, first, 5_000_000, 0, 1_700_000_001_000, V4B, 1_700_000_001_001,
                                 STORE, 0, 0, msgcodec.topic_field(topic_b), elements)


def _columnar(bodies, r: QueueRange, wanted, fail: bool = True, batch: bool = True):
    """pull_range's way: the bodies as the pull results of one batch (_batch_parts: joined
    when every body is kept whole), or (batch=False) each body on its own."""
    offset = r.start
    results = []
    for body in bodies:
        results.append(PullResult(PullResult.FOUND, _next(body, offset), 0, 10_000, [], 0, body))
        offset = results[-1].next_begin_offset
    if batch:
        parts, _ = read._batch_parts(results, r, r.start, wanted, fail, MQ, "addr")
    else:
        parts = []
        offset = r.start
        for res in results:
            keep, offset = read._batch_parts([res], r, offset, wanted, fail, MQ, "addr")
            parts.extend(keep)
    return _rows(read.parts_to_batches(parts, MQ.broker_name)), parts


def _plain(bodies, r: QueueRange, wanted, fail: bool = True):
    """The reader before the column-wise path: decode_records_raw tuples, records_to_batch."""
    offset = r.start
    parts = []
    for body in bodies:
        res = PullResult(PullResult.FOUND, _next(body, offset), 0, 10_000, read.decode_pull_body(body, MQ, "addr"))
        keep, offset = read._judge(res, r, offset, wanted, fail)
        parts.extend(keep)
    return _rows([read.records_to_batch(parts, MQ.broker_name)] if parts else [])


def _next(body: bytes, offset: int) -> int:
    walked = msgcodec.record_starts(body)
    if walked is None or not walked[0]:
        return offset + 1
    last = walked[0][-1]
    return max(offset, int.from_bytes(body[last + msgcodec.POS_QUEUE_OFFSET:last + msgcodec.POS_QUEUE_OFFSET + 8],
                                      "big")) + 1


def _rows(batches) -> list[dict]:
    batches = list(batches)
    for b in batches:
        assert b.schema == read.ARROW_SCHEMA
    return pa.Table.from_batches(batches, read.ARROW_SCHEMA).to_pylist() if batches else []


def _same(bodies, start=0, end=10_000, sub="*", expect_kinds=None):
    r = QueueRange(TOPIC, MQ.broker_name, MQ.queue_id, start, end)
    wanted = read.tag_set(sub)
    try:
        want = _plain(bodies, r, wanted)
    except Exception as e:          # the plain path's error is the column path's too
        for batch in (True, False):
            with pytest.raises(type(e)) as got_error:
                _columnar(bodies, r, wanted, batch=batch)
            assert str(got_error.value) == str(e)
        return e
    got, parts = _columnar(bodies, r, wanted)
    assert got == want
    alone, alone_parts = _columnar(bodies, r, wanted, batch=False)
    assert alone == want
    if expect_kinds is not None:
        assert [type(p).__name__ for p in alone_parts] == expect_kinds
    return got


def test_record_starts_and_head_positions():
    body = _body(10, 6, {2: {"compressed": True}, 4: {"born": V6}, 5: {"store": V6}})
    starts, slow = msgcodec.record_starts(body)
    records = msgcodec.decode_records_raw(body)
    assert starts[0] == 0 and len(starts) == 6 and slow == [2, 4, 5]
    assert [starts[k + 1] - starts[k] for k in range(5)] == [t[15] for t in records[:5]]
    for sys_flag, t, pos in ((0, records[0], starts[0]), (records[5][6], records[5], starts[5])):
        p = msgcodec.head_positions(sys_flag)
        assert int.from_bytes(body[pos + p["queue_offset"]:pos + p["queue_offset"] + 8], "big") == t[3]
        assert int.from_bytes(body[pos + p["store_timestamp"]:pos + p["store_timestamp"] + 8], "big") == t[10]
        assert body[pos + p["store_host"]:pos + p["store_port"]] == t[11][0]
        assert body[pos + p["body"]:pos + p["body"] + len(t[1])] == t[1]
    assert msgcodec.record_starts(b"") == ([], [])
    assert msgcodec.record_starts(body[:-1]) is None                     # the last size overruns
    assert msgcodec.record_starts(body + b"\x00" * 10) is None            # a tail too short for a head


def _poison(body: bytes, index: int, field: str) -> bytes:
    """body with one record spoiled: its magic code, or a property byte made invalid UTF-8."""
    starts, _ = msgcodec.record_starts(body)
    pos = starts[index]
    b = bytearray(body)
    if field == "magic":
        b[pos + 4:pos + 8] = b"\x00\x00\x00\x01"
    else:
        end = starts[index + 1] if index + 1 < len(starts) else len(body)
        b[end - 1] = 0xFF
    return bytes(b)


def _negative_size(body: bytes, index: int) -> bytes:
    """body with one record's TOTALSIZE given its sign bit (a negative int, as Java reads it)."""
    pos = msgcodec.record_starts(body)[0][index]
    b = bytearray(body)
    b[pos] |= 0x80
    return bytes(b)


def _negative_properties_length(body: bytes, index: int) -> bytes:
    """body with one record's PROPERTIESLENGTH (a signed short) negative, its bytes kept."""
    starts, _ = msgcodec.record_starts(body)
    end = starts[index + 1] if index + 1 < len(starts) else len(body)
    records = msgcodec.decode_records_raw(body)
    props_len = len(records[index][4].encode())
    b = bytearray(body)
    at = end - props_len - 2
    assert int.from_bytes(b[at:at + 2], "big") == props_len
    b[at] |= 0x80
    return bytes(b)


def test_frame_refuses_a_negative_properties_length():
    """_frame reads PROPERTIESLENGTH as a signed short: a negative one is refused (None: the
    body is then decoded record by record), not read as a length near 65,536."""
    from pocketmq.spark import read

    body = _negative_properties_length(_body(0, 4), 1)
    starts, slow = msgcodec.record_starts_np(body)
    assert not len(slow) and len(starts) == 4
    assert read._frame(body, starts) is None
    assert read._frame(_body(0, 4), starts) is not None


def _magic_in_body(n: int) -> bytes:
    """n records whose message bodies hold MAGICCODE's bytes (a false start for a search)."""
    magic = msgcodec.MESSAGE_MAGIC_CODE.to_bytes(4, "big", signed=True)
    return b"".join(_record(k, offset=k, body=b"\x00\x00\x01\x00" + magic + b"x" * k) for k in range(n))


@pytest.mark.parametrize("name, body", [
    ("plain", _body(0, 40)),
    ("slow ones", _body(10, 6, {2: {"compressed": True}, 4: {"born": V6}, 5: {"store": V6}})),
    ("a batch", _batch_body(3, 9)),
    ("magic inside bodies", _magic_in_body(5)),
    ("another magic code", _poison(_body(0, 6), 3, "magic")),
    ("first magic spoiled", _poison(_body(0, 6), 0, "magic")),
    ("last size overruns", _body(0, 5)[:-1]),
    ("a tail too short for a head", _body(0, 5) + b"\x00" * 10),
    ("junk after the records", _body(0, 5) + b"\x00" * 100),
    ("one record", _body(0, 1)),
    ("a negative size", _negative_size(_body(0, 6), 2)),
    ("the first size negative", _negative_size(_body(0, 6), 0)),
    ("empty", b""),
    ("shorter than a head", b"\x00\x00\x00\x10abc"),
])
def test_record_starts_np_is_record_starts(name, body):
    """The numpy walk (magic-code search, chain check) answers what the Python walk does,
    falling back to it where the search is not conclusive."""
    want = msgcodec.record_starts(body)
    got = msgcodec.record_starts_np(body)
    if want is None:
        assert got is None
    else:
        assert (got[0].tolist(), got[1].tolist()) == want
        assert got[0].dtype == np.int64 and got[1].dtype == np.int64


def test_record_starts_np_needs_no_python_walk_for_plain_bodies(monkeypatch):
    body = _body(0, 50, {7: {"compressed": True}})
    want = msgcodec.record_starts(body)

    def refuse(_buf):
        raise AssertionError("walked record by record")
    monkeypatch.setattr(msgcodec, "record_starts", refuse)
    starts, slow = msgcodec.record_starts_np(body)
    assert (starts.tolist(), slow.tolist()) == want and slow.tolist() == [7]
    with pytest.raises(AssertionError, match="record by record"):
        msgcodec.record_starts_np(_magic_in_body(3))        # a false start: the walk decides


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_plain_bodies_take_the_column_path_and_match(seed):
    rnd = random.Random(seed)
    texts = [None, "", "TAGS\x01x\x02TAGS\x01", "a\x011\x02a\x012", "\x01\x02UNIQ_KEY\x01",
             "ключ\x01значение\x02TAGS\x01標籤", "KEYS\x01k1 k2\x02WAIT\x01true"]
    bodies = []
    offset = 0
    for _ in range(4):
        n = rnd.randrange(1, 60)
        bodies.append(b"".join(_record(offset + k, offset=offset + k, text=rnd.choice(texts),
                                       born=rnd.choice((V4, V4B)), topic=rnd.choice((TOPIC, "Тема")),
                                       body=rnd.choice((None, b"", b"\x00\xff" * 3)))
                               for k in range(n)))
        offset += n
    rows = _same(bodies, expect_kinds=["ColumnSegment"] * 4)
    assert len(rows) == offset
    assert {r["born_host"] for r in rows} <= {"127.0.0.1:40123", "10.1.2.3:51000"}


def test_batch_records_and_several_pulls_in_one_batch():
    rows = _same([_batch_body(0, 40), _body(40, 3), _batch_body(43, 7)], expect_kinds=["ColumnSegment"] * 3)
    assert [r["queue_offset"] for r in rows] == list(range(50))
    assert rows[0]["born_host"] == "10.1.2.3:51000" and rows[40]["born_host"] == "127.0.0.1:40123"


def _framed(monkeypatch) -> list[int]:
    """The row count of every _frame call from here on."""
    calls = []
    real = read._frame

    def counting(body, starts):
        calls.append(len(starts))
        return real(body, starts)
    monkeypatch.setattr(read, "_frame", counting)
    return calls


def test_a_batch_of_plain_bodies_is_framed_once(monkeypatch):
    """pull_range's batch of several pulls whose bodies hold column-wise records only, each
    kept whole: one _frame over the joined bodies (one ColumnSegment), the same rows."""
    bodies = [_body(0, 20), _batch_body(20, 15), _body(35, 1), _body(36, 30)]
    r = QueueRange(TOPIC, MQ.broker_name, MQ.queue_id, 0, 66)
    want = _plain(bodies, r, None)
    calls = _framed(monkeypatch)
    got, parts = _columnar(bodies, r, None)
    assert got == want and [r["queue_offset"] for r in got] == list(range(66))
    assert calls == [66] and [type(p).__name__ for p in parts] == ["ColumnSegment"]
    alone, _ = _columnar(bodies[:1], r, None)       # one body: framed as it is, not copied
    assert alone == want[:20] and calls == [66, 20]


@pytest.mark.parametrize("case", ["compressed", "ipv6", "end_inside", "start_inside", "gap", "tags", "utf8",
                                  "not_found"])
def test_a_batch_is_framed_body_by_body_unless_every_body_is_kept_whole(case, monkeypatch, caplog):
    """Whatever would make _judge cut, drop, warn or raise, a body hold records the column
    path leaves out, or a record the column path cannot frame (not UTF-8): each body is taken
    on its own, and the rows, the errors and the data-loss decisions are the plain path's."""
    special = {"compressed": {3: {"compressed": True}}, "ipv6": {5: {"born": V6}},
               "utf8": {2: {"text": "TAGS\x01ok"}}}.get(case, {})
    bodies = [_body(0, 10), _body(10, 10, special), _body(20, 10)]
    if case == "utf8":
        bodies[1] = _poison(bodies[1], 2, "utf8")
    start, end, sub = {"end_inside": (0, 25), "start_inside": (4, 30), "gap": (0, 30)}.get(case, (0, 30)) + ("*",)
    if case == "tags":
        sub = "TagA"
    if case == "gap":
        bodies = [bodies[0], bodies[2]]     # offsets 10..19 gone: the second pull's first record is 20
    r = QueueRange(TOPIC, MQ.broker_name, MQ.queue_id, start, end)
    calls = _framed(monkeypatch)
    if case == "not_found":
        results = [PullResult(PullResult.FOUND, 10, 0, 10_000, [], 0, bodies[0]),
                   PullResult(PullResult.NO_MATCHED_MSG, 20, 0, 10_000, [])]
        parts, offset = read._batch_parts(results, r, 0, None, True, MQ, "addr")
        assert offset == 20 and calls == [10] and _rows(read.parts_to_batches(parts, MQ.broker_name)) \
            == _plain(bodies[:1], r, None)
        return
    with caplog.at_level(logging.WARNING):
        got = _same(bodies, start=start, end=end, sub=sub)
    if case == "utf8":      # framing the joined bodies is tried; its UTF-8 check declines it
        calls.remove(30)
    assert calls and max(calls) <= 10
    if case == "gap":
        assert isinstance(got, DataLossError)


def test_compressed_and_ipv6_records_are_merged_in_queue_order():
    body = _body(0, 9, {0: {"compressed": True}, 3: {"born": V6}, 4: {"store": V6, "text": ""},
                          8: {"born": V6, "store": V6}})
    rows = _same([body], expect_kinds=["list", "ColumnSegment", "list", "list", "ColumnSegment", "list"])
    assert [r["queue_offset"] for r in rows] == list(range(9))
    assert rows[0]["body"] == bytes([0]) * 0 + "é".encode()          # decompressed
    assert rows[3]["born_host"] == msgcodec.format_host(*V6)
    assert rows[4]["msg_id"] == msgcodec.offset_msg_id(V6[0], V6[1], 1_000_000 + 400 * 4)


def test_missing_uniq_key_falls_back_to_the_offset_msg_id():
    rows = _same([_body(0, 12, {k: {"text": ""} for k in range(0, 12, 2)})])
    assert rows[0]["msg_id"] == msgcodec.offset_msg_id(STORE[0], STORE[1], 1_000_000)
    assert rows[1]["msg_id"] == "U00000001"
    assert rows[0]["properties"] == [] and rows[0]["tags"] is None


@pytest.mark.parametrize("sub", ["TagA", "TagB || TagA", "TagC", "x"])
def test_tag_filter_matches(sub):
    texts = {1: {"text": "TAGS\x01x\x02TAGS\x01"}, 2: {"text": "TAGS\x01\x02TAGS\x01x"}, 5: {"text": ""}}
    _same([_body(0, 20, texts), _body(20, 20, {3: {"compressed": True}})], sub=sub)


@pytest.mark.parametrize("start,end", [(0, 10_000), (5, 10_000), (0, 37), (13, 14), (39, 40), (41, 90)])
def test_ranges_cut_mid_pull(start, end):
    bodies = [_body(0, 20, {7: {"compressed": True}}), _body(20, 20)]
    bodies = [b for b, first in zip(bodies, (0, 20)) if first + 20 > start]
    rows = _same(bodies, start=start, end=end)
    assert [r["queue_offset"] for r in rows] == list(range(start, min(end, 40)))


def test_data_loss_decided_the_same(caplog):
    r = QueueRange(TOPIC, MQ.broker_name, MQ.queue_id, 3, 100)
    bodies = [_body(10, 5)]
    with pytest.raises(DataLossError) as plain:
        _plain(bodies, r, None)
    with pytest.raises(DataLossError) as col:
        _columnar(bodies, r, None)
    assert str(col.value) == str(plain.value)
    with caplog.at_level(logging.WARNING, "pocketmq.spark"):
        got, _ = _columnar(bodies, r, None, fail=False)
    assert got == _plain(bodies, r, None, fail=False) and len(got) == 5
    assert "skipping them" in caplog.text
    # with a tag filter the broker skips what does not match: a gap is no loss
    assert _columnar(bodies, r, read.tag_set("TagA"))[0] == _plain(bodies, r, read.tag_set("TagA"))


@pytest.mark.parametrize("field", ["magic", "utf8"])
@pytest.mark.parametrize("index", [0, 4, 9])
def test_undecodable_records_are_skipped_like_the_client_does(field, index, caplog):
    with caplog.at_level(logging.ERROR, "pocketmq.client"):
        rows = _same([_poison(_body(0, 10), index, field), _body(10, 5)])
    assert "skipping undecodable message" in caplog.text
    if index == 0:      # the first record skipped looks like a gap at the range's start
        assert isinstance(rows, DataLossError)
    else:
        assert index not in [r["queue_offset"] for r in rows] and len(rows) == 14


def test_broken_framing_raises_what_the_client_raises():
    body = _body(0, 5)
    for broken in (body[:-3], body + b"\x00" * 50):
        r = QueueRange(TOPIC, MQ.broker_name, MQ.queue_id, 0, 100)
        with pytest.raises(MQClientError) as plain:
            _plain([broken], r, None)
        with pytest.raises(MQClientError) as col:
            _columnar([broken], r, None)
        assert str(col.value) == str(plain.value)


def test_inner_framing_off_takes_the_plain_path():
    """A record whose sizes fit the body but whose inner lengths do not add up (body
    length past the end): the body is decoded whole (the client's salvage)."""
    body = bytearray(_body(0, 4))
    starts, _ = msgcodec.record_starts(bytes(body))
    pos = starts[1] + msgcodec.head_positions(0)["body_length"]
    body[pos:pos + 4] = (10_000).to_bytes(4, "big")
    segments = read._body_segments(bytes(body), MQ, "addr")
    assert [type(s) for s in segments] == [list]
    _same([bytes(body)])


@pytest.mark.parametrize("columns", [("queue_offset",), ("body", "queue_id", "store_timestamp"),
                                     ("msg_id", "topic"), ("properties", "tags", "born_host", "keys"),
                                     ("reconsume_times", "born_timestamp", "broker_name")])
def test_columns_asked_for_are_the_full_batch_s_columns(columns):
    """A projection (schema.projection) gives the full batch's columns, in its order, on both
    paths (column-wise, and records_to_batch for the compressed and IPv6 records)."""
    body = _body(0, 30, {2: {"compressed": True}, 9: {"born": V6}, 11: {"text": ""}, 12: {"text": "a\x011\x02a\x012"}})
    r = QueueRange(TOPIC, MQ.broker_name, MQ.queue_id, 0, 10_000)
    res = PullResult(PullResult.FOUND, 30, 0, 10_000, [], 0, body)
    parts, _ = read._judge(res, r, 0, None, True, read._body_segments(body, MQ, "addr"))
    full = pa.Table.from_batches(list(read.parts_to_batches(parts, MQ.broker_name)))
    got = list(read.parts_to_batches(parts, MQ.broker_name, columns))
    assert [b.schema.names for b in got] == [list(columns)] * len(got) and len(got) == 5
    assert pa.Table.from_batches(got).to_pylist() == full.select(list(columns)).to_pylist()
    assert read.records_to_batch([], MQ.broker_name, columns).schema.names == list(columns)
    assert read.segments_to_batch([], MQ.broker_name, columns).num_rows == 0



class _FakeQueue:
    """A queue of `n` records from queue offset 0 behind a fake client instance (no
    sockets), pulls of at most `per_pull` records; `answers` overrides the answer at an
    offset (status, next_begin_offset, min_offset)."""

    def __init__(self, n: int, per_pull: int, answers: dict | None = None):
        self.n, self.per_pull, self.answers = n, per_pull, answers or {}
        self.asked: list[int] = []

    async def master_addr_refreshing(self, broker_name, topic):
        return "addr"

    @property
    def api(self):
        return self

    async def pull_message(self, req):
        self.asked.append(req.offset)
        if req.offset in self.answers:
            status, nxt, min_offset = self.answers[req.offset]
            return PullResult(status, nxt, min_offset, self.n, [])
        count = min(self.per_pull, req.max_nums, self.n - req.offset)
        return PullResult(PullResult.FOUND, req.offset + count, 0, self.n, [], 0, _body(req.offset, count))


def _fake_submits(monkeypatch, queue: _FakeQueue) -> list:
    """session.submit_with_instance against `queue`: each batch's pulls run when its result
    is first asked for (a batch cancelled before that never pulls). Returns the Futures."""
    import asyncio
    import concurrent.futures

    from pocketmq.spark import session

    class Lazy(concurrent.futures.Future):
        def __init__(self, fn):
            super().__init__()
            self.fn = fn

        def result(self, timeout=None):
            if not self.done():
                self.set_result(asyncio.run(self.fn(queue)))
            return super().result(timeout)

    submitted = []

    def submit(namesrv_addr, fn, credentials=None, tls=False):
        submitted.append(Lazy(fn))
        return submitted[-1]
    monkeypatch.setattr(session, "submit_with_instance", submit)
    return submitted


def _offsets(batches) -> list[int]:
    return [row["queue_offset"] for parts in batches for row in _rows(read.parts_to_batches(parts, MQ.broker_name))]


def test_the_next_batch_is_pulled_while_this_one_is_decoded(monkeypatch):
    """pull_range asks for the next batch's pulls before it hands this batch out, from where
    this batch's last pull ended; the rows are every record once, in order."""
    queue = _FakeQueue(100, per_pull=10)
    submitted = _fake_submits(monkeypatch, queue)
    batches = read.pull_range("ns", QueueRange(TOPIC, MQ.broker_name, MQ.queue_id, 0, 100), "*", True, rows=30)
    first = next(batches)
    assert len(submitted) == 2 and not submitted[1].done()      # the second batch asked for, not yet waited on
    assert _offsets([first]) + _offsets(batches) == list(range(100))
    assert queue.asked == list(range(0, 100, 10)) and len(submitted) == 4
    assert not any(f.cancelled() for f in submitted)


def test_a_batch_pulled_ahead_is_dropped_when_judging_moves_the_offset(monkeypatch, caplog):
    """failOnDataLoss=false, and the last pull of a batch finds its offset deleted (no match,
    the queue's min past it): the batch asked ahead from that pull's next offset is cancelled
    before it pulls anything, and the next is asked from the queue's min, where judging went."""
    queue = _FakeQueue(100, per_pull=10, answers={30: (PullResult.NO_MATCHED_MSG, 40, 50)})
    submitted = _fake_submits(monkeypatch, queue)
    with caplog.at_level(logging.WARNING, "pocketmq.spark"):
        got = _offsets(read.pull_range("ns", QueueRange(TOPIC, MQ.broker_name, MQ.queue_id, 0, 100), "*", False,
                                       rows=30))
    assert got == list(range(30)) + list(range(50, 100)) and "skipping them" in caplog.text
    assert queue.asked == [0, 10, 20, 30, 50, 60, 70, 80, 90]      # nothing pulled at 40
    assert [f.cancelled() for f in submitted] == [False, False, True, False, False]


def test_closing_the_reader_early_cancels_the_batch_pulled_ahead(monkeypatch):
    queue = _FakeQueue(100, per_pull=10)
    submitted = _fake_submits(monkeypatch, queue)
    batches = read.pull_range("ns", QueueRange(TOPIC, MQ.broker_name, MQ.queue_id, 0, 100), "*", True, rows=30)
    next(batches)
    batches.close()
    assert len(submitted) == 2 and submitted[1].cancelled() and queue.asked == [0, 10, 20]
