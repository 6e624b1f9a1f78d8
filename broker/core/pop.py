"""POP consumption's rules (pure): leases, receipt handles, FIFO blocking, the in-flight bound.

RocketMQ 5's POP (PopMessageProcessor, AckMessageProcessor, ChangeInvisibleTimeProcessor,
PopReviveService, ConsumerOrderInfoManager): the broker, not the client, owns the
position. A pop leases messages to the group for `invisible_ms`; an ack ends the lease;
a lease that runs out gives the message back (the shell, broker/services/pop.py, copies
it to `%RETRY%<group>_<topic>` with RECONSUME_TIME + 1, or to `%DLQ%<group>` past the
group's retryMaxTimes; an orderly lease is redelivered in place).

State per (group, topic, queue) — `PopQueue`:

* `pop_offset`: the next offset never popped (RocketMQ keeps it as the consumer offset;
  here the consumer offset is the acked prefix, so 4.x tools show real progress);
* `leases`: offset -> `Lease` (pop time = the lease's id, visible_at, delivery attempt,
  commit-log offset, the revive-log position of the checkpoint that made it);
* `committed()`: the lowest leased offset, else `pop_offset`: everything below it was
  acked or given back. The shell commits it to the consumer offset table.

Bounds: `inflight_max` leases in the broker and `inflight_per_group_max` per group;
`room(group)` says how many more a pop may take (0: the pop is refused SYSTEM_BUSY).

Receipt handle: RocketMQ's nine space-separated fields (ExtraInfoUtil /
ReceiptHandle: ckQueueOffset popTime invisibleTime reviveQid topicType brokerName queueId
queueOffset commitLogOffset), so Java code that parses handles still can, plus a tenth:
an HMAC-SHA256 (first 128 bits, hex) over the group, the topic and the nine fields with
the broker's secret. A handle is accepted only when its signature verifies (when it has
one: 4.x-wire clients build their extraInfo themselves and cannot sign) AND a live lease
has that queue, offset and pop time; anything else is INVALID_RECEIPT_HANDLE and changes
nothing. A changed invisibility gives a new pop time, so the old handle goes stale.

FIFO (`fifo_step`): a queue with a leased batch gives nothing more while any lease in it
is invisible; the same non-empty attempt id gets the same batch back (new pop time, same
attempts); once every lease of the batch ran out, the batch (what was not acked) is
delivered again with attempt + 1.
"""
from __future__ import annotations

import enum
import heapq
import hashlib
import hmac
import itertools
from typing import NamedTuple

from pocketmq.broker.core import pop_log
from pocketmq.common.constants import POP_ORDER_REVIVE_QUEUE, pop_retry_topic
from pocketmq.protocol.codes import ResponseCode

MAX_INVISIBLE_MS = 12 * 3600 * 1000       # RocketMQ 5's upper bound on invisible_duration
GRPC_MIN_INVISIBLE_MS = 10 * 1000         # the gRPC endpoint's lower bound (ReceiveMessageActivity)
MAX_POP_NUMS = 32                         # PopMessageProcessor: maxMsgNums > 32 is INVALID_PARAMETER
MAX_ATTEMPT_ID = 128                      # our bound on a client's attempt id
NORMAL_TOPIC = "0"                        # a handle's topicType (ExtraInfoUtil)
RETRY_TOPIC = "1"
_SIG_HEX = 32
INIT_MIN, INIT_MAX = 0, 1                 # ConsumeInitMode: where a group's first pop of a queue starts


class PopError(Exception):
    def __init__(self, code: int, remark: str):
        super().__init__(f"{remark} (code {int(code)})")
        self.code = int(code)
        self.remark = remark


class InvalidReceiptHandle(PopError):
    """A handle that is malformed, forged, for another group/topic/broker, or stale (acked,
    changed, redelivered). Nothing was changed. On the 4.x wire: NO_MESSAGE."""

    def __init__(self, remark: str):
        super().__init__(ResponseCode.NO_MESSAGE, f"invalid receipt handle: {remark}")


def invisible_error(invisible_ms: int, min_ms: int = 1) -> str | None:
    """None when `invisible_ms` is a lease length the broker takes, else the remark. The
    broker takes 1 ms .. 12 h (RocketMQ's broker checks nothing); the gRPC endpoint passes
    min_ms=GRPC_MIN_INVISIBLE_MS (10 s), as RocketMQ's proxy does."""
    if not min_ms <= invisible_ms <= MAX_INVISIBLE_MS:
        return f"invisible time {invisible_ms} ms is out of range [{min_ms}, {MAX_INVISIBLE_MS}]"
    return None


# --------------------------------------------------------------------------- receipt handles

class ReceiptHandle(NamedTuple):
    ck_offset: int            # the first offset the pop took from this queue
    pop_time: int             # the lease's id
    invisible_ms: int
    revive_qid: int           # 0, or POP_ORDER_REVIVE_QUEUE for an orderly pop
    topic_type: str           # NORMAL_TOPIC, or RETRY_TOPIC: read from %RETRY%<group>_<topic>
    broker_name: str
    queue_id: int
    offset: int
    commit_log_offset: int    # -1 when the handle does not carry it (a 4.x extraInfo)
    signature: str            # "" when unsigned

    def fields(self) -> str:
        return (f"{self.ck_offset} {self.pop_time} {self.invisible_ms} {self.revive_qid} {self.topic_type} "
                f"{self.broker_name} {self.queue_id} {self.offset} {self.commit_log_offset}")

    @property
    def fifo(self) -> bool:
        return self.revive_qid == POP_ORDER_REVIVE_QUEUE

    def real_topic(self, group: str, topic: str) -> str:
        """The topic the message was read from."""
        return pop_retry_topic(group, topic) if self.topic_type == RETRY_TOPIC else topic


def _signature(secret: bytes, group: str, topic: str, fields: str) -> str:
    mac = hmac.new(secret, f"{group}\n{topic}\n{fields}".encode(), hashlib.sha256)
    return mac.hexdigest()[:_SIG_HEX]


def encode_handle(secret: bytes, group: str, topic: str, h: ReceiptHandle) -> str:
    """The signed handle text (`topic`: the group's topic, not the retry topic)."""
    fields = h.fields()
    return f"{fields} {_signature(secret, group, topic, fields)}"


def decode_handle(text: str) -> ReceiptHandle:
    """A handle or a 4.x extraInfo (7 to 10 fields); ValueError naming what is wrong."""
    if not isinstance(text, str) or len(text) > 1024:
        raise ValueError("receipt handle missing or too long")
    parts = text.split(" ")
    if not 7 <= len(parts) <= 10:
        raise ValueError(f"receipt handle has {len(parts)} fields, expected 7 to 10")
    try:
        ck, pt, it, rq = int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3])
        qid = int(parts[6])
        offset = int(parts[7]) if len(parts) > 7 else -1
        clo = int(parts[8]) if len(parts) > 8 else -1
    except ValueError:
        raise ValueError("receipt handle field is not a number") from None
    if parts[4] not in (NORMAL_TOPIC, RETRY_TOPIC):
        raise ValueError(f"receipt handle topic type {parts[4]!r}")
    sig = parts[9] if len(parts) > 9 else ""
    return ReceiptHandle(ck, pt, it, rq, parts[4], parts[5], qid, offset, clo, sig)


def signature_ok(secret: bytes, group: str, topic: str, h: ReceiptHandle) -> bool:
    return hmac.compare_digest(h.signature, _signature(secret, group, topic, h.fields()))


# --------------------------------------------------------------------------- leases

class Lease:
    __slots__ = ("key", "offset", "commit_log_offset", "pop_time", "invisible_ms", "visible_at", "attempt",
                 "fifo", "owner", "renew_until", "ck_pos", "ck_offset", "attempt_id", "alive")

    def __init__(self, key, offset, commit_log_offset, pop_time, invisible_ms, attempt, fifo, ck_pos, ck_offset,
                 attempt_id=None, owner=None, renew_until=0):
        self.key = key                      # (group, topic read from, queue id)
        self.offset = offset
        self.commit_log_offset = commit_log_offset
        self.pop_time = pop_time
        self.invisible_ms = invisible_ms
        self.visible_at = pop_time + invisible_ms
        self.attempt = attempt              # delivery attempt of this lease (1: first delivery)
        self.fifo = fifo
        self.owner = owner                  # auto-renew: renewed while this owner is live
        self.renew_until = renew_until
        self.ck_pos = ck_pos                # revive-log queue offset of the record that made it
        self.ck_offset = ck_offset          # the handle's ckQueueOffset
        self.attempt_id = attempt_id
        self.alive = True

    def __repr__(self) -> str:
        return f"Lease({self.key}, offset={self.offset}, pop_time={self.pop_time}, visible_at={self.visible_at})"


class PopQueue:
    __slots__ = ("pop_offset", "leases", "attempt_id")

    def __init__(self, pop_offset: int):
        self.pop_offset = pop_offset
        self.leases: dict[int, Lease] = {}   # by offset, kept in offset order
        self.attempt_id: str | None = None   # FIFO: the attempt id of the leased batch

    def committed(self) -> int:
        """Every offset below this one was acked or given back."""
        for offset in self.leases:
            return offset
        return self.pop_offset


class FifoStep(enum.Enum):
    FREE = "free"              # nothing leased: pop new messages
    BLOCKED = "blocked"        # a batch is leased and invisible: nothing
    REGET = "reget"            # the same attempt id: the same batch again, same attempts
    REDELIVER = "redeliver"    # the batch's leases ran out: what was not acked, attempt + 1


def fifo_step(q: PopQueue, attempt_id: str | None, now_ms: int) -> FifoStep:
    if not q.leases:
        return FifoStep.FREE
    if any(lease.visible_at > now_ms for lease in q.leases.values()):
        if attempt_id and attempt_id == q.attempt_id:
            return FifoStep.REGET
        return FifoStep.BLOCKED
    return FifoStep.REDELIVER


class PopState:
    """Every live lease of the broker, by queue, by due time and by checkpoint position."""

    def __init__(self, inflight_max: int = 200_000, inflight_per_group_max: int = 50_000):
        self.inflight_max = inflight_max
        self.inflight_per_group_max = inflight_per_group_max
        self.queues: dict[tuple[str, str, int], PopQueue] = {}
        self.count = 0
        self.per_group: dict[str, int] = {}
        self._due: list = []         # (visible_at, seq, lease, pop_time), stale entries dropped lazily
        self._ck: list = []          # (ck_pos, seq, lease)
        self._seq = itertools.count()

    # -- queues and bounds ---------------------------------------------------------------
    def queue(self, key) -> PopQueue | None:
        return self.queues.get(key)

    def open_queue(self, key, pop_offset: int) -> PopQueue:
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = PopQueue(pop_offset)
        return q

    def room(self, group: str) -> int:
        return max(0, min(self.inflight_max - self.count,
                          self.inflight_per_group_max - self.per_group.get(group, 0)))

    # -- leasing -------------------------------------------------------------------------
    def _index(self, lease: Lease) -> None:
        heapq.heappush(self._due, (lease.visible_at, next(self._seq), lease, lease.pop_time))
        heapq.heappush(self._ck, (lease.ck_pos, next(self._seq), lease))

    def lease(self, key, items, pop_time: int, invisible_ms: int, *, fifo: bool, ck_pos: int,
              ck_offset: int, attempt_id: str | None = None, owner: str | None = None,
              renew_until: int = 0, next_offset: int | None = None) -> list[Lease]:
        """Lease `items` [(offset, commit_log_offset, attempt)] of queue `key`; an offset
        already leased (a FIFO redelivery) gets the new lease instead. `next_offset`: the
        pop position after them (it also passes the messages the filter skipped)."""
        q = self.open_queue(key, items[0][0] if items else (next_offset or 0))
        group = key[0]
        out = []
        last = next(reversed(q.leases), None)
        unordered = False
        for offset, clo, attempt in items:
            old = q.leases.get(offset)
            if old is not None:
                old.alive = False
            else:
                if last is not None and offset < last:
                    unordered = True
                last = offset if last is None else max(last, offset)
                self.count += 1
                self.per_group[group] = self.per_group.get(group, 0) + 1
            lease = Lease(key, offset, clo, pop_time, invisible_ms, attempt, fifo, ck_pos, ck_offset,
                          attempt_id, owner, renew_until)
            q.leases[offset] = lease
            self._index(lease)
            out.append(lease)
        if fifo:
            q.attempt_id = attempt_id
        if unordered:
            q.leases = dict(sorted(q.leases.items()))   # committed() reads the first key
        top = max((o for o, _, _ in items), default=-1) + 1
        q.pop_offset = max(q.pop_offset, top, next_offset if next_offset is not None else 0)
        return out

    def find(self, key, offset: int, pop_time: int) -> Lease | None:
        """The live lease a handle names (its pop time must be the lease's: a changed
        invisibility or a redelivery made the older handles stale)."""
        q = self.queues.get(key)
        lease = None if q is None else q.leases.get(offset)
        if lease is None or lease.pop_time != pop_time:
            return None
        return lease

    def resolve(self, lease: Lease) -> tuple[int, int]:
        """The lease ends (acked, or given back to the retry topic or the DLQ): (committed
        offset before, after)."""
        q = self.queues[lease.key]
        before = q.committed()
        if q.leases.get(lease.offset) is lease:
            del q.leases[lease.offset]
            self.count -= 1
            group = lease.key[0]
            left = self.per_group[group] - 1
            if left:
                self.per_group[group] = left
            else:
                del self.per_group[group]
        lease.alive = False
        if not q.leases:
            q.attempt_id = None
        return before, q.committed()

    def change(self, lease: Lease, pop_time: int, invisible_ms: int, ck_pos: int | None = None) -> Lease:
        """A new lease of the same message (ChangeInvisibleDuration): new pop time, visible
        at pop_time + invisible_ms, no auto-renew (a client that changes the time decides
        when the message comes back)."""
        lease.alive = False
        new = Lease(lease.key, lease.offset, lease.commit_log_offset, pop_time, invisible_ms, lease.attempt,
                    lease.fifo, lease.ck_pos if ck_pos is None else ck_pos, lease.ck_offset, lease.attempt_id)
        self.queues[lease.key].leases[lease.offset] = new
        self._index(new)
        return new

    def owned_by(self, owner: str) -> list[Lease]:
        """The live auto-renewed leases of one owner (a walk over every lease: called when
        a client goes, not per message)."""
        return [lease for q in self.queues.values() for lease in q.leases.values() if lease.owner == owner]

    def reschedule(self, lease: Lease, visible_at: int) -> None:
        """Same lease, due later (auto-renew, or a revive that must be tried again)."""
        lease.visible_at = visible_at
        heapq.heappush(self._due, (visible_at, next(self._seq), lease, lease.pop_time))

    # -- time ----------------------------------------------------------------------------
    def _live_due(self, entry) -> bool:
        visible_at, _, lease, pop_time = entry
        return lease.alive and lease.pop_time == pop_time and lease.visible_at == visible_at

    def next_due(self) -> int | None:
        due = self._due
        while due and not self._live_due(due[0]):
            heapq.heappop(due)
        return due[0][0] if due else None

    def due(self, now_ms: int, limit: int) -> list[Lease]:
        """Leases whose time ran out (visible_at <= now), earliest first, at most `limit`;
        they stay leased until the caller resolves, renews or redelivers them."""
        due = self._due
        out: list[Lease] = []
        while due and len(out) < limit and due[0][0] <= now_ms:
            entry = heapq.heappop(due)
            if self._live_due(entry):
                out.append(entry[2])
        if len(due) > 2 * self.count + 1024:
            self._due = [e for e in due if self._live_due(e)]
            heapq.heapify(self._due)
        return out

    def checkpoint(self) -> int | None:
        """The revive-log position a restart must replay from: that of the oldest record
        still backing a live lease (None: no lease is live)."""
        ck = self._ck
        while ck and not ck[0][2].alive:
            heapq.heappop(ck)
        if len(ck) > 2 * self.count + 1024:
            self._ck = ck = [e for e in ck if e[2].alive]
            heapq.heapify(ck)
        return ck[0][0] if ck else None

    # -- rebuilding from the revive log --------------------------------------------------
    def apply(self, rec: pop_log.LogRecord, pos: int) -> None:
        """Replay one revive-log record (at queue offset `pos`)."""
        key = (rec.group, rec.topic, rec.queue_id)
        if rec.kind == pop_log.CK:
            items = list(zip(rec.offsets, rec.commit_log_offsets, rec.attempts))
            self.lease(key, items, rec.pop_time, rec.invisible_ms, fifo=rec.fifo, ck_pos=pos,
                       ck_offset=rec.offsets[0], attempt_id=rec.attempt_id)
            return
        lease = self.find(key, rec.offsets[0], rec.pop_time)
        if lease is None:
            return
        if rec.kind == pop_log.CHANGE:
            self.change(lease, rec.new_pop_time, rec.invisible_ms)
        else:
            self.resolve(lease)

    def drop_below(self, key, committed: int) -> None:
        """After a replay: leases below the committed offset (persisted with the replay's
        start) were resolved before it; the pop position is at least the committed one."""
        q = self.queues.get(key)
        if q is None:
            return
        for offset in [o for o in q.leases if o < committed]:
            self.resolve(q.leases[offset])
        q.pop_offset = max(q.pop_offset, committed)
