"""POP's pure rules (broker/core/pop.py, pop_log.py): handles, leases, FIFO steps, bounds,
the due order, the checkpoint and the replay of the revive log."""
from __future__ import annotations

import pytest

from pocketmq.broker.core import pop_log
from pocketmq.broker.core.pop import (GRPC_MIN_INVISIBLE_MS, MAX_INVISIBLE_MS, FifoStep, PopState, ReceiptHandle,
                                      decode_handle, encode_handle, fifo_step, invisible_error, signature_ok)

SECRET = b"s" * 32
KEY = ("g", "T", 0)


def handle(**kw) -> ReceiptHandle:
    d = dict(ck_offset=5, pop_time=1000, invisible_ms=30000, revive_qid=0, topic_type="0", broker_name="broker-a",
             queue_id=0, offset=7, commit_log_offset=1234, signature="")
    d.update(kw)
    return ReceiptHandle(**d)


def test_handle_round_trip_is_java_parsable_and_signed():
    text = encode_handle(SECRET, "g", "T", handle())
    parts = text.split(" ")
    assert parts[:9] == ["5", "1000", "30000", "0", "0", "broker-a", "0", "7", "1234"]   # ReceiptHandle.decode's
    h = decode_handle(text)
    assert h._replace(signature="") == handle() and len(h.signature) == 32
    assert signature_ok(SECRET, "g", "T", h)


@pytest.mark.parametrize("change", [
    {"offset": 8}, {"pop_time": 1001}, {"queue_id": 1}, {"commit_log_offset": 1}, {"topic_type": "1"},
])
def test_any_changed_field_breaks_the_signature(change):
    h = decode_handle(encode_handle(SECRET, "g", "T", handle()))
    assert not signature_ok(SECRET, "g", "T", h._replace(**change))


def test_signature_binds_group_topic_and_secret():
    h = decode_handle(encode_handle(SECRET, "g", "T", handle()))
    assert not signature_ok(SECRET, "g2", "T", h)
    assert not signature_ok(SECRET, "g", "T2", h)
    assert not signature_ok(b"x" * 32, "g", "T", h)


@pytest.mark.parametrize("text", ["", "1 2 3", "a b c d 0 b 0 0", "1 2 3 4 7 b 0 0", "1 2 3 4 0 b 0 0 0 sig extra",
                                  "1 2 3 4 0 b x 0"])
def test_malformed_handles_raise_value_error(text):
    with pytest.raises(ValueError):
        decode_handle(text)


def test_java_extra_info_without_offset_or_signature_decodes():
    h = decode_handle("5 1000 30000 0 1 broker-a 2")
    assert (h.offset, h.commit_log_offset, h.signature, h.topic_type) == (-1, -1, "", "1")
    assert h.real_topic("g", "T") == "%RETRY%g_T"


def test_invisible_bounds():
    assert invisible_error(1) is None and invisible_error(MAX_INVISIBLE_MS) is None
    assert invisible_error(0) and invisible_error(MAX_INVISIBLE_MS + 1)
    assert invisible_error(9999, GRPC_MIN_INVISIBLE_MS) and invisible_error(10_000, GRPC_MIN_INVISIBLE_MS) is None


def lease3(s: PopState, pop_time=1000, invisible=100, fifo=False, attempt_id=None, ck_pos=0):
    return s.lease(KEY, [(0, 100, 1), (1, 200, 1), (2, 300, 1)], pop_time, invisible, fifo=fifo, ck_pos=ck_pos,
                   ck_offset=0, attempt_id=attempt_id, next_offset=5)


def test_committed_is_the_acked_prefix():
    s = PopState()
    a, b, c = lease3(s)
    q = s.queue(KEY)
    assert q.pop_offset == 5 and q.committed() == 0 and s.count == 3
    assert s.resolve(b) == (0, 0)               # a hole: nothing committed past 0
    assert s.resolve(a) == (0, 2)
    assert s.resolve(c) == (2, 5)               # everything acked: the pop position
    assert s.count == 0 and s.per_group == {}


def test_find_needs_the_lease_pop_time_and_change_makes_old_stale():
    s = PopState()
    a, _, _ = lease3(s)
    assert s.find(KEY, 0, 1000) is a and s.find(KEY, 0, 999) is None and s.find(KEY, 9, 1000) is None
    new = s.change(a, 1500, 50)
    assert s.find(KEY, 0, 1000) is None and s.find(KEY, 0, 1500) is new
    assert new.visible_at == 1550 and s.count == 3


def test_due_order_and_stale_entries_are_skipped():
    s = PopState()
    a, b, c = lease3(s)                         # visible at 1100
    s.change(b, 1010, 10)                       # visible at 1020
    s.resolve(c)
    assert s.next_due() == 1020
    assert s.due(1019, 10) == []
    assert [x.offset for x in s.due(1020, 10)] == [1]
    assert [x.offset for x in s.due(2000, 10)] == [0]
    assert s.next_due() is None


def test_room_is_bounded_per_group_and_broker():
    s = PopState(inflight_max=5, inflight_per_group_max=3)
    assert s.room("g") == 3
    lease3(s)
    assert s.room("g") == 0 and s.room("h") == 2


def test_fifo_steps():
    s = PopState()
    q = s.open_queue(KEY, 0)
    assert fifo_step(q, None, 0) is FifoStep.FREE
    a, b, c = lease3(s, fifo=True, attempt_id="A1")
    assert fifo_step(q, None, 1050) is FifoStep.BLOCKED
    assert fifo_step(q, "A2", 1050) is FifoStep.BLOCKED
    assert fifo_step(q, "A1", 1050) is FifoStep.REGET
    s.resolve(a)
    assert fifo_step(q, None, 1100) is FifoStep.REDELIVER     # the rest ran out
    s.resolve(b)
    s.resolve(c)
    assert fifo_step(q, "A1", 1100) is FifoStep.FREE and q.attempt_id is None


def test_checkpoint_is_the_oldest_record_behind_a_live_lease():
    s = PopState()
    a, b, c = lease3(s, ck_pos=10)
    s.lease(("g", "T", 1), [(0, 400, 1)], 1000, 100, fifo=False, ck_pos=11, ck_offset=0)
    assert s.checkpoint() == 10
    for x in (a, b, c):
        s.resolve(x)
    assert s.checkpoint() == 11
    s.resolve(s.find(("g", "T", 1), 0, 1000))
    assert s.checkpoint() is None


def test_replay_of_the_revive_log_rebuilds_the_leases():
    recs = [
        pop_log.encode_ck("g", "T", 0, 1000, 100, [0, 1, 2], [100, 200, 300], [1, 1, 1], False, None),
        pop_log.encode_one(pop_log.ACK, "g", "T", 0, 1, 1000),
        pop_log.encode_one(pop_log.CHANGE, "g", "T", 0, 2, 1000, 1500, 40),
        pop_log.encode_one(pop_log.ACK, "g", "T", 0, 2, 1000),            # stale: names the old lease
        pop_log.encode_ck("g", "T", 1, 1100, 100, [4], [500], [1], True, "A"),
        pop_log.encode_one(pop_log.REVIVED, "g", "T", 1, 4, 1100),
    ]
    s = PopState()
    for pos, body in enumerate(recs):
        s.apply(pop_log.decode(body), pos)
    q = s.queue(KEY)
    assert sorted(q.leases) == [0, 2] and q.leases[2].pop_time == 1500 and q.leases[2].visible_at == 1540
    assert q.pop_offset == 3 and s.queue(("g", "T", 1)).leases == {} and s.count == 2
    s.drop_below(KEY, 1)                        # offsets below the persisted committed one were resolved
    assert sorted(q.leases) == [2] and q.committed() == 2


@pytest.mark.parametrize("body", [b"", b"[]", b'{"k":"x","g":"g","t":"T","q":0,"pt":1}',
                                  b'{"k":"ack","g":"g","t":"T","q":"0","pt":1,"o":1}',
                                  b'{"k":"ck","g":"g","t":"T","q":0,"pt":1,"it":1,"o":[1],"c":[],"a":[1]}'])
def test_bad_revive_log_records_raise_value_error(body):
    with pytest.raises(ValueError):
        pop_log.decode(body)


@pytest.mark.parametrize("code", ["POP_MESSAGE", "ACK_MESSAGE", "CHANGE_MESSAGE_INVISIBLETIME"])
def test_plain_acl_asks_the_pop_codes_for_what_a_pull_needs(code):
    from pocketmq.common.acl import request_resources
    from pocketmq.protocol.codes import RequestCode as R
    ext = {"topic": "T", "consumerGroup": "g"}
    assert request_resources(R[code], ext, None) == request_resources(R.PULL_MESSAGE, ext, None) != {}
