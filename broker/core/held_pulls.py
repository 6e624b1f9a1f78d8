"""Held pulls for long polling (pure; the shell owns timers and sockets).

A PULL that finds no new message and carries FLAG_SUSPEND is parked under
`topic@queueId` until (a) the reput dispatcher reports a new entry in that
queue that the pull's subscription accepts (`notify`), or (b) its suspend
time runs out (`expire`). The shell sleeps until `next_deadline_ms()`, so a
held pull is answered at its deadline rather than on a 5 s tick; a periodic
rescan against the queue max offsets (`stale`) is the safety net for a missed
notification. Bound: `held_max` parked pulls; the caller answers SYSTEM_BUSY
beyond it.
"""
from __future__ import annotations

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


class HeldPullTable:
    def __init__(self, held_max: int = 100_000):
        self.held_max = held_max
        self.by_queue: dict[tuple[str, int], list[HeldPull]] = {}
        self._deadlines: list[tuple[int, int, HeldPull]] = []
        self._seq = itertools.count()
        self.count = 0

    def hold(self, pull: HeldPull) -> bool:
        if self.count >= self.held_max:
            return False
        pull.seq = next(self._seq)
        key = (pull.header.topic, pull.header.queue_id)
        self.by_queue.setdefault(key, []).append(pull)
        heapq.heappush(self._deadlines, (pull.deadline_ms, pull.seq, pull))
        self.count += 1
        return True

    def _take(self, key, pred) -> list[HeldPull]:
        lst = self.by_queue.get(key)
        if not lst:
            return []
        out, keep = [], []
        for p in lst:
            (out if pred(p) else keep).append(p)
        if keep:
            self.by_queue[key] = keep
        else:
            del self.by_queue[key]
        for p in out:
            p.done = True
        self.count -= len(out)
        if out and len(self._deadlines) > 2 * self.count + 1024:
            # Woken pulls linger in the deadline heap until they reach its top; rebuild it
            # so it stays proportional to what is really held.
            self._deadlines = [e for e in self._deadlines if not e[2].done]
            heapq.heapify(self._deadlines)
        return out

    def notify(self, topic: str, queue_id: int, max_offset: int, tags_code: int | None) -> list[HeldPull]:
        """New entries up to `max_offset` exist; return the pulls to replay now."""
        def ready(p: HeldPull) -> bool:
            if p.pull_from_offset >= max_offset:
                return False
            if tags_code is None or p.subscription is None:
                return True
            return p.subscription.matches_tags_code(tags_code)
        return self._take((topic, queue_id), ready)

    def expire(self, now_ms: int) -> list[HeldPull]:
        out = []
        dl = self._deadlines
        while dl and dl[0][0] <= now_ms:
            _, _, p = heapq.heappop(dl)
            if p.done:
                continue
            key = (p.header.topic, p.header.queue_id)
            out.extend(self._take(key, lambda q, p=p: q is p))
        return out

    def next_deadline_ms(self) -> int | None:
        dl = self._deadlines
        while dl and dl[0][2].done:
            heapq.heappop(dl)
        return dl[0][0] if dl else None

    def stale(self, max_offset_of) -> list[HeldPull]:
        """Safety net: pulls whose queue has grown past their offset."""
        out = []
        for key in list(self.by_queue):
            mx = max_offset_of(*key)
            out.extend(self._take(key, lambda p: p.pull_from_offset < mx))
        return out

    def drop_connection(self, conn) -> int:
        n = 0
        for key in list(self.by_queue):
            n += len(self._take(key, lambda p: p.conn is conn))
        return n

    def drain_all(self) -> list[HeldPull]:
        out = []
        for key in list(self.by_queue):
            out.extend(self._take(key, lambda p: True))
        return out
