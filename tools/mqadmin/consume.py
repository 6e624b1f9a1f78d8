"""consumeMessage: read a topic's messages from given offsets or times and print them
(Java's ConsumeMessageCommand, a pull consumer that commits nothing).

    consumeMessage -t T                       every queue, oldest first, up to -c messages
    consumeMessage -t T -b BROKER -i QID [-o OFFSET]   one queue, from OFFSET
    -s / -e                                   begin / end time (ms or yyyy-MM-dd#HH:mm:ss:SSS)
"""
from __future__ import annotations

from pocketmq.client.api import PullRequest, PullResult, pull_sys_flag
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.command import Command, Opt, Out, non_negative_int, positive_int, stripped
from pocketmq.tools.mqadmin.errors import AdminError, UsageError
from pocketmq.tools.mqadmin.offset import reset_timestamp
from pocketmq.tools.mqadmin.session import AdminSession, route_masters

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"     # Java's MixAll.TOOLS_CONSUMER_GROUP
DEFAULT_MESSAGE_NUMBER = 128
PULL_BATCH = 32
PULL_TIMEOUT_S = 10.0


def queue_range(min_offset: int, max_offset: int, begin: int | None, end: int | None,
                start: int | None, left: int) -> tuple[int, int, bool]:
    """[first, stop) of one queue to print and whether `left` cut it short. min/max are the
    queue's bounds (max exclusive), begin/end the offsets found for -s/-e, start -o."""
    first = min_offset if begin is None else max(min_offset, begin)
    stop = max_offset if end is None else min(max_offset, end)
    if start is not None:
        first = max(first, start)
    cut = stop - first > left
    if cut:
        stop = first + left
    return first, max(first, stop), cut


async def _pull(addr: str, api, req: PullRequest) -> PullResult:
    """pull_message in session.call's shape (address first; the request carries it too)."""
    return await api.pull_message(req)


async def _pull_range(s: AdminSession, addr: str, group: str, mq: MessageQueue, first: int, stop: int,
                      out: Out) -> int:
    """Print the messages of [first, stop); returns how many were printed."""
    mq_text = tables.message_queue_string(mq.topic, mq.broker_name, mq.queue_id)
    offset, printed = first, 0
    flag = pull_sys_flag(commit_offset=False, suspend=False, subscription=True)
    while offset < stop:
        req = PullRequest(addr, group, mq, offset, min(PULL_BATCH, stop - offset), flag, 0, 0, "*", 0,
                          PULL_TIMEOUT_S)
        result = await s.call(addr, _pull, s.api, req, what=f"pull {mq_text} at {offset}",
                              where=f"broker {mq.broker_name} {addr}")
        if result.status == PullResult.FOUND:
            msgs = [m for m in result.records if m.queue_offset < stop]
            out("Consume ok")
            for m in msgs:
                out(tables.message_line(m))
            printed += len(msgs)
            if result.next_begin_offset <= offset:
                break           # no progress: never spin
            offset = result.next_begin_offset
        elif result.status == PullResult.NO_MATCHED_MSG:
            out(f"{mq_text} no matched msg. status={result.status}, offset={result.next_begin_offset}")
            if result.next_begin_offset <= offset:
                break
            offset = result.next_begin_offset
        else:
            break
    out(f"{mq_text} print msg finished. offset={offset}")
    return printed


async def consume_message(s: AdminSession, a, out: Out) -> None:
    if a.queueId is not None and not a.brokerName:
        raise UsageError("consumeMessage: set -b brokerName with -i queueId")
    if a.offset is not None and a.queueId is None:
        raise UsageError("consumeMessage: set -i queueId with -o offset")
    route = await s.route(a.topic)
    masters = route_masters(route)
    if a.brokerName:
        if a.brokerName not in masters:
            raise AdminError(f"broker {a.brokerName} has no master serving topic {a.topic} "
                             f"(its brokers: {', '.join(sorted(masters)) or 'none'})")
        masters = {a.brokerName: masters[a.brokerName]}
    read_queues = {qd.broker_name: qd.read_queue_nums for qd in route.queue_datas}
    queues = []
    for name, addr in masters.items():
        n = read_queues.get(name, 0)
        if a.queueId is not None:
            if not 0 <= a.queueId < n:
                raise AdminError(f"topic {a.topic} has read queues 0..{n - 1} on broker {name}, "
                                 f"not {a.queueId}")
            queues.append((MessageQueue(a.topic, name, a.queueId), addr))
        else:
            queues += [(MessageQueue(a.topic, name, q), addr) for q in range(n)]
    if not queues:
        raise AdminError(f"topic {a.topic} has no readable queue on a master broker")
    group = a.consumerGroup or TOOLS_CONSUMER_GROUP
    left = a.messageNumber
    for mq, addr in queues:
        if left <= 0:
            break
        where = f"broker {mq.broker_name} {addr}"
        lo = await s.call(addr, s.api.min_offset, mq, what="min offset", where=where)
        hi = await s.call(addr, s.api.max_offset, mq, what="max offset", where=where)
        begin = (await s.call(addr, s.api.search_offset, mq, a.beginTimestamp, what="offset search", where=where)
                 if (a.beginTimestamp or 0) > 0 else None)
        end = (await s.call(addr, s.api.search_offset, mq, a.endTimestamp, what="offset search", where=where)
               if (a.endTimestamp or 0) > 0 else None)
        if a.offset is not None and a.offset >= max(hi, lo):
            out(f"{tables.message_queue_string(mq.topic, mq.broker_name, mq.queue_id)} no matched msg, "
                f"offset={a.offset}")
            continue
        first, stop, cut = queue_range(lo, hi, begin, end, a.offset, left)
        if cut:
            out(f"The older {stop - first} message of the {mq.queue_id} queue will be provided")
        left -= await _pull_range(s, addr, group, mq, first, stop, out)


COMMANDS = [
    Command("consumeMessage", "Consume message", [
        Opt("t", "topic", "Topic name", required=True, type=stripped),
        Opt("b", "brokerName", "Broker name", type=stripped),
        Opt("i", "queueId", "Queue Id", type=non_negative_int),
        Opt("o", "offset", "Queue offset", type=non_negative_int),
        Opt("g", "consumerGroup", f"Consumer group name (default {TOOLS_CONSUMER_GROUP}; nothing is committed)",
            type=stripped),
        Opt("s", "beginTimestamp", "Begin timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]",
            type=reset_timestamp),
        Opt("e", "endTimestamp", "End timestamp[currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]",
            type=reset_timestamp),
        Opt("c", "MessageNumber", f"Number of message to be consumed (default {DEFAULT_MESSAGE_NUMBER})",
            type=positive_int, default=DEFAULT_MESSAGE_NUMBER, dest="messageNumber"),
    ], consume_message),
]
