"""Replication's metadata rules (pure): what a slave takes from its master, and what a
master coming back takes from its slaves. The asyncio shell is broker/services/slave_sync.py;
the bodies are protocol/bodies.py's.

Slave side (Java 4.9's SlaveSynchronize.syncAll, every 10 s while a slave knows its master):

* topics (GET_ALL_TOPIC_CONFIG) and subscription groups (GET_ALL_SUBSCRIPTIONGROUP_CONFIG):
  when the master's dataVersion differs from the slave's, the slave's whole table becomes
  the master's, version included (`adopt_topics`, `adopt_groups`);
* consumer offsets (GET_ALL_CONSUMER_OFFSET): every `topic@group` the master has replaces
  the slave's (Java's putAll: the master wins); keys only the slave has stay
  (`adopt_offsets`);
* delay offsets (GET_ALL_DELAY_OFFSET): the master's table replaces the slave's, in memory
  too (`ScheduleCursors.adopt`; Java 4.9 only rewrites the file, so a slave's memory, and
  what it writes back at shutdown, stays stale).

A body that does not decode raises BodyError before anything is changed: a failed sync
never wipes a slave's table.

Master side (`take_back`, after RocketMQ 5's syncMetadataReverse): while the master is
down, consumers commit their offsets to a slave; 4.x masters never read them, and the
slave's next sync overwrites them with the master's older values (messages consumed
again). A master starting up instead merges each slave's table into its own, per
(topic@group, queue), keeping the larger offset. Why the larger: a slave's table is a copy
of the master's taken at most one sync period ago, changed only by commits made on the
slave itself, which happen while the master is away and only move forward (a consumer
commits what it has consumed; resets are refused on a slave). So a larger offset on a
slave is a commit the master missed, and a smaller one is only a copy older than the
master's. The known exception: a backward reset made on the master in the last sync
period before it went down had not reached the slave, whose older, larger offset then
wins back (those messages are not consumed again).

`SyncLog` decides which lines a repeated sync logs while its master stays unreachable.
"""
from __future__ import annotations

import logging

from pocketmq.broker.core.offsets import ConsumerOffsetManager
from pocketmq.broker.core.subscription_groups import SubscriptionGroupManager
from pocketmq.broker.core.topics import TopicConfigManager
from pocketmq.protocol.bodies import (
    decode_cluster_info,
    decode_consumer_offset_wrapper,
    decode_subscription_group_wrapper,
    decode_topic_config_wrapper,
    loads,
)
from pocketmq.protocol.errors import BodyError

__all__ = ["adopt_topics", "adopt_groups", "adopt_offsets", "group_slaves", "take_back", "SyncLog"]

# A failing sync is reminded of this often (a line per change of what fails otherwise).
REMIND_MS = 10 * 60_000


def adopt_topics(topics: TopicConfigManager, body) -> bool:
    """The master's TopicConfigSerializeWrapper `body`: when its dataVersion is not the
    slave's, the whole table and the version become the master's (True). A table without
    topics is refused (BodyError): a master always has its system topics, so it can only be a
    broken answer, and taking it would wipe the slave's."""
    table, version = decode_topic_config_wrapper(loads(body))
    if not table:
        raise BodyError("the master's topic table is empty")
    if version == topics.data_version:
        return False
    # in place: whoever holds the dict sees the new table
    topics.topics.clear()
    topics.topics.update(table)
    topics.data_version = version
    return True


def adopt_groups(groups: SubscriptionGroupManager, body) -> bool:
    """The master's SubscriptionGroupWrapper `body`: as `adopt_topics`; marks the table dirty."""
    table, version = decode_subscription_group_wrapper(loads(body))
    if version == groups.data_version:
        return False
    groups.table.clear()
    groups.table.update(table)
    groups.data_version = version
    groups.dirty = True
    return True


def adopt_offsets(offsets: ConsumerOffsetManager, body) -> int:
    """The master's ConsumerOffsetSerializeWrapper `body` put over the slave's table, one
    `topic@group` at a time (the master's queues replace the slave's for that key). Returns
    how many keys changed; marks the table dirty when any did."""
    changed = 0
    for key, queues in decode_consumer_offset_wrapper(body).items():
        if offsets.table.get(key) != queues:
            offsets.table[key] = queues
            changed += 1
    if changed:
        offsets.dirty = True
    return changed


def group_slaves(cluster_info_body, broker_name: str, own_addr: str) -> list[str]:
    """The slaves (brokerId > 0) of `broker_name` a nameserver's GET_BROKER_CLUSTER_INFO
    answer lists, in id order, without `own_addr`. Raises BodyError when it does not decode."""
    try:
        brokers, _ = decode_cluster_info(cluster_info_body)
    except BodyError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise BodyError(f"bad ClusterInfo: {type(e).__name__}: {e}") from None
    data = brokers.get(broker_name)
    if data is None:
        return []
    return [addr for bid, addr in sorted(data.broker_addrs.items()) if bid > 0 and addr != own_addr]


def take_back(offsets: ConsumerOffsetManager, slave_table: dict[str, dict[int, int]]) -> set[tuple[str, int]]:
    """Merge a slave's decoded offset table into a master's: each (topic@group, queue) takes
    the larger offset (why: the module docstring). Returns the queues that moved; marks the
    table dirty when any did."""
    moved = set()
    for key, queues in slave_table.items():
        own = offsets.table.get(key)
        for qid, off in queues.items():
            if own is None or off > own.get(qid, -1):
                if own is None:
                    own = offsets.table[key] = {}
                own[qid] = off
                moved.add((key, qid))
    if moved:
        offsets.dirty = True
    return moved


Line = tuple[int, str]


class SyncLog:
    """Which lines a sync repeated every few seconds logs (nothing here logs; the caller
    does). A round's outcome is what failed: {item: reason}. Logged: the first failure
    (WARNING), a change in what fails (another item, or an error of another kind: the
    text before the first ':'), a reminder every `remind_ms` while it goes on, and the
    recovery (INFO). A master that stays down costs one line, then one per `remind_ms`,
    not one per round."""

    def __init__(self, what: str, remind_ms: int = REMIND_MS):
        self.what = what
        self.remind_ms = remind_ms
        self._failing: dict[str, str] = {}       # item -> kind of error
        self._since_ms = 0
        self._rounds = 0
        self._next_remind_ms = 0

    @property
    def failing(self) -> bool:
        return bool(self._failing)

    def round(self, source: str, failures: dict[str, str], now_ms: int) -> Line | None:
        kinds = {item: reason.split(":", 1)[0] for item, reason in failures.items()}
        by_reason: dict[str, list[str]] = {}
        for item, reason in sorted(failures.items()):
            by_reason.setdefault(reason, []).append(item)
        detail = "; ".join(f"{', '.join(items)}: {reason}" for reason, items in by_reason.items())
        if not failures:
            if not self._failing:
                return None
            self._failing = {}
            return logging.INFO, (f"{self.what} from {source} works again after "
                                  f"{_seconds(now_ms - self._since_ms)} ({self._rounds} failed rounds)")
        if not self._failing:
            self._since_ms, self._rounds = now_ms, 0
        self._rounds += 1
        if kinds != self._failing:
            first = not self._failing
            self._failing = kinds
            self._next_remind_ms = now_ms + self.remind_ms
            return logging.WARNING, (f"{self.what} from {source} {'failed' if first else 'now fails'}: {detail}"
                                     f"; its tables are kept, retried every round, logged again when this "
                                     f"changes or every {self.remind_ms // 60_000} min")
        if now_ms >= self._next_remind_ms:
            self._next_remind_ms = now_ms + self.remind_ms
            return logging.WARNING, (f"{self.what} from {source} still failing after "
                                     f"{_seconds(now_ms - self._since_ms)} ({self._rounds} rounds): {detail}")
        return None


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.0f} s"
