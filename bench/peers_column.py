"""pocketmq as a column of ../shared/bench/peers.py (pass: --extra bench/peers_column.py).

The harness starts each broker with ctx.spawn (so it stops them by PID and counts
their CPU through self.pids) and drives it with that broker's own Python client.
pocketmq is driven the way a user would, through the public client API only:

  send sync / window 64   Producer.send(Message(topic, body)); the 64 concurrent sends
                          of the window coalesce into SEND_BATCH requests (the
                          producer's default, coalesce_sends=True)
  send batch 64           Producer.send_batch(bodies, topic=topic): the 64 bodies the
                          harness passes, sent as one SEND_BATCH without a Message per
                          body (the API a user with a list of payloads calls; a list of
                          Messages costs the caller ~2 µs per Message() more, recorded in
                          docs/benchmarks.md, "Batch path (clientbatch)")
  consume 32+ack          LitePullConsumer assigned the topic's one queue:
                          poll(max_records=32) then commit() (one round trip: the
                          commit; pulls run in the background, 32 per request)
  push consume (section)  PushConsumer with a no-op listener over a pre-filled
                          topic, recorded in the same columns (client and broker
                          CPU per message from /proc, "other" CPU)

Columns (each a Target; pick with --only / --skip):
  pocketmq             ASYNC_FLUSH, the broker's default busy polling
  pocketmq-nobusy      the same with busy polling off on both sides
                       (busyPollMicros=0 on the broker, busy_poll_us=0 in the client):
                       busy polling's CPU, shown against "pocketmq"
  pocketmq-syncflush   flushDiskType=SYNC_FLUSH (fsync before the ack, group commit)
  pocketmq-noindex     messageIndexEnable=false (what the message index costs: it is built
                       behind the dispatcher, on the broker's one interpreter)
  pocketmq-nowarm      commitLogWarmAheadBytes=0 (what reading the commit log's pages
                       into the page cache ahead of the writer buys: broker/services/warm.py)
  redis-always         Redis Streams with appendfsync always (the fsync peer of
                       pocketmq-syncflush)

Every topic has one queue (the broker runs with defaultTopicQueueNums=1), like the
one stream / one subject of the peers. Needs pocketmq installed in the harness's
venv (bench/README.md). The harness prints no calibration of its own: this file
adds a "pocketmq calibration" section (the bare loopback ping-pong round trip of
bench/bench_broker.py) so runs on a drifting host can be compared.
"""
import asyncio
import os
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))


def make_targets(api):
    from pocketmq.client import LitePullConsumer, Message, Producer, PushConsumer

    def _version():
        try:
            from importlib.metadata import version
            return version("pocketmq")
        except Exception:
            return "?"

    class PocketMQ(api.Target):
        """One nameserver + one broker process; producer and consumers of pocketmq.client."""

        def __init__(self, name="pocketmq", broker_args=(), client_busy_poll_us=None, settings=""):
            super().__init__()
            self.name = name
            self.broker_args = list(broker_args)
            self.client_busy_poll_us = client_busy_poll_us
            self.version = "pocketmq %s (Python %s)" % (_version(), sys.version.split()[0])
            self.settings = ("mqnamesrv + mqbroker, one queue per topic, 128 MiB CommitLog "
                             "segments; client: Producer.send / send_batch (64 in flight "
                             "coalesce into SEND_BATCH), LitePullConsumer poll(32)+commit() "
                             "on an assigned queue" + (settings and "; " + settings))
            self._seq = 0

        def _instance_name(self, role):
            return f"pb-{self.name}-{role}-{os.getpid()}"

        async def start(self, ctx):
            self.ctx = ctx
            root = os.path.join(ctx.data_dir, self.name)
            os.makedirs(root, exist_ok=True)
            self.ns_port, self.broker_port = api.free_port(), api.free_port()
            self.namesrv = f"127.0.0.1:{self.ns_port}"
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            ns = ctx.spawn(self.name + "-namesrv",
                           [sys.executable, "-m", "pocketmq.nameserver", f"--listenPort={self.ns_port}",
                            f"--kvConfigPath={root}/namesrv/kvConfig.json"], env=env)
            self.pids = [ns.pid]
            await api.wait_tcp(self.ns_port, 30, "mqnamesrv")
            br = ctx.spawn(self.name + "-broker",
                           [sys.executable, "-m", "pocketmq.broker", "-n", self.namesrv,
                            f"--listenPort={self.broker_port}", "--brokerIP1=127.0.0.1",
                            f"--storePathRootDir={root}/store", "--mappedFileSizeCommitLog=134217728",
                            "--defaultTopicQueueNums=1"] + self.broker_args, env=env)
            self.pids.append(br.pid)
            await api.wait_tcp(self.broker_port, 60, "mqbroker")

        def _producer(self, role):
            return Producer(f"PbProducer{role}", self.namesrv, instance_name=self._instance_name(role))

        async def connect(self):
            self._set_client_busy_poll()
            self.topic = f"PbSend{os.getpid()}"
            self.p = await self._producer("send").start()

            async def first_send():     # the broker registers with the nameserver after it listens
                return await self.p.send(Message(self.topic, b"warm-up"))
            await api.wait_until(first_send, 30, "pocketmq first send")
            self.consumer = None

        def _set_client_busy_poll(self):
            # The client's busy polling is a ClientInstance setting (DEFAULT_BUSY_POLL_US);
            # the public constructors take the default, so the no-busy column sets it here.
            # Restored in close(): the columns share this process.
            from pocketmq.client import instance
            self._saved_busy_poll_us = instance.DEFAULT_BUSY_POLL_US
            if self.client_busy_poll_us is not None:
                instance.DEFAULT_BUSY_POLL_US = self.client_busy_poll_us

        async def close(self):
            from pocketmq.client import instance
            try:
                if self.consumer is not None:
                    await self.consumer.close()
                await self.p.close()
            finally:
                instance.DEFAULT_BUSY_POLL_US = self._saved_busy_poll_us

        async def send_one(self, body):
            await self.p.send(Message(self.topic, body))

        async def send_batch(self, bodies):
            await self.p.send_batch(bodies, topic=self.topic)

        async def consume_prepare(self, body, n_max, seconds):
            self._seq += 1
            topic = f"PbConsume{os.getpid()}x{self._seq}"
            n = 0
            end = time.perf_counter() + seconds
            msgs = [Message(topic, body) for _ in range(api.BATCH)]
            while n < n_max and time.perf_counter() < end:
                await self.p.send_batch(msgs)
                n += api.BATCH
            self.consumer = LitePullConsumer(f"PbLite{os.getpid()}x{self._seq}", self.namesrv,
                                             instance_name=self._instance_name("lite"),
                                             consume_from_where="FIRST_OFFSET",
                                             auto_commit=False)
            await self.consumer.start()
            queues = await self.consumer.fetch_message_queues(topic)
            self.consumer.assign(queues)
            return n

        async def consume_batch(self, n):
            msgs = await self.consumer.poll(timeout_s=1.0, max_records=n)
            if msgs:
                await self.consumer.commit()
            return len(msgs)

        async def after_consume(self):
            await self.consumer.close()
            self.consumer = None

        async def extra_sections(self, ctx):
            rows = []
            for size in api.SIZES:
                r = await self._push_consume(size, 100_000 if size <= 256 else 60_000,
                                             max(3 * ctx.seconds, 10))
                rows.append([f"push consume, no-op listener, {size} B", f"{r['rate']:,.0f}",
                             f"{r['srv_us_msg']:.1f} ({r['srv_cpu_pct']:.0f}%)",
                             f"{r['cli_us_msg']:.1f}", f"{r['other_pct']:.0f}%", r.get("note", "")])
            out = [(f"{self.name}: push consumer (PushConsumer, no-op listener, one queue)",
                    ["scenario", "msgs/s", "server CPU µs/msg (% of a core)", "client CPU µs/msg",
                     "other CPU", "note"], rows)]
            if self.name == "pocketmq":
                rtt = await asyncio.get_running_loop().run_in_executor(None, _calibration_rtt_us)
                out.append(("pocketmq calibration (bench/bench_broker.py loopback_echo_rtt_us: "
                            "a bare 100-byte ping-pong between two processes)",
                            ["when", "loopback_echo_rtt_us"], [["after the pocketmq column", f"{rtt:.1f}"]]))
            return out

        async def _push_consume(self, size, n_max, limit_s):
            self._seq += 1
            topic = f"PbPush{os.getpid()}x{self._seq}"
            body = api.make_body(size)
            msgs = [Message(topic, body) for _ in range(api.BATCH)]
            filled = 0
            end = time.perf_counter() + 2.0
            while filled < n_max and time.perf_counter() < end:
                await self.p.send_batch(msgs)
                filled += api.BATCH
            got = 0
            done = asyncio.Event()

            async def listener(msg):
                nonlocal got
                got += 1
                if got >= filled:
                    done.set()
            await api.quiet(self.ctx)
            c = PushConsumer(f"PbPush{os.getpid()}x{self._seq}", self.namesrv, listener=listener,
                             instance_name=self._instance_name("push"),
                             consume_from_where="FIRST_OFFSET")
            c.subscribe(topic, "*")
            s0, c0, b0, t0 = api.tree_cpu(self.pids), time.process_time(), api.sys_busy(), time.perf_counter()
            await c.start()
            note = ""
            try:
                await asyncio.wait_for(done.wait(), limit_s)
            except TimeoutError:
                note = f"consumed {got}/{filled}"
            dt = time.perf_counter() - t0
            srv, cli = api.tree_cpu(self.pids) - s0, time.process_time() - c0
            other = max(0.0, api.sys_busy() - b0 - srv - cli)
            await c.close()
            return {"rate": got / dt, "srv_us_msg": 1e6 * srv / max(got, 1), "srv_cpu_pct": 100 * srv / dt,
                    "cli_us_msg": 1e6 * cli / max(got, 1), "other_pct": 100 * other / dt, "note": note}

    class RedisAlways(api.RedisTarget):
        """Redis Streams with appendfsync always: the fsync-before-ack peer of SYNC_FLUSH."""
        name = "redis-always"

        async def start(self, ctx):
            real_spawn = ctx.spawn

            def spawn(name, argv, **kw):
                argv = list(argv)
                i = argv.index("--appendfsync")
                argv[i + 1] = "always"
                return real_spawn(name + "-always", argv, **kw)
            ctx.spawn = spawn
            try:
                await super().start(ctx)
            finally:
                ctx.spawn = real_spawn
            self.settings = self.settings.replace("appendfsync everysec", "appendfsync always")

        async def extra_sections(self, ctx):
            return []

    return [
        PocketMQ(),
        PocketMQ("pocketmq-nobusy", ["--busyPollMicros=0"], client_busy_poll_us=0,
                 settings="busy polling off (broker busyPollMicros=0, client 0)"),
        PocketMQ("pocketmq-syncflush", ["--flushDiskType=SYNC_FLUSH"],
                 settings="flushDiskType=SYNC_FLUSH (fsync before the ack)"),
        PocketMQ("pocketmq-noindex", ["--messageIndexEnable=false"],
                 settings="message index off (messageIndexEnable=false: no QUERY_MESSAGE by key)"),
        PocketMQ("pocketmq-nowarm", ["--commitLogWarmAheadBytes=0"],
                 settings="commit-log page warming off (commitLogWarmAheadBytes=0)"),
        RedisAlways(),
    ]


def _calibration_rtt_us():
    """bench/bench_broker.py's calibration, loaded from this checkout (bench/ is not installed)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("pocketmq_bench_broker",
                                                  os.path.join(BENCH_DIR, "bench_broker.py"))
    mod = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = saved
    return mod.loopback_echo_rtt_us()


if __name__ == "__main__":
    sys.exit("not a script: pass it to the harness, "
             "peers.py --extra bench/peers_column.py (see bench/README.md)")
