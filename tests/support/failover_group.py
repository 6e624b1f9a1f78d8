"""A broker group in controller mode as real processes: one nameserver, N `mqbroker`
replicas (enableControllerMode, a consensus store), each replica's links to every member
of the store and its HA port optionally behind FaultProxies (tests/support/fault_proxy.py),
so a test can cut a replica off from the consensus store and from the other replicas.

    g = FailoverGroup(root, etcd.endpoint, replicas=3, proxies=True)
    await g.start()
    rid = await g.master_id()           # from the store's leader key
    g.kill(rid); g.pause(rid); g.resume(rid); g.restart(rid)
    g.partition(rid); g.heal(rid)       # store and HA links through the proxies
    await g.stop()

The store is etcd (the shipped choice) unless `store="pysyncobj"`: the measurement backend
(broker/services/consensus_pso.py, members of tests/support/pso_store.py), which the
brokers then use through controllerStore=pysyncobj. `ConsensusStore(kind, root)` starts
one: etcd (1 member, as CI runs it), etcd3 (3 members) or pysyncobj (3 members).

Readiness is the daemon's log line; who is master is read from the store (the truth),
never guessed from timing.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time

from pocketmq.broker.services.consensus import EtcdConsensus
from pocketmq.broker.services.consensus_pso import PsoConsensus
from tests.support.daemons import READY_BROKER, READY_NS, Daemon, free_port
from tests.support.etcd import EtcdCluster, EtcdServer
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.pso_store import PsoCluster

CLUSTER = "DefaultCluster"
GROUP = "broker-a"


class Replica:
    def __init__(self, rid: int) -> None:
        self.rid = rid
        self.port = free_port()
        self.ha_port = free_port()
        self.daemon: Daemon | None = None
        self.store_proxies: list[FaultProxy] = []      # one per member of the consensus store
        self.ha_proxy: FaultProxy | None = None
        self.paused = False
        self.gen = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"


class ConsensusStore:
    """The group's consensus store as processes: `etcd` (one member), `etcd3` or
    `pysyncobj` (three members); `kind` names the client the brokers use."""

    def __init__(self, kind: str, root: str) -> None:
        if kind not in ("etcd", "etcd3", "pysyncobj"):
            raise ValueError(f"consensus store {kind!r}: etcd, etcd3 or pysyncobj")
        self.kind = "pysyncobj" if kind == "pysyncobj" else "etcd"
        self.impl = {"etcd": EtcdServer, "etcd3": lambda r: EtcdCluster(3, r), "pysyncobj": lambda r: PsoCluster(3, r)
                     }[kind](root)

    @property
    def endpoints(self) -> list[str]:
        return [self.impl.endpoint] if isinstance(self.impl, EtcdServer) else self.impl.endpoints

    def __enter__(self) -> "ConsensusStore":
        self.impl.start()
        return self

    def __exit__(self, *exc) -> None:
        self.impl.stop()


class FailoverGroup:
    def __init__(self, root: str, store_endpoints: str | list[str], *, store: str = "etcd", replicas: int = 2,
                 role: str = "SYNC_MASTER", extra_args=(), proxies: bool = False, segment: int = 1 << 20,
                 lease_s: int = 2, group: str = GROUP, replica_args: dict[int, list[str]] | None = None) -> None:
        self.root = root
        self.store = store
        self.store_endpoints = [store_endpoints] if isinstance(store_endpoints, str) else list(store_endpoints)
        self.role = role
        self.extra_args = list(extra_args)
        self.replica_args = dict(replica_args or {})     # replica id -> its own extra arguments
        self.proxies = proxies
        self.segment = segment
        self.lease_s = lease_s
        self.group = group
        self.ns_port = free_port()
        self.ns = Daemon("mqnamesrv", [f"--listenPort={self.ns_port}", f"--kvConfigPath={root}/kv.json"],
                         READY_NS, os.path.join(root, "ns.log"))
        self.replicas = {i: Replica(i) for i in range(1, replicas + 1)}
        self.logs: list[str] = []
        self.consensus = (PsoConsensus if store == "pysyncobj" else EtcdConsensus)(self.store_endpoints, timeout_s=1.0)

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.ns_port}"

    def store_dir(self, rid: int) -> str:
        return os.path.join(self.root, f"store-{rid}")

    def _daemon(self, r: Replica) -> Daemon:
        endpoints = ";".join(p.addr for p in r.store_proxies) if r.store_proxies else ";".join(self.store_endpoints)
        store_args = ([f"--etcdEndpoints={endpoints}"] if self.store == "etcd"
                      else ["--controllerStore=pysyncobj", f"--pysyncobjEndpoints={endpoints}"])
        args = ["-n", self.namesrv_addr, "--brokerIP1=127.0.0.1", f"--storePathRootDir={self.store_dir(r.rid)}",
                f"--brokerName={self.group}",
                f"--mappedFileSizeCommitLog={self.segment}", "--mappedFileSizeConsumeQueue=6000",
                "--registerNameServerPeriod=1000", f"--listenPort={r.port}", f"--haListenPort={r.ha_port}",
                "--enableControllerMode=true", f"--brokerId={r.rid}", *store_args,
                f"--brokerRole={self.role}", f"--controllerLeaseSeconds={self.lease_s}",
                "--haSendHeartbeatInterval=1000", "--haHousekeepingInterval=5000"] + self.extra_args \
            + list(self.replica_args.get(r.rid, ()))
        if r.ha_proxy is not None:
            args.append(f"--haAdvertisedAddress={r.ha_proxy.addr}")
        r.gen += 1
        log = os.path.join(self.root, f"r{r.rid}-{r.gen}.log")
        self.logs.append(log)
        return Daemon("mqbroker", args, READY_BROKER, log)

    async def start(self) -> "FailoverGroup":
        self.ns.start()
        for r in self.replicas.values():
            if self.proxies:
                for ep in self.store_endpoints:
                    host, port = ep.rsplit(":", 1)
                    r.store_proxies.append(await FaultProxy(host, int(port)).start())
                r.ha_proxy = await FaultProxy("127.0.0.1", r.ha_port).start()
        for r in self.replicas.values():
            await self.start_replica(r.rid)
        await self.master_id()
        return self

    async def start_replica(self, rid: int) -> None:
        r = self.replicas[rid]
        r.daemon = self._daemon(r)
        await asyncio.get_running_loop().run_in_executor(None, r.daemon.start, 30)
        r.paused = False

    # -- truth from the store ------------------------------------------------------------------
    async def snapshot(self):
        return await self.consensus.read_group(CLUSTER, self.group)

    async def master_id(self, timeout_s: float = 30.0, not_: int | None = None) -> int:
        """The replica holding the leader key (a live lease), waiting for one (not `not_`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                snap = await self.snapshot()
                if snap.leader:
                    rid = int(snap.leader.split(b":", 1)[0])
                    if rid != not_:
                        return rid
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no master (other than {not_}) within {timeout_s} s")
            await asyncio.sleep(0.05)

    async def state(self):
        from pocketmq.broker.core.failover import GroupState
        snap = await self.snapshot()
        return GroupState.decode(snap.state) if snap.state else None

    # -- faults --------------------------------------------------------------------------------
    def kill(self, rid: int) -> None:
        r = self.replicas[rid]
        if r.daemon is not None:
            if r.paused:
                os.kill(r.daemon.proc.pid, signal.SIGCONT)
            r.daemon.kill()
            r.daemon = None
        r.paused = False

    def pause(self, rid: int) -> None:
        r = self.replicas[rid]
        os.kill(r.daemon.proc.pid, signal.SIGSTOP)
        r.paused = True

    def resume(self, rid: int) -> None:
        r = self.replicas[rid]
        os.kill(r.daemon.proc.pid, signal.SIGCONT)
        r.paused = False

    def partition(self, rid: int) -> None:
        """Cut `rid` off from the store (every member) and from the replicas (its HA port):
        links reset, new ones swallowed."""
        r = self.replicas[rid]
        for p in r.store_proxies + [r.ha_proxy]:
            p.set_fault(Fault.RESET)
            p.set_fault(Fault.BLACKHOLE)

    def heal(self, rid: int) -> None:
        r = self.replicas[rid]
        for p in r.store_proxies + [r.ha_proxy]:
            p.set_fault(Fault.RESET)     # sinks accepted during the blackhole are dropped
            p.set_fault(Fault.PASS)

    async def restart(self, rid: int) -> None:
        self.kill(rid)
        await self.start_replica(rid)

    async def stop(self) -> None:
        for r in self.replicas.values():
            if r.daemon is not None:
                if r.paused:
                    self.resume(r.rid)
                try:
                    await asyncio.get_running_loop().run_in_executor(None, r.daemon.stop)
                except Exception:
                    r.daemon.kill()
            for p in r.store_proxies + [r.ha_proxy]:
                if p is not None:
                    await p.close()
        self.ns.stop()
        await self.consensus.close()

    def tracebacks(self) -> list[str]:
        out = []
        for path in self.logs + [os.path.join(self.root, "ns.log")]:
            try:
                text = open(path, errors="replace").read()
            except OSError:
                continue
            if "Traceback" in text:
                out.append(f"{path}:\n{text[text.index('Traceback'):][:3000]}")
        return out
