"""The held-pull table's indexes (broker/core/held_pulls.py): every operation touches only
the pulls it takes, a bound per connection and in all, garbage compacted."""
from __future__ import annotations

import random
from types import SimpleNamespace

from pocketmq.broker.core.held_pulls import HeldPull, HeldPullTable, HoldResult
from pocketmq.protocol.bodies import build_subscription
from pocketmq.protocol.message import tags_code


def held(topic="T", qid=0, offset=0, deadline=100, sub="*", conn="c"):
    h = SimpleNamespace(topic=topic, queue_id=qid)
    return HeldPull(conn, None, h, None if sub is None else build_subscription(topic, sub), offset, deadline)


def test_hold_says_which_bound_refused():
    t = HeldPullTable(held_max=3, per_connection_max=2)
    assert t.hold(held(conn="a")) is HoldResult.HELD
    assert t.hold(held(conn="a")) is HoldResult.HELD
    r = t.hold(held(conn="a"))
    assert r is HoldResult.CONNECTION_FULL and not r
    assert t.hold(held(conn="b")) is HoldResult.HELD
    assert t.hold(held(conn="c")) is HoldResult.TABLE_FULL
    assert t.held_by("a") == 2 and t.held_by("b") == 1 and t.count == 3
    # a connection's room comes back when its pulls are answered
    assert len(t.expire(100, limit=1)) == 1 and t.held_by("a") == 1
    assert t.hold(held(conn="a")) is HoldResult.HELD


def test_expire_takes_at_most_limit_in_deadline_order():
    t = HeldPullTable()
    pulls = [held(deadline=d) for d in (50, 10, 40, 20, 30)]
    for p in pulls:
        t.hold(p)
    first = t.expire(45, limit=2)
    assert [p.deadline_ms for p in first] == [10, 20]
    assert [p.deadline_ms for p in t.expire(45, limit=10)] == [30, 40]
    assert t.count == 1 and t.next_deadline_ms() == 50
    assert all(p.done for p in first)


def test_notify_wakes_only_pulls_below_the_new_max_offset_and_with_the_tag():
    t = HeldPullTable()
    a = held(offset=5, sub="A || B")
    b = held(offset=5, sub="B")
    star = held(offset=5, sub="*")
    later = held(offset=9, sub="*")
    sql = held(offset=5, sub=None)
    sql.subscription = build_subscription("T", "a > 1", "SQL92")
    for p in (a, b, star, later, sql):
        t.hold(p)
    assert t.notify("T", 0, 5, tags_code("A")) == []               # nothing new for offset 5
    woken = t.notify("T", 0, 6, tags_code("A"))
    assert set(map(id, woken)) == {id(a), id(star), id(sql)}
    assert t.notify("T", 0, 6, tags_code("A")) == []               # taken once
    assert t.notify("T", 0, 7, tags_code("B")) == [b]
    assert t.notify("T", 0, 10, None) == [later]                    # None: any code
    assert t.count == 0 and t.held_on("T", 0) == []


def test_a_pull_woken_through_one_tag_is_gone_from_its_other_tags():
    t = HeldPullTable()
    p = held(offset=0, sub="A || B || C")
    t.hold(p)
    assert t.notify("T", 0, 1, tags_code("B")) == [p]
    assert t.notify("T", 0, 2, tags_code("A")) == [] and t.notify("T", 0, 2, tags_code("C")) == []
    assert t.expire(10**9) == [] and t.stale(lambda *_: 10**9) == []


def test_tag_codes_from_the_consume_queue_are_sign_extended_longs():
    t = HeldPullTable()
    tag = next(s for s in (f"tag{i}" for i in range(1000)) if tags_code(s) < 0)
    p = held(sub=tag)
    t.hold(p)
    assert t.notify("T", 0, 1, tags_code(tag) + 2**64 if tags_code(tag) < 0 else tags_code(tag)) == [p]


def test_drop_connection_takes_only_that_connections_pulls():
    t = HeldPullTable()
    mine = [held(conn="x", qid=q % 3) for q in range(30)]
    others = [held(conn="y", qid=q % 3) for q in range(5)]
    for p in mine + others:
        t.hold(p)
    assert t.drop_connection("x") == 30 and t.drop_connection("x") == 0
    assert t.count == 5 and t.held_by("x") == 0
    assert sorted(p.seq for p in t.expire(10**9)) == sorted(p.seq for p in others)


def test_stale_rescan_takes_pulls_behind_their_queue():
    t = HeldPullTable()
    p0, p1 = held(qid=0, offset=3, sub="A"), held(qid=1, offset=3)
    t.hold(p0)
    t.hold(p1)
    maxes = {0: 4, 1: 3}
    assert t.stale(lambda topic, q: maxes[q]) == [p0]
    assert t.held_on("T", 1) == [p1]


def test_drain_all_answers_every_pull_oldest_first():
    t = HeldPullTable()
    pulls = [held(conn=c, qid=q) for c in "ab" for q in range(3)]
    for p in pulls:
        t.hold(p)
    assert t.drain_all() == pulls
    assert t.count == 0 and t.next_deadline_ms() is None and t.held_by("a") == 0


def test_garbage_left_in_the_indexes_stays_proportional_to_what_is_held():
    # Pulls leave by expiry, wake-up and connection close in any order; the heaps must
    # not keep every pull ever held.
    rng = random.Random(7)
    t = HeldPullTable(held_max=10**9, per_connection_max=10**9)
    now = 0
    live = {}
    for step in range(20_000):
        now += 1
        conn = rng.randrange(20)
        p = held(conn=conn, qid=rng.randrange(4), offset=now, deadline=now + rng.randrange(1, 500),
                 sub=rng.choice(["*", "A", "A || B", "C"]))
        t.hold(p)
        live[p.seq] = p
        r = rng.random()
        if r < 0.05:
            for q in t.notify("T", rng.randrange(4), now, tags_code(rng.choice("ABC"))):
                live.pop(q.seq)
        elif r < 0.06:
            t.drop_connection(rng.randrange(20))
            live = {s: q for s, q in live.items() if not q.done}
        for q in t.expire(now):
            live.pop(q.seq)
        assert t.count == len(live)
    entries = len(t._deadlines) + sum(q.entries for q in t._queues.values())
    assert entries <= 4 * (t.count * 2) + 1024 + 4 * 64
    assert sorted(p.seq for p in t.drain_all()) == sorted(live)


def test_taking_20000_pulls_from_one_queue_costs_heap_steps_per_pull(monkeypatch):
    # The old table scanned the queue's list once per expiring pull (2*10^8 steps for
    # 20,000) and every list once per closed connection. Count the heap steps and the
    # compactions instead of timing: both must stay proportional to the pulls taken.
    import heapq as real_heapq

    from pocketmq.broker.core import held_pulls as mod
    steps = {"push": 0, "pop": 0, "heapify": 0, "rebuild": 0}

    class CountingHeapq:
        @staticmethod
        def heappush(h, e):
            steps["push"] += 1
            real_heapq.heappush(h, e)

        @staticmethod
        def heappop(h):
            steps["pop"] += 1
            return real_heapq.heappop(h)

        @staticmethod
        def heapify(h):
            steps["heapify"] += len(h)
            real_heapq.heapify(h)
    monkeypatch.setattr(mod, "heapq", CountingHeapq)
    real_rebuild = mod._Queue.rebuild

    def rebuild(q):
        steps["rebuild"] += q.entries
        real_rebuild(q)
    monkeypatch.setattr(mod._Queue, "rebuild", rebuild)
    n = 20_000
    t = HeldPullTable(per_connection_max=n)
    for i in range(n):
        t.hold(held(deadline=3000 + i % 7, conn="one"))
    for i in range(n):          # and 2,000 connections holding 10 pulls each
        t.hold(held(qid=1, deadline=10**9, conn=i % 2000))
    taken = 0
    while batch := t.expire(10_000, limit=256):
        taken += len(batch)
    for c in range(2000):
        taken += t.drop_connection(c)
    assert taken == 2 * n and t.count == 0 and t.held_on("T", 0) == []
    assert sum(steps.values()) <= 8 * 2 * n, steps
