"""A master/slave broker group for tests: one nameserver, a master and its slave (one
brokerName), in-process (`LocalPair`) on fixed free ports so each can be restarted at the
same address, or as processes (`ProcessGroup`, for SIGKILL and for benchmarks), and helpers
that compare the two stores.

    async with LocalPair(tmp_path, role="SYNC_MASTER") as pair:
        pair.master.addr, pair.slave.addr, await pair.restart_master()
"""
from __future__ import annotations

import asyncio
import os
import shutil

from pocketmq.broker.app import Broker
from pocketmq.broker.config import parse_args as broker_args
from pocketmq.nameserver.app import NameServer
from pocketmq.nameserver.config import parse_args as ns_args
from tests.support.daemons import READY_BROKER, READY_NS, Daemon, free_port

SEGMENT = 256 * 1024


class LocalPair:
    def __init__(self, root, *, role: str = "ASYNC_MASTER", master_args=(), slave_args=(), common_args=(),
                 segment: int = SEGMENT, start_slave: bool = True):
        self.root = str(root)
        self.role = role
        self.master_args = list(master_args)
        self.slave_args = list(slave_args)
        self.common_args = list(common_args)
        self.segment = segment
        self.start_slave_at_enter = start_slave
        self.ns_port = free_port()
        self.ports = {"m": (free_port(), free_port()), "s": (free_port(), free_port())}
        self.ns: NameServer | None = None
        self.master: Broker | None = None
        self.slave: Broker | None = None

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.ns_port}"

    def store_root(self, who: str) -> str:
        return os.path.join(self.root, who)

    def _config(self, who: str):
        port, ha_port = self.ports[who]
        args = ["-n", self.namesrv_addr, f"--listenPort={port}", f"--haListenPort={ha_port}",
                "--brokerIP1=127.0.0.1", f"--storePathRootDir={self.store_root(who)}",
                f"--mappedFileSizeCommitLog={self.segment}", "--mappedFileSizeConsumeQueue=6000",
                "--registerNameServerPeriod=1000"] + self.common_args
        if who == "m":
            args += [f"--brokerRole={self.role}"] + self.master_args
        else:
            args += ["--brokerRole=SLAVE", "--brokerId=1"] + self.slave_args
        return broker_args(args)[0]

    async def start_master(self) -> Broker:
        self.master = Broker(self._config("m"))
        await self.master.start()
        return self.master

    async def start_slave(self) -> Broker:
        self.slave = Broker(self._config("s"))
        await self.slave.start()
        return self.slave

    async def stop_master(self) -> None:
        if self.master is not None:
            await self.master.close()
            self.master = None

    async def stop_slave(self) -> None:
        if self.slave is not None:
            await self.slave.close()
            self.slave = None

    async def restart_master(self) -> Broker:
        await self.stop_master()
        return await self.start_master()

    async def restart_slave(self) -> Broker:
        await self.stop_slave()
        return await self.start_slave()

    async def __aenter__(self) -> "LocalPair":
        cfg, _ = ns_args([f"--listenPort={self.ns_port}", f"--kvConfigPath={self.root}/kv.json"])
        self.ns = NameServer(cfg)
        await self.ns.start()
        await self.start_master()
        if self.start_slave_at_enter:
            await self.start_slave()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop_slave()
        await self.stop_master()
        if self.ns is not None:
            await self.ns.close()

    async def caught_up(self, timeout_s: float = 10.0) -> int:
        """Wait until the slave's log ends where the master's does; returns that offset."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            end = self.master.store.commit_log_max_offset
            if self.slave.store.commit_log_max_offset == end:
                return end
            if loop.time() > deadline:
                raise AssertionError(f"slave at {self.slave.store.commit_log_max_offset}, master at {end} "
                                     f"after {timeout_s} s; slave state: {self.slave.ha_slave.state}")
            await asyncio.sleep(0.01)


def commit_log_bytes(store_dir: str, end: int | None = None, start: int = 0) -> bytes:
    """The commit log of a store directory from `start` to `end` (files concatenated)."""
    d = os.path.join(store_dir, "commitlog")
    out = bytearray()
    for name in sorted(os.listdir(d)):
        if not name.isdigit():
            continue
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        base = int(name)
        lo, hi = max(start, base), base + len(data) if end is None else min(end, base + len(data))
        if hi > lo:
            out += data[lo - base:hi - base]
    return bytes(out)


class ProcessGroup:
    """One nameserver, a master and a slave as processes; the slave's store can become the
    master's."""

    def __init__(self, root: str, role: str, extra_args=(), segment: int = 256 * 1024):
        self.root = root
        self.role = role
        self.extra_args = list(extra_args)
        self.segment = segment
        self.ns_port, self.m_port, self.m_ha, self.s_port = free_port(), free_port(), free_port(), free_port()
        self.gen = 0
        self.ns = Daemon("mqnamesrv", [f"--listenPort={self.ns_port}", f"--kvConfigPath={root}/kv.json"],
                         READY_NS, os.path.join(root, "ns.log"))
        self.master: Daemon | None = None
        self.slave: Daemon | None = None
        self.master_dir = os.path.join(root, "store-0")
        self.slave_dir = os.path.join(root, "store-1")
        self.logs: list[str] = []

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.ns_port}"

    @property
    def broker_addr(self) -> str:          # create_topic's target: the master
        return f"127.0.0.1:{self.m_port}"

    def _broker(self, who: str, store: str) -> Daemon:
        common = ["-n", self.namesrv_addr, "--brokerIP1=127.0.0.1", f"--storePathRootDir={store}",
                  f"--mappedFileSizeCommitLog={self.segment}", "--mappedFileSizeConsumeQueue=4000",
                  "--registerNameServerPeriod=1000", "--slaveTimeout=5000"] + self.extra_args
        if who == "m":
            args = common + [f"--listenPort={self.m_port}", f"--haListenPort={self.m_ha}", f"--brokerRole={self.role}"]
        else:
            args = common + [f"--listenPort={self.s_port}", f"--haListenPort={free_port()}", "--brokerRole=SLAVE",
                             "--brokerId=1", f"--haMasterAddress=127.0.0.1:{self.m_ha}"]
        log = os.path.join(self.root, f"{who}-{self.gen}.log")
        self.logs.append(log)
        return Daemon("mqbroker", args, READY_BROKER, log)

    def start(self) -> None:
        self.ns.start()
        self.master = self._broker("m", self.master_dir)
        self.master.start(30)
        self.slave = self._broker("s", self.slave_dir)
        self.slave.start(30)

    def promote_slave_store(self) -> None:
        """After the master and its store are gone: the slave's store becomes the master's,
        a new empty slave copies it."""
        self.slave.stop()
        self.gen += 1
        shutil.rmtree(self.master_dir, ignore_errors=True)
        os.rename(self.slave_dir, self.master_dir)
        self.master = self._broker("m", self.master_dir)
        self.master.start(30)
        self.slave = self._broker("s", self.slave_dir)
        self.slave.start(30)

    def stop(self) -> None:
        for d in (self.slave, self.master, self.ns):
            if d is not None:
                try:
                    d.stop()
                except Exception:
                    d.kill()

    def tracebacks(self) -> list[str]:
        out = []
        for path in self.logs:
            with open(path, errors="replace") as f:
                if "Traceback" in f.read():
                    out.append(path)
        return out
