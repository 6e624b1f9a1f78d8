"""The floor of a unary gRPC call on this host: what a server that does no work costs per
call, in several server set-ups, from two clients (issue 33's send speed).

The server is a stand-in MessagingService in a process of its own that does nothing
beyond what a client needs to start: QueryRoute answers 8 queues on itself, Telemetry
answers the client's settings (convert.settings_reply, as the broker does), Heartbeat
and SendMessage answer OK (the send stores nothing). It is a measuring device, never a
broker. Server set-ups (--servers, comma-separated):

    aio-uvloop     grpc.aio server on a uvloop loop (the broker's set-up before issue 33's work)
    aio-asyncio    grpc.aio server on the default asyncio loop
    sync           grpc.server with a thread pool; the handlers run in its threads
    sync-loop      grpc.server with a thread pool; each handler hands an `async def` to a
                   uvloop loop in another thread (asyncio.run_coroutine_threadsafe) and waits
    broker         not the stand-in: a real mqnamesrv + mqbroker --enable-proxy (ASYNC_FLUSH), whose
                   sends are stored; the difference to aio-uvloop is the broker's own share

`NAME+key=value+...` adds grpc channel options (e.g. `aio-uvloop+grpc.optimization_target=latency`;
`+maximum_concurrent_rpcs=N` is the server's argument of that name, as the broker sets it;
`+registered=1` registers the 17 RPCs as registered methods too, as the generated
`add_MessagingServiceServicer_to_server` does: grpc.aio's accept loop then waits on 18
futures per call, see broker/proxy/server.py);
`NAME@ENV=value` sets an environment variable of the server process (e.g. `@GRPC_POLL_STRATEGY=poll`).

Clients (--clients): `stub` is our generated stubs as a plain sync grpcio client in this
process (Heartbeat and SendMessage, microseconds per call); `rmq5` is the official
rocketmq-python-client 5.1.2 producer from its own venv (tests/support/rmq5.py), sync
sends one at a time (the driver's producer and message), sends per second. Every figure
comes with the server process's CPU per call (all its threads, from /proc; *: for rmq5
over the client's whole run, its start and warm-up included, so a little high) and the
client's (process CPU time). Each set-up runs `--rounds` times, interleaved, so
drift on a shared host hits every set-up alike; the loopback calibration is printed
before and after.

    python3 bench/bench_grpc_floor.py
    python3 bench/bench_grpc_floor.py --servers aio-uvloop,sync-loop --clients stub --count 5000
"""
from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = ("aio-uvloop", "aio-asyncio", "sync", "sync-loop", "broker")


# ---- the stand-in server (runs in the child process) -------------------------------------

def _replies():
    """The work of each RPC, plain functions of the request (shared by every mode)."""
    from pocketmq.broker.proxy import convert
    from pocketmq.broker.proxy.pb import definition_pb2 as pb
    from pocketmq.broker.proxy.pb import service_pb2 as spb
    from pocketmq.protocol.codes import PermName
    port = int(os.environ["FLOOR_PORT"])
    broker = pb.Broker(name="floor", id=0, endpoints=convert.endpoints("127.0.0.1", port))
    ok = convert.status(convert.OK)

    def query_route(request):
        return spb.QueryRouteResponse(status=ok, message_queues=convert.route_queues(
            request.topic.name, 8, 8, PermName.READ | PermName.WRITE, broker))

    def heartbeat(request):
        return spb.HeartbeatResponse(status=ok)

    def send(request):
        return spb.SendMessageResponse(status=ok, entries=[
            spb.SendResultEntry(status=ok, message_id=m.system_properties.message_id, offset=0)
            for m in request.messages])

    def notify(request):
        return spb.NotifyClientTerminationResponse(status=ok)

    def telemetry(command):
        if command.WhichOneof("command") == "settings":
            return spb.TelemetryCommand(status=ok, settings=convert.settings_reply(command.settings,
                                                                                   max_body_size=4 << 20))
        return None

    return {"QueryRoute": query_route, "Heartbeat": heartbeat, "SendMessage": send,
            "NotifyClientTermination": notify}, telemetry


def _aio_servicer(base, unary, telemetry):
    class Servicer(base):
        pass
    for name, fn in unary.items():
        async def call(self, request, context, fn=fn):
            return fn(request)
        setattr(Servicer, name, call)

    async def tele(self, request_iterator, context):
        async for command in request_iterator:
            reply = telemetry(command)
            if reply is not None:
                yield reply
    Servicer.Telemetry = tele
    return Servicer()


def _sync_servicer(base, unary, telemetry, loop=None):
    class Servicer(base):
        pass
    for name, fn in unary.items():
        if loop is None:
            def call(self, request, context, fn=fn):
                return fn(request)
        else:
            def call(self, request, context, fn=fn):
                async def work():
                    return fn(request)
                return asyncio.run_coroutine_threadsafe(work(), loop).result()
        setattr(Servicer, name, call)

    def tele(self, request_iterator, context):
        for command in request_iterator:
            reply = telemetry(command)
            if reply is not None:
                yield reply
    Servicer.Telemetry = tele
    return Servicer()


def serve(mode: str, options: list[tuple[str, object]]) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from pocketmq.broker.proxy.pb import service_pb2_grpc as g
    from pocketmq.broker.proxy.server import add_servicer
    unary, telemetry = _replies()
    port = int(os.environ["FLOOR_PORT"])
    limit = dict(options).get("maximum_concurrent_rpcs")
    registered = dict(options).get("registered")
    options = [(k, v) for k, v in options if k not in ("maximum_concurrent_rpcs", "registered")]

    def add(servicer, server):
        if registered:
            g.add_MessagingServiceServicer_to_server(servicer, server)
        else:
            add_servicer(servicer, server)

    def ready():
        print(f"ready {port}", flush=True)
        sys.stdin.read()          # the parent closes our stdin to stop us

    if mode.startswith("aio-"):
        if mode == "aio-uvloop":
            import uvloop
            uvloop.install()

        async def main():
            server = grpc.aio.server(options=options, maximum_concurrent_rpcs=limit)
            server.add_insecure_port(f"127.0.0.1:{port}")
            add(_aio_servicer(g.MessagingServiceServicer, unary, telemetry), server)
            await server.start()
            await asyncio.get_running_loop().run_in_executor(None, ready)
            await server.stop(0)
        asyncio.run(main())
        return
    loop = None
    if mode == "sync-loop":
        import uvloop
        loop = uvloop.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
    server = grpc.server(ThreadPoolExecutor(max_workers=16), options=options, maximum_concurrent_rpcs=limit)
    server.add_insecure_port(f"127.0.0.1:{port}")
    add(_sync_servicer(g.MessagingServiceServicer, unary, telemetry, loop), server)
    server.start()
    ready()
    server.stop(0)


# ---- the clients (this process) -----------------------------------------------------------

def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stub_us(endpoint: str, count: int, size: int, server_pid: int) -> dict:
    """Per call of our generated stubs as a sync grpcio client: (wall us, server CPU us,
    this client's CPU us)."""
    import grpc

    from pocketmq.broker.proxy.pb import definition_pb2 as pb
    from pocketmq.broker.proxy.pb import service_pb2 as spb
    from pocketmq.broker.proxy.pb import service_pb2_grpc
    channel = grpc.insecure_channel(endpoint)
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    md = [("x-mq-client-id", "bench-floor")]
    m = pb.Message(topic=pb.Resource(name="Floor"), body=b"x" * size)
    m.system_properties.message_id = "BENCH-FLOOR"
    m.system_properties.message_type = pb.NORMAL
    calls = {"Heartbeat": lambda: stub.Heartbeat(spb.HeartbeatRequest(client_type=pb.PRODUCER), metadata=md),
             "SendMessage": lambda: stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=md)}
    out = {}
    for name, call in calls.items():
        for _ in range(200):
            call()
        s0, c0, t0 = cpu_s(server_pid), time.process_time(), time.perf_counter()
        for _ in range(count):
            call()
        out[name] = tuple((x / count * 1e6) for x in (time.perf_counter() - t0, cpu_s(server_pid) - s0,
                                                          time.process_time() - c0))
    channel.close()
    return out


# Runs in the official client's venv: the driver's own producer and message (the calls
# tests/support/rmq5_driver.py's "bench" scenario makes), timed in wall and process CPU.
RMQ5_TIMED = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import rmq5_driver as d
endpoint, topic, count, size = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
p = d.producer(endpoint, topic)
m = d.build(topic, {"body": "x" * size})
for _ in range(50):
    p.send(m)
c0, t0 = time.process_time(), time.perf_counter()
for _ in range(count):
    p.send(m)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
p.shutdown()
print(json.dumps({"wall_us": wall / count * 1e6, "cpu_us": cpu / count * 1e6}))
"""


def rmq5_us(python: str, endpoint: str, topic: str, count: int, size: int, server_pid: int) -> tuple:
    """Per sync send of the official 5.x producer: (wall us, server CPU us, client CPU us);
    the server's CPU is taken over the whole client run (its start and warm-up too)."""
    import json
    import tempfile

    from tests.support.rmq5 import DRIVER
    with tempfile.TemporaryDirectory(prefix="rmq5home") as home:    # the client writes its logs under ~/logs
        env = dict(os.environ, HOME=home)
        env.pop("PYTHONPATH", None)
        s0 = cpu_s(server_pid)
        out = subprocess.run([python, "-c", RMQ5_TIMED, str(DRIVER.parent), endpoint, topic, str(count), str(size)],
                             capture_output=True, text=True, env=env, cwd=home, timeout=600)
    server = (cpu_s(server_pid) - s0) / (count + 50) * 1e6
    if out.returncode != 0:
        raise RuntimeError(f"rmq5 client exited {out.returncode}: {out.stderr[-2000:]}")
    ev = json.loads(out.stdout.strip().splitlines()[-1])
    return ev["wall_us"], server, ev["cpu_us"]


def start_server(spec: str):
    """-> (server pid, endpoint, stop())"""
    from tests.support.daemons import free_port
    spec, *envs = spec.split("@")
    mode, *opts = spec.split("+")
    if mode not in MODES:
        raise SystemExit(f"unknown server set-up {mode!r}; one of {', '.join(MODES)}")
    port = free_port()
    if mode == "broker":
        from bench.bench_broker import temp_cluster
        running = temp_cluster("bench-grpc-floor", broker_args=["--enable-proxy", f"--grpcServerPort={port}"])
        c = running.__enter__()
        return c.broker.proc.pid, f"127.0.0.1:{port}", lambda: running.__exit__(None, None, None)
    env = dict(os.environ, FLOOR_PORT=str(port))
    for e in envs:
        k, _, v = e.partition("=")
        env[k] = v
    p = subprocess.Popen([sys.executable, __file__, "--serve", mode, *[f"--opt={o}" for o in opts]],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    if not line.startswith("ready"):
        p.kill()
        raise RuntimeError(f"server {spec} did not start: {line!r}")

    def stop():
        p.stdin.close()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    return p.pid, f"127.0.0.1:{port}", stop


def option(text: str) -> tuple[str, object]:
    k, _, v = text.partition("=")
    return k, int(v) if v.lstrip("-").isdigit() else v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default=",".join(MODES))
    ap.add_argument("--clients", default="stub,rmq5")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--opt", action="append", default=[], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, [option(o) for o in a.opt])
        return 0
    from bench.bench_broker import print_calibration
    clients = a.clients.split(",")
    python = None
    if "rmq5" in clients:
        from tests.support.rmq5 import ensure_venv
        python = ensure_venv()
    print_calibration("before")
    for r in range(a.rounds):
        for spec in a.servers.split(","):
            pid, endpoint, stop = start_server(spec)
            try:
                parts = []
                if "stub" in clients:
                    us = stub_us(endpoint, a.count, a.size, pid)
                    parts.append("stub " + ", ".join(f"{k} {w:.0f} us (server CPU {s:.0f}, client CPU {c:.0f})"
                                                     for k, (w, s, c) in us.items()))
                if "rmq5" in clients:
                    w, srv, cli = rmq5_us(python, endpoint, f"Floor{r}", a.count, a.size, pid)
                    parts.append(f"rmq5 producer {1e6 / w:.0f} sends/s = {w:.0f} us/send (server CPU {srv:.0f}*, "
                                 f"client CPU {cli:.0f})")
                print(f"round {r} {spec}: " + ", ".join(parts), flush=True)
            finally:
                stop()
    print_calibration("after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
