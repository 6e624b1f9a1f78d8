"""FailureLog: which lines to log while something keeps failing (sans-IO, integer clock).

A consumer pulls every queue in its own loop and retries a failed pull every
second; logging each failure gave one line per queue per second while a broker
was down (hundreds a minute). Instead, per *source* (a broker) an *episode*
runs from its first failure until every *item* (queue) that failed has
succeeded again (or was forgotten: the queue is no longer pulled):

* the first failure is logged (INFO: most failures are one-offs), and so is a
  failure of another kind (the exception's type) during the episode;
* while failures go on, one summary every ``summary_interval_ms`` (WARNING:
  how long, how many failures, how many items, the last reason);
* the end is logged once: recovered (at WARNING if a summary was, so whoever
  saw the warning sees the recovery), or no longer pulled.

Nothing here logs: ``failed`` / ``succeeded`` / ``forget`` return the line as
``(level, message)`` or None, and the caller logs it: the fetcher (pulls and
start-offset lookups per broker and queue), the offset store (commits per
broker and queue) and the rebalancer (rounds per group and topic).
"""
from __future__ import annotations

import logging
from collections.abc import Hashable

Line = tuple[int, str]

SUMMARY_INTERVAL_MS = 30_000


class _Episode:
    __slots__ = ("since_ms", "failures", "items", "kind", "reason", "next_summary_ms", "warned")

    def __init__(self, now_ms: int, kind: str, reason: str, interval_ms: int):
        self.since_ms = now_ms
        self.failures = 0
        self.items: set = set()
        self.kind = kind
        self.reason = reason
        self.next_summary_ms = now_ms + interval_ms
        self.warned = False


class FailureLog:
    def __init__(self, what: str, summary_interval_ms: int = SUMMARY_INTERVAL_MS, *,
                 via: str = "from", unit: str = "queue"):
        """`what` failed `via` a source ("pull from broker-a", "rebalance of G"); the
        summary counts the failing items as `unit`s."""
        if summary_interval_ms <= 0:
            raise ValueError("summary_interval_ms must be positive")
        self.what = what
        self.via = via
        self.unit = unit
        self.summary_interval_ms = summary_interval_ms
        self._episodes: dict[Hashable, _Episode] = {}

    def failing(self, source: Hashable) -> bool:
        return source in self._episodes

    def failing_item(self, source: Hashable, item: Hashable) -> bool:
        ep = self._episodes.get(source)
        return ep is not None and item in ep.items

    def failing_items(self, source: Hashable) -> frozenset:
        ep = self._episodes.get(source)
        return frozenset(ep.items) if ep is not None else frozenset()

    def failed(self, source: Hashable, item: Hashable, reason: str, kind: str, now_ms: int) -> Line | None:
        """One failure of `item` of `source`; the line to log, if any."""
        ep = self._episodes.get(source)
        if ep is None:
            ep = self._episodes[source] = _Episode(now_ms, kind, reason, self.summary_interval_ms)
            ep.failures, ep.items = 1, {item}
            return logging.INFO, (f"{self.what} {self.via} {source} failed ({item}): {reason}; while it keeps "
                                  f"failing, a summary every {self.summary_interval_ms // 1000} s")
        ep.failures += 1
        ep.items.add(item)
        ep.reason = reason
        if kind != ep.kind:
            ep.kind = kind
            return logging.INFO, f"{self.what} {self.via} {source} now fails with another error ({item}): {reason}"
        if now_ms >= ep.next_summary_ms:
            ep.next_summary_ms = now_ms + self.summary_interval_ms
            ep.warned = True
            return logging.WARNING, (f"{self.what} {self.via} {source} still failing after "
                                     f"{_seconds(now_ms - ep.since_ms)}: {ep.failures} failures, "
                                     f"{len(ep.items)} {self.unit}(s); last: {reason}")
        return None

    def succeeded(self, source: Hashable, item: Hashable, now_ms: int) -> Line | None:
        """A success of `item`; logs the recovery when the last failing item of `source` recovers."""
        ep = self._end(source, item)
        if ep is None:
            return None
        return (logging.WARNING if ep.warned else logging.INFO,
                f"{self.what} {self.via} {source} works again after {_seconds(now_ms - ep.since_ms)} "
                f"({ep.failures} failures)")

    def forget(self, source: Hashable, item: Hashable, now_ms: int) -> Line | None:
        """`item` is gone (a queue no longer pulled, a topic unsubscribed): it cannot recover."""
        ep = self._end(source, item)
        if ep is None:
            return None
        return logging.INFO, (f"{self.what} {self.via} {source}: no failing {self.unit} is left "
                              f"({ep.failures} failures in {_seconds(now_ms - ep.since_ms)})")

    def _end(self, source: Hashable, item: Hashable) -> _Episode | None:
        """Take `item` out of its episode; the episode if that ended it."""
        ep = self._episodes.get(source)
        if ep is None or item not in ep.items:
            return None
        ep.items.discard(item)
        if ep.items:
            return None
        del self._episodes[source]
        return ep

def _seconds(ms: int) -> str:
    return f"{ms // 1000} s" if ms >= 10_000 else f"{ms / 1000:.1f} s"
