"""CONSUMER_SEND_MSG_BACK (36): a consumer returns a message it could not consume.

Reference 8.5 (RocketMQ 4.9.4 SendMessageProcessor.asyncConsumerSendMsgBack): the
stored message at the `offset` header field (a commit-log offset) is re-written with
its own RECONSUME_TIME + 1 to %RETRY%<group> (a random one of retryQueueNums queues)
through the delay levels (level 3 + reconsumeTimes unless the consumer chose one), or
to %DLQ%<group> queue 0 when it has been retried maxReconsumeTimes times or
delayLevel < 0. maxReconsumeTimes is the group's retryMaxTimes unless the request
carries one (version >= V3_4_9), which wins, as in Java. RETRY_TOPIC and
ORIGIN_MESSAGE_ID are set once, on the first send-back, and kept after.

The C++ client 1.2.x sends only offset, group and delayLevel (0); see docs/broker.md
for why its consumers can see reconsume_times skip (its C API fails a whole pulled
batch at the first failing message; the broker counts every send-back it gets).
"""
from __future__ import annotations

import random

from pocketmq.broker.core.delay import send_back_properties, to_schedule
from pocketmq.broker.core.status import put_status_response
from pocketmq.broker.store.api import MessageToStore
from pocketmq.common.constants import dlq_topic, retry_topic
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.codes import PermName, ResponseCode
from pocketmq.protocol.headers.typed import opt_int, opt_str, req_int, req_str

MAX_RECONSUME_TIMES_DEFAULT = 16


def process_send_back(ctx, conn, cmd):
    e = cmd.ext_fields
    offset = req_int(e, "offset")
    group = req_str(e, "group")
    delay_level = req_int(e, "delayLevel")
    now = ctx.now_ms()
    gcfg = ctx.groups.find(group, now)
    if gcfg is None:
        return cmd.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                            f"subscription group not exist, {group}")
    if not PermName.writeable(ctx.config.brokerPermission):
        return cmd.response(ResponseCode.NO_PERMISSION, f"the broker[{ctx.config.brokerIP1}] sending message is forbidden")
    if gcfg.retryQueueNums <= 0:
        return cmd.response(ResponseCode.SUCCESS)   # the group asked for no retries: dropped
    rtopic = retry_topic(group)
    created = ctx.topics.get(rtopic) is None
    rtc = ctx.topics.create_retry_or_dlq(rtopic, gcfg.retryQueueNums, PermName.READ | PermName.WRITE, now)
    if created:
        ctx.on_topics_changed()
    if not PermName.writeable(rtc.perm):
        return cmd.response(ResponseCode.NO_PERMISSION, f"the topic[{rtopic}] sending message is forbidden")
    raw = ctx.store.look_message_by_offset(offset)
    if raw is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}")
    msg = msgcodec.decode_record(bytes(raw), decompress=False)
    max_times = gcfg.retryMaxTimes
    header_max = opt_int(e, "maxReconsumeTimes")
    if header_max is not None and cmd.version >= 121:   # V3_4_9: older clients cannot set it
        max_times = header_max
    origin_topic = opt_str(e, "originTopic") or msg.topic
    origin_id = opt_str(e, "originMsgId") or msg.msg_id
    for name, value in (("originTopic", origin_topic), ("originMsgId", origin_id)):
        if "\x01" in value or "\x02" in value:
            # they become properties of the stored copy, whose separators these are
            return cmd.response(ResponseCode.SYSTEM_ERROR,
                                f"{name} holds a property separator (\\x01 or \\x02): {value!r}")
    dlq = msg.reconsume_times >= max_times or delay_level < 0
    level = 0 if dlq else delay_level if delay_level > 0 else 3 + msg.reconsume_times
    code, remark = store_back(ctx, group, msg, rtopic, min(gcfg.retryQueueNums, rtc.write_queue_nums), level, dlq=dlq,
                              origin_topic=origin_topic, origin_id=origin_id, now=now)
    return cmd.response(code, remark)


def store_back(ctx, group: str, msg, retry_topic_name: str, retry_queues: int, level: int, *, dlq: bool,
               origin_topic: str, origin_id: str, now: int) -> tuple[int, str | None]:
    """Store `msg` (a decoded stored record) again for another delivery to `group`: into
    `retry_topic_name` (a random one of `retry_queues` queues; through delay level `level`,
    0: visible at once) with RECONSUME_TIME + 1, or with `dlq` into %DLQ%<group> queue 0
    (created READ|WRITE). RETRY_TOPIC / ORIGIN_MESSAGE_ID keep their first values.
    (SUCCESS, None) or (SYSTEM_ERROR, remark). The one writer of retries and dead letters:
    CONSUMER_SEND_MSG_BACK and POP's revive (broker/services/pop.py) both call it."""
    if dlq:
        topic = dlq_topic(group)
        created = ctx.topics.get(topic) is None
        # perm 6 (READ|WRITE) as RocketMQ >= 4.9.2, so the dead letters can be read back.
        ctx.topics.create_retry_or_dlq(topic, 1, PermName.READ | PermName.WRITE, now)
        if created:
            ctx.on_topics_changed()
        queue_id, level = 0, 0
    else:
        topic = retry_topic_name
        # Java: random % retryQueueNums; bounded by the topic's queues in case it was created
        # with fewer by hand (a queue outside the route would never be pulled)
        queue_id = random.randrange(max(1, retry_queues))
    props = send_back_properties(msg.properties, origin_topic, origin_id, level)
    store_topic, store_qid = topic, queue_id
    if level > 0:
        store_topic, store_qid, props = to_schedule(topic, queue_id, props, level, len(ctx.delay_levels))
    result = ctx.store.put_message(MessageToStore(
        store_topic, store_qid, msg.flag, msg.body, props, msg.sys_flag, msg.born_timestamp,
        msgcodec.parse_host(msg.born_host), now, msg.reconsume_times + 1))
    code, remark = put_status_response(result.status, ctx.config.maxMessageSize)
    if code != ResponseCode.SUCCESS:
        return ResponseCode.SYSTEM_ERROR, remark
    ctx.stats.count_put(topic, result)
    return ResponseCode.SUCCESS, None
