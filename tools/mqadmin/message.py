"""Message commands: sendMessage, queryMsgById, queryMsgByKey, queryMsgByUniqueKey,
queryMsgByOffset, printMsg (Java's names, flags and output shapes)."""
from __future__ import annotations

import argparse
import random
import time
from functools import partial

from pocketmq.client.api import PullRequest, PullResult, pull_sys_flag
from pocketmq.client.errors import BrokerError, MessageNotFoundError, RemotingFailure
from pocketmq.client.message import Message, UniqIdGenerator

# the client's one response-code -> SendStatus table (private to the producer for now)
from pocketmq.client.producer import SEND_STATUS
from pocketmq.client.query import query_route, view_route
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
from pocketmq.tools.mqadmin.command import Command, Opt, Out, java_bool, non_negative_int, positive_int, stripped
from pocketmq.tools.mqadmin.errors import (
    AdminError,
    UsageError,
    code_name,
    failed,
    one_line,
)
from pocketmq.tools.mqadmin.offset import reset_timestamp
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


def _direct_args(a) -> tuple[str, str] | None:
    """(group, clientId) when -g and -d ask to consume the message directly (Java's tools
    need both: with one of them they only print the message)."""
    if a.consumerGroup and a.clientId:
        return a.consumerGroup, a.clientId
    return None


async def consume_directly(s: AdminSession, addr: str, msg_id: str, group: str, client_id: str) -> str:
    """CONSUME_MESSAGE_DIRECTLY through the broker at `addr` that stores the message: the
    client's ConsumeMessageDirectlyResult as Java's toString prints it."""
    try:
        r = await s.reach(addr, s.api.consume_message_directly, group, client_id, msg_id)
    except BrokerError as e:
        raise failed(e, f"consume message {msg_id} directly by {client_id} of group {group}",
                     f"broker {addr}") from None
    return str(r)


async def query_msg_by_id(s: AdminSession, a, out: Out) -> None:
    ids = [i.strip() for i in a.msgId.split(",") if i.strip()]
    if not ids:
        raise UsageError("queryMsgById: -i needs at least one message id")
    direct = _direct_args(a)
    views = []
    for msg_id in ids:
        try:
            ip, port, offset = decode_offset_msg_id(msg_id.upper())
        except ValueError as e:
            raise AdminError(f"bad message id {msg_id!r}: {e} (queryMsgById takes the offsetMsgId "
                             "that the broker returned, not the client UNIQ_KEY)") from None
        addr = f"{ip}:{port}"
        if direct is not None:
            views.append(await consume_directly(s, addr, msg_id.upper(), *direct))
            continue
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


TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"      # Java's MixAll.TOOLS_CONSUMER_GROUP
PRINT_BATCH = 32                            # printMsg pulls 32 at a time, like Java


def timestamp(s: str) -> int:
    """-b / -e: now | milliseconds | yyyy-MM-dd#HH:mm:ss:SSS (local time)."""
    v = reset_timestamp(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"bad timestamp {s!r}: must not be negative")
    return v


async def _admin_lookup(s: AdminSession, what: str, coro):
    """A lookup through client/query.py: transport failures and error answers become one
    AdminError line."""
    try:
        return await coro
    except RemotingFailure as e:
        raise AdminError(f"{what} failed: cannot reach a broker ({e})") from None
    except BrokerError as e:
        raise failed(e, what, "broker") from None


async def query_msg_by_key(s: AdminSession, a, out: Out) -> None:
    begin = a.beginTimestamp if a.beginTimestamp is not None else 0
    end = a.endTimestamp
    if end is not None and end < begin:
        raise UsageError("queryMsgByKey: the end timestamp (-e) is before the begin timestamp (-b)")
    route = await s.route(a.topic)
    msgs = await _admin_lookup(s, f"query of key {a.msgKey} in topic {a.topic}",
                               query_route(s.api, route, a.topic, a.msgKey, a.maxNum, begin, end))
    out(tables.format_table(["#Message ID", "#QID", "#Offset"],
                            [(m.msg_id, m.queue_id, m.queue_offset) for m in msgs], right=(1, 2)))


def _view(msg, charset: str) -> str:
    try:
        host, port = parse_host(msg.store_host)
        oid = offset_msg_id(host, port, msg.commit_log_offset)
    except ValueError:
        oid = ""
    return tables.format_message(msg, oid, charset)


async def query_msg_by_unique_key(s: AdminSession, a, out: Out) -> None:
    route = await s.route(a.topic)
    try:
        msg = await _admin_lookup(s, f"query of message {a.msgId} in topic {a.topic}",
                                  view_route(s.api, a.msgId, a.topic, route))
    except MessageNotFoundError as e:
        raise AdminError(str(e)) from None
    direct = _direct_args(a)
    if direct is not None:
        # like Java's: the broker that stores the message, asked by the message's offsetMsgId
        try:
            host, port = parse_host(msg.store_host)
        except ValueError as e:
            raise AdminError(f"message {a.msgId} has no usable store host {msg.store_host!r}: {e}") from None
        oid = offset_msg_id(host, port, msg.commit_log_offset)
        out(await consume_directly(s, msg.store_host, oid, *direct))
        return
    out(_view(msg, a.bodyFormat))


async def _pull(s: AdminSession, addr: str, mq: MessageQueue, offset: int, n: int, expression: str) -> PullResult:
    req = PullRequest(addr, TOOLS_CONSUMER_GROUP, mq, offset, n, pull_sys_flag(False, False, True), 0, 0,
                      expression, 0, s.api.timeout_s)
    try:
        return await _reach_pull(s, addr, req)
    except BrokerError as e:
        raise failed(e, f"pull of {mq.topic} queue {mq.queue_id} at {offset}", f"broker {mq.broker_name} {addr}") from None


async def _reach_pull(s: AdminSession, addr: str, req: PullRequest) -> PullResult:
    try:
        return await s.api.pull_message(req)
    except RemotingFailure as e:
        raise AdminError(f"cannot reach broker {addr} ({s.reason(e, addr)})") from None


async def query_msg_by_offset(s: AdminSession, a, out: Out) -> None:
    route = await s.route(a.topic)
    masters = route_masters(route)
    addr = masters.get(a.brokerName)
    if addr is None:
        known = ", ".join(sorted(masters)) or "none"
        raise AdminError(f"broker {a.brokerName} has no master in the route of topic {a.topic} (brokers: {known})")
    mq = MessageQueue(a.topic, a.brokerName, a.queueId)
    res = await _pull(s, addr, mq, a.offset, 1, "*")
    if res.status != PullResult.FOUND or not res.records:
        raise AdminError(f"no message at offset {a.offset} of {a.topic} queue {a.queueId} on {a.brokerName} "
                         f"({res.status}; the queue holds {res.min_offset}..{res.max_offset - 1})")
    out(_view(res.records[0], "utf-8"))


def _mq_text(mq: MessageQueue) -> str:
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


def _msg_text(m) -> str:
    """Java's MessageExt.toString(), the fields printMsg shows."""
    props = ", ".join(f"{k}={v}" for k, v in m.properties.items())
    return (f"MessageExt [queueId={m.queue_id}, storeSize={m.store_size}, queueOffset={m.queue_offset}, "
            f"sysFlag={m.sys_flag}, bornTimestamp={m.born_timestamp}, bornHost={m.born_host}, "
            f"storeTimestamp={m.store_timestamp}, storeHost={m.store_host}, msgId={m.offset_msg_id}, "
            f"commitLogOffset={m.commit_log_offset}, bodyCRC={m.body_crc}, reconsumeTimes={m.reconsume_times}, "
            f"preparedTransactionOffset={m.prepared_transaction_offset}, toString()=Message{{topic='{m.topic}', "
            f"flag={m.flag}, properties={{{props}}}}}]")


async def print_msg(s: AdminSession, a, out: Out) -> None:
    route = await s.route(a.topic)
    masters = route_masters(route)
    charset = a.charsetName or "utf-8"
    try:
        "".encode(charset)
    except LookupError:
        raise UsageError(f"printMsg: unknown charset {charset!r}") from None
    expression = a.subExpression or "*"
    print_body = True if a.printBody is None else a.printBody
    queues = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if qd.broker_name in masters:
            queues += [MessageQueue(a.topic, qd.broker_name, q) for q in range(qd.read_queue_nums)]
    for mq in queues:
        addr = masters[mq.broker_name]
        lo = await s.call(addr, s.api.min_offset, mq, what="min offset", where=f"broker {mq.broker_name}")
        hi = await s.call(addr, s.api.max_offset, mq, what="max offset", where=f"broker {mq.broker_name}")
        if a.beginTimestamp is not None:
            lo = await s.call(addr, s.api.search_offset, mq, a.beginTimestamp, what="offset search",
                              where=f"broker {mq.broker_name}")
        if a.endTimestamp is not None:
            hi = await s.call(addr, s.api.search_offset, mq, a.endTimestamp, what="offset search",
                              where=f"broker {mq.broker_name}")
        out(f"minOffset={lo}, maxOffset={hi}, {_mq_text(mq)}")
        offset = lo
        while offset < hi:
            res = await _pull(s, addr, mq, offset, min(PRINT_BATCH, hi - offset), expression)
            offset = res.next_begin_offset
            if res.status == PullResult.FOUND:
                for m in res.records:
                    if m.queue_offset >= hi:
                        break
                    body = tables.decode_body(m.body, charset) if print_body else "NOT PRINT BODY"
                    out(f"MSGID: {m.msg_id} {_msg_text(m)} BODY: {body}")
            elif res.status == PullResult.NO_MATCHED_MSG:
                out(f"{_mq_text(mq)} no matched msg. status={res.status}, offset={offset}")
            else:
                out(f"{_mq_text(mq)} print msg finished. status={res.status}, offset={offset}")
                break
        out("--------------------------------------------------------")


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
        Opt("g", "consumerGroup", "consumer group name (with -d: the client consumes the message directly)",
            type=stripped),
        Opt("d", "clientId", "The consumer's client id (with -g: it consumes the message directly)", type=stripped),
        Opt("f", "bodyFormat", "print message body by the specified charset (default utf-8)", default="utf-8"),
    ], query_msg_by_id, needs_namesrv=False),
    Command("queryMsgByKey", "Query Message by Key", [
        Opt("t", "topic", "topic name", required=True, type=stripped),
        Opt("k", "msgKey", "Message Key", required=True, type=stripped),
        Opt("b", "beginTimestamp", "Begin timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS] (default 0)",
            type=timestamp),
        Opt("e", "endTimestamp", "End timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS] (default: no end)",
            type=timestamp),
        Opt("m", "maxNum", "most messages to list (default 64, paged past a broker's 64)", type=positive_int,
            default=64),
    ], query_msg_by_key),
    Command("queryMsgByUniqueKey", "Query Message by Unique key", [
        Opt("i", "msgId", "Message Id (the client msgId, or an offsetMsgId)", required=True, type=stripped),
        Opt("t", "topic", "The topic of msg", required=True, type=stripped),
        Opt("g", "consumerGroup", "consumer group name (with -d: the client consumes the message directly)",
            type=stripped),
        Opt("d", "clientId", "The consumer's client id (with -g: it consumes the message directly)", type=stripped),
        Opt("f", "bodyFormat", "print message body by the specified charset (default utf-8)", default="utf-8"),
    ], query_msg_by_unique_key),
    Command("queryMsgByOffset", "Query Message by offset", [
        Opt("t", "topic", "topic name", required=True, type=stripped),
        Opt("b", "brokerName", "Broker Name", required=True, type=stripped),
        Opt("i", "queueId", "Queue Id", required=True, type=non_negative_int),
        Opt("o", "offset", "Queue Offset", required=True, type=non_negative_int),
    ], query_msg_by_offset),
    Command("printMsg", "Print Message Detail", [
        Opt("t", "topic", "topic name", required=True, type=stripped),
        Opt("c", "charsetName", "CharsetName(eg: UTF-8,GBK)"),
        Opt("s", "subExpression", "Subscribe Expression(eg: TagA || TagB)"),
        Opt("b", "beginTimestamp", "Begin timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]", type=timestamp),
        Opt("e", "endTimestamp", "End timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]", type=timestamp),
        Opt("d", "printBody", "print body (true/false, default true)", type=java_bool),
    ], print_msg),
]
