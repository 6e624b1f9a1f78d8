"""Issue 11 items 1-3, sans-IO: total encoders, the name rules, header number ranges."""
import pytest

from pocketmq.common.constants import NAME_BROKER, NAME_CLIENT_ID, NAME_GROUP, NAME_TOPIC, name_error
from pocketmq.protocol import bodies
from pocketmq.protocol.codes import RequestCode as R, SerializeType
from pocketmq.protocol.command import FrameDecoder, RemotingCommand, encode
from pocketmq.protocol.errors import BodyError, HeaderError
from pocketmq.protocol.headers.typed import (check_ext_names, decode_pull_header, decode_send_fields,
                                             encode_send_header, SendMessageRequestHeader)

BAD = ["x\ud800", "\udfff", "a\ud83d", "ok\x00", "é"]


@pytest.mark.parametrize("stype", list(SerializeType))
@pytest.mark.parametrize("text", BAD)
def test_every_frame_encoder_writes_any_string(stype, text):
    cmd = RemotingCommand(R.SEND_MESSAGE, 7, 1, remark=text, ext_fields={"k" + text: text, "n": 5},
                          serialize_type=stype)
    frame = encode(cmd)
    if stype == SerializeType.JSON:
        frame[8:].decode("utf-8")          # the header is valid UTF-8
    dec = FrameDecoder()
    dec.feed(frame)
    back = dec.next_command()
    assert back.opaque == 7 and back.ext_fields["n"] == "5"
    if stype == SerializeType.JSON:
        assert back.remark == text            # \uXXXX escapes: the value survives
    else:
        # no escape in these formats: a lone surrogate is written as U+FFFD
        assert back.remark == "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text)


def test_json_header_without_surrogates_is_unchanged_utf8():
    frame = encode(RemotingCommand(1, remark="é"))
    assert "é".encode() in frame


def test_bodies_dumps_is_total_and_round_trips():
    d = {"topicList": ["t\ud800", "é"]}
    raw = bodies.dumps(d)
    raw.decode("utf-8")
    assert bodies.loads(raw) == d
    assert bodies.dumps({"a": "é"}) == '{"a":"é"}'.encode()


@pytest.mark.parametrize("body", [b"\xff\xfe", b"{x", b"[" * 5000, b"{" * 5000, b"{[" * 3000])
def test_loads_raises_body_error_only(body):
    with pytest.raises(BodyError):
        bodies.loads(body)


@pytest.mark.parametrize("kind,value,ok", [
    (NAME_TOPIC, "T-1_%|x", True), (NAME_TOPIC, "t\ud800", False), (NAME_TOPIC, "a" * 128, False),
    (NAME_TOPIC, "a\n", False), (NAME_TOPIC, "", False), (NAME_GROUP, "g" * 255, True),
    (NAME_GROUP, "g" * 256, False), (NAME_CLIENT_ID, "10.0.0.5@12345", True),
    (NAME_CLIENT_ID, "4242-10.0.0.5@DEFAULT", True), (NAME_CLIENT_ID, "fe80::1%eth0@1#99", True),
    (NAME_CLIENT_ID, "bad\ud800@1", False), (NAME_CLIENT_ID, "a b", False),
    (NAME_BROKER, "host.example.com", True), (NAME_BROKER, "b\ud800", False),
])
def test_name_rules(kind, value, ok):
    err = name_error(kind, "f", value)
    assert (err is None) == ok
    if err is not None:
        err.encode("ascii")          # the remark names the field and is plain ASCII
        assert "f" in err


def test_ext_names_checked_and_empty_fields_ignored():
    check_ext_names({"topic": "T", "consumerGroup": "", "producerGroup": "P"})
    with pytest.raises(HeaderError, match="consumerGroup"):
        check_ext_names({"topic": "T", "consumerGroup": "G\ud800"})


def _send_ext(**over):
    h = SendMessageRequestHeader("pg", "T", "TBW102", 4, 0, 0, 1, 0, None, 0, False, False, None)
    ext = encode_send_header(h)
    ext.update(over)
    return ext


@pytest.mark.parametrize("key,value,name", [("h", str(2**31), "flag"), ("g", str(2**63), "bornTimestamp"),
                                            ("e", str(-2**31 - 1), "queueId"), ("l", str(2**31), "maxReconsumeTimes")])
def test_send_header_numbers_range_checked(key, value, name):
    with pytest.raises(HeaderError, match=f"<{name}> is out of range.*2147483647|<{name}> is out of range"):
        decode_send_fields(R.SEND_MESSAGE_V2, _send_ext(**{key: value}))
    assert decode_send_fields(R.SEND_MESSAGE_V2, _send_ext(h=str(2**31 - 1), g=str(2**63 - 1)))[7] == 2**31 - 1


def test_pull_header_numbers_range_checked():
    ext = {"consumerGroup": "G", "topic": "T", "queueId": "0", "queueOffset": str(2**63 - 1), "maxMsgNums": "32",
           "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0"}
    assert decode_pull_header(ext).queue_offset == 2**63 - 1
    with pytest.raises(HeaderError, match="<maxMsgNums> is out of range"):
        decode_pull_header(dict(ext, maxMsgNums=str(2**31)))
    with pytest.raises(HeaderError, match="<queueOffset> is out of range"):
        decode_pull_header(dict(ext, queueOffset=str(2**63)))


def test_heartbeat_and_lock_bodies_check_names():
    with pytest.raises(BodyError, match="clientID"):
        bodies.parse_heartbeat(bodies.dumps({"clientID": "c\ud800"}))
    with pytest.raises(BodyError, match="groupName"):
        bodies.parse_heartbeat(bodies.dumps({"clientID": "c@1", "producerDataSet": [{"groupName": "p g"}]}))
    with pytest.raises(BodyError, match="producerDataSet"):
        bodies.parse_heartbeat(bodies.dumps({"clientID": "c@1", "producerDataSet": 5}))
    with pytest.raises(BodyError, match="brokerName"):
        bodies.decode_lock_body(bodies.dumps({"clientId": "c@1", "consumerGroup": "G", "mqSet": [
            {"topic": "T", "brokerName": "b\ud800", "queueId": 0}]}))
    with pytest.raises(BodyError, match="topic"):
        bodies.decode_register_broker_body(bodies.encode_register_broker_body(
            {"t\ud800": bodies.TopicConfig("t\ud800")}, bodies.DataVersion()))
