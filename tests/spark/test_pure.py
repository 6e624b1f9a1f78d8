"""The connector's pure parts: options, range resolution and splitting, Arrow batches.
No sockets, no Spark session (pyarrow only)."""
from __future__ import annotations

import pytest

from pocketmq.protocol import message as msgcodec
from pocketmq.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    parse_offsets_spec,
    parse_reader_options,
    parse_writer_options,
    tag_set,
)
from pocketmq.spark.plan import DataLossError, QueueRange, resolve_range, split_ranges

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
    everything, user = read.properties_columns(pa.array(texts, pa.string()))
    assert user.to_pylist() == want.to_pylist()
    for key in ("TAGS", "KEYS", "UNIQ_KEY", "a"):
        looked_up = pc.map_lookup(everything, key, "last").to_pylist()
        assert looked_up == [msgcodec.decode_properties(t).get(key) for t in texts], key


def test_properties_with_repeated_user_names_keep_dict_order():
    from pocketmq.spark.read import properties_columns

    _, user = properties_columns(pa.array(["a\x011\x02b\x012\x02a\x013", "b\x01x", "c\x011\x02c\x012"], pa.string()))
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
