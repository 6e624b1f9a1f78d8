"""END_TRANSACTION (37): a producer commits or rolls back a half message (reference 3.6,
8.6; Java 4.9's EndTransactionProcessor), and the stores every transaction decision
shares (the half message itself is stored by the send processor, `store_half`).

The half message is looked up by the header's commitLogOffset and checked against the
header (a half message, PGROUP = producerGroup, queue offset = tranStateTableOffset).
COMMIT re-stores it to REAL_TOPIC / REAL_QID with the transaction type COMMIT and
PREPAREDTRANSACTIONOFFSET = the half message's commit-log offset (through
SCHEDULE_TOPIC_XXXX when it has a delay level, or rmq_sys_wheel_timer when it is a timer
message, as a plain send would); ROLLBACK stores
nothing. Both then write an op record (broker/core/transaction.py) so neither the
check-back service nor a second END_TRANSACTION applies a decision again. The real
message is stored before the op record: a crash between the two can deliver a
committed message twice (at least once), never lose it. NOT_TYPE (unknown) is Java's
"nothing to do": no answer, as Java gives none.
"""
from __future__ import annotations

import logging

from pocketmq.broker.core import transaction as tx
from pocketmq.broker.core.delay import delay_level, to_schedule
from pocketmq.broker.core.status import put_status_response
from pocketmq.broker.core.timer import has_timer_property
from pocketmq.broker.core.timer import place as timer_place
from pocketmq.broker.store.api import MessageToStore, PutMessageResult, PutMessageStatus
from pocketmq.common.constants import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.codes import PermName, ResponseCode
from pocketmq.protocol.headers.typed import decode_end_transaction_header

log = logging.getLogger("pocketmq.broker.transaction")

_RW = PermName.READ | PermName.WRITE


def ensure_system_topic(ctx, topic: str) -> None:
    """The half, op and discard topics are created on first use (1 queue, perm 6, as Java's
    TransactionalMessageBridge does), so admin tools list them."""
    if ctx.topics.get(topic) is None:
        ctx.topics.create_retry_or_dlq(topic, 1, _RW, ctx.now_ms())
        ctx.on_topics_changed()


def store_half(ctx, topic: str, queue_id: int, flag: int, body: bytes, props: str, sys_flag: int,
               born_timestamp: int, born_host, now: int, reconsume_times: int,
               producer_group: str) -> PutMessageResult:
    """A prepared message, stored as a half message (the send processor's branch)."""
    ensure_system_topic(ctx, TRANS_HALF_TOPIC)
    return ctx.store.put(TRANS_HALF_TOPIC, tx.HALF_QUEUE_ID, flag, body,
                         tx.half_properties(props, topic, queue_id, producer_group).encode(),
                         tx.half_sys_flag(sys_flag), born_timestamp, born_host, now, reconsume_times)


def write_op(ctx, half_queue_offset: int, origin: int) -> bool:
    """Record a decision: the origin is decided from now on (in memory at once, durable
    with the op record). False when the store refused the op record (logged)."""
    ctx.transactions.add(origin)
    ensure_system_topic(ctx, TRANS_OP_HALF_TOPIC)
    body, props = tx.op_record(half_queue_offset, origin)
    now = ctx.now_ms()
    result = ctx.store.put_message(MessageToStore(TRANS_OP_HALF_TOPIC, tx.OP_QUEUE_ID, 0, body, props, 0, now,
                                                  ctx.store_host, now))
    if result.status is not PutMessageStatus.PUT_OK:
        log.error("writing the op record of half message %d failed: %s; the decision holds until a restart",
                  half_queue_offset, result.status.name)
        return False
    return True


def discard(ctx, rec: msgcodec.MessageExt, origin: int) -> None:
    """A half message checked transactionCheckMax times: kept in TRANS_CHECK_MAX_TIME_TOPIC
    for operators (as Java 4.9 does), and decided (no later decision applies)."""
    props = rec.properties
    log.warning("half message %s (topic %s, origin %d) discarded after %s checks without an answer",
                props.get(msgcodec.UNIQ_KEY), props.get(msgcodec.REAL_TOPIC), origin,
                props.get(msgcodec.TRANSACTION_CHECK_TIMES))
    ensure_system_topic(ctx, TRANS_CHECK_MAX_TIME_TOPIC)
    now = ctx.now_ms()
    result = ctx.store.put_message(MessageToStore(
        TRANS_CHECK_MAX_TIME_TOPIC, 0, rec.flag, rec.body, msgcodec.encode_properties(dict(props)),
        rec.sys_flag, rec.born_timestamp, msgcodec.parse_host(rec.born_host), now, rec.reconsume_times))
    if result.status is not PutMessageStatus.PUT_OK:
        log.error("keeping discarded half message %d in %s failed: %s", rec.queue_offset,
                  TRANS_CHECK_MAX_TIME_TOPIC, result.status.name)
    write_op(ctx, rec.queue_offset, origin)


def _commit(ctx, rec: msgcodec.MessageExt, real: tx.RealMessage) -> PutMessageResult:
    topic, qid, props = real
    now = ctx.now_ms()
    level = 0
    if msgcodec.DELAY in rec.properties and ctx.delay_levels:
        level = delay_level(props)
        if level > 0:
            topic, qid, props = to_schedule(topic, qid, props, level, len(ctx.delay_levels))
    if level <= 0 and has_timer_property(props) and ctx.config.timerWheelEnable:
        # a timer message's time counts from the commit, as in Java; the send of the half
        # message checked it (send.py), so the bound is not applied a second time here
        timer = timer_place(topic, qid, props, now, 1 << 62)
        if timer is not None:
            topic, qid, props = timer
    sys_flag = msgcodec.MessageSysFlag.reset_transaction_value(rec.sys_flag, tx.COMMIT)
    return ctx.store.put_message(MessageToStore(
        topic, qid, rec.flag, rec.body, props, sys_flag, rec.born_timestamp,
        msgcodec.parse_host(rec.born_host), now, rec.reconsume_times, rec.commit_log_offset))


def process_end_transaction(ctx, conn, cmd):
    h = decode_end_transaction_header(cmd.ext_fields)
    if h.commit_or_rollback == tx.NOT_TYPE:
        return None     # unknown: the check-back service will ask (Java answers nothing)
    raw = ctx.store.look_message_by_offset(h.commit_log_offset) if h.commit_log_offset >= 0 else None
    if raw is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR,
                            f"Find prepared transaction message failed: no message at commitLogOffset "
                            f"{h.commit_log_offset}")
    try:
        rec = msgcodec.decode_record(bytes(raw), decompress=False)
    except ValueError as e:     # an offset inside a record, not at its start
        return cmd.response(ResponseCode.SYSTEM_ERROR,
                            f"Find prepared transaction message failed: no message starts at commitLogOffset "
                            f"{h.commit_log_offset} ({e})")
    props = rec.properties
    bad = tx.check_end_transaction(rec.topic, props, rec.queue_offset, h.producer_group,
                                   h.tran_state_table_offset, h.commit_or_rollback)
    if bad is not None:
        return cmd.response(*bad)
    origin = tx.origin_of(props, rec.queue_offset)
    if origin in ctx.transactions:
        log.info("END_TRANSACTION %d for half message %d (origin %d, msgId %s) ignored: already decided",
                 h.commit_or_rollback, rec.queue_offset, origin, h.msg_id)
        return cmd.response(ResponseCode.SUCCESS, "the transaction was already decided; nothing applied")
    if h.commit_or_rollback == tx.COMMIT:
        real = tx.real_message(props)
        if real is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR,
                                "the half message has no REAL_TOPIC/REAL_QID; cannot commit it")
        result = _commit(ctx, rec, real)
        if result.status is not PutMessageStatus.PUT_OK:
            code, remark = put_status_response(result.status, ctx.config.maxMessageSize)
            return cmd.response(code, remark)   # undecided: a later check asks again
        ctx.stats.count_put(real.topic, result)
    write_op(ctx, rec.queue_offset, origin)
    return cmd.response(ResponseCode.SUCCESS)

