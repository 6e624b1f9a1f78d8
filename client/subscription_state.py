"""SubscriptionState: the one mutable state of a consumer (pure, no asyncio, no clock).

What the consumer subscribed to, which queues it holds and where each one stands.
Both consumers keep theirs here; the fetcher, the rebalancer and the public APIs
(push: listener dispatch, lite: poll/seek/commit) read and change it. Modelled on
aiokafka's SubscriptionState / TopicPartitionState.

Per assigned queue (QueueState):

| field          | meaning                                                        |
|----------------|----------------------------------------------------------------|
| pull_offset    | next offset the fetcher pulls (-1: not known yet)              |
| consume_offset | lite: offset after the last message poll() returned            |
| seq            | bumped by seek(): results of pulls sent before are dropped     |
| paused         | no fetching (and no poll() results) until resumed              |
| dropped        | the queue left the assignment: its pull task ends              |
| task           | the fetcher's pull task (opaque here)                          |
| pq             | push: the ProcessQueue of pulled, not yet consumed messages    |
| buffer         | lite: pulled messages waiting for poll()                       |
"""
from __future__ import annotations

from collections import deque

from pocketmq.client.selector import MessageSelector, selector_of
from pocketmq.protocol.bodies import MessageQueue, SubscriptionData, build_subscription
from pocketmq.protocol.message import property_value


def tag_filter(sub: SubscriptionData):
    """Client-side tag check after the broker's hash-code filter (None = everything), on the
    tuples of protocol.message.decode_records_raw (TAGS read from the properties text)."""
    if sub.is_all or sub.expression_type != "TAG":
        return None
    tags = frozenset(sub.tags_set)
    return lambda rec: property_value(rec[4], "TAGS") in tags


class QueueState:
    __slots__ = ("buffer", "consume_offset", "dropped", "mq", "paused", "pq", "pull_offset", "room", "seq", "task")

    def __init__(self, mq: MessageQueue, pull_offset: int = -1, pq=None):
        self.mq = mq
        self.pull_offset = pull_offset
        self.consume_offset = -1
        self.seq = 0
        self.paused = False
        self.dropped = False
        self.task = None
        self.pq = pq
        self.buffer: deque = deque()
        # the pull task's flow-control wait while it lasts (client.fetcher.wake_fetcher ends it)
        self.room = None

    def drop(self) -> None:
        self.dropped = True
        if self.pq is not None:
            self.pq.dropped = True

    def seek(self, offset: int) -> None:
        """Move both positions; what was buffered is dropped, a pull in flight is ignored."""
        self.seq += 1
        self.buffer.clear()
        self.pull_offset = offset
        self.consume_offset = offset

    def __repr__(self) -> str:
        return (f"QueueState({self.mq}, pull={self.pull_offset}, consume={self.consume_offset}, "
                f"paused={self.paused}, dropped={self.dropped})")


class SubscriptionState:
    def __init__(self):
        self.subscriptions: dict[str, SubscriptionData] = {}
        self.filters: dict[str, object] = {}        # topic -> tag_filter(...) (None = accept all)
        self.assignment: dict[MessageQueue, QueueState] = {}
        self.manual: bool | None = None            # lite: True after assign(), False after subscribe()

    # -- subscriptions --------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str | MessageSelector | None, now_ms: int, *,
                  with_filter: bool = True) -> None:
        """`expression`: a tag expression ("*", "A || B") or a MessageSelector (TAG or SQL92)."""
        sel = selector_of(expression)
        sub = build_subscription(topic, sel.expression, sel.expression_type, now_ms)
        self.subscriptions[topic] = sub
        self.filters[topic] = tag_filter(sub) if with_filter else None

    def subscribe_default(self, topic: str, now_ms: int) -> None:
        """Subscribe `topic` to everything unless already subscribed (retry topic, assign())."""
        if topic not in self.subscriptions:
            self.subscribe(topic, "*", now_ms)

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        self.filters.pop(topic, None)

    def topics(self) -> set[str]:
        return set(self.subscriptions)

    # -- assignment -----------------------------------------------------------------------
    def add(self, mq: MessageQueue, pull_offset: int = -1, pq=None) -> QueueState:
        qs = QueueState(mq, pull_offset, pq)
        self.assignment[mq] = qs
        return qs

    def remove(self, mq: MessageQueue, qs: QueueState | None = None) -> QueueState | None:
        """Drop `mq` from the assignment (only if it is still `qs`, when given)."""
        cur = self.assignment.get(mq)
        if cur is None or (qs is not None and cur is not qs):
            return None
        del self.assignment[mq]
        cur.drop()
        return cur

    def get(self, mq: MessageQueue) -> QueueState | None:
        return self.assignment.get(mq)

    def held(self, topic: str | None = None) -> list[MessageQueue]:
        return [mq for mq in self.assignment if topic is None or mq.topic == topic]

    def stale(self) -> list[MessageQueue]:
        """Held queues of topics no longer subscribed."""
        return [mq for mq in self.assignment if mq.topic not in self.subscriptions]
