"""POP consumption: the engine the remoting POP codes and the gRPC endpoint call.

The rules are broker/core/pop.py's (leases, handles, FIFO) and the record format
broker/core/pop_log.py's; this shell reads the store, writes the revive log, commits
offsets, parks long polls in the held-pull table and runs the revive timer.

Python API (all on the broker's event loop; errors are `PopError` with a RocketMQ
response code `.code` and a `.remark`; `InvalidReceiptHandle` is a PopError):

    svc = broker.pop_service
    result = await svc.pop(group, topic, queue_id=-1, max_nums=32, invisible_ms=60_000,
                           attempt_id=None, expression="*", expression_type="TAG",
                           poll_ms=0, fifo=None, auto_renew=False, owner=None)
        -> PopResult(messages=[PoppedMessage(message, receipt_handle, delivery_attempt,
                                             raw, topic, queue_id, offset)], pop_time,
                     invisible_ms, revive_qid, rest_num, start_offsets, order_counts)
    await svc.ack(group, topic, receipt_handle)
    new_handle = await svc.change_invisible(group, topic, receipt_handle, invisible_ms)
    await svc.forward_to_dlq(group, topic, receipt_handle)
    svc.release_owner(owner)        # an auto-renew owner went away: its leases end in 1 s

* `queue_id=-1` pops every readable queue of the topic (from a rotating start) and the
  group's retry topic `%RETRY%<group>_<topic>` (first with popFromRetryProbability %).
* `message` is a `MessageExt` as a consumer sees it (a retried message shows its first
  topic; `real_topic` is the topic it was read from); `delivery_attempt` is
  reconsume_times + 1 (FIFO: the lease's attempt); `raw` is the stored record.
* `invisible_ms`: 1 ms .. 12 h here; the gRPC endpoint applies RocketMQ's 10 s minimum
  itself (core/pop.py `invisible_error(ms, GRPC_MIN_INVISIBLE_MS)`).
* `poll_ms` > 0 waits up to that long (at most 60 s) for a message, woken by the
  dispatcher (and by an ack that unblocks a FIFO queue); an empty result is not an error.
* `fifo=None` takes the group's consumeMessageOrderly; `attempt_id` lets a retried FIFO
  pop get its batch back.
* `auto_renew=True` with an `owner` (the gRPC client id): the broker renews the lease
  every `invisible_ms` until the message is acked, its invisibility changed, the owner
  released (its leases then end RELEASE_INVISIBLE_MS later, as Java's proxy clears a gone
  client's handles), or 12 h passed. Renewals are not logged: after a crash such messages
  come back at their first lease's end.
* Handles are signed with this broker's secret (`config/popSecret`, 32 random bytes made
  at first start); ack / change / forward refuse an unsigned handle (`signed=False` is the
  4.x wire's: its clients build the extraInfo themselves; the live lease is still checked).

Crash safety: every pop writes a checkpoint record before it is answered, every ack /
change / revive a record (pop_log.py) before it takes effect; `recover()` replays the
revive log from its checkpoint (the consumer offset of CID_RMQ_SYS_REVIVE_GROUP, kept in
consumerOffset.json with the offsets it agrees with) at start. With SYNC_FLUSH an ack is
answered once its record is flushed; with ASYNC_FLUSH an ack lost in a crash means one
more delivery.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
from typing import Callable, NamedTuple

from pocketmq.broker.core import pop_log, sql92
from pocketmq.broker.core.held_pulls import HeldPull, HoldResult
from pocketmq.broker.core.pop import (INIT_MAX, INIT_MIN, MAX_ATTEMPT_ID, MAX_INVISIBLE_MS, MAX_POP_NUMS,
                                      NORMAL_TOPIC, RETRY_TOPIC, FifoStep, InvalidReceiptHandle, Lease, PopError,
                                      PopState, ReceiptHandle, decode_handle, encode_handle, fifo_step,
                                      invisible_error, signature_ok)
from pocketmq.broker.store.api import GetMessageStatus, MessageToStore
from pocketmq.common.constants import (NAME_TOPIC, POP_ORDER_REVIVE_QUEUE, REVIVE_GROUP, RETRY_GROUP_TOPIC_PREFIX,
                                       name_error, pop_retry_topic, revive_topic)
from pocketmq.common.files import read_file, write_file_atomic
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import build_subscription
from pocketmq.protocol.codes import PermName, ResponseCode
from pocketmq.protocol.errors import BodyError
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.broker.pop")

POLL_MS_MAX = 60_000
REVIVE_SLICE = 256               # leases handled per timer turn before yielding
REVIVE_RETRY_MS = 1000           # a revive the store refused is tried again this much later
RELEASE_INVISIBLE_MS = 1000      # a gone auto-renew owner's leases end this soon (release_owner)
TIMER_CAP_S = 60.0               # the timer re-reads the wall clock at least this often
_MOVED = frozenset({GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY,
                    GetMessageStatus.OFFSET_FOUND_NULL})


class PoppedMessage(NamedTuple):
    message: msgcodec.MessageExt
    receipt_handle: str
    delivery_attempt: int
    raw: bytes
    topic: str                   # the topic it was read from (maybe the retry topic)
    queue_id: int
    offset: int


class PopResult(NamedTuple):
    messages: list[PoppedMessage]
    pop_time: int
    invisible_ms: int
    revive_qid: int
    rest_num: int
    start_offsets: list[tuple[str, int, int]]     # (topicType, queue id, first offset)
    order_counts: list[tuple[str, int, int, int]]  # FIFO: (topicType, queue id, offset, reconsume count)


class _WaitHeader(NamedTuple):
    """What the held-pull table indexes a waiting pop by: every pop of `topic` waits
    under queue -1, woken by any queue of the topic and of its retry topics."""
    topic: str
    queue_id: int = -1


class PopWaiter:
    """A long-polling pop parked in the held-pull table (as its `conn`)."""
    __slots__ = ("future", "closed")

    def __init__(self):
        self.future = asyncio.get_running_loop().create_future()
        self.closed = False

    def wake(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


def replay_held(pull_replay: Callable, held: HeldPull) -> None:
    """The hold service's replay: a parked pop is woken (it pops again), a pull replayed."""
    if isinstance(held.conn, PopWaiter):
        held.conn.wake()
    else:
        pull_replay(held)


def load_secret(path: str) -> bytes:
    """The broker's handle secret: read, or made (32 random bytes, written atomically)."""
    data = read_file(path)
    if data is not None and len(data) >= 16:
        return data
    data = os.urandom(32)
    write_file_atomic(path, data)
    return data


def _records(buffers):
    """(MessageExt, raw record bytes) of a get_message result's buffers."""
    for buf in buffers:
        pos, n = 0, len(buf)
        while pos < n:
            try:
                m = msgcodec.decode_record(buf, pos)
            except ValueError as e:
                log.error("pop: an undecodable record in a consume queue's range skipped: %s", e)
                return
            yield m, bytes(buf[pos:pos + m.store_size])
            pos += m.store_size


class PopService:
    def __init__(self, ctx, *, secret: bytes, store_back: Callable, rng: Callable[[], float] = random.random):
        self.ctx = ctx
        cfg = ctx.config
        self.secret = secret
        self.store_back = store_back         # send_back.store_back bound to ctx
        self.rng = rng
        self.broker_name = cfg.brokerName
        self.revive_topic = revive_topic(cfg.brokerClusterName)
        self.state = PopState(cfg.maxPopInflightMessages, cfg.maxPopInflightMessagesPerGroup)
        self.retry_probability = cfg.popFromRetryProbability
        self.hold_dispatch: Callable | None = None   # HoldService.on_dispatch, set by the broker
        self._retry_of: dict[str, str] = {}          # pop retry topic -> its topic (wake-ups)
        self._waiting_topics: dict[str, int] = {}    # topic -> pops parked on it
        self._owners: set[str] = set()               # auto-renew owners alive
        self._last_pop_time = 0
        self._last_end = 0                           # commit-log end of the last revive-log record
        self._rr = itertools.count()
        self._event: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._timer_at: int | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def recover(self) -> int:
        """Rebuild the leases from the revive log (before serving). Returns records read."""
        ctx = self.ctx
        ctx.topics.create_retry_or_dlq(self.revive_topic, 1, PermName.READ | PermName.WRITE, ctx.now_ms())
        start = max(ctx.offsets.query(REVIVE_GROUP, self.revive_topic, 0), ctx.store.get_min_offset_in_queue(
            self.revive_topic, 0))
        pos, n = start, 0
        while True:
            r = ctx.store.get_message(self.revive_topic, 0, pos, 256, None, None)
            if r.status in _MOVED and r.next_begin_offset != pos:
                pos = r.next_begin_offset
                continue
            if r.status is not GetMessageStatus.FOUND or not r.message_count:
                break
            for m, _ in _records(r.buffers):
                try:
                    rec = pop_log.decode(m.body)
                except ValueError as e:
                    log.error("revive log record at %d skipped: %s", m.queue_offset, e)
                    continue
                self.state.apply(rec, m.queue_offset)
                # pop times stay increasing across a restart whatever the wall clock did
                self._last_pop_time = max(self._last_pop_time, rec.pop_time, rec.new_pop_time)
                if rec.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                    self._learn_retry(rec.group, rec.topic)
                n += 1
            pos = r.next_begin_offset
        for key in list(self.state.queues):
            group, topic, qid = key
            committed = ctx.offsets.query(group, topic, qid)
            if committed >= 0:
                self.state.drop_below(key, committed)
            self._commit(key, self.state.queues[key].committed())
        self.save_checkpoint()
        if n:
            log.info("pop: %d revive log records replayed from %d, %d messages in flight", n, start,
                     self.state.count)
        return n

    def _learn_retry(self, group: str, retry_topic: str) -> None:
        prefix = f"{RETRY_GROUP_TOPIC_PREFIX}{group}_"
        if retry_topic.startswith(prefix):
            self._retry_of[retry_topic] = retry_topic[len(prefix):]

    def start(self) -> None:
        self._event = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._revive_loop(), name="pop-revive")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """The revive log's replay start, in the offset table (persisted with the offsets
        it agrees with)."""
        ctx = self.ctx
        ck = self.state.checkpoint()
        if ck is None:
            ck = ctx.store.get_max_offset_in_queue(self.revive_topic, 0)
        known = ctx.offsets.query(REVIVE_GROUP, self.revive_topic, 0)
        # (a broker that never popped keeps no entry: its offset table, what slaves copy
        # and mqadmin lists, stays as it was before POP existed)
        if ck != known and (ck > 0 or known >= 0):
            ctx.offsets.commit(REVIVE_GROUP, self.revive_topic, 0, ck)

    # -- helpers -------------------------------------------------------------------------
    def _pop_time(self) -> int:
        # strictly increasing: a lease id never repeats, so an older handle is always stale
        self._last_pop_time = t = max(self.ctx.now_ms(), self._last_pop_time + 1)
        return t

    def _append(self, kind: str, body: bytes) -> int:
        """Write a revive-log record; its queue offset, or PopError when the store refuses."""
        ctx = self.ctx
        now = ctx.now_ms()
        r = ctx.store.put_message(MessageToStore(
            self.revive_topic, 0, 0, body, msgcodec.encode_properties({msgcodec.TAGS: kind}), 0, now,
            ctx.store_host, now))
        if not r.ok:
            raise PopError(ResponseCode.SYSTEM_ERROR, f"cannot write the revive log: {r.status.name}")
        self._last_end = r.end_offset
        return r.queue_offset

    async def _durable(self) -> None:
        ctx = self.ctx
        if ctx.sync_flush and ctx.flush_service is not None:
            await ctx.flush_service.wait_flushed(self._last_end, ctx.config.syncFlushTimeout / 1000)

    def _commit(self, key, committed: int) -> None:
        group, topic, qid = key
        if committed > self.ctx.offsets.query(group, topic, qid):
            self.ctx.offsets.commit(group, topic, qid, committed)

    def _init_offset(self, group: str, topic: str, qid: int, init_mode: int) -> int:
        """Where a group's first pop of a queue starts (RocketMQ's getInitOffset): the
        committed offset; else the queue's start for a retry topic or INIT_MIN; else the
        last message (maxOffset - 1), or 0 while the queue's start is still in memory."""
        ctx = self.ctx
        committed = ctx.offsets.query(group, topic, qid)
        if committed >= 0:
            return committed
        store = ctx.store
        if init_mode == INIT_MIN or topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            offset = store.get_min_offset_in_queue(topic, qid)
        elif store.get_min_offset_in_queue(topic, qid) <= 0 and store.get_max_offset_in_queue(topic, qid) > 0 \
                and not store.check_in_disk_by_consume_offset(topic, qid, 0):
            offset = 0
        else:
            offset = max(0, store.get_max_offset_in_queue(topic, qid) - 1)
        ctx.offsets.commit(group, topic, qid, offset)
        return offset

    def _subscription(self, topic: str, expression: str | None, expression_type: str | None):
        """(tags filter, record filter, SubscriptionData) for the store; PopError when the
        expression does not parse."""
        try:
            sub = build_subscription(topic, expression or "*", expression_type or "TAG", 0)
        except BodyError as e:
            raise PopError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"parse the consumer's subscription failed: {e}")
        if sub.expression_type == "TAG":
            return (None if sub.is_all else sub.matches_tags_code), None, sub
        if not self.ctx.config.enablePropertyFilter:
            raise PopError(ResponseCode.SYSTEM_ERROR,
                           f"The broker does not support consumer to filter message by {sub.expression_type}")
        try:
            return None, sql92.compiled(sub.sub_string).match_record, sub
        except sql92.ParseError as e:
            raise PopError(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                           f"parse the consumer's subscription[{sub.sub_string}] failed: {e}") from None

    def _group(self, group: str):
        gcfg = self.ctx.groups.find(group, self.ctx.now_ms())
        if gcfg is None:
            raise PopError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist")
        return gcfg

    def _handle(self, group: str, topic: str, ck_offset: int, lease: Lease, retry: str) -> str:
        return encode_handle(self.secret, group, topic, ReceiptHandle(
            ck_offset, lease.pop_time, lease.invisible_ms, POP_ORDER_REVIVE_QUEUE if lease.fifo else 0, retry,
            self.broker_name, lease.key[2], lease.offset, lease.commit_log_offset, ""))

    # -- pop -----------------------------------------------------------------------------
    async def pop(self, group: str, topic: str, queue_id: int = -1, max_nums: int = 32,
                  invisible_ms: int = 60_000, *, attempt_id: str | None = None, expression: str | None = "*",
                  expression_type: str | None = "TAG", poll_ms: int = 0, fifo: bool | None = None,
                  auto_renew: bool = False, owner: str | None = None, init_mode: int = INIT_MAX) -> PopResult:
        ctx = self.ctx
        filters = self._subscription(topic, expression, expression_type)
        deadline = ctx.mono_ms() + max(0, min(poll_ms, POLL_MS_MAX))
        while True:
            result = self.pop_now(group, topic, queue_id, max_nums, invisible_ms, attempt_id=attempt_id,
                                  filters=filters, fifo=fifo, owner=owner if auto_renew else None,
                                  init_mode=init_mode)
            if result.messages or ctx.is_closing() or ctx.mono_ms() >= deadline:
                return result
            await self._wait(topic, filters[2], deadline)

    async def _wait(self, topic: str, sub, deadline: int) -> None:
        waiter = PopWaiter()
        held = HeldPull(waiter, None, _WaitHeader(topic), sub, 0, deadline)
        r = self.ctx.held_pulls.hold(held)
        if r is not HoldResult.HELD:
            raise PopError(ResponseCode.POLLING_FULL, f"[POLLING_FULL]too many pops waiting ({r.value})")
        self._waiting_topics[topic] = self._waiting_topics.get(topic, 0) + 1
        self.ctx.wake_hold()
        try:
            await waiter.future
        finally:
            waiter.closed = True
            left = self._waiting_topics[topic] - 1
            if left:
                self._waiting_topics[topic] = left
            else:
                del self._waiting_topics[topic]

    def on_dispatch(self, topic: str, queue_id: int, max_offset: int, tags_code, store_ts: int) -> None:
        """The dispatcher stored a message: wake the pops waiting on its topic (or, for a
        pop retry topic, on the topic it retries)."""
        if not self._waiting_topics:
            return
        if topic in self._waiting_topics:
            self.hold_dispatch(topic, -1, 1, tags_code, store_ts)
        else:
            origin = self._retry_of.get(topic)
            if origin is not None and origin in self._waiting_topics:
                self.hold_dispatch(origin, -1, 1, None, store_ts)

    def _wake_topic(self, topic: str) -> None:
        if topic in self._waiting_topics:
            self.hold_dispatch(topic, -1, 1, None, 0)

    def pop_now(self, group: str, topic: str, queue_id: int, max_nums: int, invisible_ms: int, *,
                attempt_id: str | None, filters, fifo: bool | None, owner: str | None,
                init_mode: int = INIT_MAX) -> PopResult:
        ctx = self.ctx
        cfg = ctx.config
        if ctx.is_slave:
            raise PopError(ResponseCode.NO_PERMISSION, f"the broker[{cfg.brokerIP1}] is a slave: pop from its master")
        if not PermName.readable(cfg.brokerPermission):
            raise PopError(ResponseCode.NO_PERMISSION, f"the broker[{cfg.brokerIP1}] pop message is forbidden")
        if not 1 <= max_nums <= MAX_POP_NUMS:
            raise PopError(ResponseCode.INVALID_PARAMETER,
                           f"the broker[{cfg.brokerIP1}] pop message's num {max_nums} is not in [1, {MAX_POP_NUMS}]")
        err = invisible_error(invisible_ms)
        if err:
            raise PopError(ResponseCode.INVALID_PARAMETER, err)
        if attempt_id is not None and len(attempt_id) > MAX_ATTEMPT_ID:
            raise PopError(ResponseCode.INVALID_PARAMETER, f"attempt id longer than {MAX_ATTEMPT_ID}")
        tc = ctx.topics.get(topic)
        if tc is None:
            raise PopError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not PermName.readable(tc.perm):
            raise PopError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] peeking message is forbidden")
        if queue_id >= tc.read_queue_nums or queue_id < -1:
            raise PopError(ResponseCode.INVALID_PARAMETER, f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                           f"topicConfig.readQueueNums:[{tc.read_queue_nums}]")
        gcfg = self._group(group)
        if not gcfg.consumeEnable:
            raise PopError(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        if fifo is None:
            fifo = gcfg.consumeMessageOrderly
        rtopic = pop_retry_topic(group, topic)
        if name_error(NAME_TOPIC, "topic", rtopic):
            raise PopError(ResponseCode.INVALID_PARAMETER,
                           f"group and topic too long together for the pop retry topic {rtopic!r}")
        room = min(max_nums, self.state.room(group))
        if room <= 0:
            raise PopError(ResponseCode.SYSTEM_BUSY, f"[POP_FULL]too many messages in flight for group {group} "
                           f"(maxPopInflightMessagesPerGroup {self.state.inflight_per_group_max}, "
                           f"maxPopInflightMessages {self.state.inflight_max}): ack some first")
        if queue_id >= 0:
            qids = [queue_id]
        else:
            n = tc.read_queue_nums
            first = next(self._rr) % max(1, n)
            qids = [(first + i) % n for i in range(n)]
        sources = [(topic, q, NORMAL_TOPIC) for q in qids]
        if not fifo:
            rtc = ctx.topics.get(rtopic)
            if rtc is not None:
                retries = [(rtopic, q, RETRY_TOPIC) for q in range(rtc.read_queue_nums)]
                sources = retries + sources if self.rng() * 100 < self.retry_probability else sources + retries
        tag_filter, record_filter, _ = filters
        pop_time = self._pop_time()
        renew_until = pop_time + MAX_INVISIBLE_MS if owner else 0
        if owner:
            self._owners.add(owner)
        out: list[PoppedMessage] = []
        starts: list[tuple[str, int, int]] = []
        orders: list[tuple[str, int, int, int]] = []
        rest = 0
        for t, q, kind in sources:
            if len(out) >= room:
                break
            key = (group, t, q)
            st = self.state.queue(key)
            if st is None:
                st = self.state.open_queue(key, self._init_offset(group, t, q, init_mode))
            if fifo:
                step = fifo_step(st, attempt_id, ctx.now_ms())
                if step is FifoStep.BLOCKED:
                    continue
                if step is not FifoStep.FREE:
                    got = self._relet(key, st, step, gcfg, topic, pop_time, invisible_ms, attempt_id, owner,
                                      renew_until)
                    if got:
                        starts.append((kind, q, got[0].offset))
                        orders.extend((kind, q, p.offset, p.delivery_attempt - 1) for p in got)
                        out.extend(got)
                    continue
            try:
                got = self._take(key, st, room - len(out), tag_filter, record_filter, gcfg, topic, kind,
                                 pop_time, invisible_ms, fifo, attempt_id, owner, renew_until)
            except PopError:
                if out:
                    break          # what was leased is answered; the rest stays for the next pop
                raise
            if got:
                starts.append((kind, q, got[0].offset))
                if fifo:
                    orders.extend((kind, q, p.offset, 0) for p in got)
                out.extend(got)
            rest += max(0, ctx.store.get_max_offset_in_queue(t, q) - st.pop_offset)
        if out:
            ctx.stats.count_get(topic, group, len(out), sum(len(p.raw) for p in out))
        return PopResult(out, pop_time, invisible_ms, POP_ORDER_REVIVE_QUEUE if fifo else 0, rest, starts, orders)

    def _take(self, key, st, n, tag_filter, record_filter, gcfg, topic, kind, pop_time, invisible_ms, fifo,
              attempt_id, owner, renew_until) -> list[PoppedMessage]:
        """Lease up to n new messages of one queue from its pop position."""
        ctx = self.ctx
        group, t, q = key
        r = ctx.store.get_message(t, q, st.pop_offset, n, tag_filter, record_filter)
        if r.status in _MOVED:
            log.warning("pop position of %s moved %d -> %d (%s)", key, st.pop_offset, r.next_begin_offset,
                        r.status.name)
            st.pop_offset = r.next_begin_offset
            self._commit(key, st.committed())
            r = ctx.store.get_message(t, q, st.pop_offset, n, tag_filter, record_filter)
        if r.status is GetMessageStatus.NO_MATCHED_MESSAGE:
            st.pop_offset = max(st.pop_offset, r.next_begin_offset)
            self._commit(key, st.committed())
            return []
        if r.status is not GetMessageStatus.FOUND:
            return []
        recs = list(_records(r.buffers))
        if not recs:
            return []
        items = [(m.queue_offset, m.commit_log_offset, 1 if fifo else m.reconsume_times + 1) for m, _ in recs]
        body = pop_log.encode_ck(group, t, q, pop_time, invisible_ms, *zip(*items), fifo, attempt_id)
        ck_pos = self._append(pop_log.CK, body)
        leases = self.state.lease(key, items, pop_time, invisible_ms, fifo=fifo, ck_pos=ck_pos,
                                  ck_offset=items[0][0], attempt_id=attempt_id, owner=owner,
                                  renew_until=renew_until, next_offset=r.next_begin_offset)
        self._commit(key, st.committed())
        if kind == RETRY_TOPIC:
            self._learn_retry(group, t)
        self._wake_timer(leases[0].visible_at)
        bn = self.broker_name
        return [PoppedMessage(msgcodec.MessageExt.from_record(m, bn), self._handle(group, topic, items[0][0], lease,
                                                                                  kind),
                              lease.attempt, raw, t, q, m.queue_offset)
                for (m, raw), lease in zip(recs, leases)]

    def _relet(self, key, st, step, gcfg, topic, pop_time, invisible_ms, attempt_id, owner,
               renew_until) -> list[PoppedMessage]:
        """FIFO: the leased batch again (REGET: same attempts; REDELIVER: attempt + 1; a
        message past the group's attempts goes to the DLQ instead)."""
        ctx = self.ctx
        group, t, q = key
        bump = 1 if step is FifoStep.REDELIVER else 0
        max_attempts = gcfg.retryMaxTimes + 1
        items, recs = [], []
        for lease in list(st.leases.values()):
            raw = ctx.store.look_message_by_offset(lease.commit_log_offset)
            if raw is None:
                log.error("pop: %s offset %d is gone from the commit log; dropped", key, lease.offset)
                self._end(lease, pop_log.REVIVED)
                continue
            m = msgcodec.decode_record(bytes(raw))
            attempt = lease.attempt + bump
            if attempt > max_attempts:
                self._dead_letter(lease, m, gcfg, topic)
                continue
            items.append((lease.offset, lease.commit_log_offset, attempt))
            recs.append((m, bytes(raw)))
        if not items:
            return []
        body = pop_log.encode_ck(group, t, q, pop_time, invisible_ms, *zip(*items), True, attempt_id)
        ck_pos = self._append(pop_log.CK, body)
        leases = self.state.lease(key, items, pop_time, invisible_ms, fifo=True, ck_pos=ck_pos,
                                  ck_offset=items[0][0], attempt_id=attempt_id, owner=owner, renew_until=renew_until)
        self._wake_timer(leases[0].visible_at)
        bn = self.broker_name
        return [PoppedMessage(msgcodec.MessageExt.from_record(m, bn),
                              self._handle(group, topic, items[0][0], lease, NORMAL_TOPIC), lease.attempt, raw, t, q,
                              m.queue_offset)
                for (m, raw), lease in zip(recs, leases)]

    # -- ending and changing leases ------------------------------------------------------
    def _end(self, lease: Lease, kind: str) -> None:
        """Log the lease's end (ack / revived), then resolve it: commit the acked prefix,
        wake pops waiting on an unblocked FIFO queue."""
        group, t, q = lease.key
        self._append(kind, pop_log.encode_one(kind, group, t, q, lease.offset, lease.pop_time))
        _, committed = self.state.resolve(lease)
        self._commit(lease.key, committed)
        self.save_checkpoint()
        if lease.fifo and not self.state.queues[lease.key].leases:
            self._wake_topic(self._retry_of.get(t, t))

    def _lease_of(self, group: str, topic: str, handle: str, signed: bool, offset: int | None = None,
                  queue_id: int | None = None) -> tuple[Lease, ReceiptHandle]:
        try:
            h = decode_handle(handle)
        except ValueError as e:
            raise InvalidReceiptHandle(str(e)) from None
        retry_prefix = f"{RETRY_GROUP_TOPIC_PREFIX}{group}_"
        if h.topic_type == RETRY_TOPIC and topic.startswith(retry_prefix):
            # a Java 5 client names the topic it read from (ExtraInfoUtil.getRealTopic): the
            # handle's topic is the one it retries
            topic = topic[len(retry_prefix):]
        if h.offset < 0:
            if offset is None:
                raise InvalidReceiptHandle("no queue offset")
            h = h._replace(offset=offset)
        elif offset is not None and offset != h.offset:
            raise InvalidReceiptHandle(f"offset {offset} is not the handle's {h.offset}")
        if queue_id is not None and queue_id != h.queue_id:
            raise InvalidReceiptHandle(f"queue {queue_id} is not the handle's {h.queue_id}")
        if (signed or h.signature) and not signature_ok(self.secret, group, topic, h):
            raise InvalidReceiptHandle("signature does not verify (forged, or for another group or topic)")
        if h.broker_name != self.broker_name:
            raise InvalidReceiptHandle(f"handle of broker {h.broker_name!r}, this is {self.broker_name!r}")
        lease = self.state.find((group, h.real_topic(group, topic), h.queue_id), h.offset, h.pop_time)
        if lease is None:
            raise InvalidReceiptHandle("no such lease (acked, changed, redelivered or never made)")
        return lease, h

    async def ack(self, group: str, topic: str, handle: str, *, signed: bool = True, offset: int | None = None,
                  queue_id: int | None = None) -> None:
        lease, _ = self._lease_of(group, topic, handle, signed, offset, queue_id)
        self._end(lease, pop_log.ACK)
        await self._durable()

    async def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int, *,
                               signed: bool = True, offset: int | None = None,
                               queue_id: int | None = None) -> tuple[str, Lease]:
        """A new lease of the message, visible again `invisible_ms` from now: (its signed
        handle, the lease). The old handle is stale from now on."""
        err = invisible_error(invisible_ms)
        if err:
            raise PopError(ResponseCode.INVALID_PARAMETER, err)
        lease, h = self._lease_of(group, topic, handle, signed, offset, queue_id)
        group_, t, q = lease.key
        pop_time = self._pop_time()
        self._append(pop_log.CHANGE, pop_log.encode_one(pop_log.CHANGE, group, t, q, lease.offset, lease.pop_time,
                                                        pop_time, invisible_ms))
        new = self.state.change(lease, pop_time, invisible_ms)
        self._wake_timer(new.visible_at)
        await self._durable()
        return self._handle(group, topic, h.ck_offset, new, h.topic_type), new

    async def forward_to_dlq(self, group: str, topic: str, handle: str, *, signed: bool = True) -> None:
        """The message goes to %DLQ%<group> now and its lease ends (gRPC's
        ForwardMessageToDeadLetterQueue: a FIFO client out of local retries)."""
        lease, _ = self._lease_of(group, topic, handle, signed)
        raw = self.ctx.store.look_message_by_offset(lease.commit_log_offset)
        if raw is None:
            raise PopError(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {lease.commit_log_offset}")
        self._dead_letter(lease, msgcodec.decode_record(bytes(raw), decompress=False), self._group(group), topic)
        await self._durable()

    def _dead_letter(self, lease: Lease, m, gcfg, topic: str) -> None:
        self._give_back(lease, m, gcfg, topic, dlq=True)

    def _give_back(self, lease: Lease, m, gcfg, topic: str | None, dlq: bool) -> None:
        """Copy the message to the pop retry topic (RECONSUME_TIME + 1; the DLQ past the
        group's retryMaxTimes, or `dlq`) and end its lease."""
        ctx = self.ctx
        group = lease.key[0]
        origin = topic or m.properties.get(msgcodec.RETRY_TOPIC) or self._retry_of.get(m.topic) or m.topic
        rtopic = pop_retry_topic(group, origin)
        now = ctx.now_ms()
        queues = max(1, gcfg.retryQueueNums)
        if not dlq and ctx.topics.get(rtopic) is None:
            ctx.topics.create_retry_or_dlq(rtopic, queues, PermName.READ | PermName.WRITE, now)
            ctx.on_topics_changed()
        self._retry_of[rtopic] = origin
        code, remark = self.store_back(group, m, rtopic, queues, 0, dlq=dlq or m.reconsume_times >= gcfg.retryMaxTimes,
                                       origin_topic=origin, origin_id=m.msg_id, now=now)
        if code != ResponseCode.SUCCESS:
            raise PopError(code, remark or "cannot store the message back")
        self._end(lease, pop_log.REVIVED)

    def keep_owner(self, owner: str) -> None:
        """The owner is alive (a consumer's Telemetry stream (re)opened): its leases are
        renewed again, also those release_owner brought forward, if they are not due yet."""
        self._owners.add(owner)

    def release_owner(self, owner: str) -> None:
        """The owner (a gRPC client) went away: its auto-renewed leases are renewed no more
        and come back RELEASE_INVISIBLE_MS from now (Java's proxy: clearGroup with
        invisibleTimeMillisWhenClear, 1 s), not at the end of their 60 s lease: a FIFO
        queue whose batch the gone client held is blocked until then. An owner back within
        that time (a Telemetry stream replaced, a new receive) keeps them: the revive
        timer renews the leases of live owners."""
        self._owners.discard(owner)
        at = self.ctx.now_ms() + RELEASE_INVISIBLE_MS
        moved = 0
        for lease in self.state.owned_by(owner):
            if lease.visible_at > at:
                self.state.reschedule(lease, at)
                moved += 1
        if moved:
            log.info("pop: %d message(s) leased to %s visible again in %d ms (the client went away)", moved, owner,
                     RELEASE_INVISIBLE_MS)
            self._wake_timer(at)

    # -- the revive timer ----------------------------------------------------------------
    def _wake_timer(self, visible_at: int) -> None:
        if self._event is not None and (self._timer_at is None or visible_at < self._timer_at):
            self._event.set()

    async def _revive_loop(self) -> None:
        ctx = self.ctx
        while True:
            nd = self.state.next_due()
            self._timer_at = nd
            wait_s = TIMER_CAP_S if nd is None else min(TIMER_CAP_S, max(0, nd - ctx.now_ms()) / 1000)
            self._event.clear()
            if wait_s > 0:
                try:
                    async with asyncio.timeout(wait_s):
                        await self._event.wait()
                except TimeoutError:
                    pass
            try:
                self.revive_due(ctx.now_ms())
            except Exception:
                log.exception("pop revive pass failed")
            await asyncio.sleep(0)

    def revive_due(self, now: int) -> int:
        """Handle at most REVIVE_SLICE leases whose time ran out: renew (auto-renew, owner
        alive), make FIFO batches poppable again, give the others back. Returns how many."""
        due = self.state.due(now, REVIVE_SLICE)
        for lease in due:
            try:
                if lease.owner is not None and lease.owner in self._owners and now < lease.renew_until:
                    self.state.reschedule(lease, now + lease.invisible_ms)
                elif lease.fifo:
                    self._wake_topic(self._retry_of.get(lease.key[1], lease.key[1]))
                else:
                    self._revive(lease)
            except PopError as e:
                log.warning("pop revive of %s offset %d failed, retried in %d ms: %s", lease.key, lease.offset,
                            REVIVE_RETRY_MS, e)
                self.state.reschedule(lease, now + REVIVE_RETRY_MS)
        return len(due)

    def _revive(self, lease: Lease) -> None:
        ctx = self.ctx
        raw = ctx.store.look_message_by_offset(lease.commit_log_offset)
        if raw is None:
            log.error("pop: %s offset %d is gone from the commit log; not redelivered", lease.key, lease.offset)
            self._end(lease, pop_log.REVIVED)
            return
        gcfg = ctx.groups.find(lease.key[0], ctx.now_ms())
        if gcfg is None:    # the group was deleted: nobody to redeliver to
            self._end(lease, pop_log.REVIVED)
            return
        m = msgcodec.decode_record(bytes(raw), decompress=False)
        t = lease.key[1]
        self._give_back(lease, m, gcfg, None if t.startswith(RETRY_GROUP_TOPIC_PREFIX) else t, dlq=False)
