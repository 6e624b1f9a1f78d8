"""The broker's only door to etcd (controller mode, broker/services/failover.py): a shell
over the asyncio etcd v3 client `aetcd`. Values are opaque bytes (the caller encodes them).

Key layout: common/controller_keys.py (the one owner; mqadmin's controller commands read it too).

Why CAS on the state's mod_revision: every change of the state is one transaction that
compares the mod_revision the writer read (`GroupSnapshot.state_rev`; 0 = absent) with the
key's current one, so of two writers acting on the same read exactly one wins, and a writer
acting on a stale read loses instead of overwriting what it never saw.

Why the leader key is bound to a lease: the master keeps its lease alive; when it dies or is
cut off, etcd deletes the key when the lease expires, without anyone's help. "Leader key
absent" (create_revision == 0) is then the election's guard, and "leader key holds my token"
the guard of every change a master makes, so a master whose lease lapsed can change nothing.

Every call is bounded by `timeout_s` (aetcd can hang on a partitioned network) and any
failure (timeout, grpc status, OS error) is a ConsensusError naming the endpoint; the next
call then goes to the next endpoint (round robin) on a fresh connection.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aetcd
import grpc

from pocketmq.common import controller_keys as keys

T = TypeVar("T")

class ConsensusError(Exception):
    """etcd unreachable, timed out, or answered an error (message names the endpoint and what failed)."""


class LeaseLost(ConsensusError):
    """the lease is gone (expired or revoked)."""


@dataclass(frozen=True)
class GroupSnapshot:
    revision: int                          # etcd header revision of the read
    state: bytes | None                    # value of {prefix}/{cluster}/{group}/state
    state_rev: int                         # its mod_revision (0 when absent)
    leader: bytes | None                   # value of .../leader (bound to the master's lease)
    leader_lease: int                      # the leader key's lease id (0 if absent)
    alive: dict[int, tuple[bytes, int]]    # replica id -> (value, lease id) of .../alive/{id}
    requests: dict[str, bytes]             # .../request/{name} keys (operator requests)


def _lease_not_found(e: BaseException) -> bool:
    return "lease not found" in str(e)


class ConsensusKeys:
    """What every consensus client shares (this module's EtcdConsensus; the measurement
    backend broker/services/consensus_pso.py): the endpoints, the key layout above, and
    turning a read of the group's keys into a GroupSnapshot."""

    store = "consensus store"

    def __init__(self, endpoints: list[str], *, prefix: str = "/pocketmq", timeout_s: float = 1.0):
        if not endpoints:
            raise ValueError(f"no {self.store} endpoints")
        self._endpoints: list[tuple[str, int]] = []
        for ep in endpoints:
            host, sep, port = ep.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"{self.store} endpoint {ep!r}: expected host:port")
            self._endpoints.append((host, int(port)))
        self.prefix = prefix.rstrip("/")
        self.timeout_s = timeout_s
        self._next = 0                                   # the endpoint the next call uses

    # -- keys (common/controller_keys.py) ----------------------------------------------------
    def _group(self, cluster: str, group: str) -> bytes:
        return keys.group_base(self.prefix, cluster, group)

    def _request_key(self, cluster: str, group: str, name: str) -> bytes:
        return keys.request_key(self.prefix, cluster, group, name)

    def _alive_key(self, cluster: str, group: str, replica_id: int) -> bytes:
        return keys.alive_key(self.prefix, cluster, group, replica_id)

    def _list_base(self, cluster: str | None) -> str:
        return keys.list_base(self.prefix, cluster).decode()

    def endpoint(self, i: int | None = None) -> str:
        host, port = self._endpoints[self._next if i is None else i]
        return f"{host}:{port}"

    @staticmethod
    def _snapshot(base: bytes, revision: int, kvs) -> GroupSnapshot:
        """kvs: (key, value, mod_revision, lease) of every key under the group's folder."""
        state, state_rev, leader, leader_lease = None, 0, None, 0
        alive: dict[int, tuple[bytes, int]] = {}
        requests: dict[str, bytes] = {}
        for key, value, mod_revision, lease in kvs:
            kind = keys.key_kind(key[len(base):].decode(errors="replace"))
            if kind is None:
                continue
            if kind[0] == "state":
                state, state_rev = value, mod_revision
            elif kind[0] == "leader":
                leader, leader_lease = value, lease
            elif kind[0] == "alive":
                alive[kind[1]] = (value, lease)
            else:
                requests[kind[1]] = value
        return GroupSnapshot(revision, state, state_rev, leader, leader_lease, alive, requests)

    def _groups(self, found) -> list[tuple[str, str]]:
        """(cluster, group) of every state key among `found`, sorted."""
        return keys.groups_of_keys(self.prefix, found)


class EtcdConsensus(ConsensusKeys):
    store = "etcd"

    def __init__(self, endpoints: list[str], *, prefix: str = "/pocketmq", timeout_s: float = 1.0):
        super().__init__(endpoints, prefix=prefix, timeout_s=timeout_s)
        self._clients: dict[int, aetcd.Client] = {}
        # clients dropped after a failure, closed once every call begun on them has timed out
        self._retired: list[tuple[float, aetcd.Client]] = []

    # -- the one call path -------------------------------------------------------------------
    async def _call(self, what: str, fn: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        await self._close_retired(force=False)
        i = self._next
        client = self._clients.get(i)
        if client is None:
            host, port = self._endpoints[i]
            client = self._clients[i] = aetcd.Client(host, port, options=keys.ETCD_CHANNEL_OPTIONS)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await fn(client)
        except TimeoutError:
            err = ConsensusError(f"etcd {self.endpoint(i)}: {what} timed out after {self.timeout_s:g} s")
        except (aetcd.ClientError, grpc.RpcError, OSError) as e:
            if _lease_not_found(e):
                raise LeaseLost(f"etcd {self.endpoint(i)}: {what}: lease not found") from e
            err = ConsensusError(f"etcd {self.endpoint(i)}: {what} failed: {type(e).__name__}: {e}")
            err.__cause__ = e
        self._fail(i, client)
        raise err

    def _fail(self, i: int, client: aetcd.Client) -> None:
        """Drop the endpoint's connection (a half-open one may hang every later call) and
        move the next call to the next endpoint."""
        if self._clients.get(i) is client:
            del self._clients[i]
            self._retired.append((time.monotonic() + self.timeout_s + 0.5, client))
        if self._next == i:
            self._next = (i + 1) % len(self._endpoints)

    async def _close_retired(self, force: bool) -> None:
        now = time.monotonic()
        due = [c for t, c in self._retired if force or t <= now]
        if not due:
            return
        self._retired = [(t, c) for t, c in self._retired if not (force or t <= now)]
        for c in due:
            await self._close_client(c)

    async def _close_client(self, client: aetcd.Client) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                await client.close()
        except (TimeoutError, aetcd.ClientError, grpc.RpcError, OSError):
            pass

    # -- leases ------------------------------------------------------------------------------
    async def grant_lease(self, ttl_s: int) -> int:
        lease = await self._call(f"grant lease ({ttl_s} s)", lambda c: c.lease(ttl_s))
        return lease.id

    async def keepalive(self, lease_id: int) -> int:
        """The lease's remaining TTL in seconds; LeaseLost when etcd no longer has it."""
        reply = await self._call(f"keepalive of lease {lease_id:x}", lambda c: c.refresh_lease(lease_id))
        if reply is None:
            raise ConsensusError(f"etcd {self.endpoint()}: keepalive of lease {lease_id:x}: no answer")
        if reply.TTL <= 0:
            raise LeaseLost(f"etcd {self.endpoint()}: lease {lease_id:x} is gone (expired or revoked)")
        return reply.TTL

    async def revoke(self, lease_id: int) -> None:
        """Revoke the lease (its keys go with it); a lease already gone is not an error."""
        try:
            await self._call(f"revoke of lease {lease_id:x}", lambda c: c.revoke_lease(lease_id))
        except LeaseLost:
            pass

    # -- reads -------------------------------------------------------------------------------
    async def read_group(self, cluster: str, group: str) -> GroupSnapshot:
        """All of the group's keys in one read (one revision)."""
        base = self._group(cluster, group)
        res = await self._call(f"read of {base.decode()}", lambda c: c.get_prefix(base))
        return self._snapshot(base, res.header.revision, ((kv.key, kv.value, kv.mod_revision, kv.lease) for kv in res))

    async def list_groups(self, cluster: str | None = None) -> list[tuple[str, str]]:
        """(cluster, group) of every group with a state key, sorted."""
        base = self._list_base(cluster)
        res = await self._call(f"list of {base}",
                               lambda c: c.get_prefix(base.encode(), keys_only=True))
        return self._groups(kv.key for kv in res)

    # -- writes ------------------------------------------------------------------------------
    async def put_alive(self, cluster: str, group: str, replica_id: int, value: bytes, lease_id: int) -> None:
        """LeaseLost when the lease is gone."""
        key = self._alive_key(cluster, group, replica_id)
        await self._call(f"put of {key.decode()}", lambda c: c.put(key, value, lease=lease_id))

    async def cas_state(self, cluster: str, group: str, *, expect_state_rev: int, new_state: bytes,
                        leader_absent: bool = False, expect_leader: bytes | None = None,
                        put_leader: tuple[bytes, int] | None = None, delete_requests: tuple[str, ...] = ()) -> bool:
        """One transaction. Compares: the state's mod_revision == expect_state_rev (0: the
        state must not exist); with leader_absent, no leader key; with expect_leader, the
        leader key's value is that. On success: put the state, put the leader key
        (value, bound to lease) when put_leader, delete the named request keys. True when
        it succeeded; LeaseLost when put_leader's lease is gone."""
        base = self._group(cluster, group)
        state_key, leader_key = base + b"state", base + b"leader"

        def txn(c: aetcd.Client):
            tr = c.transactions
            compare = [tr.mod(state_key) == expect_state_rev]
            if leader_absent:
                compare.append(tr.create(leader_key) == 0)
            if expect_leader is not None:
                compare.append(tr.value(leader_key) == expect_leader)
            success = [tr.put(state_key, new_state)]
            if put_leader is not None:
                success.append(tr.put(leader_key, put_leader[0], lease=put_leader[1]))
            for name in dict.fromkeys(delete_requests):      # etcd refuses a key twice in one txn
                success.append(tr.delete(self._request_key(cluster, group, name)))
            return c.transaction(compare=compare, success=success, failure=[])

        succeeded, _ = await self._call(f"CAS of {state_key.decode()} at revision {expect_state_rev}", txn)
        return bool(succeeded)

    async def put_request(self, cluster: str, group: str, name: str, value: bytes) -> None:
        key = self._request_key(cluster, group, name)
        await self._call(f"put of {key.decode()}", lambda c: c.put(key, value))

    async def delete_request(self, cluster: str, group: str, name: str) -> None:
        key = self._request_key(cluster, group, name)
        await self._call(f"delete of {key.decode()}", lambda c: c.delete(key))

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await self._close_retired(force=True)
        for c in clients:
            await self._close_client(c)
