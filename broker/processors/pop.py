"""POP_MESSAGE (200050), ACK_MESSAGE (200051), CHANGE_MESSAGE_INVISIBLETIME (200053):
RocketMQ 5's POP consumption on the 4.x remoting wire, over broker/services/pop.py.

Request headers (RocketMQ 5's PopMessageRequestHeader, AckMessageRequestHeader,
ChangeInvisibleTimeRequestHeader):

| code | fields |
|---|---|
| POP_MESSAGE | consumerGroup, topic, queueId (-1: all), maxMsgNums (<= 32), invisibleTime (ms), |
| | pollTime (ms), bornTime, initMode (0 MIN, 1 MAX), expType, exp, order, attemptId |
| ACK_MESSAGE | consumerGroup, topic, queueId, extraInfo, offset |
| CHANGE_MESSAGE_INVISIBLETIME | consumerGroup, topic, queueId, extraInfo, offset, invisibleTime |

Answers: POP_MESSAGE SUCCESS with the stored records back to back as the body (as a
PULL body) and PopMessageResponseHeader: popTime, invisibleTime, reviveQid, restNum,
startOffsetInfo (`topicType queueId startOffset;...`), msgOffsetInfo (`topicType
queueId o1,o2,...;...`), orderCountInfo (FIFO: `topicType qo<queueId>%<offset>
count;...`); no message within pollTime: POLLING_TIMEOUT; too many pops waiting:
POLLING_FULL. A Java 5 client builds each message's extraInfo from these (ExtraInfoUtil).
ACK_MESSAGE: SUCCESS, or NO_MESSAGE when the extraInfo names no live lease (forged,
stale, acked). CHANGE_MESSAGE_INVISIBLETIME: SUCCESS with ChangeInvisibleTimeResponseHeader
(popTime, invisibleTime, reviveQid; the client's new extraInfo carries the new popTime), or
NO_MESSAGE. An extraInfo may carry our handle's signature as a tenth field (then it must
verify); 4.x-wire clients build theirs unsigned, so what stands between them and another
group's messages is the live-lease check (queue, offset and the pop time in ms).

Differences from Java: no bornTime/pollTime "timeout too much" refusal (it fails clients
whose clock is off); pops wait at most 60 s.
"""
from __future__ import annotations

from pocketmq.broker.core.pop import INIT_MAX, PopError
from pocketmq.common.constants import POP_ORDER_REVIVE_QUEUE
from pocketmq.protocol.codes import ResponseCode
from pocketmq.protocol.headers.typed import opt_int, opt_str, parse_bool, req_int, req_str


def _error(cmd, e: PopError):
    return cmd.response(e.code, e.remark)


async def process_pop(ctx, conn, cmd):
    e = cmd.ext_fields
    group = req_str(e, "consumerGroup")
    topic = req_str(e, "topic")
    queue_id = req_int(e, "queueId", -1, 2**31 - 1)
    max_nums = req_int(e, "maxMsgNums", -2**31, 2**31 - 1)
    invisible = req_int(e, "invisibleTime")
    poll = opt_int(e, "pollTime", 0)
    init_mode = opt_int(e, "initMode", INIT_MAX)
    order = parse_bool(opt_str(e, "order"))
    attempt_id = opt_str(e, "attemptId") or None
    try:
        r = await ctx.pop.pop(group, topic, queue_id, max_nums, invisible, attempt_id=attempt_id,
                              expression=opt_str(e, "exp") or "*", expression_type=opt_str(e, "expType") or "TAG",
                              poll_ms=max(0, poll), fifo=True if order else None, init_mode=init_mode)
    except PopError as err:
        return _error(cmd, err)
    ext = {"popTime": str(r.pop_time), "invisibleTime": str(r.invisible_ms), "reviveQid": str(r.revive_qid),
           "restNum": str(r.rest_num),
           "startOffsetInfo": ";".join(f"{k} {q} {o}" for k, q, o in r.start_offsets)}
    offsets: dict[tuple[str, int], list[int]] = {}
    for p in r.messages:
        offsets.setdefault(("1" if p.topic != topic else "0", p.queue_id), []).append(p.offset)
    ext["msgOffsetInfo"] = ";".join(f"{k} {q} {','.join(map(str, os_))}" for (k, q), os_ in offsets.items())
    if r.revive_qid and r.order_counts:
        ext["orderCountInfo"] = ";".join(f"{k} qo{q}%{o} {c}" for k, q, o, c in r.order_counts)
    if not r.messages:
        return cmd.response(ResponseCode.POLLING_TIMEOUT, "NO_MESSAGE_IN_QUEUE", ext_fields=ext)
    return cmd.response(ResponseCode.SUCCESS, "FOUND", ext_fields=ext, body=b"".join(p.raw for p in r.messages))


async def process_ack(ctx, conn, cmd):
    e = cmd.ext_fields
    try:
        await ctx.pop.ack(req_str(e, "consumerGroup"), req_str(e, "topic"), req_str(e, "extraInfo"), signed=False,
                          offset=req_int(e, "offset"), queue_id=req_int(e, "queueId"))
    except PopError as err:
        return _error(cmd, err)
    return cmd.response(ResponseCode.SUCCESS)


async def process_change_invisible(ctx, conn, cmd):
    e = cmd.ext_fields
    try:
        _, lease = await ctx.pop.change_invisible(
            req_str(e, "consumerGroup"), req_str(e, "topic"), req_str(e, "extraInfo"), req_int(e, "invisibleTime"),
            signed=False, offset=req_int(e, "offset"), queue_id=req_int(e, "queueId"))
    except PopError as err:
        return _error(cmd, err)
    return cmd.response(ResponseCode.SUCCESS, ext_fields={
        "popTime": str(lease.pop_time), "invisibleTime": str(lease.invisible_ms),
        "reviveQid": str(POP_ORDER_REVIVE_QUEUE if lease.fifo else 0)})
