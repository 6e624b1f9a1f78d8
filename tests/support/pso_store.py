"""A pysyncobj consensus store as real processes: the measurement backend of issue 31's
choice between etcd and a Raft library (test and bench tooling, never shipped; pysyncobj
is not a dependency of pocketmq: `python3 -m pip install pysyncobj`).

Each member is this file run as a script (`--serve I`): a pysyncobj SyncObj replicating
a small key-value state machine with etcd's shape, serving it to clients over its own
TCP port as JSON lines, as a nameserver embedding the controller would serve brokers.
The broker's client is broker/services/consensus_pso.py `PsoConsensus` (no pysyncobj on
its side); bench/bench_consensus.py drives the same members with its own client.

    with PsoCluster(3) as store: ...          # store.endpoints == ["127.0.0.1:PORT", ...]

The wire: one JSON object per line each way, a connection may carry many requests at once
(answers come in completion order, matched by `i`):

| request | answer |
|---|---|
| ``{"i": n, "op": op, "a": [args]}`` | ``{"i": n, "r": result}`` or ``{"i": n, "e": "Type: text"}`` |

| op (args) | result | through the log |
|---|---|---|
| ``read`` (prefix, keys_only=false) | ``[revision, [[key, value, mod_revision, lease], ...]]`` | yes (linearizable) |
| ``read_local`` (prefix) | the same, from this member's copy (possibly stale) | no |
| ``cas`` (key, expect, value, lease) | ``[ok, version]``; expect = the key's mod_revision, 0 absent, -1 any | yes |
| ``txn`` (compares, ops) | ``{"ok": bool, "rev": n}`` or ``{"lease_missing": lease}`` | yes |
| ``grant`` (ttl) / ``keepalive`` (lease) / ``revoke`` (lease) | lease id / its TTL, -1 gone / existed | yes |
| ``status`` () | this member's Raft state (leader, term, commit and applied index, peers connected) | no |

A txn is etcd's transaction: compares ``[key, "ver", n]`` (mod_revision == n, 0: absent)
and ``[key, "value", v]`` (present with value v); ops ``["put", key, value, lease]`` and
``["del", key]``, applied only when every compare holds, under one new revision (none if
nothing changed); as in etcd, a put naming a lease that is gone fails the whole
transaction (lease_missing) when, and only when, the compares held.

Leases (pysyncobj has none): emulated as etcd's lessor does it. grant/keepalive are log
entries; every member notes (its own monotonic clock, not replicated) when it applied a
lease's last renewal; the member that is Raft leader checks every tick (~50 ms) and, past
the TTL, proposes expire(lease, renewals seen), which deletes the lease and its keys unless
a renewal got into the log first. A member that becomes leader restarts every lease's TTL
from then (etcd's Promote). What that costs in safety: the lease code is ours (the issue
wants no consensus code of our own); every keepalive is a log entry on every member (etcd
renews leases on its leader only, outside the log); expiry depends on the leader's clock
rate, as etcd's; and pysyncobj writes its journal through mmap without fsync, so an
acknowledged write survives a process crash but not the loss of a majority of hosts' page
caches (etcd fsyncs its WAL before answering).

A member without a leader (an election under way) holds a request up to `wait_leader_s`
and retries it (the command was never appended, so a retry cannot apply it twice), as etcd
holds a request until it has a leader; 0 answers MISSING_LEADER at once (bench_consensus's
recorded figures were taken that way). Other failures (LEADER_CHANGED, NOT_LEADER...) are
answered as they are: their outcome is unknown, the client decides.
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

SKIP_REASON = "pysyncobj is not installed (python3 -m pip install pysyncobj; a measurement backend, not shipped)"
# Raft timings as etcd's in tests/support/etcd.py (heartbeat 50 ms, election 0.5-1.0 s);
# appendEntriesUseBatch off: an entry is sent at once instead of on the next 100 ms batch
FAST_RAFT = dict(appendEntriesUseBatch=False, appendEntriesPeriod=0.05, raftMinTimeout=0.5, raftMaxTimeout=1.0,
                 leaderFallbackTimeout=1.0)
MAX_IN_FLIGHT = 64          # requests one connection may have open on a member; more wait to be read
START_TIMEOUT_S = 20.0


def pysyncobj_available() -> bool:
    try:
        import pysyncobj  # noqa: F401
    except ImportError:
        return False
    return True


# -- a member process --------------------------------------------------------------------------

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
            self.kv: dict[str, list] = {}            # key -> [value, version (mod revision), lease]
            self.leases: dict[int, list] = {}        # lease -> [ttl, renewals]
            self.rev = 1                             # etcd's revision also starts at 1
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

        @replicated
        def txn(self, compares, ops):
            for key, kind, want in compares:
                cur = self.kv.get(key)
                if kind == "ver" and (cur[1] if cur else 0) != want:
                    return {"ok": False, "rev": self.rev}
                if kind == "value" and (cur is None or cur[0] != want):
                    return {"ok": False, "rev": self.rev}
            for op in ops:
                if op[0] == "put" and op[3] and op[3] not in self.leases:
                    return {"lease_missing": op[3]}
            changed = any(op[0] == "put" or op[1] in self.kv for op in ops)
            if changed:
                self.rev += 1
            for op in ops:
                if op[0] == "put":
                    self.kv[op[1]] = [op[2], self.rev, op[3]]
                else:
                    self.kv.pop(op[1], None)
            return {"ok": True, "rev": self.rev}

        def _scan(self, prefix, keys_only=False):
            return [self.rev, [[k, None if keys_only else v[0], v[1], v[2]]
                               for k, v in list(self.kv.items()) if k.startswith(prefix)]]

        @replicated
        def read(self, prefix, keys_only=False):
            return self._scan(prefix, keys_only)

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

        def _drop_lease(self, lease):
            del self.leases[lease]
            self.renewed.pop(lease, None)
            gone = [k for k, v in self.kv.items() if v[2] == lease]
            if gone:
                self.rev += 1
                for k in gone:
                    del self.kv[k]

        @replicated
        def revoke(self, lease):
            if lease not in self.leases:
                return False
            self._drop_lease(lease)
            return True

        @replicated
        def expire(self, lease, renewals):
            entry = self.leases.get(lease)
            if entry is None or entry[1] != renewals:
                return False                         # renewed after the leader decided: keep it
            self._drop_lease(lease)
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


REPLICATED_OPS = ("cas", "txn", "read", "grant", "keepalive", "revoke")


def serve(index: int, raft: list[str], port: int, data_dir: str, conf: dict, wait_leader_s: float) -> None:
    """Member `index` of the cluster `raft` (host:port of each member's Raft link), its
    client API on 127.0.0.1:`port`; runs until killed."""
    from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf
    names = {v: k for k, v in vars(FAIL_REASON).items() if k.isupper()}
    me = raft[index]
    state = _group_state_class()()
    tag = me.replace(":", "_")
    so_conf = SyncObjConf(journalFile=os.path.join(data_dir, f"{tag}.journal"),
                          fullDumpFile=os.path.join(data_dir, f"{tag}.dump"),
                          connectionRetryTime=0.5, **conf)
    so = SyncObj(me, [a for a in raft if a != me], so_conf, consumers=[state])
    so.addOnTickCallback(state.tick)

    def status() -> dict:
        st = so.getStatus()
        leader = st["leader"]
        return {"self": me, "state": st["state"], "leader": leader.id if leader is not None else None,
                "term": st["raft_term"], "commit": st["commit_idx"], "applied": st["last_applied"],
                "connected": sum(1 for k, v in st.items() if k.startswith("partner_node_status_server_") and v == 2),
                "has_quorum": st["has_quorum"]}

    class Refused(Exception):
        pass

    async def run() -> None:
        loop = asyncio.get_running_loop()

        def call(method, *a):
            fut = loop.create_future()

            def settle(res, err):
                if fut.done():
                    return
                if err == FAIL_REASON.SUCCESS:
                    fut.set_result(res)
                else:
                    fut.set_exception(Refused(f"pysyncobj {names.get(err, err)}"))

            method(*a, callback=lambda res, err: loop.call_soon_threadsafe(settle, res, err))
            return fut

        async def replicated_call(op, a):
            deadline = time.monotonic() + wait_leader_s
            while True:
                try:
                    return await call(getattr(state, op), *a)
                except Refused as e:
                    # never appended: safe to try again once a leader is known
                    if "MISSING_LEADER" not in str(e) or time.monotonic() >= deadline:
                        raise
                await asyncio.sleep(0.02)

        async def answer(req, writer, slots):
            try:
                op, a = req["op"], req.get("a", [])
                if op == "status":
                    r = status()
                elif op == "read_local":
                    r = state.read_local(*a)
                elif op in REPLICATED_OPS:
                    r = await asyncio.wait_for(replicated_call(op, a), 5.0)
                else:
                    raise ValueError(f"unknown op {op!r}")
                resp = {"i": req["i"], "r": r}
            except Exception as e:
                resp = {"i": req.get("i"), "e": f"{type(e).__name__}: {e}"}
            finally:
                slots.release()
            if not writer.is_closing():
                writer.write(json.dumps(resp).encode() + b"\n")

        async def handle(reader, writer):
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            slots = asyncio.Semaphore(MAX_IN_FLIGHT)      # the bound: past it, the next line waits unread
            tasks = set()
            try:
                while line := await reader.readline():
                    await slots.acquire()
                    try:
                        req = json.loads(line)
                    except ValueError as e:
                        slots.release()
                        writer.write(json.dumps({"i": None, "e": f"ValueError: bad request line: {e}"}).encode()
                                     + b"\n")
                        continue
                    t = asyncio.create_task(answer(req, writer, slots))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
            except (ConnectionError, OSError, ValueError):
                pass
            finally:
                for t in tasks:
                    t.cancel()
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(run())


# -- the cluster (processes) ----------------------------------------------------------------

class PsoCluster:
    """n members of this file in --serve mode, their data in `root` (a temporary directory
    when None). Members can be killed, paused and restarted on their journal."""

    def __init__(self, n: int = 3, root: str | None = None, *, raft_conf: dict | None = None,
                 wait_leader_s: float = 2.0):
        from tests.support.daemons import free_port
        self.n = n
        self.raft_conf = FAST_RAFT if raft_conf is None else raft_conf
        self.wait_leader_s = wait_leader_s
        self._tmp = None if root is not None else tempfile.TemporaryDirectory(prefix="pso-")
        self.root = root if root is not None else self._tmp.name
        os.makedirs(self.root, exist_ok=True)
        self.raft = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.ports = [free_port() for _ in range(n)]
        self.procs: list[subprocess.Popen | None] = [None] * n

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    @property
    def endpoint(self) -> str:
        return self.endpoints[0]

    def spawn(self, i: int) -> None:
        log = open(os.path.join(self.root, f"n{i}.log"), "ab")
        try:
            self.procs[i] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--serve", str(i), "--raft", ",".join(self.raft),
                 "--port", str(self.ports[i]), "--dir", self.root, "--conf", json.dumps(self.raft_conf),
                 "--wait-leader-s", str(self.wait_leader_s)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "PsoCluster":
        """Start every member not running (all of them the first time) and wait until healthy."""
        try:
            for i in range(self.n):
                if self.procs[i] is None:
                    self.spawn(i)
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for i in range(self.n):
            self.kill(i)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> "PsoCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    def log_tail(self, i: int, lines: int = 30) -> str:
        try:
            with open(os.path.join(self.root, f"n{i}.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def status(self, i: int) -> dict | None:
        if self.procs[i] is None or self.procs[i].poll() is not None:
            return None
        try:
            with socket.create_connection(("127.0.0.1", self.ports[i]), timeout=0.5) as s:
                s.settimeout(0.5)
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

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Every member up, connected to all others, agreeing on one leader, and applied up
        to the leader's commit index."""
        deadline = time.monotonic() + timeout_s
        while True:
            for i, p in enumerate(self.procs):
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"pysyncobj member {i} exited ({p.returncode}):\n{self.log_tail(i)}")
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

    def kill(self, i: int = 0) -> None:
        p = self.procs[i]
        if p is not None:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)        # a paused member dies as well
                p.send_signal(signal.SIGKILL)
            p.wait(5)
            self.procs[i] = None

    def restart(self, i: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Member i again, on its journal (it rejoins with what it had)."""
        self.kill(i)
        self.spawn(i)
        self.wait_healthy(timeout_s)

    def pause(self, i: int = 0) -> None:
        """SIGSTOP, and wait (bounded) until every thread of it is stopped."""
        from tests.support.etcd import wait_stopped
        self.procs[i].send_signal(signal.SIGSTOP)
        wait_stopped(self.procs[i].pid, f"pysyncobj member {i}")

    def resume(self, i: int = 0) -> None:
        self.procs[i].send_signal(signal.SIGCONT)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="one member of a pysyncobj store (tests/support/pso_store.py)")
    ap.add_argument("--serve", type=int, required=True, help="this member's index in --raft")
    ap.add_argument("--raft", required=True, help="host:port of every member's Raft link, ',' between")
    ap.add_argument("--port", type=int, required=True, help="the client API's port (127.0.0.1)")
    ap.add_argument("--dir", required=True, help="journal and dump files")
    ap.add_argument("--conf", default="{}", help="SyncObjConf keywords, JSON")
    ap.add_argument("--wait-leader-s", type=float, default=0.0)
    args = ap.parse_args(argv)
    serve(args.serve, args.raft.split(","), args.port, args.dir, json.loads(args.conf), args.wait_leader_s)


if __name__ == "__main__":
    main()
