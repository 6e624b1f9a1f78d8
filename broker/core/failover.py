"""Automatic failover's rules (RocketMQ 5 controller mode): pure functions, no I/O, no clock.

The shells: broker/services/consensus.py (etcd: the only place the group's state lives),
broker/services/failover.py (the per-broker agent: lease, election, role changes), and
broker/services/ha.py (the HA stream's epoch handshake, acks, the SyncStateSet). What is
decided here:

* `GroupState`: what etcd holds per broker group (one JSON value, changed only by
  compare-and-swap on its revision): the master's replica id and epoch, the SyncStateSet
  (the replicas holding every acknowledged message) and its epoch, and the epoch history
  (epoch, start offset): where each master's writes began in the group's log.
* `candidates`: who may be elected when the master's lease is gone, best first. Only live
  members of the SyncStateSet (they hold every acknowledged message) unless unclean
  election is enabled; ranked as RocketMQ's DefaultElectPolicy (epoch, then max offset,
  then the lowest id). `elected` is the state the winner writes: epoch + 1, SyncStateSet =
  {winner}, history + (epoch + 1, the winner's end).
* `consistent_point`: where a replica's log stops agreeing with its (new) master's,
  from the two epoch histories (RocketMQ's EpochFileCache.findConsistentPoint): the last
  epoch both hold with the same start, cut at the earlier of the two ends of that epoch.
  A replica truncates its log there before it replicates.
* `SyncStateTracker`: the master's view of its slaves' acks: the confirm offset (the min
  ack of the SyncStateSet: consumers are never served past it, so nothing a consumer saw
  is rolled back by a failover), the offset that k acks reached (sends wait for it), and
  the changes to propose (a member disconnected or not caught up for
  haMaxTimeSlaveNotCatchup leaves; a caught-up slave joins). A joiner counts in the
  confirm offset from the moment it is proposed, so every message acknowledged after that
  is on it, and is proposed to etcd only once it holds everything acknowledged before.
  A shrink takes effect only once etcd committed it (until then its member's ack is still
  awaited): so the committed set always holds every acknowledged message.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

__all__ = ["GroupState", "AliveInfo", "StateError", "bootstrap", "candidates", "elected",
           "consistent_point", "epoch_entries_for", "with_sync_state_set", "SyncStateTracker", "HISTORY_MAX"]

# the history etcd keeps per group: older epochs than these can only matter to a replica
# that was away for that many elections (it then has no common epoch and refuses, keeping
# its data, rather than guess)
HISTORY_MAX = 64


class StateError(ValueError):
    """A group state value that is not ours or is inconsistent (names the field)."""


@dataclass(frozen=True)
class GroupState:
    master: int                          # replica id of the master; -1: none (never elected)
    epoch: int                           # the master's epoch
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int
    history: tuple[tuple[int, int], ...] = ()   # (epoch, start offset), ascending

    def encode(self) -> bytes:
        return json.dumps({"master": self.master, "epoch": self.epoch,
                           "syncStateSet": sorted(self.sync_state_set),
                           "syncStateSetEpoch": self.sync_state_set_epoch,
                           "history": [list(h) for h in self.history]}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "GroupState":
        try:
            d = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise StateError(f"group state is not JSON: {e}") from None
        if not isinstance(d, dict):
            raise StateError("group state is not an object")

        def num(name: str) -> int:
            v = d.get(name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise StateError(f"group state field {name!r} is not an integer: {v!r}")
            return v
        sss = d.get("syncStateSet")
        if not isinstance(sss, list) or not all(isinstance(i, int) and i >= 0 for i in sss):
            raise StateError(f"group state field 'syncStateSet' is not a list of replica ids: {sss!r}")
        hist = d.get("history", [])
        if not isinstance(hist, list) or not all(isinstance(h, list) and len(h) == 2 and all(isinstance(x, int)
                                                                                           for x in h) for h in hist):
            raise StateError(f"group state field 'history' is not a list of [epoch, offset]: {hist!r}")
        st = cls(num("master"), num("epoch"), frozenset(sss), num("syncStateSetEpoch"),
                 tuple((h[0], h[1]) for h in hist))
        if st.master >= 0 and st.master not in st.sync_state_set:
            raise StateError(f"group state: master {st.master} is not in its syncStateSet {sorted(sss)}")
        return st


@dataclass(frozen=True)
class AliveInfo:
    """What a live replica publishes under its lease (alive/{id})."""
    replica_id: int
    addr: str                 # remoting address (host:port)
    ha_addr: str              # HA address slaves connect to (host:port)
    max_offset: int           # its commit log's end when it last published
    epoch: int                # the last epoch in its epoch file (0: none)

    def encode(self) -> bytes:
        return json.dumps({"id": self.replica_id, "addr": self.addr, "haAddr": self.ha_addr,
                           "maxOffset": self.max_offset, "epoch": self.epoch}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "AliveInfo":
        try:
            d = json.loads(data)
            return cls(int(d["id"]), str(d["addr"]), str(d["haAddr"]), int(d["maxOffset"]), int(d["epoch"]))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise StateError(f"alive record is not ours: {e}") from None


def bootstrap(replica_id: int, end: int) -> GroupState:
    """The first state of a group: its first live replica is master of epoch 1. (Data the
    store had before controller mode is epoch 0, from offset 0: epoch_entries_for.)"""
    hist = ((0, 0), (1, end)) if end > 0 else ((1, end),)
    return GroupState(replica_id, 1, frozenset({replica_id}), 1, hist)


def candidates(state: GroupState, alive: dict[int, AliveInfo], unclean: bool) -> list[int]:
    """Replica ids that may become master now, best first; [] means the group must stay
    without a master (every live replica may lack acknowledged messages)."""
    pool = [a for i, a in alive.items() if i in state.sync_state_set]
    if not pool and unclean:
        pool = list(alive.values())
    pool.sort(key=lambda a: (-a.epoch, -a.max_offset, a.replica_id))
    return [a.replica_id for a in pool]


def elected(state: GroupState, winner: int, end: int) -> GroupState:
    epoch = state.epoch + 1
    hist = tuple(h for h in state.history if h[1] <= end) + ((epoch, end),)
    return GroupState(winner, epoch, frozenset({winner}), state.sync_state_set_epoch + 1, hist[-HISTORY_MAX:])


def with_sync_state_set(state: GroupState, members: frozenset[int]) -> GroupState:
    return GroupState(state.master, state.epoch, members, state.sync_state_set_epoch + 1, state.history)


def epoch_entries_for(entries: list[tuple[int, int]], end: int) -> list[tuple[int, int]]:
    """A log's epoch entries as consistent_point reads them: a log with data but no entries
    (written before controller mode) is epoch 0 from offset 0; entries starting at or past
    the log's end cover no data of it."""
    if end > 0 and not entries:
        return [(0, 0)]
    return [e for e in entries if e[1] < end]


def _ranges(entries: list[tuple[int, int]], end: int) -> dict[int, tuple[int, int]]:
    out = {}
    for i, (epoch, start) in enumerate(entries):
        stop = entries[i + 1][1] if i + 1 < len(entries) else end
        out[epoch] = (start, min(stop, end))
    return out


def consistent_point(local: list[tuple[int, int]], local_end: int,
                     master: list[tuple[int, int]], master_end: int) -> int:
    """The offset up to which the local log agrees with the master's (a record boundary of
    both); -1 when they share no epoch (the local log is not this group's: never guessed)."""
    if local_end == 0:
        return 0
    mine = _ranges(epoch_entries_for(local, local_end), local_end)
    theirs = _ranges(epoch_entries_for(master, master_end), master_end)
    for epoch in sorted(set(mine) & set(theirs), reverse=True):
        (ls, le), (ms, me) = mine[epoch], theirs[epoch]
        if ls == ms:
            return min(le, me)
    return -1


@dataclass
class _Member:
    ack: int = -1
    connected: bool = False
    caught_up_ms: int = 0         # last time its ack reached the master's end of its previous report
    end_at_report: int = 0


@dataclass
class SyncStateTracker:
    """The master's SyncStateSet bookkeeping for one epoch (see the module docstring)."""
    master: int
    committed: frozenset[int]                     # the set etcd holds
    max_not_catchup_ms: int = 15_000
    joining: dict[int, int] = field(default_factory=dict)     # replica id -> end it must reach
    members: dict[int, _Member] = field(default_factory=dict)

    def _m(self, rid: int) -> _Member:
        m = self.members.get(rid)
        if m is None:
            m = self.members[rid] = _Member()
        return m

    def on_connect(self, rid: int, now_ms: int) -> None:
        m = self._m(rid)
        m.connected = True
        m.caught_up_ms = now_ms

    def on_disconnect(self, rid: int) -> None:
        m = self._m(rid)
        m.connected = False
        self.joining.pop(rid, None)

    def on_ack(self, rid: int, ack: int, master_end: int, now_ms: int) -> None:
        m = self._m(rid)
        if ack > m.ack:
            m.ack = ack
        if ack >= m.end_at_report:
            m.caught_up_ms = now_ms
        m.end_at_report = master_end

    @property
    def awaited(self) -> frozenset[int]:
        """Replicas whose acks count now: the committed set (removals count until committed)
        and the joiners, without the master."""
        return (self.committed | frozenset(self.joining)) - {self.master}

    def confirm_offset(self, master_end: int) -> int:
        """The least ack of the committed set's members (without the master): what every
        electable replica holds. Joiners are not electable until committed (and hold all of
        it by then), so they do not hold it back."""
        acks = [max(self.members[r].ack, 0) if r in self.members else 0 for r in self.committed - {self.master}]
        return min([master_end] + acks)

    def acked_by(self, k: int, master_end: int) -> int:
        """The offset at least k awaited replicas acked (k <= 0: the master's end)."""
        if k <= 0:
            return master_end
        acks = sorted((max(self.members[r].ack, 0) if r in self.members else 0 for r in self.awaited),
                      reverse=True)
        if len(acks) < k:
            return -1
        return min(acks[k - 1], master_end)

    def proposal(self, master_end: int, now_ms: int, join_gap: int) -> frozenset[int] | None:
        """The SyncStateSet to propose to etcd now, or None. Starts joins (a connected slave
        within `join_gap` of the end) as a side effect: see the module docstring."""
        leave = set()
        for rid in self.committed - {self.master}:
            m = self.members.get(rid)
            if m is None or not m.connected or now_ms - m.caught_up_ms > self.max_not_catchup_ms:
                leave.add(rid)
        for rid, m in self.members.items():
            if rid in self.committed or rid == self.master or not m.connected or rid in self.joining:
                continue
            if m.ack >= 0 and master_end - m.ack <= join_gap:
                self.joining[rid] = master_end
        join = {rid for rid, target in self.joining.items()
                if self.members[rid].ack >= target and self.members[rid].connected}
        if not leave and not join:
            return None
        return frozenset((self.committed - leave) | join)

    def committed_as(self, members: frozenset[int]) -> None:
        """etcd now holds `members`."""
        self.committed = members
        for rid in members:
            self.joining.pop(rid, None)
