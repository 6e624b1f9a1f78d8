"""The console's long-running reads: the live tail (a topic's new messages, read by offset
with held pulls, nothing committed) and the content search (a bounded scan with progress
and cancel). Both are bounded: a tail holds at most TAIL_BUFFER messages between the pulls
and the page (the pulls wait when it is full), at most MAX_TAILS run at once; at most
MAX_SEARCHES searches run at once and the last KEEP_SEARCHES are kept for their pages.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict

from pocketmq.client.api import PullResult
from pocketmq.console import logic
from pocketmq.console.data import PULL_BATCH, Cluster
from pocketmq.tools.mqadmin.errors import AdminError

log = logging.getLogger("pocketmq.console")

TAIL_BUFFER = 1000
MAX_TAILS = 16
TAIL_HOLD_MS = 5000          # a held pull answers within this when nothing arrives
MAX_SEARCHES = 4
KEEP_SEARCHES = 32


class Busy(Exception):
    """Too many tails or searches running: the page says so (503)."""


def message_event(m) -> dict:
    body = logic.body_views(m.body, 2048)
    return {"broker": m.broker_name, "queue": m.queue_id, "offset": m.queue_offset, "msg_id": m.msg_id,
            "tags": m.tags or "", "keys": " ".join(m.keys), "time": logic.format_ms(m.store_timestamp),
            "body": body["text"], "size": body["size"], "commit_log_offset": m.commit_log_offset,
            "store_host": m.store_host}


def parse_positions(text: str | None) -> dict[tuple[str, int], int]:
    """`broker:queue:offset,...` (the page's resume point) -> {(broker, queue): offset}."""
    out = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        try:
            broker, q, off = part.strip().rsplit(":", 2)
            out[(broker, int(q))] = int(off)
        except ValueError:
            raise ValueError(f"bad resume position {part!r}: expected broker:queue:offset") from None
    return out


class Tails:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.running = 0

    async def stream(self, topic: str, expression: str, expression_type: str, start: dict):
        """Async iterator of ("start", {"broker:queue": offset}) once, then ("msg", event) and
        ("error", text) for the topic's new messages
        from `start` ({(broker, queue): offset}; queues not named start at their end)."""
        if self.running >= MAX_TAILS:
            raise Busy(f"{MAX_TAILS} live tails are running; close one and retry")
        self.running += 1
        try:
            ranges = await self.cluster.queue_ranges(topic, None, None)
            buf: asyncio.Queue = asyncio.Queue(TAIL_BUFFER)
            # where each queue starts: the page resumes from here after a pause (a queue that
            # got nothing since must not jump to its end, past what came during the pause)
            yield ("start", {f"{r.broker_name}:{r.queue_id}": start.get((r.broker_name, r.queue_id), r.stop)
                             for r, _ in ranges})

            async def follow(r, addr):
                off = start.get((r.broker_name, r.queue_id), r.stop)
                while True:
                    try:
                        res = await self.cluster.pull(addr, topic, r, off, PULL_BATCH, expression, expression_type,
                                                      suspend_ms=TAIL_HOLD_MS, timeout_s=TAIL_HOLD_MS / 1000 + 5)
                    except AdminError as e:
                        await buf.put(("error", str(e)))
                        await asyncio.sleep(1.0)        # an unreachable broker: retry, not spin
                        continue
                    if res.status == PullResult.FOUND:
                        for m in res.records:
                            await buf.put(("msg", message_event(m)))
                    elif res.status == PullResult.OFFSET_ILLEGAL:
                        await buf.put(("error", f"{r.broker_name} queue {r.queue_id}: offset {off} out of "
                                                f"range, following from {res.next_begin_offset}"))
                    off = max(off, res.next_begin_offset)

            tasks = [asyncio.ensure_future(follow(r, addr)) for r, addr in ranges]
            try:
                while True:
                    yield await buf.get()
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self.running -= 1


class Search:
    """One content search: state read by its page while it runs."""

    def __init__(self, sid: str, topic: str, needle: str, prop_key: str | None, plan: list, cut: bool):
        self.id = sid
        self.topic = topic
        self.needle = needle
        self.prop_key = prop_key
        self.plan = plan
        self.cut = cut
        self.total = logic.scan_total(plan)
        self.scanned = 0
        self.hits: list = []
        self.state = "running"      # running, done, cancelled, failed, hit limit
        self.error = ""
        self.task: asyncio.Task | None = None
        self.begin_ms: int | None = None
        self.end_ms: int | None = None

    @property
    def percent(self) -> int:
        return 100 if not self.total else min(100, self.scanned * 100 // self.total)


class Searches:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.jobs: OrderedDict[str, Search] = OrderedDict()
        self._ids = itertools.count(1)

    def get(self, sid: str) -> Search | None:
        return self.jobs.get(sid)

    async def start(self, topic: str, needle: str, prop_key: str | None, begin_ms: int | None, end_ms: int | None,
                    limit: int) -> Search:
        if not needle:
            raise ValueError("nothing to search for")
        if sum(1 for j in self.jobs.values() if j.state == "running") >= MAX_SEARCHES:
            raise Busy(f"{MAX_SEARCHES} searches are running; wait or cancel one")
        ranges = await self.cluster.queue_ranges(topic, begin_ms, end_ms)
        addrs = {r.broker_name: a for r, a in ranges}
        plan, cut = logic.scan_plan([r for r, _ in ranges], limit)
        job = Search(f"{next(self._ids)}", topic, needle, prop_key, plan, cut)
        job.begin_ms, job.end_ms = begin_ms, end_ms
        self.jobs[job.id] = job
        while len(self.jobs) > KEEP_SEARCHES:
            old = next(iter(self.jobs.values()))
            if old.task is not None:
                old.task.cancel()
            self.jobs.popitem(last=False)
        job.task = asyncio.ensure_future(self._run(job, addrs))
        return job

    def cancel(self, sid: str) -> bool:
        job = self.jobs.get(sid)
        if job is None or job.state != "running" or job.task is None:
            return False
        job.task.cancel()
        job.state = "cancelled"
        return True

    async def _run(self, job: Search, addrs: dict) -> None:
        try:
            for r in job.plan:
                off = r.first
                while off < r.stop:
                    res = await self.cluster.pull(addrs[r.broker_name], job.topic, r, off,
                                                  min(PULL_BATCH, r.stop - off))
                    if res.status != PullResult.FOUND:
                        if res.next_begin_offset <= off:
                            break
                        job.scanned += min(res.next_begin_offset, r.stop) - off
                        off = res.next_begin_offset
                        continue
                    for m in res.records:
                        if m.queue_offset >= r.stop:
                            break
                        job.scanned += 1
                        if logic.in_time_range(m.store_timestamp, job.begin_ms, job.end_ms) and \
                                logic.message_matches(m.body, m.properties, job.needle, job.prop_key):
                            job.hits.append(message_event(m))
                            if len(job.hits) >= logic.MAX_SCAN_HITS:
                                job.state = "hit limit"
                                return
                    # offsets the pull skipped (none in a plain topic) count as scanned too
                    job.scanned += max(0, min(res.next_begin_offset, r.stop) - off - len(res.records))
                    off = res.next_begin_offset
            job.state = "done"
        except asyncio.CancelledError:
            job.state = "cancelled"
        except AdminError as e:
            job.state, job.error = "failed", str(e)
        except Exception as e:     # a search must end with a state its page shows
            log.exception("console: search %s failed", job.id)
            job.state, job.error = "failed", f"{type(e).__name__}: {e}"
