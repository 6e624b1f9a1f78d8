"""The gRPC endpoint's pure conversions (broker/proxy/convert.py): v2 messages to sends and
stored records back, status codes, routes and assignments, the settings handshake."""
from __future__ import annotations

import hashlib

import pytest

pytest.importorskip("grpc", reason="the grpc extra (pip install pocketmq[grpc]) is not installed")

from pocketmq.broker.proxy import convert  # noqa: E402
from pocketmq.broker.proxy.convert import Code, Refused  # noqa: E402
from pocketmq.broker.proxy.pb import definition_pb2 as pb  # noqa: E402
from pocketmq.protocol import message as msgcodec  # noqa: E402
from pocketmq.protocol.codes import CURRENT_VERSION, VERSION_NAMES, LanguageCode, PermName, ResponseCode  # noqa: E402

NOW = 1_700_000_000_000
LIMITS = dict(max_body_size=4 << 20, queue_count=8, max_delay_ms=3 * 86_400_000, now_ms=NOW)


def v2(body=b"payload", mtype=pb.NORMAL, **sp) -> pb.Message:
    m = pb.Message(topic=pb.Resource(name="T1"), body=body)
    m.system_properties.message_id = sp.pop("message_id", "01ABCDEF")
    m.system_properties.message_type = mtype
    for k, v in sp.items():
        if k == "keys":
            m.system_properties.keys.extend(v)
        elif k == "delivery_ms":
            m.system_properties.delivery_timestamp.FromMilliseconds(v)
        elif k == "born_ms":
            m.system_properties.born_timestamp.FromMilliseconds(v)
        else:
            setattr(m.system_properties, k, v)
    return m


def props_of(f) -> dict:
    return msgcodec.decode_properties(f.properties)


def test_normal_message_becomes_a_send_with_uniq_key_tags_keys_and_user_properties():
    m = v2(tag="TagA", keys=["k1", "k2"], born_ms=NOW - 5)
    m.user_properties["color"] = "red"
    f = convert.message_to_send(m, **LIMITS)
    assert (f.topic, f.producer_group, f.queue_id, f.sys_flag, f.born_timestamp, f.body, f.transactional) == \
        ("T1", "T1", -1, 0, NOW - 5, b"payload", False)
    assert props_of(f) == {"color": "red", "TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "01ABCDEF"}


def test_fifo_message_goes_to_the_queue_its_group_hashes_to_and_names_the_group():
    f = convert.message_to_send(v2(mtype=pb.FIFO, message_group="order-42"), **LIMITS)
    assert f.queue_id == msgcodec.java_string_hash("order-42") % 8
    assert props_of(f)[msgcodec.SHARDING_KEY] == "order-42"
    # same group, same queue; the hash is Java's (negative hashes are taken mod, never negative)
    assert convert.fifo_queue("order-42", 8) == f.queue_id
    negative = next(g for g in (f"message-group-{i}" for i in range(1000)) if msgcodec.java_string_hash(g) < 0)
    assert 0 <= convert.fifo_queue(negative, 7) < 7


def test_delay_message_carries_timer_deliver_ms():
    f = convert.message_to_send(v2(mtype=pb.DELAY, delivery_ms=NOW + 10_000), **LIMITS)
    assert props_of(f)[convert.TIMER_DELIVER_MS] == str(NOW + 10_000)
    assert f.queue_id == -1


def test_transactional_message_is_a_prepared_half_message_of_group_topic():
    m = v2(mtype=pb.TRANSACTION)
    m.system_properties.orphaned_transaction_recovery_duration.FromSeconds(30)
    f = convert.message_to_send(m, **LIMITS)
    p = props_of(f)
    assert f.transactional and f.sys_flag & msgcodec.MessageSysFlag.TRANSACTION_MASK == \
        msgcodec.MessageSysFlag.TRANSACTION_PREPARED_TYPE
    assert (p[msgcodec.TRAN_MSG], p[msgcodec.PGROUP], p[msgcodec.CHECK_IMMUNITY_TIME_IN_SECONDS]) == \
        ("true", "T1", "30")
    assert p[convert.TRANSACTION_ID] == "01ABCDEF"      # the transaction id is the message id


def test_gzip_encoding_sets_the_compressed_flag():
    m = v2()
    m.system_properties.body_encoding = pb.GZIP
    assert convert.message_to_send(m, **LIMITS).sys_flag & msgcodec.MessageSysFlag.COMPRESSED_FLAG


@pytest.mark.parametrize("message,code", [
    (lambda: v2(body=b""), Code.MESSAGE_BODY_EMPTY),
    (lambda: v2(body=b"x" * 101), Code.MESSAGE_BODY_TOO_LARGE),
    (lambda: v2(message_id=""), Code.ILLEGAL_MESSAGE_ID),
    (lambda: v2(tag="a||b"), Code.ILLEGAL_MESSAGE_TAG),
    (lambda: v2(tag="  "), Code.ILLEGAL_MESSAGE_TAG),
    (lambda: v2(keys=["has space"]), Code.ILLEGAL_MESSAGE_KEY),
    (lambda: v2(mtype=pb.FIFO), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: v2(mtype=pb.DELAY), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: v2(message_group="g", delivery_ms=NOW + 1), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: v2(mtype=pb.TRANSACTION, delivery_ms=NOW + 1), Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (lambda: v2(mtype=pb.FIFO, message_group="g" * 65), Code.ILLEGAL_MESSAGE_GROUP),
    (lambda: v2(mtype=pb.DELAY, delivery_ms=NOW + 3 * 86_400_000 + 1), Code.ILLEGAL_DELIVERY_TIME),
])
def test_bad_messages_are_refused_with_javas_codes(message, code):
    with pytest.raises(Refused) as e:
        convert.message_to_send(message(), **{**LIMITS, "max_body_size": 100})
    assert e.value.code == code and e.value.message
    assert e.value.status().code == code


@pytest.mark.parametrize("key", ["UNIQ_KEY", "TAGS", "DELAY", "TIMER_DELIVER_MS", "a\x01b", ""])
def test_user_properties_may_not_use_system_names_or_separators(key):
    m = v2()
    m.user_properties[key] = "v"
    with pytest.raises(Refused) as e:
        convert.message_to_send(m, **LIMITS)
    assert e.value.code == Code.ILLEGAL_MESSAGE_PROPERTY_KEY


def test_record_to_message_round_trip():
    props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "01ABC", "color": "red", "__SHARDINGKEY": "g1",
             "CLUSTER": "DefaultCluster"}
    rec = msgcodec.MessageExt("T1", b"hello", 3, 17, properties=props, born_timestamp=NOW - 10,
                              born_host="10.0.0.1:1234", store_timestamp=NOW, store_host="10.0.0.2:10911",
                              reconsume_times=2)
    m = convert.record_to_message(rec, receipt_handle="rh", invisible_ms=15_000)
    sp = m.system_properties
    assert sp.invisible_duration.ToMilliseconds() == 15_000
    # __SHARDINGKEY is shown as Java's proxy shows it (not in its MessageConst.STRING_HASH_SET)
    assert m.topic.name == "T1" and m.body == b"hello" and dict(m.user_properties) == {"color": "red",
                                                                                        "__SHARDINGKEY": "g1"}
    assert (sp.tag, list(sp.keys), sp.message_id, sp.message_group, sp.message_type) == \
        ("TagA", ["k1", "k2"], "01ABC", "g1", pb.FIFO)
    assert sp.body_digest.type == pb.MD5 and sp.body_digest.checksum == hashlib.md5(b"hello").hexdigest().upper()
    assert (sp.queue_id, sp.queue_offset, sp.delivery_attempt, sp.receipt_handle) == (3, 17, 3, "rh")
    assert sp.born_timestamp.ToMilliseconds() == NOW - 10 and sp.store_timestamp.ToMilliseconds() == NOW
    assert (sp.born_host, sp.store_host) == ("10.0.0.1:1234", "10.0.0.2:10911")
    # and back: what the producer sent is what a send would store
    back = convert.message_to_send(m, **LIMITS)
    assert props_of(back)["color"] == "red" and props_of(back)["UNIQ_KEY"] == "01ABC"
    assert props_of(back)["__SHARDINGKEY"] == "g1"
    m.user_properties["__SHARDINGKEY"] = "another group"
    with pytest.raises(Refused):
        convert.message_to_send(m, **LIMITS)


def test_record_to_message_types():
    def mtype(props, sys_flag=0):
        return convert.record_to_message(msgcodec.MessageExt("T", b"b", 0, 0, properties=props,
                                                             sys_flag=sys_flag)).system_properties
    assert mtype({}).message_type == pb.NORMAL
    sp = mtype({"TIMER_DELIVER_MS": str(NOW)})
    assert sp.message_type == pb.DELAY and sp.delivery_timestamp.ToMilliseconds() == NOW
    assert mtype({"DELAY": "3"}).message_type == pb.DELAY
    assert mtype({"TRAN_MSG": "true"}, msgcodec.MessageSysFlag.TRANSACTION_PREPARED_TYPE).message_type == \
        pb.TRANSACTION


@pytest.mark.parametrize("code,v2code", [
    (ResponseCode.SUCCESS, Code.OK), (ResponseCode.SYSTEM_BUSY, Code.TOO_MANY_REQUESTS),
    (ResponseCode.TOPIC_NOT_EXIST, Code.TOPIC_NOT_FOUND), (ResponseCode.NO_PERMISSION, Code.FORBIDDEN),
    (ResponseCode.FLUSH_DISK_TIMEOUT, Code.MASTER_PERSISTENCE_TIMEOUT),
    (ResponseCode.FLUSH_SLAVE_TIMEOUT, Code.SLAVE_PERSISTENCE_TIMEOUT),
    (ResponseCode.SLAVE_NOT_AVAILABLE, Code.HA_NOT_AVAILABLE), (ResponseCode.MESSAGE_ILLEGAL, Code.BAD_REQUEST),
    (ResponseCode.SYSTEM_ERROR, Code.INTERNAL_SERVER_ERROR), (999, Code.INTERNAL_SERVER_ERROR),
])
def test_remoting_codes_map_to_v2_codes(code, v2code):
    st = convert.from_remoting(code, "why")
    assert st.code == v2code
    assert st.message == ("OK" if v2code == Code.OK else "why")


def test_pop_errors_map_to_v2_codes():
    from pocketmq.broker.core.pop import InvalidReceiptHandle, PopError
    assert convert.from_pop_error(InvalidReceiptHandle("stale")).code == Code.INVALID_RECEIPT_HANDLE
    for code, v2code in ((ResponseCode.INVALID_PARAMETER, Code.BAD_REQUEST),
                         (ResponseCode.SUBSCRIPTION_PARSE_FAILED, Code.ILLEGAL_FILTER_EXPRESSION),
                         (ResponseCode.POLLING_FULL, Code.TOO_MANY_REQUESTS),
                         (ResponseCode.SYSTEM_BUSY, Code.TOO_MANY_REQUESTS),
                         (ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, Code.CONSUMER_GROUP_NOT_FOUND)):
        st = convert.from_pop_error(PopError(code, "why"))
        assert (st.code, st.message) == (v2code, "why")


def test_long_polling_is_clamped_as_javas_proxy_does():
    poll = convert.polling_ms
    assert poll(20_000, 30_000, 10_000, "5.1.2") == 20_000
    assert poll(1_000, 30_000, 10_000, "5.1.2") == 5_000            # at least 5 s
    assert poll(60_000, 90_000, 10_000, "5.1.2") == 20_000          # at most 20 s
    assert poll(20_000, 8_000, 10_000, "5.1.2") == 8_000            # within the deadline
    assert poll(None, 16_000, 10_000, "5.1.2") == 11_000            # no ask: the deadline less half the timeout
    assert poll(None, None, 3_000, "5.1.2") == 20_000               # no deadline
    for version, code in (("5.1.2", Code.ILLEGAL_POLLING_TIME), ("5.0.3", Code.ILLEGAL_POLLING_TIME),
                          ("5.0.2", Code.BAD_REQUEST), ("", Code.BAD_REQUEST), ("1.0.8", Code.BAD_REQUEST)):
        with pytest.raises(Refused) as e:
            poll(20_000, 4_000, 10_000, version)
        assert e.value.code == code, version


def test_receive_invisible_time_batch_and_ack_status():
    assert convert.receive_invisible_ms(None, True, 10_000, 43_200_000) == convert.AUTO_RENEW_INVISIBLE_MS
    assert convert.receive_invisible_ms(10_000, False, 10_000, 43_200_000) == 10_000
    for bad in (None, 9_999, 43_200_001):
        with pytest.raises(Refused) as e:
            convert.receive_invisible_ms(bad, False, 10_000, 43_200_000)
        assert e.value.code == Code.ILLEGAL_INVISIBLE_TIME
    assert [convert.receive_batch(n) for n in (1, 32, 33, 2**31 - 1)] == [1, 32, 32, 32]
    with pytest.raises(Refused):
        convert.receive_batch(0)
    assert convert.ack_status([Code.OK, Code.OK]).code == Code.OK
    assert convert.ack_status([Code.INVALID_RECEIPT_HANDLE]).code == Code.INVALID_RECEIPT_HANDLE
    assert convert.ack_status([Code.OK, Code.INVALID_RECEIPT_HANDLE]).code == Code.MULTIPLE_RESULTS
    assert convert.ack_status([]).code == Code.BAD_REQUEST


def test_status_ok_is_20000_never_0():
    assert convert.status(Code.OK).code == 20000
    assert convert.from_remoting(ResponseCode.SUCCESS, None).code == 20000


def test_route_queues_permissions_and_types():
    broker = pb.Broker(name="b", id=0, endpoints=convert.endpoints("127.0.0.1", 8081))
    qs = convert.route_queues("T", 2, 3, PermName.READ | PermName.WRITE, broker)
    assert [(q.id, q.permission) for q in qs] == [(0, pb.READ_WRITE), (1, pb.READ_WRITE), (2, pb.WRITE)]
    assert all(list(q.accept_message_types) == [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION] for q in qs)
    assert qs[0].broker.endpoints.scheme == pb.IPv4
    assert [q.permission for q in convert.route_queues("T", 1, 1, PermName.READ, broker)] == [pb.READ]


def test_endpoint_schemes():
    assert convert.endpoints("10.1.2.3", 1).scheme == pb.IPv4
    assert convert.endpoints("::1", 1).scheme == pb.IPv6
    assert convert.endpoints("broker-a", 1).scheme == pb.DOMAIN_NAME


def test_assignments_per_broker_or_per_queue_for_fifo_groups():
    broker = pb.Broker(name="b")
    rw = PermName.READ | PermName.WRITE
    assert [q.id for q in convert.assignment_queues("T", 4, rw, broker, fifo=False)] == [-1]
    assert [q.id for q in convert.assignment_queues("T", 4, rw, broker, fifo=True)] == [0, 1, 2, 3]
    assert convert.assignment_queues("T", 4, PermName.WRITE, broker, fifo=False) == []


def test_producer_settings_reply():
    client = pb.Settings(client_type=pb.PRODUCER)
    client.publishing.topics.add().name = "T"
    client.publishing.max_body_size = 128 << 20
    client.metric.on = True
    client.user_agent.language = pb.PYTHON
    s = convert.settings_reply(client, max_body_size=4 << 20)
    assert s.publishing.max_body_size == 4 << 20 and s.publishing.validate_message_type
    assert [t.name for t in s.publishing.topics] == ["T"] and s.user_agent.language == pb.PYTHON
    b = s.backoff_policy
    assert b.WhichOneof("strategy") == "exponential_backoff" and b.max_attempts == 3
    assert b.exponential_backoff.initial.ToMilliseconds() == 10 and b.exponential_backoff.max.ToMilliseconds() == 1000
    assert b.exponential_backoff.multiplier == 2.0
    assert s.metric.on is False


def test_consumer_settings_reply():
    client = pb.Settings(client_type=pb.PUSH_CONSUMER)
    client.subscription.group.name = "G"
    client.subscription.subscriptions.add().topic.name = "T"
    s = convert.settings_reply(client, max_body_size=1, fifo=True, max_attempts=17, backoff_ms=(1000, 5000, 7_200_000))
    sub = s.subscription
    assert sub.fifo and sub.receive_batch_size == 32 and sub.long_polling_timeout.ToMilliseconds() == 20_000
    assert sub.group.name == "G" and sub.subscriptions[0].topic.name == "T"
    b = s.backoff_policy
    assert b.max_attempts == 17 and [d.ToMilliseconds() for d in b.customized_backoff.next] == [1000, 5000, 7_200_000]
    assert not s.HasField("publishing") and not s.metric.on


def test_channel_info_of_user_agents():
    assert convert.channel_info_of(pb.UA(language=pb.PYTHON, version="5.1.2")) == \
        (LanguageCode.PYTHON, VERSION_NAMES.index("V5_1_2"), "PYTHON", "5.1.2")
    assert convert.channel_info_of(pb.UA(language=pb.NODE_JS, version="1.0.8")) == \
        (LanguageCode.OTHER, CURRENT_VERSION, "NODE_JS", "1.0.8")
    assert convert.channel_info_of(pb.UA(language=pb.GOLANG))[0] == LanguageCode.GO
