"""ClientAPI over a recording transport: the headers each request code gets, and responses
turned into values or typed exceptions (no sockets, no sleeps)."""
import pytest

from pocketmq.client import errors
from pocketmq.client.api import ClientAPI, PullRequest, PullResult, ResetOffsetRequest, SendBackRequest, pull_sys_flag
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import (
    MessageQueue,
    TopicConfig,
    decode_lock_body,
    dumps,
    encode_mq_set,
    encode_reset_offset_body,
)
from pocketmq.protocol.codes import PullSysFlag, RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import decode_pull_header

MQ = MessageQueue("T", "broker-a", 3)


class _Remoting:
    def __init__(self, transport):
        self.t = transport
        self.connections = {}

    async def invoke_namesrv(self, cmd, timeout_s):
        return self.t.answer(None, cmd, "namesrv")

    async def invoke(self, addr, cmd, timeout_s):
        return self.t.answer(addr, cmd, "namesrv")


class RecordingTransport:
    """Answers every request with the next queued response (SUCCESS by default)."""

    def __init__(self, *responses):
        self.responses = list(responses)
        self.sent = []
        self.remoting = _Remoting(self)

    def answer(self, addr, cmd, how):
        self.sent.append((addr, cmd, how))
        if self.responses:
            return self.responses.pop(0)
        return RemotingCommand(ResponseCode.SUCCESS)

    async def invoke(self, addr, cmd, timeout_s=3.0):
        return self.answer(addr, cmd, "invoke")

    async def invoke_oneway(self, addr, cmd):
        self.answer(addr, cmd, "oneway")

    async def invoke_unprepared(self, addr, cmd, timeout_s=3.0):
        return self.answer(addr, cmd, "unprepared")


def _resp(code=ResponseCode.SUCCESS, ext=None, body=b"", remark=None):
    return RemotingCommand(code, remark=remark, ext_fields=ext or {}, body=body)


def _record(offset):
    host = (bytes([127, 0, 0, 1]), 1)
    return msgcodec.encode_record("T", 3, 0, b"body%d" % offset, msgcodec.encode_properties({"TAGS": "A"}), 0,
                                  1, host, host, 0, 0, offset, 1000 + offset, 2)


def _pull_req(**kw):
    args = dict(addr="b:1", group="G", mq=MQ, offset=5, max_nums=32, sys_flag=pull_sys_flag(True, True, True),
                commit_offset=4, suspend_ms=15000, subscription="A || B", sub_version=7, timeout_s=30.0)
    args.update(kw)
    return PullRequest(**args)


async def test_pull_builds_the_header_and_maps_every_status():
    body = _record(5) + _record(6)
    t = RecordingTransport(
        _resp(ResponseCode.SUCCESS, {"nextBeginOffset": "7", "minOffset": "0", "maxOffset": "9"}, body),
        _resp(ResponseCode.PULL_NOT_FOUND, {"nextBeginOffset": "5", "minOffset": "0", "maxOffset": "5"}),
        _resp(ResponseCode.PULL_RETRY_IMMEDIATELY, {"nextBeginOffset": "6"}),
        _resp(ResponseCode.PULL_OFFSET_MOVED, {"nextBeginOffset": "100", "minOffset": "100", "maxOffset": "120"}),
        _resp(ResponseCode.SUBSCRIPTION_NOT_LATEST, remark="stale"),
    )
    api = ClientAPI(t)
    r = await api.pull_message(_pull_req(raw=True))
    assert (r.status, r.next_begin_offset, r.max_offset) == (PullResult.FOUND, 7, 9)
    assert [rec[3] for rec in r.records] == [5, 6]
    addr, cmd, _ = t.sent[0]
    assert addr == "b:1" and cmd.code == RequestCode.PULL_MESSAGE
    h = decode_pull_header(cmd.ext_fields)
    assert (h.consumer_group, h.topic, h.queue_id, h.queue_offset, h.max_msg_nums, h.commit_offset,
            h.suspend_timeout_millis, h.subscription, h.sub_version, h.expression_type) == (
        "G", "T", 3, 5, 32, 4, 15000, "A || B", 7, "TAG")
    assert h.sys_flag == PullSysFlag.COMMIT_OFFSET | PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION
    assert (await api.pull_message(_pull_req())).status == PullResult.NO_NEW_MSG
    assert (await api.pull_message(_pull_req())).status == PullResult.NO_MATCHED_MSG
    moved = await api.pull_message(_pull_req())
    assert (moved.status, moved.next_begin_offset, moved.min_offset) == (PullResult.OFFSET_ILLEGAL, 100, 100)
    with pytest.raises(errors.SubscriptionError):
        await api.pull_message(_pull_req())


async def test_pull_body_salvage_is_the_transport_owners_choice():
    good, bad = _record(1), bytearray(_record(2))
    bad[-1] ^= 0xFF          # breaks the properties' framing, not the record size
    body = good + bytes(bad)
    ok = _resp(ResponseCode.SUCCESS, {"nextBeginOffset": "3"}, body)
    try:
        msgcodec.decode_records_raw(body)
    except ValueError:
        pass
    else:
        pytest.skip("this corruption still decodes")
    with pytest.raises(errors.BrokerSystemError):
        await ClientAPI(RecordingTransport(ok)).pull_message(_pull_req(raw=True))
    salvaged = []

    def salvage(b, decode, mq, e):
        salvaged.append(mq)
        return ["kept"]
    r = await ClientAPI(RecordingTransport(ok), salvage).pull_message(_pull_req(raw=True))
    assert r.records == ["kept"] and salvaged == [MQ]


async def test_offset_requests():
    t = RecordingTransport(_resp(ext={"offset": "42"}), _resp(ResponseCode.QUERY_NOT_FOUND),
                           _resp(ext={"offset": "9"}), _resp(ext={"offset": "1"}), _resp(ext={"offset": "5"}),
                           _resp(ext={"timestamp": "1700"}), _resp(ResponseCode.SYSTEM_ERROR, remark="x"),
                           _resp(ext={}))
    api = ClientAPI(t)
    assert await api.query_consumer_offset("b:1", "G", MQ) == 42
    assert await api.query_consumer_offset("b:1", "G", MQ) == -1
    assert await api.max_offset("b:1", MQ) == 9
    assert await api.min_offset("b:1", MQ) == 1
    assert await api.search_offset("b:1", MQ, 123) == 5
    assert await api.earliest_msg_store_time("b:1", MQ) == 1700
    with pytest.raises(errors.BrokerSystemError):
        await api.max_offset("b:1", MQ)
    with pytest.raises(errors.BrokerError, match="without offset"):
        await api.max_offset("b:1", MQ)
    codes = [c.code for _, c, _ in t.sent]
    assert codes == [RequestCode.QUERY_CONSUMER_OFFSET] * 2 + [
        RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
        RequestCode.GET_EARLIEST_MSG_STORETIME, RequestCode.GET_MAX_OFFSET, RequestCode.GET_MAX_OFFSET]
    assert t.sent[0][1].ext_fields == {"consumerGroup": "G", "topic": "T", "queueId": "3"}
    assert t.sent[4][1].ext_fields == {"topic": "T", "queueId": "3", "timestamp": "123"}
    await api.update_consumer_offset("b:1", "G", MQ, 77, oneway=True)
    await api.update_consumer_offset("b:1", "G", MQ, 78)
    (_, one, how1), (_, two, how2) = t.sent[-2:]
    assert (how1, how2) == ("oneway", "invoke")
    assert one.ext_fields == {"consumerGroup": "G", "topic": "T", "queueId": "3", "commitOffset": "77"}
    assert all(isinstance(v, str) for _, c, _ in t.sent for v in c.ext_fields.values())


async def test_group_requests_send_back_locks_and_registration():
    t = RecordingTransport(_resp(body=dumps({"consumerIdList": ["c1", "c2"]})), _resp(),
                           _resp(body=encode_mq_set("lockOKMQSet", [MQ])), _resp(),
                           _resp(ResponseCode.SYSTEM_ERROR), _resp(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST))
    api = ClientAPI(t)
    assert await api.consumer_id_list("b:1", "G") == ["c1", "c2"]
    await api.send_back(SendBackRequest("b:1", "G", 1234, 0, "ID", "T", 16))
    assert t.sent[1][1].ext_fields == {"offset": "1234", "group": "G", "delayLevel": "0", "originMsgId": "ID",
                                       "originTopic": "T", "unitMode": "false", "maxReconsumeTimes": "16"}
    assert await api.lock_batch("b:1", "G", "cid", [MQ]) == [MQ]
    assert decode_lock_body(t.sent[2][1].body) == ("G", "cid", [MQ])
    await api.unlock_batch("b:1", "G", "cid", [MQ])
    assert t.sent[3][1].code == RequestCode.UNLOCK_BATCH_MQ
    with pytest.raises(errors.BrokerSystemError):
        await api.heartbeat("b:1", b"{}")
    assert t.sent[4][2] == "unprepared"          # heartbeats prepare connections themselves
    with pytest.raises(errors.SubscriptionError):
        await api.consumer_id_list("b:1", "G")
    await api.unregister_client("b:1", "cid", consumer_group="G")
    assert t.sent[-1][1].ext_fields == {"clientID": "cid", "consumerGroup": "G"}


async def test_send_message_codes_and_send_ok_statuses():
    t = RecordingTransport(_resp(ResponseCode.FLUSH_DISK_TIMEOUT), _resp(ResponseCode.SYSTEM_BUSY))
    api = ClientAPI(t)
    assert (await api.send_message("b:1", {"a": "PG"}, b"x")).code == ResponseCode.FLUSH_DISK_TIMEOUT
    with pytest.raises(errors.SystemBusyError):
        await api.send_message("b:1", {"a": "PG"}, b"x", batch=True)
    assert await api.send_message("b:1", {"a": "PG"}, b"x", oneway=True) is None
    assert [c.code for _, c, _ in t.sent] == [RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
                                              RequestCode.SEND_MESSAGE_V2]


async def test_admin_requests():
    table = {MQ: 11}
    t = RecordingTransport(
        _resp(), _resp(), _resp(body=dumps({"topicList": ["B", "A"]})), _resp(ResponseCode.TOPIC_NOT_EXIST),
        _resp(body=encode_reset_offset_body(table)), _resp(body=dumps({"table": {"k": "v"}})),
        _resp(body=_record(3)), _resp(ResponseCode.TOPIC_NOT_EXIST, remark="no T"))
    api = ClientAPI(t)
    await api.create_topic("b:1", TopicConfig("T", 4, 2, 6, order=True), "TBW102")
    assert t.sent[0][1].ext_fields == {"topic": "T", "defaultTopic": "TBW102", "readQueueNums": "4",
                                       "writeQueueNums": "2", "perm": "6", "topicFilterType": "SINGLE_TAG",
                                       "topicSysFlag": "0", "order": "true"}
    await api.put_kv_config("ORDER_TOPIC_CONFIG", "T", "broker-a:2", namesrv_addr="n:1")
    assert t.sent[1][0] == "n:1" and t.sent[1][1].code == RequestCode.PUT_KV_CONFIG
    assert sorted(await api.topic_list()) == ["A", "B"]
    assert await api.get_route("T") is None
    assert await api.reset_offset("b:1", ResetOffsetRequest("T", "G", -1)) == table
    assert t.sent[4][1].ext_fields == {"topic": "T", "group": "G", "timestamp": "-1", "isForce": "true"}
    assert await api.broker_runtime_info("b:1") == {"table": {"k": "v"}}
    assert (await api.view_message("b:1", 999)).queue_offset == 3
    assert t.sent[6][1].ext_fields == {"offset": "999"}
    with pytest.raises(errors.TopicNotExistError, match="no T"):
        await api.topic_stats("b:1", "T")
