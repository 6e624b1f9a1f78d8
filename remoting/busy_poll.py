"""Adaptive busy polling: after activity, keep the event loop polling for a short window.

On this project's virtual machines an idle vCPU is halted, and waking it for the next
packet costs ~40 µs per hop (a blocking ping-pong measured 64 µs round trip, a spinning
one 20 µs). A request/response peer that answers and then blocks in epoll pays that on
every request. While a callback is scheduled with call_soon the loop polls with a zero
timeout instead of sleeping, so keeping one scheduled for a window after the last
activity keeps the CPU awake exactly when the next request is likely. The cost is CPU
burnt during the window (at most `window_us`, the cap, per activity burst), so it is a
setting: 0 turns it off.

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
* **a budget that learns whether spinning pays**: a window that ends
  without catching anything (no kick while it spun) is a miss. After MISS_LIMIT misses
  in a row the poller stops spinning and only probes one window every PROBE_EVERY kicks;
  a probe that catches something re-enables it. A peer whose requests come seldom, or
  whose answers take longer than the window, costs one window in PROBE_EVERY kicks.

**The window follows the host** (both sides): how long to spin is not a constant but
WINDOW_PER_GAP times the measured gap between kicks (an exponentially weighted average:
for a sync-send loop, the host's whole round trip), or the average plus DEV_FACTOR mean
deviations where the gaps spread wider, capped by `window_us`, the setting:
the longest the loop will spin for one burst. Whether to spin at all is decided by the
budget above, i.e. by whether spins catch the next kick. An earlier rule compared the
gap and each read's processing time with absolute thresholds (gap < 200 µs, read < 100
µs): on a host whose round trip sat near them (120-300 µs) whether spinning engaged
decided the run, and since spinning shortens the round trip by the two wake-ups, both
states were stable (sync sends at 4.4-5.4k/s or 7.7k/s on the same setup, issue 35). Now
a peer whose round trip fits the cap is caught whichever state the loop starts in: a
non-spinning loop's probe window is sized by the slow gap it measured, catches, and
spinning resumes. Only round trips near the cap itself can still settle either way, and
there the two wake-ups spinning saves are a small share of the cycle.

The client kicks when it sends a request with nothing else in flight (remoting.connection),
so "caught" there means the next lone request came within the window: a sync-send loop
whose round trips fit the window. Responses themselves are not kicks. The server kicks
after a read that answered something; its gap is the same round trip seen from the other
end.
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
# The window is this many times the average gap between kicks (capped by window_us): twice
# the usual gap leaves room for a slower round trip without waiting out a long idle spell...
WINDOW_PER_GAP = 2.0
# ...or the average plus this many mean deviations, when the gaps spread wider (TCP's
# retransmission timeout, srtt + 4 rttvar, is the same rule): a consumer's pulls and commits
# come 15-35 µs apart with one in ten ~100 µs, and a window of twice the mean would end
# before those and let the loop sleep just before the request (lite pulls 5-8% slower).
DEV_FACTOR = 4.0
# ...and never less than this share of the cap: after a burst of back-to-back kicks (many
# connections answered in one loop turn) the average gap is near zero, and a window of
# twice that would end before any peer could answer.
MIN_WINDOW_SHARE = 0.1
# Weight of the newest gap in the average (the older ones keep the rest): forgets a cold
# start or a pause within ~10 kicks.
GAP_WEIGHT = 0.25
# A gap longer than this many caps counts as this many caps (an idle spell must not hold
# the average up for long after requests resume).
GAP_CAP_FACTOR = 10

_sched_yield = getattr(os, "sched_yield", None)
_INF = float("inf")


class BusyPoll:
    __slots__ = ("cap_s", "window_s", "_min_window_s", "yield_cpu", "_until", "_scheduled", "_loop", "_last",
                 "_gap_avg", "_gap_dev", "_caught", "_misses", "_skipped", "stats", "_gap_cap_s", "sharing")

    def __init__(self, window_us: int, yield_cpu: bool = True):
        # the longest window (the setting); the window itself follows the measured gap
        self.cap_s = max(0, window_us) / 1e6
        self.window_s = self.cap_s          # until a gap has been measured
        self._min_window_s = MIN_WINDOW_SHARE * self.cap_s
        self._gap_cap_s = GAP_CAP_FACTOR * self.cap_s
        self.yield_cpu = yield_cpu and _sched_yield is not None
        self._until = 0.0
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last = 0.0
        self._gap_avg = _INF
        self._gap_dev = 0.0
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
        """Spinning suspended by the budget (only probing windows run). A probe that keeps
        catching is a window that never ends: the budget is reset when it does, and until
        then this says False."""
        return self._misses >= MISS_LIMIT and not self._scheduled

    @property
    def gap_avg_us(self) -> float:
        """The average gap between kicks (µs; -1 before two kicks): what the window follows."""
        return -1.0 if self._gap_avg == _INF else self._gap_avg * 1e6

    def snapshot(self) -> dict:
        """What an operator reads (the broker's runtime info): the window now, the gap it
        follows, the cap, whether the budget suspended spinning, and the counters."""
        st = self.stats
        return {"windowMicros": round(self.window_s * 1e6), "gapAvgMicros": round(self.gap_avg_us),
                "capMicros": round(self.cap_s * 1e6), "suspended": self.suspended, "windows": st["windows"],
                "caught": st["caught"], "suspendedKicks": st["suspended_kicks"], "shared": st["shared"]}

    def kick(self) -> None:
        """Activity now: poll (do not sleep) for the window from now."""
        if not self.cap_s:
            return
        now = perf_counter()
        if self._scheduled:
            self._caught = True
        if self._last:
            gap = now - self._last
            if gap > self._gap_cap_s:
                gap = self._gap_cap_s
            avg = self._gap_avg
            if avg == _INF:
                self._gap_avg = avg = gap
                dev = 0.0
            else:
                d = gap - avg
                self._gap_avg = avg = avg + GAP_WEIGHT * d
                self._gap_dev = dev = self._gap_dev + GAP_WEIGHT * ((d if d > 0 else -d) - self._gap_dev)
            window = avg + DEV_FACTOR * dev
            if window < WINDOW_PER_GAP * avg:
                window = WINDOW_PER_GAP * avg
            self.window_s = (window if window < self.cap_s else self.cap_s) if window > self._min_window_s \
                else self._min_window_s
        self._last = now
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
