"""A slave's metadata sync and a returning master's take-back of offsets under plain ACL:
master and slave both run aclEnable; the requests (GET_ALL_TOPIC_CONFIG,
GET_ALL_SUBSCRIPTIONGROUP_CONFIG, GET_ALL_CONSUMER_OFFSET, GET_ALL_DELAY_OFFSET) need only a
valid signature (no admin, no topic or group permission: common/acl.py checks no resource
for them), so the sync account here is a plain one with every default DENY. Unsigned, the
master refuses them and the slave keeps its tables."""
from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from pocketmq.broker.core.offsets import ConsumerOffsetManager
from pocketmq.broker.services.slave_sync import take_back_offsets
from pocketmq.protocol.acl import sign_request
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_replication_metadata import NAME, start_broker, start_ns

pytestmark = pytest.mark.asyncio

ADMIN = ("adminUser", "adminSecret1")
SYNC = ("brokerSync1", "brokerSyncSecret1")
ACL_YML = f"""\
globalWhiteRemoteAddresses: [10.250.250.*]
accounts:
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
  - accessKey: {SYNC[0]}
    secretKey: {SYNC[1]}
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
"""
TOPIC, GROUP = "AclSyncT", "AclSyncG"


def acl_args(root, creds=SYNC) -> list[str]:
    path = os.path.join(str(root), "plain_acl.yml")
    with open(path, "w") as f:
        f.write(ACL_YML)
    args = ["--aclEnable=true", f"--aclFilePath={path}"]
    if creds:
        args += [f"--accessKey={creds[0]}", f"--secretKey={creds[1]}"]
    return args


async def admin_call(client, addr, code, ext=None, body=b"") -> RemotingCommand:
    cmd = RemotingCommand(code, ext_fields=sign_request(ext or {}, body, *ADMIN), body=body)
    resp = await client.invoke(addr, cmd, 3.0)
    assert resp.code == C.SUCCESS, (code, resp.remark)
    return resp


async def create_topic_and_commit(client, master, offset: int) -> None:
    await admin_call(client, master.addr, R.UPDATE_AND_CREATE_TOPIC, {
        "topic": TOPIC, "defaultTopic": "TBW102", "readQueueNums": "2", "writeQueueNums": "2", "perm": "6",
        "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})
    await admin_call(client, master.addr, R.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": GROUP, "topic": TOPIC, "queueId": "1", "commitOffset": str(offset)})


async def wait_synced(slave, rounds: int = 2) -> None:
    for _ in range(rounds):
        await asyncio.wait_for(slave.slave_sync.synced(), 10)


@contextlib.asynccontextmanager
async def acl_pair(tmp_path, ns, slave_creds=None):
    """An ACL master (signing as ADMIN) and its ACL slave (`slave_creds` in its config)."""
    master = await start_broker(f"{tmp_path}/m", ns, *acl_args(tmp_path, ADMIN))
    slave = await start_broker(f"{tmp_path}/s", ns, "--brokerRole=SLAVE", "--brokerId=1",
                               *acl_args(tmp_path, slave_creds))
    try:
        yield master, slave
    finally:
        await slave.close()
        await master.close()


@pytest.fixture
async def ns(tmp_path):
    server, addr = await start_ns(tmp_path)
    yield addr
    await server.close()


@pytest.fixture
async def client():
    c = RemotingClient()
    yield c
    await c.close()


async def test_unsigned_sync_is_refused_by_an_acl_master(tmp_path, ns, client):
    async with acl_pair(tmp_path, ns) as (master, slave):
        await create_topic_and_commit(client, master, 7)
        await wait_synced(slave)
        failures = slave.slave_sync.last_failures
        assert set(failures) == {"topics", "groups", "consumer offsets", "delay offsets"}, failures
        assert all("No accessKey is configured" in v for v in failures.values()), failures
        assert TOPIC not in slave.topics.topics


async def test_signed_sync_copies_topics_and_offsets(tmp_path, ns, client):
    """The slave's service signs with the credentials it is given (here set on the service,
    as the broker's own accessKey/secretKey would be)."""
    async with acl_pair(tmp_path, ns) as (master, slave):
        slave.slave_sync.credentials = SYNC
        await create_topic_and_commit(client, master, 11)
        await wait_synced(slave)
        assert slave.slave_sync.last_failures == {}
        assert TOPIC in slave.topics.topics
        assert slave.offsets.table[f"{TOPIC}@{GROUP}"][1] == 11


async def test_slave_with_broker_credentials_syncs_from_acl_master(tmp_path, ns, client):
    async with acl_pair(tmp_path, ns, SYNC) as (master, slave):
        await create_topic_and_commit(client, master, 13)
        await wait_synced(slave)
        assert slave.slave_sync.last_failures == {}
        assert TOPIC in slave.topics.topics
        assert slave.offsets.table[f"{TOPIC}@{GROUP}"][1] == 13


async def test_take_back_offsets_from_an_acl_slave(tmp_path, ns, client):
    """A returning master asks its ACL slave for offsets: refused unsigned, taken signed."""
    async with acl_pair(tmp_path, ns) as (master, slave):
        slave.slave_sync.credentials = SYNC
        await create_topic_and_commit(client, master, 5)
        await wait_synced(slave)
        # committed to the slave while the master is "away" (a consumer reading from it)
        slave.offsets.commit(GROUP, TOPIC, 1, 42)
        own = ConsumerOffsetManager()
        own.commit(GROUP, TOPIC, 1, 5)
        assert await take_back_offsets(ns, NAME, master.addr, own) == 0          # unsigned: refused
        assert own.table[f"{TOPIC}@{GROUP}"][1] == 5
        assert await take_back_offsets(ns, NAME, master.addr, own, credentials=SYNC) == 1
        assert own.table[f"{TOPIC}@{GROUP}"][1] == 42
