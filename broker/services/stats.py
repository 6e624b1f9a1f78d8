"""The clock of broker/core/stats.py: one tick a second (samples for the TPS windows,
today's counts moved at local midnight)."""
from __future__ import annotations

import asyncio
import datetime
import logging

log = logging.getLogger("pocketmq.broker.stats")

TICK_S = 1.0


def local_day(now_ms: int) -> int:
    """The local calendar day of a wall-clock time (changes at local midnight)."""
    return datetime.date.fromtimestamp(now_ms / 1000).toordinal()


async def run_stats_ticks(stats, now_ms, tick_s: float = TICK_S) -> None:
    """Tick `stats` (a BrokerStats) with the broker's wall clock `now_ms()` until cancelled."""
    while True:
        try:
            now = now_ms()
            stats.tick(now, local_day(now))
        except Exception:   # a bad tick must not stop the statistics for good
            log.exception("stats tick failed")
        await asyncio.sleep(tick_s)
