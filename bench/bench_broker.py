"""Broker throughput/latency with a lean raw client (no per-message decoding).

Starts mqnamesrv + mqbroker as real processes (store in a temp dir), then runs
the load from this process:

    python bench/bench_broker.py [--seconds 5] [--flush ASYNC_FLUSH|SYNC_FLUSH] [--codec json|msgpack]
                                 [--pull-batch 32] [--busy-poll-us N] [--metrics-port N]
                                 [--sync-gap-us N ...] [--no-index] [--in-process] [--settle-s S]

Reports: sync sends/s and p50/p99 latency (one in flight), sends/s with 64 in
flight, batched sends (64 x 128 B per request) msgs/s, pull consumption
msgs/s, and broker CPU microseconds per message (utime+stime of the broker
process from /proc, divided by messages handled in that phase), split into the
event loop's thread (`broker_main_cpu_us_per_msg`, of which `broker_main_sys_us_per_msg`
in the kernel) and every other thread (`broker_threads_cpu_us_per_msg`: the flush
thread, which also builds the message index, and the store's helpers).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pocketmq.protocol.codes import PullSysFlag, RequestCode as R, SerializeType  # noqa: E402
from pocketmq.protocol.command import RemotingCommand, encode  # noqa: E402
from pocketmq.protocol.headers.typed import SendMessageRequestHeader, encode_send_header  # noqa: E402
from pocketmq.protocol.message import encode_batch_body, encode_properties  # noqa: E402
from tests.support.daemons import Cluster  # noqa: E402
from tests.support.null_transport import NullTransport  # noqa: E402

BODY = b"x" * 128


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> tuple[float, float, float]:
    """(main thread user+sys, main thread sys, all other threads user+sys) of a process, from
    /proc/PID/task/*/stat (the main thread's tid is the pid)."""
    tck = os.sysconf("SC_CLK_TCK")
    main = main_sys = others = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue        # a thread that ended meanwhile
        user, sys_ = int(fields[11]) / tck, int(fields[12]) / tck
        if int(tid) == pid:
            main, main_sys = user + sys_, sys_
        else:
            others += user + sys_
    return main, main_sys, others


class Raw(asyncio.Protocol):
    """Counts responses by opaque; parses only the 8-byte prefix and the header."""

    def __init__(self):
        from pocketmq.protocol.command import FrameDecoder
        self.dec = FrameDecoder(64 << 20)
        self.waiters = {}
        self.transport = None

    def connection_made(self, t):
        self.transport = t

    def data_received(self, data):
        self.dec.feed(data)
        for cmd in self.dec.commands():
            fut = self.waiters.pop(cmd.opaque, None)
            if fut is not None:
                fut.set_result(cmd)

    def call(self, frame_prefix_fn, opaque):
        fut = asyncio.get_running_loop().create_future()
        self.waiters[opaque] = fut
        self.transport.write(frame_prefix_fn(opaque))
        return fut


SERIALIZE = SerializeType.JSON


def send_frame_factory(topic, body, batch=False, queue_id=0):
    props = encode_properties({"TAGS": "TagA", "UNIQ_KEY": "0" * 32, "WAIT": "true"})
    h = SendMessageRequestHeader("bench", topic, "TBW102", 8, queue_id, 0, int(time.time() * 1000), 0,
                                 "" if batch else props, 0, False, batch, None)
    code = R.SEND_BATCH_MESSAGE if batch else R.SEND_MESSAGE_V2
    ext = encode_send_header(h)

    def make(opaque):
        return encode(RemotingCommand(code, opaque=opaque, ext_fields=ext, body=body, serialize_type=SERIALIZE))
    return make


async def connect(addr):
    host, port = addr.split(":")
    _, proto = await asyncio.get_running_loop().create_connection(Raw, host, int(port))
    return proto


async def phase_sync(addr, topic, seconds, gap_us=0):
    """One send in flight; with gap_us the client waits that long (blocking, so the broker's
    loop sleeps too) between a reply and the next send: a producer sending now and then."""
    p = await connect(addr)
    make = send_frame_factory(topic, BODY)
    lat = []
    n = 0
    gap_s = gap_us / 1e6
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if gap_s:
            time.sleep(gap_s)
        n += 1
        t0 = time.perf_counter()
        r = await p.call(make, n)
        lat.append(time.perf_counter() - t0)
        assert r.code == 0, r.remark
    p.transport.close()
    lat.sort()
    return n, {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6}


async def phase_inflight(addr, topic, seconds, inflight=64, batch=False):
    p = await connect(addr)
    if batch:
        body = encode_batch_body([(0, BODY, encode_properties({"UNIQ_KEY": "%032X" % i, "TAGS": "TagA"}))
                                  for i in range(64)])
        make = send_frame_factory(topic, body, batch=True)
        per = 64
    else:
        make = send_frame_factory(topic, BODY)
        per = 1
    n = 0
    end = time.perf_counter() + seconds
    seq = 0

    async def worker():
        nonlocal n, seq
        while time.perf_counter() < end:
            seq += 1
            r = await p.call(make, seq)
            assert r.code == 0, r.remark
            n += per
    await asyncio.gather(*(worker() for _ in range(inflight)))
    p.transport.close()
    return n, {}


async def phase_pull(addr, topic, queues, seconds, max_nums=32, inflight=8):
    p = await connect(addr)
    offsets = {q: 0 for q in range(queues)}
    n = 0
    seq = 0
    end = time.perf_counter() + seconds
    done_queues = set()

    async def worker(q):
        nonlocal n, seq
        while time.perf_counter() < end:
            seq += 1
            ext = {"consumerGroup": "bench_pull", "topic": topic, "queueId": str(q),
                   "queueOffset": str(offsets[q]), "maxMsgNums": str(max_nums),
                   "sysFlag": str(PullSysFlag.SUBSCRIPTION), "commitOffset": "0",
                   "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}
            r = await p.call(lambda o: encode(RemotingCommand(R.PULL_MESSAGE, opaque=o, ext_fields=ext,
                                                              serialize_type=SERIALIZE)), seq)
            nxt = int(r.ext_fields["nextBeginOffset"])
            if r.code != 0:
                done_queues.add(q)
                return
            n += nxt - offsets[q]
            offsets[q] = nxt
    await asyncio.gather(*(worker(q) for q in range(queues)))
    p.transport.close()
    return n, {"drained": len(done_queues) == queues}


def calibrated(run, json_path: str | None = None) -> dict:
    """`run()` between two calibrations (printed, and kept in the result under
    calibration_rtt_us), the result written to `json_path` when given."""
    import json
    before = loopback_echo_rtt_us()
    print(f"calibration before: loopback_echo_rtt_us={before:.1f}", flush=True)
    result = run()
    after = loopback_echo_rtt_us()
    print(f"calibration after: loopback_echo_rtt_us={after:.1f}", flush=True)
    result["calibration_rtt_us"] = {"before": before, "after": after}
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    return result


@contextlib.contextmanager
def temp_cluster(prefix: str, make=Cluster, **kwargs):
    """A started cluster (`make(root, **kwargs)`: tests/support/daemons.py Cluster, or a
    factory such as tests/support/rmq5.proxy_cluster) in a temp dir, stopped and its store
    removed on leaving: a bench leaves no store behind (stores filled /tmp once)."""
    root = tempfile.mkdtemp(prefix=prefix)
    try:
        c = make(root, **kwargs)
        c.start()
        try:
            yield c
        finally:
            c.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def print_calibration(when: str) -> None:
    """The calibration line a bench prints before and after its rounds: the loopback round
    trip and the host's load (the 2-core host is shared: read the figures against both)."""
    print(f"calibration {when}: loopback_echo_rtt_us={loopback_echo_rtt_us():.1f}, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)


def loopback_echo_rtt_us(seconds: float = 1.0) -> float:
    """Calibration: a bare asyncio round trip between two processes on this machine right
    now (100-byte ping-pong). Shared hosts drift; read the other figures against it."""
    import socket
    import subprocess
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-c", f"""
import asyncio
try:
    import uvloop; uvloop.install()
except ImportError:
    pass
async def main():
    r, w = await asyncio.open_connection("127.0.0.1", {port})
    while True:
        data = await r.read(100)
        if not data:
            return
        w.write(data)
asyncio.run(main())
"""])
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    n = 0
    end = time.perf_counter() + seconds
    t0 = time.perf_counter()
    while time.perf_counter() < end:
        conn.sendall(b"x" * 100)
        got = 0
        while got < 100:
            got += len(conn.recv(100 - got))
        n += 1
    rtt = (time.perf_counter() - t0) / n * 1e6
    conn.close()
    srv.close()
    child.wait(5)
    return rtt


async def main_async(args, cluster):
    pid = cluster.broker.proc.pid
    addr = cluster.broker_addr
    results = []

    async def run(name, coro_fn, settle_s=0.0):
        c0, th0, t0 = cpu_seconds(pid), thread_cpu_seconds(pid), time.perf_counter()
        n, extra = await coro_fn()
        dt, dc = time.perf_counter() - t0, cpu_seconds(pid) - c0
        th1 = thread_cpu_seconds(pid)
        per = 1e6 / max(n, 1)
        row = {"phase": name, "msgs": n, "msgs_per_s": n / dt, "broker_cpu_us_per_msg": dc * per,
               "broker_main_cpu_us_per_msg": (th1[0] - th0[0]) * per,
               "broker_main_sys_us_per_msg": (th1[1] - th0[1]) * per,
               "broker_threads_cpu_us_per_msg": (th1[2] - th0[2]) * per}
        if settle_s:
            # what the phase's messages cost the broker in all, work left behind them (the
            # message index) included: its CPU until settle_s after the phase, per message
            await asyncio.sleep(settle_s)
            row["broker_cpu_us_per_msg_settled"] = (cpu_seconds(pid) - c0) * per
        row.update(extra)
        results.append(row)
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)

    print(f"calibration loopback_echo_rtt_us={loopback_echo_rtt_us():.1f}", flush=True)
    # Warm-up creates the topics (auto-creation, 8 queues).
    await phase_sync(addr, "BenchSync", 0.2)
    await run("sync_send", lambda: phase_sync(addr, "BenchSync", args.seconds))
    for gap in args.sync_gap_us:
        await run(f"sync_send_gap_{gap}us", lambda gap=gap: phase_sync(addr, "BenchSync", args.seconds, gap))
    await run("send_64_in_flight", lambda: phase_inflight(addr, "BenchAsync", args.seconds))
    await run("batch_send_64x128B", lambda: phase_inflight(addr, "BenchBatch", args.seconds, inflight=8, batch=True),
              args.settle_s)
    await run("pull", lambda: phase_pull(addr, "BenchBatch", 1, args.seconds, max_nums=args.pull_batch))
    return results


async def in_process(args, root) -> None:
    """--in-process: a Broker in this process, SEND_MESSAGE_V2 frames fed to a server
    Connection (no sockets, no client): the broker's own CPU per send, by thread_time of
    each request, back to back (warm) and after each --sync-gap-us idle gap (cold)."""
    import statistics

    from pocketmq.broker.app import Broker
    from pocketmq.broker.config import parse_args
    config, _ = parse_args([f"--storePathRootDir={root}", "--listenPort=0", "--defaultTopicQueueNums=1",
                            "--brokerIP1=127.0.0.1"])
    broker = Broker(config, host="127.0.0.1")
    await broker.start()
    try:
        conn = broker.server._factory()
        conn.connection_made(NullTransport(("127.0.0.1", 50000)))
        make = send_frame_factory("BenchInProcess", BODY)
        conn.data_received(make(1))              # creates the topic (published asynchronously)
        await asyncio.sleep(0.5)
        n = max(200, int(args.seconds * 2000))
        opaque = 1
        for gap_us in [0, *args.sync_gap_us]:
            rounds = []
            for _ in range(5 if not gap_us else 1):
                frames = [make(opaque + i) for i in range(n)]
                opaque += n
                cpu = 0
                for f in frames:
                    if gap_us:
                        time.sleep(gap_us / 1e6)
                    c0 = time.thread_time_ns()
                    conn.data_received(f)
                    cpu += time.thread_time_ns() - c0
                rounds.append(cpu / n / 1000)
                await asyncio.sleep(0)          # the loop runs between rounds (busy-poll windows end)
            print(f"phase=in_process_send gap_us={gap_us} msgs={n * len(rounds)} "
                  f"cpu_us_per_send_min={min(rounds):.1f} cpu_us_per_send_median={statistics.median(rounds):.1f}",
                  flush=True)
    finally:
        await broker.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--flush", default="ASYNC_FLUSH")
    ap.add_argument("--pull-batch", type=int, default=32)
    ap.add_argument("--busy-poll-us", type=int, default=None,
                    help="broker busyPollMicros (default: the broker's default, 500)")
    ap.add_argument("--metrics-port", type=int, default=0,
                    help="broker metricsPort: serve Prometheus /metrics (times every request; 0: off)")
    ap.add_argument("--codec", choices=["json", "msgpack"], default="json",
                    help="request header codec (replies use the same; msgpack is pocketmq's own)")
    ap.add_argument("--sync-gap-us", type=int, action="append", default=[],
                    help="also run the sync phase with this idle gap between sends (repeatable): "
                         "the broker's CPU per send once its loop sleeps between requests")
    ap.add_argument("--settle-s", type=float, default=0.0,
                    help="after the batched phase, wait this long and also report the broker's CPU "
                         "per message of that phase including the work left behind it (the index)")
    ap.add_argument("--no-index", action="store_true",
                    help="broker messageIndexEnable=false (the message index is built behind the dispatcher)")
    ap.add_argument("--in-process", action="store_true",
                    help="no daemons: a broker in this process fed frames without sockets; its CPU per "
                         "send warm and after each --sync-gap-us gap")
    args = ap.parse_args()
    global SERIALIZE
    SERIALIZE = SerializeType.MSGPACK if args.codec == "msgpack" else SerializeType.JSON
    root = tempfile.mkdtemp(prefix="pocketmq-bench-")
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    if args.in_process:
        try:
            asyncio.run(in_process(args, root))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    extra = [f"--flushDiskType={args.flush}", "--defaultTopicQueueNums=1",
             f"--maxTransferCountOnMessageInMemory={max(32, args.pull_batch)}",
             f"--maxTransferBytesOnMessageInMemory={max(262144, args.pull_batch * 300)}"]
    if args.busy_poll_us is not None:
        extra.append(f"--busyPollMicros={args.busy_poll_us}")
    if args.metrics_port:
        extra.append(f"--metricsPort={args.metrics_port}")
    if args.no_index:
        extra.append("--messageIndexEnable=false")
    cluster = Cluster(root, broker_args=extra).start()
    try:
        asyncio.run(main_async(args, cluster))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
