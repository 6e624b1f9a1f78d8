"""Master/slave groups as processes for the interop tests of replication, and the dead-master
scenario a real client's push consumer is put through (tests/interop/test_cpp_replication.py,
test_ons_replication.py).

`Brokers`: one nameserver and any brokers (masters, slaves) as real processes on free
loopback ports, each with its own store; a broker can be SIGKILLed, started again on its
store, and SIGSTOPped.

The producer tests' brokers (fixtures `brokers`, `no_slave`, `stalled_slave`; `stored` counts
the copies by pulling each queue from each master's address): broker-a a SYNC_MASTER whose
slave is started (and SIGSTOPped) only by `stalled_slave`, broker-b an ASYNC_MASTER, broker-c
a SYNC_MASTER without a slave, and topics on one or two of them.

`dead_master_run(root, client)`: a SYNC_MASTER broker-a with its slave, a topic of 4 queues,
one push consumer of the client under test (`CppClient`, `OnsClient`). The consumer is made
to stop pulling with a backlog on the broker: its message handler waits on a gate file, so
each queue caches what the consumer pulled until it exceeds the client's per-queue limit
(set small), and then the client pulls no more (flow control). Only then is the backlog sent
(acknowledged SEND_OK by the SYNC_MASTER: on the slave too), so no copy of it can be in the
consumer before the kill: everything of it the consumer delivers after the kill was pulled
from the slave. Then: SIGKILL the master and open the gate; wait for every message; wait until
the slave holds the consumer's offsets for all of it (the client commits them there while the
master is away); restart the master on its store (it takes the slave's newer offsets back
before it serves); read its offsets; stop the consumer and start a fresh one in the same group
(it reads its offsets from the master) and send one fence message per queue: it must receive
the fences and nothing else.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest
from pocketmq.client import Message, MessageQueue, Producer
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.bodies import TopicConfig
from pocketmq.protocol.codes import ResponseCode as C
from pocketmq.protocol.message import decode_records
from pocketmq.remoting.client import RemotingClient

from tests.integration.test_broker import pull_cmd, send_cmd
from tests.interop.test_cpp_features import stop_agents
from tests.support.daemons import READY_BROKER, READY_NS, Daemon, free_port
from tests.support.events import Sink, pump_json_lines

HERE = os.path.dirname(os.path.abspath(__file__))
CPP_AGENT = os.path.join(HERE, "cpp_agent.py")
ONS_AGENT = os.path.join(HERE, "node", "ons_agent.js")


# -- processes ---------------------------------------------------------------------------------

class Brokers:
    """A nameserver and brokers as processes. `add` declares a broker (`key` names it here);
    `start` (again after `kill`: the same store and ports), `kill` (SIGKILL), `pause` (SIGSTOP:
    its sockets stay open, nothing is read or answered)."""

    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.ns_port = free_port()
        self.ns = Daemon("mqnamesrv", [f"--listenPort={self.ns_port}", f"--kvConfigPath={root}/kv.json"],
                         READY_NS, os.path.join(root, "namesrv.log"))
        self.args: dict[str, list[str]] = {}
        self.ports: dict[str, tuple[int, int]] = {}
        self.daemons: dict[str, Daemon] = {}
        self.starts = collections.Counter()

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.ns_port}"

    def addr(self, key: str) -> str:
        return f"127.0.0.1:{self.ports[key][0]}"

    def ha_addr(self, key: str) -> str:
        return f"127.0.0.1:{self.ports[key][1]}"

    def add(self, key: str, name: str, role: str, *extra: str, slave_of: str | None = None) -> None:
        port, ha = free_port(), free_port()
        self.ports[key] = (port, ha)
        args = ["-n", self.namesrv_addr, "--brokerIP1=127.0.0.1", f"--brokerName={name}",
                f"--storePathRootDir={self.root}/store-{key}", f"--listenPort={port}", f"--haListenPort={ha}",
                f"--brokerRole={role}", "--registerNameServerPeriod=1000", "--defaultTopicQueueNums=4",
                "--mappedFileSizeCommitLog=4194304"]
        if slave_of is not None:
            args += ["--brokerId=1", f"--haMasterAddress={self.ha_addr(slave_of)}"]
        self.args[key] = args + list(extra)

    def start_ns(self) -> None:
        self.ns.start()

    def start(self, key: str) -> None:
        self.starts[key] += 1
        d = Daemon("mqbroker", self.args[key], READY_BROKER, os.path.join(self.root, f"{key}-{self.starts[key]}.log"))
        d.start(30)
        self.daemons[key] = d

    def kill(self, key: str) -> None:
        self.daemons[key].kill()

    def pause(self, key: str) -> None:
        self.daemons[key].proc.send_signal(signal.SIGSTOP)

    def logs(self) -> list[str]:
        return sorted(os.path.join(self.root, n) for n in os.listdir(self.root) if n.endswith(".log"))

    def stop(self) -> None:
        for d in list(self.daemons.values()):
            if d.proc is not None and d.proc.poll() is None:
                d.proc.send_signal(signal.SIGCONT)       # a paused broker cannot handle SIGTERM
            try:
                d.stop()
            except Exception:
                d.kill()
        try:
            self.ns.stop()
        except Exception:
            self.ns.kill()


async def create_topic_on(ns_addr: str, broker_addrs: list[str], topic: str, queues: int) -> None:
    """Create `topic` on each broker, then wait until the nameserver's route lists them all."""
    inst = ClientInstance(f"127.0.0.1@create-{topic}", ns_addr)
    try:
        for addr in broker_addrs:
            await inst.api.create_topic(addr, TopicConfig(topic, queues, queues), "TBW102")
        for _ in range(400):
            route = await inst.api.get_route(topic)
            if route is not None and len(route.queue_datas) == len(broker_addrs):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the route of {topic} never listed {len(broker_addrs)} brokers")
    finally:
        await inst.close()


async def wait_slave_knows(slave_addr: str, topic: str, timeout_s: float = 30) -> float:
    """Until the slave serves pulls of `topic` (its metadata sync copied it from the master:
    before that it answers TOPIC_NOT_EXIST). Returns the seconds waited."""
    c = RemotingClient()
    t0 = time.monotonic()
    try:
        while True:
            r = await c.invoke(slave_addr, pull_cmd(topic, 0, 0, group="ReplicaProbeG"))
            if r.code != C.TOPIC_NOT_EXIST:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise AssertionError(f"the slave {slave_addr} never learned the topic {topic} from its master "
                                     f"in {timeout_s} s (metadata sync)")
            await asyncio.sleep(0.2)
    finally:
        await c.close()


def msgs(events) -> list[dict]:
    return [e for e in events if e["event"] == "msg"]


def bodies(events) -> list[str]:
    return [m["body"] for m in msgs(events)]


# -- SYNC_MASTER's 11 and 12: the brokers of the producer tests ---------------------------------

SLAVE_TIMEOUT_MS = 400
ONE, TWO, BOTH, PROBE = "SyncOne", "SyncTwo", "SyncBoth", "SyncProbe"


@pytest.fixture(scope="module", name="brokers")
def brokers_fixture(tmp_path_factory):
    """broker-a: SYNC_MASTER (its slave `as` declared, started by `stalled_slave`); broker-b: an
    ASYNC_MASTER; broker-c: a SYNC_MASTER that never has a slave. ONE is on broker-a alone, TWO
    on broker-a and broker-b, BOTH on broker-a and broker-c."""
    b = Brokers(str(tmp_path_factory.mktemp("sync-master")))
    b.add("a", "broker-a", "SYNC_MASTER", f"--slaveTimeout={SLAVE_TIMEOUT_MS}")
    b.add("b", "broker-b", "ASYNC_MASTER")
    b.add("c", "broker-c", "SYNC_MASTER")
    b.add("as", "broker-a", "SLAVE", slave_of="a")
    try:
        b.start_ns()
        for key in ("a", "b", "c"):
            b.start(key)

        async def topics():
            await create_topic_on(b.namesrv_addr, [b.addr("a")], ONE, 4)
            await create_topic_on(b.namesrv_addr, [b.addr("a")], PROBE, 1)
            await create_topic_on(b.namesrv_addr, [b.addr("a"), b.addr("b")], TWO, 4)
            await create_topic_on(b.namesrv_addr, [b.addr("a"), b.addr("c")], BOTH, 4)
        asyncio.run(topics())
        yield b
    finally:
        b.stop()


async def broker_a_answers(brokers, code: int, timeout_s: float = 20) -> None:
    """Until a send to broker-a (PROBE) is answered `code`: SUCCESS once a slave is connected and
    acks, SLAVE_NOT_AVAILABLE once none is."""
    c = RemotingClient()
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    try:
        while (r := await c.invoke(brokers.addr("a"), send_cmd(PROBE, b"probe"))).code != code:
            assert loop.time() < end, f"broker-a still answers {r.code} ({r.remark}), not {code}"
            await asyncio.sleep(0.1)
    finally:
        await c.close()


@pytest.fixture(name="no_slave")
async def no_slave_fixture(brokers):
    await broker_a_answers(brokers, C.SLAVE_NOT_AVAILABLE)


@pytest.fixture(name="stalled_slave")
async def stalled_slave_fixture(brokers):
    """broker-a's slave connected and acking, then SIGSTOPped: its connection stays open,
    nothing is acknowledged. Killed afterwards (broker-a then has no slave again)."""
    await asyncio.to_thread(brokers.start, "as")
    try:
        await broker_a_answers(brokers, C.SUCCESS)
        brokers.pause("as")
        yield
    finally:
        await asyncio.to_thread(brokers.kill, "as")
    await broker_a_answers(brokers, C.SLAVE_NOT_AVAILABLE)


async def stored(brokers, topic: str) -> dict[str, list[tuple[str, int]]]:
    """body -> [(broker name, queue id)] of every copy of `topic` on its masters (pulled queue by
    queue from each master's address: no client routing involved)."""
    keys = {ONE: ["a"], TWO: ["a", "b"], BOTH: ["a", "c"]}[topic]
    out = collections.defaultdict(list)
    c = RemotingClient()
    try:
        for k in keys:
            for q in range(4):
                offset = 0
                while True:
                    r = await c.invoke(brokers.addr(k), pull_cmd(topic, q, offset, group="SyncCount"))
                    if r.code != C.SUCCESS:
                        assert r.code == C.PULL_NOT_FOUND, (r.code, r.remark)
                        break
                    for m in decode_records(r.body):
                        out[m.body.decode()].append((f"broker-{k}", q))
                    offset = int(r.ext_fields["nextBeginOffset"])
    finally:
        await c.close()
    return out


def counts(copies: dict, prefix: str) -> dict[str, int]:
    return {b: len(v) for b, v in copies.items() if b.startswith(prefix + "-")}


def where(copies: dict, prefix: str) -> dict[str, list[str]]:
    return {b: sorted(name for name, _ in v) for b, v in copies.items() if b.startswith(prefix + "-")}


# -- the clients -------------------------------------------------------------------------------

CACHE = 10          # messages a queue may cache before the consumer stops pulling it
FILL = 50           # per queue: more than CACHE plus one pull's batch (32)
BACKLOG = 5         # per queue, sent once the consumer pulls no more


class CppClient:
    """The Apache C++ client (rocketmq==0.4.4 wheel) through cpp_agent.py. Its route refresh:
    3 s after its start, then every 30 s (fixed in C++ 1.2.x)."""

    name = "cpp"

    def __init__(self, home: str):
        self.home = home

    def start(self, ns: str, group: str, topic: str, stop: str, gate: str = "") -> subprocess.Popen:
        args = [sys.executable, CPP_AGENT, "push", "--ns", ns, "--group", group, "--topic", topic,
                "--stop-file", stop, "--seconds", "240", "--log-level", "fatal"]
        if gate:
            args += ["--gate-file", gate, "--max-cache", str(CACHE)]
        env = dict(os.environ, HOME=self.home, PYTHONUNBUFFERED="1")
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)

    async def pulls_no_more(self, inst: ClientInstance, master: str, group: str, topic: str, events) -> bool:
        """Every queue caches more than CACHE messages (the client's own ConsumerRunningInfo, relayed
        by the master): it pulls none of them again while the gate holds its consume threads."""
        ids = await inst.api.consumer_id_list(master, group)
        if len(ids) != 1:
            return False
        info = await inst.api.consumer_running_info(master, group, ids[0])
        cached = {mq.queue_id: int(v.get("cachedMsgCount", 0)) for mq, v in info["mqTable"].items()
                  if mq.topic == topic}
        return len(cached) == QUEUES and all(n > CACHE for n in cached.values())

    def settled(self, events) -> bool:
        """Nothing to wait for before the kill."""
        return True


class OnsClient:
    """ali-ons (npm) through node/ons_agent.js. Its route refresh: every `poll_ms`
    (pollNameServerInteval, default 30 s) from its start; `rebalance_ms` (rebalanceInterval,
    10 s) and `persist_ms` (persistConsumerOffsetInterval, 5 s) as given."""

    name = "ons"

    def __init__(self, node_dir: str, poll_ms: int, rebalance_ms: int = 10_000, persist_ms: int = 5_000):
        self.node_dir = node_dir
        self.poll_ms = poll_ms
        self.rebalance_ms = rebalance_ms
        self.persist_ms = persist_ms

    def start(self, ns: str, group: str, topic: str, stop: str, gate: str = "") -> subprocess.Popen:
        args = ["node", ONS_AGENT, "push", "--ns", ns, "--group", group, "--topic", topic, "--stop-file", stop,
                "--seconds", "240", "--poll-ns-ms", str(self.poll_ms), "--rebalance-ms", str(self.rebalance_ms),
                "--persist-ms", str(self.persist_ms)]
        if gate:
            args += ["--gate-file", gate, "--pull-threshold", str(CACHE)]
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                cwd=self.node_dir)

    def settled(self, events) -> bool:
        """As a long-running consumer: it has taken its %RETRY% queue (found at a route refresh once
        the broker created the retry topic for the group) and committed it at least once."""
        return any(e["event"] == "offset_commit" and e["topic"].startswith("%RETRY%") for e in events)

    async def pulls_no_more(self, inst, master, group, topic, events) -> bool:
        """Each queue holds more than CACHE unconsumed messages (the pulls' own counts): ali-ons
        checks that before each pull and then waits instead (pullThresholdForQueue)."""
        found = collections.Counter()
        for e in events:
            if e["event"] == "pulled":
                found[e["queue_id"]] += e["found"]
        consumed = collections.Counter(m["queue_id"] for m in msgs(events))
        return all(found[q] - consumed[q] > CACHE for q in range(QUEUES))


# -- the dead-master scenario ------------------------------------------------------------------

TOPIC = "ReplFailoverT"
QUEUES = 4


@dataclass
class DeadMasterRun:
    client: str
    t_started: float = 0.0            # the consumer's "started" event (wall clock)
    t_kill: float = 0.0
    events: list = field(default_factory=list)        # the first consumer's
    fresh_events: list = field(default_factory=list)  # the fresh consumer's, after the restart
    maxes: list = field(default_factory=list)         # each queue's max offset at the kill
    slave_offsets_at: float = 0.0                     # seconds after the kill
    master_offsets: list = field(default_factory=list)   # the restarted master's, before any client
    backlog: set = field(default_factory=set)
    sent_before_kill: set = field(default_factory=set)
    slave_addr: str = ""
    logs: list = field(default_factory=list)

    def first_backlog_after_kill(self) -> float:
        return min(m["t"] for m in msgs(self.events) if m["body"] in self.backlog) - self.t_kill

    def per_queue_after_kill(self) -> dict[int, float]:
        out = {}
        for m in msgs(self.events):
            if m["body"] in self.backlog:
                q = m["queue_id"]
                out[q] = min(out.get(q, 1e9), m["t"] - self.t_kill)
        return out

    def duplicates(self, fresh: bool = True) -> dict[str, int]:
        """Bodies delivered more than once: by the first consumer, and with `fresh` counting the
        fresh consumer's deliveries after the restart too."""
        c = collections.Counter(bodies(self.events) + (bodies(self.fresh_events) if fresh else []))
        return {b: n for b, n in c.items() if n > 1}


async def _send_per_queue(producer: Producer, prefix: str, n: int, ok=("SEND_OK",)) -> set[str]:
    out = set()
    for q in range(QUEUES):
        batch = [f"{prefix}-{q}-{i}" for i in range(n)]
        rs = await producer.send_batch([Message(TOPIC, b.encode()) for b in batch],
                                       queue=MessageQueue(TOPIC, "broker-a", q))
        assert all(r.status.name in ok for r in rs), rs
        out.update(batch)
    return out


async def _stop(proc: subprocess.Popen, stop: str) -> None:
    """Stop the agent through its stop file (removed again for the next one)."""
    try:
        await stop_agents([proc], stop)
    finally:
        os.unlink(stop)


async def dead_master_run(root: str, client, *, deliver_within_s: float, settle_within_s: float = 30) -> DeadMasterRun:
    run = DeadMasterRun(client.name)
    b = Brokers(root)
    b.add("m", "broker-a", "SYNC_MASTER")
    b.add("s", "broker-a", "SLAVE", slave_of="m")
    group = f"ReplFailover{client.name.capitalize()}G"
    gate, stop = os.path.join(root, "gate"), os.path.join(root, "stop")
    procs = []
    inst = None
    try:
        await asyncio.to_thread(b.start_ns)
        await asyncio.to_thread(b.start, "m")
        # the topic before the slave starts: its first metadata sync (3 s after its start) copies it
        await create_topic_on(b.namesrv_addr, [b.addr("m")], TOPIC, QUEUES)
        await asyncio.to_thread(b.start, "s")
        run.slave_addr = b.addr("s")
        await wait_slave_knows(b.addr("s"), TOPIC)
        inst = ClientInstance("127.0.0.1@repl-failover", b.namesrv_addr)
        mqs = [MessageQueue(TOPIC, "broker-a", q) for q in range(QUEUES)]

        events = Sink()
        proc = client.start(b.namesrv_addr, group, TOPIC, stop, gate)
        procs.append(proc)
        pump_json_lines(proc, events)
        async with asyncio.timeout(30):
            await events.until(lambda s: any(e["event"] == "started" for e in s))
        run.t_started = time.time()
        async with Producer("ReplFailoverPG", b.namesrv_addr, instance_name=f"repl-{client.name}") as p:
            # warm up until the consumer took and pulls every queue
            async with asyncio.timeout(30):
                for rnd in range(1000):
                    run.sent_before_kill |= await _send_per_queue(p, f"warm{rnd}", 1)
                    try:
                        async with asyncio.timeout(0.3):
                            await events.until(lambda s: len({m["queue_id"] for m in msgs(s)}) == QUEUES)
                        break
                    except TimeoutError:
                        continue
                await asyncio.to_thread(pathlib.Path(gate).touch)
                run.sent_before_kill |= await _send_per_queue(p, "fill", FILL)
                while not await client.pulls_no_more(inst, b.addr("m"), group, TOPIC, events):
                    await asyncio.sleep(0.1)
            run.backlog = await _send_per_queue(p, "backlog", BACKLOG)
            run.sent_before_kill |= run.backlog
        async with asyncio.timeout(settle_within_s):
            await events.until(client.settled)
        run.maxes = [await inst.api.max_offset(b.addr("m"), mq) for mq in mqs]

        run.t_kill = time.time()
        await asyncio.to_thread(b.kill, "m")
        os.unlink(gate)
        async with asyncio.timeout(deliver_within_s):
            await events.until(lambda s: run.sent_before_kill <= set(bodies(s)))
        # the client commits what it consumed to the slave while the master is away
        async with asyncio.timeout(30):
            while [await inst.api.query_consumer_offset(b.addr("s"), group, mq) for mq in mqs] != run.maxes:
                await asyncio.sleep(0.2)
        run.slave_offsets_at = time.time() - run.t_kill
        await asyncio.to_thread(b.start, "m")
        run.master_offsets = [await inst.api.query_consumer_offset(b.addr("m"), group, mq) for mq in mqs]
        await _stop(proc, stop)
        run.events = list(events)

        # a fresh consumer of the group reads its offsets from the restarted master
        fresh = Sink()
        proc = client.start(b.namesrv_addr, group, TOPIC, stop)
        procs.append(proc)
        pump_json_lines(proc, fresh)
        async with asyncio.timeout(60):
            await fresh.until(lambda s: any(e["event"] == "started" for e in s))
            async with Producer("ReplFailoverPG2", b.namesrv_addr, instance_name=f"repl2-{client.name}") as p:
                # stored either way; the slave may not have reconnected to the restarted master yet
                fences = await _send_per_queue(p, "fence", 1, ok=("SEND_OK", "SLAVE_NOT_AVAILABLE"))
            await fresh.until(lambda s: fences <= set(bodies(s)))
        await _stop(proc, stop)
        run.fresh_events = list(fresh)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if inst is not None:
            await inst.close()
        await asyncio.to_thread(b.stop)
        run.logs = b.logs()
    return run


def log_lines(paths: list[str], needle: str) -> list[str]:
    out = []
    for path in paths:
        with open(path, errors="replace") as f:
            out += [line.rstrip() for line in f if needle in line]
    return out


def dump(run: DeadMasterRun) -> str:
    """A one-line summary for failure messages."""
    return json.dumps({"client": run.client, "kill_after_start": round(run.t_kill - run.t_started, 2),
                       "per_queue": run.per_queue_after_kill() if run.t_kill else {},
                       "maxes": run.maxes, "master_offsets": run.master_offsets})
