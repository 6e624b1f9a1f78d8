"""Broker processors driven through their BrokerContext, without sockets: an in-memory
store, an integer clock and a recording connection stand in for the running broker.
Also: the one status table covers every store status, and the hold service answers
held pulls only through the replay it is given."""
import asyncio

from pocketmq.broker.config import BrokerConfig
from pocketmq.broker.core.clients import ConsumerManager, ProducerManager
from pocketmq.broker.core.held_pulls import HeldPull, HeldPullTable
from pocketmq.broker.core.locks import RebalanceLockManager
from pocketmq.broker.core.offsets import ConsumerOffsetManager
from pocketmq.broker.core.status import (GET_STATUS_RESPONSE, PUT_STATUS_RESPONSE, pull_status_response,
                                         put_status_response)
from pocketmq.broker.core.subscription_groups import SubscriptionGroupManager
from pocketmq.broker.core.topics import TopicConfigManager
from pocketmq.broker.processors import build_processor_table
from pocketmq.broker.processors.context import BrokerContext, BrokerStats
from pocketmq.broker.processors.pull import replay
from pocketmq.broker.services.hold import HoldService
from pocketmq.broker.store.api import GetMessageStatus, PutMessageStatus
from pocketmq.broker.store.memory_store import MemoryStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.common.constants import SCHEDULE_TOPIC
from pocketmq.protocol.codes import PullSysFlag, RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import SendMessageRequestHeader, encode_send_header
from pocketmq.protocol.message import decode_records, encode_properties


# -- the status table -----------------------------------------------------------------------

def test_every_put_status_has_a_response():
    assert set(PUT_STATUS_RESPONSE) == set(PutMessageStatus)
    for status in PutMessageStatus:
        code, remark = put_status_response(status, 1024)
        assert (code == C.SUCCESS) == (status is PutMessageStatus.PUT_OK)
        assert (remark is None) == (status is PutMessageStatus.PUT_OK)


def test_every_get_status_has_a_response():
    assert set(GET_STATUS_RESPONSE) == set(GetMessageStatus)
    for status in GetMessageStatus:
        for offset in (0, 5):
            code, remark = pull_status_response(status, offset)
            assert isinstance(code, int) and remark == status.name


def test_status_responses():
    assert put_status_response(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, 4096) == (
        C.MESSAGE_ILLEGAL, "the message is illegal, maybe msg body or properties length not matched. "
                           "msg body length limit 4096B, msg properties length limit 32KB.")
    assert put_status_response(PutMessageStatus.OS_PAGECACHE_BUSY, 1)[0] == C.SYSTEM_BUSY
    assert put_status_response(PutMessageStatus.CREATE_MAPEDFILE_FAILED, 1) == (
        C.SYSTEM_ERROR, "create mapped file failed, server is busy or broken.")      # Java's remark
    assert pull_status_response(GetMessageStatus.FOUND, 3) == (C.SUCCESS, "FOUND")
    assert pull_status_response(GetMessageStatus.OFFSET_TOO_SMALL, 3)[0] == C.PULL_OFFSET_MOVED
    # An empty queue: "not found" from offset 0, "offset moved" from anywhere else.
    assert pull_status_response(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0)[0] == C.PULL_NOT_FOUND
    assert pull_status_response(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 1)[0] == C.PULL_OFFSET_MOVED


# -- processors over a context ----------------------------------------------------------------

class Conn:
    """What processors use of a connection; records what is sent."""

    def __init__(self, addr="10.0.0.7:5555"):
        self.remote_addr = addr
        self.attrs = {}
        self.closed = False
        self.sent = []

    def send(self, cmd):
        self.sent.append(cmd)

    oneway = send


class Env:
    def __init__(self, tmp_path, *, store_record_max=4 * 1024 * 1024, **config):
        self.now = 1_700_000_000_000
        self.mono = 0
        self.closing = False
        self.wakes = 0
        self.topic_changes = 0
        self.published = []
        self.groups_persisted = 0
        cfg = BrokerConfig(storePathRootDir=str(tmp_path), brokerIP1="127.0.0.1", **config)
        self.store = MemoryStore(StoreConfig(str(tmp_path), max_message_size=store_record_max))
        self.store.open()
        self.ctx = BrokerContext(
            config=cfg, store=self.store,
            topics=TopicConfigManager(cluster_name=cfg.brokerClusterName, broker_name=cfg.brokerName,
                                      auto_create_topic_enable=True, default_topic_queue_nums=4),
            offsets=ConsumerOffsetManager(), groups=SubscriptionGroupManager(True), consumers=ConsumerManager(),
            producers=ProducerManager(), locks=RebalanceLockManager(), held_pulls=HeldPullTable(10),
            stats=BrokerStats(), flush_service=None, sync_flush=False, delay_levels=cfg.delay_levels_ms(),
            cluster_property=f"CLUSTER\x01{cfg.brokerClusterName}", send_ext_region_trace=("R1", "false"),
            pull_max_msg_nums=32, now_ms=lambda: self.now, mono_ms=lambda: self.mono,
            is_closing=lambda: self.closing, wake_hold=self._wake, on_topics_changed=self._topics_changed,
            publish_topics=self._publish, unpublished_topics=set(), persist_groups=self._persist_groups)
        self.table = build_processor_table(self.ctx)
        self.conn = Conn()

    def _wake(self):
        self.wakes += 1

    def _topics_changed(self):
        self.topic_changes += 1

    async def _publish(self, topic):
        # what the broker does before answering: the topic is durable and routable
        self.published.append((topic, self.ctx.topics.get(topic) is not None,
                               self.store.get_max_offset_in_queue(topic, 0)))

    async def _persist_groups(self):
        self.groups_persisted += 1

    def call(self, cmd):
        result = self.table[cmd.code](self.conn, cmd)
        if result is not None and type(result) is not RemotingCommand:   # a processor that waits (publication, flush)
            result = asyncio.run(result)
        return result


def send_cmd(topic, body=b"x", queue_id=0, props=None):
    h = SendMessageRequestHeader("pg", topic, "TBW102", 4, queue_id, 0, 1_700_000_000_000, 0,
                                 encode_properties({"TAGS": "A", **(props or {})}), 0, False, False, None)
    return RemotingCommand(R.SEND_MESSAGE_V2, opaque=7, ext_fields=encode_send_header(h, v2=True), body=body)


def pull_cmd(topic, queue_id, offset, *, suspend_ms=0, opaque=9):
    flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if suspend_ms else 0)
    return RemotingCommand(R.PULL_MESSAGE, opaque=opaque, ext_fields={
        "consumerGroup": "G", "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
        "maxMsgNums": "32", "sysFlag": str(flag), "commitOffset": "0",
        "suspendTimeoutMillis": str(suspend_ms), "subscription": "*", "subVersion": "0"})


def test_send_then_pull_through_the_context(tmp_path):
    env = Env(tmp_path)
    r = env.call(send_cmd("T", b"hello", queue_id=2))
    assert r.code == C.SUCCESS and r.opaque == 7
    assert r.ext_fields["queueId"] == "2" and r.ext_fields["queueOffset"] == "0"
    assert (r.ext_fields["MSG_REGION"], r.ext_fields["TRACE_ON"]) == ("R1", "false")
    # auto-created, and published before the message was stored
    assert env.published == [("T", True, 0)] and env.ctx.topics.get("T") is not None
    r = env.call(pull_cmd("T", 2, 0))
    assert (r.code, r.remark, r.ext_fields["nextBeginOffset"]) == (C.SUCCESS, "FOUND", "1")
    (msg,) = decode_records(b"".join(r.body))
    assert msg.body == b"hello" and msg.store_timestamp == env.now and msg.properties["CLUSTER"]
    assert (env.ctx.stats.msg_put_total, env.ctx.stats.msg_get_total) == (1, 1)
    # Past the end of a queue that has messages: the status table's answer, status name as remark.
    r = env.call(pull_cmd("T", 2, 5))
    assert (r.code, r.remark) == (C.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY")


def test_store_refusal_is_answered_from_the_status_table(tmp_path):
    # The broker's body limit passes the message; the store's record limit refuses it.
    env = Env(tmp_path, store_record_max=300, maxMessageSize=2048)
    r = env.call(send_cmd("T", b"y" * 1000))
    assert r.code == C.MESSAGE_ILLEGAL and "msg body length limit 2048B" in r.remark
    assert r.ext_fields["MSG_REGION"] == "R1"
    assert env.ctx.stats.msg_put_total == 0


def test_a_parked_pull_wakes_the_hold_service_and_is_replayed_with_its_opaque(tmp_path):
    env = Env(tmp_path)
    env.call(send_cmd("T", b"first"))
    assert env.call(pull_cmd("T", 0, 1, suspend_ms=15_000, opaque=42)) is None   # parked
    assert env.wakes == 1 and env.ctx.held_pulls.count == 1
    assert env.ctx.held_pulls.next_deadline_ms() == 15_000   # on the monotonic clock
    env.call(send_cmd("T", b"second"))
    (held,) = env.ctx.held_pulls.notify("T", 0, 2, None)
    replay(env.ctx, held)
    (resp,) = env.conn.sent
    assert resp.code == C.SUCCESS and resp.opaque == 42
    assert [m.body for m in decode_records(b"".join(resp.body))] == [b"second"]


def test_pulls_are_not_parked_while_closing(tmp_path):
    env = Env(tmp_path)
    env.call(send_cmd("T", b"x"))
    env.closing = True
    r = env.call(pull_cmd("T", 0, 1, suspend_ms=15_000))
    assert r.code == C.PULL_NOT_FOUND and env.ctx.held_pulls.count == 0 and env.wakes == 0


def test_send_back_goes_through_the_delay_levels(tmp_path):
    env = Env(tmp_path)
    sent = env.call(send_cmd("T", b"work"))
    (msg,) = decode_records(b"".join(env.call(pull_cmd("T", 0, 0)).body))
    r = env.call(RemotingCommand(R.CONSUMER_SEND_MSG_BACK, ext_fields={
        "offset": str(msg.commit_log_offset), "group": "G", "delayLevel": "0", "originMsgId": sent.ext_fields["msgId"],
        "originTopic": "T"}))
    assert r.code == C.SUCCESS
    got = env.store.get_message(SCHEDULE_TOPIC, 2, 0, 1)   # level 3 (first retry) is queue 2
    (parked,) = decode_records(b"".join(got.buffers))
    assert parked.properties["REAL_TOPIC"] == "%RETRY%G" and parked.reconsume_times == 1
    assert parked.store_timestamp == env.now
    assert env.ctx.stats.msg_put_total == 2


# -- the hold service answers through the replay it is given ----------------------------------

def _held(topic, qid, offset, deadline):
    h = type("H", (), {"topic": topic, "queue_id": qid})()
    return HeldPull("conn", None, h, None, offset, deadline)


async def test_hold_service_close_answers_every_held_pull_through_replay():
    table = HeldPullTable()
    held = [_held("T", 0, 0, 100), _held("U", 1, 3, 200)]
    for p in held:
        table.hold(p)
    answered = []
    hs = HoldService(table, answered.append, mono_ms=lambda: 0, max_offset_of=lambda t, q: 0)
    await hs.close()
    assert answered == held and table.count == 0


async def test_hold_service_replays_a_woken_pull():
    table = HeldPullTable()
    p = _held("T", 0, 0, 10_000)
    p.subscription = type("S", (), {"matches_tags_code": staticmethod(lambda code: True)})()
    table.hold(p)
    woken = asyncio.Event()
    answered = []

    def answer(held):
        answered.append(held)
        woken.set()
    hs = HoldService(table, answer, mono_ms=lambda: 0, max_offset_of=lambda t, q: 0)
    hs.on_dispatch("T", 0, 1, 123, 0)
    await asyncio.wait_for(woken.wait(), 5)
    assert answered == [p] and table.count == 0
