"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320).

Checks in RocketMQ's order (reference 5.2, 8.2, 8.3): broker writable, topic
name valid and not forbidden, topic exists or is auto-created from
defaultTopic, queueId legal, sizes; then the append. A send that auto-creates its
topic is answered only once the topic is in topics.json and registered with every
nameserver (bounded by registerBrokerTimeoutMills; `_publish_then_send`). Under SYNC_FLUSH the
reply waits for the group commit covering the record (FLUSH_DISK_TIMEOUT
after syncFlushTimeout). A prepared transactional message (sysFlag
TRANSACTION_PREPARED, TRAN_MSG=true) is stored as a half message (`_send_half`).
Responses always carry MSG_REGION and TRACE_ON, which Java clients read
unconditionally.

SYNC_MASTER (as Java 4.9's handleHA): after the store (and the flush under SYNC_FLUSH),
the reply waits until a slave acked an offset at or past the message's end (one waiter per
request: a batch or a coalesced group waits once); no slave connected, or the best one
more than haSlaveFallbehindMax behind, answers SLAVE_NOT_AVAILABLE at once, a wait longer
than slaveTimeout FLUSH_SLAVE_TIMEOUT. The message is stored either way: both answers
carry its msgId, queueId and queueOffset. A slave refuses every send (`refuse_on_slave`).

Timer messages (RocketMQ 5: TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS) are parked
in rmq_sys_wheel_timer by broker/core/timer.py's `place`; past timerMaxDelaySec the send is
refused with MESSAGE_ILLEGAL and Java's remark. A batch's header may not ask for a timer
(MESSAGE_ILLEGAL); timer properties inside a batch's elements are stored as sent.
"""
from __future__ import annotations

import random
import zlib

from pocketmq.broker.core.delay import delay_level, to_schedule
from pocketmq.broker.core.status import put_status_response
from pocketmq.broker.core.timer import TimerError, has_timer_property
from pocketmq.broker.core.timer import place as timer_place
from pocketmq.broker.processors.end_transaction import store_half
from pocketmq.broker.core.topics import validate_topic
from pocketmq.broker.store.api import PutMessageStatus
from pocketmq.common.constants import DLQ_GROUP_TOPIC_PREFIX as DLQ_PREFIX
from pocketmq.common.constants import (
    NOT_ALLOWED_SEND_TOPICS,
    RETRY_GROUP_TOPIC_PREFIX,
    TRANS_HALF_TOPIC,
    dlq_topic,
)
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.codes import PermName, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import decode_send_fields
from pocketmq.protocol.message import PROPERTIES_LENGTH_BYTES_MAX

_PUT_OK = PutMessageStatus.PUT_OK
_TRANSACTION_MASK = msgcodec.MessageSysFlag.TRANSACTION_MASK
_PREPARED = msgcodec.MessageSysFlag.TRANSACTION_PREPARED_TYPE


def _host_of(conn) -> tuple[bytes, int]:
    host = conn.attrs.get("born_host")
    if host is None:
        host = conn.attrs["born_host"] = msgcodec.parse_host(conn.remote_addr or "127.0.0.1:0")
    return host


def _ext_base(ctx) -> dict:
    region, trace_on = ctx.send_ext_region_trace
    return {"MSG_REGION": region, "TRACE_ON": trace_on}


def _error(ctx, cmd, code, remark):
    return cmd.response(code, remark, ext_fields=_ext_base(ctx))


_WRITEABLE = PermName.WRITE
_SUCCESS = ResponseCode.SUCCESS


def process_send(ctx, conn, cmd):
    (_group, topic, default_topic, default_topic_queue_nums, queue_id, sys_flag, born_timestamp, flag, props,
     reconsume_times, _unit_mode, batch, max_reconsume_times) = decode_send_fields(cmd.code, cmd.ext_fields)
    cfg = ctx.config
    if not cfg.brokerPermission & _WRITEABLE:
        return _error(ctx, cmd, ResponseCode.NO_PERMISSION,
                      f"the broker[{cfg.brokerIP1}] sending message is forbidden")
    if topic in NOT_ALLOWED_SEND_TOPICS:
        return _error(ctx, cmd, ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.")
    if ctx.fence is not None:
        refused = ctx.fence()
        if refused is not None:
            return _error(ctx, cmd, *refused)
    now = ctx.now_ms()
    tc = ctx.topics.get(topic)
    if tc is None:
        # Known topics were validated when created; only a new name needs checking.
        bad = validate_topic(topic)
        if bad:
            return _error(ctx, cmd, ResponseCode.SYSTEM_ERROR, bad)
        tc = ctx.topics.create_from_default(topic, default_topic, default_topic_queue_nums, now)
        if tc is None:
            return _error(ctx, cmd, ResponseCode.TOPIC_NOT_EXIST,
                          f"topic[{topic}] not exist, apply first please!")
        return _publish_then_send(ctx, conn, cmd, topic)
    if ctx.unpublished_topics and topic in ctx.unpublished_topics:
        return _publish_then_send(ctx, conn, cmd, topic)   # created by a send still publishing it
    if not tc.perm & _WRITEABLE:
        return _error(ctx, cmd, ResponseCode.NO_PERMISSION,
                      f"the topic[{topic}] sending message is forbidden")
    if queue_id < 0:
        queue_id = random.randrange(tc.write_queue_nums)
    elif queue_id >= tc.write_queue_nums and queue_id >= tc.read_queue_nums:
        return _error(ctx, cmd, ResponseCode.SYSTEM_ERROR,
                      f"request queueId[{queue_id}] is illegal, {tc.topic_name} Producer: {conn.remote_addr}")
    body = cmd.body
    if len(body) > cfg.maxMessageSize:
        return _error(ctx, cmd, ResponseCode.MESSAGE_ILLEGAL,
                      f"the message body size {len(body)} exceeds the limit {cfg.maxMessageSize}B")
    props = props or ""
    # A message sent back to %RETRY% too often goes to the dead-letter queue.
    if not batch and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
        gcfg = ctx.groups.find(group, now)
        max_times = max_reconsume_times if (max_reconsume_times is not None and cmd.version >= 121) \
            else (gcfg.retryMaxTimes if gcfg else 16)
        if reconsume_times >= max_times:
            topic = dlq_topic(group)
            ctx.topics.create_retry_or_dlq(topic, 1, PermName.READ | PermName.WRITE, now)
            ctx.on_topics_changed()
            queue_id = 0
    batch_props = ctx.cluster_property
    born_host = _host_of(conn)
    store = ctx.store
    if batch:
        if has_timer_property(props) and _asks_timer(topic, queue_id, props, now):
            return _error(ctx, cmd, ResponseCode.MESSAGE_ILLEGAL, "timer messages cannot be sent in a batch")
        if sys_flag & msgcodec.MessageSysFlag.COMPRESSED_FLAG:
            # The C++ 1.2.x client zlib-compresses a whole batch body over 4 KiB (Java never
            # compresses batches, and a Java broker stores such a batch as one message).
            # Elements are stored uncompressed, so the flag is cleared.
            inflater = zlib.decompressobj()
            try:
                body = inflater.decompress(body, cfg.maxFrameSize)
            except zlib.error as e:
                return _error(ctx, cmd, ResponseCode.MESSAGE_ILLEGAL, f"bad compressed batch body: {e}")
            if inflater.unconsumed_tail:   # bounded: a zip bomb is refused, not inflated
                return _error(ctx, cmd, ResponseCode.MESSAGE_ILLEGAL,
                              f"compressed batch body inflates beyond {cfg.maxFrameSize} bytes")
            sys_flag &= ~(msgcodec.MessageSysFlag.COMPRESSED_FLAG | 0x700)
        # Batch-level properties (header + CLUSTER) are appended to every element's while
        # the body is parsed: one pass over the elements, properties kept as bytes.
        extra = ((props + "\x02" if props and not props.endswith("\x02") else props) + batch_props).encode()
        try:
            result = store.put_batch_body(topic, queue_id, sys_flag, born_timestamp, born_host, now, body,
                                          extra, reconsume_times, cfg.maxMessageSize)
        except ValueError as e:
            return _error(ctx, cmd, ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {e}")
        # like Java, the batch's WAIT is the one in the request header's properties
        wait = "WAIT\x01false" not in props
    else:
        p = props + "\x02" + batch_props if props and not props.endswith("\x02") else props + batch_props
        if sys_flag & _TRANSACTION_MASK == _PREPARED:
            return _send_half(ctx, cmd, conn, _group, topic, queue_id, flag, body, p, sys_flag, born_timestamp,
                              now, reconsume_times)
        store_topic, store_qid = topic, queue_id
        level = 0
        if "DELAY\x01" in p and not topic.startswith(DLQ_PREFIX):
            level = delay_level(p)
            if level > 0 and (sys_flag & 0xC) in (0, 8):
                # Parked in SCHEDULE_TOPIC_XXXX until due (reference 8.4); the reply still
                # names the queue the producer asked for, as Java's does.
                store_topic, store_qid, p = to_schedule(topic, queue_id, p, level, len(ctx.delay_levels))
        if level <= 0 and has_timer_property(p) and not topic.startswith(DLQ_PREFIX) and (sys_flag & 0xC) in (0, 8):
            # RocketMQ 5's timer message: parked in rmq_sys_wheel_timer until its time
            # (broker/core/timer.py); a delay level above wins, as in Java
            try:
                timer = _timer_place(ctx, topic, queue_id, p, now)
            except _TimerRefused as e:
                return _error(ctx, cmd, *e.args)
            if timer is not None:
                store_topic, store_qid, p = timer
        props_b = p.encode()
        if len(props_b) > PROPERTIES_LENGTH_BYTES_MAX:
            return _error(ctx, cmd, ResponseCode.MESSAGE_ILLEGAL,
                          "the message is illegal, maybe msg body or properties length not matched. "
                          "msg properties length limit 32KB.")
        wait = "WAIT\x01false" not in props
        result = store.put(store_topic, store_qid, flag, body, props_b, sys_flag, born_timestamp, born_host,
                           now, reconsume_times)
    if result.status is not _PUT_OK:
        code, remark = put_status_response(result.status, cfg.maxMessageSize)
        return _error(ctx, cmd, code, remark)
    region, trace_on = ctx.send_ext_region_trace
    ext = {"MSG_REGION": region, "TRACE_ON": trace_on, "msgId": result.msg_id, "queueId": str(queue_id),
           "queueOffset": str(result.queue_offset)}
    ctx.stats.count_put(topic, result)
    if wait and (ctx.sync_flush or ctx.sync_master):
        return _await_durable(ctx, cmd, ext, result.wrote_offset + result.wrote_bytes)
    return cmd.response(_SUCCESS, None, ext)


class _TimerRefused(Exception):
    """(response code, remark) of a refused timer message."""


def _timer_place(ctx, topic, queue_id, p, now):
    """timer.place under the broker's settings; raises _TimerRefused."""
    if not ctx.config.timerWheelEnable:
        raise _TimerRefused(ResponseCode.SYSTEM_ERROR,   # Java's remark
                            "accurate timer message is not enabled, timerWheelEnable is false")
    try:
        return timer_place(topic, queue_id, p, now, ctx.config.timerMaxDelaySec)
    except TimerError as e:
        raise _TimerRefused(ResponseCode.MESSAGE_ILLEGAL, str(e)) from None


def _asks_timer(topic, queue_id, props, now) -> bool:
    try:
        return timer_place(topic, queue_id, props, now, 1 << 62) is not None
    except TimerError:
        return True


def _send_half(ctx, cmd, conn, group, topic, queue_id, flag, body, p, sys_flag, born_timestamp, now,
               reconsume_times):
    """A prepared transactional message: stored as a half message (end_transaction.py), so
    no consumer sees it before END_TRANSACTION commits it. The answer names the half
    message (its queue offset and offsetMsgId are what END_TRANSACTION quotes)."""
    if ctx.config.rejectTransactionMessage:
        return _error(ctx, cmd, ResponseCode.NO_PERMISSION,
                      f"the broker[{ctx.config.brokerIP1}] sending transaction message is forbidden")
    if f"{msgcodec.TRAN_MSG}\x01true" not in p:
        return _error(ctx, cmd, ResponseCode.MESSAGE_ILLEGAL,
                      "sysFlag says TRANSACTION_PREPARED but the property TRAN_MSG is not true")
    if has_timer_property(p):
        # a timer message's time is checked now (it is parked when committed: end_transaction.py)
        try:
            _timer_place(ctx, topic, queue_id, p, now)
        except _TimerRefused as e:
            return _error(ctx, cmd, *e.args)
    result = store_half(ctx, topic, queue_id, flag, body, p, sys_flag, born_timestamp, _host_of(conn), now,
                        reconsume_times, group)
    if result.status is not _PUT_OK:
        code, remark = put_status_response(result.status, ctx.config.maxMessageSize)
        return _error(ctx, cmd, code, remark)
    region, trace_on = ctx.send_ext_region_trace
    ext = {"MSG_REGION": region, "TRACE_ON": trace_on, "msgId": result.msg_id, "queueId": str(queue_id),
           "queueOffset": str(result.queue_offset)}
    ctx.stats.count_put(TRANS_HALF_TOPIC, result)
    if "WAIT\x01false" not in p and (ctx.sync_flush or ctx.sync_master):
        return _await_durable(ctx, cmd, ext, result.wrote_offset + result.wrote_bytes)
    return cmd.response(_SUCCESS, None, ext)


async def _publish_then_send(ctx, conn, cmd, topic):
    """A send that auto-created `topic` (or found it still being published): as Java 4.9,
    the topic is in topics.json and registered with every nameserver before the message is
    stored and the send answered, so a consumer started right after finds its route and
    a broker killed right after still knows the topic."""
    try:
        await ctx.publish_topics(topic)
    except OSError as e:
        return _error(ctx, cmd, ResponseCode.SYSTEM_ERROR, f"create topic[{topic}] failed: cannot persist it: {e}")
    result = process_send(ctx, conn, cmd)   # the topic exists now: the ordinary path
    if type(result) is not RemotingCommand:
        result = await result
    return result


async def _await_durable(ctx, cmd, ext, end_offset):
    """SYNC_FLUSH's and SYNC_MASTER's waits (both when both are set, side by side)."""
    replicated = None
    if ctx.sync_master:
        repl = ctx.replication
        if not repl.slave_ok(end_offset):
            return cmd.response(ResponseCode.SLAVE_NOT_AVAILABLE, None, ext_fields=ext)
        replicated = repl.waiter(end_offset, ctx.config.slaveTimeout / 1000)
    if ctx.sync_flush:
        ok = await ctx.flush_service.wait_flushed(end_offset, ctx.config.syncFlushTimeout / 1000)
        if ok is None:
            return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE,
                                "the store failed to flush; it no longer accepts writes", ext_fields=_ext_base(ctx))
        if not ok:
            return cmd.response(ResponseCode.FLUSH_DISK_TIMEOUT, None, ext_fields=ext)
    ok = replicated is None or await replicated
    if ctx.fence is not None:
        # controller mode: the lease may have gone while the send waited (the agent then
        # ends the wait at once); a master that is no longer sure to be the master never
        # answers SEND_OK, and says why, so the client looks for the new one (failover.py)
        refused = ctx.fence()
        if refused is not None:
            return cmd.response(refused[0], refused[1], ext_fields=ext)
    if not ok:
        return cmd.response(ResponseCode.FLUSH_SLAVE_TIMEOUT, None, ext_fields=ext)
    return cmd.response(ResponseCode.SUCCESS, None, ext_fields=ext)


def refuse_on_slave(ctx, conn, cmd):
    """A slave's answer to a send: its log is the master's copy (Java's store answers
    SERVICE_NOT_AVAILABLE to a put on a slave)."""
    return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE,
                        f"the broker {ctx.config.brokerName} (brokerId {ctx.config.brokerId}) is a slave: "
                        f"send to its master", ext_fields=_ext_base(ctx))
