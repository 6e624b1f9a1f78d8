"""Message queries against real daemons: keys and unique keys found through the broker's
IndexFile (QUERY_MESSAGE) after the index rolls over (tiny maxIndexNum), after a clean
restart and after a SIGKILL; a key with 1,000 messages paged past the broker's 64; the
mqadmin commands queryMsgByKey / queryMsgByUniqueKey / queryMsgByOffset / printMsg with
their error paths."""
from __future__ import annotations

import asyncio
import os

import pytest

from pocketmq.client import Message, MessageNotFoundError, NoRouteError, Producer
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.headers.typed import QueryMessageRequestHeader
from tests.integration.test_client_cluster import create_topic, uniq
from tests.integration.test_mqadmin import assert_clean_failure, run_cli, table_rows
from tests.support.daemons import Cluster

pytestmark = pytest.mark.slow

TOPIC = "QueryTopic"
MANY = 1000
BATCH = 25        # a batch shares one store millisecond: keep it below a page (64), and
                  # each batch in a millisecond of its own (see `sent`)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("query"))
    # 200 entries per index file: every message has 2 keys, so ~100 messages per file
    c = Cluster(root, broker_args=["--maxHashSlotNum=64", "--maxIndexNum=200"]).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def sent(cluster):
    """MANY messages with key K-many (batches), and a few single sends with their own keys."""
    async def go():
        await create_topic(cluster, TOPIC, 2)
        async with Producer(uniq("QP"), cluster.namesrv_addr, instance_name=uniq("qp")) as p:
            singles = []
            for i in range(5):
                r = await p.send(Message(TOPIC, f"single-{i}".encode(), keys=[f"S{i}", "shared"], tags="TagA"))
                singles.append(r)
            many = []
            for start in range(0, MANY, BATCH):
                msgs = [Message(TOPIC, f"m{i}".encode(), keys=["K-many"]) for i in range(start, start + BATCH)]
                r = await p.send_batch(msgs)
                for x in r:
                    many += x.msg_id.split(",")
                # The pager tells records apart by store millisecond (client/query.py: more
                # than a page in one millisecond cannot all be found, as with Java); a fast
                # host stores three batches in one. The next batch is stored after this one's
                # ack, so two milliseconds later it is in a millisecond of its own.
                await asyncio.sleep(0.002)
            return singles, many
    return asyncio.run(go())


async def producer(cluster):
    p = Producer(uniq("QQ"), cluster.namesrv_addr, instance_name=uniq("qq"))
    await p.start()
    return p


def index_files(cluster) -> list[str]:
    d = os.path.join(cluster.root, "store", "index")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


async def test_keys_and_unique_keys_after_rollover(cluster, sent):
    singles, many = sent
    p = await producer(cluster)
    try:
        for i, r in enumerate(singles):
            got = await p.query_message(TOPIC, f"S{i}")
            assert [m.msg_id for m in got] == [r.msg_id]
            assert got[0].body == f"single-{i}".encode()
            assert (await p.view_message(r.msg_id, TOPIC)).body == f"single-{i}".encode()     # client msgId
            assert (await p.view_message(r.offset_msg_id)).msg_id == r.msg_id                 # offsetMsgId
        shared = await p.query_message(TOPIC, "shared")
        assert [m.msg_id for m in shared] == [r.msg_id for r in reversed(singles)]          # newest first
        assert await p.query_message(TOPIC, "no-such-key") == []
        assert len(index_files(cluster)) >= 10          # 2,010 entries, 200 per file: rolled over
        assert await p.query_message(TOPIC, "S1", end_ms=1000) == []
        s1 = (await p.query_message(TOPIC, "S1"))[0]
        assert await p.query_message(TOPIC, "S1", begin_ms=s1.store_timestamp + 1) == []
        assert len(await p.query_message(TOPIC, "S1", begin_ms=s1.store_timestamp,
                                         end_ms=s1.store_timestamp)) == 1
    finally:
        await p.close()


async def test_a_thousand_messages_paged(cluster, sent):
    _singles, many = sent
    p = await producer(cluster)
    try:
        got = await p.query_message(TOPIC, "K-many", max_num=MANY)
        assert len(got) == MANY
        assert sorted(m.msg_id for m in got) == sorted(many)
        ts = [m.store_timestamp for m in got]
        assert ts == sorted(ts, reverse=True)
        newest = await p.query_message(TOPIC, "K-many", max_num=10)
        assert [m.msg_id for m in newest] == [m.msg_id for m in got[:10]]
        # one broker request answers at most maxMsgsNumBatch (64)
        inst = ClientInstance("127.0.0.1@query-raw", cluster.namesrv_addr)
        try:
            page, progress = await inst.api.query_message(
                cluster.broker_addr, QueryMessageRequestHeader(TOPIC, "K-many", MANY, 0, 1 << 62))
            assert len(page) == 64 and progress.index_last_update_timestamp > 0
            empty, progress2 = await inst.api.query_message(      # QUERY_NOT_FOUND: empty, not an error
                cluster.broker_addr, QueryMessageRequestHeader(TOPIC, "absent", 10, 0, 1 << 62))
            assert empty == [] and progress2.index_last_update_phyoffset > 0
        finally:
            await inst.close()
    finally:
        await p.close()


async def test_bad_lookups_raise_clear_errors(cluster, sent):
    p = await producer(cluster)
    try:
        with pytest.raises(MessageNotFoundError, match="pass topic="):
            await p.view_message("not-an-id")
        with pytest.raises(MessageNotFoundError, match="no message"):
            await p.view_message("0A0000000000FFFF0000000000001234", TOPIC)
        with pytest.raises(MessageNotFoundError, match="not found on broker"):
            host = cluster.broker_addr
            _ip, port = host.split(":")
            bogus = "7F000001" + f"{int(port):08X}" + f"{(1 << 40):016X}"
            await p.view_message(bogus)
        with pytest.raises(NoRouteError):
            await p.query_message("NoSuchTopicQ", "k")
        with pytest.raises(ValueError):
            await p.query_message(TOPIC, "")
    finally:
        await p.close()


async def restart_and_query(cluster, sent, kill: bool):
    singles, many = sent
    p = await producer(cluster)
    try:
        fresh = await p.send(Message(TOPIC, b"after", keys=["fresh" + str(kill)]))
    finally:
        await p.close()
    cluster.restart_broker(kill=kill)
    p = await producer(cluster)
    try:
        got = await p.query_message(TOPIC, "fresh" + str(kill))
        assert [m.msg_id for m in got] == [fresh.msg_id]
        assert (await p.view_message(singles[2].msg_id, TOPIC)).msg_id == singles[2].msg_id
        assert len(await p.query_message(TOPIC, "K-many", max_num=MANY)) == MANY
        again = await p.send(Message(TOPIC, b"again", keys=["fresh" + str(kill)]))
        got = await p.query_message(TOPIC, "fresh" + str(kill))
        assert [m.msg_id for m in got] == [again.msg_id, fresh.msg_id]
    finally:
        await p.close()


async def test_index_survives_a_clean_restart(cluster, sent):
    await restart_and_query(cluster, sent, kill=False)


async def test_index_survives_sigkill(cluster, sent):
    await restart_and_query(cluster, sent, kill=True)


# --------------------------------------------------------------------------- mqadmin


def test_mqadmin_query_msg_by_key(cluster, sent):
    singles, _many = sent
    r = run_cli("queryMsgByKey", "-n", cluster.namesrv_addr, "-t", TOPIC, "-k", "shared")
    assert r.returncode == 0, r.stderr
    rows = table_rows(r.stdout, "#Message ID")
    assert [row[0] for row in rows] == [s.msg_id for s in reversed(singles)]
    r = run_cli("queryMsgByKey", "-n", cluster.namesrv_addr, "-t", TOPIC, "-k", "K-many", "-m", "200")
    assert r.returncode == 0 and len(table_rows(r.stdout, "#Message ID")) == 200
    r = run_cli("queryMsgByKey", "-n", cluster.namesrv_addr, "-t", TOPIC, "-k", "shared", "-e", "1000")
    assert r.returncode == 0 and table_rows(r.stdout, "#Message ID") == []
    assert_clean_failure(run_cli("queryMsgByKey", "-n", cluster.namesrv_addr, "-t", "NoSuchTopicQ", "-k", "x"),
                         "NoSuchTopicQ")
    r = run_cli("queryMsgByKey", "-n", cluster.namesrv_addr, "-t", TOPIC, "-k", "x", "-b", "yesterday")
    assert r.returncode == 2 and "bad timestamp" in r.stderr
    r = run_cli("queryMsgByKey", "-h")
    assert r.returncode == 0 and "--msgKey" in r.stdout


def test_mqadmin_query_msg_by_unique_key(cluster, sent):
    singles, _many = sent
    r = run_cli("queryMsgByUniqueKey", "-n", cluster.namesrv_addr, "-t", TOPIC, "-i", singles[3].msg_id)
    assert r.returncode == 0, r.stderr
    assert "Topic:" in r.stdout and TOPIC in r.stdout and "single-3" in r.stdout and "[S3 shared]" in r.stdout
    assert_clean_failure(run_cli("queryMsgByUniqueKey", "-n", cluster.namesrv_addr, "-t", TOPIC,
                                 "-i", "0A0000000000FFFF0000000000001234"), "no message")
    r = run_cli("queryMsgByUniqueKey", "-n", cluster.namesrv_addr, "-t", TOPIC, "-i", singles[0].msg_id,
                "-g", "G", "-d", "C")
    # -g/-d: consume it directly (tests/integration/test_consume_message_directly.py); no such client here
    assert_clean_failure(r, "not online")


def test_mqadmin_query_msg_by_offset(cluster, sent):
    singles, _many = sent
    target = singles[1]
    r = run_cli("queryMsgByOffset", "-n", cluster.namesrv_addr, "-t", TOPIC, "-b", target.queue.broker_name,
                "-i", str(target.queue.queue_id), "-o", str(target.queue_offset))
    assert r.returncode == 0, r.stderr
    assert "single-1" in r.stdout and target.offset_msg_id in r.stdout
    assert_clean_failure(run_cli("queryMsgByOffset", "-n", cluster.namesrv_addr, "-t", TOPIC, "-b",
                                 target.queue.broker_name, "-i", "0", "-o", "999999"), "no message at offset")
    assert_clean_failure(run_cli("queryMsgByOffset", "-n", cluster.namesrv_addr, "-t", TOPIC, "-b", "nobroker",
                                 "-i", "0", "-o", "0"), "nobroker")


def test_mqadmin_print_msg(cluster, sent):
    singles, _many = sent
    r = run_cli("printMsg", "-n", cluster.namesrv_addr, "-t", TOPIC, "-s", "TagA", timeout=120)
    assert r.returncode == 0, r.stderr
    bodies = [ln.rsplit("BODY: ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith("MSGID: ")]
    assert sorted(bodies) == sorted(f"single-{i}" for i in range(5))
    assert r.stdout.count("minOffset=") == 2 and "MessageQueue [topic=QueryTopic" in r.stdout
    r = run_cli("printMsg", "-n", cluster.namesrv_addr, "-t", TOPIC, "-s", "TagA", "-d", "false", timeout=120)
    assert r.returncode == 0 and "NOT PRINT BODY" in r.stdout and "single-" not in r.stdout
    r = run_cli("printMsg", "-n", cluster.namesrv_addr, "-t", TOPIC, "-b", "1000", "-e", "2000")
    assert r.returncode == 0 and "MSGID:" not in r.stdout
    assert_clean_failure(run_cli("printMsg", "-n", cluster.namesrv_addr, "-t", "NoSuchTopicQ"), "NoSuchTopicQ")
    r = run_cli("printMsg", "-n", cluster.namesrv_addr, "-t", TOPIC, "-c", "no-such-charset")
    assert r.returncode == 2 and "charset" in r.stderr


def test_blocking_facade_lookups(cluster, sent):
    from pocketmq.client import sync
    singles, _many = sent
    with sync.Producer(uniq("QS"), cluster.namesrv_addr, instance_name=uniq("qs")) as p:
        assert [m.msg_id for m in p.query_message(TOPIC, "S0")] == [singles[0].msg_id]
        assert p.view_message(singles[0].msg_id, TOPIC).body == b"single-0"
        with pytest.raises(MessageNotFoundError):
            p.view_message("nope")
