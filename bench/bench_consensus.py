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
  pso3    3 processes (this file, --pso-serve), each a pysyncobj SyncObj with the same Raft
          timings (heartbeat 50 ms, election timeout 0.5-1.0 s, leaderFallbackTimeout 1 s,
          appendEntriesUseBatch off: an entry is sent at once instead of on the next 100 ms
          batch; journal file on disk) replicating a small state machine: a dict of
          key -> [value, version, lease]: cas(key, expected_version, value, lease),
          read(prefix) through the log (linearizable) and read_local (this member's copy,
          possibly stale), grant(ttl), keepalive(lease), expire(lease, renewals). Each
          process also serves that API to clients over its own TCP port (JSON lines), as a
          nameserver embedding the controller would serve brokers; a member that is not
          the Raft leader forwards the command to it (pysyncobj's own forwarding).
          The client: one request at a time, a timeout, the next member on any failure
          (EtcdConsensus's rule).
  pso3-defaults  the same with pysyncobj's default timings (batched appends every 100 ms,
          election 0.4-1.4 s); not in the default list.

Leases on pysyncobj (it has none): emulated as etcd's lessor does it. grant/keepalive are
log entries; every member notes (its own monotonic clock, not replicated) when it applied a
lease's last renewal; the member that is Raft leader checks every tick (~50 ms) and, past
the TTL, proposes expire(lease, renewals seen), which deletes the lease and its keys unless
a renewal got into the log first. A member that becomes leader restarts every lease's TTL
from then (etcd's Promote). What that costs in safety: the lease code is ours (the issue
wants no consensus code of our own); every keepalive is a log entry on every member (etcd
renews leases on its leader only, outside the log); expiry depends on the leader's clock
rate, as etcd's; and pysyncobj writes its journal through mmap without fsync, so an
acknowledged CAS survives a process crash but not the loss of a majority of hosts' page
caches (etcd fsyncs its WAL before answering).

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
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
PSO_RAFT = {"pso3": dict(appendEntriesUseBatch=False, appendEntriesPeriod=0.05, raftMinTimeout=0.5,
                         raftMaxTimeout=1.0, leaderFallbackTimeout=1.0),
            "pso3-defaults": {}}


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


# -- the pysyncobj side: a member process ----------------------------------------------------

def _group_state_class():
    from pysyncobj import SyncObjConsumer, replicated

    class GroupState(SyncObjConsumer):
        """The replicated state machine (see the module doc). Methods marked @replicated
        run on every member in log order; their result goes to the proposer's callback."""

        def __init__(self):
            # soft state, per member, not replicated (set before SyncObjConsumer.__init__,
            # so pysyncobj leaves it out of its full dumps)
            self.renewed: dict[int, float] = {}      # lease -> when this member applied its last renewal
            self.proposed: dict[int, int] = {}       # lease -> renewals count an expire was proposed at
            self.was_leader = False
            super().__init__()
            self.kv: dict[str, list] = {}            # key -> [value, version, lease]
            self.leases: dict[int, list] = {}        # lease -> [ttl, renewals]
            self.rev = 0
            self.last_lease = 0

        @replicated
        def cas(self, key, expect, value, lease):
            """expect: the key's version (0: absent; -1: any). [ok, version]."""
            cur = self.kv.get(key)
            ver = cur[1] if cur else 0
            if expect >= 0 and ver != expect:
                return [False, ver]
            if lease and lease not in self.leases:
                return [False, -1]
            self.rev += 1
            self.kv[key] = [value, self.rev, lease]
            return [True, self.rev]

        def _scan(self, prefix):
            return [self.rev, [[k, v[0], v[1], v[2]] for k, v in list(self.kv.items()) if k.startswith(prefix)]]

        @replicated
        def read(self, prefix):
            return self._scan(prefix)

        def read_local(self, prefix):
            return self._scan(prefix)

        @replicated
        def grant(self, ttl):
            self.last_lease += 1
            self.leases[self.last_lease] = [ttl, 0]
            self.renewed[self.last_lease] = time.monotonic()
            return self.last_lease

        @replicated
        def keepalive(self, lease):
            entry = self.leases.get(lease)
            if entry is None:
                return -1
            entry[1] += 1
            self.renewed[lease] = time.monotonic()
            return entry[0]

        @replicated
        def expire(self, lease, renewals):
            entry = self.leases.get(lease)
            if entry is None or entry[1] != renewals:
                return False                         # renewed after the leader decided: keep it
            del self.leases[lease]
            self.renewed.pop(lease, None)
            gone = [k for k, v in self.kv.items() if v[2] == lease]
            if gone:
                self.rev += 1
                for k in gone:
                    del self.kv[k]
            return True

        def tick(self):
            """pysyncobj's tick thread, every tick (<= autoTickPeriod, 50 ms): the leader
            proposes the expiry of leases not renewed for their TTL by its clock."""
            so = self._syncObj
            if so is None:
                return
            leader = so._isLeader()
            now = time.monotonic()
            if leader and not self.was_leader:
                for lease in self.leases:            # a new leader restarts every TTL (etcd's Promote)
                    self.renewed[lease] = now
                self.proposed.clear()
            self.was_leader = leader
            if not leader:
                return
            for lease, (ttl, renewals) in list(self.leases.items()):
                since = self.renewed.setdefault(lease, now)
                if now - since > ttl and self.proposed.get(lease) != renewals:
                    self.proposed[lease] = renewals
                    self.expire(lease, renewals)

    return GroupState


def pso_serve(args) -> None:
    """--pso-serve I: member I of the pysyncobj cluster, its client API on --pso-port."""
    from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
    names = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}
    raft = args.pso_raft.split(",")
    me = raft[args.pso_serve]
    state = _group_state_class()()
    tag = me.replace(":", "_")
    conf = SyncObjConf(journalFile=os.path.join(args.pso_dir, f"{tag}.journal"),
                       fullDumpFile=os.path.join(args.pso_dir, f"{tag}.dump"),
                       connectionRetryTime=0.5, **json.loads(args.pso_conf))
    so = SyncObj(me, [a for a in raft if a != me], conf, consumers=[state])
    so.addOnTickCallback(state.tick)

    def status() -> dict:
        st = so.getStatus()
        leader = st["leader"]
        return {"self": me, "state": st["state"], "leader": leader.id if leader is not None else None,
                "term": st["raft_term"], "commit": st["commit_idx"], "applied": st["last_applied"],
                "connected": sum(1 for k, v in st.items() if k.startswith("partner_node_status_server_") and v == 2),
                "has_quorum": st["has_quorum"]}

    async def serve() -> None:
        loop = asyncio.get_running_loop()

        def call(method, *a):
            fut = loop.create_future()

            def settle(res, err):
                if fut.done():
                    return
                if err == FAIL_REASON.SUCCESS:
                    fut.set_result(res)
                else:
                    fut.set_exception(RuntimeError(f"pysyncobj {names.get(err, err)}"))

            method(*a, callback=lambda res, err: loop.call_soon_threadsafe(settle, res, err))
            return fut

        async def handle(reader, writer):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                while line := await reader.readline():
                    req = json.loads(line)
                    op, a = req["op"], req.get("a", [])
                    try:
                        if op == "status":
                            r = status()
                        elif op == "read_local":
                            r = state.read_local(*a)
                        elif op in ("cas", "read", "grant", "keepalive"):
                            r = await asyncio.wait_for(call(getattr(state, op), *a), 5.0)
                        else:
                            raise ValueError(f"unknown op {op!r}")
                        resp = {"i": req["i"], "r": r}
                    except Exception as e:
                        resp = {"i": req["i"], "e": f"{type(e).__name__}: {e}"}
                    writer.write(json.dumps(resp).encode() + b"\n")
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", args.pso_port)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


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
    """n processes of this file in --pso-serve mode."""

    def __init__(self, n: int, timeout_s: float, raft_conf: dict):
        from tests.support.daemons import free_port
        self.n = n
        self.timeout_s = timeout_s
        self.raft_conf = raft_conf
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-pso-")
        self.raft = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.ports = [free_port() for _ in range(n)]
        self.procs: list[subprocess.Popen | None] = [None] * n

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def spawn(self, i: int) -> None:
        log = open(os.path.join(self.tmp.name, f"n{i}.log"), "ab")
        try:
            self.procs[i] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--pso-serve", str(i), "--pso-raft", ",".join(self.raft),
                 "--pso-port", str(self.ports[i]), "--pso-dir", self.tmp.name,
                 "--pso-conf", json.dumps(self.raft_conf)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()

    def start(self) -> None:
        for i in range(self.n):
            self.spawn(i)
        self.wait_healthy()

    def stop(self) -> None:
        for i in range(self.n):
            self.kill(i)
        self.tmp.cleanup()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    def status(self, i: int) -> dict | None:
        if self.procs[i] is None or self.procs[i].poll() is not None:
            return None
        try:
            with socket.create_connection(("127.0.0.1", self.ports[i]), timeout=0.5) as s:
                s.sendall(b'{"i": 0, "op": "status"}\n')
                buf = b""
                while not buf.endswith(b"\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        return None
                    buf += chunk
            return json.loads(buf).get("r")
        except (OSError, ValueError):
            return None

    def leader_index(self) -> int | None:
        best = None
        for i in range(self.n):
            st = self.status(i)
            if st is not None and st["state"] == 2 and (best is None or st["term"] > best[1]):
                best = (i, st["term"])
        return best and best[0]

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        """Every member up, connected to all others, agreeing on one leader, and applied up
        to the leader's commit index."""
        deadline = time.monotonic() + timeout_s
        while True:
            sts = [self.status(i) for i in range(self.n)]
            if all(sts):
                leaders = {st["leader"] for st in sts}
                lead = [st for st in sts if st["state"] == 2]
                if (len(leaders) == 1 and None not in leaders and len(lead) == 1
                        and all(st["connected"] == self.n - 1 for st in sts)
                        and all(st["applied"] >= lead[0]["commit"] for st in sts)):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"pysyncobj: no healthy cluster in time: {sts}")
            time.sleep(0.05)

    def kill(self, i: int) -> None:
        p = self.procs[i]
        if p is not None:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait(5)
            self.procs[i] = None

    def restart(self, i: int) -> None:
        self.kill(i)
        self.spawn(i)
        self.wait_healthy()

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
    ap.add_argument("--pso-serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--pso-raft", help=argparse.SUPPRESS)
    ap.add_argument("--pso-port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--pso-dir", help=argparse.SUPPRESS)
    ap.add_argument("--pso-conf", default="{}", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.pso_serve is not None:
        pso_serve(args)
        return
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
