"""Broker failover on the client side: what counts as a failover signal, and the rate
limit on the route refreshes those signals cause (pure; times are integer ms passed in).

When a broker group's master dies or is demoted, the nameserver's route for its
brokerName soon maps brokerId 0 to another address (a former slave, issue 31). The
client's member table only learns that from a route refresh, which the timer does every
30 s; until then every send and pull to the group goes to the old address and fails.
So the requests that fail in a way that says "this address may no longer be the
group's master" ask for a refresh at once (the ClientInstance runs it):

* the connection failed: refused, reset, closed, or no answer in time
  (client.errors.RemotingFailure, RequestTimeoutError included);
* a broker answered SERVICE_NOT_AVAILABLE (a slave, or a master being demoted, refuses
  sends with it), SLAVE_NOT_AVAILABLE (a SYNC_MASTER without an in-sync slave: the
  message is stored, but the group is changing), or SYSTEM_ERROR with the remark
  "in-sync replicas not enough" (RocketMQ 5's IN_SYNC_REPLICAS_NOT_ENOUGH: a master
  whose SyncStateSet is below minInSyncReplicas).

`is_failover_signal` is the only place that decision is made; the producer, the pull
loop and the push consumer's send-back call it.

A dead broker fails every request to it, many per second (every queue's pull, every
send). `RefreshLimiter` keeps that from becoming nameserver traffic: per topic at most
one refresh in flight, and refreshes of a topic start at least `min_interval_ms` apart;
a request meanwhile leaves one pending mark, served when the interval has passed.
"""
from __future__ import annotations

from collections.abc import Iterable

from pocketmq.client.errors import BrokerError, RemotingFailure
from pocketmq.protocol.codes import ResponseCode

# RocketMQ 5 answers IN_SYNC_REPLICAS_NOT_ENOUGH as SYSTEM_ERROR with this remark
# (SendMessageProcessor.handlePutMessageResult): the code alone is any broker error.
IN_SYNC_REPLICAS_NOT_ENOUGH = "in-sync replicas not enough"

_NOT_A_WRITABLE_MASTER = frozenset({ResponseCode.SERVICE_NOT_AVAILABLE, ResponseCode.SLAVE_NOT_AVAILABLE})


def is_failover_signal(what: BaseException | int, remark: str | None = None) -> bool:
    """Whether a failed request, or a send answered with response code `what` (and
    `remark`), says the broker it went to may no longer be its group's writable master,
    so the routes through its group should be fetched again now.

    `what` is an exception a request raised (its code and remark are read from it) or a
    response code (a send's status code: SLAVE_NOT_AVAILABLE comes with a stored
    message, not an exception)."""
    if isinstance(what, BaseException):
        if isinstance(what, RemotingFailure):
            return True
        if not isinstance(what, BrokerError):
            return False
        code, remark = what.code, what.remark
    else:
        code = what
    if code in _NOT_A_WRITABLE_MASTER:
        return True
    return code == ResponseCode.SYSTEM_ERROR and IN_SYNC_REPLICAS_NOT_ENOUGH in (remark or "").lower()


class RefreshLimiter:
    """Which topics' routes to refresh now because of failures (one owner: the instance).

    `request(topics)` marks them pending; `take_due(now_ms)` hands out the pending topics
    that may start now (not in flight, last start at least min_interval_ms ago) and marks
    them in flight; `finished(topics)` ends that. Everything is bounded by the topics the
    client uses: one pending mark and one start time per topic, start times older than
    the interval forgotten."""

    __slots__ = ("min_interval_ms", "pending", "in_flight", "last_start")

    def __init__(self, min_interval_ms: int):
        self.min_interval_ms = min_interval_ms
        self.pending: set[str] = set()
        self.in_flight: set[str] = set()
        self.last_start: dict[str, int] = {}

    def request(self, topics: Iterable[str]) -> int:
        """Mark `topics` pending; returns how many were not pending already (the others join
        a refresh that is waiting for its turn)."""
        before = len(self.pending)
        self.pending.update(topics)
        return len(self.pending) - before

    def take_due(self, now_ms: int) -> tuple[list[str], int | None]:
        """(the topics to refresh now, sorted and marked in flight; ms until the next pending
        topic may start, None when no other is waiting for its interval). A pending topic
        that is in flight is neither: the caller asks again after finished()."""
        interval = self.min_interval_ms
        # a start older than the interval constrains nothing any more
        self.last_start = {t: s for t, s in self.last_start.items() if now_ms - s < interval}
        due: list[str] = []
        wait: int | None = None
        for topic in sorted(self.pending):
            if topic in self.in_flight:
                continue            # one refresh of a topic at a time
            start = self.last_start.get(topic)
            left = 0 if start is None else start + interval - now_ms
            if left <= 0:
                due.append(topic)
            elif wait is None or left < wait:
                wait = left
        for topic in due:
            self.pending.discard(topic)
            self.in_flight.add(topic)
            self.last_start[topic] = now_ms
        return due, wait

    def finished(self, topics: Iterable[str]) -> None:
        self.in_flight.difference_update(topics)


__all__ = ["IN_SYNC_REPLICAS_NOT_ENOUGH", "RefreshLimiter", "is_failover_signal"]
