"""ProcessQueue: the client-side snapshot of one assigned queue (pure, no asyncio).

Pulled messages wait here, keyed by queue offset in a SortedDict, until the
listener has finished with them. The commit point of the queue is derived
from what is still in flight:

* the smallest offset still in the tree (that message is not done yet, so the
  broker must hand it out again if we die), or
* when the tree is empty (everything pulled is done): the offset the next
  pull starts from (`pull_offset`, set by the pull loop; it also covers
  messages the tag filter skipped), or `queue_offset_max + 1` if unknown.

Flow control (Java DefaultMQPushConsumer defaults) is a pure decision taken
before each pull: more than `pull_threshold_for_queue` cached messages, more
than `pull_threshold_size_for_queue_bytes` cached body bytes, or (concurrent
mode) a span between the smallest and largest cached offsets above
`consume_concurrently_max_span` delays the next pull by 50 ms.

Orderly consumption (Java's ProcessQueue lock fields and ConsumeMessageOrderlyService
rules) keeps its pure parts here too:

* the local lock: `set_locked(now_ms)` after LOCK_BATCH_MQ named the queue; it is
  valid for REBALANCE_LOCK_MAX_LIVE_MS (30 s) after the last renewal, which the
  consumer attempts every REBALANCE_LOCK_INTERVAL_MS (20 s) for every held queue, so
  a client that cannot reach its broker stops consuming before the broker's own lock
  (60 s) lets another client take the queue;
* `take_messages(n)`: the first n cached messages in queue order (they stay cached, so
  the commit point stays at the first of them until they are removed on success);
* `orderly_step(...)`: what the queue's consume task does next (consume, wait for the
  lock, yield after MAX_TIME_CONSUME_CONTINUOUSLY_MS (60 s) of continuous consumption,
  idle, stop);
* `split_exhausted(msgs, max)`: which failed messages go to the dead-letter queue.

Consume timeout (Java's consumeTimeout and ConsumeMessageConcurrentlyService.cleanExpireMsg),
concurrent mode: the worker notes when a listener call starts (`start_consuming`) and ends
(`finish_consuming`); `claim_expired(now_ms, timeout_ms)` hands the shell every message in
flight for longer than the timeout and forgets its start, so the listener's late result
for it is ignored (finish_consuming no longer returns it) while the shell sends it back;
`oldest_in_flight_age_ms(now_ms)` makes a stuck listener visible before flow control stops
the queue.

Times are integer milliseconds passed in by the caller (no clock reads here).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from operator import attrgetter

from sortedcontainers import SortedDict

PULL_THRESHOLD_FOR_QUEUE = 1000
PULL_THRESHOLD_SIZE_FOR_QUEUE_BYTES = 100 * 1024 * 1024
CONSUME_CONCURRENTLY_MAX_SPAN = 2000
FLOW_CONTROL_DELAY_MS = 50

# Orderly consumption (Java 4.9: ProcessQueue.REBALANCE_LOCK_MAX_LIVE_TIME,
# RebalanceImpl lockMQPeriodically, ConsumeMessageOrderlyService.MAX_TIME_CONSUME_CONTINUOUSLY).
REBALANCE_LOCK_MAX_LIVE_MS = 30_000
REBALANCE_LOCK_INTERVAL_MS = 20_000
MAX_TIME_CONSUME_CONTINUOUSLY_MS = 60_000
# A failing orderly message is retried locally this many times before the dead-letter queue
# (Java's orderly default is endless; pocketmq stops a poison message from blocking a queue).
ORDERLY_MAX_RECONSUME_TIMES = 16


class FlowControl(Enum):
    COUNT = "cached message count above pullThresholdForQueue"
    SIZE = "cached message size above pullThresholdSizeForQueue"
    SPAN = "offset span above consumeConcurrentlyMaxSpan"


@dataclass(frozen=True, slots=True)
class FlowLimits:
    pull_threshold_for_queue: int = PULL_THRESHOLD_FOR_QUEUE
    pull_threshold_size_for_queue_bytes: int = PULL_THRESHOLD_SIZE_FOR_QUEUE_BYTES
    consume_concurrently_max_span: int = CONSUME_CONCURRENTLY_MAX_SPAN

    def __post_init__(self):
        if not 1 <= self.pull_threshold_for_queue <= 65535:
            raise ValueError("pull_threshold_for_queue must be in [1, 65535]")
        if not 1 <= self.pull_threshold_size_for_queue_bytes <= 1024 * 1024 * 1024:
            raise ValueError("pull_threshold_size_for_queue_bytes must be in [1, 1 GiB]")
        if not 1 <= self.consume_concurrently_max_span <= 65535:
            raise ValueError("consume_concurrently_max_span must be in [1, 65535]")


_queue_offset = attrgetter("queue_offset")


def _body_len(msg) -> int:
    try:
        return len(msg.body)
    except (AttributeError, TypeError):     # no body (or None): counts 0
        return 0


class ProcessQueue:
    """Messages of one queue between pull and listener completion.

    `msg` objects need `queue_offset` and `body` attributes.
    """

    __slots__ = (
        "consumed_total",
        "consuming",
        "dropped",
        "in_flight",
        "last_consume_ms",
        "last_lock_ms",
        "last_pull_ms",
        "locked",
        "msg_count",
        "msg_size_bytes",
        "msgs",
        "pull_offset",
        "queue_offset_max",
        "room",
    )

    def __init__(self, now_ms: int = 0):
        self.msgs: SortedDict = SortedDict()
        self.msg_count = 0
        self.msg_size_bytes = 0
        self.queue_offset_max = -1       # largest offset ever put
        self.pull_offset = -1            # where the next pull starts (-1: not known)
        self.dropped = False
        self.last_pull_ms = now_ms
        self.last_consume_ms = now_ms
        self.in_flight = 0               # listener calls running for this queue
        self.consumed_total = 0
        self.locked = False              # orderly: the broker named this queue ours
        self.last_lock_ms = 0            # orderly: when it last did
        self.consuming: dict = {}        # queue offset -> when its listener call started (ms)
        # the shell's flow-control waiter (client.fetcher), opaque here: where the consume
        # side removes messages it can tell the pull that room was made
        self.room = None

    # -- pull side ---------------------------------------------------------------------
    def put_messages(self, msgs, now_ms: int = 0) -> int:
        """Add pulled messages (duplicates by offset are ignored). Returns how many were new."""
        tree = self.msgs
        offs = list(map(_queue_offset, msgs))
        if offs and min(offs) > self.queue_offset_max and len(set(offs)) == len(offs):
            # A pull's messages all beyond what was ever cached, none twice (every pull but
            # one after a seek back): no duplicate to look for, and the tree takes them in
            # one update (sortedcontainers sorts in C) instead of one insertion each.
            tree.update(zip(offs, msgs))
            added = len(offs)
            self.msg_size_bytes += sum(map(_body_len, msgs))
            self.queue_offset_max = max(offs)
        else:
            added = 0
            for m in msgs:
                off = m.queue_offset
                if off in tree:
                    continue
                tree[off] = m
                added += 1
                self.msg_size_bytes += _body_len(m)
                self.queue_offset_max = max(self.queue_offset_max, off)
        self.msg_count += added
        self.last_pull_ms = now_ms
        return added

    # -- consume side --------------------------------------------------------------------
    def remove_messages(self, msgs, now_ms: int = 0) -> int:
        """Forget messages the listener is done with; return the new commit point.

        -1 when the tree was already empty (nothing to commit), like Java's
        ProcessQueue.removeMessage.
        """
        tree = self.msgs
        if not tree:
            return -1
        self.last_consume_ms = now_ms
        for m in msgs:
            old = tree.pop(m.queue_offset, None)
            if old is not None:
                self.msg_count -= 1
                self.msg_size_bytes -= _body_len(old)
                self.consumed_total += 1
        return self.commit_offset()

    def remove_one(self, msg, now_ms: int = 0) -> None:
        """remove_messages((msg,), now_ms) without working out the commit point (the push
        consumer's per-message path, which does not use it: commits read commit_offset())."""
        tree = self.msgs
        if not tree:
            return
        self.last_consume_ms = now_ms
        old = tree.pop(msg.queue_offset, None)
        if old is not None:
            self.msg_count -= 1
            self.msg_size_bytes -= _body_len(old)
            self.consumed_total += 1

    def commit_offset(self) -> int:
        """Next offset to consume as far as this queue knows: smallest in-flight
        offset; when nothing is in flight the next pull offset, else max+1;
        -1 if nothing is known."""
        if self.msgs:
            return self.msgs.keys()[0]
        if self.pull_offset >= 0:
            return self.pull_offset
        return self.queue_offset_max + 1 if self.queue_offset_max >= 0 else -1

    # -- consume timeout ----------------------------------------------------------------------
    def start_consuming(self, msgs, now_ms: int) -> None:
        """The listener is called for `msgs` now."""
        consuming = self.consuming
        for m in msgs:
            consuming[m.queue_offset] = now_ms

    def finish_consuming(self, msgs) -> list:
        """The listener returned for `msgs`: those whose result still counts (the others
        were claimed by claim_expired meanwhile and are already being sent back)."""
        consuming = self.consuming
        return [m for m in msgs if consuming.pop(m.queue_offset, None) is not None]

    def claim_expired(self, now_ms: int, timeout_ms: int) -> list:
        """Cached messages whose listener call started more than `timeout_ms` ago, in
        queue order. Their start is forgotten, so finish_consuming() drops their late
        result; they stay cached (holding the commit point) until the caller removes them."""
        deadline = now_ms - timeout_ms
        expired = sorted(off for off, t in self.consuming.items() if t < deadline)
        out = []
        for off in expired:
            del self.consuming[off]
            m = self.msgs.get(off)
            if m is not None:
                out.append(m)
        return out

    def oldest_in_flight_age_ms(self, now_ms: int) -> int:
        """How long the oldest running listener call of this queue has run (0: none)."""
        if not self.consuming:
            return 0
        return max(0, now_ms - min(self.consuming.values()))

    @property
    def max_span(self) -> int:
        if not self.msgs:
            return 0
        keys = self.msgs.keys()
        return keys[-1] - keys[0]

    def clear(self) -> None:
        self.msgs.clear()
        self.consuming.clear()
        self.msg_count = 0
        self.msg_size_bytes = 0

    def flow_control(self, limits: FlowLimits, orderly: bool = False) -> FlowControl | None:
        """None if the next pull may go now, else why it must wait FLOW_CONTROL_DELAY_MS."""
        if self.msg_count > limits.pull_threshold_for_queue:
            return FlowControl.COUNT
        if self.msg_size_bytes > limits.pull_threshold_size_for_queue_bytes:
            return FlowControl.SIZE
        if not orderly and self.max_span > limits.consume_concurrently_max_span:
            return FlowControl.SPAN
        return None

    # -- orderly consumption ----------------------------------------------------------------
    def set_locked(self, now_ms: int) -> None:
        """LOCK_BATCH_MQ (first lock or renewal) answered with this queue."""
        self.locked = True
        self.last_lock_ms = now_ms

    def lose_lock(self) -> None:
        self.locked = False

    def lock_expired(self, now_ms: int) -> bool:
        return now_ms - self.last_lock_ms > REBALANCE_LOCK_MAX_LIVE_MS

    def holds_lock(self, now_ms: int) -> bool:
        """Locked and renewed within REBALANCE_LOCK_MAX_LIVE_MS: the queue may be pulled and consumed."""
        return self.locked and now_ms - self.last_lock_ms <= REBALANCE_LOCK_MAX_LIVE_MS

    def take_messages(self, n: int) -> list:
        """The first `n` cached messages in queue order. They stay cached (and hold the
        commit point) until remove_messages() after the listener succeeded."""
        tree = self.msgs
        if n == 1:
            return [tree.peekitem(0)[1]] if tree else []
        return [tree[k] for k in tree.keys()[:n]]

    def remove_head(self, msgs, now_ms: int = 0) -> None:
        """Orderly: forget `msgs` taken by take_messages() after the listener succeeded.
        They are normally the first cached messages, which popping removes faster than
        remove_messages()'s search; a message found elsewhere is removed by offset."""
        tree = self.msgs
        self.last_consume_ms = now_ms
        for m in msgs:
            off = m.queue_offset
            if not tree:
                return
            k, old = tree.popitem(0)
            if k != off:                  # something was cached before it meanwhile: put it back
                tree[k] = old
                old = tree.pop(off, None)
                if old is None:
                    continue
            self.msg_count -= 1
            self.msg_size_bytes -= _body_len(old)
            self.consumed_total += 1

    def replace_messages(self, msgs) -> None:
        """Put changed copies of cached messages back at their offsets (orderly retries
        count reconsume_times locally)."""
        tree = self.msgs
        for m in msgs:
            if m.queue_offset in tree:
                tree[m.queue_offset] = m

    @property
    def idle(self) -> bool:
        return self.in_flight == 0

    def __repr__(self) -> str:
        return (f"ProcessQueue(count={self.msg_count}, size={self.msg_size_bytes}B, "
                f"span={self.max_span}, max={self.queue_offset_max}, dropped={self.dropped})")


class OrderlyStep(Enum):
    CONSUME = "consume the next messages"
    NEED_LOCK = "the queue's lock is missing or expired: relock before consuming"
    YIELD = "consumed continuously for MAX_TIME_CONSUME_CONTINUOUSLY_MS: let other queues run"
    IDLE = "nothing cached"
    STOP = "the queue was dropped"


def orderly_step(pq: ProcessQueue, began_ms: int, now_ms: int, needs_lock: bool) -> OrderlyStep:
    """What a queue's orderly consume task does next, in Java's order of checks (dropped,
    lock held and fresh (clustering only), continuous-consumption limit, messages)."""
    if pq.dropped:
        return OrderlyStep.STOP
    if needs_lock and not pq.holds_lock(now_ms):
        return OrderlyStep.NEED_LOCK
    if now_ms - began_ms > MAX_TIME_CONSUME_CONTINUOUSLY_MS:
        return OrderlyStep.YIELD
    if not pq.msgs:
        return OrderlyStep.IDLE
    return OrderlyStep.CONSUME


def next_lock_renewal_ms(last_renewal_ms: int) -> int:
    """When the periodic LOCK_BATCH_MQ of every held queue is due again."""
    return last_renewal_ms + REBALANCE_LOCK_INTERVAL_MS


def split_exhausted(msgs, max_reconsume_times: int) -> tuple[list, list]:
    """(to the dead-letter queue, to retry): a message that already had
    `max_reconsume_times` local retries goes to the DLQ (Java's checkReconsumeTimes)."""
    dead, retry = [], []
    for m in msgs:
        (dead if m.reconsume_times >= max_reconsume_times else retry).append(m)
    return dead, retry
