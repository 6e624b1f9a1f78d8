"""Client benchmarks: producer and push-consumer throughput, end-to-end latency.

    python -m bench.bench_client                       # starts mqnamesrv + mqbroker in a temp dir
    python -m bench.bench_client --namesrv 127.0.0.1:9876
    python -m bench.bench_client --fake                # in-process FakeCluster (client overhead only)
    python -m bench.bench_client --phases inflight,sync --pin split \
        --broker-arg=--flushDiskType=SYNC_FLUSH --broker-arg=--defaultTopicQueueNums=1

`--phases` picks phases (a quick A/B of one cell instead of the whole ~5-minute
side-by-side harness); `--pin same|split` places the cluster this starts and the client
on CPUs as ../shared/bench/peers.py does; `--broker-arg` passes mqbroker flags
(`--defaultTopicQueueNums=1` gives the harness's one queue per topic).

Measures (defaults keep a run under ~2 minutes on 2 cores):
  sync send       one send at a time: msgs/s, p50/p99/p99.9 latency, client CPU per send
  request floor   (`--phases floor`) requests the broker answers with no handler's work
                  (an unserved code), one at a time, against as many sync sends, twice:
                  rate and client / broker CPU per request (what the send's own work costs
                  over the remoting round trip)
  send layers     (`--phases layers`) the same sync send through ever more of the client:
                  a prebuilt frame on a minimal protocol, that plus encoding and decoding,
                  Connection.request, api.send_message, Producer.send; rounds interleaved,
                  rate and client / broker CPU per send (what each layer costs)
  api pairs       (`--phases apis`) the API users call first against the fast one, rows
                  interleaved round by round: send_batch of 64 Messages built per call,
                  of 64 prebuilt Messages, of the 64 bodies (topic=); send(Message) with 64
                  in flight against the same window of sends to the harness's py-store
                  floor (../shared/bench/pyserver.py, started here; --pyserver '' skips it)
  async send      64 sends in flight: msgs/s, p50/p99 per send, client CPU per message
                  (coalesced into batches by the producer unless --no-coalesce: then one
                  request per send; `--coalesce-max N`: groups of at most N sends)
  batch send      send_batch of 100 x 128 B: msgs/s and client CPU per message, one at a
                  time (one list of Messages, built once; and the bodies API:
                  send_batch(bodies, topic=...)) and 8 in flight
  push consume    messages/s delivered to a no-op listener (pre-produced backlog)
  lite consume    LitePullConsumer poll(max_records=32) + commit() over a pre-produced
                  backlog (the side-by-side harness's consume cycle): msgs/s, p99 per
                  cycle, client CPU per message
  orderly consume the same on a topic of 8 queues, concurrent and orderly=True (the
                  issue's target: orderly at least half of concurrent); --no-orderly skips it
  end-to-end      send -> listener latency p50/p99 at 1,000 and 10,000 msgs/s
Every phase is bounded in count and time and talks to 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import socket
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pocketmq.client import LitePullConsumer, Message, Producer, PushConsumer
from pocketmq.protocol.codes import SerializeType


# What every client of the run is given: credentials (--credentials: every request signed)
# and tls (--tls). Set once by main() before the phases run.
CLIENT_KW: dict = {}
BENCH_ACCOUNT = ("benchAdmin", "benchSecret")


def tls_and_acl_args(root: str, tls: str | None, credentials: bool) -> tuple[list[str], list[str]]:
    """(nameserver args, broker args) for the cluster this starts: --tls = both daemons in
    tlsServerMode=enforcing (`tls`: the mode) with a self-signed certificate made here by
    openssl (the broker registering over TLS); --credentials = plain ACL on both,
    BENCH_ACCOUNT an admin account (the broker checks every request's signature: signing
    and verifying are both measured)."""
    ns: list[str] = []
    broker: list[str] = []
    if tls:
        import subprocess
        cert, key = os.path.join(root, "cert.pem"), os.path.join(root, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost"],
                       check=True, capture_output=True, timeout=60)
        keys = [f"--tlsServerMode={tls}", f"--tlsServerCertPath={cert}", f"--tlsServerKeyPath={key}"]
        ns += keys
        broker += keys + ["--useTLS=true"]
    if credentials:
        acl = os.path.join(root, "plain_acl.yml")
        with open(acl, "w") as f:
            f.write(f"accounts:\n  - accessKey: {BENCH_ACCOUNT[0]}\n    secretKey: {BENCH_ACCOUNT[1]}\n"
                    "    admin: true\n")
        ns += ["--aclEnable=true", f"--aclFilePath={acl}"]
        broker += ["--aclEnable=true", f"--aclFilePath={acl}", f"--accessKey={BENCH_ACCOUNT[0]}",
                   f"--secretKey={BENCH_ACCOUNT[1]}"]
    return ns, broker


def pct(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p / 100))]


async def bench_sync_send(addr, topic, n, st):
    body = b"x" * 128
    lat = []
    async with Producer("BenchSync", addr, instance_name="bench-sync", serialize_type=st, **CLIENT_KW) as p:
        for _ in range(200):
            await p.send(Message(topic, body))
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            s = time.perf_counter_ns()
            await p.send(Message(topic, body))
            lat.append((time.perf_counter_ns() - s) / 1000)
        dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"msgs_per_s": n / dt, "p50_us": pct(lat, 50), "p99_us": pct(lat, 99), "p999_us": pct(lat, 99.9),
            "client_cpu_us_per_msg": cpu * 1e6 / n}


# A request code no broker serves: answered REQUEST_CODE_NOT_SUPPORTED by the remoting layer
# with no handler's work (RocketMQ's codes stay below 1000 and 30xx-40xx).
_UNSERVED_CODE = 9999


def _proc_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` (all its threads), None without a pid."""
    if pid is None:
        return None
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_request_floor(addr, topic, n, st, broker_pid=None):
    """What a sync send costs over the remoting round trip alone: n requests the broker
    answers without a handler (an unserved code, one at a time on the producer's broker
    connection), then n sync sends, alternated twice; client CPU and (when this process
    started the cluster) broker CPU per request. The difference is the send's own work on
    both sides; the first is the floor a sync send cannot go below with this remoting."""
    from pocketmq.protocol.command import RemotingCommand
    body = b"x" * 128
    out = {}
    async with Producer("BenchFloor", addr, instance_name="bench-floor", serialize_type=st, **CLIENT_KW) as p:
        for _ in range(200):
            r = await p.send(Message(topic, body))
        inst = p.instance
        conn = inst.remoting.connections[inst.brokers.master(r.queue.broker_name)]
        for kind in ("unserved", "send", "unserved", "send"):
            b0, cpu0, t0 = _proc_cpu_s(broker_pid), time.process_time(), time.perf_counter()
            for _ in range(n):
                if kind == "send":
                    await p.send(Message(topic, body))
                else:
                    await conn.request(RemotingCommand(_UNSERVED_CODE, ext_fields={}), 3.0)
            dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            row = {"per_s": n / dt, "client_cpu_us": cpu * 1e6 / n}
            if broker_pid is not None:
                row["broker_cpu_us"] = (_proc_cpu_s(broker_pid) - b0) * 1e6 / n
            out.setdefault(kind, []).append(row)
    return out


class _RawClient(asyncio.Protocol):
    """The least a client can be (peers.py's FrameClient): u32-length-prefixed frames written
    as given, replies handed back in order as bytes; no opaque table, no timeouts."""

    def __init__(self):
        self.waiters = collections.deque()
        self.buf = bytearray()

    def connection_made(self, transport):
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.loop = asyncio.get_running_loop()

    def connection_lost(self, exc):
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(ConnectionError("connection to the broker lost"))

    def request(self, frame: bytes) -> asyncio.Future:
        fut = self.loop.create_future()
        self.waiters.append(fut)
        self.transport.write(frame)
        return fut

    def data_received(self, data):
        buf = self.buf
        buf += data
        pos = 0
        while len(buf) - pos >= 4:
            end = pos + 4 + int.from_bytes(buf[pos:pos + 4], "big")
            if end > len(buf):
                break
            self.waiters.popleft().set_result(bytes(buf[pos + 4:end]))
            pos = end
        del buf[:pos]


async def send_layer_fns(p: Producer, raw_request, topic: str, body: bytes) -> dict:
    """The callables of `--phases layers` (bench_send_layers), each one sync send of `body`
    to `topic` through a layer of the client: "frame", "codec" (on `raw_request(frame) ->
    reply bytes`, a minimal protocol such as _RawClient.request or peers.py's FrameClient),
    "conn", "api", "producer" (on the started Producer `p`). Sends once to learn the queue."""
    from pocketmq.client.message import SendResult
    from pocketmq.client.producer import SEND_STATUS, _uniq, send_ext_fields
    from pocketmq.protocol.codes import CURRENT_VERSION, LanguageCode, RequestCode
    from pocketmq.protocol.command import RemotingCommand, encode_parts
    from pocketmq.protocol.headers.codec import DECODERS
    r = await p.send(Message(topic, body))
    inst = p.instance
    mq = r.queue
    addr = inst.brokers.master(mq.broker_name)
    conn = inst.remoting.connections[addr]
    st = conn.attrs["serialize_type"]
    decode = DECODERS[st]
    group = p.group
    code = RequestCode.SEND_MESSAGE_V2

    def command(uniq: str) -> RemotingCommand:
        props = Message(topic, body).wire_properties_text(uniq)
        ext = send_ext_fields(group, topic, mq.queue_id, 0, 0, props, False, time.time_ns() // 1_000_000)
        return RemotingCommand(code, 0, 0, None, ext, body, LanguageCode.PYTHON, CURRENT_VERSION, st)

    def result(uniq: str, code: int, ext: dict) -> SendResult:
        return SendResult(SEND_STATUS[code], uniq, ext.get("msgId", ""), mq, int(ext.get("queueOffset", -1)))

    def header(reply: bytes) -> tuple:
        """(code, language, version, opaque, flag, remark, ext) of a reply without its length."""
        return decode(memoryview(reply)[4:4 + int.from_bytes(reply[1:4], "big")])

    frame = b"".join(encode_parts(command(_uniq.next_id())))
    # the `frame` row times replies it never reads: this one is checked to be a stored send
    rcode, _lang, _ver, _opaque, _flag, remark, rext = header(await raw_request(frame))
    if rcode != 0 or "queueOffset" not in rext:
        raise RuntimeError(f"the prebuilt send frame was answered {rcode} {remark!r}")

    async def codec():
        uniq = _uniq.next_id()
        rcode, _lang, _ver, _opaque, _flag, _remark, ext = header(
            await raw_request(b"".join(encode_parts(command(uniq)))))
        return result(uniq, rcode, ext)

    async def via_conn():
        uniq = _uniq.next_id()
        resp = await conn.request(command(uniq), 3.0)
        return result(uniq, resp.code, resp.ext_fields)

    async def via_api():
        uniq = _uniq.next_id()
        resp = await inst.api.send_message(addr, command(uniq).ext_fields, body, timeout_s=3.0)
        return result(uniq, resp.code, resp.ext_fields)

    return {"frame": lambda: raw_request(frame), "codec": codec, "conn": via_conn, "api": via_api,
            "producer": lambda: p.send(Message(topic, body))}


async def _layer_row(fn, seconds: float, broker_pid: int | None) -> dict:
    """One row of bench_send_layers: `fn` awaited in a loop for `seconds`."""
    n = 0
    b0, cpu0, t0 = _proc_cpu_s(broker_pid), time.process_time(), time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            await fn()
        n += 100
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    row = {"per_s": n / dt, "client_cpu_us": cpu * 1e6 / n}
    if broker_pid is not None:
        row["broker_cpu_us"] = (_proc_cpu_s(broker_pid) - b0) * 1e6 / n
    row["sends"] = n
    return row


async def bench_send_layers(addr, topic, seconds, rounds, broker_pid=None):
    """What each layer of the client costs a sync send: the same SEND_MESSAGE_V2 one at a time
    through ever more of the client, rounds interleaved, rate and client / broker CPU per send.

      frame     a prebuilt frame on a minimal protocol (_RawClient): no client work at all
      codec     the same minimal protocol, the frame encoded per send (Message, uniq id,
                properties, ext fields, protocol.command.encode_parts) and the reply's header
                decoded into a SendResult: about the least a real client does
      conn      RemotingCommand through the producer's broker Connection.request (opaque
                table, deadlines, busy poll, the FrameDecoder)
      api       client.api's send_message (the response code checked)
      producer  Producer.send (checks, route, fault tolerance, retry loop)

    On one core the rows above `producer` also show what a leaner client saves the broker:
    both processes share the CPU's caches."""
    out = {}
    async with Producer("BenchLayers", addr, instance_name="bench-layers", **CLIENT_KW) as p:
        r = await p.send(Message(topic, b"warm-up"))
        host, port = p.instance.brokers.master(r.queue.broker_name).rsplit(":", 1)
        _, raw = await asyncio.get_running_loop().create_connection(_RawClient, host, int(port))
        try:
            # the minimal protocol has no timeouts of its own: a broker that stops answering
            # ends the phase here
            async with asyncio.timeout(60 + rounds * 5 * (seconds + 10)):
                layers = await send_layer_fns(p, raw.request, topic, b"x" * 128)
                for fn in layers.values():
                    for _ in range(200):
                        await fn()
                for _ in range(rounds):
                    for name, fn in layers.items():
                        out.setdefault(name, []).append(await _layer_row(fn, seconds, broker_pid))
        finally:
            raw.transport.close()
    return out


async def bench_inflight_send(addr, topic, n, st, inflight=64, coalesce=True, coalesce_max=None):
    body = b"x" * 128
    kw = {} if coalesce_max is None else {"coalesce_max_messages": coalesce_max}
    async with Producer("BenchAsync", addr, instance_name="bench-async", serialize_type=st, **CLIENT_KW,
                        coalesce_sends=coalesce, **kw) as p:
        await p.send(Message(topic, body))
        left = n
        lat = []

        async def worker():
            nonlocal left
            while left > 0:
                left -= 1
                s = time.perf_counter_ns()
                await p.send(Message(topic, body))
                lat.append((time.perf_counter_ns() - s) / 1000)
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"msgs_per_s": n / dt, "in_flight": inflight, "coalesce_sends": coalesce,
            "coalesce_max_messages": p.coalesce_max_messages, "p50_us": pct(lat, 50),
            "p99_us": pct(lat, 99), "client_cpu_us_per_msg": cpu * 1e6 / n}


async def bench_batch_send(addr, topic, n, st, batch=100, inflight=1, api="messages"):
    """send_batch one batch at a time (or `inflight` at once) until `n` messages. `api`:
    "messages" sends one list of Messages built once (as this phase always did: the
    Message() cost is not counted), "bodies" passes the payloads (send_batch(bodies,
    topic=...)). Client CPU per message from time.process_time (this process: the client)."""
    body = b"x" * 128
    bodies = [body] * batch
    async with Producer("BenchBatch", addr, instance_name="bench-batch", serialize_type=st, **CLIENT_KW) as p:
        if api == "bodies":
            async def one():
                await p.send_batch(bodies, topic=topic)
        else:
            msgs = [Message(topic, b) for b in bodies]

            async def one():
                await p.send_batch(msgs)
        await one()
        sent = 0

        async def worker():
            nonlocal sent
            while sent < n:
                sent += batch
                await one()
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"msgs_per_s": sent / dt, "batch": batch, "in_flight": inflight, "api": api,
            "client_cpu_us_per_msg": round(1e6 * cpu / sent, 2)}


# The py-store floor of the side-by-side harness (../shared/bench/pyserver.py --style store:
# a uvloop server packing every message as a CommitLog record into an mmap), driven here
# with the harness's frames: u32 length + b"S" + body per send.
PYSERVER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "shared", "bench", "pyserver.py")


def start_pyserver_store(root: str, path: str = PYSERVER):
    """The py-store server in a subprocess: (Popen, port)."""
    import subprocess
    d = os.path.join(root, "py-store")
    os.makedirs(d, exist_ok=True)
    proc = subprocess.Popen([sys.executable, path, "--style", "store", "--data-dir", d],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = proc.stdout.readline()
    if not line.startswith(b"READY"):
        proc.kill()
        raise RuntimeError(f"py-store: bad start line {line!r}")
    return proc, int(line.split()[1])


async def _timed_row(one, per: int, seconds: float, workers: int = 1) -> dict:
    """`one()` awaited in a loop by `workers` tasks for `seconds`; `per` messages each call:
    msgs/s and client CPU per message (this process)."""
    n = 0

    async def worker(end):
        nonlocal n
        while time.perf_counter() < end:
            await one()
            n += per
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(t0 + seconds) for _ in range(workers)))
    dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"msgs_per_s": n / dt, "client_cpu_us_per_msg": cpu * 1e6 / n, "msgs": n}


async def bench_api_pairs(addr, topic, seconds, rounds, batch=64, inflight=64, floor_port=None):
    """The API users call first against the fast one (issue 35 item 3), rows interleaved
    round by round in one process against one broker, 128 B bodies:

      batch_messages   send_batch([Message(topic, b) for b in bodies]): the Messages built
                       per call, as a user's code does
      batch_prebuilt   send_batch(msgs) of one list of Messages built once (the path alone)
      batch_bodies     send_batch(bodies, topic=topic)
      inflight_message `inflight` tasks each awaiting send(Message(topic, body)) in a loop
      floor_window     (floor_port given) the same window of single sends to the py-store
                       floor (the harness's `send window 64` cell of py-store)

    Ratios are read within a round (batch_messages / batch_bodies, inflight_message /
    floor_window): the host's drift moves both rows of a round alike."""
    body = b"x" * 128
    bodies = [body] * batch
    rows: dict = {}
    raw = None
    async with Producer("BenchApis", addr, instance_name="bench-apis", **CLIENT_KW) as p:
        await p.send(Message(topic, body))
        prebuilt = [Message(topic, b) for b in bodies]

        async def batch_messages():
            await p.send_batch([Message(topic, b) for b in bodies])

        async def batch_prebuilt():
            await p.send_batch(prebuilt)

        async def batch_bodies():
            await p.send_batch(bodies, topic=topic)

        async def inflight_message():
            await p.send(Message(topic, body))
        fns = {"batch_messages": (batch_messages, batch, 1), "batch_prebuilt": (batch_prebuilt, batch, 1),
               "batch_bodies": (batch_bodies, batch, 1), "inflight_message": (inflight_message, 1, inflight)}
        if floor_port is not None:
            _, raw = await asyncio.get_running_loop().create_connection(_RawClient, "127.0.0.1", floor_port)
            frame = struct.pack(">IB", len(body) + 1, ord("S")) + body

            async def floor_window():
                await raw.request(frame)
            fns["floor_window"] = (floor_window, 1, inflight)
        try:
            async with asyncio.timeout(60 + rounds * len(fns) * (seconds + 10)):
                for fn, per, workers in fns.values():        # warm-up
                    await _timed_row(fn, per, min(0.3, seconds), workers)
                for r in range(rounds):
                    for name, (fn, per, workers) in fns.items():
                        rows.setdefault(name, []).append(await _timed_row(fn, per, seconds, workers))
                    last = {k: v[-1]["msgs_per_s"] for k, v in rows.items()}
                    ratios = f"messages/bodies {last['batch_messages'] / last['batch_bodies']:.2f}x, " \
                             f"prebuilt/bodies {last['batch_prebuilt'] / last['batch_bodies']:.2f}x"
                    if "floor_window" in last:
                        ratios += (f", send(Message) x{inflight} / floor "
                                   f"{last['inflight_message'] / last['floor_window']:.2f}x")
                    print(f"round {r + 1}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in last.items()) + "; " + ratios,
                          flush=True)
        finally:
            if raw is not None:
                raw.transport.close()
    out = {"rows": rows, "batch": batch, "in_flight": inflight}
    per_round = list(zip(*(rows[k] for k in rows)))
    names = list(rows)

    def ratio(a, b):
        return [x[names.index(a)]["msgs_per_s"] / x[names.index(b)]["msgs_per_s"] for x in per_round]
    out["messages_vs_bodies"] = ratio("batch_messages", "batch_bodies")
    out["prebuilt_vs_bodies"] = ratio("batch_prebuilt", "batch_bodies")
    if "floor_window" in rows:
        out["inflight_vs_floor"] = ratio("inflight_message", "floor_window")
    return out


async def create_queues(addr, topic, queues):
    """Create `topic` with `queues` queues on every master and wait for its route."""
    from pocketmq.client.instance import ClientInstance
    from pocketmq.protocol.bodies import TopicConfig
    inst = ClientInstance("127.0.0.1@bench-admin", addr, **CLIENT_KW)
    try:
        brokers, _ = await inst.api.cluster_info()
        for bd in brokers.values():
            await inst.api.create_topic(bd.broker_addrs[0], TopicConfig(topic, queues, queues), "TBW102")
        for _ in range(400):
            route = await inst.api.get_route(topic)
            if route is not None and sum(q.read_queue_nums for q in route.queue_datas) == queues * len(brokers):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"route of {topic} never showed its {queues} queues")
    finally:
        await inst.close()


async def bench_push_consume(addr, topic, n, st, *, orderly=False, queues=None):
    body = b"x" * 128
    if queues:
        await create_queues(addr, topic, queues)
    async with Producer("BenchFill", addr, instance_name="bench-fill", serialize_type=st, **CLIENT_KW) as p:
        msgs = [Message(topic, body) for _ in range(100)]
        for _ in range(n // 100):
            await p.send_batch(msgs)
    done = asyncio.Event()
    count = 0
    first = None
    cpu0 = cpu1 = 0.0

    async def listener(msg):
        nonlocal count, first, cpu0, cpu1
        if first is None:
            first = time.perf_counter()
            cpu0 = time.process_time()
        count += 1
        if count >= n:
            cpu1 = time.process_time()
            done.set()
    c = PushConsumer("BenchConsumeOrderly" if orderly else "BenchConsume", addr, listener=listener,
                     instance_name="bench-consume", consume_from_where="FIRST_OFFSET", serialize_type=st, **CLIENT_KW,
                     orderly=orderly)
    c.subscribe(topic)
    async with c:
        try:
            await asyncio.wait_for(done.wait(), 120)
        except TimeoutError:
            pass
        dt = time.perf_counter() - (first or time.perf_counter())
    out = {"msgs_per_s": count / dt if dt > 0 else 0.0, "consumed": count}
    if cpu1 > cpu0:
        # this process's CPU per message: steadier than msgs/s on a host whose speed drifts
        out["client_cpu_us_per_msg"] = (cpu1 - cpu0) * 1e6 / count
    if queues:
        out["queues"] = queues
    if orderly:
        out["orderly"] = True
    return out


async def bench_lite_consume(addr, topic, n, st, *, poll=32):
    """poll(max_records=poll) + commit() until `n` messages of a pre-produced backlog are
    consumed (one queue, like the harness's consume cycle)."""
    body = b"x" * 128
    async with Producer("BenchLiteFill", addr, instance_name="bench-lite-fill", serialize_type=st, **CLIENT_KW) as p:
        msgs = [Message(topic, body) for _ in range(64)]
        for _ in range(n // 64):
            await p.send_batch(msgs)
    n = n // 64 * 64
    c = LitePullConsumer("BenchLite", addr, instance_name="bench-lite", consume_from_where="FIRST_OFFSET",
                         auto_commit=False, serialize_type=st, **CLIENT_KW)
    got, lats = 0, []
    async with c:
        c.assign(await c.fetch_message_queues(topic))
        cpu0, t0 = time.process_time(), time.perf_counter()
        while got < n:
            t = time.perf_counter()
            batch = await c.poll(timeout_s=5.0, max_records=min(poll, n - got))
            if not batch:
                break
            await c.commit()
            lats.append(time.perf_counter() - t)
            got += len(batch)
        dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"msgs_per_s": got / dt if dt > 0 else 0.0, "consumed": got,
            "p99_cycle_us": pct(lats, 99) * 1e6 if lats else 0.0,
            "client_cpu_us_per_msg": cpu * 1e6 / got if got else 0.0}


async def bench_e2e(addr, topic, rate, seconds, st):
    lat = []

    async def listener(msg):
        (sent_ns,) = struct.unpack_from(">q", msg.body)
        if len(msg.body) > 8:
            lat.append((time.time_ns() - sent_ns) / 1e6)
    async with Producer("BenchE2EW", addr, instance_name="bench-e2ew", serialize_type=st, **CLIENT_KW) as p:
        await p.send(Message(topic, struct.pack(">q", time.time_ns())))   # creates the topic
    c = PushConsumer("BenchE2E", addr, listener=listener, instance_name="bench-e2e",
                     consume_from_where="LAST_OFFSET", serialize_type=st, **CLIENT_KW)
    c.subscribe(topic)
    n = int(rate * seconds)
    async with c:
        end = time.perf_counter() + 30
        while len([q for q in c.pqs if q.topic == topic]) < 4 and time.perf_counter() < end:
            await asyncio.sleep(0.05)      # the auto-created topic's route shows up after a moment
        await asyncio.sleep(0.5)
        async with Producer("BenchE2EP", addr, instance_name="bench-e2ep", serialize_type=st, **CLIENT_KW) as p:
            interval = 1.0 / rate
            t0 = time.perf_counter()
            pending = set()
            for i in range(n):
                target = t0 + i * interval
                delay = target - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                body = struct.pack(">q", time.time_ns()) + b"x" * 120
                t = asyncio.ensure_future(p.send(Message(topic, body)))
                pending.add(t)
                t.add_done_callback(pending.discard)
                if len(pending) > 256:
                    await asyncio.sleep(0)
            await asyncio.gather(*pending)
            end = time.perf_counter() + 10
            while len(lat) < n and time.perf_counter() < end:
                await asyncio.sleep(0.05)
    return {"rate": rate, "received": len(lat), "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}


def _print_rows(rows_by_kind: dict) -> None:
    """A line per kind: its rows' figures, rows separated by `;`."""
    for kind, rows in rows_by_kind.items():
        print(f"{kind:9}", "; ".join(", ".join(f"{k} {v:,.1f}" for k, v in row.items()) for row in rows),
              flush=True)


async def run_all(addr, args):
    # auto (default): the client negotiates (msgpack with pocketmq brokers, JSON otherwise)
    st = {"auto": None, "json": SerializeType.JSON, "msgpack": SerializeType.MSGPACK}[
        "msgpack" if args.msgpack else args.codec]
    out = {}
    suffix = str(os.getpid())
    phases = args.phases
    if "sync" in phases:
        out["sync_send"] = await bench_sync_send(addr, f"BenchSync{suffix}", args.n_sync, st)
        print("sync send", out["sync_send"], flush=True)
    if "floor" in phases:
        out["request_floor"] = await bench_request_floor(addr, f"BenchFloor{suffix}", args.n_sync, st,
                                                         getattr(args, "broker_pid", None))
        _print_rows(out["request_floor"])
    if "layers" in phases:
        out["send_layers"] = await bench_send_layers(addr, f"BenchLayers{suffix}", args.layer_seconds,
                                                     args.layer_rounds, getattr(args, "broker_pid", None))
        _print_rows(out["send_layers"])
    if "apis" in phases:
        out["api_pairs"] = r = await bench_api_pairs(addr, f"BenchApis{suffix}", args.api_seconds, args.api_rounds,
                                                     floor_port=getattr(args, "floor_port", None))
        for key in ("messages_vs_bodies", "prebuilt_vs_bodies", "inflight_vs_floor"):
            if key in r:
                print(f"{key}: " + " / ".join(f"{x:.2f}" for x in r[key]), flush=True)
    if "inflight" in phases:
        out["inflight_send"] = await bench_inflight_send(addr, f"BenchAsync{suffix}", args.n_async, st,
                                                         coalesce=not args.no_coalesce,
                                                         coalesce_max=args.coalesce_max)
        print("64 in flight", out["inflight_send"], flush=True)
    if "batch" in phases:
        out["batch_send"] = await bench_batch_send(addr, f"BenchBatch{suffix}", args.n_batch, st)
        print("batch send", out["batch_send"], flush=True)
        out["batch_send_bodies"] = await bench_batch_send(addr, f"BenchBatchB{suffix}", args.n_batch, st,
                                                          api="bodies")
        print("batch send of bodies", out["batch_send_bodies"], flush=True)
        out["batch_send_8"] = await bench_batch_send(addr, f"BenchBatch8x{suffix}", args.n_batch, st, inflight=8)
        print("batch send, 8 in flight", out["batch_send_8"], flush=True)
    if "push" in phases:
        out["push_consume"] = await bench_push_consume(addr, f"BenchConsume{suffix}", args.n_consume, st)
        print("push consume", out["push_consume"], flush=True)
    if "lite" in phases:
        out["lite_consume"] = await bench_lite_consume(addr, f"BenchLite{suffix}", args.n_consume, st)
        print("lite consume, poll(32) + commit()", out["lite_consume"], flush=True)
    if "orderly" in phases and not args.no_orderly:
        out["push_consume_8q"] = await bench_push_consume(addr, f"BenchConsume8q{suffix}", args.n_consume, st,
                                                          queues=8)
        print("push consume, 8 queues", out["push_consume_8q"], flush=True)
        out["orderly_consume_8q"] = await bench_push_consume(addr, f"BenchOrderly8q{suffix}", args.n_consume, st,
                                                             orderly=True, queues=8)
        out["orderly_vs_concurrent"] = (out["orderly_consume_8q"]["msgs_per_s"]
                                        / max(out["push_consume_8q"]["msgs_per_s"], 1e-9))
        print("orderly consume, 8 queues", out["orderly_consume_8q"],
              f"ratio vs concurrent {out['orderly_vs_concurrent']:.2f}", flush=True)
    for rate in args.rates if "e2e" in phases else ():
        key = f"e2e_{rate}"
        out[key] = await bench_e2e(addr, f"BenchE2E{rate}x{suffix}", rate, args.seconds, st)
        print("end-to-end", out[key], flush=True)
    return out


PHASES = ("sync", "floor", "layers", "apis", "inflight", "batch", "push", "lite", "orderly", "e2e")

# (name, on the ACL cluster, client options); "signed-noacl": the client signs, the broker
# has no ACL (the signature is ignored): the client's share of a signed send's cost
AB_CONFIGS = (("plain", False, {}), ("tls", False, {"tls": True}),
              ("signed-noacl", False, {"credentials": BENCH_ACCOUNT}),
              ("signed", True, {"credentials": BENCH_ACCOUNT}),
              ("signed+tls", True, {"credentials": BENCH_ACCOUNT, "tls": True}))
# --ab-control: a third cluster configured as the first (no ACL), plaintext: how far two
# identical clusters differ on this host (where the scheduler put their processes), the
# noise floor of every ratio above, which compares configurations on two clusters
AB_CONTROL = ("plain-control", "control", {})


async def run_ab(addrs: dict, args) -> dict:
    """--ab ROUNDS: sync sends and 64 in flight, plaintext vs TLS vs signed (ACL off, on) vs both,
    interleaved round by round on two clusters that run at once (tlsServerMode=permissive:
    one port serves both; the second with aclEnable), so every configuration sees the same
    host state; each configuration's figure is compared with plaintext's of the same round."""
    st = {"auto": None, "json": SerializeType.JSON, "msgpack": SerializeType.MSGPACK}[args.codec]
    configs = AB_CONFIGS + ((AB_CONTROL,) if "control" in addrs else ())
    rows: dict = {name: {"sync": [], "inflight": []} for name, _, _ in configs}
    suffix = str(os.getpid())
    for r in range(args.ab):
        for name, acl, kw in configs:
            CLIENT_KW.clear()
            CLIENT_KW.update(kw)
            tag = name.replace("+", "").replace("-", "")
            rows[name]["sync"].append(await bench_sync_send(addrs[acl], f"BenchSync{tag}{suffix}", args.n_sync, st))
            rows[name]["inflight"].append(await bench_inflight_send(addrs[acl], f"BenchAsync{tag}{suffix}",
                                                                    args.n_async, st))
        last = {name: (rows[name]["sync"][-1]["msgs_per_s"], rows[name]["inflight"][-1]["msgs_per_s"])
                for name, _, _ in configs}
        print(f"round {r + 1}: " + "; ".join(f"{name} sync {a:,.0f}/s 64 {b:,.0f}/s" for name, (a, b) in last.items()),
              flush=True)
    CLIENT_KW.clear()
    out = {}
    for name, _, _ in configs:
        for phase in ("sync", "inflight"):
            runs = rows[name][phase]
            ratios = [a["msgs_per_s"] / b["msgs_per_s"] for a, b in zip(runs, rows["plain"][phase])]
            cpu_ratios = [a["client_cpu_us_per_msg"] / b["client_cpu_us_per_msg"]
                          for a, b in zip(runs, rows["plain"][phase])]
            out[f"{name}_{phase}"] = summary = {
                "msgs_per_s_median": pct([x["msgs_per_s"] for x in runs], 50),
                "p50_us_median": pct([x["p50_us"] for x in runs], 50),
                "p99_us_median": pct([x["p99_us"] for x in runs], 50),
                "client_cpu_us_per_msg_median": pct([x["client_cpu_us_per_msg"] for x in runs], 50),
                "vs_plain_rate_median": pct(ratios, 50), "vs_plain_rate_range": [min(ratios), max(ratios)],
                "vs_plain_client_cpu_median": pct(cpu_ratios, 50)}
            print(f"{name:10} {phase:8}", ", ".join(f"{k} {v:,.2f}" if isinstance(v, float) else f"{k} {v}"
                                                   for k, v in summary.items()), flush=True)
    return out


def pin(mode: str, daemon_pids: list[int]) -> None:
    """Place the daemons and this process on CPUs (the harness's --pin): affinity is set
    on the daemons' main PIDs, and threads they start later inherit it."""
    if mode == "none":
        return
    cpus = sorted(os.sched_getaffinity(0))
    if mode == "same" or len(cpus) < 2:
        servers, client = {cpus[0]}, {cpus[0]}
    else:
        servers, client = {cpus[-1]}, set(cpus[:-1])
    for pid in daemon_pids:
        for tid in os.listdir(f"/proc/{pid}/task"):      # threads already running too
            os.sched_setaffinity(int(tid), servers)
    os.sched_setaffinity(0, client)
    print(f"pinned: daemons on CPUs {sorted(servers)}, client on {sorted(client)}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namesrv", help="use a running cluster")
    ap.add_argument("--fake", action="store_true", help="in-process FakeCluster")
    ap.add_argument("--codec", choices=["auto", "json", "msgpack"], default="auto",
                    help="request header codec; auto = negotiated per broker (the client's default)")
    ap.add_argument("--msgpack", action="store_true", help="same as --codec msgpack")
    ap.add_argument("--no-coalesce", action="store_true",
                    help="64 in flight with coalesce_sends=False (one request per send)")
    ap.add_argument("--coalesce-max", type=int, default=None, metavar="N",
                    help="64 in flight: the producer's coalesce_max_messages (default: the producer's)")
    ap.add_argument("--n-sync", type=int, default=20000)
    ap.add_argument("--n-async", type=int, default=50000)
    ap.add_argument("--n-batch", type=int, default=200000)
    ap.add_argument("--n-consume", type=int, default=100000)
    ap.add_argument("--layer-seconds", type=float, default=2.0, help="layers: seconds per row and round")
    ap.add_argument("--layer-rounds", type=int, default=3, help="layers: interleaved rounds")
    ap.add_argument("--api-seconds", type=float, default=2.0, help="apis: seconds per row and round")
    ap.add_argument("--api-rounds", type=int, default=3, help="apis: interleaved rounds")
    ap.add_argument("--pyserver", default=PYSERVER,
                    help="apis: the harness's pyserver.py, started as the py-store floor ('' = no floor row)")
    ap.add_argument("--rates", type=int, nargs="*", default=[1000, 10000])
    ap.add_argument("--no-orderly", action="store_true",
                    help="skip the 8-queue concurrent vs orderly consumption phases")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help=f"comma-separated subset of {','.join(PHASES)} (default: all)")
    ap.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                    help="extra mqbroker flag for the cluster this starts, e.g. --broker-arg=--flushDiskType=SYNC_FLUSH "
                         "(repeatable)")
    ap.add_argument("--tls", action="store_true",
                    help="every client over TLS; the cluster this starts runs tlsServerMode=enforcing")
    ap.add_argument("--credentials", action="store_true",
                    help="every request signed (plain ACL); the cluster this starts runs aclEnable=true")
    ap.add_argument("--ab-control", action="store_true",
                    help="with --ab: a third cluster like the first (no ACL) and the configuration plain-control")
    ap.add_argument("--ab", type=int, default=0, metavar="ROUNDS",
                    help="plaintext / TLS / signed / signed+TLS sync and 64-in-flight sends, interleaved "
                         "ROUNDS times on two clusters this starts (docs/benchmarks.md)")
    ap.add_argument("--pin", choices=["none", "same", "split"], default="none",
                    help="CPU placement of the cluster this starts (as ../shared/bench/peers.py): same = "
                         "daemons and this client on CPU 0; split = daemons on the last CPU, the client on "
                         "the others")
    args = ap.parse_args(argv)
    args.phases = set(args.phases.split(","))
    if args.phases - set(PHASES):
        ap.error(f"unknown phases {sorted(args.phases - set(PHASES))}; known: {','.join(PHASES)}")
    if (args.broker_arg or args.pin != "none") and (args.fake or args.namesrv):
        ap.error("--broker-arg and --pin apply to the cluster this starts (not with --fake or --namesrv)")
    if args.fake and (args.tls or args.credentials or args.ab):
        ap.error("--tls, --credentials and --ab need a real cluster (not --fake)")
    if args.ab and (args.namesrv or args.tls or args.credentials):
        ap.error("--ab starts its own two clusters and runs every configuration (no --namesrv, --tls, --credentials)")
    if args.fake:
        args.no_orderly = True     # the fake cluster has no admin topic creation nor queue locks
    CLIENT_KW.clear()
    if args.tls:
        CLIENT_KW["tls"] = True
    if args.credentials:
        CLIENT_KW["credentials"] = BENCH_ACCOUNT
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    # The host's speed drifts (shared VM): a bare loopback round trip before and after the
    # run says what state it was in; read the figures against it.
    from bench.bench_broker import loopback_echo_rtt_us
    before = loopback_echo_rtt_us()
    print(f"calibration before: loopback_echo_rtt_us={before:.1f}", flush=True)
    if args.ab:
        from tests.support.daemons import Cluster
        roots, clusters = [], []
        try:
            keys = (False, True) + (("control",) if args.ab_control else ())
            for key in keys:
                root = tempfile.mkdtemp(prefix="bench-client-ab-")
                roots.append(root)
                ns_args, broker_args = tls_and_acl_args(root, "permissive", key is True)
                c = Cluster(root, args.broker_arg + broker_args)
                c.namesrv.args += ns_args
                clusters.append(c.start())
            pin(args.pin, [p for c in clusters for p in (c.namesrv.proc.pid, c.broker.proc.pid)])
            result = asyncio.run(run_ab({key: c.namesrv_addr for key, c in zip(keys, clusters)}, args))
        finally:
            for c in clusters:
                c.stop()
            for root in roots:
                shutil.rmtree(root, ignore_errors=True)
    elif args.fake:
        from tests.support.fake_broker import FakeCluster

        async def fake():
            async with FakeCluster() as cluster:
                return await run_all(cluster.namesrv_addr, args)
        result = asyncio.run(fake())
    elif args.namesrv:
        result = asyncio.run(run_all(args.namesrv, args))
    else:
        from tests.support.daemons import Cluster
        root = tempfile.mkdtemp(prefix="bench-client-")
        ns_args, broker_args = tls_and_acl_args(root, "enforcing" if args.tls else None, args.credentials)
        cluster = Cluster(root, args.broker_arg + broker_args)
        cluster.namesrv.args += ns_args
        cluster.start()
        floor = None
        try:
            pids = [cluster.namesrv.proc.pid, cluster.broker.proc.pid]
            if "apis" in args.phases and args.pyserver:
                floor, args.floor_port = start_pyserver_store(root, args.pyserver)
                pids.append(floor.pid)
            pin(args.pin, pids)
            args.broker_pid = cluster.broker.proc.pid
            result = asyncio.run(run_all(cluster.namesrv_addr, args))
        finally:
            if floor is not None:
                floor.stdin.close()         # pyserver.py exits when its stdin closes
                try:
                    floor.wait(10)
                except Exception:
                    floor.kill()
            cluster.stop()
            shutil.rmtree(root, ignore_errors=True)
    after = loopback_echo_rtt_us()
    print(f"calibration after: loopback_echo_rtt_us={after:.1f}", flush=True)
    result["calibration_rtt_us"] = {"before": before, "after": after}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
