"""The client rotates through a ';'-separated nameserver list and reconnects after a
nameserver restart, without user action (real mqnamesrv/mqbroker processes)."""
import asyncio
import os

import pytest

from pocketmq.client import Message, Producer
from tests.support.daemons import READY_BROKER, READY_NS, Daemon, free_broker_port, free_port

pytestmark = pytest.mark.asyncio


def namesrv(root, port, tag):
    return Daemon("mqnamesrv", [f"--listenPort={port}", f"--kvConfigPath={root}/{tag}/kv.json"], READY_NS,
                  os.path.join(root, f"{tag}.log"))


async def send_new_topic(p, topic, timeout_s=20):
    """A never-seen topic forces a route lookup at a nameserver."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await p.send(Message(topic, b"x"))
        except Exception:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.3)


async def test_nameserver_rotation_and_restart(tmp_path):
    root = str(tmp_path)
    p1, p2, bp = free_port(), free_port(), free_broker_port()     # (its HA port: bp + 1)
    ns1, ns2 = namesrv(root, p1, "ns1").start(), namesrv(root, p2, "ns2").start()
    addrs = f"127.0.0.1:{p1};127.0.0.1:{p2}"
    broker = Daemon("mqbroker", ["-n", addrs, f"--listenPort={bp}", "--brokerIP1=127.0.0.1",
                                 f"--storePathRootDir={root}/store", "--mappedFileSizeCommitLog=16777216",
                                 "--registerNameServerPeriod=1000"], READY_BROKER,
                    os.path.join(root, "broker.log")).start()
    try:
        async with Producer("PG", addrs) as p:
            assert (await send_new_topic(p, "Before")).ok
            ns1.kill()                                   # first nameserver gone: rotate to the second
            assert (await send_new_topic(p, "AfterNs1Down")).ok
            ns1 = namesrv(root, p1, "ns1").start()       # back (empty until the broker re-registers)
            ns2.kill()                                   # now only the restarted one is left
            assert (await send_new_topic(p, "AfterNs1Restart")).ok
            ns1.kill()                                   # none left: a new topic cannot be routed
            with pytest.raises(Exception):
                await send_new_topic(p, "NoNameserver", timeout_s=2)
    finally:
        broker.stop()
        for d in (ns1, ns2):
            d.kill()
