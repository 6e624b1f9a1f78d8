"""In-process nameserver + broker on 127.0.0.1 port 0, for integration tests."""
from __future__ import annotations

import contextlib

from pocketmq.broker.app import Broker
from pocketmq.broker.config import parse_args as broker_args
from pocketmq.nameserver.app import NameServer
from pocketmq.nameserver.config import parse_args as ns_args


@contextlib.asynccontextmanager
async def local_cluster(root, *broker_overrides: str, with_namesrv: bool = True):
    ns = None
    ns_addr = None
    if with_namesrv:
        ns_cfg, _ = ns_args(["--listenPort=0", f"--kvConfigPath={root}/kv.json"])
        ns = NameServer(ns_cfg)
        await ns.start()
        ns_addr = f"127.0.0.1:{ns.port}"
    args = ["--listenPort=0", "--brokerIP1=127.0.0.1", f"--storePathRootDir={root}/store",
            "--mappedFileSizeCommitLog=1048576", "--mappedFileSizeConsumeQueue=2000"]
    if ns_addr:
        args += ["-n", ns_addr]
    cfg, _ = broker_args(args + list(broker_overrides))
    broker = Broker(cfg)
    await broker.start()
    try:
        yield ns_addr, broker
    finally:
        await broker.close()
        if ns is not None:
            await ns.close()
