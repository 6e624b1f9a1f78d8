"""The failover agent's client of the pysyncobj store (``controllerStore=pysyncobj``): the
measurement backend issue 31 compares with etcd (docs/replication.md, "Choosing the
consensus store"), not the shipped choice. The store's members are processes of
tests/support/pso_store.py (pysyncobj is not a dependency of pocketmq and is imported
nowhere here: the members are spoken to in JSON lines over TCP, the wire that file's doc
describes).

Exactly EtcdConsensus's API and rules (broker/services/consensus.py): the same key layout,
GroupSnapshot, ConsensusError / LeaseLost; every call bounded by `timeout_s`; any failure
(timeout, connection, the member's error such as MISSING_LEADER or LEADER_CHANGED) is a
ConsensusError naming the endpoint and moves the next call to the next member on a fresh
connection. Values (bytes) travel base64-encoded; revisions and lease ids are the store's.

One connection per member carries concurrent calls (the agent's keepalive and poll loops),
answers matched by request id; a connection dropped after a failure is closed once the
calls begun on it have ended (each is bounded by its own timeout).
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import socket

from pocketmq.broker.services.consensus import ConsensusError, ConsensusKeys, GroupSnapshot, LeaseLost

MAX_PENDING = 64                 # calls in flight on one connection; more is a ConsensusError
MAX_LINE = 16 << 20              # an answer's size bound (a list of every group's keys)


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _unb64(value: str) -> bytes:
    return base64.b64decode(value)


class _StoreError(Exception):
    """the member answered an error."""


class _Conn:
    """One TCP connection to a member: requests written as lines, answers read by one task."""

    def __init__(self, host: str, port: int) -> None:
        self.pending: dict[int, asyncio.Future] = {}
        self.retired = False
        self.broken: BaseException | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._opened = asyncio.ensure_future(self._open(host, port))

    async def _open(self, host: str, port: int) -> None:
        reader, self._writer = await asyncio.open_connection(host, port, limit=MAX_LINE)
        self._writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader_task = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                resp = json.loads(line)
                fut = self.pending.get(resp.get("i"))
                if fut is not None and not fut.done():
                    fut.set_result(resp)
            err: BaseException = ConnectionError("connection closed by the member")
        except (OSError, ValueError) as e:           # ValueError: bad JSON, or a line past MAX_LINE
            err = e
        self.broken = err
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)

    async def request(self, i: int, op: str, args: list):
        await asyncio.shield(self._opened)          # one open shared by every call waiting on it
        if self.broken is not None:
            raise self.broken
        if len(self.pending) >= MAX_PENDING:
            raise ConsensusError(f"{MAX_PENDING} calls in flight on one connection")
        fut = asyncio.get_running_loop().create_future()
        self.pending[i] = fut
        try:
            self._writer.write(json.dumps({"i": i, "op": op, "a": args}).encode() + b"\n")
            resp = await fut
        finally:
            del self.pending[i]
            if self.retired and not self.pending:
                self.close()
        if "e" in resp:
            raise _StoreError(resp["e"])
        return resp["r"]

    def retire(self) -> None:
        self.retired = True
        if not self.pending:
            self.close()

    def close(self) -> None:
        if not self._opened.done():
            self._opened.cancel()
        elif not self._opened.cancelled():
            self._opened.exception()                # retrieved: a failed open was reported by its caller
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()
        self.broken = self.broken or ConnectionError("connection closed")
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(self.broken)


class PsoConsensus(ConsensusKeys):
    store = "pysyncobj"

    def __init__(self, endpoints: list[str], *, prefix: str = "/pocketmq", timeout_s: float = 1.0):
        super().__init__(endpoints, prefix=prefix, timeout_s=timeout_s)
        self._conns: dict[int, _Conn] = {}
        self._retired: list[_Conn] = []
        self._ids = itertools.count(1)

    # -- the one call path -------------------------------------------------------------------
    async def _call(self, what: str, op: str, *args):
        i = self._next
        conn = self._conns.get(i)
        if conn is None:
            host, port = self._endpoints[i]
            conn = self._conns[i] = _Conn(host, port)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await conn.request(next(self._ids), op, list(args))
        except TimeoutError:
            err = ConsensusError(f"pysyncobj {self.endpoint(i)}: {what} timed out after {self.timeout_s:g} s")
        except (_StoreError, OSError, ValueError) as e:
            err = ConsensusError(f"pysyncobj {self.endpoint(i)}: {what} failed: {type(e).__name__}: {e}")
            err.__cause__ = e
        except ConsensusError as e:
            err = ConsensusError(f"pysyncobj {self.endpoint(i)}: {what}: {e}")
        self._fail(i, conn)
        raise err

    def _fail(self, i: int, conn: _Conn) -> None:
        """Drop the member's connection and move the next call to the next member."""
        if self._conns.get(i) is conn:
            del self._conns[i]
            conn.retire()
            self._retired = [c for c in self._retired if c.pending] + [conn]
        if self._next == i:
            self._next = (i + 1) % len(self._endpoints)

    # -- leases ------------------------------------------------------------------------------
    async def grant_lease(self, ttl_s: int) -> int:
        return int(await self._call(f"grant lease ({ttl_s} s)", "grant", int(ttl_s)))

    async def keepalive(self, lease_id: int) -> int:
        """The lease's TTL in seconds; LeaseLost when the store no longer has it."""
        ttl = await self._call(f"keepalive of lease {lease_id:x}", "keepalive", lease_id)
        if ttl <= 0:
            raise LeaseLost(f"pysyncobj {self.endpoint()}: lease {lease_id:x} is gone (expired or revoked)")
        return ttl

    async def revoke(self, lease_id: int) -> None:
        """Revoke the lease (its keys go with it); a lease already gone is not an error."""
        await self._call(f"revoke of lease {lease_id:x}", "revoke", lease_id)

    # -- reads -------------------------------------------------------------------------------
    async def read_group(self, cluster: str, group: str) -> GroupSnapshot:
        """All of the group's keys in one read through the Raft log (linearizable)."""
        base = self._group(cluster, group)
        revision, kvs = await self._call(f"read of {base.decode()}", "read", base.decode())
        return self._snapshot(base, revision, ((k.encode(), _unb64(v), ver, lease) for k, v, ver, lease in kvs))

    async def list_groups(self, cluster: str | None = None) -> list[tuple[str, str]]:
        """(cluster, group) of every group with a state key, sorted."""
        base = self._list_base(cluster)
        _, kvs = await self._call(f"list of {base}", "read", base, True)
        return self._groups(kv[0].encode() for kv in kvs)

    # -- writes ------------------------------------------------------------------------------
    async def _txn(self, what: str, compares: list, ops: list) -> bool:
        res = await self._call(what, "txn", compares, ops)
        if "lease_missing" in res:
            raise LeaseLost(f"pysyncobj {self.endpoint()}: {what}: lease {res['lease_missing']:x} not found")
        return bool(res["ok"])

    async def put_alive(self, cluster: str, group: str, replica_id: int, value: bytes, lease_id: int) -> None:
        """LeaseLost when the lease is gone."""
        key = self._alive_key(cluster, group, replica_id).decode()
        await self._txn(f"put of {key}", [], [["put", key, _b64(value), lease_id]])

    async def cas_state(self, cluster: str, group: str, *, expect_state_rev: int, new_state: bytes,
                        leader_absent: bool = False, expect_leader: bytes | None = None,
                        put_leader: tuple[bytes, int] | None = None, delete_requests: tuple[str, ...] = ()) -> bool:
        """EtcdConsensus.cas_state's transaction, as one entry of the store's log."""
        base = self._group(cluster, group).decode()
        state_key, leader_key = base + "state", base + "leader"
        compares = [[state_key, "ver", expect_state_rev]]
        if leader_absent:
            compares.append([leader_key, "ver", 0])
        if expect_leader is not None:
            compares.append([leader_key, "value", _b64(expect_leader)])
        ops = [["put", state_key, _b64(new_state), 0]]
        if put_leader is not None:
            ops.append(["put", leader_key, _b64(put_leader[0]), put_leader[1]])
        for name in dict.fromkeys(delete_requests):
            ops.append(["del", self._request_key(cluster, group, name).decode()])
        return await self._txn(f"CAS of {state_key} at revision {expect_state_rev}", compares, ops)

    async def put_request(self, cluster: str, group: str, name: str, value: bytes) -> None:
        key = self._request_key(cluster, group, name).decode()
        await self._txn(f"put of {key}", [], [["put", key, _b64(value), 0]])

    async def delete_request(self, cluster: str, group: str, name: str) -> None:
        key = self._request_key(cluster, group, name).decode()
        await self._txn(f"delete of {key}", [], [["del", key]])

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for c in conns + self._retired:
            c.close()
        self._retired = []
