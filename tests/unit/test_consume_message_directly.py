"""CONSUME_MESSAGE_DIRECTLY's pure parts: the request header (Java's
ConsumeMessageDirectlyResultRequestHeader), the answer (ConsumeMessageDirectlyResult in
fastjson's form, and Java's toString that mqadmin prints), a listener's return value as
CMResult, and the client's handling of the request without a socket (the handler's answer
awaited directly)."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from pocketmq.client import ConsumeStatus, PushConsumer
from pocketmq.client.instance import ClientInstance
from pocketmq.client.push_consumer import direct_consume_result
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import CM_RESULTS, ConsumeMessageDirectlyResult
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.errors import BodyError, HeaderError
from pocketmq.protocol.headers.typed import (
    ConsumeMessageDirectlyRequestHeader,
    decode_consume_message_directly_header,
    encode_consume_message_directly_header,
)


def test_header_round_trip_and_required_group():
    h = ConsumeMessageDirectlyRequestHeader("G", "127.0.0.1@1", "C0A8000100002A9F0000000000000010")
    ext = encode_consume_message_directly_header(h)
    assert ext == {"consumerGroup": "G", "clientId": "127.0.0.1@1", "msgId": "C0A8000100002A9F0000000000000010"}
    assert decode_consume_message_directly_header({**ext, "brokerName": "broker-a"}).broker_name == "broker-a"
    assert decode_consume_message_directly_header(ext) == h
    # the C++ client's "" for an absent optional field is absent
    assert decode_consume_message_directly_header({"consumerGroup": "G", "clientId": ""}).client_id is None
    with pytest.raises(HeaderError, match="consumerGroup"):
        decode_consume_message_directly_header({"clientId": "c"})


def test_result_is_fastjson_shaped_and_read_back():
    r = ConsumeMessageDirectlyResult(order=False, auto_commit=True, consume_result="CR_SUCCESS", spent_time_mills=3)
    # fastjson: sorted fields, the null remark left out, the enum by name
    assert r.encode() == b'{"autoCommit":true,"consumeResult":"CR_SUCCESS","order":false,"spentTimeMills":3}'
    assert ConsumeMessageDirectlyResult.decode(r.encode()) == r
    full = ConsumeMessageDirectlyResult(True, False, "CR_THROW_EXCEPTION", "ValueError: x", 12)
    assert ConsumeMessageDirectlyResult.decode(full.encode()) == full
    assert str(full) == ("ConsumeMessageDirectlyResult [order=true, autoCommit=false, "
                         "consumeResult=CR_THROW_EXCEPTION, remark=ValueError: x, spentTimeMills=12]")
    assert str(ConsumeMessageDirectlyResult()) == ("ConsumeMessageDirectlyResult [order=false, autoCommit=true, "
                                                   "consumeResult=null, remark=null, spentTimeMills=0]")
    assert CM_RESULTS == ("CR_SUCCESS", "CR_LATER", "CR_ROLLBACK", "CR_COMMIT", "CR_THROW_EXCEPTION",
                          "CR_RETURN_NULL")


def test_result_decoding_is_lenient_where_fastjson_is_and_strict_elsewhere():
    # strings for booleans and numbers (fastjson reads them), absent fields take Java's defaults
    r = ConsumeMessageDirectlyResult.decode(b'{"order":"true","spentTimeMills":"7","consumeResult":"CR_COMMIT"}')
    assert (r.order, r.auto_commit, r.consume_result, r.spent_time_mills) == (True, True, "CR_COMMIT", 7)
    assert ConsumeMessageDirectlyResult.decode(b"{}") == ConsumeMessageDirectlyResult()
    for bad, what in ((b'{"consumeResult":"CR_MAYBE"}', "consumeResult"), (b'{"order":"yes"}', "order"),
                      (b'{"spentTimeMills":1.5}', "spentTimeMills"), (b"[1]", "not a JSON object"),
                      (b"\xff", "UTF-8")):
        with pytest.raises(BodyError, match=what):
            ConsumeMessageDirectlyResult.decode(bad)
    with pytest.raises(BodyError, match="consumeResult"):
        ConsumeMessageDirectlyResult(consume_result="OK").encode()


def test_listener_values_as_cm_results():
    for ok in (None, True, ConsumeStatus.CONSUME_SUCCESS, "CONSUME_SUCCESS"):
        assert direct_consume_result(ok) == ("CR_SUCCESS", None)
    for later in (ConsumeStatus.RECONSUME_LATER, ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT, "RECONSUME_LATER"):
        assert direct_consume_result(later) == ("CR_LATER", None)
    result, remark = direct_consume_result(42)
    assert result == "CR_LATER" and "42" in remark


def _record(topic="T", body=b"hello", props=None) -> bytes:
    return msgcodec.encode_record(topic, 2, 0, body, msgcodec.encode_properties(props or {"TAGS": "A"}), 0,
                                  1_700_000_000_000, (b"\x7f\x00\x00\x01", 5000), (b"\x7f\x00\x00\x01", 10911),
                                  0, 0, 7, 4096, 1_700_000_000_001)


def _request(group="G", body=None) -> RemotingCommand:
    return RemotingCommand(RequestCode.CONSUME_MESSAGE_DIRECTLY, opaque=5,
                           ext_fields={"consumerGroup": group, "clientId": "127.0.0.1@unit", "brokerName": "broker-a",
                                       "msgId": "7F00000100002A9F0000000000001000"},
                           body=_record() if body is None else body)


CONN = SimpleNamespace(remote_addr="127.0.0.1:10911")


async def _answer(inst, cmd):
    r = inst._on_request(CONN, cmd)
    return await r if asyncio.iscoroutine(r) else r


async def test_the_client_runs_the_listener_once_and_answers():
    seen = []

    def listener(msg):
        seen.append(msg)
        if msg.body == b"boom":
            raise RuntimeError("boom")
        return ConsumeStatus.RECONSUME_LATER if msg.body == b"later" else None
    inst = ClientInstance("127.0.0.1@unit-cmd", "127.0.0.1:9876")
    c = PushConsumer("G", "127.0.0.1:9876", listener=listener, orderly=True)
    inst.register_consumer("G", c)
    try:
        resp = await _answer(inst, _request())
        assert resp.code == ResponseCode.SUCCESS and resp.opaque == 5
        body = json.loads(resp.body_bytes())
        assert body["consumeResult"] == "CR_SUCCESS" and body["order"] is True and body["autoCommit"] is True
        m = seen[0]
        assert (m.topic, m.body, m.tags, m.queue_id, m.queue_offset, m.broker_name) == ("T", b"hello", "A", 2, 7,
                                                                                        "broker-a")
        # a %RETRY% copy reaches the listener under its original topic, as the queues deliver it
        retry = _record("%RETRY%G", b"later", {"TAGS": "A", "RETRY_TOPIC": "T"})
        resp = await _answer(inst, _request(body=retry))
        assert json.loads(resp.body_bytes())["consumeResult"] == "CR_LATER" and seen[-1].topic == "T"
        resp = await _answer(inst, _request(body=_record(body=b"boom")))
        got = ConsumeMessageDirectlyResult.decode(resp.body_bytes())
        assert got.consume_result == "CR_THROW_EXCEPTION" and got.remark == "RuntimeError: boom"
        assert c.stats["consumed_directly"] == 3 and c.stats["consumed"] == 0 and c.direct_consumes == 0

        # the errors: no such group here, an undecodable record, too many at once
        resp = await _answer(inst, _request(group="Other"))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "<Other> not exist" in resp.remark
        resp = await _answer(inst, _request(body=b"\x00\x00"))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "unreadable" in resp.remark
        c.direct_consumes = c.DIRECT_CONSUMES_MAX
        resp = await _answer(inst, _request())
        assert resp.code == ResponseCode.SYSTEM_BUSY
        c.direct_consumes = 0
        inst.register_consumer("L", SimpleNamespace(group="L"))      # not a push consumer
        resp = await _answer(inst, _request(group="L"))
        assert resp.code == ResponseCode.SYSTEM_ERROR and "not a push consumer" in resp.remark
        assert len(seen) == 3
    finally:
        await inst.close()


# -- the broker's forwarding (broker/processors/admin.py), with a fake context and channel ------

class _Channel:
    """A client connection: records the forwarded request, answers or fails as told."""

    def __init__(self, outcome):
        self.outcome, self.got = outcome, []

    async def request(self, cmd, timeout_s):
        self.got.append((cmd, timeout_s))
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return cmd.response(ResponseCode.SUCCESS, body=self.outcome)


def _broker_ctx(channel, records: dict):
    info = SimpleNamespace(client_id="127.0.0.1@c1")
    groups = {"G": SimpleNamespace(channels={channel: info})}
    return SimpleNamespace(consumers=groups, config=SimpleNamespace(brokerName="broker-a"),
                           store=SimpleNamespace(look_message_by_offset=records.get))


def _admin_request(msg_id="7F00000100002A9F0000000000001000", client_id="127.0.0.1@c1"):
    return RemotingCommand(RequestCode.CONSUME_MESSAGE_DIRECTLY, opaque=9,
                           ext_fields={"consumerGroup": "G", "clientId": client_id, "msgId": msg_id})


async def _process(ctx, cmd):
    from pocketmq.broker.processors.admin import process_consume_message_directly
    r = process_consume_message_directly(ctx, None, cmd)
    return await r if asyncio.iscoroutine(r) else r


async def test_broker_forwards_the_record_with_its_name_and_relays_the_answer():
    from pocketmq.broker.processors.admin import CALL_CLIENT_TIMEOUT_S
    answer = ConsumeMessageDirectlyResult(consume_result="CR_SUCCESS").encode()
    ch = _Channel(answer)
    rec = _record()
    resp = await _process(_broker_ctx(ch, {0x1000: rec}), _admin_request())
    assert resp.code == ResponseCode.SUCCESS and resp.opaque == 9 and resp.body_bytes() == answer
    fwd, timeout_s = ch.got[0]
    assert fwd.code == RequestCode.CONSUME_MESSAGE_DIRECTLY and fwd.body_bytes() == rec
    assert fwd.ext_fields == {"consumerGroup": "G", "clientId": "127.0.0.1@c1", "brokerName": "broker-a",
                              "msgId": "7F00000100002A9F0000000000001000"}
    assert timeout_s == CALL_CLIENT_TIMEOUT_S == 10.0


async def test_broker_errors_name_the_problem():
    from pocketmq.remoting.connection import RemotingError, RequestTimeout
    rec = {0x1000: _record()}
    # a client that does not answer within the bound, one whose connection dies meanwhile
    resp = await _process(_broker_ctx(_Channel(RequestTimeout("no answer in 10s")), rec), _admin_request())
    assert resp.code == ResponseCode.CONSUME_MSG_TIMEOUT and "127.0.0.1@c1" in resp.remark
    resp = await _process(_broker_ctx(_Channel(RemotingError("connection closed")), rec), _admin_request())
    assert resp.code == ResponseCode.SYSTEM_ERROR and "connection closed" in resp.remark
    # a client that is gone: nothing is read or sent
    ch = _Channel(b"{}")
    resp = await _process(_broker_ctx(ch, rec), _admin_request(client_id="127.0.0.1@gone"))
    assert resp.code == ResponseCode.SYSTEM_ERROR and "<127.0.0.1@gone> <G> not online" in resp.remark
    for msg_id, what in (("7F00000100002A9F0000000000002000", "can not find message by the offset, 8192"),
                         ("nothex", "bad message id"), ("", "<msgId> is null")):
        resp = await _process(_broker_ctx(ch, rec), _admin_request(msg_id=msg_id))
        assert resp.code == ResponseCode.SYSTEM_ERROR and what in resp.remark, resp.remark
    assert ch.got == []
