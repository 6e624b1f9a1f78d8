"""JSON bodies: C++ heartbeat quirks, fastjson dialect, route data form."""
import json

import pytest

from pocketmq.protocol import bodies
from pocketmq.protocol.errors import BodyError

CPP_HEARTBEAT = (b'{"clientID":"4242-10.0.0.5@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,'
                 b'"groupName":"G1","messageModel":1,"subscriptionDataSet":[{"codeSet":[0],"subString":"TagA || TagB",'
                 b'"subVersion":"1700000000000","tagsSet":["TagA","TagB"],"topic":"T1"},{"subString":"*",'
                 b'"subVersion":"1700000000001","topic":"%RETRY%G1"}]}]}\n')

JAVA_HEARTBEAT = (b'{"clientID":"10.0.0.5@12345","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET",'
                  b'"consumeType":"CONSUME_PASSIVELY","groupName":"G1","messageModel":"CLUSTERING",'
                  b'"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[2598919],"expressionType":"TAG",'
                  b'"subString":"TagA","subVersion":1700000000000,"tagsSet":["TagA"],"topic":"T1"}],"unitMode":false}],'
                  b'"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}]}')


def test_cpp_heartbeat_ordinals_string_subversion_and_bogus_codes():
    hb = bodies.parse_heartbeat(CPP_HEARTBEAT)
    cd = hb.consumer_data_set[0]
    assert (cd.consume_type, cd.message_model, cd.consume_from_where) == \
           ("CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")
    sub = cd.subscription_data_set[0]
    assert sub.sub_version == 1700000000000
    assert sub.code_set == [2598919, 2598920]  # recomputed, not the C++ atoi() zeros
    assert sub.matches_tags_code(2598919) and not sub.matches_tags_code(0)
    assert cd.subscription_data_set[1].is_all
    assert hb.producer_groups == []


def test_java_heartbeat_names():
    hb = bodies.parse_heartbeat(JAVA_HEARTBEAT)
    assert hb.producer_groups == ["CLIENT_INNER_PRODUCER"]
    assert hb.consumer_data_set[0].subscription_data_set[0].code_set == [2598919]


def test_heartbeat_round_trip_through_to_json():
    hb = bodies.parse_heartbeat(JAVA_HEARTBEAT)
    again = bodies.parse_heartbeat(bodies.dumps(hb.to_json()))
    assert again.to_json() == hb.to_json()


@pytest.mark.parametrize("bad", [b"{}", b"[]", b'{"clientID":"x","consumerDataSet":[{"groupName":"G","consumeType":7}]}',
                                 b"not json"])
def test_bad_heartbeats_raise_body_error(bad):
    with pytest.raises(BodyError):
        bodies.parse_heartbeat(bad)


def test_negative_tag_hash_matches_sign_extended_code():
    sub = bodies.build_subscription("T", "TagNeg_xyz_12345")
    assert sub.code_set == [-1465635644]
    assert sub.matches_tags_code(-1465635644)


def test_lenient_reads_fastjson_forms():
    text = '{"offsetTable":{"T1@G1":{0:250,1:250\n\t\t},"x":{{"brokerName":"b","queueId":0,"topic":"T"}:5}}}'
    d = bodies.loads(text)
    assert d["offsetTable"]["T1@G1"] == {0: 250, 1: 250}
    (key, val), = d["offsetTable"]["x"].items()
    assert bodies.MessageQueue.from_json(key) == bodies.MessageQueue("T", "b", 0) and val == 5


def test_object_keyed_dump_is_read_back():
    mq = bodies.MessageQueue("T", "b", 1)
    text = bodies.dumps_object_keyed({mq: {"maxOffset": 3}})
    (key, val), = bodies.loads_lenient(text).items()
    assert bodies.MessageQueue.from_json(key) == mq and val == {"maxOffset": 3}


def test_route_data_is_compact_standard_json_with_both_flag_spellings():
    route = bodies.TopicRouteData([bodies.QueueData("broker-a", 4, 4, 6)],
                                  [bodies.BrokerData("DefaultCluster", "broker-a", {0: "10.0.0.1:10911"})])
    raw = bodies.dumps(route.to_json())
    assert b" " not in raw and b'"brokerAddrs":{"0":"10.0.0.1:10911"}' in raw
    d = json.loads(raw)
    assert d["queueDatas"][0]["topicSysFlag"] == d["queueDatas"][0]["topicSynFlag"] == 0
    back = bodies.TopicRouteData.from_body(raw)
    assert back.broker_datas[0].master_addr() == "10.0.0.1:10911"


def test_message_queue_sorts_like_java():
    mqs = [bodies.MessageQueue("T", "b", 1), bodies.MessageQueue("T", "a", 2), bodies.MessageQueue("S", "z", 0)]
    assert sorted(mqs) == [mqs[2], mqs[1], mqs[0]]


def test_reset_offset_bodies_both_forms_round_trip():
    from pocketmq.protocol.bodies import (MessageQueue, decode_reset_offset_body, encode_reset_offset_body,
                                 encode_reset_offset_body_for_c)
    from pocketmq.protocol.errors import BodyError
    t = {MessageQueue("T", "broker-a", 1): 5, MessageQueue("T", "broker-a", 0): 0, MessageQueue("T", "b", 0): 9}
    java = encode_reset_offset_body(t)
    assert java.startswith(b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:9,')
    c = encode_reset_offset_body_for_c(t)
    assert b'{"brokerName":"broker-a","offset":5,"queueId":1,"topic":"T"}' in c
    assert decode_reset_offset_body(java) == t == decode_reset_offset_body(c)
    assert decode_reset_offset_body(b'{"offsetTable":{}}') == {}
    for bad in (b'{"offsetTable":[{"topic":"T","brokerName":"b","queueId":0,"offset":-2}]}',
                b'{"offsetTable":[{"topic":"T","queueId":0,"offset":1}]}', b'{"offsetTable":7}', b'[', b'{"offsetTable":[1]}'):
        with pytest.raises(BodyError):
            decode_reset_offset_body(bad)
