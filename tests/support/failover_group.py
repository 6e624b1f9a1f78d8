"""A broker group in controller mode as real processes: one nameserver, N `mqbroker`
replicas (enableControllerMode, one etcd), each replica's etcd connection and HA port
optionally behind its own FaultProxy (tests/support/fault_proxy.py), so a test can cut a
replica off from the consensus store and from the other replicas.

    g = FailoverGroup(root, etcd.endpoint, replicas=3, proxies=True)
    await g.start()
    rid = await g.master_id()           # from etcd's leader key
    g.kill(rid); g.pause(rid); g.resume(rid); g.restart(rid)
    g.partition(rid); g.heal(rid)       # etcd and HA links through the proxies
    await g.stop()

Readiness is the daemon's log line; who is master is read from etcd (the truth), never
guessed from timing.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time

from pocketmq.broker.services.consensus import EtcdConsensus
from tests.support.daemons import READY_BROKER, READY_NS, Daemon, free_port
from tests.support.fault_proxy import Fault, FaultProxy

CLUSTER = "DefaultCluster"
GROUP = "broker-a"


class Replica:
    def __init__(self, rid: int) -> None:
        self.rid = rid
        self.port = free_port()
        self.ha_port = free_port()
        self.daemon: Daemon | None = None
        self.etcd_proxy: FaultProxy | None = None
        self.ha_proxy: FaultProxy | None = None
        self.paused = False
        self.gen = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"


class FailoverGroup:
    def __init__(self, root: str, etcd_endpoint: str, *, replicas: int = 2, role: str = "SYNC_MASTER",
                 extra_args=(), proxies: bool = False, segment: int = 1 << 20, lease_s: int = 2,
                 group: str = GROUP, replica_args: dict[int, list[str]] | None = None) -> None:
        self.root = root
        self.etcd_endpoint = etcd_endpoint
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
        self.consensus = EtcdConsensus([etcd_endpoint], timeout_s=1.0)

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.ns_port}"

    def store_dir(self, rid: int) -> str:
        return os.path.join(self.root, f"store-{rid}")

    def _daemon(self, r: Replica) -> Daemon:
        etcd = r.etcd_proxy.addr if r.etcd_proxy is not None else self.etcd_endpoint
        args = ["-n", self.namesrv_addr, "--brokerIP1=127.0.0.1", f"--storePathRootDir={self.store_dir(r.rid)}",
                f"--brokerName={self.group}",
                f"--mappedFileSizeCommitLog={self.segment}", "--mappedFileSizeConsumeQueue=6000",
                "--registerNameServerPeriod=1000", f"--listenPort={r.port}", f"--haListenPort={r.ha_port}",
                "--enableControllerMode=true", f"--brokerId={r.rid}", f"--etcdEndpoints={etcd}",
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
                host, port = self.etcd_endpoint.rsplit(":", 1)
                r.etcd_proxy = await FaultProxy(host, int(port)).start()
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

    # -- truth from etcd ------------------------------------------------------------------
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
        """Cut `rid` off from etcd and from the replicas (its HA port): links reset, new ones swallowed."""
        r = self.replicas[rid]
        for p in (r.etcd_proxy, r.ha_proxy):
            p.set_fault(Fault.RESET)
            p.set_fault(Fault.BLACKHOLE)

    def heal(self, rid: int) -> None:
        r = self.replicas[rid]
        for p in (r.etcd_proxy, r.ha_proxy):
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
            for p in (r.etcd_proxy, r.ha_proxy):
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
