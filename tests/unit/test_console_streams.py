"""The console's content search and live tail (console/streams.py) over a fake cluster in
memory: the scan's bound, progress, hit limit and cancel; the tail's start positions, resume
and the bound on running tails. No sockets, no sleeps: pulls wait on events."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("starlette", reason="the console extra is not installed")

from pocketmq.client.api import PullResult  # noqa: E402
from pocketmq.console import logic, streams  # noqa: E402
from pocketmq.protocol.message import MessageExt  # noqa: E402


class FakeCluster:
    """Two queues of `n` messages each; message i of queue q has body b"q{q}-{i}"."""

    def __init__(self, n: int = 100, batch: int = 32):
        self.n = n
        self.batch = batch
        self.pulled = 0
        self.gate: asyncio.Event | None = None       # set: pulls go on; cleared: they wait
        self.appended: dict[int, asyncio.Event] = {0: asyncio.Event(), 1: asyncio.Event()}
        self.extra: dict[int, list] = {0: [], 1: []}

    async def queue_ranges(self, topic, begin_ms, end_ms):
        return [(logic.ScanRange("b", q, 0, self.n), "addr") for q in (0, 1)]

    def _msg(self, q: int, i: int, body: bytes) -> MessageExt:
        return MessageExt("T", body, q, i, "b", {"idx": str(i)}, store_timestamp=1000 + i, store_host="127.0.0.1:1",
                          commit_log_offset=q * 10**6 + i)

    async def pull(self, addr, topic, r, offset, n, expression="*", expression_type="TAG", suspend_ms=0,
                   timeout_s=None):
        if self.gate is not None:
            await self.gate.wait()
        q = r.queue_id
        if offset >= self.n:                       # the tail: wait for an appended message
            k = offset - self.n
            while k >= len(self.extra[q]):
                self.appended[q].clear()
                await self.appended[q].wait()
            m = self.extra[q][k]
            return PullResult(PullResult.FOUND, offset + 1, 0, offset + 1, [m])
        stop = min(self.n, offset + min(n, self.batch))
        self.pulled += stop - offset
        return PullResult(PullResult.FOUND, stop, 0, self.n,
                          [self._msg(q, i, f"q{q}-{i}".encode()) for i in range(offset, stop)])

    def append(self, q: int, body: bytes) -> None:
        self.extra[q].append(self._msg(q, self.n + len(self.extra[q]), body))
        self.appended[q].set()


async def _finish(job):
    await asyncio.gather(job.task, return_exceptions=True)


async def test_search_reads_only_its_budget_newest_first():
    c = FakeCluster(n=100)
    s = streams.Searches(c)
    job = await s.start("T", "q1-9", None, None, None, limit=20)
    await _finish(job)
    assert job.state == "done" and job.total == 20 and job.scanned == 20 and c.pulled == 20
    assert job.cut and job.percent == 100
    # each queue's newest 10 (90..99): q1-9 itself is not among them, q1-90..q1-99 contain "q1-9"
    assert sorted(h["body"] for h in job.hits) == [f"q1-9{i}" for i in range(10)]


async def test_search_by_property_and_time_range():
    c = FakeCluster(n=50)
    s = streams.Searches(c)
    job = await s.start("T", "7", "idx", 1000 + 5, 1000 + 30, limit=1000)
    await _finish(job)
    assert job.state == "done" and not job.cut
    assert sorted((h["queue"], h["offset"]) for h in job.hits) == [(0, 7), (1, 7)]


async def test_search_stops_at_the_hit_limit():
    c = FakeCluster(n=1000)
    s = streams.Searches(c)
    job = await s.start("T", "q", None, None, None, limit=2000)
    await _finish(job)
    assert job.state == "hit limit" and len(job.hits) == logic.MAX_SCAN_HITS
    assert job.scanned == logic.MAX_SCAN_HITS          # every message matches: it stopped at once


async def test_search_cancel_and_the_running_bound():
    c = FakeCluster(n=100)
    c.gate = asyncio.Event()           # every pull waits: the searches stay running
    s = streams.Searches(c)
    jobs = [await s.start("T", "x", None, None, None, limit=100) for _ in range(streams.MAX_SEARCHES)]
    with pytest.raises(streams.Busy):
        await s.start("T", "x", None, None, None, limit=100)
    assert s.cancel(jobs[0].id) and jobs[0].state == "cancelled"
    await _finish(jobs[0])
    assert jobs[0].state == "cancelled" and jobs[0].scanned == 0
    assert not s.cancel(jobs[0].id) and not s.cancel("nope")
    more = await s.start("T", "x", None, None, None, limit=100)        # room again
    c.gate.set()
    for j in jobs[1:] + [more]:
        await _finish(j)
        assert j.state == "done"
    with pytest.raises(ValueError):
        await s.start("T", "", None, None, None, limit=100)


async def test_tail_starts_at_the_end_and_resumes_from_positions():
    c = FakeCluster(n=10)
    tails = streams.Tails(c)
    gen = tails.stream("T", "*", "TAG", {})
    kind, start = await gen.__anext__()
    assert (kind, start) == ("start", {"b:0": 10, "b:1": 10})
    c.append(1, b"new")
    kind, ev = await gen.__anext__()
    assert kind == "msg" and (ev["queue"], ev["offset"], ev["body"]) == (1, 10, "new")
    await gen.aclose()
    assert tails.running == 0
    # resume from queue 1's next offset: what came meanwhile, nothing twice
    c.append(1, b"while paused")
    gen = tails.stream("T", "*", "TAG", streams.parse_positions("b:1:11"))
    assert (await gen.__anext__())[1] == {"b:0": 10, "b:1": 11}
    kind, ev = await gen.__anext__()
    assert ev["body"] == "while paused" and ev["offset"] == 11
    await gen.aclose()


async def test_tails_are_bounded():
    c = FakeCluster(n=1)
    tails = streams.Tails(c)
    gens = [tails.stream("T", "*", "TAG", {}) for _ in range(streams.MAX_TAILS)]
    for g in gens:
        await g.__anext__()
    with pytest.raises(streams.Busy):
        await tails.stream("T", "*", "TAG", {}).__anext__()
    for g in gens:
        await g.aclose()
    assert tails.running == 0


def test_parse_positions():
    assert streams.parse_positions("broker-a:0:5,broker-b:3:17") == {("broker-a", 0): 5, ("broker-b", 3): 17}
    assert streams.parse_positions("") == {} and streams.parse_positions(None) == {}
    with pytest.raises(ValueError, match="bad resume position"):
        streams.parse_positions("broker-a:x:5")
