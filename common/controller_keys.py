"""Controller mode's key layout in the consensus store: the one owner. The brokers' failover
agents (broker/services/consensus.py, consensus_pso.py) write these keys and mqadmin's
controller commands (tools/mqadmin/controller.py) read them; neither may import the other.

PURE module: no I/O. Keys under `prefix` (default ``/pocketmq``), one folder per broker group:

| key                                      | value                                          | lease               |
|------------------------------------------|------------------------------------------------|---------------------|
| ``{prefix}/{cluster}/{group}/state``     | the group's state (JSON: master, epoch,        | none: outlives all  |
|                                          | syncStateSet, syncStateSetEpoch, history)      |                     |
| ``{prefix}/{cluster}/{group}/leader``    | the master's token (``{id}:...``)              | the master's lease  |
| ``{prefix}/{cluster}/{group}/alive/{id}``| a replica's record (JSON: id, addr, haAddr,    | that replica's lease|
|                                          | maxOffset, epoch)                              |                     |
| ``{prefix}/{cluster}/{group}/request/{name}`` | an operator's request (``switchover``: the | none                |
|                                          | target replica's id)                           |                     |
"""
from __future__ import annotations

from collections.abc import Iterable

PREFIX = "/pocketmq"
SWITCHOVER = "switchover"       # the planned switchover request (mqadmin electMaster -b)

# grpc shares subchannels between channels to the same address by default: a fresh channel
# to an etcd member that came back would inherit the dead connection's reconnect backoff (up
# to 2 min of instant "connection refused"). Each channel its own, and a short backoff.
ETCD_CHANNEL_OPTIONS = {
    "grpc.use_local_subchannel_pool": 1,
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}


def check_name(kind: str, name: str) -> str:
    """A cluster, group or request name as a key part; ValueError naming it when it cannot be one."""
    if not name or "/" in name:
        raise ValueError(f"{kind} {name!r}: must be non-empty and contain no '/'")
    return name


def group_base(prefix: str, cluster: str, group: str) -> bytes:
    """The group's folder, ending in '/'."""
    return f"{prefix}/{check_name('cluster', cluster)}/{check_name('group', group)}/".encode()


def alive_key(prefix: str, cluster: str, group: str, replica_id: int) -> bytes:
    return group_base(prefix, cluster, group) + f"alive/{int(replica_id)}".encode()


def request_key(prefix: str, cluster: str, group: str, name: str) -> bytes:
    return group_base(prefix, cluster, group) + b"request/" + check_name("request", name).encode()


def list_base(prefix: str, cluster: str | None) -> bytes:
    """Where every group's keys (of one cluster, or of all) begin."""
    return (f"{prefix}/" + (f"{check_name('cluster', cluster)}/" if cluster is not None else "")).encode()


def key_kind(tail: str) -> tuple[str, str | int | None] | None:
    """What a key below a group's folder is: ("state", None), ("leader", None), ("alive",
    replica id), ("request", name); None for anything else (ignored by every reader)."""
    if tail == "state" or tail == "leader":
        return tail, None
    if tail.startswith("alive/") and tail[6:].isdigit():
        return "alive", int(tail[6:])
    if tail.startswith("request/") and len(tail) > 8:
        return "request", tail[8:]
    return None


def groups_of_keys(prefix: str, keys: Iterable[bytes]) -> list[tuple[str, str]]:
    """(cluster, group) of every group among `keys` that has a state key, sorted."""
    found = []
    for key in keys:
        parts = key[len(prefix) + 1:].decode(errors="replace").split("/")
        if len(parts) == 3 and parts[2] == "state":
            found.append((parts[0], parts[1]))
    return sorted(found)
