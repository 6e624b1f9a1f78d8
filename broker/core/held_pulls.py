"""Held pulls for long polling (pure; the shell owns timers and sockets).

A PULL that finds no new message and carries FLAG_SUSPEND is parked under
`topic@queueId` until (a) the reput dispatcher reports a new entry in that
queue that the pull's subscription accepts (`notify`), or (b) its suspend
time runs out (`expire`). The shell sleeps until `next_deadline_ms()`, so a
held pull is answered at its deadline rather than on a 5 s tick; a periodic
rescan against the queue max offsets (`stale`) is the safety net for a missed
notification.

Bounds: `held_max` parked pulls in all, `per_connection_max` per connection;
`hold` says which one refused (the caller answers SYSTEM_BUSY).

Indexes. Each operation costs O(k log n) for the k pulls it takes (amortized),
never a scan of everything held: one queue with 20,000 held pulls used to cost
a pass over the queue's list per expiring pull (issue 11, item 5).

| index | key | used by |
|---|---|---|
| deadline heap | (deadline_ms, seq) | `expire`, `next_deadline_ms` |
| per queue, heap `any` | (pull_from_offset, seq) of pulls every tags code wakes (`*`, SQL92, none) | `notify`, `stale` |
| per queue, heap per tags code | (pull_from_offset, seq) of TAG subscriptions, once per code of their set | `notify` |
| per connection | seq -> pull | `drop_connection`, the per-connection bound |

A pull taken by one index stays in the others as garbage (`done`): a heap drops
it when it reaches the top, and a heap holding more garbage than twice its live
entries is rebuilt, so memory stays proportional to what is held.
"""
from __future__ import annotations

import enum
import heapq
import itertools
from dataclasses import dataclass


@dataclass(slots=True)
class HeldPull:
    conn: object
    request: object            # the RemotingCommand, replayed with the original opaque
    header: object             # decoded PullMessageRequestHeader
    subscription: object       # SubscriptionData used to filter wake-ups
    pull_from_offset: int
    deadline_ms: int
    seq: int = 0
    done: bool = False
    entries: int = 0           # how many queue-heap entries index it (one per tags code)


class HoldResult(enum.Enum):
    """What `hold` did; truthy only for HELD."""
    HELD = "held"
    TABLE_FULL = "table full"
    CONNECTION_FULL = "connection full"

    def __bool__(self) -> bool:
        return self is HoldResult.HELD


def _int32(code: int) -> int:
    # Consume-queue tag codes are sign-extended longs; subscriptions hold Java ints.
    return ((code + 2**31) % 2**32) - 2**31


def _wake_codes(sub) -> frozenset[int] | None:
    """The tags codes that wake a pull, or None when every code does (the same rule as
    SubscriptionData.matches_tags_code: `*` and SQL92 pass the tags stage)."""
    if sub is None or getattr(sub, "expression_type", None) != "TAG" or sub.is_all:
        return None
    # (a TAG set without codes cannot come from build_subscription; indexed as `any`, it
    # is replayed on the first new entry and answered by the pull's own filter)
    return frozenset(_int32(c) for c in sub.code_set) or None


class _Queue:
    __slots__ = ("live", "live_entries", "entries", "any", "by_code")

    def __init__(self):
        self.live = 0            # pulls held here and not yet taken
        self.live_entries = 0    # heap entries of those pulls
        self.entries = 0         # heap entries, garbage included
        self.any: list = []      # heap of (pull_from_offset, seq, pull)
        self.by_code: dict[int, list] = {}

    def add(self, p: HeldPull) -> None:
        entry = (p.pull_from_offset, p.seq, p)
        codes = _wake_codes(p.subscription)
        if codes is None:
            heapq.heappush(self.any, entry)
            p.entries = 1
        else:
            by_code = self.by_code
            for c in codes:
                h = by_code.get(c)
                if h is None:
                    by_code[c] = [entry]
                else:
                    heapq.heappush(h, entry)
            p.entries = len(codes)
        self.entries += p.entries
        self.live_entries += p.entries
        self.live += 1

    def pop_ready(self, heap: list, max_offset: int, out: list) -> None:
        """Move the pulls of `heap` below max_offset to out (marking them done)."""
        pop = heapq.heappop
        while heap and heap[0][0] < max_offset:
            p = pop(heap)[2]
            self.entries -= 1
            if not p.done:
                p.done = True
                out.append(p)

    def pop_code(self, code: int, max_offset: int, out: list) -> None:
        h = self.by_code.get(code)
        if h is not None:
            self.pop_ready(h, max_offset, out)
            if not h:
                del self.by_code[code]

    def pop_all_ready(self, max_offset: int, out: list) -> None:
        self.pop_ready(self.any, max_offset, out)
        for code in list(self.by_code):
            self.pop_code(code, max_offset, out)

    def live_pulls(self) -> list[HeldPull]:
        seen = {}
        for h in (self.any, *self.by_code.values()):
            for _, seq, p in h:
                if not p.done:
                    seen[seq] = p
        return [seen[s] for s in sorted(seen)]

    def rebuild(self) -> None:
        live = self.live_pulls()
        self.live = self.live_entries = self.entries = 0
        self.any = []
        self.by_code = {}
        for p in live:
            self.add(p)


class HeldPullTable:
    def __init__(self, held_max: int = 100_000, per_connection_max: int = 10_000):
        self.held_max = held_max
        self.per_connection_max = per_connection_max
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._by_conn: dict[object, dict[int, HeldPull]] = {}
        self._deadlines: list[tuple[int, int, HeldPull]] = []
        self._seq = itertools.count()
        self.count = 0

    # -- parking -----------------------------------------------------------------------
    def hold(self, pull: HeldPull) -> HoldResult:
        if self.count >= self.held_max:
            return HoldResult.TABLE_FULL
        mine = self._by_conn.get(pull.conn)
        if mine is None:
            mine = self._by_conn[pull.conn] = {}
        elif len(mine) >= self.per_connection_max:
            return HoldResult.CONNECTION_FULL
        pull.seq = seq = next(self._seq)
        pull.done = False
        mine[seq] = pull
        key = (pull.header.topic, pull.header.queue_id)
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = _Queue()
        q.add(pull)
        heapq.heappush(self._deadlines, (pull.deadline_ms, seq, pull))
        self.count += 1
        return HoldResult.HELD

    def held_by(self, conn) -> int:
        m = self._by_conn.get(conn)
        return 0 if m is None else len(m)

    def held_on(self, topic: str, queue_id: int) -> list[HeldPull]:
        """The pulls held on one queue, oldest first (for tests and diagnostics: O(n))."""
        q = self._queues.get((topic, queue_id))
        return [] if q is None else q.live_pulls()

    # -- taking ------------------------------------------------------------------------
    def _forget(self, taken: list[HeldPull], drop_conn_entries: bool = True) -> None:
        """Remove pulls already marked done from the counts, the connection index and
        their queues; compact what holds too much garbage."""
        queues, by_conn = self._queues, self._by_conn
        touched = set()
        for p in taken:
            if drop_conn_entries:
                m = by_conn.get(p.conn)
                if m is not None:
                    m.pop(p.seq, None)
                    if not m:
                        del by_conn[p.conn]
            key = (p.header.topic, p.header.queue_id)
            q = queues.get(key)
            if q is not None:
                q.live -= 1
                q.live_entries -= p.entries
                touched.add(key)
        self.count -= len(taken)
        for key in touched:
            q = queues[key]
            if q.live <= 0:
                del queues[key]          # its garbage goes with it
            elif q.entries > 2 * q.live_entries + 64:   # garbage outnumbers live entries
                q.rebuild()
        if len(self._deadlines) > 2 * self.count + 1024:
            self._deadlines = [e for e in self._deadlines if not e[2].done]
            heapq.heapify(self._deadlines)

    def notify(self, topic: str, queue_id: int, max_offset: int, tags_code: int | None) -> list[HeldPull]:
        """New entries up to `max_offset` exist (the last one with `tags_code`; None: any
        code); return the pulls to replay now."""
        q = self._queues.get((topic, queue_id))
        if q is None:
            return []
        out: list[HeldPull] = []
        q.pop_ready(q.any, max_offset, out)
        if tags_code is None:
            for code in list(q.by_code):
                q.pop_code(code, max_offset, out)
        elif q.by_code:
            q.pop_code(_int32(tags_code), max_offset, out)
        if out:
            self._forget(out)
        return out

    def expire(self, now_ms: int, limit: int | None = None) -> list[HeldPull]:
        """Pulls whose deadline is <= now_ms, earliest first, at most `limit`."""
        out: list[HeldPull] = []
        dl = self._deadlines
        pop = heapq.heappop
        room = len(dl) if limit is None else limit
        while dl and dl[0][0] <= now_ms and len(out) < room:
            p = pop(dl)[2]
            if not p.done:
                p.done = True
                out.append(p)
        if out:
            self._forget(out)
        return out

    def next_deadline_ms(self) -> int | None:
        dl = self._deadlines
        while dl and dl[0][2].done:
            heapq.heappop(dl)
        return dl[0][0] if dl else None

    def stale(self, max_offset_of) -> list[HeldPull]:
        """Safety net: pulls whose queue has grown past their offset (any tags code).
        One max-offset lookup per queue held on."""
        out: list[HeldPull] = []
        for key, q in list(self._queues.items()):
            q.pop_all_ready(max_offset_of(*key), out)
        if out:
            self._forget(out)
        return out

    def drop_connection(self, conn) -> int:
        """Forget the pulls of a closed connection (nothing to answer). Returns how many."""
        m = self._by_conn.pop(conn, None)
        if not m:
            return 0
        taken = list(m.values())
        for p in taken:
            p.done = True
        self._forget(taken, drop_conn_entries=False)
        return len(taken)

    def drain_all(self) -> list[HeldPull]:
        """Take every held pull, oldest first (shutdown)."""
        out = sorted((p for m in self._by_conn.values() for p in m.values()), key=lambda p: p.seq)
        for p in out:
            p.done = True
        self._queues.clear()
        self._by_conn.clear()
        self._deadlines.clear()
        self.count = 0
        return out
