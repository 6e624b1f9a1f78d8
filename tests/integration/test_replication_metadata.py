"""Replication's metadata with real brokers in-process: a master and a slave of one
brokerName on one nameserver, over TCP. The slave copies its master's topics, groups,
consumer offsets and delay offsets (into memory too) and keeps them while the master is
down; a master coming back takes the offsets committed to its slave meanwhile, never
lowering its own. Periods are shortened with slaveSyncIntervalMillis; every wait is an
awaited round (SlaveSyncService.synced) or a bounded poll."""
from __future__ import annotations

import asyncio
import json
import os
import time
import zlib

import pytest

from pocketmq.broker.app import Broker
from pocketmq.broker.config import parse_args as broker_args
from pocketmq.broker.core.offsets import ConsumerOffsetManager
from pocketmq.broker.services.slave_sync import take_back_offsets
from pocketmq.nameserver.app import NameServer
from pocketmq.nameserver.config import parse_args as ns_args
from pocketmq.protocol import bodies
from pocketmq.protocol.bodies import DataVersion, SubscriptionGroupConfig
from pocketmq.protocol.codes import RequestCode as R
from pocketmq.protocol.codes import ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import send_cmd

pytestmark = pytest.mark.asyncio

NAME = "broker-r"
LEVELS = "--messageDelayLevel=1s 1s 1s"
SYNC_MS = "--slaveSyncIntervalMillis=100"


async def start_broker(root: str, ns_addr: str, *extra: str) -> Broker:
    cfg, _ = broker_args(["--listenPort=0", "--brokerIP1=127.0.0.1", f"--storePathRootDir={root}",
                          "--mappedFileSizeCommitLog=1048576", "--mappedFileSizeConsumeQueue=2000",
                          f"--brokerName={NAME}", "-n", ns_addr, "--registerNameServerPeriod=1000", LEVELS,
                          SYNC_MS, *extra])
    broker = Broker(cfg)
    await broker.start()
    return broker


async def start_ns(tmp_path) -> tuple[NameServer, str]:
    cfg, _ = ns_args(["--listenPort=0", f"--kvConfigPath={tmp_path}/kv.json"])
    ns = NameServer(cfg)
    await ns.start()
    return ns, f"127.0.0.1:{ns.port}"


def start_master(tmp_path, ns_addr):
    return start_broker(f"{tmp_path}/master", ns_addr)


def start_slave(tmp_path, ns_addr):
    return start_broker(f"{tmp_path}/slave", ns_addr, "--brokerRole=SLAVE", "--brokerId=1")


@pytest.fixture
async def cluster(tmp_path):
    """(ns_addr, master, slave, client, brokers): `brokers` is closed at the end (a test may
    replace its master)."""
    ns, ns_addr = await start_ns(tmp_path)
    brokers: list[Broker] = []
    client = RemotingClient()
    try:
        brokers.append(await start_master(tmp_path, ns_addr))
        brokers.append(await start_slave(tmp_path, ns_addr))
        assert brokers[1].master_addr == brokers[0].addr     # learnt from the registration
        yield ns_addr, brokers[0], brokers[1], client, brokers
    finally:
        await client.close()
        for b in reversed(brokers):
            if not b.closing:
                await b.close()
        await ns.close()


async def synced(slave: Broker, rounds: int = 1) -> None:
    async with asyncio.timeout(10):
        for _ in range(rounds):
            await slave.slave_sync.synced()


async def call(client, addr, code, ext=None, body=b""):
    return await client.invoke(addr, RemotingCommand(code, ext_fields=ext or {}, body=body), 5)


async def commit(client, addr, group, topic, qid, offset):
    r = await call(client, addr, R.UPDATE_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                                            "queueId": str(qid), "commitOffset": str(offset)})
    assert r.code == C.SUCCESS, r.remark


async def query(client, addr, group, topic, qid) -> int:
    r = await call(client, addr, R.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic,
                                                           "queueId": str(qid)})
    return int(r.ext_fields["offset"]) if r.code == C.SUCCESS else -1


async def create_topic_and_group(client, master):
    r = await call(client, master.addr, R.UPDATE_AND_CREATE_TOPIC,
                   {"topic": "TR", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"})
    assert r.code == C.SUCCESS, r.remark
    r = await call(client, master.addr, R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                   body=bodies.dumps(SubscriptionGroupConfig("GR", retryMaxTimes=5).to_json()))
    assert r.code == C.SUCCESS, r.remark


def config_file(broker: Broker, name: str) -> dict:
    with open(os.path.join(broker.root, "config", name), "rb") as f:
        return bodies.loads(f.read())


async def test_topic_group_and_offsets_created_on_the_master_appear_on_the_slave(cluster):
    ns_addr, master, slave, client, _ = cluster
    await create_topic_and_group(client, master)
    await commit(client, master.addr, "GR", "TR", 2, 17)
    await synced(slave)
    # in memory, over the wire and on disk
    assert slave.topics.get("TR") == master.topics.get("TR")
    assert slave.topics.data_version == master.topics.data_version
    assert slave.groups.table["GR"].retryMaxTimes == 5
    assert await query(client, slave.addr, "GR", "TR", 2) == 17
    r = await call(client, slave.addr, R.GET_ALL_TOPIC_CONFIG)
    assert "TR" in json.loads(r.body)["topicConfigTable"]
    assert "TR" in config_file(slave, "topics.json")["topicConfigTable"]
    assert "GR" in config_file(slave, "subscriptionGroup.json")["subscriptionGroupTable"]
    assert config_file(slave, "consumerOffset.json")["offsetTable"]["TR@GR"] == {"2": 17}
    # a later commit on the master follows; the master wins over the slave's copy
    await commit(client, master.addr, "GR", "TR", 2, 18)
    await synced(slave)
    assert slave.offsets.query("GR", "TR", 2) == 18


async def test_delay_offsets_reach_the_slaves_memory(cluster):
    ns_addr, master, slave, client, _ = cluster
    await create_topic_and_group(client, master)
    r = await client.invoke(master.addr, send_cmd("TR", b"later", props={"DELAY": "1"}))
    assert r.code == C.SUCCESS, r.remark
    async with asyncio.timeout(10):                  # delivered by the master after 1 s
        while master.schedule_cursors.get(1) < 1:
            await asyncio.sleep(0.05)
    # the master serves them (GET_ALL_DELAY_OFFSET, delayOffset.json's form)
    r = await call(client, master.addr, R.GET_ALL_DELAY_OFFSET)
    assert r.code == C.SUCCESS and bodies.decode_delay_offset_wrapper(r.body)[1] == 1
    await synced(slave)
    assert slave.schedule_cursors.get(1) == 1                       # memory, not only the file
    r = await call(client, slave.addr, R.GET_ALL_DELAY_OFFSET)      # so the slave serves them too
    assert bodies.decode_delay_offset_wrapper(r.body) == master.schedule_cursors.offsets
    assert config_file(slave, "delayOffset.json")["offsetTable"]["1"] == 1


async def test_a_slave_keeps_its_tables_while_the_master_is_down(cluster):
    ns_addr, master, slave, client, _ = cluster
    await create_topic_and_group(client, master)
    await commit(client, master.addr, "GR", "TR", 0, 5)
    master.schedule_cursors.advance(2, 3)
    await synced(slave)
    before = (dict(slave.topics.topics), dict(slave.groups.table), {k: dict(v) for k, v in slave.offsets.table.items()},
              dict(slave.schedule_cursors.offsets))
    assert "TR" in before[0] and before[3][2] == 3
    await master.close()
    await synced(slave, rounds=3)
    assert set(slave.slave_sync.last_failures) == {"topics", "groups", "consumer offsets", "delay offsets"}
    after = (dict(slave.topics.topics), dict(slave.groups.table), {k: dict(v) for k, v in slave.offsets.table.items()},
             dict(slave.schedule_cursors.offsets))
    assert after == before
    assert await query(client, slave.addr, "GR", "TR", 0) == 5
    assert "TR" in config_file(slave, "topics.json")["topicConfigTable"]


async def test_a_returning_master_takes_the_slaves_newer_offsets_back(cluster, tmp_path):
    ns_addr, master, slave, client, brokers = cluster
    await create_topic_and_group(client, master)
    await commit(client, master.addr, "GR", "TR", 0, 40)
    await commit(client, master.addr, "GR", "TR", 1, 10)
    await synced(slave)
    assert slave.offsets.query("GR", "TR", 0) == 40
    await master.close()
    # consumers commit to the slave while the master is away: q1 and q3 move on; q0 is
    # committed backwards there, which must not lower the master's
    await commit(client, slave.addr, "GR", "TR", 1, 25)
    await commit(client, slave.addr, "GR", "TR", 3, 7)
    await commit(client, slave.addr, "GR", "TR", 0, 30)
    t0 = time.monotonic()
    master = await start_master(tmp_path, ns_addr)
    brokers.append(master)
    assert time.monotonic() - t0 < 5
    # before its first request was served, and on disk
    assert [master.offsets.query("GR", "TR", q) for q in range(4)] == [40, 25, -1, 7]
    assert config_file(master, "consumerOffset.json")["offsetTable"]["TR@GR"] == {"0": 40, "1": 25, "3": 7}
    assert await query(client, master.addr, "GR", "TR", 1) == 25
    # the slave follows the new master (new port) and gets the same values back, not older ones
    async with asyncio.timeout(10):
        while slave.master_addr != master.addr:
            await asyncio.sleep(0.05)
    await synced(slave)
    assert [slave.offsets.query("GR", "TR", q) for q in range(4)] == [40, 25, -1, 7]


async def test_a_master_without_a_slave_starts_as_before(tmp_path):
    ns, ns_addr = await start_ns(tmp_path)
    try:
        master = await start_master(tmp_path, ns_addr)
        try:
            assert master.offsets.table == {} and master.slave_sync is None
        finally:
            await master.close()
    finally:
        await ns.close()


async def test_take_back_from_a_slave_that_never_answers_is_bounded(tmp_path):
    """A slave listed by the nameserver accepts the connection and answers nothing: the
    master goes on at its deadline with its own offsets."""
    ns, ns_addr = await start_ns(tmp_path)
    accepted = []
    silent = await asyncio.start_server(lambda r, w: accepted.append(w), "127.0.0.1", 0)
    silent_addr = f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    client = RemotingClient()
    try:
        body = bodies.encode_register_broker_body({}, DataVersion(1, 1))
        r = await call(client, ns_addr, R.REGISTER_BROKER, {
            "brokerName": NAME, "brokerAddr": silent_addr, "clusterName": "DefaultCluster",
            "haServerAddr": silent_addr, "brokerId": "1", "compressed": "false",
            "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)}, body)
        assert r.code == C.SUCCESS, r.remark
        offsets = ConsumerOffsetManager()
        offsets.commit("G", "T", 0, 3)
        t0 = time.monotonic()
        assert await take_back_offsets(ns_addr, NAME, "127.0.0.1:1", offsets, timeout_s=0.3) == 0
        assert time.monotonic() - t0 < 1.5
        assert accepted and offsets.table == {"T@G": {0: 3}}
    finally:
        await client.close()
        for w in accepted:
            w.close()
        silent.close()
        await silent.wait_closed()
        await ns.close()
