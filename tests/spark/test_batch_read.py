"""Batch reads against nameserver + brokers: exactly the messages sent, bounds honoured."""
from __future__ import annotations

import json
import time

import pytest

from pocketmq.client import Message, sync
from pocketmq.protocol.bodies import MessageQueue
from tests.spark.conftest import uniq
from tests.spark.support import create_topic, send_to

pytestmark = [pytest.mark.spark, pytest.mark.slow]

QUEUES = [("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)]
TAGS = ["TagA", "TagB", "TagC"]


def _message(topic: str, i: int) -> Message:
    return Message(topic, f"body-{i}".encode() + bytes([i % 256]), tags=TAGS[i % 3],
                   keys=(f"k{i}", f"order{i % 5}"), properties={"n": str(i), "half": "1" if i >= 24 else "0"})


@pytest.fixture(scope="module")
def dataset(cluster):
    """48 messages over 4 queues on 2 brokers, in two halves 24/24 split by `mid_ms`."""
    topic = uniq("SparkRead")
    create_topic(cluster, topic, ["broker-a", "broker-b"], 2)
    sent = {}
    with sync.Producer("spark_read_pg", cluster.namesrv_addr) as p:
        def half(lo, hi):
            plan = [(MessageQueue(topic, *QUEUES[i % 4]), _message(topic, i)) for i in range(lo, hi)]
            for (mq, m), r in zip(plan, send_to(p, plan)):
                sent[(mq.broker_name, mq.queue_id, r.queue_offset)] = (m, r)
        half(0, 24)
        time.sleep(0.05)
        mid_ms = int(time.time() * 1000)
        time.sleep(0.05)
        half(24, 48)
    return topic, sent, mid_ms


def _read(spark, cluster, topic, **options):
    r = spark.read.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr).option("subscribe", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _key(row):
    return (row.broker_name, row.queue_id, row.queue_offset)


def _check_rows(rows, sent, topic):
    for row in rows:
        m, r = sent[_key(row)]
        assert row.topic == topic
        assert row.body == m.body
        assert row.tags == m.tags
        assert row.keys == " ".join(m.keys)
        assert row.properties == dict(m.properties)
        assert row.msg_id == r.msg_id
        assert row.reconsume_times == 0
        assert row.born_host.startswith("127.0.0.1:")
        assert row.store_timestamp >= row.born_timestamp


def test_schema_columns_in_order(spark, cluster, dataset):
    topic, _, _ = dataset
    df = _read(spark, cluster, topic)
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("topic", "string"), ("broker_name", "string"), ("queue_id", "int"), ("queue_offset", "bigint"),
        ("msg_id", "string"), ("tags", "string"), ("keys", "string"), ("body", "binary"),
        ("properties", "map<string,string>"), ("born_timestamp", "timestamp"),
        ("store_timestamp", "timestamp"), ("born_host", "string"), ("reconsume_times", "int")]


def test_reads_exactly_what_was_sent_across_two_brokers(spark, cluster, dataset):
    topic, sent, _ = dataset
    df = _read(spark, cluster, topic)
    assert df.rdd.getNumPartitions() == 4          # one per queue
    rows = df.collect()
    assert len(rows) == 48
    assert sorted(map(_key, rows)) == sorted(sent)
    assert {r.broker_name for r in rows} == {"broker-a", "broker-b"}
    _check_rows(rows, sent, topic)


def test_json_offsets_bound_each_queue(spark, cluster, dataset):
    topic, sent, _ = dataset
    start = {topic: {"broker-a:0": 3, "broker-b:1": -1, "broker-b:0": -2}}
    end = {topic: {"broker-a:0": 7, "broker-a:1": 2}}
    rows = _read(spark, cluster, topic, startingOffsets=json.dumps(start), endingOffsets=json.dumps(end)).collect()
    want = sorted(k for k in sent if (k[0], k[1]) == ("broker-a", 0) and 3 <= k[2] < 7)
    want += sorted(k for k in sent if (k[0], k[1]) == ("broker-a", 1) and k[2] < 2)
    want += sorted(k for k in sent if (k[0], k[1]) == ("broker-b", 0))
    assert sorted(map(_key, rows)) == sorted(want)
    _check_rows(rows, sent, topic)


def test_earliest_and_latest(spark, cluster, dataset):
    topic, sent, _ = dataset
    assert _read(spark, cluster, topic, startingOffsets="latest").count() == 0
    assert _read(spark, cluster, topic, endingOffsets="earliest").count() == 0
    assert _read(spark, cluster, topic, startingOffsets="earliest", endingOffsets="latest").count() == len(sent)


def test_timestamps_bound_the_read(spark, cluster, dataset):
    topic, sent, mid_ms = dataset
    second = _read(spark, cluster, topic, startingTimestamp=str(mid_ms)).collect()
    first = _read(spark, cluster, topic, endingTimestamp=str(mid_ms)).collect()
    assert sorted(r.properties["n"] for r in second) == sorted(str(i) for i in range(24, 48))
    assert sorted(r.properties["n"] for r in first) == sorted(str(i) for i in range(24))


def test_min_partitions_splits_and_reads_each_message_once(spark, cluster, dataset):
    topic, sent, _ = dataset
    df = _read(spark, cluster, topic, minPartitions="10")
    assert df.rdd.getNumPartitions() >= 10
    rows = df.collect()
    assert len(rows) == 48 and sorted(map(_key, rows)) == sorted(sent)


def test_sub_expression_filters_tags(spark, cluster, dataset):
    topic, sent, _ = dataset
    rows = _read(spark, cluster, topic, subExpression="TagA || TagC").collect()
    want = sorted(k for k, (m, _) in sent.items() if m.tags in ("TagA", "TagC"))
    assert sorted(map(_key, rows)) == want and len(want) == 32
    _check_rows(rows, sent, topic)


def test_subscribe_pattern(spark, cluster, dataset):
    topic, sent, _ = dataset
    df = (spark.read.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr)
          .option("subscribePattern", topic[:9] + ".*" + topic[-3:]).load())
    assert sorted(map(_key, df.collect())) == sorted(sent)


def test_clear_errors_for_bad_options(spark, cluster, dataset):
    topic, _, _ = dataset
    with pytest.raises(Exception, match="namesrvAddr is required"):
        spark.read.format("pocketmq").option("subscribe", topic).load().collect()
    with pytest.raises(Exception, match="exactly one of the options subscribe"):
        (spark.read.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr).option("subscribe", topic)
         .option("subscribePattern", ".*").load().collect())
    with pytest.raises(Exception, match="exactly one of the options subscribe"):
        spark.read.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr).load().collect()
    with pytest.raises(Exception, match="startingOffsets"):
        _read(spark, cluster, topic, startingOffsets="{nope").collect()


def test_a_given_schema_reads_those_columns_only(spark, cluster, dataset):
    """`.schema(...)` names a subset of the columns (any order): the reader builds only those
    (Spark cannot prune a Python source's columns itself); a column it lacks or a wrong type
    is refused by name."""
    topic, sent, _ = dataset
    base = spark.read.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr).option("subscribe", topic)
    df = base.schema("queue_offset long, body binary, broker_name string, queue_id int, msg_id string").load()
    assert df.columns == ["queue_offset", "body", "broker_name", "queue_id", "msg_id"]
    rows = df.collect()
    assert sorted(map(_key, rows)) == sorted(sent)
    for row in rows:
        m, r = sent[_key(row)]
        assert row.body == m.body and row.msg_id == r.msg_id
    assert base.schema("queue_offset long").load().count() == 48
    assert base.schema("tags string").option("subExpression", "TagB").load().distinct().collect() == \
        [("TagB",)]
    with pytest.raises(Exception, match="column 'offset', which the source does not have"):
        base.schema("offset long").load().collect()
    with pytest.raises(Exception, match="column queue_id is int, the schema says bigint"):
        base.schema("queue_id long").load().collect()
