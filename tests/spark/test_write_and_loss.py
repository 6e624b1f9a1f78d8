"""Writer round trip, and failOnDataLoss against a broker whose retention deletes heads."""
from __future__ import annotations

import json
import time

import pytest

from pocketmq.client import Message, sync
from pocketmq.protocol.bodies import MessageQueue
from tests.spark.conftest import uniq
from tests.spark.support import create_topic, queue_min_offset, send_to

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _read(spark, cluster, topic, **options):
    r = spark.read.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr).option("subscribe", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_writer_round_trip(spark, cluster):
    t1, t2 = uniq("SparkW1"), uniq("SparkW2")
    for t in (t1, t2):
        create_topic(cluster, t, ["broker-a", "broker-b"], 2)
    rows = [(bytes([i % 256]) * (i + 1), t1 if i % 3 else t2, f"tag{i % 2}", f"k{i} x{i}",
             {"n": str(i), "kind": "w"}) for i in range(300)]
    df = spark.createDataFrame(rows, "body binary, topic string, tags string, keys string, "
                                     "properties map<string,string>").repartition(3)
    df.write.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr).option("batchSize", "64") \
        .mode("append").save()
    got = _read(spark, cluster, t1).union(_read(spark, cluster, t2)).collect()
    assert len(got) == 300
    assert sorted((r.body, r.topic, r.tags, r.keys, tuple(sorted(r.properties.items()))) for r in got) == \
        sorted((b, t, g, k, tuple(sorted(p.items()))) for b, t, g, k, p in rows)


def test_writer_topic_option_and_string_body(spark, cluster):
    t = uniq("SparkW3")
    create_topic(cluster, t, ["broker-b"], 1)
    spark.createDataFrame([("héllo",), ("world",)], "body string").write.format("pocketmq") \
        .option("namesrvAddr", cluster.namesrv_addr).option("topic", t).mode("append").save()
    got = _read(spark, cluster, t).collect()
    assert sorted(r.body for r in got) == sorted(["héllo".encode(), b"world"])
    assert all(r.tags is None and r.keys is None and r.properties == {} for r in got)


def test_writer_fails_clearly(spark, cluster):
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="no topic"):
        df.write.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr).mode("append").save()
    with pytest.raises(Exception, match="namesrvAddr is required"):
        df.write.format("pocketmq").option("topic", "X").mode("append").save()
    # a topic name the producer refuses: the send fails the task with the producer's reason
    with pytest.raises(Exception, match="sending 1 messages to topic bad topic!"):
        df.write.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", "bad topic!") \
            .mode("append").save()


@pytest.fixture(scope="module")
def lossy_topic(cluster):
    """A queue on broker-lossy whose head retention has deleted (min offset > 0)."""
    topic = uniq("SparkLoss")
    create_topic(cluster, topic, ["broker-lossy"], 1)
    mq = MessageQueue(topic, "broker-lossy", 0)
    bodies = {}
    with sync.Producer("spark_loss_pg", cluster.namesrv_addr) as p:
        plan = [(mq, Message(topic, f"{i:04d}".encode() * 120)) for i in range(60)]
        for (_, m), r in zip(plan, send_to(p, plan)):
            bodies[r.queue_offset] = m.body
    deadline = time.monotonic() + 40
    while queue_min_offset(cluster, topic, "broker-lossy", 0) == 0:
        if time.monotonic() > deadline:
            pytest.fail("broker-lossy never cleaned its expired segments")
        time.sleep(0.5)
    return topic, bodies


def test_fail_on_data_loss_true_fails_naming_the_queue(spark, cluster, lossy_topic):
    topic, _ = lossy_topic
    start = json.dumps({topic: {"broker-lossy:0": 0}})
    with pytest.raises(Exception) as e:
        _read(spark, cluster, topic, startingOffsets=start).collect()
    text = str(e.value)
    assert f"topic {topic} broker broker-lossy queue 0" in text and "failOnDataLoss=false" in text


def test_fail_on_data_loss_false_skips_the_lost_part(spark, cluster, lossy_topic):
    topic, bodies = lossy_topic
    min_before = queue_min_offset(cluster, topic, "broker-lossy", 0)
    start = json.dumps({topic: {"broker-lossy:0": 0}})
    rows = _read(spark, cluster, topic, startingOffsets=start, failOnDataLoss="false").collect()
    offsets = sorted(r.queue_offset for r in rows)
    assert offsets and offsets[0] >= min_before > 0
    assert offsets == list(range(offsets[0], 60))       # contiguous up to the end
    assert all(r.body == bodies[r.queue_offset] for r in rows)
    # earliest is the queue's min offset: no loss to report even with the default
    assert _read(spark, cluster, topic).count() >= 1
