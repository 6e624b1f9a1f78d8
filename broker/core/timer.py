"""Timer messages: RocketMQ 5's delivery at an arbitrary time (pure rules and the schedule).

**Which message is a timer message** (Java 5's HookUtils): one carrying TIMER_DELAY_SEC,
TIMER_DELAY_MS or TIMER_DELIVER_MS (read in that order; the delays count from the broker's
clock when the message arrives), no DELAY level (a delay level wins: the timer properties
are then ignored, as in Java), no TIMER_OUT_MS (a message the timer delivered once and
someone sent again is an ordinary message) and not prepared as a transaction half.

**Parking** (`park`): a delivery time in the future, at most timerMaxDelaySec away, is
written as TIMER_OUT_MS with REAL_TOPIC/REAL_QID, and the message is stored in
rmq_sys_wheel_timer queue 0 (TIMER_QUEUE). A time now or past stores it in its topic at
once. Further than timerMaxDelaySec, or not a number: refused (Java's MESSAGE_ILLEGAL
and remark). Unlike Java, the time is not rounded down to timerPrecisionMs: a timer
message is never delivered before its time.

**Delivery** (`unpark`): the parked message is written to REAL_TOPIC/REAL_QID without
those two, with TIMER_ENQUEUE_MS (when it was parked) and TIMER_DEQUEUE_MS (when it was
delivered) added; TIMER_OUT_MS stays (it marks the copy as delivered).

**The schedule** (`TimerSchedule`): which parked messages are waiting, as keys
(deliver_ms, queue offset in TIMER_QUEUE), a total order. At most `capacity` keys are in
memory; keys from `horizon` on are *deferred*: left in the queue, found again by a
*reload*, a rescan of TIMER_QUEUE from the lowest deferred offset that takes the next
capacity/2 keys. Every key below the horizon is in the heap, so the heap's least key is
the next delivery.

**Checkpoints** are records in rmq_sys_wheel_timer queue 1 (CHECKPOINT_QUEUE), written
after the deliveries they cover: the commit log is written in order, so a checkpoint that
survives a crash is never ahead of the deliveries it claims, and a slave has them too.
A checkpoint (E, D, L) means: every parked message at an offset below E whose key is
below D has been delivered (D = null: all of them), and so has every one below L. The
body is JSON:

| field             | type            | meaning                                                  |
|-------------------|-----------------|----------------------------------------------------------|
| `enqueueOffset`   | int             | E: TIMER_QUEUE offsets below it had been read            |
| `deliveredBelow`  | [int, int]/null | D: the least key still waiting then (null: none waited)  |
| `lowOffset`       | int             | L: the lowest offset still waiting then (the rebuild's start) |

A restart rebuilds the schedule by reading TIMER_QUEUE from L, skipping what (E, D) says
was delivered: deliveries after the last checkpoint are made again (at least once).
"""
from __future__ import annotations

import heapq
import json
from typing import NamedTuple

from pocketmq.broker.core.delay import real_place
from pocketmq.common.constants import TIMER_TOPIC
from pocketmq.protocol.message import (DELAY, REAL_QID, REAL_TOPIC, TIMER_DEL_UNIQKEY, TIMER_DELAY_MS,
                                       TIMER_DELAY_SEC, TIMER_DELIVER_MS, TIMER_DEQUEUE_MS, TIMER_ENQUEUE_MS,
                                       TIMER_OUT_MS, decode_properties, encode_properties)

TIMER_QUEUE = 0            # the parked messages
CHECKPOINT_QUEUE = 1       # the timer's checkpoints

Key = tuple[int, int]      # (deliver_ms, queue offset in TIMER_QUEUE)


class TimerError(ValueError):
    """A timer message the broker refuses (the send answers MESSAGE_ILLEGAL with this text)."""


def has_timer_property(props: str) -> bool:
    """Quick test on the wire text: may this message be a timer message? (then `deliver_ms`)"""
    return "TIMER_DEL" in props


def illegal_remark(max_delay_sec: int) -> str:
    # Java's remark for WHEEL_TIMER_MSG_ILLEGAL, word for word (clients and tools match on it)
    return (f"timer message illegal, the delay time should not be bigger than the max delay "
            f"{max_delay_sec * 1000}ms; or if set del msg, the delay time should be bigger than the current time")


def _delay_level(props: dict) -> int:
    try:
        return int(props.get(DELAY) or 0)
    except ValueError:
        return 0


def deliver_ms(props: dict, now_ms: int, max_delay_sec: int) -> int | None:
    """When a message should be delivered: None when it is not a timer message (see the
    module doc), else the absolute time in ms (<= now_ms: deliver at once). Raises
    TimerError when a timer property is not a whole number, the time is more than
    max_delay_sec away, or the message asks to cancel a timer (TIMER_DEL_UNIQKEY)."""
    if TIMER_OUT_MS in props or _delay_level(props) > 0:
        return None
    if TIMER_DELAY_SEC in props:
        name, scale, base = TIMER_DELAY_SEC, 1000, now_ms
    elif TIMER_DELAY_MS in props:
        name, scale, base = TIMER_DELAY_MS, 1, now_ms
    elif TIMER_DELIVER_MS in props:
        name, scale, base = TIMER_DELIVER_MS, 1, 0
    else:
        return None
    try:
        value = int(props[name])
    except ValueError:
        raise TimerError(f"{name} must be a whole number, got {props[name]!r}") from None
    at = base + value * scale
    if TIMER_DEL_UNIQKEY in props:
        # Java cancels a timer this way (a delete marker in the wheel); pocketmq has none
        raise TimerError(f"cancelling a timer message ({TIMER_DEL_UNIQKEY}) is not supported")
    if at - now_ms > max_delay_sec * 1000:
        raise TimerError(illegal_remark(max_delay_sec))
    return at


def park(topic: str, queue_id: int, props: dict, at_ms: int) -> tuple[str, int, str]:
    """Where a timer message waits: (TIMER_TOPIC, TIMER_QUEUE, properties to store)."""
    d = dict(props)
    d[TIMER_OUT_MS] = str(at_ms)
    d[REAL_TOPIC] = topic
    d[REAL_QID] = str(queue_id)
    return TIMER_TOPIC, TIMER_QUEUE, encode_properties(d)


def place(topic: str, queue_id: int, props_text: str, now_ms: int, max_delay_sec: int) -> tuple[str, int, str] | None:
    """Where a message whose properties (wire text) may ask for a timer is stored: None for
    its own topic as sent (not a timer message), else (TIMER_TOPIC, TIMER_QUEUE, properties)
    when its time is in the future, or (topic, queue_id, properties unchanged) when it has
    come. Raises TimerError (see deliver_ms). Every send path (remoting, gRPC) asks this."""
    if not has_timer_property(props_text):
        return None
    props = decode_properties(props_text)
    at = deliver_ms(props, now_ms, max_delay_sec)
    if at is None:
        return None
    if at <= now_ms:
        return topic, queue_id, props_text
    return park(topic, queue_id, props, at)


def unpark(props: dict, parked_ms: int, now_ms: int) -> tuple[str, int, str] | None:
    """(real topic, real queue id, properties to store) of a due message; None when the
    parked message does not say where it belongs."""
    place = real_place(props)
    if place is None:
        return None
    d = dict(props)
    del d[REAL_TOPIC], d[REAL_QID]
    d[TIMER_ENQUEUE_MS] = str(parked_ms)
    d[TIMER_DEQUEUE_MS] = str(now_ms)
    return place[0], place[1], encode_properties(d)


def parked_deliver_ms(props: dict, store_timestamp: int) -> int:
    """The delivery time of a parked message (TIMER_OUT_MS; the broker wrote it, so only a
    damaged record lacks it: such a message is due at once, never held forever)."""
    try:
        return int(props.get(TIMER_OUT_MS, ""))
    except ValueError:
        return store_timestamp


# --- checkpoints ---------------------------------------------------------------------------

class TimerCheckpoint(NamedTuple):
    enqueue_offset: int            # E
    delivered_below: Key | None    # D (None: everything below E was delivered)
    low_offset: int                # L

    def encode(self) -> bytes:
        d = self.delivered_below
        return json.dumps({"enqueueOffset": self.enqueue_offset,
                           "deliveredBelow": None if d is None else [d[0], d[1]],
                           "lowOffset": self.low_offset}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, body: bytes) -> TimerCheckpoint:
        """Raises ValueError naming what is wrong."""
        try:
            d = json.loads(body)
            e, low, below = d["enqueueOffset"], d["lowOffset"], d["deliveredBelow"]
        except (ValueError, TypeError, KeyError) as ex:
            raise ValueError(f"bad timer checkpoint {bytes(body[:80])!r}: {ex}") from None
        if below is not None:
            if (type(below) is not list or len(below) != 2 or not all(type(x) is int for x in below)):
                raise ValueError(f"bad timer checkpoint deliveredBelow {below!r}")
            below = (below[0], below[1])
        if type(e) is not int or type(low) is not int or not 0 <= low <= e:
            raise ValueError(f"bad timer checkpoint offsets enqueueOffset={e!r} lowOffset={low!r}")
        return cls(e, below, low)

    def delivered(self, offset: int, key: Key) -> bool:
        """Did the run that wrote this checkpoint deliver the message at `offset`?"""
        if offset < self.low_offset:
            return True
        if offset >= self.enqueue_offset:
            return False
        return self.delivered_below is None or key < self.delivered_below


# --- the schedule --------------------------------------------------------------------------

class _Reload:
    """A rescan in progress: keeps the `keep` least keys at or past `horizon` in a max-heap
    (negated keys); what falls out stays deferred."""
    __slots__ = ("horizon", "pos", "keep", "kept", "evicted_min", "evicted_low", "evicted")

    def __init__(self, horizon: Key, pos: int, keep: int):
        self.horizon = horizon
        self.pos = pos
        self.keep = keep
        self.kept: list[tuple[int, int]] = []
        self.evicted_min: Key | None = None
        self.evicted_low: int | None = None
        self.evicted = 0


class TimerSchedule:
    """The waiting timer messages (pure: the shell feeds it TIMER_QUEUE's entries in offset
    order and asks what is due).

    Invariant: every waiting message read so far (offset below `enqueue_offset`) is either in
    `heap` (key < horizon) or deferred (key >= horizon, offset >= deferred_low); nothing
    delivered is in either. Hence the heap's least key is the next delivery, and
    `checkpoint()` is exact."""

    def __init__(self, capacity: int, start_offset: int, restored: TimerCheckpoint | None = None):
        if capacity < 4:
            raise ValueError(f"timer schedule capacity must be >= 4, got {capacity}")
        self.capacity = capacity
        self.heap: list[Key] = []
        self.horizon: Key | None = None       # keys >= horizon are deferred (None: none are)
        self.deferred_low: int | None = None  # lowest offset of a deferred key (None: none deferred)
        self.deferred = 0                     # how many are deferred
        self.enqueue_offset = start_offset    # next TIMER_QUEUE offset to read
        self.restored = restored              # the checkpoint this run started from
        self._reload: _Reload | None = None

    # -- reading the queue -------------------------------------------------------------------
    def add(self, offset: int, at_ms: int) -> None:
        """The entry at `offset` (>= enqueue_offset; a gap is a hole in the queue) waits
        until `at_ms`."""
        self.enqueue_offset = offset + 1
        key = (at_ms, offset)
        if self.restored is not None and self.restored.delivered(offset, key):
            return
        horizon = self.horizon
        if horizon is not None and key >= horizon:
            self._defer(offset)
            return
        heapq.heappush(self.heap, key)
        if len(self.heap) > self.capacity:
            self._shrink()

    def skip_to(self, offset: int) -> None:
        """Entries below `offset` are unreadable (a hole, or the queue's files were removed)."""
        if offset > self.enqueue_offset:
            self.enqueue_offset = offset

    def _defer(self, offset: int) -> None:
        self.deferred += 1
        if self.deferred_low is None or offset < self.deferred_low:
            self.deferred_low = offset

    def _shrink(self) -> None:
        """Over capacity: keep the least half in memory, defer the rest."""
        self.heap.sort()                      # a sorted list is a heap
        half = self.capacity // 2
        evicted = self.heap[half:]
        del self.heap[half:]
        self.horizon = evicted[0]
        self.deferred += len(evicted)
        low = min(o for _, o in evicted)
        if self.deferred_low is None or low < self.deferred_low:
            self.deferred_low = low
        # a reload in progress selected keys from the old horizon up: now wrong
        self._reload = None

    # -- delivering ------------------------------------------------------------------------
    def next_due_ms(self) -> int | None:
        return self.heap[0][0] if self.heap else None

    def pop_due(self, now_ms: int, limit: int) -> list[Key]:
        """Up to `limit` keys due at now_ms, least first (never one whose time has not come)."""
        heap, out = self.heap, []
        while heap and heap[0][0] <= now_ms and len(out) < limit:
            out.append(heapq.heappop(heap))
        return out

    def put_back(self, key: Key) -> None:
        """A popped key whose delivery failed (the store refused the write): wait again."""
        heapq.heappush(self.heap, key)

    @property
    def size(self) -> int:
        """Waiting messages read so far (in memory and deferred)."""
        return len(self.heap) + self.deferred

    # -- reloading the deferred part --------------------------------------------------------
    def needs_reload(self) -> bool:
        return self._reload is None and self.deferred_low is not None and len(self.heap) <= self.capacity // 4

    @property
    def reloading(self) -> bool:
        return self._reload is not None

    def begin_reload(self) -> int:
        """Start a rescan; returns the TIMER_QUEUE offset to read from (then `reload_add`
        each entry in order up to enqueue_offset, and `reload_finish`)."""
        assert self.horizon is not None and self.deferred_low is not None
        self._reload = _Reload(self.horizon, self.deferred_low, max(1, self.capacity // 2))
        return self.deferred_low

    def reload_position(self) -> int:
        return self._reload.pos

    def reload_add(self, offset: int, at_ms: int) -> None:
        r = self._reload
        r.pos = offset + 1
        key = (at_ms, offset)
        if key < r.horizon or (self.restored is not None and self.restored.delivered(offset, key)):
            return          # delivered, or in the heap already
        neg = (-at_ms, -offset)
        if len(r.kept) < r.keep:
            heapq.heappush(r.kept, neg)
            return
        if neg < r.kept[0]:
            out = key       # larger than every kept key: stays deferred
        else:
            out_neg = heapq.heapreplace(r.kept, neg)
            out = (-out_neg[0], -out_neg[1])
        r.evicted += 1
        if r.evicted_min is None or out < r.evicted_min:
            r.evicted_min = out
        if r.evicted_low is None or out[1] < r.evicted_low:
            r.evicted_low = out[1]

    def reload_skip_to(self, offset: int) -> None:
        if offset > self._reload.pos:
            self._reload.pos = offset

    def reload_finish(self) -> bool:
        """Adopt the rescan when it reached enqueue_offset (True); False: keep scanning."""
        r = self._reload
        if r is None or r.pos < self.enqueue_offset:
            return False
        self._reload = None
        for neg in r.kept:
            heapq.heappush(self.heap, (-neg[0], -neg[1]))
        self.horizon = r.evicted_min
        self.deferred_low = r.evicted_low
        self.deferred = r.evicted
        if len(self.heap) > self.capacity:
            self._shrink()
        return True

    # -- checkpoints -----------------------------------------------------------------------
    def checkpoint(self) -> TimerCheckpoint | None:
        """The state to record now; None while a restart's rebuild has not read past the
        checkpoint it started from (that one says more)."""
        r = self.restored
        if r is not None and self.enqueue_offset < r.enqueue_offset:
            return None
        e = self.enqueue_offset
        heap = self.heap
        low = min(o for _, o in heap) if heap else e
        if self.deferred_low is not None and self.deferred_low < low:
            low = self.deferred_low
        below = heap[0] if heap else self.horizon
        return TimerCheckpoint(e, below, low)
