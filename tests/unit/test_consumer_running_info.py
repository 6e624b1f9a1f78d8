"""ConsumerRunningInfo (GET_CONSUMER_RUNNING_INFO) in Java's fastjson shape: the writer in
protocol/bodies.py, what PushConsumer/ClientInstance report, and mqadmin's rendering."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from pocketmq.client import PushConsumer
from pocketmq.client.instance import ClientInstance, mono_ms
from pocketmq.client.process_queue import ProcessQueue
from pocketmq.protocol import bodies
from pocketmq.protocol.bodies import MessageQueue, build_subscription
from pocketmq.protocol.errors import BodyError
from pocketmq.tools.mqadmin.consumer import analyze_process_queues, format_running_info


@dataclass
class M:
    queue_offset: int
    body: bytes = b"x"


def _pqi(**kw):
    d = dict.fromkeys(bodies.PROCESS_QUEUE_INFO_FIELDS, 0)
    d.update(locked=False, droped=False)
    d.update(kw)
    return d


def test_writer_emits_java_field_names_object_keys_and_string_properties():
    mq1, mq0 = MessageQueue("T", "b", 1), MessageQueue("T", "b", 0)
    body = bodies.encode_consumer_running_info(
        {"PROP_CONSUMEORDERLY": "false", "consumeThreadMax": 20}, [build_subscription("T", "A || B")],
        {mq1: _pqi(commitOffset=7), mq0: _pqi(commitOffset=3, locked=True)}, {"T": {"consumeRT": 1.5}})
    text = body.decode()
    # fastjson: fields sorted, no jstack when null, MessageQueue keys written as objects, sorted
    assert text.startswith('{"mqTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{')
    assert '"jstack"' not in text
    assert text.index('"queueId":0') < text.index('"queueId":1')
    d = bodies.loads(body)
    assert set(d) == {"mqTable", "properties", "statusTable", "subscriptionSet"}
    assert d["properties"] == {"PROP_CONSUMEORDERLY": "false", "consumeThreadMax": "20"}
    assert d["statusTable"] == {"T": {"pullRT": 0, "pullTPS": 0, "consumeRT": 1.5, "consumeOKTPS": 0,
                                      "consumeFailedTPS": 0, "consumeFailedMsgs": 0}}
    assert d["subscriptionSet"][0]["subString"] == "A || B" and d["subscriptionSet"][0]["tagsSet"] == ["A", "B"]
    back = bodies.decode_consumer_running_info(body)
    assert list(back["mqTable"]) == [mq0, mq1]
    assert back["mqTable"][mq0]["locked"] is True and back["mqTable"][mq1]["commitOffset"] == 7
    assert back["subscriptionSet"][0].tags_set == ["A", "B"] and back["jstack"] is None
    with_stack = bodies.decode_consumer_running_info(
        bodies.encode_consumer_running_info({}, [], {}, {}, jstack="main\n"))
    assert with_stack["jstack"] == "main\n"


def test_writer_refuses_an_incomplete_process_queue_info_and_reader_a_malformed_body():
    with pytest.raises(BodyError, match="lacks .*cachedMsgCount"):
        bodies.encode_consumer_running_info({}, [], {MessageQueue("T", "b", 0): {"commitOffset": 1}}, {})
    for bad in (b"[]", b'{"mqTable":[]}', b'{"mqTable":{{"x":1}:{}}}', b'{"mqTable":{{"brokerName":"b",'
                b'"queueId":0,"topic":"T"}:5}}'):
        with pytest.raises(BodyError):
            bodies.decode_consumer_running_info(bad)


def test_push_consumer_reports_its_queues_in_java_shape():
    c = PushConsumer("G", "127.0.0.1:9876", listener=print, orderly=True, consume_concurrency=4,
                     consume_timeout_min=2)
    c.subscribe("T", "TagA")
    mq = MessageQueue("T", "broker-a", 2)
    pq = ProcessQueue(mono_ms())
    pq.put_messages([M(10, b"a" * 10), M(11), M(12)], mono_ms())
    pq.set_locked(mono_ms())
    pq.start_consuming([M(10)], mono_ms() - 5_000)
    c.subscription_state.add(mq, 13, pq)
    inst = ClientInstance("127.0.0.1@unit", "127.0.0.1:9876;127.0.0.1:9877")
    info = bodies.decode_consumer_running_info(inst.consumer_running_info(c))
    props = info["properties"]
    assert props["PROP_CONSUMEORDERLY"] == "true" and props["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
    assert props["PROP_NAMESERVER_ADDR"] == "127.0.0.1:9876;127.0.0.1:9877"
    assert props["PROP_CLIENT_VERSION"] == "V4_9_4" and props["PROP_THREADPOOL_CORE_SIZE"] == "4"
    assert props["consumerGroup"] == "G" and props["consumeTimeout"] == "2" and props["maxReconsumeTimes"] == "-1"
    assert "PROP_CONSUMER_START_TIMESTAMP" in props
    assert [(s.topic, s.sub_string) for s in info["subscriptionSet"]] == [("T", "TagA")]
    pqi = info["mqTable"][mq]
    assert (pqi["commitOffset"], pqi["cachedMsgMinOffset"], pqi["cachedMsgMaxOffset"], pqi["cachedMsgCount"]) \
        == (10, 10, 12, 3)
    assert pqi["locked"] is True and pqi["droped"] is False and pqi["lastLockTimestamp"] > 1_600_000_000_000
    assert pqi["oldestInFlightAgeMs"] >= 5_000
    assert set(bodies.PROCESS_QUEUE_INFO_FIELDS) <= set(pqi)
    assert info["statusTable"]["T"]["consumeOKTPS"] == 0
    # Java's analysis: an orderly queue that is locked is fine; one that is not is reported
    assert analyze_process_queues("cid", info, 0) == []
    pqi["locked"] = False
    assert analyze_process_queues("cid", info, pqi["lastLockTimestamp"] + 5)[0].endswith("can't lock for a while, 5ms")
    text = format_running_info(info)
    for section in ("#Consumer Properties#", "#Consumer Subscription#", "#Consumer Offset#",
                    "#Consumer MQ Detail#", "#Consumer RT&TPS#"):
        assert section in text
    assert "ProcessQueueInfo [commitOffset=10, cachedMsgMinOffset=10" in text


def test_a_consumer_without_running_info_reports_pull_type_and_subscriptions():
    class Lite:
        group = "LG"
        subscriptions = {"T": build_subscription("T", "*")}
    info = json.loads(ClientInstance("127.0.0.1@unit2", "127.0.0.1:9876").consumer_running_info(Lite()))
    assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_ACTIVELY"
    assert info["mqTable"] == {} and info["subscriptionSet"][0]["topic"] == "T"
