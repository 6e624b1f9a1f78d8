"""Slow and stalling clients must not grow a daemon's memory or stop it serving others
(issue 11, item 6), real daemon processes.

* 20 connections each send most of a 15 MiB frame and stop: the broker's RSS grows by
  about `maxBufferedRequestBytes`, not by 300 MiB, and another client is served;
* slowloris (a header one byte per second): the connection is closed after
  `frameReadTimeoutMillis`, on the broker and on the nameserver, others served meanwhile;
* a slow reader pipelines 2,000 pulls of 128 KiB answers and reads nothing: the broker
  stops handling its requests at the write high-water mark (RSS bounded, others
  served), and when it reads again every pull is answered.
"""
from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
import time

import pytest

from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand, encode
from tests.integration.test_broker import pull_cmd, send_cmd
from tests.support.daemons import Cluster
from tests.support.raw_client import Raw, connect
from tests.support.workloads import poll_until

pytestmark = [pytest.mark.asyncio, pytest.mark.fault]

MiB = 1 << 20
BUDGET = 32 * MiB
TIMEOUT_MS = 2000


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024


@pytest.fixture
def cluster(tmp_path):
    args = [f"--maxBufferedRequestBytes={BUDGET}", f"--frameReadTimeoutMillis={TIMEOUT_MS}"]
    c = Cluster(str(tmp_path), args)
    c.namesrv.args += args
    c.start()
    try:
        yield c
    finally:
        c.stop()


async def served(addr: str, opaque: int, topic: str = "SlowProbeT") -> float:
    """Another client's SEND on a fresh connection; returns its latency."""
    conn = await connect(addr)
    try:
        t0 = time.perf_counter()
        r = await conn.call(send_cmd(topic, b"probe"), opaque)
        assert r.code == C.SUCCESS, r.remark
        return time.perf_counter() - t0
    finally:
        conn.transport.close()


async def test_unfinished_large_frames_are_bounded_by_the_budget_and_others_are_served(tmp_path):
    # A long frame timeout: this test is about bytes, not time.
    c = Cluster(str(tmp_path), [f"--maxBufferedRequestBytes={BUDGET}", "--frameReadTimeoutMillis=600000"]).start()
    try:
        addr, pid = c.broker_addr, c.broker.proc.pid
        await served(addr, 1)
        before = rss_bytes(pid)
        frame_len = 15 * MiB
        # a SEND_MESSAGE_V2 prefix claiming 15 MiB; all but the last KiB is sent
        prefix = struct.pack(">ii", frame_len, 2)[:8]
        chunk = b"\0" * (256 * 1024)
        sent = [0] * 20
        writers = []

        async def attacker(i: int) -> None:
            host, port = addr.split(":")
            _, w = await asyncio.open_connection(host, int(port))
            writers.append(w)
            w.write(prefix)
            total = len(prefix)
            while total < frame_len + 4 - 1024:
                n = min(len(chunk), frame_len + 4 - 1024 - total)
                w.write(chunk[:n])
                await w.drain()
                total += n
                sent[i] = total
            await asyncio.sleep(3600)

        tasks = [asyncio.create_task(attacker(i)) for i in range(20)]
        try:
            # until the broker takes no more: nothing sent for a second
            last, still = -1, 0
            while still < 4:
                await asyncio.sleep(0.25)
                total = sum(sent)
                still = still + 1 if total == last else 0
                last = total
            grown = rss_bytes(pid) - before
            print(f"20 unfinished 15 MiB frames: {sum(sent) / MiB:.0f} MiB sent, broker RSS +{grown / MiB:.0f} MiB")
            # The budget (32 MiB) plus a read chunk per waiting connection and allocator
            # slack; without the budget it was +300 MiB.
            assert grown < BUDGET + 48 * MiB
            assert sum(sent) < 120 * MiB      # the rest waits in the kernel and the senders
            assert await served(addr, 2) < 1.0
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in writers:
                w.transport.abort()
        # the budget is freed with the connections: a large frame is read and answered
        conn = await connect(addr)
        r = await conn.call(send_cmd("SlowProbeT", b"y" * (15 * MiB)), 3, timeout_s=30)
        assert r.code == C.MESSAGE_ILLEGAL       # over maxMessageSize, but read and answered
        conn.transport.close()
    finally:
        c.stop()


async def slowloris(addr: str, timeout_s: float) -> tuple[float, int]:
    """Send a header one byte per second; returns (seconds until the daemon closed the
    connection, bytes sent)."""
    host, port = addr.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    header = struct.pack(">ii", 200, 190) + b"{" * 190
    t0 = time.monotonic()
    sent = 0
    closed = asyncio.create_task(reader.read())
    try:
        for b in header:
            writer.write(bytes([b]))
            sent += 1
            done, _ = await asyncio.wait({closed}, timeout=1.0)
            if done:
                break
            assert time.monotonic() - t0 < timeout_s + 10, "slowloris connection never closed"
        assert closed.done()
        # closed by the daemon: an EOF, or a reset when a byte of ours was still unread in
        # its socket as it closed (the kernel then answers with RST instead of FIN)
        exc = closed.exception()
        assert isinstance(exc, ConnectionResetError) if exc is not None else closed.result() == b""
        return time.monotonic() - t0, sent
    finally:
        writer.transport.abort()


@pytest.mark.parametrize("daemon", ["broker", "namesrv"])
async def test_slowloris_is_closed_after_the_frame_read_timeout_and_others_are_served(cluster, daemon):
    addr = cluster.broker_addr if daemon == "broker" else cluster.namesrv_addr
    task = asyncio.create_task(slowloris(addr, TIMEOUT_MS / 1000))
    try:
        await asyncio.sleep(0.5)
        if daemon == "broker":
            assert await served(addr, 7) < 1.0
        else:
            conn = await connect(addr)
            r = await conn.call(RemotingCommand(R.GET_BROKER_CLUSTER_INFO), 7)
            assert r.code == C.SUCCESS
            conn.transport.close()
        took, sent = await task
    finally:
        task.cancel()
    print(f"{daemon}: slowloris closed after {took:.1f} s, {sent} bytes")
    assert TIMEOUT_MS / 1000 <= took < TIMEOUT_MS / 1000 + 3
    d = cluster.broker if daemon == "broker" else cluster.namesrv
    # the close reaches us before the daemon's log line reaches the thread reading its output
    log = poll_until(lambda: "a request frame started" in d.log_text() and d.log_text(), 5)
    assert log and "frameReadTimeoutMillis=2000" in log, d.log_text()


async def messages_got(conn: Raw, opaque: int) -> int:
    r = await conn.call(RemotingCommand(R.GET_BROKER_RUNTIME_INFO), opaque)
    return int(json.loads(r.body)["table"]["msgGetTotalTodayNow"])


async def test_a_client_that_does_not_read_its_answers_stops_being_served_not_buffered(cluster):
    addr, pid = cluster.broker_addr, cluster.broker.proc.pid
    admin = await connect(addr)
    for i in range(32):
        r = await admin.call(send_cmd("SlowReadT", b"m" * 4096), 100 + i)
        assert r.code == C.SUCCESS
    before = rss_bytes(pid)
    host, port = addr.split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.connect((host, int(port)))
    sock.setblocking(False)
    _, slow = await asyncio.get_running_loop().create_connection(Raw, sock=sock)
    slow.transport.pause_reading()                     # reads nothing from now on
    n = 2000                                           # 2,000 answers of 32 x 4 KiB: 256 MiB
    frames = []
    for i in range(1, n + 1):
        cmd = pull_cmd("SlowReadT", 0, 0, group="SlowG")
        cmd.opaque = i
        frames.append(encode(cmd))
    slow.transport.write(b"".join(frames))
    await asyncio.sleep(3)
    grown = rss_bytes(pid) - before
    got = await messages_got(admin, 10)
    print(f"slow reader, {n} pulls pipelined: {got // 32} answered while it does not read, "
          f"broker RSS +{grown / MiB:.0f} MiB")
    assert grown < 96 * MiB
    assert got < n * 32 // 2           # it stopped handling them, not buffering the answers
    assert await served(addr, 9) < 1.0
    # reading again, it gets every answer
    slow.want = n
    slow.transport.resume_reading()
    await asyncio.wait_for(slow.enough.wait(), 60)
    assert len(slow.responses) == n and {r.code for r in slow.responses} == {C.SUCCESS}
    assert sorted(r.opaque for r in slow.responses) == list(range(1, n + 1))
    slow.transport.close()
