"""Descriptor exhaustion (issue 11 item 4): a broker run with a low RLIMIT_NOFILE
(tests/support/rlimit_exec.py) and hundreds of idle connections.

* With the connection limit (the default: RLIMIT_NOFILE minus the reserve), connections
  past it are accepted and closed at once, the store still creates segments and writes
  checkpoints, an existing client's SYNC_FLUSH sends succeed, and after the idle
  connections close new clients are served, without a restart.
* With the limit opened up (the reserve set to 1 descriptor), the idle connections take
  every descriptor: the store then cannot create its next segment or its checkpoint. That
  used to stop every send until restart; now the sends in that window are refused with
  Java's "create mapped file failed" and the store recovers by itself once the
  connections are gone.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys

import pytest

from pocketmq.broker.store.checkpoint import read_checkpoint
from pocketmq.protocol.codes import ResponseCode as C
from pocketmq.remoting.client import RemotingClient
from pocketmq.remoting.server import connection_limit, reserved_descriptors_default
from tests.integration.test_broker import pull_cmd, send_cmd
from tests.support.daemons import READY_BROKER, Daemon, Cluster

pytestmark = pytest.mark.fault

NOFILE = 256
IDLE_CONNECTIONS = 300
SEGMENT = 1 << 20                      # small commit-log segments: sends roll them often
BODY = b"d" * (200 * 1024)             # five of them fill a segment
WRAPPER = [sys.executable, os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "rlimit_exec.py"),
           str(NOFILE)]


@contextlib.asynccontextmanager
async def limited_cluster(root: str, *broker_args: str):
    cluster = Cluster(root)
    cluster.broker = Daemon("mqbroker", [
        "-n", cluster.namesrv_addr, f"--listenPort={cluster.broker_port}", f"--haListenPort={cluster.ha_port}",
        "--brokerIP1=127.0.0.1",
        f"--storePathRootDir={root}/store", f"--mappedFileSizeCommitLog={SEGMENT}",
        "--flushDiskType=SYNC_FLUSH", "--syncFlushTimeout=2000", *broker_args],
        READY_BROKER, os.path.join(root, "broker.log"), wrapper=WRAPPER)
    await asyncio.to_thread(cluster.start)
    try:
        yield cluster
    finally:
        await asyncio.to_thread(cluster.stop)


async def open_idle(addr: str, n: int):
    """n idle connections; returns (writers, a task per connection finishing when the
    broker closes it)."""
    host, port = addr.split(":")
    writers, closed = [], []
    for _ in range(n):
        reader, writer = await asyncio.open_connection(host, int(port))
        writers.append(writer)
        closed.append(asyncio.ensure_future(reader.read(1)))
    return writers, closed


async def close_all(writers, closed) -> None:
    for w in writers:
        w.close()
    for t in closed:
        t.cancel()
    await asyncio.gather(*closed, return_exceptions=True)


async def send(client, addr, topic, body=BODY):
    return await client.invoke(addr, send_cmd(topic, body), 15)


async def checkpoint_moves(path: str, past: int, timeout_s: float = 15.0) -> int:
    """Wait until the checkpoint's flushed offset reaches `past` (the flush service writes it
    every second); returns it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        ck = read_checkpoint(path)
        if ck is not None and ck.flushed_physical_offset >= past:
            return ck.flushed_physical_offset
        assert loop.time() < deadline, (ck, past)
        await asyncio.sleep(0.1)     # a file written by another process: nothing to await


async def wait_log(daemon, needles, timeout_s: float = 15.0) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not any(n in daemon.log_text() for n in needles):
        assert loop.time() < deadline, f"none of {needles} in the log"
        await asyncio.sleep(0.1)     # another process's log: nothing to await
    return daemon.log_text()


@pytest.mark.asyncio
async def test_connections_past_the_limit_are_closed_and_the_store_keeps_working(tmp_path):
    root = str(tmp_path)
    limit = connection_limit(NOFILE)
    async with limited_cluster(root) as cluster:
        addr = cluster.broker_addr
        client = RemotingClient()
        try:
            first = await send(client, addr, "DescT")          # the existing client
            assert first.code == C.SUCCESS, first.remark
            writers, closed = await open_idle(addr, IDLE_CONNECTIONS)
            # everything past the limit (the client above holds one) is closed at once
            refused = IDLE_CONNECTIONS - (limit - 1)
            while sum(t.done() for t in closed) < refused:
                done, _ = await asyncio.wait([t for t in closed if not t.done()], timeout=20,
                                             return_when=asyncio.FIRST_COMPLETED)
                assert done, f"only {sum(t.done() for t in closed)} of {refused} connections closed"
            assert sum(t.done() for t in closed) == refused
            # the store still creates segments (sends roll several) and consume-queue files
            # (a new topic), and the checkpoint moves; all acknowledged after fdatasync
            offsets = []
            for i in range(12):
                r = await send(client, addr, "DescT" if i % 2 else "DescNew")
                assert r.code == C.SUCCESS, (i, r.code, r.remark)
                offsets.append(int(r.ext_fields["queueOffset"]))
            end = await checkpoint_moves(os.path.join(root, "store", "checkpoint"), 5 * SEGMENT // 2)
            assert end >= 2 * SEGMENT
            assert "connection(s) refused since the last report" in cluster.broker.log_text()
            await close_all(writers, closed)
            # once they are gone, new clients are served (no restart)
            other = RemotingClient()
            try:
                r = await send(other, addr, "DescT", b"after")
                assert r.code == C.SUCCESS, r.remark
                pulled = await other.invoke(addr, pull_cmd("DescT", 0, 0, max_nums=32), 10)
                assert pulled.code == C.SUCCESS
            finally:
                await other.close()
        finally:
            await client.close()
        assert "Traceback" not in cluster.broker.log_text()
        assert "CRITICAL" not in cluster.broker.log_text()


@pytest.mark.asyncio
async def test_exhausted_descriptors_refuse_sends_until_they_are_back(tmp_path):
    # the pre-fix behaviour: the checkpoint write failed with EMFILE and the store refused
    # every send until restart
    root = str(tmp_path)
    async with limited_cluster(root, f"--maxConnections={10 * NOFILE}", "--reservedFileDescriptors=1") as cluster:
        addr = cluster.broker_addr
        client = RemotingClient()
        try:
            assert (await send(client, addr, "DescT")).code == C.SUCCESS
            writers, closed = await open_idle(addr, IDLE_CONNECTIONS)
            refused = None
            for i in range(3 * SEGMENT // len(BODY)):        # rolls at least two segments
                r = await send(client, addr, "DescT")
                if r.code != C.SUCCESS:
                    refused = r
                    break
            assert refused is not None, "the broker never ran out of descriptors"
            # a segment or a consume-queue file could not be created (or, if the segment
            # was made, its directory could not be synced in time)
            assert (refused.code, refused.remark) == (C.SYSTEM_ERROR, "create mapped file failed, server is busy or "
                                                      "broken.") or refused.code == C.FLUSH_DISK_TIMEOUT, \
                (refused.code, refused.remark)
            # keep them out until the flush service has failed to write a checkpoint too
            # (it tries every second)
            await wait_log(cluster.broker, ("cannot write the checkpoint", "to fsync it", "store failed"))
            await close_all(writers, closed)
            # back by itself: sends succeed (SYNC_FLUSH: durable), the checkpoint moves on
            ok = None
            for _ in range(50):
                ok = await send(client, addr, "DescT")
                if ok.code == C.SUCCESS:
                    break
            assert ok.code == C.SUCCESS, (ok.code, ok.remark)
            for _ in range(8):
                r = await send(client, addr, "DescT")
                assert r.code == C.SUCCESS, (r.code, r.remark)
            await checkpoint_moves(os.path.join(root, "store", "checkpoint"), 2 * SEGMENT)
        finally:
            await client.close()
        text = cluster.broker.log_text()
        assert "store failed" not in text and "CRITICAL" not in text      # nothing sticky
        # what ran out was logged: a file not created, or (a segment made, then its
        # directory not opened for the fsync: the FLUSH_DISK_TIMEOUT case above) not synced
        assert re.search(r"cannot (create|open) .*Too many open files", text), text[-2000:]


def test_connection_limit_leaves_the_reserve():
    assert reserved_descriptors_default(256) == 128 and reserved_descriptors_default(100) == 64
    assert reserved_descriptors_default(1 << 20) == 1024
    assert connection_limit(256) == 128                 # ulimit -n 256
    assert connection_limit(1024) == 512
    assert connection_limit(65536) == 65536 - 1024
    assert connection_limit(256, max_connections=50) == 50
    assert connection_limit(256, max_connections=500) == 128     # never eats the reserve
    assert connection_limit(256, reserved_fds=200) == 56
    assert connection_limit(10, reserved_fds=100) == 1         # always serves someone


@pytest.mark.asyncio
async def test_nameserver_applies_its_connection_limit(tmp_path):
    from pocketmq.nameserver.app import NameServer
    from pocketmq.nameserver.config import parse_args as ns_args
    from pocketmq.protocol.codes import RequestCode as R
    from pocketmq.protocol.command import RemotingCommand
    cfg, _ = ns_args(["--listenPort=0", f"--kvConfigPath={tmp_path}/kv.json", "--maxConnections=3"])
    ns = NameServer(cfg)
    await ns.start()
    addr = f"127.0.0.1:{ns.port}"
    client = RemotingClient()
    try:
        assert (await client.invoke(addr, RemotingCommand(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 5)).code == C.SUCCESS
        writers, closed = await open_idle(addr, 5)        # 2 fit, 3 are closed at once
        while sum(t.done() for t in closed) < 3:
            done, _ = await asyncio.wait([t for t in closed if not t.done()], timeout=10,
                                         return_when=asyncio.FIRST_COMPLETED)
            assert done
        assert sum(t.done() for t in closed) == 3 and ns._server.refused_total == 3
        assert (await client.invoke(addr, RemotingCommand(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 5)).code == C.SUCCESS
        await close_all(writers, closed)
        for _ in range(500):             # the server notices the closes on its own loop turns
            if len(ns._server.connections) <= 1:
                break
            await asyncio.sleep(0.01)
        other = RemotingClient()         # room again
        try:
            r = await other.invoke(addr, RemotingCommand(R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 5)
            assert r.code == C.SUCCESS
        finally:
            await other.close()
    finally:
        await client.close()
        await ns.close()
