"""The pure half of one rebalance round for one topic.

Given what the NameServer and broker told us (readable queues of the topic and
the client ids of the group) and the queues this consumer currently holds,
decide which queues to drop and which to start. The asyncio shell carries the
plan out: dropped queues stop being consumed, their offsets are committed,
then they are removed; added queues get an offset and a pull loop.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pocketmq.client.rebalance.allocate import AllocateStrategy
from pocketmq.protocol.bodies import MessageQueue


@dataclass(frozen=True, slots=True)
class RebalancePlan:
    topic: str
    allocated: frozenset          # queues this consumer owns after the round
    to_remove: tuple              # held queues no longer owned (sorted)
    to_add: tuple                 # owned queues not held yet (sorted)

    @property
    def changed(self) -> bool:
        return bool(self.to_remove or self.to_add)


def plan_clustering(topic: str, group: str, client_id: str, mq_all: Iterable[MessageQueue],
                    cid_all: Iterable[str], held: Iterable[MessageQueue],
                    strategy: AllocateStrategy) -> RebalancePlan:
    """Sort both lists like RebalanceImpl, allocate, diff against `held` (this topic only)."""
    mqs = sorted(set(mq_all))
    cids = sorted(set(cid_all))
    held_here = {mq for mq in held if mq.topic == topic}
    if not mqs or not cids:
        allocated = frozenset()
    else:
        allocated = frozenset(strategy.allocate(group, client_id, mqs, cids))
    return RebalancePlan(topic, allocated, tuple(sorted(held_here - allocated)),
                         tuple(sorted(allocated - held_here)))


def plan_broadcasting(topic: str, mq_all: Iterable[MessageQueue],
                      held: Iterable[MessageQueue]) -> RebalancePlan:
    allocated = frozenset(mq_all)
    held_here = {mq for mq in held if mq.topic == topic}
    return RebalancePlan(topic, allocated, tuple(sorted(held_here - allocated)),
                         tuple(sorted(allocated - held_here)))
