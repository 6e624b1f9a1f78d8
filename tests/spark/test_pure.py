"""The connector's pure parts: options, range resolution and splitting, Arrow batches.
No sockets, no Spark session (pyarrow only)."""
from __future__ import annotations

import json

import pytest

from pocketmq.protocol import message as msgcodec
from pocketmq.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    offsets_from_json,
    offsets_to_json,
    parse_offsets_spec,
    parse_reader_options,
    parse_writer_options,
    queue_key,
    tag_set,
)
from pocketmq.spark.plan import DataLossError, QueueRange, admit, resolve_range, split_ranges
from pocketmq.spark.schema import ARROW_SCHEMA, COLUMNS, DDL, SchemaError, arrow_schema, projection

pytestmark = pytest.mark.spark
pa = pytest.importorskip("pyarrow")


def test_offsets_spec_forms():
    assert parse_offsets_spec("startingOffsets", None, EARLIEST) == EARLIEST
    assert parse_offsets_spec("startingOffsets", "Latest", EARLIEST) == LATEST
    assert parse_offsets_spec("x", '{"T": {"broker-a:0": 5, "b:c:1": -2}}', LATEST) == \
        {"T": {("broker-a", 0): 5, ("b:c", 1): EARLIEST}}
    for bad in ('{"T": {"broker-a": 5}}', '{"T": {"a:0": -3}}', '{"T": 3}', "[1]", "soon"):
        with pytest.raises(OptionError, match="option x"):
            parse_offsets_spec("x", bad, LATEST)


def test_reader_options_are_case_insensitive_and_checked():
    o = parse_reader_options({"namesrvaddr": "h:1", "subscribe": "A, B,A", "minpartitions": "3",
                              "failondataloss": "false", "subexpression": "x || y"})
    assert (o.namesrv_addr, o.topics, o.min_partitions, o.fail_on_data_loss) == ("h:1", ("A", "B"), 3, False)
    assert tag_set(o.sub_expression) == {"x", "y"} and tag_set("*") is None
    with pytest.raises(OptionError, match="namesrvAddr is required"):
        parse_reader_options({"subscribe": "A"})
    with pytest.raises(OptionError, match="not both"):
        parse_reader_options({"namesrvAddr": "h:1", "subscribe": "A", "subscribePattern": "A.*"})
    with pytest.raises(OptionError, match="subscribePattern is not a valid regex"):
        parse_reader_options({"namesrvAddr": "h:1", "subscribePattern": "("})
    with pytest.raises(OptionError, match="failOnDataLoss"):
        parse_reader_options({"namesrvAddr": "h:1", "subscribe": "A", "failOnDataLoss": "maybe"})
    w = parse_writer_options({"namesrvAddr": "h:1"})
    assert (w.topic, w.producer_group, w.batch_size) == (None, "spark-writer", 256)


def test_resolve_range():
    assert resolve_range("T", "b", 0, 5, 20, EARLIEST, LATEST, True) == (5, 20)
    assert resolve_range("T", "b", 0, 5, 20, 7, 30, True) == (7, 20)
    assert resolve_range("T", "b", 0, 5, 20, LATEST, LATEST, True) is None
    with pytest.raises(DataLossError, match="offsets 2..4 of topic T broker b queue 0"):
        resolve_range("T", "b", 0, 5, 20, 2, LATEST, True)
    assert resolve_range("T", "b", 0, 5, 20, 2, LATEST, False) == (5, 20)
    with pytest.raises(DataLossError, match="offsets 2..3 of topic T"):     # all of the wanted part is gone
        resolve_range("T", "b", 0, 5, 20, 2, 4, True)
    assert resolve_range("T", "b", 0, 5, 20, 2, 4, False) is None


def test_split_ranges_covers_each_offset_once():
    ranges = [QueueRange("T", "a", 0, 0, 100), QueueRange("T", "a", 1, 10, 13), QueueRange("T", "b", 0, 0, 1)]
    out = split_ranges(ranges, 8)
    assert len(out) >= 8
    for q in (("a", 0), ("a", 1), ("b", 0)):
        parts = [r for r in out if (r.broker_name, r.queue_id) == q]
        covered = [o for r in parts for o in range(r.start, r.end)]
        orig = next(r for r in ranges if (r.broker_name, r.queue_id) == q)
        assert covered == list(range(orig.start, orig.end))
    assert split_ranges(ranges, None) == sorted(ranges)
    assert len(split_ranges([QueueRange("T", "a", 0, 0, 2)], 10)) == 2     # cannot split below one message


def test_records_to_batch_columns():
    from pocketmq.spark.read import records_to_batch
    from pocketmq.spark.schema import ARROW_SCHEMA

    props = msgcodec.encode_properties({"TAGS": "t", "KEYS": "k1 k2", "UNIQ_KEY": "U1", "WAIT": "true", "a": "1"})
    host = (b"\x7f\x00\x00\x01", 1234)
    recs = [("T", b"x", 2, 7, props, 0, 0, 99, 1_000, host, 2_000, host, 1, 0, 0, 0),
            ("T", b"", 2, 8, "", 0, 0, 150, 1_001, host, 2_001, host, 0, 0, 0, 0)]
    b = records_to_batch(recs, "broker-a")
    assert b.schema == ARROW_SCHEMA
    d = b.to_pydict()
    assert d["msg_id"][0] == "U1" and d["msg_id"][1] == msgcodec.offset_msg_id(host[0], host[1], 150)
    assert d["tags"] == ["t", None] and d["keys"] == ["k1 k2", None]
    assert d["properties"] == [[("a", "1")], []]
    assert d["broker_name"] == ["broker-a"] * 2 and d["queue_offset"] == [7, 8]
    assert [t.timestamp() for t in d["store_timestamp"]] == [2.0, 2.001]
    assert d["born_host"] == ["127.0.0.1:1234"] * 2 and d["reconsume_times"] == [1, 0]


def test_stream_options():
    o = parse_reader_options({"namesrvAddr": "h:1", "subscribe": "A", "maxOffsetsPerTrigger": "100",
                              "groupId": "g1"}, streaming=True)
    assert (o.starting, o.ending, o.max_offsets_per_trigger, o.group_id) == (LATEST, LATEST, 100, "g1")
    assert parse_reader_options({"namesrvAddr": "h:1", "subscribe": "A"}).starting == EARLIEST   # batch
    for name in ("endingOffsets", "endingTimestamp"):
        with pytest.raises(OptionError, match=f"option {name} is for batch reads only"):
            parse_reader_options({"namesrvAddr": "h:1", "subscribe": "A", name: "5"}, streaming=True)
    with pytest.raises(OptionError, match="maxOffsetsPerTrigger must be >= 1"):
        parse_reader_options({"namesrvAddr": "h:1", "subscribe": "A", "maxOffsetsPerTrigger": "0"}, streaming=True)
    with pytest.raises(OptionError, match="option groupId: .*illegal characters"):
        parse_reader_options({"namesrvAddr": "h:1", "subscribe": "A", "groupId": "bad group"}, streaming=True)


def test_offsets_json_round_trip_in_canonical_order():
    table = {("T2", "b", 10): 7, ("T1", "broker-b", 0): 0, ("T2", "b", 2): 3, ("T1", "a:x", 1): 12}
    doc = offsets_to_json(table)
    assert json.dumps(doc) == json.dumps(
        {"T1": {"a:x:1": 12, "broker-b:0": 0}, "T2": {"b:2": 3, "b:10": 7}})   # queue ids numerically
    assert offsets_from_json(json.loads(json.dumps(doc))) == table
    assert offsets_to_json(dict(reversed(list(table.items())))) == doc
    # the checkpoint holds positions: no -2 / -1 there
    with pytest.raises(OptionError, match="stream offset: offset of T b:0 must be an integer >= 0"):
        offsets_from_json({"T": {"b:0": -1}})
    with pytest.raises(OptionError, match="must be brokerName:queueId"):
        offsets_from_json({"T": {"b": 1}})
    assert queue_key("broker-a", 3) == "broker-a:3"


def test_admit_splits_the_cap_by_backlog():
    a, b, c = ("T", "a", 0), ("T", "a", 1), ("T", "b", 0)
    # everything fits: the targets
    assert admit({a: 5, b: 0}, {a: 10, b: 3}, 100) == {a: 10, b: 3}
    assert admit({a: 5}, {a: 10, c: 4}, None) == {a: 10, c: 4}          # a queue missing from starts starts at 0
    # proportional to the backlog, summing exactly to the cap
    got = admit({a: 0, b: 0, c: 0}, {a: 600, b: 300, c: 100}, 100)
    assert got == {a: 60, b: 30, c: 10}
    got = admit({a: 0, b: 0, c: 0}, {a: 10, b: 10, c: 10}, 10)
    assert sum(got.values()) == 10 and max(got.values()) - min(got.values()) <= 1
    # a small queue next to a huge one still moves while the cap allows one offset per queue
    got = admit({a: 0, b: 0}, {a: 1_000_000, b: 1}, 10)
    assert got == {a: 9, b: 1}
    # never past a target, never below a start (a queue whose max fell behind its offset)
    got = admit({a: 50, b: 0}, {a: 20, b: 1000}, 10)
    assert got == {a: 50, b: 10}
    for cap in range(1, 40):
        starts = {a: 3, b: 0, c: 7}
        targets = {a: 20, b: 5, c: 9}
        got = admit(starts, targets, cap)
        assert sum(got[k] - starts[k] for k in got) == min(cap, 24)
        assert all(starts[k] <= got[k] <= targets[k] for k in got)


class _FakeStreamReader:
    """PocketMQStreamReader with the cluster replaced by a table of (min, max) offsets."""

    @staticmethod
    def make(bounds, **options):
        pytest.importorskip("pyspark")
        from pocketmq.spark.stream import PocketMQStreamReader

        class Reader(PocketMQStreamReader):
            def _refresh_bounds(self):
                self._bounds = dict(self.fake_bounds)
                return self._bounds

        r = Reader({"namesrvAddr": "h:1", "subscribe": "T", **options})
        r.fake_bounds = bounds
        return r


def test_stream_reader_latest_offset_queues_come_and_go():
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    a, b, c = ("T", "a", 0), ("T", "a", 1), ("T", "b", 0)
    r = _FakeStreamReader.make({a: (0, 10), b: (0, 4)}, maxOffsetsPerTrigger="7")
    assert r.getDefaultReadLimit() == ReadMaxRows(7)
    start = offsets_to_json({a: 2, b: 4})
    assert r.latestOffset(start, ReadAllAvailable()) == offsets_to_json({a: 10, b: 4})
    assert r.latestOffset(start, ReadMaxRows(3)) == offsets_to_json({a: 5, b: 4})
    assert r.reportLatestOffset() == offsets_to_json({a: 10, b: 4})
    # b vanished from the routes (kept at its offset); c is new: it starts at 0
    r.fake_bounds = {a: (0, 10), c: (0, 6)}
    assert r.latestOffset(start, ReadAllAvailable()) == offsets_to_json({a: 10, b: 4, c: 6})
    # a new queue whose head is gone: the cap is not spent on the lost offsets
    r.fake_bounds = {a: (0, 2), c: (5, 9)}
    assert r.latestOffset(offsets_to_json({a: 2}), ReadMaxRows(2)) == offsets_to_json({a: 2, c: 7})
    # nothing new: the start itself, in the same text, so Spark sees no new data
    r.fake_bounds = {a: (0, 2)}
    assert json.dumps(r.latestOffset(json.loads(json.dumps(offsets_to_json({a: 2}))), ReadAllAvailable())) == \
        json.dumps(offsets_to_json({a: 2}))


def test_stream_reader_available_now_stops_at_its_target():
    from pyspark.sql.streaming.datasource import ReadMaxRows

    a, c = ("T", "a", 0), ("T", "b", 0)
    r = _FakeStreamReader.make({a: (0, 10)})
    r.prepareForTriggerAvailableNow()
    r.fake_bounds = {a: (0, 50), c: (0, 5)}           # more messages and a queue arrive afterwards
    start = offsets_to_json({a: 0})
    end = r.latestOffset(start, ReadMaxRows(6))
    assert end == offsets_to_json({a: 6})
    end = r.latestOffset(end, ReadMaxRows(6))
    assert end == offsets_to_json({a: 10})
    assert r.latestOffset(end, ReadMaxRows(6)) == end  # done: Spark stops the run
    assert r.reportLatestOffset() == offsets_to_json({a: 50, c: 5})


def test_stream_reader_partitions_and_pickling():
    import pickle

    a, b, c = ("T", "a", 0), ("T", "a", 1), ("T", "b", 0)
    r = _FakeStreamReader.make({a: (0, 100), b: (3, 8), c: (0, 1)}, minPartitions="4", failOnDataLoss="false")
    r._refresh_bounds()
    parts = r.partitions(offsets_to_json({a: 0, b: 1, c: 1}), offsets_to_json({a: 40, b: 8, c: 1}))
    ranges = [p.value for p in parts]
    assert len(ranges) == 4 and {(x.topic, x.broker_name, x.queue_id) for x in ranges} == {a, b}
    assert sorted(o for x in ranges if x.queue_id == 0 for o in range(x.start, x.end)) == list(range(40))
    assert [(x.start, x.end) for x in ranges if x.queue_id == 1] == [(3, 8)]      # lost 1..2 skipped
    assert r.partitions(offsets_to_json({a: 5}), offsets_to_json({a: 5})) == []
    strict = _FakeStreamReader.make({b: (3, 8)})
    strict._refresh_bounds()
    with pytest.raises(DataLossError, match="offsets 1..2 of topic T broker a queue 1"):
        strict.partitions(offsets_to_json({b: 1}), offsets_to_json({b: 8}))
    # the executors get the options only, never the driver's connection or its state
    from pocketmq.spark.stream import PocketMQStreamReader

    real = PocketMQStreamReader({"namesrvAddr": "h:1", "subscribe": "T"})
    real._latest, real._bounds, real._target = {a: 1}, {a: (0, 1)}, {a: 1}
    back = pickle.loads(pickle.dumps(real))
    assert back.opts == real.opts and back._inst is None and back._latest is None and back._bounds == {}
    # ... and the columns a given schema asked for (schema.projection)
    narrow = pickle.loads(pickle.dumps(PocketMQStreamReader({"namesrvAddr": "h:1", "subscribe": "T"},
                                                            ("queue_offset", "body"))))
    assert narrow.columns == ("queue_offset", "body") and back.columns is None


def test_stream_reader_stores_group_offsets_that_moved():
    import asyncio

    from pyspark.sql.streaming.datasource import ReadAllAvailable

    a, b = ("T", "a", 0), ("T", "b", 0)

    class FakeApi:
        def __init__(self):
            self.calls = []

        async def update_consumer_offset(self, addr, group, mq, offset):
            self.calls.append((addr, group, mq.topic, mq.broker_name, mq.queue_id, offset))
            if mq.broker_name == "b":
                raise ConnectionError("broker b is away")

    class FakeInst:
        api = FakeApi()

        async def master_addr_refreshing(self, broker, topic):
            return f"{broker}:10911"

    inst = FakeInst()
    r = _FakeStreamReader.make({a: (0, 10), b: (0, 10)}, groupId="G")
    r._run = lambda fn: asyncio.run(fn(inst))
    r.latestOffset(offsets_to_json({a: 3, b: 4}), ReadAllAvailable())     # start: a completed batch's end
    assert sorted(inst.api.calls) == [("a:10911", "G", "T", "a", 0, 3), ("b:10911", "G", "T", "b", 0, 4)]
    inst.api.calls.clear()
    r.commit(offsets_to_json({a: 3, b: 4}))             # nothing moved: nothing sent, the failure not retried
    assert inst.api.calls == []
    r.commit(offsets_to_json({a: 9, b: 4}))
    assert inst.api.calls == [("a:10911", "G", "T", "a", 0, 9)]
    plain = _FakeStreamReader.make({a: (0, 10)})
    plain._run = lambda fn: pytest.fail("no groupId: nothing is stored")
    plain.commit(offsets_to_json({a: 1}))


def test_stream_reader_queue_that_went_back():
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    a, b = ("T", "a", 0), ("T", "b", 0)
    start = offsets_to_json({a: 50, b: 7})
    strict = _FakeStreamReader.make({a: (0, 3), b: (0, 9)})
    with pytest.raises(DataLossError, match="topic T broker a queue 0 now ends at offset 3, before the stream's "
                                            "offset 50.*failOnDataLoss=false"):
        strict.latestOffset(start, ReadAllAvailable())
    lax = _FakeStreamReader.make({a: (0, 3), b: (0, 9)}, failOnDataLoss="false")
    end = lax.latestOffset(start, ReadAllAvailable())
    assert end == offsets_to_json({a: 0, b: 9})          # back to the min; read from there next
    assert [(p.value.queue_id, p.value.broker_name, p.value.start, p.value.end)
            for p in lax.partitions(start, end)] == [(0, "b", 7, 9)]
    assert lax.latestOffset(end, ReadAllAvailable()) == offsets_to_json({a: 3, b: 9})


# -- records_to_batch's vectorised properties, pinned to the per-row decode_properties path

_TRICKY_PROPERTIES = [
    "", "a\x01b", "\x01x", "x\x01", "\x01", "\x02", "\x02\x02", "a\x01b\x01c", "a\x01b\x02", "\x02a\x01b",
    "a\x011\x02a\x012", "a\x011\x02b\x012\x02a\x013", "TAGS\x01t1\x02TAGS\x01t2", "UNIQ_KEY\x01",
    "UNIQ_KEY\x01\x02KEYS\x01k1 k2", "ключ\x01значение\x02é\x01ü\x02TAGS\x01標籤", "n\nl\x01v\nw\x02\x01\x01\x01",
    "KEYS\x01k\x02WAIT\x01true\x02color\x01red\x02UNIQ_KEY\x01U9\x02TAGS\x01x\x02",
    "TAGS\x01\x02TAGS\x01late", "a\x01\x02a\x01b", "\x01a\x01b\x02c\x01\x01",
]


def _fuzz_properties(seed: int, rows: int) -> list[str]:
    import random

    rnd = random.Random(seed)
    atoms = ["a", "b", "\x01", "\x02", "é", "TAGS", "KEYS", "UNIQ_KEY", "WAIT", "x y", "\x01\x01", "😀"]
    return ["".join(rnd.choice(atoms) for _ in range(rnd.randrange(0, 12))) for _ in range(rows)]


def _raw_records(texts: list[str]) -> list[tuple]:
    host = (b"\x7f\x00\x00\x01", 1234)
    store = (b"\x0a\x00\x00\x02", 10911)
    return [("T", bytes([i % 256]) * (i % 5), 3, 100 + i, text, 0, 0, 1000 * i, 1_000 + i,
             host if i % 3 else (b"\x00" * 15 + b"\x01", 99), 2_000 + i, store, i % 4, 0, 0, 0)
            for i, text in enumerate(texts)]


def _expected_columns(records: list[tuple], broker_name: str) -> dict:
    """The plain construction: decode_properties per row."""
    cols: dict = {name: [] for name in ("msg_id", "tags", "keys", "properties", "born_host", "body",
                                        "queue_offset", "reconsume_times", "broker_name")}
    for t in records:
        props = msgcodec.decode_properties(t[4])
        cols["msg_id"].append(props.get("UNIQ_KEY") or msgcodec.offset_msg_id(t[11][0], t[11][1], t[7]))
        cols["tags"].append(props.get("TAGS"))
        cols["keys"].append(props.get("KEYS"))
        cols["properties"].append([(k, v) for k, v in props.items() if k not in msgcodec.SYSTEM_PROPERTY_KEYS])
        cols["born_host"].append(msgcodec.format_host(*t[9]))
        cols["body"].append(t[1])
        cols["queue_offset"].append(t[3])
        cols["reconsume_times"].append(t[12])
        cols["broker_name"].append(broker_name)
    return cols


@pytest.mark.parametrize("texts", [_TRICKY_PROPERTIES, _fuzz_properties(1, 500), _fuzz_properties(2, 3000),
                                   ["TAGS\x01a\x02KEYS\x01k\x02UNIQ_KEY\x01U\x02c\x01d"] * 50, [""] * 7],
                         ids=["tricky", "fuzz500", "fuzz3000", "uniform", "empty"])
def test_records_to_batch_matches_decode_properties(texts):
    from pocketmq.spark.read import records_to_batch
    from pocketmq.spark.schema import ARROW_SCHEMA

    records = _raw_records(texts)
    b = records_to_batch(records, "broker-x")
    assert b.schema == ARROW_SCHEMA and b.num_rows == len(records)
    got = b.to_pydict()
    for name, want in _expected_columns(records, "broker-x").items():
        assert got[name] == want, name


def test_properties_map_is_vectorised_without_duplicate_names(monkeypatch):
    """Rows whose user properties never repeat a name take the pyarrow.compute path only
    (the per-row rebuild is for repeats), and it gives decode_properties' dicts."""
    import pyarrow.compute as pc

    from pocketmq.spark import read

    texts = [t for t in _fuzz_properties(3, 2000) if t]
    texts = [t for t in texts if len(_user_names(t)) == len(set(_user_names(t)))] + _TRICKY_PROPERTIES[:10]
    assert any(len(_user_names(t)) > 1 for t in texts)
    want = read._user_map_plain(texts)

    def refuse(_texts):
        raise AssertionError("per-row path taken")
    monkeypatch.setattr(read, "_user_map_plain", refuse)
    props = read.Properties(pa.array(texts, pa.string()))
    assert props.user_map().to_pylist() == want.to_pylist()
    for key in ("TAGS", "KEYS", "UNIQ_KEY", "WAIT", "a", "é", "absent"):
        looked_up = props.lookup(key).to_pylist()
        assert looked_up == [msgcodec.decode_properties(t).get(key) for t in texts], key
        # the same as pyarrow's map_lookup over a map of every entry (the reader before Properties)
        everything = pa.MapArray.from_arrays(pa.array(props.offsets, pa.int32()), props.names, props.values)
        assert looked_up == pc.map_lookup(everything, key, "last").to_pylist(), key


def _uniform_texts(seed: int, rows: int, names: list[str], trailing: bool = False) -> list[str]:
    import random

    rnd = random.Random(seed)
    values = ["", "v", "red", "k1 k2", "значение", "😀x", "a" * 70, "TAGS", "=", "\x03"]
    return ["\x02".join(f"{n}\x01{rnd.choice(values)}" for n in names) + ("\x02" if trailing else "")
            for _ in range(rows)]


def _check_properties(props, texts: list[str], names) -> None:
    from pocketmq.spark import read

    for key in list(names) + ["absent", "TAGS", "KEYS", "UNIQ_KEY"]:
        assert props.lookup(key).to_pylist() == [msgcodec.decode_properties(t).get(key) for t in texts], key
    assert props.user_map().to_pylist() == read._user_map_plain(texts).to_pylist()


@pytest.mark.parametrize("names,trailing", [
    (["TAGS", "KEYS", "UNIQ_KEY", "color", "WAIT"], False),
    (["UNIQ_KEY"], True),
    (["a", "__STARTDELIVERTIME", "ключ", "x" * 65, "TAGS", "y" * 9, "z" * 16], False),
    (["KEYS", "user"], True),
    # a batch element as the broker stores it: WAIT twice (the element's, then the batch's)
    (["color", "TAGS", "KEYS", "WAIT", "UNIQ_KEY", "WAIT", "CLUSTER"], False),
    (["TAGS", "u", "TAGS", "KEYS", "TAGS"], True),
], ids=["producer", "one-trailing", "lengths", "keys-user-trailing", "batch-element", "system-thrice"])
def test_uniform_properties_match_decode_properties(names, trailing):
    """Rows with the same names in the same order (one producer's messages) take
    UniformProperties: every lookup and the user map as decode_properties gives them,
    empty values dropped, names of every length compared exactly."""
    from pocketmq.spark import read

    texts = _uniform_texts(7, 600, names, trailing)
    arr = pa.array(texts, pa.string())
    props = read.uniform_properties(arr)
    assert props is not None and props.names == names
    _check_properties(props, texts, names)
    assert isinstance(read.properties_columns(arr), read.UniformProperties)
    # a slice of a larger array (offset into its buffers), as a batch's texts can be
    part = pa.array(["TAGS\x01other"] + texts, pa.string()).slice(1)
    _check_properties(read.uniform_properties(part), texts, names)


@pytest.mark.parametrize("case", ["other-name-same-length", "other-count", "empty-name", "repeated-user-name",
                                  "trailing-in-some", "empty-row", "null-row", "one-row",
                                  "last-name-at-the-buffer-end", "no-separator-after-name", "chunk-shorter-than-name",
                                  "name-continued-in-next-row", "row0-chunk-without-name", "name-longer-in-a-row"])
def test_uniform_properties_declines_rows_that_differ(case):
    """What UniformProperties cannot read row-alike is left to Properties (None here), and
    properties_columns still answers as decode_properties."""
    from pocketmq.spark import read

    base = _uniform_texts(8, 40, ["TAGS", "KEYS", "color"])
    texts = list(base)
    if case == "other-name-same-length":
        texts[17] = texts[17].replace("KEYS", "KEYZ")
    elif case == "other-count":
        texts[3] += "\x02extra\x01e"
    elif case == "empty-name":
        texts = ["\x01v\x02" + t for t in texts]
    elif case == "repeated-user-name":
        texts = [t + "\x02color\x01again" for t in texts]
    elif case == "trailing-in-some":
        texts[0] += "\x02"
    elif case == "empty-row":
        texts[11] = ""
    elif case == "one-row":
        texts = texts[:1]
    elif case == "no-separator-after-name":
        texts[21] = texts[21].replace("KEYS\x01", "KEYSx", 1)
    elif case == "chunk-shorter-than-name":
        texts[30] = texts[30].replace(texts[30].split("\x02")[1], "KEY", 1)
    elif case == "name-continued-in-next-row":
        # row 12's last chunk is a prefix of its name ("x" of "xa") and row 13 opens with
        # the rest ("a\x01", its own first name): the bytes from row 12's chunk on read
        # "xa\x01", but across the row's end
        texts = [f"a\x01{i}\x02xa\x01v" for i in range(20)]
        texts[12] = "a\x01t\x02x"
    elif case == "row0-chunk-without-name":
        texts = ["TAGS\x01t\x02plain\x02c\x01d"] * 5
    elif case == "name-longer-in-a-row":
        texts[6] = texts[6].replace("TAGS\x01", "TAGSS\x01", 1)
    if case == "last-name-at-the-buffer-end":
        # the names are the same; the last row's last name ends just before the buffer
        # does (the word-wise compare must not read past it)
        texts = ["v\x01" + "x" * (i % 3) + "\x02ab\x01" + "y" * (i % 4 + 1) for i in range(30)]
        props = read.uniform_properties(pa.array(texts, pa.string()))
        assert props is not None
        _check_properties(props, texts, ["v", "ab"])
        return
    arr = pa.array(texts + ([None] if case == "null-row" else []), pa.string())
    assert read.uniform_properties(arr) is None
    if case != "null-row":
        _check_properties(read.properties_columns(arr), texts, ["TAGS", "KEYS", "color", "KEYZ", "extra"])


def test_uniform_properties_read_values_holding_separators_and_nuls():
    """Only \x02 splits chunks and only a chunk's first \x01 ends its name
    (decode_properties): values holding \x01 or \x00 are read row-alike as it reads them,
    as are empty values in row 0 and single-entry rows."""
    from pocketmq.spark import read

    base = _uniform_texts(9, 40, ["TAGS", "KEYS", "color"])
    cases = {
        "one-in-value": [t.replace("color\x01", "color\x01a\x01", 1) if i % 3 == 0 else t for i, t in enumerate(base)],
        "value-just-one": [t.replace("KEYS\x01", "KEYS\x01\x01", 1) for t in base],
        "nul-in-value": [t.replace("color\x01", "color\x01\x00", 1) for t in base],
        "single-entry": [f"KEYS\x01{'k' * (i % 5)}" for i in range(30)],
        "single-entry-trailing": [f"u\x01\x01{i}\x02" for i in range(30)],
    }
    for name, texts in cases.items():
        names = [c.split("\x01")[0] for c in texts[0].split("\x02") if c]
        props = read.uniform_properties(pa.array(texts, pa.string()))
        assert props is not None, name
        assert props.names == names, name
        _check_properties(props, texts, names)


def test_properties_with_repeated_user_names_keep_dict_order():
    from pocketmq.spark.read import properties_columns

    user = properties_columns(pa.array(["a\x011\x02b\x012\x02a\x013", "b\x01x", "c\x011\x02c\x012"],
                                        pa.string())).user_map()
    assert user.to_pylist() == [[("a", "3"), ("b", "2")], [("b", "x")], [("c", "2")]]


def _user_names(text: str) -> list[str]:
    out = []
    for chunk in text.split("\x02"):
        i = chunk.find("\x01")
        if 0 < i < len(chunk) - 1 and chunk[:i] not in msgcodec.SYSTEM_PROPERTY_KEYS:
            out.append(chunk[:i])
    return out


def test_read_ahead_keeps_order_raises_in_order_and_stops_when_closed():
    import threading

    from pocketmq.spark.read import read_ahead

    assert list(read_ahead(iter(range(50)), 2)) == list(range(50))
    assert list(read_ahead(iter(()), 2)) == []

    def failing():
        yield 1
        yield 2
        raise ValueError("offsets 5..9 are gone")
    got = []
    with pytest.raises(ValueError, match="offsets 5..9 are gone"):
        for x in read_ahead(failing(), 3):
            got.append(x)
    assert got == [1, 2]

    produced = []
    finished = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                produced.append(i)
                yield i
                i += 1
        finally:
            finished.set()
    gen = read_ahead(endless(), 2)
    assert [next(gen), next(gen), next(gen)] == [0, 1, 2]
    gen.close()
    # the producer stops after at most the items the queue held plus the one it was making
    assert finished.wait(10)
    assert len(produced) <= 3 + 2 + 2


def test_projection_of_the_given_schema():
    from pyspark.sql.types import StructType

    def struct(ddl: str) -> StructType:
        # what `.schema(ddl)` hands reader(schema): pyspark parses DDL without a session
        # only through the JSON form, so build it field by field
        from pyspark.sql.types import (BinaryType, IntegerType, LongType, MapType, StringType, StructField,
                                       TimestampNTZType, TimestampType)
        kinds = {"string": StringType(), "int": IntegerType(), "long": LongType(), "bigint": LongType(),
                 "binary": BinaryType(), "timestamp": TimestampType(), "timestamp_ntz": TimestampNTZType(),
                 "map<string,string>": MapType(StringType(), StringType())}
        fields = []
        for part in ddl.split(", "):
            name, kind, *rest = part.split(" ")
            fields.append(StructField(name, kinds[kind], nullable=not rest))
        return StructType(fields)

    assert projection(struct(DDL)) is None
    assert projection(struct("queue_offset long, body binary")) == ("queue_offset", "body")
    assert projection(struct("properties map<string,string>, topic string")) == ("properties", "topic")
    # the full set in another order is a projection too (the batches follow the schema's order)
    reordered = ", ".join(f"{n} {k}" for n, k in reversed(COLUMNS))
    assert projection(struct(reordered)) == tuple(n for n, _ in reversed(COLUMNS))
    assert arrow_schema(("body", "queue_id")).names == ["body", "queue_id"]
    assert arrow_schema(None) == ARROW_SCHEMA
    for ddl, error in (("offset long", "does not have"), ("queue_offset int", "queue_offset is bigint"),
                       ("born_timestamp timestamp_ntz", "the schema says timestamp_ntz"),
                       ("body binary NOT", "nullable"), ("body binary, body binary", "twice")):
        with pytest.raises(SchemaError, match=error):
            projection(struct(ddl))
    with pytest.raises(SchemaError, match="no column"):
        projection(StructType([]))


def test_cut_out_gives_each_range_of_the_buffer():
    """_cut_out (the framing's body / topic / properties columns) against plain slices:
    ranges with and without gaps between them, empty ones, at the buffer's start and end."""
    import random

    import numpy as np

    from pocketmq.spark.read import _cut_out

    rng = random.Random(7)
    for _ in range(50):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
        cuts = sorted(rng.randrange(len(data) + 1) for _ in range(2 * rng.randrange(1, 12)))
        starts, ends = np.array(cuts[0::2], np.int64), np.array(cuts[1::2], np.int64)
        got = _cut_out(pa.py_buffer(data), starts, ends)
        assert got.to_pylist() == [data[s:e] for s, e in zip(cuts[0::2], cuts[1::2])]
    assert _cut_out(pa.py_buffer(b"abc"), np.array([], np.int64), np.array([], np.int64)).to_pylist() == []
