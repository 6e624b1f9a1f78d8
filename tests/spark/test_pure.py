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
