"""Message commands: sendMessage, queryMsgById."""
from __future__ import annotations

import random
import time
from functools import partial

from pocketmq.client.errors import BrokerError
from pocketmq.client.message import Message, UniqIdGenerator

# the client's one response-code -> SendStatus table (private to the producer for now)
from pocketmq.client.producer import SEND_STATUS
from pocketmq.common.constants import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    DEFAULT_TOPIC_QUEUE_NUMS,
)
from pocketmq.protocol.bodies import MessageQueue, TopicRouteData
from pocketmq.protocol.codes import PermName
from pocketmq.protocol.headers.typed import SendMessageRequestHeader
from pocketmq.protocol.message import (
    decode_offset_msg_id,
    maybe_compress,
    offset_msg_id,
    parse_host,
)
from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.command import Command, Opt, Out, non_negative_int, stripped
from pocketmq.tools.mqadmin.errors import (
    AdminError,
    UsageError,
    code_name,
    failed,
    one_line,
)
from pocketmq.tools.mqadmin.session import (
    AdminSession,
    route_masters,
    to_int,
    topic_not_exist,
)


async def send_route(s: AdminSession, topic: str) -> tuple[TopicRouteData, bool]:
    """The topic's route; like RocketMQ's producer, fall back to TBW102 (auto-create) if
    unknown. Returns (route, auto_create)."""
    route = await s.find_route(topic)
    if route is not None:
        return route, False
    try:
        route = await s.find_route(AUTO_CREATE_TOPIC_KEY_TOPIC)
    except AdminError:
        route = None
    if route is None:
        raise topic_not_exist(topic)
    return route, True


def writable_queues(route: TopicRouteData, topic: str, masters: dict[str, str], auto_create: bool) -> list:
    queues = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if not PermName.writeable(qd.perm) or qd.broker_name not in masters:
            continue
        # a topic the broker creates on first send gets the producer's default queue count
        n = min(DEFAULT_TOPIC_QUEUE_NUMS, qd.write_queue_nums) if auto_create else qd.write_queue_nums
        queues += [MessageQueue(topic, qd.broker_name, q) for q in range(n)]
    return queues


async def send_message(s: AdminSession, a, out: Out) -> None:
    if a.qid is not None and not a.broker:
        raise UsageError("sendMessage: broker name (-b) must be set if the queue (-i) is chosen")
    route, auto_create = await send_route(s, a.topic)
    masters = route_masters(route)
    queues = writable_queues(route, a.topic, masters, auto_create)
    if a.broker:
        if a.broker not in masters:
            known = ", ".join(sorted(masters)) or "none"
            raise AdminError(f"broker {a.broker} has no master in the route of topic {a.topic} (brokers: {known})")
        queues = [q for q in queues if q.broker_name == a.broker]
        if a.qid is not None:
            if a.qid not in {q.queue_id for q in queues}:
                raise AdminError(f"queue {a.qid} is not a writable queue of topic {a.topic} on broker {a.broker} "
                                 f"(it has {len(queues)} writable queues)")
            queues = [q for q in queues if q.queue_id == a.qid]
    if not queues:
        raise AdminError(f"topic {a.topic} has no writable queue")
    mq = random.choice(queues)
    addr = masters[mq.broker_name]

    uniq = UniqIdGenerator().next_id()
    msg = Message(a.topic, a.body, tags=a.tags or None, keys=a.key or ())
    body, sys_flag = maybe_compress(msg.body)
    now_ms = time.time_ns() // 1_000_000
    header = SendMessageRequestHeader(
        producer_group=f"mqadmin-{now_ms}", topic=a.topic, default_topic=AUTO_CREATE_TOPIC_KEY_TOPIC,
        default_topic_queue_nums=DEFAULT_TOPIC_QUEUE_NUMS, queue_id=mq.queue_id, sys_flag=sys_flag,
        born_timestamp=now_ms, flag=msg.flag, properties=msg.wire_properties_text(uniq),
        reconsume_times=0, unit_mode=False, batch=False, max_reconsume_times=None)
    try:
        resp = await s.reach(addr, partial(s.api.send_message, timeout_s=s.api.timeout_s), header, body)
    except BrokerError as e:
        raise failed(e, f"send to topic {a.topic}", f"broker {mq.broker_name} {addr}") from None
    ext = resp.ext_fields
    qid = to_int(ext.get("queueId"), mq.queue_id)
    out(tables.format_table(["#Broker Name", "#QID", "#Send Result", "#MsgId", "#OffsetMsgId", "#Queue Offset"],
                            [(mq.broker_name, qid, SEND_STATUS[resp.code].value, uniq, ext.get("msgId", ""),
                              ext.get("queueOffset", ""))]))


async def query_msg_by_id(s: AdminSession, a, out: Out) -> None:
    ids = [i.strip() for i in a.msgId.split(",") if i.strip()]
    if not ids:
        raise UsageError("queryMsgById: -i needs at least one message id")
    views = []
    for msg_id in ids:
        try:
            ip, port, offset = decode_offset_msg_id(msg_id.upper())
        except ValueError as e:
            raise AdminError(f"bad message id {msg_id!r}: {e} (queryMsgById takes the offsetMsgId "
                             "that the broker returned, not the client UNIQ_KEY)") from None
        addr = f"{ip}:{port}"
        try:
            msg = await s.reach(addr, s.api.view_message, offset)
        except BrokerError as e:
            raise AdminError(f"message {msg_id} not found on broker {addr}: "
                             f"{one_line(e.remark) or 'no details'} ({code_name(e.code)})") from None
        try:
            host, hport = parse_host(msg.store_host)
            oid = offset_msg_id(host, hport, msg.commit_log_offset)
        except ValueError:
            oid = msg_id.upper()
        views.append(tables.format_message(msg, oid, a.bodyFormat))
    out("\n\n".join(views))


COMMANDS = [
    Command("sendMessage", "Send a message", [
        Opt("t", "topic", "Topic name", required=True, type=stripped),
        Opt("p", "body", "UTF-8 string format of the message body", required=True),
        Opt("k", "key", "Message keys"),
        Opt("c", "tags", "Message tags"),
        Opt("b", "broker", "Send message to target broker (broker name)"),
        Opt("i", "qid", "Send message to target queue (needs -b)", type=non_negative_int),
    ], send_message),
    Command("queryMsgById", "Query Message by Id", [
        Opt("i", "msgId", "Message Id (offsetMsgId; several separated by ',')", required=True),
        Opt("f", "bodyFormat", "print message body by the specified charset (default utf-8)", default="utf-8"),
    ], query_msg_by_id, needs_namesrv=False),
]
