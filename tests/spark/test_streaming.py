"""Structured Streaming against nameserver + brokers: readStream with availableNow and a cap,
restarts from the checkpoint, new queues and topics, groupId offsets on the broker,
failOnDataLoss, and writeStream. Each query runs with trigger(availableNow=True), so it
stops by itself once it has read what existed when it started."""
from __future__ import annotations

import json

import pytest
from pyspark.errors import StreamingQueryException

from pocketmq.client import Message, sync
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.bodies import MessageQueue
from tests.spark.conftest import uniq
from tests.spark.support import create_topic, queue_min_offset, send_to, wait_head_deleted
from tests.support.workloads import run_mqadmin

pytestmark = [pytest.mark.spark, pytest.mark.slow]

QUERY_TIMEOUT_S = 180


def _send(cluster, topic: str, plan: list[tuple[str, int]], tag: str) -> dict:
    """Send one message per (broker, queue) of `plan`; {(topic, broker, queue, offset): body}."""
    msgs = [(MessageQueue(topic, b, q), Message(topic, f"{tag}-{i}".encode(), tags=tag, keys=(f"k{i}",),
                                                 properties={"i": str(i)}))
            for i, (b, q) in enumerate(plan)]
    with sync.Producer("spark_stream_pg", cluster.namesrv_addr) as p:
        return {(topic, mq.broker_name, mq.queue_id, r.queue_offset): m.body
                for (mq, m), r in zip(msgs, send_to(p, msgs))}


def _run(spark, cluster, out, checkpoint, **options):
    """One availableNow run of readStream pocketmq -> Parquet; its progress list."""
    r = spark.readStream.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr)
    for k, v in options.items():
        r = r.option(k, v)
    q = (r.load().writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        # a failed query raises StreamingQueryException here, with the source's message
        assert q.awaitTermination(QUERY_TIMEOUT_S), "the availableNow query did not stop"
    finally:
        if q.isActive:
            q.stop()
    return q.recentProgress


def _rows(spark, out) -> dict:
    rows = spark.read.parquet(str(out)).collect()
    keys = [(r.topic, r.broker_name, r.queue_id, r.queue_offset) for r in rows]
    assert len(keys) == len(set(keys)), "a message was written twice"
    return {k: r.body for k, r in zip(keys, rows)}


def _offsets(progress, field: str) -> dict:
    return json.loads(progress["sources"][0][field])


def _total(offsets: dict) -> int:
    return sum(o for queues in offsets.values() for o in queues.values())


def _group_offsets(cluster, group: str, queues) -> dict:
    async def go():
        inst = ClientInstance("127.0.0.1@spark-tests-admin", cluster.namesrv_addr)
        try:
            return {(t, b, q): await inst.api.query_consumer_offset(cluster.addr(b), group, MessageQueue(t, b, q))
                    for t, b, q in queues}
        finally:
            await inst.close()
    return sync.run(go(), 30)


def test_available_now_capped_batches_resume_new_queue_and_group(spark, cluster, tmp_path):
    topic, group = uniq("SparkStream"), uniq("spark_stream_g")
    create_topic(cluster, topic, ["broker-a"], 2)
    sent = _send(cluster, topic, [("broker-a", i % 2) for i in range(40)], "first")
    out, ck = tmp_path / "out", tmp_path / "ck"
    opts = dict(subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="15", groupId=group)

    progress = [p for p in _run(spark, cluster, out, ck, **opts) if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in progress] == [15, 15, 10]      # capped batches, then it stopped
    assert _rows(spark, out) == sent
    # the source reports the true latest offset: the first batch shows the backlog behind it
    first = progress[0]
    assert _total(_offsets(first, "latestOffset")) == 40 and _total(_offsets(first, "endOffset")) == 15
    assert _offsets(progress[-1], "endOffset") == {topic: {"broker-a:0": 20, "broker-a:1": 20}}
    # groupId: the committed ends are the group's offsets on the broker, and mqadmin shows no lag
    assert _group_offsets(cluster, group, [(topic, "broker-a", 0), (topic, "broker-a", 1)]) == \
        {(topic, "broker-a", 0): 20, (topic, "broker-a", 1): 20}
    res = run_mqadmin("consumerProgress", "-n", cluster.namesrv_addr, "-g", group)
    assert res.returncode == 0, res.stderr
    assert topic in res.stdout and "Diff Total: 0" in res.stdout

    # between runs: more messages, and the topic gains two queues on a second broker
    create_topic(cluster, topic, ["broker-a", "broker-b"], 2)
    later = _send(cluster, topic, [("broker-a", 0)] * 3 + [("broker-b", 0)] * 5 + [("broker-b", 1)] * 4, "later")
    progress = [p for p in _run(spark, cluster, out, ck, **opts) if p["numInputRows"] > 0]
    assert sum(p["numInputRows"] for p in progress) == 12 and all(p["numInputRows"] <= 15 for p in progress)
    assert _offsets(progress[0], "startOffset") == {topic: {"broker-a:0": 20, "broker-a:1": 20}}
    assert _rows(spark, out) == {**sent, **later}                      # resumed exactly: none twice, none lost
    assert _group_offsets(cluster, group, [(topic, "broker-a", 0), (topic, "broker-b", 0), (topic, "broker-b", 1)]) \
        == {(topic, "broker-a", 0): 23, (topic, "broker-b", 0): 5, (topic, "broker-b", 1): 4}


def test_pattern_picks_up_new_topics_and_starts_at_latest(spark, cluster, tmp_path):
    prefix = uniq("SparkPat")
    t1, t2 = prefix + "One", prefix + "Two"
    create_topic(cluster, t1, ["broker-b"], 1)
    _send(cluster, t1, [("broker-b", 0)] * 4, "before")
    out, ck = tmp_path / "out", tmp_path / "ck"
    opts = dict(subscribePattern=prefix + ".*")
    # a stream starts at latest by default (Kafka's rule): what was there before is not read
    progress = _run(spark, cluster, out, ck, **opts)
    assert sum(p["numInputRows"] for p in progress) == 0
    assert _offsets(progress[-1], "endOffset") == {t1: {"broker-b:0": 4}}

    create_topic(cluster, t2, ["broker-a"], 1)
    want = {**_send(cluster, t1, [("broker-b", 0)] * 2, "after"), **_send(cluster, t2, [("broker-a", 0)] * 3, "new")}
    progress = _run(spark, cluster, out, ck, **opts)
    assert sum(p["numInputRows"] for p in progress) == 5
    assert _rows(spark, out) == want
    assert _offsets(progress[-1], "endOffset") == {t1: {"broker-b:0": 6}, t2: {"broker-a:0": 3}}


def test_batch_only_options_fail_a_stream_clearly(spark, cluster, tmp_path):
    with pytest.raises(StreamingQueryException, match="endingOffsets is for batch reads only"):
        _run(spark, cluster, tmp_path / "out", tmp_path / "ck", subscribe="Whatever", endingOffsets="latest")


@pytest.fixture(scope="module")
def lossy_stream_topic(cluster):
    """A queue on broker-lossy whose head retention has deleted (min offset > 0)."""
    topic = uniq("SparkStreamLoss")
    create_topic(cluster, topic, ["broker-lossy"], 1)
    sent = _send_big(cluster, topic, 60)
    wait_head_deleted(cluster, topic, "broker-lossy", 0)
    return topic, sent


def _send_big(cluster, topic: str, n: int) -> dict:
    mq = MessageQueue(topic, "broker-lossy", 0)
    plan = [(mq, Message(topic, f"{i:04d}".encode() * 120)) for i in range(n)]
    with sync.Producer("spark_stream_loss_pg", cluster.namesrv_addr) as p:
        return {r.queue_offset: m.body for (_, m), r in zip(plan, send_to(p, plan))}


def test_fail_on_data_loss_in_a_stream(spark, cluster, lossy_stream_topic, tmp_path):
    topic, sent = lossy_stream_topic
    start = json.dumps({topic: {"broker-lossy:0": 0}})
    with pytest.raises(StreamingQueryException) as e:
        _run(spark, cluster, tmp_path / "o1", tmp_path / "c1", subscribe=topic, startingOffsets=start)
    assert f"topic {topic} broker broker-lossy queue 0" in str(e.value) and "failOnDataLoss=false" in str(e.value)

    min_before = queue_min_offset(cluster, topic, "broker-lossy", 0)
    _run(spark, cluster, tmp_path / "o2", tmp_path / "c2", subscribe=topic, startingOffsets=start,
         failOnDataLoss="false", maxOffsetsPerTrigger="1000")
    got = _rows(spark, tmp_path / "o2")
    offsets = sorted(k[3] for k in got)
    assert offsets and offsets[0] >= min_before > 0 and offsets == list(range(offsets[0], 60))
    assert all(body == sent[k[3]] for k, body in got.items())


def test_write_stream_round_trip(spark, cluster, tmp_path):
    src, dst = uniq("SparkStreamSrc"), uniq("SparkStreamDst")
    create_topic(cluster, src, ["broker-a", "broker-b"], 1)
    create_topic(cluster, dst, ["broker-b"], 2)
    sent = _send(cluster, src, [("broker-a", 0), ("broker-b", 0)] * 10, "copy")
    # the stream reads only the columns the writer takes (a given schema: schema.projection)
    stream = (spark.readStream.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr)
              .option("subscribe", src).option("startingOffsets", "earliest")
              .schema("body binary, tags string, keys string, properties map<string,string>").load())
    assert stream.columns == ["body", "tags", "keys", "properties"]
    q = (stream.writeStream.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", dst)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(QUERY_TIMEOUT_S) and q.exception() is None
    got = (spark.read.format("pocketmq").option("namesrvAddr", cluster.namesrv_addr).option("subscribe", dst)
           .load().collect())
    assert sorted(r.body for r in got) == sorted(sent.values())
    assert all(r.tags == "copy" and r.keys == "k" + r.properties["i"] and r.body == f"copy-{r.properties['i']}".encode()
               for r in got)
