"""Delay / retry rules (pure)."""
from pocketmq.broker.core.delay import (ScheduleCursors, delay_level, from_schedule, is_due, send_back_properties,
                               to_schedule)
from pocketmq.protocol.message import decode_properties, encode_properties


def test_delay_level_parsing():
    assert delay_level(encode_properties({"DELAY": "3", "TAGS": "a"})) == 3
    assert delay_level(encode_properties({"TAGS": "a"})) == 0
    assert delay_level(encode_properties({"DELAY": "x"})) == 0
    assert delay_level("") == 0


def test_schedule_round_trip_and_clamping():
    topic, qid, props = to_schedule("T", 5, encode_properties({"DELAY": "40", "k": "v"}), 40, 18)
    assert (topic, qid) == ("SCHEDULE_TOPIC_XXXX", 17)
    d = decode_properties(props)
    assert d["REAL_TOPIC"] == "T" and d["REAL_QID"] == "5" and d["DELAY"] == "18"
    real = from_schedule(d)
    assert real[:2] == ("T", 5)
    back = decode_properties(real[2])
    assert "DELAY" not in back and back["WAIT"] == "false" and back["k"] == "v"
    assert from_schedule({"REAL_TOPIC": "T"}) is None and from_schedule({"REAL_QID": "1"}) is None


def test_due_rule():
    assert is_due(1000, 1000, 5000) and not is_due(1001, 1000, 5000)
    assert is_due(100_000, 1000, 5000)   # impossible future (clock went back): deliver now


def test_send_back_keeps_first_topic_and_id():
    p = decode_properties(send_back_properties({"k": "v"}, "T", "ID1", 4))
    assert (p["RETRY_TOPIC"], p["ORIGIN_MESSAGE_ID"], p["DELAY"], p["WAIT"]) == ("T", "ID1", "4", "false")
    again = decode_properties(send_back_properties(p, "%RETRY%G", "ID2", 0))
    assert again["RETRY_TOPIC"] == "T" and again["ORIGIN_MESSAGE_ID"] == "ID1" and "DELAY" not in again


def test_cursors_persist_and_read_java_form():
    c = ScheduleCursors()
    c.advance(3, 7)
    assert c.dirty
    d = ScheduleCursors()
    d.load(c.encode())
    assert d.get(3) == 7 and d.get(1) == 0
    java = ScheduleCursors()
    java.load(b'{\n\t"offsetTable":{1:5,3:9\n\t}\n}')
    assert java.get(3) == 9
