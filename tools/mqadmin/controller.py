"""Controller-mode commands (RocketMQ 5's names and flags): getSyncStateSet, getBrokerEpoch,
electMaster. RocketMQ's controller is ours in etcd: `-a` takes etcd endpoints
(host:port;host:port, as RocketMQ's controllerAddress), and the commands read and write
the keys the brokers' failover agents keep there (layout: common/controller_keys.py, the
one owner both sides call).

The tools may not import the broker (the layering), so the two JSON values (the state and
a replica's alive record) are read here; tests/unit/test_mqadmin_failover.py checks them
against the broker's own code. A planned switchover is a request the master carries out (or refuses: it deletes
the request and says why in its log); electMaster waits for either.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from pocketmq.common import controller_keys as keys
from pocketmq.tools.mqadmin import tables
from pocketmq.tools.mqadmin.cluster import _kv, print_warnings
from pocketmq.tools.mqadmin.command import Command, Opt, Out, non_negative_int, positive_int, stripped
from pocketmq.tools.mqadmin.errors import AdminError, UsageError, one_line
from pocketmq.tools.mqadmin.session import AdminSession

if TYPE_CHECKING:
    import aetcd

T = TypeVar("T")

PREFIX = keys.PREFIX            # EtcdConsensus's default prefix (the brokers' agents use it)
SWITCHOVER = keys.SWITCHOVER
CALL_TIMEOUT_S = 3.0
ELECT_WAIT_S = 20.0             # the master waits up to 10 s for the target to catch up
POLL_S = 0.1


# ------------------------------------------------------------------------------ the group (pure)

@dataclass(frozen=True)
class Replica:
    """A live replica's record (alive/{id})."""
    rid: int
    addr: str
    ha_addr: str
    max_offset: int
    epoch: int


@dataclass
class GroupView:
    """One read of a group's keys."""
    cluster: str
    group: str
    master: int = -1                      # the state's master (the last elected)
    epoch: int = 0
    sync_state_set: tuple[int, ...] = ()
    sync_state_set_epoch: int = 0
    history: tuple[tuple[int, int], ...] = ()
    leader: int | None = None             # who holds the leader key (a live lease) now
    alive: dict[int, Replica] = field(default_factory=dict)
    requests: dict[str, str] = field(default_factory=dict)
    has_state: bool = False

    @property
    def master_addr(self) -> str | None:
        r = self.alive.get(self.leader) if self.leader is not None else None
        return r.addr if r is not None else None

    def replica_ids(self) -> list[int]:
        ids = set(self.alive) | set(self.sync_state_set)
        if self.master >= 0:
            ids.add(self.master)
        return sorted(ids)


def _unreadable(view: GroupView, what: str, why) -> AdminError:
    return AdminError(f"unreadable {what} of broker group {view.group} in the controller: {why}")


def _int(d: dict, name: str, view: GroupView, what: str) -> int:
    v = d.get(name)
    if not isinstance(v, int) or isinstance(v, bool):
        raise _unreadable(view, what, f"field {name!r} is not an integer: {v!r}")
    return v


def _json(raw: bytes, view: GroupView, what: str) -> dict:
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise _unreadable(view, what, f"not JSON: {e}") from None
    if not isinstance(d, dict):
        raise _unreadable(view, what, "not a JSON object")
    return d


def group_view(cluster: str, group: str, items: Iterable[tuple[str, bytes]]) -> GroupView:
    """The view of a group from its keys: (the key below {prefix}/{cluster}/{group}/, value)."""
    v = GroupView(cluster, group)
    for tail, raw in items:
        kind = keys.key_kind(tail)
        if kind is None:
            continue
        if kind[0] == "state":
            d = _json(raw, v, "state")
            sss = d.get("syncStateSet")
            hist = d.get("history", [])
            if not isinstance(sss, list) or not all(isinstance(i, int) for i in sss):
                raise _unreadable(v, "state", f"syncStateSet is not a list of replica ids: {sss!r}")
            if not isinstance(hist, list) or not all(isinstance(h, list) and len(h) == 2 for h in hist):
                raise _unreadable(v, "state", f"history is not a list of [epoch, offset]: {hist!r}")
            v.master, v.epoch = _int(d, "master", v, "state"), _int(d, "epoch", v, "state")
            v.sync_state_set_epoch = _int(d, "syncStateSetEpoch", v, "state")
            v.sync_state_set = tuple(sorted(sss))
            v.history = tuple((int(e), int(o)) for e, o in hist)
            v.has_state = True
        elif kind[0] == "leader":
            head = raw.split(b":", 1)[0]
            v.leader = int(head) if head.isdigit() else None
        elif kind[0] == "alive":
            what = f"alive record {kind[1]}"
            d = _json(raw, v, what)
            v.alive[kind[1]] = Replica(_int(d, "id", v, what), str(d.get("addr", "")),
                                       str(d.get("haAddr", "")), _int(d, "maxOffset", v, what),
                                       _int(d, "epoch", v, what))
        else:
            v.requests[kind[1]] = raw.decode(errors="replace")
    return v


def _ids(ids) -> str:
    return "[" + ", ".join(str(i) for i in sorted(ids)) + "]"


def no_master_note(v: GroupView) -> str | None:
    """What a group without a master (nobody holds the leader key) does next; None when it
    has one."""
    if v.leader is not None:
        return None
    was = f"replica {v.master} (master of epoch {v.epoch}) lost its lease" if v.master >= 0 \
        else "no replica has been elected yet"
    live = [r for r in v.sync_state_set if r in v.alive]
    if live:
        return (f"NO MASTER: {was}; the live members of the SyncStateSet {_ids(live)} elect a new one "
                f"(within a few seconds)")
    return (f"NO MASTER: {was} and no member of the SyncStateSet {_ids(v.sync_state_set)} is alive "
            f"(alive: {_ids(v.alive)}): the group stays unavailable for writes until one returns. The other "
            f"replicas may lack acknowledged messages: they are elected only with enableElectUncleanMaster=true")


def format_sync_state_set(v: GroupView) -> str:
    """getSyncStateSet's block for one group: RocketMQ's #labels, then one row per replica."""
    master_alive = v.alive.get(v.leader) if v.leader is not None else None
    pairs = [("#ClusterName", v.cluster), ("#BrokerName", v.group),
             ("#MasterId", v.leader if v.leader is not None else "-"),
             ("#MasterAddr", v.master_addr or "-"),
             ("#MasterEpoch", v.epoch),
             ("#SyncStateSet", _ids(v.sync_state_set)),
             ("#SyncStateSetEpoch", v.sync_state_set_epoch),
             ("#SyncStateSetNums", len(v.sync_state_set))]
    if SWITCHOVER in v.requests:
        pairs.append(("#PendingSwitchover", f"to replica {v.requests[SWITCHOVER]}"))
    rows = []
    for rid in v.replica_ids():
        r = v.alive.get(rid)
        role = "MASTER" if rid == v.leader else "SLAVE" if r is not None and v.leader is not None else "-"
        if r is None:
            rows.append((rid, role, "-", "-", "false", rid in v.sync_state_set, "-", "-", "-"))
            continue
        lag = max(0, master_alive.max_offset - r.max_offset) if master_alive is not None else "-"
        rows.append((rid, role, r.addr, r.ha_addr, "true", rid in v.sync_state_set, r.max_offset, lag, r.epoch))
    lines = _kv(pairs)
    lines.append(tables.format_table(["#ReplicaId", "#Role", "#Addr", "#HaAddr", "#Alive", "#InSyncStateSet",
                                      "#LogEnd", "#LagBytes", "#LastEpoch"], rows, right=(6, 7, 8)))
    note = no_master_note(v)
    if note:
        lines.append(note)
    return "\n".join(lines)


def format_broker_epoch(v: GroupView) -> str:
    """getBrokerEpoch's block: the group's epoch history (each epoch's start offset, and its
    end: the next one's start, the live master's log end for the last) and each live
    replica's last epoch (the last entry of its epoch file) and log end."""
    master_alive = v.alive.get(v.leader) if v.leader is not None else None
    pairs = [("#ClusterName", v.cluster), ("#BrokerName", v.group),
             ("#MasterId", v.leader if v.leader is not None else "-"), ("#MasterEpoch", v.epoch)]
    hist = list(v.history)
    rows = []
    for i, (epoch, start) in enumerate(hist):
        if i + 1 < len(hist):
            end = hist[i + 1][1]
        else:
            end = master_alive.max_offset if master_alive is not None and epoch == v.epoch else "-"
        rows.append((epoch, start, end))
    lines = _kv(pairs)
    lines.append(tables.format_table(["#Epoch", "#StartOffset", "#EndOffset"], rows, right=(1, 2)))
    reps = [(r.rid, "MASTER" if r.rid == v.leader else "SLAVE" if v.leader is not None else "-", r.epoch,
             r.max_offset) for r in sorted(v.alive.values(), key=lambda r: r.rid)]
    lines.append(tables.format_table(["#ReplicaId", "#Role", "#LastEpoch", "#LogEnd"], reps, right=(2, 3)))
    note = no_master_note(v)
    if note:
        lines.append(note)
    return "\n".join(lines)


# outcomes of a switchover request, from two reads of the group
PENDING, DONE, REFUSED, OTHER = "pending", "done", "refused", "other"


def switchover_outcome(before: GroupView, now: GroupView, target: int) -> str:
    """DONE: the target is master of a newer epoch; OTHER: someone else is; REFUSED: the
    request is gone and the epoch unchanged (the master deletes a request it refuses;
    one it carries out goes in the same transaction as the new state); else PENDING."""
    if now.epoch > before.epoch:
        return DONE if now.master == target else OTHER
    if SWITCHOVER not in now.requests:
        return REFUSED
    return PENDING


def refusal_reason(v: GroupView, target: int) -> str:
    """Why the master most likely refused to hand over to `target` (its log says for sure)."""
    if target not in v.alive:
        return f"replica {target} is not alive (no live record in the controller; alive: {_ids(v.alive)})"
    if target not in v.sync_state_set:
        return (f"replica {target} is not in the SyncStateSet {_ids(v.sync_state_set)}: it may lack "
                f"acknowledged messages (wait until getSyncStateSet shows it in sync)")
    return (f"replica {target} was not connected to the master, did not catch up within 10 s, or its lease "
            f"expired during the handover")


def format_elect_result(v: GroupView, before: GroupView, took_s: float) -> str:
    """electMaster's answer: RocketMQ's labels, then the live replicas (#Broker id addr)."""
    head = (f"replica {v.master} is the master of {v.group} now (was replica {before.leader}, epoch "
            f"{before.epoch} -> {v.epoch}, {took_s:.2f} s)")
    lines = [head] + _kv([("#ClusterName", v.cluster), ("#BrokerName", v.group),
                          ("#BrokerMasterAddr", v.master_addr or "-"), ("#MasterId", v.master),
                          ("#MasterEpoch", v.epoch), ("#SyncStateSetEpoch", v.sync_state_set_epoch),
                          ("#SyncStateSet", _ids(v.sync_state_set))])
    lines += [f"\t#Broker\t{r.rid}\t{r.addr}" for r in sorted(v.alive.values(), key=lambda r: r.rid)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ etcd

def parse_endpoints(value: str) -> list[tuple[str, int]]:
    """`-a host:port;host:port` (',' also separates) -> [(host, port)]; UsageError when malformed."""
    out = []
    for ep in (e.strip() for e in value.replace(",", ";").split(";")):
        if not ep:
            continue
        host, sep, port = ep.removeprefix("http://").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"bad controller (etcd) address {ep!r}; expected host:port")
        out.append((host, int(port)))
    if not out:
        raise UsageError("empty controller (etcd) address; expected host:port[;host:port]")
    return out


def etcd_reason(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return f"no answer within {CALL_TIMEOUT_S:g}s"
    text = one_line(str(e))
    low = text.lower()
    if "refused" in low:
        return "connection refused"
    if "resolving" in low or "name not found" in low or "name or service not known" in low:
        return "unknown host"
    return text or type(e).__name__


class Controller:
    """The etcd endpoints of `-a`: each call goes to the first that answers, starting with
    the one that answered last (at first the first given); when none answers, one
    AdminError names each with its reason."""

    def __init__(self, endpoints: str, *, prefix: str = PREFIX, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.prefix = prefix
        self.timeout_s = timeout_s
        self._clients: dict[int, aetcd.Client] = {}
        self._good = 0                  # the endpoint that answered last
        # etcd's client and grpc only here, when a command talks to the controller: importing
        # them costs ~0.2 s of CPU, which every other mqadmin command would pay at its start
        # (the tests run mqadmin ~300 times)
        import aetcd
        import grpc
        self._aetcd = aetcd
        self._errors = (TimeoutError, aetcd.ClientError, grpc.RpcError, OSError)

    def _name(self, i: int) -> str:
        host, port = self.endpoints[i]
        return f"{host}:{port}"

    @property
    def endpoint(self) -> str:
        """The endpoint that answered last (for messages)."""
        return self._name(self._good)

    async def _call(self, fn: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        failures = []
        n = len(self.endpoints)
        for i in [(self._good + k) % n for k in range(n)]:
            client = self._clients.get(i)
            if client is None:
                client = self._clients[i] = self._aetcd.Client(*self.endpoints[i],
                                                               options=keys.ETCD_CHANNEL_OPTIONS)
            try:
                async with asyncio.timeout(self.timeout_s):
                    result = await fn(client)
                self._good = i
                return result
            except self._errors as e:
                failures.append(f"{self._name(i)} ({etcd_reason(e)})")
                await self._drop(i)
        if len(failures) == 1:
            raise AdminError(f"cannot reach controller (etcd) {failures[0]}")
        raise AdminError("cannot reach any controller (etcd): " + "; ".join(failures))

    async def _drop(self, i: int) -> None:
        client = self._clients.pop(i, None)
        if client is not None:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await client.close()
            except self._errors:
                pass

    async def close(self) -> None:
        for i in list(self._clients):
            await self._drop(i)

    def _base(self, cluster: str, group: str) -> bytes:
        return keys.group_base(self.prefix, cluster, group)

    def request_key(self, cluster: str, group: str, name: str) -> bytes:
        return keys.request_key(self.prefix, cluster, group, name)

    async def read_group(self, cluster: str, group: str) -> GroupView:
        base = self._base(cluster, group)
        res = await self._call(lambda c: c.get_prefix(base))
        return group_view(cluster, group, [(kv.key[len(base):].decode(errors="replace"), kv.value) for kv in res])

    async def list_groups(self, cluster: str | None = None) -> list[tuple[str, str]]:
        """(cluster, group) of every group with a state key, sorted."""
        base = keys.list_base(self.prefix, cluster or None)
        res = await self._call(lambda c: c.get_prefix(base, keys_only=True))
        return keys.groups_of_keys(self.prefix, (kv.key for kv in res))

    async def put_request(self, cluster: str, group: str, name: str, value: bytes) -> None:
        key = self.request_key(cluster, group, name)
        await self._call(lambda c: c.put(key, value))

    async def delete_request(self, cluster: str, group: str, name: str) -> None:
        key = self.request_key(cluster, group, name)
        await self._call(lambda c: c.delete(key))


def _check_name(kind: str, name: str | None) -> str | None:
    if name is not None and "/" in name:
        raise UsageError(f"bad {kind} {name!r}: must not contain '/'")
    return name


def _known(groups: list[tuple[str, str]]) -> str:
    return ", ".join(f"{c}/{g}" for c, g in groups) or "none"


async def groups_of(ctl: Controller, broker_name: str | None, cluster: str | None) -> list[tuple[str, str]]:
    """(cluster, group) the command works on: the one named (in -c's cluster, or the only
    cluster holding that name), or every group (of -c's cluster). AdminError when unknown."""
    _check_name("cluster name", cluster)
    _check_name("broker name", broker_name)
    everything = await ctl.list_groups()
    scope = [g for g in everything if cluster is None or g[0] == cluster]
    where = f"in cluster {cluster} " if cluster else ""
    if broker_name is None:
        if not scope:
            raise AdminError(f"no broker group {where}in the controller (etcd {ctl.endpoint}; groups: "
                             f"{_known(everything)})")
        return scope
    found = [g for g in scope if g[1] == broker_name]
    if not found:
        raise AdminError(f"broker group {broker_name} {where}not found in the controller (etcd "
                         f"{ctl.endpoint}): known groups: {_known(everything)} (is enableControllerMode on?)")
    if len(found) > 1:
        raise UsageError(f"broker group {broker_name} exists in clusters {', '.join(c for c, _ in found)}: "
                         f"pass -c clusterName")
    return found


# ------------------------------------------------------------------------------ the commands

async def _each_group(a, out: Out, fmt: Callable[[GroupView], str]) -> None:
    ctl = Controller(a.controllerAddress)
    try:
        while True:
            blocks = []
            for cluster, group in await groups_of(ctl, a.brokerName, a.clusterName):
                v = await ctl.read_group(cluster, group)
                if v.has_state:        # deleted between the listing and the read: nothing to show
                    blocks.append(fmt(v))
            out("\n\n".join(blocks))
            if not getattr(a, "interval", None):
                return
            await asyncio.sleep(a.interval)
            out("")
    finally:
        await ctl.close()


async def get_sync_state_set(s: AdminSession, a, out: Out) -> None:
    await _each_group(a, out, format_sync_state_set)


async def get_broker_epoch(s: AdminSession, a, out: Out) -> None:
    await _each_group(a, out, format_broker_epoch)


async def elect_master(s: AdminSession, a, out: Out) -> None:
    ctl = Controller(a.controllerAddress)
    try:
        [(cluster, group)] = await groups_of(ctl, a.brokerName, a.clusterName)
        before = await ctl.read_group(cluster, group)
        target = a.brokerId
        if before.leader is None:
            raise AdminError(f"broker group {group} has no master to hand over from: "
                             f"{no_master_note(before) or 'none'}")
        if target == before.leader:
            raise AdminError(f"replica {target} is already the master of {group} (epoch {before.epoch})")
        if SWITCHOVER in before.requests:
            raise AdminError(f"a switchover of {group} to replica {before.requests[SWITCHOVER]} is pending "
                             f"already (key {ctl.request_key(cluster, group, SWITCHOVER).decode()})")
        t0 = time.monotonic()
        await ctl.put_request(cluster, group, SWITCHOVER, str(target).encode())
        now = await _await_outcome(ctl, before, target, t0, a.timeout)
        # the target took the leader key: wait (same bound) until it runs as master of the
        # new epoch (its alive record names it), so the route it registers follows at once
        while not _serving(now, target) and time.monotonic() < t0 + a.timeout:
            await asyncio.sleep(POLL_S)
            now = await ctl.read_group(cluster, group)
        out(format_elect_result(now, before, time.monotonic() - t0))
        if not _serving(now, target):
            print_warnings([f"replica {target} holds the mastership of epoch {now.epoch} but does not run as "
                            f"master yet (see its log)"])
    finally:
        await ctl.close()


def _serving(v: GroupView, target: int) -> bool:
    r = v.alive.get(target)
    return v.leader == target and r is not None and r.epoch == v.epoch


async def _await_outcome(ctl: Controller, before: GroupView, target: int, t0: float, timeout_s: float) -> GroupView:
    cluster, group = before.cluster, before.group
    while True:
        await asyncio.sleep(POLL_S)
        now = await ctl.read_group(cluster, group)
        outcome = switchover_outcome(before, now, target)
        if outcome == DONE:
            return now
        if outcome == REFUSED:
            raise AdminError(f"electMaster refused by the master of {group} (replica {before.leader}): "
                             f"{refusal_reason(now, target)}; the master's log says why (look for 'electMaster')")
        if outcome == OTHER:
            raise AdminError(f"broker group {group} elected replica {now.master} (epoch {now.epoch}) while the "
                             f"switchover to replica {target} was pending: it did not happen")
        if time.monotonic() - t0 > timeout_s:
            await ctl.delete_request(cluster, group, SWITCHOVER)
            raise AdminError(f"no switchover of {group} to replica {target} within {timeout_s:g} s: the request "
                             f"is withdrawn (a handover already under way may still complete: see "
                             f"getSyncStateSet, and the master's log)")


def _controller_opt() -> Opt:
    return Opt("a", "controllerAddress", "the controller: etcd endpoints host:port[;host:port]", required=True,
               type=stripped)


def _read_opts() -> list[Opt]:
    """getSyncStateSet's and getBrokerEpoch's flags (RocketMQ's)."""
    return [_controller_opt(),
            Opt("b", "brokerName", "which broker group (default: every group, of -c's cluster)", type=stripped),
            Opt("c", "clusterName", "which cluster", type=stripped),
            Opt("i", "interval", "print again every N seconds until interrupted", type=positive_int)]


COMMANDS = [
    Command("getSyncStateSet", "Fetch syncStateSet for target brokers", _read_opts(), get_sync_state_set,
            needs_namesrv=False,
            epilog="Per group: the master (who holds the leader key in etcd now), its epoch, the SyncStateSet "
                   "(the replicas holding every acknowledged message; only they can be elected) and its epoch, "
                   "then each replica: alive (a live lease), its log end as it last published it (every "
                   "second) and its lag behind the master's in bytes. A group without a master says what "
                   "happens next."),
    Command("getBrokerEpoch", "Fetch broker epoch entries", _read_opts(), get_broker_epoch, needs_namesrv=False,
            epilog="The group's epoch history (each master's epoch and the offset its writes began at) and "
                   "each live replica's last epoch and log end."),
    Command("electMaster", "Re-elect the specified broker as master", [
        _controller_opt(),
        Opt("b", "brokerName", "the broker group", required=True, type=stripped),
        Opt("i", "brokerId", "the replica (its brokerId) to become master", required=True,
            type=non_negative_int),
        Opt("c", "clusterName", "which cluster (default: the one holding the group)", type=stripped),
        Opt("t", "timeout", f"seconds to wait for the switchover (default {ELECT_WAIT_S:g})",
            type=positive_int, default=int(ELECT_WAIT_S)),
    ], elect_master, needs_namesrv=False,
        epilog="A planned switchover: the master stops acknowledging sends, waits until the replica has "
               "everything, and hands it the mastership of the next epoch. Only a live, connected member "
               "of the SyncStateSet can take it: the master refuses any other (and says why in its log)."),
]
