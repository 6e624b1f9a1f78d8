"""Errors table, route views, fault avoidance, message types (no sockets, integer clocks)."""
import dataclasses

import pytest

from pocketmq.client import errors
from pocketmq.client.fault import LatencyFaultTolerance, not_available_duration_ms
from pocketmq.client.message import (
    Message,
    MessageExt,
    SendResult,
    SendStatus,
    UniqIdGenerator,
    decode_properties,
    encode_properties,
)
from pocketmq.client.route import BrokerAddrTable, publish_info, subscribe_queues
from pocketmq.protocol.bodies import BrokerData, MessageQueue, QueueData, TopicRouteData
from pocketmq.protocol.codes import ResponseCode


def test_error_table_maps_codes_to_classes():
    e = errors.error_for(ResponseCode.TOPIC_NOT_EXIST, "no topic", "1.2.3.4:10911")
    assert isinstance(e, errors.TopicNotExistError) and e.retriable
    assert e.code == 17 and "TOPIC_NOT_EXIST" in str(e) and "1.2.3.4:10911" in str(e)
    assert isinstance(errors.error_for(13, "x"), errors.MessageIllegalError)
    assert not errors.error_for(13).retriable
    assert isinstance(errors.error_for(ResponseCode.SUBSCRIPTION_NOT_LATEST), errors.SubscriptionError)
    assert type(errors.error_for(999)) is errors.BrokerError
    for code, cls in errors.ERROR_TABLE.items():
        assert issubclass(cls, errors.BrokerError)
        assert code not in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT,
                            ResponseCode.PULL_NOT_FOUND)


def test_wrap_remoting():
    from pocketmq.remoting.connection import ConnectionClosed, RequestTimeout
    assert isinstance(errors.wrap_remoting(RequestTimeout("t")), errors.RequestTimeoutError)
    w = errors.wrap_remoting(ConnectionClosed("c"), "a:1")
    assert isinstance(w, errors.RemotingFailure) and w.retriable and "a:1" in str(w)


def route():
    return TopicRouteData(
        [QueueData("broker-b", 4, 2, 6), QueueData("broker-a", 4, 4, 6), QueueData("broker-c", 2, 2, 4)],
        [BrokerData("C", "broker-a", {0: "a:1"}), BrokerData("C", "broker-b", {0: "b:1", 1: "b:2"}),
         BrokerData("C", "broker-c", {0: "c:1"})])


def test_publish_and_subscribe_views():
    info = publish_info("T", route())
    assert [(q.broker_name, q.queue_id) for q in info.queues] == \
        [("broker-a", i) for i in range(4)] + [("broker-b", 0), ("broker-b", 1)]  # c is read-only
    subs = subscribe_queues("T", route())
    assert len(subs) == 10 and subs == sorted(subs)
    ordered = TopicRouteData([], [], "broker-a:2;broker-b:1")
    assert [(q.broker_name, q.queue_id) for q in publish_info("T", ordered).queues] == \
        [("broker-a", 0), ("broker-a", 1), ("broker-b", 0)]
    table = BrokerAddrTable()
    table.update(route())
    assert table.master("broker-b") == "b:1" and table.master("nope") is None


def test_not_available_durations():
    assert not_available_duration_ms(10) == 0
    assert not_available_duration_ms(100) == 0
    assert not_available_duration_ms(550) == 30000
    assert not_available_duration_ms(2999) == 120000
    assert not_available_duration_ms(30000) == 600000


def test_fault_avoidance_skips_slow_and_failed_brokers():
    info = publish_info("T", route())
    ft = LatencyFaultTolerance()
    ft.update("broker-a", 0, now_ms=1000, isolation=True)
    picks = {ft.select(info, None, now_ms=2000).broker_name for _ in range(12)}
    assert picks == {"broker-b"}
    # once the isolation is over broker-a comes back
    picks = {ft.select(info, None, now_ms=1000 + 600000).broker_name for _ in range(12)}
    assert picks == {"broker-a", "broker-b"}
    # every broker marked: the one recovering first is used
    ft.update("broker-b", 0, now_ms=5000, isolation=True)
    ft.update("broker-a", 3000, now_ms=5000)   # 180 s
    assert ft.select(info, None, now_ms=6000).broker_name == "broker-a"
    # a retry avoids the broker that just failed when another is available
    ft2 = LatencyFaultTolerance()
    assert all(ft2.select(info, "broker-a", 0).broker_name == "broker-b" for _ in range(6))
    ft3 = LatencyFaultTolerance(enabled=False)
    ft3.update("broker-a", 0, 0, isolation=True)
    assert not ft3.items
    assert {ft3.select(info, None, 0).broker_name for _ in range(6)} == {"broker-a", "broker-b"}


def test_message_normalisation_and_wire_properties():
    m = Message("T", "héllo", tags="TagA", keys="k1 k2", properties={"a": 1}, delay_level=3)
    assert m.body == "héllo".encode() and m.keys == ("k1", "k2")
    with pytest.raises(TypeError):
        m.properties["b"] = "2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.topic = "x"  # type: ignore[misc]
    props = m.wire_properties("ID")
    assert props == {"a": "1", "TAGS": "TagA", "KEYS": "k1 k2", "DELAY": "3", "WAIT": "true", "UNIQ_KEY": "ID"}
    text = encode_properties(props)
    assert not text.endswith("\x02")
    assert decode_properties(text) == props
    assert decode_properties(text + "\x02") == props
    assert decode_properties("\x01x\x02a\x01\x02k\x01v") == {"k": "v"}


def test_message_ext_views():
    mx = MessageExt("T", b"b", 3, 42, properties={"TAGS": "A", "KEYS": "x y", "u": "1", "UNIQ_KEY": "ID"},
                    broker_name="broker-a", store_host="10.0.0.1:10911", commit_log_offset=1234)
    assert mx.msg_id == "ID" and mx.offset_msg_id == "0A00000100002A9F00000000000004D2"
    assert MessageExt("T", b"b", 3, 42, store_host="10.0.0.1:10911", commit_log_offset=1234).msg_id == \
        "0A00000100002A9F00000000000004D2"
    assert mx.tags == "A" and mx.keys == ("x", "y") and mx.user_properties == {"u": "1"}
    assert mx.queue == MessageQueue("T", "broker-a", 3)
    r = SendResult(SendStatus.SEND_OK, "ID", "OFF", mx.queue, 42)
    assert r.ok


def test_uniq_ids_are_unique_hex_and_time_ordered():
    clock = [1_700_000_000_000]
    gen = UniqIdGenerator(ip=b"\x0a\x00\x00\x01", pid=0x1234, now_ms=lambda: clock[0])
    ids = [gen.next_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 and i == i.upper() for i in ids)
    assert ids[0].startswith("0A0000011234")


def test_message_types_work_with_dataclasses_copy_pickle_and_json():
    import copy
    import json
    import pickle

    from pocketmq.client.message import FrozenProperties, MessageExt, SendResult, SendStatus
    from pocketmq.protocol.bodies import MessageQueue
    mq = MessageQueue("T", "broker-a", 1)
    m = Message("T", b"x", tags="A", properties={"a": "1"})
    ext = MessageExt("T", b"b", 1, 2, "broker-a", {"TAGS": "A", "u": "2"}, store_host="127.0.0.1:10911")
    r = SendResult(SendStatus.SEND_OK, "U", "O", mq, 5)
    for obj in (m, ext, r, mq):
        assert dataclasses.is_dataclass(obj)
        assert copy.deepcopy(obj) == obj and pickle.loads(pickle.dumps(obj)) == obj
    assert [f.name for f in dataclasses.fields(ext)][:6] == ["topic", "body", "queue_id", "queue_offset",
                                                              "broker_name", "properties"]
    d = dataclasses.asdict(ext)
    assert d["properties"] == {"TAGS": "A", "u": "2"} and d["store_host"] == "127.0.0.1:10911"
    assert json.dumps(dataclasses.asdict(m)["properties"]) == '{"a": "1"}'
    ext2 = dataclasses.replace(ext, body=b"new")
    assert type(ext2) is MessageExt and ext2.body == b"new" and ext2.tags == "A" and ext2 != ext
    assert dataclasses.replace(ext2, body=b"b") == ext
    m2 = dataclasses.replace(m, body=b"y")
    assert m2.properties == {"a": "1"} and type(m2.properties) is FrozenProperties
    for props in (m.properties, ext.properties):
        with pytest.raises(TypeError):
            props.update(x="1")  # type: ignore[attr-defined]
        with pytest.raises(TypeError):
            props.pop("a", None)  # type: ignore[attr-defined]
        with pytest.raises(TypeError):
            del props["a"]  # type: ignore[attr-defined]
