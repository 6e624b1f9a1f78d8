"""Latency-based fault avoidance for sends (pure; times are integer ms passed in).

Java's MQFaultStrategy: after each send the broker's latency is mapped to a
"not available" duration through two tables; a failed send counts as 30 s of
latency (isolation), which maps to 10 minutes of avoidance. The selector
still uses a marked broker when every broker of the topic is marked. The queue selector prefers queues on available brokers and, if
every broker is marked, the one that will recover first.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pocketmq.client.route import TopicPublishInfo
from pocketmq.protocol.bodies import MessageQueue

LATENCY_MAX_MS = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_DURATION_MS = (0, 0, 30000, 60000, 120000, 180000, 600000)
ISOLATION_LATENCY_MS = 30000


def not_available_duration_ms(latency_ms: int) -> int:
    for i in range(len(LATENCY_MAX_MS) - 1, -1, -1):
        if latency_ms >= LATENCY_MAX_MS[i]:
            return NOT_AVAILABLE_DURATION_MS[i]
    return 0


@dataclass(slots=True)
class FaultItem:
    broker_name: str
    latency_ms: int
    start_ms: int          # available again from this instant

    def available(self, now_ms: int) -> bool:
        return now_ms >= self.start_ms


@dataclass(slots=True)
class LatencyFaultTolerance:
    items: dict = field(default_factory=dict)
    enabled: bool = True

    def update(self, broker_name: str, latency_ms: int, now_ms: int, isolation: bool = False) -> None:
        if not self.enabled:
            return
        lat = ISOLATION_LATENCY_MS if isolation else latency_ms
        duration = 0 if lat < LATENCY_MAX_MS[2] else not_available_duration_ms(lat)
        item = self.items.get(broker_name)
        if item is None:
            self.items[broker_name] = FaultItem(broker_name, lat, now_ms + duration)
        else:
            item.latency_ms = lat
            item.start_ms = now_ms + duration

    def available(self, broker_name: str, now_ms: int) -> bool:
        item = self.items.get(broker_name)
        return item is None or item.available(now_ms)

    def remove(self, broker_name: str) -> None:
        self.items.pop(broker_name, None)

    def least_bad(self, candidates) -> str | None:
        """Of the marked brokers among `candidates`, the one available soonest."""
        marked = [self.items[b] for b in candidates if b in self.items]
        if not marked:
            return None
        return min(marked, key=lambda it: (it.start_ms, it.latency_ms)).broker_name

    def select(self, info: TopicPublishInfo, last_broker_name: str | None, now_ms: int) -> MessageQueue:
        """Pick the queue for the next attempt."""
        if not self.enabled:
            return info.select_one(last_broker_name)
        n = len(info.queues)
        for _ in range(n):
            mq = info.queues[info.next_index() % n]
            if self.available(mq.broker_name, now_ms) and (
                    last_broker_name is None or mq.broker_name != last_broker_name or
                    all(q.broker_name == last_broker_name for q in info.queues)):
                return mq
        # Every broker is marked: take the one recovering first.
        best = self.least_bad({q.broker_name for q in info.queues})
        if best is not None:
            mqs = [q for q in info.queues if q.broker_name == best]
            if mqs:
                return mqs[info.next_index() % len(mqs)]
        return info.select_one(last_broker_name)
