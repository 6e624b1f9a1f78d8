"""Master/slave broker groups: which member of a group a request goes to (pure).

RocketMQ 4.x replicates a broker as a group: one brokerName whose members are numbered
by brokerId, 0 the master, 1.. the slaves. The nameserver's route lists every live
member (`BrokerData.broker_addrs`, {0: master, 1: slave}); when the master dies the
nameserver drops it at once and the route shows the slaves only, the queues kept.
The rules here follow the Java client (MQClientInstance, PullAPIWrapper):

* writes (sends, send-back, queue locks, END_TRANSACTION) go to the master only: a slave
  refuses them (client.route.publish_info leaves a group without master out of the
  producer's queues);
* a pull goes to the member the last pull of that queue suggested (the broker's
  `suggestWhichBrokerId`: the master says 1 when the consumer lags far behind and the
  group reads from slaves), `find_broker_address_in_subscribe`; a member the route no
  longer has falls back to the master, else the lowest id, so pulls go on from a slave
  while the master is down. A pull to a slave carries no commit offset
  (`member_pull_sys_flag`): a slave never stores what a pull carries, and Java's client
  clears the flag for the same reason;
* offset commits and queries, min/max offsets and timestamp searches go to the master
  when the route has one, else to any member (`find_broker_address_in_admin`): a slave
  answers them, so consumers keep their progress while the master is down.

`BrokerChanges` is what one route update changed in the client's member table: the
addresses seen for the first time (the client heartbeats them at once, so a newly seen
slave knows our consumers and a transactional producer is checkable by a new master
without waiting for the 30 s timer), the groups whose master left or came back, and
those whose master moved to another address (a failover: client.failover). Orderly
consumers stop and resume on those (queue locks live on the master only; a moved master
is one that left and came back); producers forget a back or moved group's send faults.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pocketmq.protocol.codes import PullSysFlag

MASTER_ID = 0

_NOT_COMMIT_OFFSET = ~PullSysFlag.COMMIT_OFFSET


def find_broker_address_in_admin(addrs: Mapping[int, str]) -> tuple[str, int] | None:
    """(address, broker id) of the master, else of the member with the lowest id; None for
    no member. Java's findBrokerAddressInAdmin takes the map's first entry, which is the
    master when there is one; the lowest id makes the choice among slaves stable."""
    if not addrs:
        return None
    broker_id = MASTER_ID if MASTER_ID in addrs else min(addrs)
    return addrs[broker_id], broker_id


def find_broker_address_in_subscribe(addrs: Mapping[int, str], broker_id: int) -> tuple[str, int] | None:
    """(address, broker id) of the member `broker_id` when the route has it, else the
    admin choice (the master, else the lowest id): a suggested slave that is gone, or a
    master that died, still leaves the group readable."""
    addr = addrs.get(broker_id)
    if addr is not None:
        return addr, broker_id
    return find_broker_address_in_admin(addrs)


def member_pull_sys_flag(sys_flag: int, broker_id: int) -> int:
    """A pull's sysFlag for the member it goes to: without COMMIT_OFFSET for a slave (Java
    PullAPIWrapper.pullKernelImpl). The commit goes to the master (or, without one, to
    a member through the offset store), never through a slave's pull."""
    return sys_flag if broker_id == MASTER_ID else sys_flag & _NOT_COMMIT_OFFSET


class PullFromWhichNode:
    """Java PullAPIWrapper.pullFromWhichNodeTable: per queue, the broker id the last pull
    result suggested; the next pull of that queue goes there. Keyed by the queues a
    consumer pulls (forget() when it stops pulling one), so it stays as small as its
    assignment."""

    __slots__ = ("table",)

    def __init__(self):
        self.table: dict = {}

    def update(self, mq, suggest_which_broker_id: int) -> None:
        self.table[mq] = suggest_which_broker_id

    def recalculate(self, mq) -> int:
        """The broker id to pull `mq` from next (the master until a pull suggested otherwise)."""
        return self.table.get(mq, MASTER_ID)

    def forget(self, mq) -> None:
        self.table.pop(mq, None)


@dataclass(frozen=True, slots=True)
class BrokerChanges:
    """What one route changed in the member table (BrokerAddrTable.update)."""
    new_addrs: frozenset = frozenset()          # addresses no route showed before
    masters_lost: frozenset = frozenset()       # broker names whose master left the route
    masters_back: frozenset = frozenset()       # broker names known without master, now with one
    # broker names whose master is now at another address (a failover promoted a slave, or
    # the master came back elsewhere) without a route in between showing none
    masters_moved: frozenset = frozenset()

    def __bool__(self) -> bool:
        return bool(self.new_addrs or self.masters_lost or self.masters_back or self.masters_moved)


def broker_changes(old: Mapping[str, Mapping[int, str]], new: Mapping[str, Mapping[int, str]]) -> BrokerChanges:
    """The changes from the member table `old` ({brokerName: {brokerId: addr}}) to the groups
    of one route, `new` (groups the route does not name are unchanged). A group seen for
    the first time has neither lost nor regained its master."""
    known = {a for addrs in old.values() for a in addrs.values()}
    new_addrs = {a for addrs in new.values() for a in addrs.values()} - known
    lost, back, moved = set(), set(), set()
    for name, addrs in new.items():
        before = old.get(name)
        if before is None:
            continue
        had, has = before.get(MASTER_ID), addrs.get(MASTER_ID)
        if had and not has:
            lost.add(name)
        elif has and not had:
            back.add(name)
        elif had != has:
            moved.add(name)
    return BrokerChanges(frozenset(new_addrs), frozenset(lost), frozenset(back), frozenset(moved))
