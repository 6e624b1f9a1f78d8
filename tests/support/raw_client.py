"""Raw RemotingCommand connections for fault tests and benches: pipeline frames, collect
every response, and a prober measuring another client's latency meanwhile."""
from __future__ import annotations

import asyncio
import json
import time

from pocketmq.protocol.codes import PullSysFlag, RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import FrameDecoder, RemotingCommand, encode
from tests.integration.test_broker import send_cmd


class Raw(asyncio.Protocol):
    """A connection that pipelines frames and collects every response."""

    def __init__(self):
        self.dec = FrameDecoder(64 << 20)
        self.transport = None
        self.responses: list[RemotingCommand] = []
        self.waiters: dict[int, asyncio.Future] = {}
        self.want = 0
        self.enough = asyncio.Event()
        self.lost = asyncio.Event()

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.dec.feed(data)
        for cmd in self.dec.commands():
            fut = self.waiters.pop(cmd.opaque, None)
            if fut is not None:
                if not fut.done():
                    fut.set_result(cmd)
            else:
                self.responses.append(cmd)
                if self.want and len(self.responses) >= self.want:
                    self.enough.set()

    def connection_lost(self, exc):
        self.lost.set()

    async def call(self, cmd: RemotingCommand, opaque: int, timeout_s: float = 10) -> RemotingCommand:
        cmd.opaque = opaque
        fut = asyncio.get_running_loop().create_future()
        self.waiters[opaque] = fut
        self.transport.write(encode(cmd))
        return await asyncio.wait_for(fut, timeout_s)


async def connect(addr: str) -> Raw:
    host, port = addr.split(":")
    _, proto = await asyncio.get_running_loop().create_connection(Raw, host, int(port))
    return proto


class Prober:
    """Another client: one request at a time (`make()`, default a SEND to `topic`) until
    stopped; records each answer's latency."""

    def __init__(self, conn: Raw, topic: str = "ProbeT", make=None):
        self.conn = conn
        self.make = make or (lambda: send_cmd(topic, b"probe"))
        self.latencies: list[float] = []
        self.started: list[float] = []     # when each probe was sent (perf_counter)
        self.stop = asyncio.Event()
        self.opaque = 1_000_000_000

    async def run(self) -> None:
        while not self.stop.is_set():
            self.opaque += 1
            t0 = time.perf_counter()
            self.started.append(t0)
            r = await self.conn.call(self.make(), self.opaque)
            self.latencies.append(time.perf_counter() - t0)
            assert r.code == C.SUCCESS, r.remark
            await asyncio.sleep(0.002)

    def quantile_ms(self, f: float) -> float:
        lat = sorted(self.latencies)
        return lat[min(len(lat) - 1, int(f * len(lat)))] * 1000

    def summary(self) -> str:
        lat = sorted(self.latencies)
        if not lat:
            return "no probes"
        q = self.quantile_ms
        worst = max(range(len(self.latencies)), key=self.latencies.__getitem__)
        return (f"{len(lat)} probes, p50 {q(0.5):.1f} ms, p99 {q(0.99):.1f} ms, max {lat[-1] * 1000:.1f} ms "
                f"(sent {self.started[worst] - self.started[0]:.2f} s after the first)")


def pull_frame(topic: str, opaque: int, offset: int, suspend_ms: int, queue_id: int = 0,
               group: str = "HeldG") -> bytes:
    """A long-poll PULL (subscription "*") as bytes, to pipeline many."""
    cmd = RemotingCommand(R.PULL_MESSAGE, opaque=opaque, ext_fields={
        "consumerGroup": group, "topic": topic, "queueId": str(queue_id), "queueOffset": str(offset),
        "maxMsgNums": "32", "sysFlag": str(PullSysFlag.SUBSCRIPTION | PullSysFlag.SUSPEND),
        "commitOffset": "0", "suspendTimeoutMillis": str(suspend_ms), "subscription": "*", "subVersion": "0"})
    return encode(cmd)


async def held_count(conn: Raw, opaque: int) -> int:
    r = await conn.call(RemotingCommand(R.GET_BROKER_RUNTIME_INFO), opaque)
    return int(json.loads(r.body)["table"]["heldPulls"])


async def until_held(conn: Raw, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    opaque = 2_000_000_000
    while (held := await held_count(conn, opaque)) != n:
        assert time.monotonic() < deadline, f"{held} pulls held, expected {n}"
        opaque += 1
        await asyncio.sleep(0.05)
