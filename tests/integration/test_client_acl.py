"""Our client against real daemons running plain ACL (tests/integration/test_acl_broker.py's
cluster: broker and nameserver with aclEnable): credentials= signs every request of the
producers and consumers (brokers and nameservers), and each deny is an AclDeniedError that
names the account and the reason, with nothing stored."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from pocketmq.client import CONSUME_SUCCESS, LitePullConsumer, Message, Producer, PushConsumer
from pocketmq.client import sync
from pocketmq.client.errors import AclDeniedError
from pocketmq.client.instance import ClientInstance
from pocketmq.client.transaction_producer import LocalTransactionState, TransactionProducer
from pocketmq.protocol.bodies import MessageQueue, TopicConfig
from tests.integration.test_acl_broker import ADMIN, APP, start_acl_cluster
from tests.integration.test_client_cluster import uniq
from tests.support.daemons import free_broker_port, free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_acl_cluster(str(tmp_path_factory.mktemp("client-acl")))
    yield c
    c.stop()


async def admin_api(cluster, fn):
    inst = ClientInstance(f"127.0.0.1@{uniq('adm')}", cluster.namesrv_addr, credentials=ADMIN)
    try:
        return await fn(inst.api)
    finally:
        await inst.close()


async def ensure_topic(cluster, topic: str) -> None:
    async def create(api):
        await api.create_topic(cluster.broker_addr, TopicConfig(topic, 1, 1), "TBW102")
        for _ in range(200):
            if await api.get_route(topic) is not None:
                return
            await asyncio.sleep(0.05)
    await admin_api(cluster, create)


async def max_offset(cluster, topic: str) -> int:
    return await admin_api(cluster, lambda api: api.max_offset(cluster.broker_addr, MessageQueue(topic, "broker-a", 0)))


async def test_producer_and_consumers_with_credentials(cluster):
    await ensure_topic(cluster, "AclT")
    start = await max_offset(cluster, "AclT")
    bodies = [f"signed-{i}".encode() for i in range(5)]
    async with Producer(uniq("P"), cluster.namesrv_addr, instance_name=uniq("p"), credentials=APP) as p:
        for b in bodies:
            await p.send(Message("AclT", b))
        # 64 in flight: coalesced batches are signed like single sends
        await asyncio.gather(*(p.send(Message("AclT", b"many")) for _ in range(64)))
    c = LitePullConsumer(uniq("LiteG"), cluster.namesrv_addr, instance_name=uniq("c"), credentials=APP,
                         auto_commit=False, max_poll_records=100)
    c.assign([MessageQueue("AclT", "broker-a", 0)])
    got: list[bytes] = []
    async with c:
        c.seek(MessageQueue("AclT", "broker-a", 0), start)
        for _ in range(100):
            got += [m.body for m in await c.poll(timeout_s=0.2)]
            if len(got) >= 69:
                break
    assert got[:5] == bodies and len(got) == 69

    seen = asyncio.Event()

    def listener(msg):
        if msg.body == b"push-me":
            seen.set()
        return CONSUME_SUCCESS
    push = PushConsumer(uniq("PushG"), cluster.namesrv_addr, listener=listener, instance_name=uniq("c"),
                        credentials=APP, consume_from_where="LAST_OFFSET")
    push.subscribe("AclT")
    async with push:
        async with Producer(uniq("P"), cluster.namesrv_addr, instance_name=uniq("p"), credentials=APP) as p:
            for _ in range(100):
                await p.send(Message("AclT", b"push-me"))
                try:
                    await asyncio.wait_for(seen.wait(), 0.3)
                    break
                except asyncio.TimeoutError:
                    pass
    assert seen.is_set()


@pytest.mark.parametrize("case", ["no credentials", "wrong secret", "unknown key", "topic without PUB"])
async def test_denied_sends_raise_acl_denied_naming_account_and_reason(cluster, case):
    topic = "OtherT" if case == "topic without PUB" else "AclT"
    await ensure_topic(cluster, topic)
    creds = {"no credentials": None, "wrong secret": (APP[0], "wrongSecret"), "unknown key": ("nobodyKey", "whatever1"),
             "topic without PUB": APP}[case]
    before = await max_offset(cluster, topic)
    with pytest.raises(AclDeniedError) as ei:
        async with Producer(uniq("P"), cluster.namesrv_addr, instance_name=uniq("p"), credentials=creds,
                            send_timeout_ms=2000) as p:
            await p.send(Message(topic, b"refused"))
    e = ei.value
    assert e.account == (creds[0] if creds else None)
    want = {"no credentials": "No accessKey is configured", "wrong secret": "Check signature failed",
            "unknown key": "No acl config for nobodyKey", "topic without PUB": topic}[case]
    assert want in e.reason and want in str(e)
    assert (creds[0] if creds else "without credentials") in str(e)
    assert not e.retriable
    assert await max_offset(cluster, topic) == before      # nothing stored


async def test_nameserver_writes_are_signed_too(cluster):
    # PUT_KV_CONFIG is an admin write on an ACL nameserver: the admin account's signed
    # request passes, the app account's is refused by name
    await admin_api(cluster, lambda api: api.put_kv_config("clientAclNs", "k", "v"))
    inst = ClientInstance(f"127.0.0.1@{uniq('app')}", cluster.namesrv_addr, credentials=APP)
    try:
        with pytest.raises(AclDeniedError, match=f"account {APP[0]} by .*Need admin permission"):
            await inst.api.put_kv_config("clientAclNs", "k", "v2")
    finally:
        await inst.close()


async def test_transaction_producer_with_credentials(cluster):
    await ensure_topic(cluster, "AclT")
    before = await max_offset(cluster, "AclT")
    async with TransactionProducer(uniq("TxG"), cluster.namesrv_addr, instance_name=uniq("t"), credentials=APP,
                                   checker=lambda m: LocalTransactionState.COMMIT) as p:
        r = await p.send_in_transaction(Message("AclT", b"tx"), lambda m, a: LocalTransactionState.COMMIT)
    assert r.local_state is LocalTransactionState.COMMIT
    for _ in range(100):
        if await max_offset(cluster, "AclT") > before:
            break
        await asyncio.sleep(0.05)
    assert await max_offset(cluster, "AclT") == before + 1


def test_sync_facade_with_credentials(cluster):
    asyncio.run(ensure_topic(cluster, "AclT"))
    with sync.Producer(uniq("P"), cluster.namesrv_addr, instance_name=uniq("p"), credentials=APP) as p:
        assert p.send(Message("AclT", b"blocking")).status.name == "SEND_OK"
    with pytest.raises(AclDeniedError):
        with sync.Producer(uniq("P"), cluster.namesrv_addr, instance_name=uniq("p"),
                           credentials=(APP[0], "wrongSecret")) as p:
            p.send(Message("AclT", b"blocking"))


# --- the tools take credentials ---------------------------------------------------------------

def test_mqadmin_signs_with_flags_or_environment(cluster, capsys, monkeypatch):
    from pocketmq.tools.mqadmin.cli import main as admin_main
    monkeypatch.delenv("ROCKETMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("ROCKETMQ_SECRET_KEY", raising=False)
    base = ["updateTopic", "-n", cluster.namesrv_addr, "-b", cluster.broker_addr]
    assert admin_main([*base, "-t", uniq("AdmT")]) != 0
    assert "No accessKey is configured" in capsys.readouterr().err
    assert admin_main([*base, "-t", uniq("AdmT"), "--accessKey", APP[0], "--secretKey", APP[1]]) != 0
    assert "Need admin permission" in capsys.readouterr().err
    assert admin_main([*base, "-t", uniq("AdmT"), "--accessKey", ADMIN[0], "--secretKey", ADMIN[1]]) == 0
    assert admin_main([*base, "-t", uniq("AdmT"), "--accessKey", ADMIN[0]]) == 2
    assert "secretKey is missing" in capsys.readouterr().err
    monkeypatch.setenv("ROCKETMQ_ACCESS_KEY", ADMIN[0])
    monkeypatch.setenv("ROCKETMQ_SECRET_KEY", ADMIN[1])
    assert admin_main([*base, "-t", uniq("AdmT")]) == 0
    # the flags win over the environment
    assert admin_main([*base, "-t", uniq("AdmT"), "--accessKey", APP[0], "--secretKey", APP[1]]) != 0


def test_pocketmq_dev_runs_acl_with_its_credentials(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCKETMQ_")}
    cmd = [sys.executable, "-m", "pocketmq", "dev", "--demo", "--dir", str(tmp_path / "dev"),
           "--namesrv-port", str(free_port()), "--broker-port", str(free_broker_port())]
    r = subprocess.run([*cmd, "--accessKey", "devAdmin1", "--secretKey", "devSecret1"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "plain ACL on, admin account devAdmin1" in r.stdout and "5 messages consumed" in r.stdout
    assert "secretKey: \"devSecret1\"" in (tmp_path / "dev" / "plain_acl.yml").read_text()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=dict(env, ROCKETMQ_ACCESS_KEY="devAdmin1"))
    assert r.returncode == 1 and "ROCKETMQ_SECRET_KEY is not set" in r.stderr


def test_spark_source_and_sink_options_sign(cluster):
    """The Spark connector's driver and executor paths (plan_read, pull_range, write_rows:
    what source.py runs, here without a Spark session) sign with accessKey/secretKey."""
    pytest.importorskip("pyarrow")
    from pocketmq.spark.options import parse_reader_options, parse_writer_options
    from pocketmq.spark.plan import plan_read
    from pocketmq.spark.read import pull_range
    from pocketmq.spark.write import write_rows
    asyncio.run(ensure_topic(cluster, "AclT"))
    start = asyncio.run(max_offset(cluster, "AclT"))
    creds = {"accessKey": APP[0], "secretKey": APP[1]}
    w = parse_writer_options({"namesrvAddr": cluster.namesrv_addr, "topic": "AclT",
                              "producerGroup": uniq("SparkW"), **creds})
    assert write_rows(w, [{"body": f"spark-{i}".encode()} for i in range(10)]) == (10, 1)
    r = parse_reader_options({"namesrvAddr": cluster.namesrv_addr, "subscribe": "AclT",
                              "startingOffsets": f'{{"AclT": {{"broker-a:0": {start}}}}}', **creds})
    ranges = plan_read(r)
    got = sum(len(part) for rr in ranges for parts in pull_range(r.namesrv_addr, rr, "*", True,
                                                                 credentials=r.credentials) for part in parts)
    assert got == 10
    # without credentials the sink's sends are refused by name
    unsigned = parse_writer_options({"namesrvAddr": cluster.namesrv_addr, "topic": "AclT",
                                     "producerGroup": uniq("SparkW")}, environ={})
    with pytest.raises(RuntimeError, match="ACL denied a client without credentials.*No accessKey is configured"):
        write_rows(unsigned, [{"body": b"x"}])
