"""`mqadmin` against groups of Apache C++ client consumers (rocketmq==0.4.4 wheel, C++ client
1.2.x) on real mqnamesrv/mqbroker processes:

* consumerConnection: what the C++ heartbeats registered (client ids, language CPP, the
  C++ client's version, subscriptions, consume type, model, from-where);
* consumerStatus: GET_CONSUMER_RUNNING_INFO relayed by the broker to the C++ consumers,
  whose JSON is not Java's (MessageQueue keys written as styled JSON objects, no
  statusTable, numbers as strings, PROP_CONSUMEORDERLY "flase", no cachedMsgSizeInMiB, and
  lastLockTimestamp / an unconsumed queue's lastConsumeTimestamp left uninitialised, so
  only lastPullTimestamp and a consumed queue's lastConsumeTimestamp are checked as dates):
  mqadmin must read and render it;
* consumerProgress: the offsets the C++ consumers commit (every 5 s) and the lag of
  messages sent while they are stopped;
* producerConnection of a running C++ producer, and queryMsgByKey / queryMsgByUniqueKey /
  queryMsgById of messages the C++ producer sent (keys `key-{i}`, the msg id it returned).

The C++ side runs in cpp_agent.py subprocesses; mqadmin runs as a subprocess too.
"""
from __future__ import annotations

import asyncio
import contextlib
import re
import time
from types import SimpleNamespace

import pytest

from pocketmq.client import Message, MessageQueue, Producer
from pocketmq.client.errors import BrokerError
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_client_cluster import create_topic, uniq
from tests.integration.test_consumer_running_info import mqadmin
from tests.integration.test_mqadmin import table_rows
from tests.interop.test_cpp_features import msgs, sent, stop_agents
from tests.support.events import Sink, pump_json_lines
from tests.support.workloads import poll_until, run_mqadmin

pytestmark = [pytest.mark.interop, pytest.mark.slow]

BROKER = "broker-a"
QUEUES = 4
EXPR = "TagA || TagB"
CPP_VERSION = 63              # the C++ client's heartbeat version: MQVersion V3_1_8
CPP_VERSION_DESC = "V3_1_8"   # what it reports as PROP_CLIENT_VERSION, and what a connection's
                              # version column shows (MQVersion.getVersionDesc(63), as Java's tools)


def retry_topic(group: str) -> str:
    return f"%RETRY%{group}"


async def raw_running_info(cluster, group: str, client_id: str) -> bytes | None:
    """The consumer's own answer to GET_CONSUMER_RUNNING_INFO as the broker relays it (None:
    no answer, e.g. not registered yet)."""
    rc = RemotingClient()
    try:
        resp = await rc.invoke(cluster.broker_addr, RemotingCommand(
            RequestCode.GET_CONSUMER_RUNNING_INFO,
            ext_fields={"consumerGroup": group, "clientId": client_id, "jstackEnable": "false"}), 15)
    finally:
        await rc.close()
    return resp.body_bytes() if resp.code == ResponseCode.SUCCESS else None


def raw_mq_table(raw: bytes) -> dict[tuple[str, int], int]:
    """{(topic, queueId): commitOffset} read straight from a C++ client's running info (its
    MessageQueue keys are styled JSON objects, not strings: no JSON parser takes them; read
    here without pocketmq's decoder, which is under test)."""
    keys = re.findall(r'\{\s*"brokerName" : "[^"]*",\s*"queueId" : (\d+),\s*"topic" : "([^"]*)"\s*\}:\{([^}]*)\}',
                      raw.decode())
    return {(t, int(q)): int(re.search(r'"commitOffset" : "?(-?\d+)', body).group(1)) for q, t, body in keys}


async def held_queues(api, cluster, group: str, topic: str) -> dict[str, set[int]]:
    """{clientId: the queue ids of `topic` it holds}, from the running info the broker relays."""
    held = {}
    try:
        ids = await api.consumer_id_list(cluster.broker_addr, group)
    except BrokerError:
        return held                      # no member registered yet
    for cid in ids:
        raw = await raw_running_info(cluster, group, cid)
        held[cid] = {q for t, q in raw_mq_table(raw) if t == topic} if raw is not None else set()
    return held


@contextlib.asynccontextmanager
async def cpp_consumers(agent, cluster, tmp_path, topic: str, group: str, members: int = 2, *,
                        orderly: bool = False):
    """`members` C++ push consumers (instances adm0, adm1, ...) of `group` subscribed to
    `topic` with EXPR (`orderly`: the C++ orderly push consumer), running until the yielded
    `stop()`; entered once the broker lists them all and they split the topic's queues
    disjointly. Yields .ids ({instance: clientId}), .procs ({instance: Popen}), .events
    (every member's events, one Sink), .stop(*instances) (cleanly, each at once; none
    named: all)."""
    events, procs, readers, stop_files = Sink(), {}, {}, {}
    inst = ClientInstance(uniq("127.0.0.1@cpp-admin"), cluster.namesrv_addr)

    async def stop(*names):
        names = names or tuple(procs)
        await asyncio.gather(*(stop_agents([procs[n]], stop_files[n]) for n in names))
        for n in names:
            readers[n].join(5)
    try:
        for i in range(members):
            name = f"adm{i}"
            stop_files[name] = str(tmp_path / f"stop-{group}-{name}")
            procs[name] = agent.start("push", "--ns", cluster.namesrv_addr, "--group", group, "--topic", topic,
                                      "--expr", EXPR, "--instance", name, "--stop-file", stop_files[name],
                                      "--seconds", "120", *(["--orderly"] if orderly else []))
            readers[name] = pump_json_lines(procs[name], events)
        held: dict = {}
        try:
            async with asyncio.timeout(40):
                await events.until(lambda s: sum(e["event"] == "started" for e in s) == members)
                while True:     # the C++ client rebalances on start and when the broker notifies it
                    held = await held_queues(inst.api, cluster, group, topic)
                    if len(held) == members and sorted(q for qs in held.values() for q in qs) == list(range(QUEUES)):
                        break
                    await asyncio.sleep(0.2)
        except TimeoutError:
            raise AssertionError(f"the C++ consumers never split the {QUEUES} queues: {held}") from None
        ids = {name: next(c for c in held if c.endswith(f"@{name}")) for name in procs}
        yield SimpleNamespace(ids=ids, procs=procs, events=events, stop=stop)
    finally:
        await stop()
        await inst.close()


async def until_mqadmin(pred, *args, timeout_s: float = 20):
    """Run mqadmin ARGS until pred(result) holds (state a C++ client changes on its own
    schedule, e.g. its periodic offset commits); the last result either way."""
    last = []

    def attempt():
        last.append(run_mqadmin(*args))
        return pred(last[-1])
    await asyncio.to_thread(poll_until, attempt, timeout_s, 0.3)
    return last[-1]


async def send_per_queue(prod, topic: str, counts, prefix: str) -> set[str]:
    """counts[q] messages (tag TagA) to queue q; returns their bodies, `{prefix}-{q}-{i}`."""
    bodies = set()
    for q, n in enumerate(counts):
        for i in range(n):
            await prod.send(Message(topic, f"{prefix}-{q}-{i}".encode(), tags="TagA"),
                            queue=MessageQueue(topic, BROKER, q))
            bodies.add(f"{prefix}-{q}-{i}")
    return bodies


def labelled(text: str) -> dict[str, str]:
    """`Label:   value` lines (format_message, consumerConnection's tail) -> {label: value}."""
    out = {}
    for ln in text.splitlines():
        m = re.match(r"([A-Za-z][A-Za-z ]*?):\s+(.*)$", ln)
        if m:
            out.setdefault(m.group(1), m.group(2))
    return out


def connection_rows(stdout: str) -> list[list[str]]:
    """consumerConnection / producerConnection lines: [index, clientId, addr, language, version]."""
    rows = []
    for ln in stdout.splitlines():
        if not ln.strip():
            break
        rows.append(ln.split())
    return rows


def assert_cpp_connections(rows, client_ids, index_width=3):
    assert [r[1] for r in rows] == sorted(client_ids), rows
    for i, r in enumerate(rows, 1):
        assert len(r) == 5 and r[0] == f"{i:0{index_width}d}", r
        assert re.fullmatch(r"127\.0\.0\.1:\d+", r[2]), r
        assert r[3] == "CPP" and r[4] == CPP_VERSION_DESC, r


# -- 1. consumerConnection -------------------------------------------------------------------

async def test_consumer_connection_lists_the_cpp_consumers_and_their_subscription(agent, cluster, tmp_path):
    topic, group = uniq("CppAdmConnT"), uniq("CppAdmConnG")
    await create_topic(cluster, topic, QUEUES)
    async with cpp_consumers(agent, cluster, tmp_path, topic, group) as g:
        async with asyncio.timeout(40):
            # what the broker holds from the C++ heartbeats, for the version the rows must show
            inst = ClientInstance(uniq("127.0.0.1@cpp-admin-cc"), cluster.namesrv_addr)
            try:
                cc = await inst.api.consumer_connection_list(cluster.broker_addr, group)
            finally:
                await inst.close()
            assert {c["clientId"]: (c["language"], c["version"]) for c in cc["connectionSet"]} == {
                cid: ("CPP", CPP_VERSION) for cid in g.ids.values()}, cc

            r = await mqadmin("consumerConnection", "-n", cluster.namesrv_addr, "-g", group)
            assert r.returncode == 0 and r.stderr == "", r.stderr
            assert_cpp_connections(connection_rows(r.stdout), g.ids.values())
            subs = re.findall(r"^(\d{3})  Topic: (\S+)\s+SubExpression: (.*)$", r.stdout, re.M)
            # the C++ client subscribes its group's retry topic too, like Java's
            assert subs == [("001", retry_topic(group), "*"), ("002", topic, EXPR)], r.stdout
            tail = labelled(r.stdout.split("Below is subscription:", 1)[1])
            assert tail["ConsumeType"] == "CONSUME_PASSIVELY", r.stdout
            assert tail["MessageModel"] == "CLUSTERING", r.stdout
            assert tail["ConsumeFromWhere"] == "CONSUME_FROM_LAST_OFFSET", r.stdout

            # the group listing (consumerProgress without -g) counts the same connections
            r = await mqadmin("consumerProgress", "-n", cluster.namesrv_addr)
            assert r.returncode == 0, r.stderr
            row = next(row for row in table_rows(r.stdout, "#Group") if row[0] == group)
            assert row[1:4] == ["2", "PUSH", "CLUSTERING"], row

            # A message per queue ends the long polls the broker holds: else the first member,
            # which took every queue before the second joined, may still have a pull held on a
            # queue it gave up; re-taking that queue while the group stops blocks its shutdown
            # until that pull returns (the 15 s suspend; C++ client 1.2.x).
            async with Producer(uniq("CppAdmConnPG"), cluster.namesrv_addr, instance_name=uniq("conn")) as prod:
                wake = await send_per_queue(prod, topic, [1] * QUEUES, "wake")
            await g.events.until(lambda s: wake <= {m["body"] for m in msgs(s)})


# -- 2. consumerStatus -----------------------------------------------------------------------

def status_sections(stdout: str) -> dict[str, str]:
    """consumerStatus without -i: {clientId: its `#ClientId#` section}."""
    parts = re.split(r"^#ClientId# (\S+)$", stdout, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def mq_detail(section: str, topics) -> dict[tuple[str, int], dict[str, str]]:
    """The `#Consumer MQ Detail#` rows: {(topic, qid): ProcessQueueInfo fields}."""
    out = {}
    for ln in section.split("#Consumer MQ Detail#", 1)[1].splitlines():
        m = re.match(r"(\S+)\s+(\S+)\s+(\d+)\s+ProcessQueueInfo \[(.*)\]$", ln)
        if m and m.group(1) in topics:
            assert m.group(2) == BROKER, ln
            out[(m.group(1), int(m.group(3)))] = dict(kv.split("=", 1) for kv in m.group(4).split(", "))
    return out


def offset_rows(section: str) -> dict[tuple[str, int], int]:
    """The `#Consumer Offset#` rows: {(topic, qid): consumer offset}."""
    body = section.split("#Consumer Offset#", 1)[1].split("#Consumer MQ Detail#", 1)[0]
    return {(t, int(q)): int(o) for t, b, q, o in re.findall(r"^(\S+)\s+(\S+)\s+(\d+)\s+(-?\d+)\s*$", body, re.M)}


def human_date(s: str) -> bool:
    """A timestamp rendered like Java's (this year's), not a raw number or an empty cell."""
    return bool(re.fullmatch(rf"{time.localtime().tm_year}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}}", s))


async def test_consumer_status_renders_the_running_info_of_cpp_consumers(agent, cluster, tmp_path):
    topic, group = uniq("CppAdmStatT"), uniq("CppAdmStatG")
    await create_topic(cluster, topic, QUEUES)
    per_queue = [1, 2, 3, 4]
    async with cpp_consumers(agent, cluster, tmp_path, topic, group) as g:
        async with asyncio.timeout(50):
            async with Producer(uniq("CppAdmStatPG"), cluster.namesrv_addr, instance_name=uniq("stat")) as prod:
                want = await send_per_queue(prod, topic, per_queue, "s")
            await g.events.until(lambda s: want <= {m["body"] for m in msgs(s)})

            # The C++ clients' own JSON as the broker relays it, read without pocketmq's decoder,
            # once their in-memory offsets are past every message (set after each callback).
            consumed = {(topic, q): n for q, n in enumerate(per_queue)}
            while True:
                raws = {cid: await raw_running_info(cluster, group, cid) for cid in g.ids.values()}
                assert all(raws.values()), raws
                tables = {cid: raw_mq_table(raw) for cid, raw in raws.items()}
                if all(tables[cid][k] == n for cid in tables for k, n in consumed.items() if k in tables[cid]):
                    break
                await asyncio.sleep(0.2)
            for raw in raws.values():        # not Java's shape: object keys, no statusTable
                assert b'"mqTable":{{' in raw and b"statusTable" not in raw, raw[:300]
            held = {cid: {q for t, q in table if t == topic} for cid, table in tables.items()}
            assert sorted(q for qs in held.values() for q in qs) == list(range(QUEUES)), tables

            # the whole group: a summary row per C++ client, then each one's info
            r = await mqadmin("consumerStatus", "-n", cluster.namesrv_addr, "-g", group)
            assert r.returncode == 0 and r.stderr == "", r.stderr
            summary = table_rows(r.stdout, "#Index")
            assert [(row[1], row[2]) for row in summary] == [(cid, CPP_VERSION_DESC) for cid in sorted(g.ids.values())]
            assert sum(int(row[3]) for row in summary) >= QUEUES, summary
            assert "Same subscription in the same group of consumer" in r.stdout
            assert "Rebalance OK" in r.stdout
            sections = status_sections(r.stdout)
            assert sorted(sections) == sorted(g.ids.values()), r.stdout
            for row in summary:
                cid, section = row[1], sections[row[1]]
                props = dict(re.findall(r"^(PROP_\w+)\s+: (.*)$", section, re.M))
                assert props["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY", section
                assert props["PROP_CLIENT_VERSION"] == CPP_VERSION_DESC, section
                assert props["PROP_NAMESERVER_ADDR"] == cluster.namesrv_addr, section
                assert props["PROP_THREADPOOL_CORE_SIZE"] == "2", section      # cpp_agent's set_thread_count(2)
                subs = re.findall(r"^\d{3} Topic: (\S+)\s+ClassFilter: false\s+SubExpression: (.*)$", section, re.M)
                assert sorted(subs) == sorted([(retry_topic(group), "*"), (topic, EXPR)]), section
                # every queue of the C++ client's mqTable, and only those
                detail = mq_detail(section, (topic, retry_topic(group)))
                assert set(detail) == set(tables[cid]), (section, tables[cid])
                assert int(row[3]) == len(detail), row
                assert offset_rows(section) == {k: tables[cid][k] for k in detail}, section
                for pqi in detail.values():
                    assert pqi["droped"] == "false" and pqi["locked"] == "false", pqi
                    assert human_date(pqi["lastPullTimestamp"]), pqi

            # one client (-i): its own queues, consumed
            cid = g.ids["adm0"]
            r = await mqadmin("consumerStatus", "-n", cluster.namesrv_addr, "-g", group, "-i", cid)
            assert r.returncode == 0 and r.stderr == "", r.stderr
            assert "#ClientId#" not in r.stdout and r.stdout.startswith("#Consumer Properties#"), r.stdout
            detail = mq_detail(r.stdout, (topic,))
            assert {q for _, q in detail} == held[cid], (r.stdout, held)
            for (_, q), pqi in detail.items():
                assert int(pqi["commitOffset"]) == per_queue[q], (q, pqi)
                assert pqi["cachedMsgCount"] == "0", pqi
                # absent from the C++ JSON: read as Java's default, as fastjson does
                assert pqi["cachedMsgSizeInMiB"] == "0", pqi
                assert human_date(pqi["lastConsumeTimestamp"]), pqi
            other = g.ids["adm1"]
            assert other not in r.stdout

            r = await mqadmin("consumerStatus", "-n", cluster.namesrv_addr, "-g", group, "-i", "127.0.0.1@nobody")
            assert r.returncode == 1 and "not online" in r.stderr and cid in r.stderr, r.stderr


# -- 3. consumerProgress ---------------------------------------------------------------------

def progress(stdout: str, topic: str) -> dict[int, tuple[int, int, int]]:
    """consumerProgress rows of `topic`: {qid: (broker offset, consumer offset, diff)}."""
    return {int(row[2]): (int(row[3]), int(row[4]), int(row[5]))
            for row in table_rows(stdout, "#Topic") if row[0] == topic and row[1] == BROKER}


def diff_total(stdout: str) -> int:
    return int(re.search(r"^Diff Total: (-?\d+)$", stdout, re.M).group(1))


async def test_consumer_progress_follows_the_cpp_commits_and_shows_the_lag_while_stopped(agent, cluster, tmp_path):
    topic, group = uniq("CppAdmProgT"), uniq("CppAdmProgG")
    await create_topic(cluster, topic, QUEUES)
    n = 40
    later = [1, 2, 3, 4]                  # sent per queue while the group is stopped
    async with cpp_consumers(agent, cluster, tmp_path, topic, group) as g:
        async with asyncio.timeout(55):
            async with Producer(uniq("CppAdmProgPG"), cluster.namesrv_addr, instance_name=uniq("prog")) as prod:
                results = [await prod.send(Message(topic, f"p-{i}".encode(), tags="TagA")) for i in range(n)]
                per_queue = [sum(r.queue.queue_id == q for r in results) for q in range(QUEUES)]
                assert all(per_queue), per_queue
                want = {f"p-{i}" for i in range(n)}
                await g.events.until(lambda s: want <= {m["body"] for m in msgs(s)})

                # the C++ client commits its offsets every 5 s: wait for them, not a fixed time
                consumed = {q: (per_queue[q], per_queue[q], 0) for q in range(QUEUES)}
                r = await until_mqadmin(lambda r: r.returncode == 0 and progress(r.stdout, topic) == consumed,
                                        "consumerProgress", "-n", cluster.namesrv_addr, "-g", group, timeout_s=20)
                assert r.returncode == 0 and r.stderr == "", r.stderr
                assert progress(r.stdout, topic) == consumed, r.stdout
                assert diff_total(r.stdout) == 0, r.stdout
                r = await mqadmin("consumerProgress", "-n", cluster.namesrv_addr, "-g", group, "-t", topic)
                assert r.returncode == 0, r.stderr
                assert {row[0] for row in table_rows(r.stdout, "#Topic")} == {topic}, r.stdout
                assert progress(r.stdout, topic) == consumed, r.stdout

                await g.stop()
                assert sum(e["event"] == "done" for e in g.events) == 2, "a C++ consumer did not stop"
                # the broker dropped the C++ connections (UNREGISTER_CLIENT, then the close)
                r = await until_mqadmin(lambda r: r.returncode == 1, "consumerConnection", "-n",
                                        cluster.namesrv_addr, "-g", group, timeout_s=10)
                assert r.returncode == 1 and "not online" in r.stderr, (r.stdout, r.stderr)

                await send_per_queue(prod, topic, later, "late")
            r = await mqadmin("consumerProgress", "-n", cluster.namesrv_addr, "-g", group, "-t", topic)
            assert r.returncode == 0 and r.stderr == "", r.stderr
            assert progress(r.stdout, topic) == {
                q: (per_queue[q] + later[q], per_queue[q], later[q]) for q in range(QUEUES)}, r.stdout
            assert diff_total(r.stdout) == sum(later), r.stdout
            late = [m["body"] for m in msgs(g.events) if m["body"].startswith("late-")]
            assert not late, late


# -- 4. producerConnection and the message queries, with the C++ producer --------------------

async def test_producer_connection_shows_a_running_cpp_producer(agent, cluster):
    topic, group = uniq("CppAdmProdT"), uniq("CppAdmProdG")
    await create_topic(cluster, topic, QUEUES)
    # A producer that keeps sending until killed: its heartbeats reach the broker it sends to.
    # The C++ client heartbeats at start and then on a 30 s timer (MQClientFactory); a beat
    # sent before its first send has fetched the route reaches no broker, so on a loaded host
    # the producer may show up only at the 30 s beat (a CI run with three workers: not
    # within 20 s; alone it shows within a second).
    p = agent.start("produce", "--ns", cluster.namesrv_addr, "--topic", topic, "--group", group,
                    "--count", "1000000", "--prefix", "live")
    try:
        async with asyncio.timeout(60):
            r = await until_mqadmin(lambda r: r.returncode == 0, "producerConnection", "-n",
                                    cluster.namesrv_addr, "-g", group, "-t", topic, timeout_s=40)
            assert r.returncode == 0 and r.stderr == "", (r.stdout, r.stderr)
            rows = connection_rows(r.stdout)
            assert len(rows) == 1 and rows[0][1].endswith("@DEFAULT"), rows
            assert_cpp_connections(rows, [rows[0][1]], index_width=4)
            assert p.poll() is None, "the producer ended before it was seen"
    finally:
        p.kill()
        await asyncio.to_thread(p.wait)
    r = await until_mqadmin(lambda r: r.returncode == 1, "producerConnection", "-n",
                            cluster.namesrv_addr, "-g", group, "-t", topic, timeout_s=10)
    assert r.returncode == 1 and "not online" in r.stderr, (r.stdout, r.stderr)


async def test_query_commands_find_cpp_messages_by_key_and_by_the_returned_msg_id(agent, cluster):
    topic, group = uniq("CppAdmQryT"), uniq("CppAdmQryPG")
    await create_topic(cluster, topic, QUEUES)
    async with asyncio.timeout(50):
        ev = await asyncio.to_thread(agent.run, "produce", "--ns", cluster.namesrv_addr, "--topic", topic,
                                     "--group", group, "--mode", "sync", "--count", "6", "--prefix", "qry")
        out = {e["idx"]: e for e in sent(ev)}
        assert sorted(out) == list(range(6)) and all(e["status"] == 0 for e in out.values()), ev
        assert len({e["msg_id"] for e in out.values()}) == 6, out
        for i in (0, 4):
            e = out[i]
            r = await until_mqadmin(lambda r: r.returncode == 0 and table_rows(r.stdout, "#Message ID"),
                                    "queryMsgByKey", "-n", cluster.namesrv_addr, "-t", topic, "-k", f"key-{i}",
                                    timeout_s=10)
            assert r.returncode == 0 and r.stderr == "", r.stderr
            rows = table_rows(r.stdout, "#Message ID")
            assert len(rows) == 1 and rows[0][0] == e["msg_id"], (r.stdout, e)
            assert int(rows[0][2]) == e["offset"], (rows, e)
            qid = int(rows[0][1])

            # the msg id the C++ send returned is the message's UNIQ_KEY
            r = await mqadmin("queryMsgByUniqueKey", "-n", cluster.namesrv_addr, "-t", topic, "-i", e["msg_id"])
            assert r.returncode == 0 and r.stderr == "", r.stderr
            by_uniq = labelled(r.stdout)
            assert by_uniq["Topic"] == topic and by_uniq["Tags"] == "[TagA]", r.stdout
            assert by_uniq["Keys"] == f"[key-{i}]" and by_uniq["Message Body"] == f"qry-{i}", r.stdout
            assert int(by_uniq["Queue ID"]) == qid and int(by_uniq["Queue Offset"]) == e["offset"], r.stdout
            props = by_uniq["Properties"]
            for kv in (f"UNIQ_KEY={e['msg_id']}", f"KEYS=key-{i}", f"idx={i}", "origin=cpp"):
                assert kv in props, props

            # ... and the offset id it printed finds the same record
            r = await mqadmin("queryMsgById", "-n", cluster.namesrv_addr, "-i", by_uniq["OffsetID"])
            assert r.returncode == 0 and r.stderr == "", r.stderr
            by_id = labelled(r.stdout)
            assert by_id == by_uniq, (by_id, by_uniq)

        r = await mqadmin("queryMsgByKey", "-n", cluster.namesrv_addr, "-t", topic, "-k", "key-6")
        assert r.returncode == 0 and table_rows(r.stdout, "#Message ID") == [], r.stdout
