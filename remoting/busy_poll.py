"""Adaptive busy polling: after activity, keep the event loop polling for a short window.

On this project's virtual machines an idle vCPU is halted, and waking it for the next
packet costs ~40 µs per hop (a blocking ping-pong measured 64 µs round trip, a spinning
one 20 µs). A request/response peer that answers and then blocks in epoll pays that on
every request. While a callback is scheduled with call_soon the loop polls with a zero
timeout instead of sleeping, so keeping one scheduled for `window_us` after the last
activity keeps the CPU awake exactly when the next request is likely. The cost is CPU
burnt during the window (at most window_us per activity burst), so it is a setting:
0 turns it off.

Busy polling must never hurt, and it can hurt a lot: when the peer shares our CPU
(client and broker on one core: a small container, a laptop under load) the peer can
only produce the next request while we are *not* running, so a spinning loop delays the
very thing it waits for until the scheduler preempts it (measured before this rule:
consume p99 44 ms on one shared core, against 0.5 ms with spare cores). Hence:

* **yield inside the spin, and stop when the yield gave the CPU away** (`yield_cpu`, on
  by default): every spin iteration calls os.sched_yield(). With nothing else runnable
  on our CPU it returns at once (~1 µs) and the spin keeps its gain. With a runnable
  peer on our CPU (the client we answered, a neighbour) that peer runs first; a yield
  that returns after SHARED_YIELD_S says so, and the window ends there (counted a
  miss): sharing a CPU, the peer's wake-up is cheap (the CPU is not halted) and every
  spin is time taken from it. This is the rule that makes one shared core work
  (docs/benchmarks.md, "Side by side").
* **a budget that learns whether spinning pays** (both modes): a window that ends
  without catching anything (no kick while it spun) is a miss. After MISS_LIMIT misses
  in a row the poller stops spinning and only probes one window every PROBE_EVERY kicks;
  a probe that catches something re-enables it. A peer whose requests come seldom, or
  whose answers take longer than the window, costs one window in PROBE_EVERY kicks.

Adaptive mode (servers) adds two rules on when a window starts: spinning only pays when
the next request is likely to come within the window. The mean gap between recent kicks
(an exponentially weighted average) decides: spin only while it is shorter than the
window. A peer that sends every 250 µs then costs nothing; a fast request/response peer
keeps the CPU awake. Nor does it spin after a read that took longer than half the window
to process (large batches, pipelined requests): such a peer has its next request on the
way already or is busy itself, and a spinning loop only takes CPU from it and from our
own flush thread (measured: batched sends 276k -> 306k msgs/s with spinning off on this
2-vCPU machine).

The client kicks when it sends a request with nothing else in flight (remoting.connection),
so "caught" there means the next lone request came within the window: a sync-send loop
whose round trips fit the window. Responses themselves are not kicks.
"""
from __future__ import annotations

import asyncio
import os
from time import perf_counter

# After this many windows in a row that caught nothing, stop spinning...
MISS_LIMIT = 8
# ...except for one probing window every this many kicks.
PROBE_EVERY = 64
# A sched_yield that returns later than this ran another task on our CPU (an empty yield
# is a syscall of ~1 µs; a task switch and back costs tens of µs at least).
SHARED_YIELD_S = 30e-6

_sched_yield = getattr(os, "sched_yield", None)
_INF = float("inf")


class BusyPoll:
    __slots__ = ("window_s", "adaptive", "yield_cpu", "_until", "_scheduled", "_loop", "_last", "_gap_avg",
                 "_caught", "_misses", "_skipped", "stats", "_long_work_s", "_gap_cap_s", "sharing")

    def __init__(self, window_us: int, adaptive: bool = False, yield_cpu: bool = True):
        self.window_s = max(0, window_us) / 1e6
        self.adaptive = adaptive
        # kick() runs once per answered read: its thresholds are computed once here
        self._long_work_s = 0.5 * self.window_s
        self._gap_cap_s = 10 * self.window_s
        self.yield_cpu = yield_cpu and _sched_yield is not None
        self._until = 0.0
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last = 0.0
        self._gap_avg = float("inf")
        self._caught = False        # a kick arrived while the current window was spinning
        self._misses = 0            # windows in a row that caught nothing
        self._skipped = 0           # kicks not spun for since spinning was suspended
        # windows started / that caught something / kicks passed over by the budget
        # and windows ended because a yield ran another task (a runnable peer on our CPU)
        self.stats = {"windows": 0, "caught": 0, "suspended_kicks": 0, "shared": 0}
        # What the last yield of a spin found (yield_cpu only): True when it ran another task,
        # a runnable peer on our CPU; False when it returned at once. Others ask it
        # (broker/services/index_pump.py: deferrable work is batched while the CPU is shared).
        # Unknown until a spin has yielded: taken as shared (the cautious answer).
        self.sharing = True

    @property
    def suspended(self) -> bool:
        """Spinning suspended by the budget (only probing windows run)."""
        return self._misses >= MISS_LIMIT

    def kick(self, work_s: float = 0.0) -> None:
        """Activity now: poll (do not sleep) until window_us from now. work_s: how long the
        activity took to process (adaptive mode does not spin after long work)."""
        if not self.window_s:
            return
        now = perf_counter()
        if self._scheduled:
            self._caught = True
        if self.adaptive:
            if work_s > self._long_work_s:
                self._last = now
                return
            gap = now - self._last
            if gap > self._gap_cap_s:
                gap = self._gap_cap_s
            self._last = now
            avg = self._gap_avg
            self._gap_avg = avg = gap if avg == _INF else 0.75 * avg + 0.25 * gap
            if avg >= self.window_s:
                return
        if not self._scheduled and self._misses >= MISS_LIMIT:
            self._skipped += 1
            if self._skipped < PROBE_EVERY:
                self.stats["suspended_kicks"] += 1
                return
            self._skipped = 0           # a probing window
        self._until = now + self.window_s
        if not self._scheduled:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
            self._scheduled = True
            self._caught = False
            self.stats["windows"] += 1
            self._loop.call_soon(self._spin)

    def _spin(self) -> None:
        now = perf_counter()
        if now < self._until:
            if not self.yield_cpu:
                self._loop.call_soon(self._spin)
                return
            _sched_yield()
            if perf_counter() - now < SHARED_YIELD_S:
                self.sharing = False
                self._loop.call_soon(self._spin)
                return
            self.sharing = True
            # The yield ran another task on our CPU: a runnable peer shares it, and every
            # spin would take its time. Sleep in epoll instead, and count the window a miss.
            self.stats["shared"] += 1
            self._caught = False
        self._scheduled = False
        if self._caught:
            self._misses = 0
            self._skipped = 0
            self.stats["caught"] += 1
        else:
            self._misses += 1
