"""Our client against real daemons running plain ACL (tests/integration/test_acl_broker.py's
cluster: broker and nameserver with aclEnable): credentials= signs every request of the
producers and consumers (brokers and nameservers), and each deny is an AclDeniedError that
names the account and the reason, with nothing stored."""
from __future__ import annotations

import asyncio

import pytest

from pocketmq.client import CONSUME_SUCCESS, LitePullConsumer, Message, Producer, PushConsumer
from pocketmq.client import sync
from pocketmq.client.errors import AclDeniedError
from pocketmq.client.instance import ClientInstance
from pocketmq.client.transaction_producer import LocalTransactionState, TransactionProducer
from pocketmq.protocol.bodies import MessageQueue, TopicConfig
from tests.integration.test_acl_broker import ADMIN, APP, start_acl_cluster
from tests.integration.test_client_cluster import uniq

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
