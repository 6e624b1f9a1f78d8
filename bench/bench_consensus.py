"""Consensus store for automatic failover (issue 31): etcd against pysyncobj on this host,
on the operations the failover agent (broker/services/failover.py) depends on.

    python -m bench.bench_consensus                    # every store and phase, ~2 minutes
    python -m bench.bench_consensus --quick            # fewer ops / kills / lease rounds, ~1 minute
    python -m bench.bench_consensus --stores pso3 --phases ops --ops 500

pysyncobj is a bench-only dependency: `python3 -m pip install pysyncobj` (not in pyproject).

Stores (`--stores`):

  etcd3   3 etcd members (tests/support/etcd.py EtcdCluster: heartbeat 50 ms, election
          500 ms), driven through broker/services/consensus.py EtcdConsensus, the agent's
          client: cas_state (a transaction comparing the state key's mod_revision),
          read_group (one linearizable range read of the group's keys), keepalive.
  etcd1   1 etcd member (EtcdServer), same client.
  pso3    3 members of tests/support/pso_store.py (PsoCluster; the server moved there so
          brokers and the chaos test can use it: its doc describes the state machine, the
          JSON-lines wire and the emulated leases), each a pysyncobj SyncObj with the same
          Raft timings (heartbeat 50 ms, election timeout 0.5-1.0 s, leaderFallbackTimeout
          1 s, appendEntriesUseBatch off: an entry is sent at once instead of on the next
          100 ms batch; journal file on disk) replicating a dict of key -> [value, version,
          lease]: here cas(key, expected_version, value, lease), read(prefix) through the
          log (linearizable) and read_local (this member's copy, possibly stale),
          grant(ttl), keepalive(lease). A member that is not the Raft leader forwards the
          command to it (pysyncobj's own forwarding); during an election it answers
          MISSING_LEADER at once (wait_leader_s=0, as the recorded figures were taken).
          The client (PsoClient below): one request at a time, a timeout, the next member
          on any failure (EtcdConsensus's rule). The agent's own client of these members
          is broker/services/consensus_pso.py (controllerStore=pysyncobj).
  pso3-defaults  the same with pysyncobj's default timings (batched appends every 100 ms,
          election 0.4-1.4 s); not in the default list.

Leases on pysyncobj (it has none) are emulated as etcd's lessor does it, at a cost in
safety (our lease code; every keepalive a log entry; no fsync of the journal): see
tests/support/pso_store.py.

Phases (`--phases`):

  ops    sequential CAS, read and keepalive, `--ops` each (2000), p50/p99 ms, through the
         leader and (3 members) through a follower; the store processes' CPU (utime+stime
         of every member, /proc/PID/stat) and this client's CPU per 1000 ops; etcd's WAL
         fsyncs (its /metrics) during the CAS run.
  kill   `--kills` times (10): SIGKILL the consensus leader, then read + CAS (as the agent
         does) in a loop until a CAS succeeds; time from the kill to that CAS, p50/max.
         The client starts on the leader in even rounds and on a follower in odd ones. The
         killed member is restarted on its data between rounds. 3-member stores only.
         BENCH_DEBUG=1 prints each failed call of the loop (timeouts, LEADER_CHANGED...).
  lease  `--lease-rounds` times (4): a key bound to a TTL 2 s lease, renewed every 0.5 s
         (the agent's TTL/4), then no more; the key is read (linearizable) every 10 ms.
         Figure: from the last keepalive's SEND (the holder's fencing reference: it stops
         acknowledging at send + 0.8 TTL) to the first read that finds the key gone.

Every store runs on 127.0.0.1; bench_broker's loopback calibration is printed before and
after, as in the other benches. Prints a table (markdown) and `--json` writes everything.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.pso_store import FAST_RAFT  # noqa: E402  (the store's members and their timings)

STORES = ("etcd3", "etcd1", "pso3")
ALL_STORES = STORES + ("pso3-defaults",)
PHASES = ("ops", "kill", "lease")
CLUSTER, GROUP = "BenchCluster", "bench-a"
PREFIX = "/bench-consensus"
GROUP_PREFIX = f"{PREFIX}/{CLUSTER}/{GROUP}/"
# about the size of the agent's GroupState JSON (epoch, master, SyncStateSet, epochs)
STATE = json.dumps({"epoch": 7, "master": 1, "masterAddr": "127.0.0.1:10911", "syncStateSet": [1, 2, 3],
                    "syncStateSetEpoch": 12, "startOffset": 1 << 40, "pad": "x" * 40}).encode()
LEASE_TTL_S = 2
LEASE_MARGIN = 0.8          # broker/services/failover.py: the holder fences at send + TTL * 0.8
SETUP_LEASE_TTL_S = 600     # the group's leader/alive keys in the ops/kill phases: never expire there
PSO_RAFT = {"pso3": FAST_RAFT, "pso3-defaults": {}}


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


def proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class StoreError(Exception):
    """a call failed (timeout, connection, the store's error); the client moved to the next member."""


# -- store clusters (processes) --------------------------------------------------------------

class EtcdStore:
    """etcd members (tests/support/etcd.py) and the agent's client, EtcdConsensus."""

    def __init__(self, n: int, timeout_s: float):
        from tests.support.etcd import EtcdCluster, EtcdServer
        self.n = n
        self.timeout_s = timeout_s
        self.impl = EtcdCluster(n) if n > 1 else EtcdServer()

    @property
    def members(self):
        return self.impl.members if self.n > 1 else [self.impl.member]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self) -> None:
        self.impl.start()

    def stop(self) -> None:
        self.impl.stop()

    def pids(self) -> list[int]:
        return [m.proc.pid for m in self.members if m.proc is not None]

    def _metrics(self, i: int) -> dict[str, float]:
        out = {}
        try:
            with urllib.request.urlopen(f"http://{self.members[i].endpoint}/metrics", timeout=0.5) as r:
                for line in r.read().decode().splitlines():
                    if line and not line.startswith("#"):
                        name, _, value = line.rpartition(" ")
                        out[name] = float(value)
        except (OSError, ValueError):
            pass
        return out

    def leader_index(self) -> int | None:
        for i in range(self.n):
            if self.members[i].proc is not None and self._metrics(i).get("etcd_server_is_leader") == 1:
                return i
        return None

    def fsyncs(self) -> tuple[float, float]:
        """(WAL fsyncs, their seconds) summed over the members, from etcd's /metrics."""
        count = total = 0.0
        for i in range(self.n):
            m = self._metrics(i)
            count += m.get("etcd_disk_wal_fsync_duration_seconds_count", 0.0)
            total += m.get("etcd_disk_wal_fsync_duration_seconds_sum", 0.0)
        return count, total

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        from tests.support.etcd import _healthy
        deadline = time.monotonic() + timeout_s
        while not (all(_healthy(m.client_port) for m in self.members) and self.leader_index() is not None):
            if time.monotonic() > deadline:
                raise RuntimeError("etcd: no healthy cluster with a leader in time")
            time.sleep(0.05)

    def kill(self, i: int) -> None:
        self.impl.kill(i)

    def restart(self, i: int) -> None:
        self.impl.restart(i)

    def client(self, first: int = 0) -> "EtcdClient":
        eps = self.endpoints
        return EtcdClient(eps[first:] + eps[:first], self.timeout_s)


class PsoStore:
    """n members of tests/support/pso_store.py (PsoCluster), answering MISSING_LEADER at
    once during an election (wait_leader_s=0: how the recorded figures were taken)."""

    def __init__(self, n: int, timeout_s: float, raft_conf: dict):
        from tests.support.pso_store import PsoCluster
        self.n = n
        self.timeout_s = timeout_s
        self.impl = PsoCluster(n, raft_conf=raft_conf, wait_leader_s=0.0)
        self.endpoints = self.impl.endpoints
        for name in ("start", "stop", "pids", "leader_index", "wait_healthy", "kill", "restart"):
            setattr(self, name, getattr(self.impl, name))

    def fsyncs(self) -> tuple[float, float]:
        return 0.0, 0.0

    def client(self, first: int = 0) -> "PsoClient":
        eps = self.endpoints
        return PsoClient(eps[first:] + eps[:first], self.timeout_s)


# -- clients (the agent's side), one interface -----------------------------------------------

class Snap:
    __slots__ = ("state_rev", "leader", "alive")

    def __init__(self, state_rev: int, leader: bool, alive: set[int]):
        self.state_rev, self.leader, self.alive = state_rev, leader, alive


class EtcdClient:
    def __init__(self, endpoints: list[str], timeout_s: float):
        from pocketmq.broker.services.consensus import ConsensusError, EtcdConsensus
        self.c = EtcdConsensus(endpoints, prefix=PREFIX, timeout_s=timeout_s)
        self.errors = ConsensusError
        self._head = 0          # etcd's revision as last seen: a CAS we win makes the state's mod_revision head + 1

    async def _wrap(self, coro):
        try:
            return await coro
        except self.errors as e:
            raise StoreError(str(e)) from e

    async def read(self) -> Snap:
        s = await self._wrap(self.c.read_group(CLUSTER, GROUP))
        self._head = s.revision
        return Snap(s.state_rev, s.leader is not None, set(s.alive))

    async def read_local(self) -> Snap:
        raise NotImplementedError

    async def cas(self, expect: int) -> int | None:
        """The state's new version when the CAS won, None when it lost."""
        if await self._wrap(self.c.cas_state(CLUSTER, GROUP, expect_state_rev=expect, new_state=STATE)):
            self._head += 1     # this bench is the only writer while it times CAS
            return self._head
        return None

    async def grant(self, ttl: int) -> int:
        return await self._wrap(self.c.grant_lease(ttl))

    async def keepalive(self, lease: int) -> int:
        return await self._wrap(self.c.keepalive(lease))

    async def put_alive(self, rid: int, lease: int) -> None:
        await self._wrap(self.c.put_alive(CLUSTER, GROUP, rid, b'{"addr": "127.0.0.1:10911", "end": 0}', lease))

    async def setup(self, lease: int) -> None:
        s = await self.read()
        ok = await self._wrap(self.c.cas_state(CLUSTER, GROUP, expect_state_rev=s.state_rev, new_state=STATE,
                                               leader_absent=not s.leader, put_leader=(b"token-1", lease)))
        assert ok, "setup CAS lost"
        for rid in (1, 2, 3):
            await self.put_alive(rid, lease)

    async def close(self) -> None:
        await self.c.close()


class PsoClient:
    def __init__(self, endpoints: list[str], timeout_s: float):
        self.endpoints = [(h, int(p)) for h, _, p in (e.rpartition(":") for e in endpoints)]
        self.timeout_s = timeout_s
        self._next = 0
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._id = 0

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None

    async def _call(self, op: str, *a):
        i = self._next
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._conn is None:
                    r, w = await asyncio.open_connection(*self.endpoints[i])
                    w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._conn = (r, w)
                r, w = self._conn
                self._id += 1
                w.write(json.dumps({"i": self._id, "op": op, "a": list(a)}).encode() + b"\n")
                line = await r.readline()
            if not line:
                raise ConnectionError("connection closed")
            resp = json.loads(line)
            if "e" in resp:
                raise RuntimeError(resp["e"])
            return resp["r"]
        except (TimeoutError, OSError, ConnectionError, ValueError, RuntimeError) as e:
            # EtcdConsensus's rule: any failure, a fresh connection to the next member
            self._drop()
            self._next = (i + 1) % len(self.endpoints)
            raise StoreError(f"pysyncobj {self.endpoints[i]}: {op}: {type(e).__name__}: {e}") from e

    @staticmethod
    def _snap(r) -> Snap:
        state_rev, leader, alive = 0, False, set()
        for key, _value, ver, _lease in r[1]:
            tail = key[len(GROUP_PREFIX):]
            if tail == "state":
                state_rev = ver
            elif tail == "leader":
                leader = True
            elif tail.startswith("alive/"):
                alive.add(int(tail[6:]))
        return Snap(state_rev, leader, alive)

    async def read(self) -> Snap:
        return self._snap(await self._call("read", GROUP_PREFIX))

    async def read_local(self) -> Snap:
        return self._snap(await self._call("read_local", GROUP_PREFIX))

    async def cas(self, expect: int) -> int | None:
        ok, ver = await self._call("cas", GROUP_PREFIX + "state", expect, STATE.decode(), 0)
        return ver if ok else None

    async def grant(self, ttl: int) -> int:
        return await self._call("grant", ttl)

    async def keepalive(self, lease: int) -> int:
        ttl = await self._call("keepalive", lease)
        if ttl <= 0:
            raise StoreError(f"lease {lease} is gone")
        return ttl

    async def put_alive(self, rid: int, lease: int) -> None:
        ok, _ = await self._call("cas", f"{GROUP_PREFIX}alive/{rid}", -1, '{"addr": "127.0.0.1:10911", "end": 0}',
                                 lease)
        if not ok:
            raise StoreError(f"lease {lease} is gone")

    async def setup(self, lease: int) -> None:
        s = await self.read()
        ok, _ = await self._call("cas", GROUP_PREFIX + "state", s.state_rev, STATE.decode(), 0)
        assert ok, "setup CAS lost"
        await self._call("cas", GROUP_PREFIX + "leader", -1, "token-1", lease)
        for rid in (1, 2, 3):
            await self.put_alive(rid, lease)

    async def close(self) -> None:
        self._drop()


# -- phases ----------------------------------------------------------------------------------

async def time_ops(store, cli, op: str, n: int) -> dict:
    lat: list[float] = []
    errors = lost = 0
    snap = await cli.read()
    rev = snap.state_rev
    lease = await cli.grant(SETUP_LEASE_TTL_S) if op == "keepalive" else 0
    pids = store.pids()
    cpu0 = sum(proc_cpu_s(p) for p in pids)
    ccpu0 = time.process_time()
    fs0 = store.fsyncs() if op == "cas" else None
    t_start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        try:
            if op == "cas":
                new = await cli.cas(rev)
                if new is None:
                    lost += 1
                    rev = (await cli.read()).state_rev
                    continue
                rev = new
            elif op == "read":
                await cli.read()
            elif op == "read_local":
                await cli.read_local()
            else:
                await cli.keepalive(lease)
        except StoreError:
            errors += 1
            continue
        lat.append((time.perf_counter_ns() - t0) / 1e6)
    wall = time.perf_counter() - t_start
    cpu = sum(proc_cpu_s(p) for p in pids) - cpu0
    ccpu = time.process_time() - ccpu0
    out = {"n": n, "p50_ms": round(pct(lat, 50), 3), "p99_ms": round(pct(lat, 99), 3),
           "max_ms": round(max(lat), 2), "ops_per_s": round(len(lat) / wall),
           "store_cpu_ms_per_1000": round(cpu * 1e6 / n, 1), "client_cpu_ms_per_1000": round(ccpu * 1e6 / n, 1),
           "errors": errors, "cas_lost": lost}
    if fs0 is not None and store.fsyncs()[0]:
        fs1 = store.fsyncs()
        out["wal_fsyncs_per_cas_all_members"] = round((fs1[0] - fs0[0]) / n, 2)
        out["wal_fsync_mean_ms"] = round(1000 * (fs1[1] - fs0[1]) / max(1, fs1[0] - fs0[0]), 3)
    if op == "cas":
        final = await cli.read()
        out["final_state_rev_as_expected"] = final.state_rev == rev
    return out


async def phase_ops(store, name: str, args) -> dict:
    res = {}
    lead = store.leader_index()
    vias = [("leader", lead)] + ([("follower", (lead + 1) % store.n)] if store.n > 1 else [])
    ops = ["cas", "read"] + (["read_local"] if name.startswith("pso") else []) + ["keepalive"]
    for via, first in vias:
        cli = store.client(first)
        try:
            for op in ops:
                r = await time_ops(store, cli, op, args.ops)
                res[f"{op}_via_{via}"] = r
                print(f"  {name} {op} via {via}: {r}", flush=True)
        finally:
            await cli.close()
    res["rss_mib_all_members"] = round(sum(proc_rss_mib(p) for p in store.pids()), 1)
    return res


async def phase_kill(store, name: str, args) -> dict:
    times, attempts_l = [], []
    for r in range(args.kills):
        await asyncio.to_thread(store.wait_healthy)
        await asyncio.sleep(0.3)
        lead = store.leader_index()
        first = lead if r % 2 == 0 else (lead + 1) % store.n
        cli = store.client(first)
        try:
            s = await cli.read()
            await cli.cas(s.state_rev)             # warm: connected, a CAS just went through
            t0 = time.perf_counter()
            store.kill(lead)
            attempts = 0
            while True:
                attempts += 1
                try:
                    s = await cli.read()
                    if await cli.cas(s.state_rev) is not None:
                        break
                except StoreError as e:
                    if os.environ.get("BENCH_DEBUG"):
                        print(f"    {time.perf_counter() - t0:.3f} s: {e}", flush=True)
                    await asyncio.sleep(0.005)     # a refused connect fails in microseconds
                if time.perf_counter() - t0 > 30:
                    raise RuntimeError(f"{name}: no CAS within 30 s of the leader's kill")
            dt = time.perf_counter() - t0
        finally:
            await cli.close()
        times.append(round(dt, 3))
        attempts_l.append(attempts)
        print(f"  {name} kill {r + 1}: leader {lead} killed, client started on "
              f"{'the leader' if first == lead else 'a follower'}; first CAS after {dt:.3f} s "
              f"({attempts} attempts)", flush=True)
        await asyncio.to_thread(store.restart, lead)
    return {"kill_to_cas_s": times, "p50_s": pct(times, 50), "max_s": max(times),
            "client_on_leader_s": times[0::2], "client_on_follower_s": times[1::2], "attempts": attempts_l}


async def phase_lease(store, name: str, args) -> dict:
    observed, read_ms = [], []
    cli = store.client(store.leader_index() or 0)
    try:
        for r in range(args.lease_rounds):
            rid = 100 + r
            lease = await cli.grant(LEASE_TTL_S)
            await cli.put_alive(rid, lease)
            for _ in range(3):
                await asyncio.sleep(LEASE_TTL_S / 4)
                t_sent = time.perf_counter()
                await cli.keepalive(lease)
            while True:                              # no more renewals: how long until it is gone
                await asyncio.sleep(0.01)
                t_read = time.perf_counter()
                try:
                    snap = await cli.read()
                except StoreError:
                    continue
                read_ms.append((time.perf_counter() - t_read) * 1000)
                if rid not in snap.alive:
                    t_gone = time.perf_counter()
                    break
                if t_read - t_sent > 10 * LEASE_TTL_S:
                    raise RuntimeError(f"{name}: lease not expired after {10 * LEASE_TTL_S} s")
            observed.append(round(t_gone - t_sent, 3))
            print(f"  {name} lease {r + 1}: TTL {LEASE_TTL_S} s, gone {t_gone - t_sent:.3f} s after the last "
                  f"keepalive's send", flush=True)
    finally:
        await cli.close()
    return {"ttl_s": LEASE_TTL_S, "observed_s": observed, "min_s": min(observed), "median_s": pct(observed, 50),
            "max_s": max(observed), "poll_ms": 10, "read_p50_ms_while_polling": round(pct(read_ms, 50), 2),
            "never_before_holder_fence": min(observed) >= LEASE_TTL_S * LEASE_MARGIN}


def make_store(name: str, timeout_s: float):
    if name == "etcd3":
        return EtcdStore(3, timeout_s)
    if name == "etcd1":
        return EtcdStore(1, timeout_s)
    return PsoStore(3, timeout_s, PSO_RAFT[name])


async def bench_store(name: str, args) -> dict:
    store = make_store(name, args.timeout_s)
    t0 = time.perf_counter()
    await asyncio.to_thread(store.start)
    res = {"start_s": round(time.perf_counter() - t0, 2), "load_before": loadavg()}
    print(f"{name}: started in {res['start_s']} s, load {res['load_before']}", flush=True)
    try:
        cli = store.client(0)
        try:
            lease = await cli.grant(SETUP_LEASE_TTL_S)
            await cli.setup(lease)
        finally:
            await cli.close()
        if "ops" in args.phases:
            res["ops"] = await phase_ops(store, name, args)
        if "kill" in args.phases and store.n > 1:
            res["kill"] = await phase_kill(store, name, args)
        if "lease" in args.phases:
            res["lease"] = await phase_lease(store, name, args)
    finally:
        await asyncio.to_thread(store.stop)
    res["load_after"] = loadavg()
    return res


# -- report ----------------------------------------------------------------------------------

LABELS = {"etcd3": "etcd, 3 members", "etcd1": "etcd, 1 member", "pso3": "pysyncobj, 3 processes",
          "pso3-defaults": "pysyncobj defaults, 3 processes"}


def table(result: dict) -> str:
    stores = [s for s in result["stores"] if s in result]

    def cell(s, *path, fmt="{}"):
        v = result[s]
        for k in path:
            if not isinstance(v, dict) or k not in v:
                return "-"
            v = v[k]
        return fmt.format(v)

    def lat(s, key):
        p50, p99 = cell(s, "ops", key, "p50_ms"), cell(s, "ops", key, "p99_ms")
        return "-" if p50 == "-" else f"{float(p50):.2f} / {float(p99):.2f}"

    rows = []
    for op, what in (("cas", "CAS"), ("read", "read (linearizable)"), ("read_local", "read (member's copy)"),
                     ("keepalive", "keepalive")):
        for via in ("leader", "follower"):
            rows.append((f"{what} p50 / p99 ms, via the {via}", [lat(s, f"{op}_via_{via}") for s in stores]))
    for op, what in (("cas", "CAS"), ("read", "read"), ("keepalive", "keepalive")):
        rows.append((f"store CPU ms per 1000 {what} (all members; via the leader)",
                     [cell(s, "ops", f"{op}_via_leader", "store_cpu_ms_per_1000") for s in stores]))
    rows.append(("client CPU ms per 1000 CAS", [cell(s, "ops", "cas_via_leader", "client_cpu_ms_per_1000")
                                                for s in stores]))
    rows.append(("WAL fsyncs per CAS (all members), mean fsync ms",
                 [f"{cell(s, 'ops', 'cas_via_leader', 'wal_fsyncs_per_cas_all_members')}, "
                  f"{cell(s, 'ops', 'cas_via_leader', 'wal_fsync_mean_ms')}" if s.startswith("etcd") else "none"
                  for s in stores]))
    rows.append(("RSS MiB, all members", [cell(s, "ops", "rss_mib_all_members") for s in stores]))
    rows.append(("leader SIGKILL -> first CAS, p50 / max s",
                 [f"{cell(s, 'kill', 'p50_s')} / {cell(s, 'kill', 'max_s')}" if "kill" in result[s] else "-"
                  for s in stores]))
    rows.append((f"lease TTL {LEASE_TTL_S} s: gone after, min / median / max s",
                 [f"{cell(s, 'lease', 'min_s')} / {cell(s, 'lease', 'median_s')} / {cell(s, 'lease', 'max_s')}"
                  if "lease" in result[s] else "-" for s in stores]))
    rows.append(("load average before / after", [f"{cell(s, 'load_before')} / {cell(s, 'load_after')}"
                                                 for s in stores]))
    rows = [r for r in rows if any(c not in ("-", "- / -", "-, -", "none") for c in r[1])]
    lines = ["| | " + " | ".join(LABELS[s] for s in stores) + " |", "|---" * (len(stores) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows]
    return "\n".join(lines)


def run(args) -> dict:
    result = {"command": " ".join([os.path.basename(sys.executable), "-m", "bench.bench_consensus"] + sys.argv[1:]),
              "stores": args.stores, "ops": args.ops, "kills": args.kills, "lease_rounds": args.lease_rounds,
              "timeout_s": args.timeout_s, "etcd": subprocess.run(["etcd", "--version"], capture_output=True,
                                                                 text=True).stdout.split("\n")[0]}
    try:
        import pysyncobj
        result["pysyncobj"] = pysyncobj.__version__ if hasattr(pysyncobj, "__version__") else ""
        from pysyncobj.version import VERSION
        result["pysyncobj"] = VERSION
    except ImportError:
        if any(s.startswith("pso") for s in args.stores):
            sys.exit("pysyncobj is not installed: python3 -m pip install pysyncobj (bench only)")
    t0 = time.perf_counter()
    for name in args.stores:
        result[name] = asyncio.run(bench_store(name, args))
        print(json.dumps({name: result[name]}, indent=1), flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(table(result), flush=True)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", default=",".join(STORES), help=f"of {','.join(ALL_STORES)}")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--ops", type=int, default=2000, help="ops: sequential operations of each kind and path")
    ap.add_argument("--kills", type=int, default=10, help="kill: leader kills per 3-member store")
    ap.add_argument("--lease-rounds", type=int, default=4)
    ap.add_argument("--timeout-s", type=float, default=0.5,
                    help="the client's timeout per call (the agent's: max(0.3, TTL / 4) = 0.5 s)")
    ap.add_argument("--quick", action="store_true", help="--ops 300 --kills 3 --lease-rounds 2")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.ops, args.kills, args.lease_rounds = 300, 3, 2
    args.stores = args.stores.split(",")
    args.phases = set(args.phases.split(","))
    if set(args.stores) - set(ALL_STORES):
        ap.error(f"unknown stores {sorted(set(args.stores) - set(ALL_STORES))}; known: {','.join(ALL_STORES)}")
    if args.phases - set(PHASES):
        ap.error(f"unknown phases {sorted(args.phases - set(PHASES))}; known: {','.join(PHASES)}")
    from bench.bench_broker import calibrated
    calibrated(lambda: run(args), args.json)


if __name__ == "__main__":
    main()
