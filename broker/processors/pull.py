"""PULL_MESSAGE (11) with long polling.

Order of checks and response codes follow reference 7.2-7.4. The body of a
FOUND response is the list of segment slices the store returns, written to
the socket as they are (no per-message Python work). A pull that finds
nothing and carries FLAG_SUSPEND is parked in the held-pull table and
replayed (with suspension disabled, same opaque) when the reput dispatcher
stores a matching message or its suspend time runs out.

Master/slave (the seeds' PullMessageProcessor steps 7 and 9): every answer suggests the
broker id of the group member the next pull should go to (`_suggest`: with
slaveReadEnable, whichBrokerWhenConsumeSlowly of the group when the pulled messages lie
further behind the log's end than the in-memory limit, else the group's brokerId; 0
without it), and a slave never stores the commit offset a pull carries. A slave's held
pulls are woken by the dispatch of the replicated records, like a master's. A pull past a
slave's end (a consumer that read from the master what the slave has not copied) keeps its
offset and waits for the copy, unless offsetCheckInSlave: a slave behind its master never
moves a consumer back (Java's nextOffsetCorrection; without it the consumer would read the
whole queue again).
"""
from __future__ import annotations

from pocketmq.broker.core import sql92
from pocketmq.broker.core.held_pulls import HeldPull, HoldResult
from pocketmq.broker.core.replication import suggest_broker_id
from pocketmq.broker.core.status import pull_status_response
from pocketmq.broker.store.api import GetMessageStatus
from pocketmq.protocol.bodies import build_subscription
from pocketmq.protocol.codes import PermName, PullSysFlag, ResponseCode
from pocketmq.protocol.errors import BodyError
from pocketmq.protocol.headers.typed import decode_pull_header

SUSPEND_MS_MAX = 60_000
_NOT_HERE_YET = frozenset({GetMessageStatus.OFFSET_OVERFLOW_BADLY, GetMessageStatus.NO_MESSAGE_IN_QUEUE})


def _offsets_ext(next_begin: int, min_offset: int, max_offset: int, suggest: str = "0") -> dict:
    return {"suggestWhichBrokerId": suggest, "nextBeginOffset": str(next_begin),
            "minOffset": str(min_offset), "maxOffset": str(max_offset)}


def _suggest(ctx, gcfg, h, r) -> str:
    """suggestWhichBrokerId of a pull answer (Java's PullMessageProcessor): only with
    slaveReadEnable does it name anything but the master."""
    cfg = ctx.config
    if not cfg.slaveReadEnable:
        return "0"
    # the last message this pull returns (Java: maxPhyOffsetPulling) lies past the memory
    # limit behind the log's end: the consumer reads from disk
    slow = (r.message_count > 0
            and ctx.store.check_in_disk_by_consume_offset(h.topic, h.queue_id, r.next_begin_offset - 1))
    return str(suggest_broker_id(slow, True, gcfg.whichBrokerWhenConsumeSlowly, gcfg.brokerId))


def _fail(cmd, code, remark):
    # Java clients unbox the four offsets for every PULL response: always send them.
    return cmd.response(code, remark, ext_fields=_offsets_ext(0, 0, 0))


def process_pull(ctx, conn, cmd):
    return pull(ctx, conn, cmd, decode_pull_header(cmd.ext_fields), allow_suspend=True)


# Subscriptions carried by pull headers (lite pull consumers, and push consumers of the
# C++ client, send theirs on every pull), built once per (topic, expression, type, version):
# parsing the tags and hashing them was ~4 µs of every such pull. The SubscriptionData kept
# here are shared by the pulls that use them and never changed after build_subscription
# (resolve_subscription's callers only read them). Bounded: cleared when full.
PULL_SUBS_MAX = 1024
_pull_subs: dict = {}


def resolve_subscription(ctx, h):
    """Returns (SubscriptionData, None) or (None, (code, remark))."""
    if h.sys_flag & PullSysFlag.SUBSCRIPTION:
        if h.expression_type and h.expression_type != "TAG" and not h.subscription:
            # Java's FilterAPI.build refuses an empty expression before anything else
            return None, (ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                          f"parse the consumer's subscription failed: Expression can't be null! {h.expression_type}")
        key = (h.topic, h.subscription, h.expression_type, h.sub_version)
        sub = _pull_subs.get(key)
        if sub is None:
            try:
                sub = build_subscription(h.topic, h.subscription, h.expression_type, h.sub_version)
            except BodyError as e:
                return None, (ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription failed: {e}")
            if len(_pull_subs) >= PULL_SUBS_MAX:
                _pull_subs.clear()
            _pull_subs[key] = sub
    else:
        group = ctx.consumers.get(h.consumer_group)
        if group is None:
            return None, (ResponseCode.SUBSCRIPTION_NOT_EXIST,
                          f"the consumer's group info not exist {h.consumer_group}")
        if group.message_model == "BROADCASTING":
            gcfg = ctx.groups.find(h.consumer_group)
            if gcfg is not None and not gcfg.consumeBroadcastEnable:
                return None, (ResponseCode.NO_PERMISSION,
                              f"the consumer group[{h.consumer_group}] can not consume by broadcast way")
        sub = group.subscriptions.get(h.topic)
        if sub is None:
            return None, (ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist")
        if sub.sub_version < h.sub_version:
            return None, (ResponseCode.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription not latest")
    if sub.expression_type != "TAG":
        if not ctx.config.enablePropertyFilter:
            return None, (ResponseCode.SYSTEM_ERROR,
                          f"The broker does not support consumer to filter message by {sub.expression_type}")
        err = sql92_error(sub.sub_string)
        if err is not None:
            return None, (ResponseCode.SUBSCRIPTION_PARSE_FAILED, err)
    return sub, None


def sql92_error(expression: str) -> str | None:
    """None when `expression` compiles (it is then cached), else the remark naming the
    error and its column, for SUBSCRIPTION_PARSE_FAILED."""
    try:
        sql92.compiled(expression)
    except sql92.ParseError as e:
        return f"parse the consumer's subscription[{expression}] failed: {e}"
    return None


def _filters(sub):
    """(tags-code filter, record filter) of a resolved subscription for the store."""
    if sub.expression_type == "TAG":
        return (None if sub.is_all else sub.matches_tags_code), None
    return None, sql92.compiled(sub.sub_string).match_record


def pull(ctx, conn, cmd, h, allow_suspend: bool, sub=None):
    cfg = ctx.config
    if not PermName.readable(cfg.brokerPermission):
        return _fail(cmd, ResponseCode.NO_PERMISSION, f"the broker[{cfg.brokerIP1}] pulling message is forbidden")
    now = ctx.now_ms()
    gcfg = ctx.groups.find(h.consumer_group, now)
    if gcfg is None:
        return _fail(cmd, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                     f"subscription group [{h.consumer_group}] does not exist")
    if not gcfg.consumeEnable:
        return _fail(cmd, ResponseCode.NO_PERMISSION, f"subscription group no permission, {h.consumer_group}")
    tc = ctx.topics.get(h.topic)
    if tc is None:
        return _fail(cmd, ResponseCode.TOPIC_NOT_EXIST, f"topic[{h.topic}] not exist, apply first please!")
    if not PermName.readable(tc.perm):
        return _fail(cmd, ResponseCode.NO_PERMISSION, f"the topic[{h.topic}] pulling message is forbidden")
    if h.queue_id < 0 or h.queue_id >= tc.read_queue_nums:
        return _fail(cmd, ResponseCode.SYSTEM_ERROR,
                     f"queueId[{h.queue_id}] is illegal, topic:[{h.topic}] topicConfig.readQueueNums:"
                     f"[{tc.read_queue_nums}] consumer:[{conn.remote_addr}]")
    if sub is None:
        sub, err = resolve_subscription(ctx, h)
        if err is not None:
            return _fail(cmd, *err)
    max_nums = max(1, min(h.max_msg_nums, ctx.pull_max_msg_nums))
    tag_filter, record_filter = _filters(sub)
    r = ctx.store.get_message(h.topic, h.queue_id, h.queue_offset, max_nums, tag_filter, record_filter)
    if ctx.is_slave and r.status in _NOT_HERE_YET and not cfg.offsetCheckInSlave and h.queue_offset > r.max_offset:
        # A consumer ahead of this slave (the master stored and served what has not been
        # copied here yet, or never will be): the offset is the consumer's to keep, not ours
        # to move (Java's nextOffsetCorrection on a slave). Answered like a caught-up pull:
        # held, and woken when the copy reaches it.
        r = r._replace(status=GetMessageStatus.OFFSET_OVERFLOW_ONE, next_begin_offset=h.queue_offset)
    code, status = pull_status_response(r.status, h.queue_offset)
    if allow_suspend and h.sys_flag & PullSysFlag.COMMIT_OFFSET and not ctx.is_slave:
        ctx.offsets.commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
    ext = _offsets_ext(r.next_begin_offset, r.min_offset, r.max_offset, _suggest(ctx, gcfg, h, r))
    if code == ResponseCode.SUCCESS:
        ctx.stats.count_get(h.topic, h.consumer_group, r.message_count, r.buffer_total_size)
        return cmd.response(code, status, ext_fields=ext, body=r.buffers)
    ctx.stats.count_miss()
    if (code == ResponseCode.PULL_NOT_FOUND and allow_suspend and h.sys_flag & PullSysFlag.SUSPEND
            and not ctx.is_closing()):
        timeout = h.suspend_timeout_millis if cfg.longPollingEnable else cfg.shortPollingTimeMills
        # Clients wait 30 s for a pull held up to 15-20 s; a longer hold only pins memory.
        timeout = min(max(0, timeout), SUSPEND_MS_MAX)
        held = HeldPull(conn, cmd, h, sub, h.queue_offset, ctx.mono_ms() + timeout)
        result = ctx.held_pulls.hold(held)
        if result is HoldResult.HELD:
            ctx.wake_hold()
            return None
        # Java never refuses to hold. SYSTEM_BUSY, not PULL_NOT_FOUND: Java and C++ clients
        # re-pull at once after PULL_NOT_FOUND (a busy loop), after an error in 3 s.
        if result is HoldResult.CONNECTION_FULL:
            remark = (f"[HOLD_FULL]too many held pulls on this connection "
                      f"({ctx.held_pulls.per_connection_max}), start flow control for a while")
        else:
            remark = "[HOLD_FULL]too many held pulls, start flow control for a while"
        return cmd.response(ResponseCode.SYSTEM_BUSY, remark, ext_fields=ext)
    return cmd.response(code, status, ext_fields=ext)


def replay(ctx, held: HeldPull) -> None:
    """Answer a held pull now (woken or expired), with suspension disabled."""
    conn = held.conn
    if conn.closed:
        return
    try:
        resp = pull(ctx, conn, held.request, held.header, allow_suspend=False, sub=held.subscription)
    except Exception as e:  # never let one bad replay stop the hold service
        resp = held.request.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}",
                                     ext_fields=_offsets_ext(0, 0, 0))
    if resp is not None:
        conn.send(resp)
