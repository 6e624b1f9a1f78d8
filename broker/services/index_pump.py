"""The message index built right behind the dispatcher, on the event loop (IndexPump).

The store's index (broker/store/index.py) is derived data: the flush thread walks
what the dispatcher has passed once a second, at most indexBuildBatchNums records
a pass. Alone, that lets the index lag under load by whole seconds of messages, and
the work of indexing them lands later on whatever the broker does then: measured, a
consumer reading a topic just filled paid ~5 µs of broker CPU per message for the
fill's index (13.1 against 7.7 µs per message once the index had caught up), and
the flush thread took the GIL from the loop in 64-record slices while it worked.

So the loop indexes as it dispatches, like Java's reput thread (whose dispatchers
build the index per message): after a dispatch, once `backlog_bytes` of commit log
wait to be indexed (any at all while the broker has its CPU to itself, as its busy
poll finds: `backlog_bytes_alone`; 128 KiB in sub-steps of 1,024 records while a peer
shares it: `backlog_bytes_sharing`), a step runs as a loop callback (after the replies of the current
read are written, between reads): sub-steps of `step_records` records until less than
that waits, so each loop turn indexes what the previous one dispatched; only a backlog
longer than `step_budget_s` (10 ms) of work is spread over several turns. The cost of indexing a
message is then paid by the broker while it stores such messages, and the tail
below `backlog_bytes` is left to the flush thread's pass and to queries (which catch
up first). A long catch-up (after a stall) is spread over loop turns so requests
interleave with it instead of waiting behind it; no lock is held across steps.

On a slave that is behind its master (`hold`: HASlave.behind), the pump leaves the index
alone: on one host a slave that also indexes everything it copies costs about what its
master costs a message, and falls further behind the master's ingest the longer it lasts
(bench_replication, docs/benchmarks.md); copying comes first. The flush thread's pass and
queries go on indexing, and the slave kicks the pump when it has caught up.
"""
from __future__ import annotations

import asyncio
import logging
from time import perf_counter

log = logging.getLogger("pocketmq.broker.index")


class IndexPump:
    # Records per sub-step: enough to amortise its fixed cost (~20 µs measured: the index
    # lock, the segment lookup, the column passes' setup); the budget below bounds how long
    # a request waits behind a step. (A batch's IndexHint is taken whole, over this bound.)
    step_records = 32
    # Start stepping once this much commit log waits: sync sends index in groups of
    # about this size instead of one record per step (a step's fixed cost is ~20 µs). Not
    # more: the request that arrives while a step runs waits for it, one sync send in
    # every group. At 8 KiB (~25 records of 128 B, a ~90 µs step) the sync p99 was
    # 231-243 µs in three runs against 151-210 at 1-4 KiB (`bench_client --phases sync
    # --pin split`, docs/benchmarks.md "The index pump's step size").
    backlog_bytes = 4096
    # ...but while the broker has its CPU to itself (its busy poll's yields return at once:
    # no runnable peer shares the CPU) a step runs after every dispatch: one or two records,
    # the store's few-records path (~4-8 µs, store/index.py `_index_few`), done while the
    # client prepares its next request, so no request waits behind a group's step.
    # Measured, sync sends with --pin split, three interleaved pairs: p99 114-145 µs against
    # 147-174 at 4 KiB, 17.2-17.9k sends/s against 14.2-16.3k; with one shared core the same
    # per-dispatch steps cost 11% of the sync rate (each step's code runs cold there), hence
    # the groups (docs/benchmarks.md, "A few records at a time"). Under load a dispatch
    # covers what a loop turn stored, so the steps grow with it on their own.
    backlog_bytes_alone = 1
    # ...and while a runnable peer shares its CPU (the busy poll's yields run someone else:
    # a client on the same core), larger groups in larger sub-steps. There every step runs
    # with its code and data evicted by the peer's turn, and on this host's VM a cache or
    # TLB miss costs ~0.5-2 µs (a random 4-byte read of a 20 MB mapping, measured), so a
    # step's fixed cost, not its records, dominated: in 4 KiB groups of 32-record sub-steps
    # the index cost sync sends of 128 B 11-13 µs of broker CPU each on one core (160 µs a
    # ~12-record step). With these groups, one core, medians of five alternating pairs in
    # each of two sessions' runs: sync 68.1 -> 65.8 and 75.2 -> 62.0 µs of broker CPU a send,
    # 64 in flight 9.95 -> 9.22 and 10.68 -> 9.12 µs a message (docs/benchmarks.md, "The
    # index pump while a CPU is shared"; the flag flips on one core, so some steps still run
    # in the CPU-alone mode). Requests wait behind fewer
    # steps (one sync send in ~400 of 128 B instead of one in ~12), each longer (a few ms;
    # the step budget below still ends a callback: a sub-step over step_records is sized by
    # the last one's time a record to fit what is left of it).
    backlog_bytes_sharing = 128 * 1024
    step_records_sharing = 1024
    # One loop callback indexes what the loop dispatched before it, but for at most this
    # long (then yields a turn to the sockets): only a backlog left by something else (the
    # flush thread behind, a long stall) takes more than one callback.
    step_budget_s = 0.010

    def __init__(self, store, busy_poll=None, hold=None) -> None:
        self.store = store
        # a callable, True while the pump should leave the backlog alone (a slave behind its
        # master: replication first; the flush thread's pass and queries still index, and
        # the slave kicks the pump once it has caught up). None: never.
        self.hold = hold
        # the server's BusyPoll (remoting/busy_poll.py), whose `sharing` says whether a
        # runnable peer shares our CPU; None (busy polling off): groups always
        self.busy_poll = busy_poll
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False
        self._closed = False
        self.steps = 0              # steps run (tests, stats)
        self.records = 0            # records walked by them
        self._record_cost_s = 0.0   # the last sub-step's time a record (0: not measured yet)

    def _mode(self) -> tuple[int, int]:
        """(backlog bytes a step waits for, records a sub-step) as the busy poll finds the
        CPU: its own, shared with a runnable peer, or unknown (no busy poll: 4 KiB groups)."""
        bp = self.busy_poll
        if bp is None:
            return self.backlog_bytes, self.step_records
        if bp.sharing:
            return self.backlog_bytes_sharing, self.step_records_sharing
        return self.backlog_bytes_alone, self.step_records

    def kick(self) -> None:
        """Called after a dispatch (on the loop): schedule a step if enough waits."""
        if self._scheduled or self._closed or (self.hold is not None and self.hold()):
            return
        if self.store.index_backlog_bytes() < self._mode()[0]:
            return
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._scheduled = True
        self._loop.call_soon(self._step)

    def _step(self) -> None:
        """Index sub-steps of step_records until the backlog is under backlog_bytes (all
        that was dispatched before this callback) or step_budget_s has passed; then, if
        still behind, again on the next loop turn. Not a fixed amount per turn: with several
        batches in flight one loop turn dispatches hundreds of records (8 x 64 measured),
        and 32 records a turn, or 2 ms, fell behind."""
        self._scheduled = False
        if self._closed:
            return
        store = self.store
        threshold, step_max = self._mode()
        now = perf_counter()
        deadline = now + self.step_budget_s
        small = self.step_records
        while True:
            step = step_max
            if step_max > small:
                # Sub-steps larger than step_records (the shared mode) only as far as the
                # measured cost a record lets one fit the time left: a record's cost grows with
                # its keys (1,024 records of 100 KEYS each took ~100 ms in one call), and the
                # budget is checked between sub-steps only. Unmeasured yet: step_records.
                cost = self._record_cost_s
                step = small if cost <= 0 else max(small, min(step_max, int((deadline - now) / cost)))
            try:
                n = store.index_some(step)
            except Exception:       # a closed or failed store: the flush pass and queries decide
                log.exception("message index step failed")
                return
            t = perf_counter()
            if n > 0:
                self._record_cost_s = (t - now) / n
            now = t
            self.steps += 1
            self.records += n
            if not n or store.index_backlog_bytes() < threshold:
                return
            if self.hold is not None and self.hold():
                return
            if now >= deadline:
                break
        if not self._closed:
            self._scheduled = True
            self._loop.call_soon(self._step)

    def close(self) -> None:
        self._closed = True
