"""NameServer over real TCP on 127.0.0.1 (port 0), driven by RemotingClient and raw sockets."""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import signal
import struct
import sys
import zlib
from types import SimpleNamespace

import pytest

from pocketmq.nameserver.app import NameServer
from pocketmq.protocol.bodies import (DataVersion, TopicConfig, TopicRouteData, decode_cluster_info, dumps,
                             encode_register_broker_body, loads)
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient

TEST_TIMEOUT_S = 15
CLUSTER = "DefaultCluster"
BROKER_A = "127.0.0.1:10911"


def bounded(fn):
    """Every test runs under asyncio.wait_for."""
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        await asyncio.wait_for(fn(*args, **kwargs), TEST_TIMEOUT_S)
    return wrapper


class FakeClock:
    def __init__(self, now_ms: int = 1_000_000):
        self.now = now_ms

    def __call__(self) -> int:
        return self.now


def make_config(tmp_path, **over):
    d = dict(listenPort=0, kvConfigPath=str(tmp_path / "namesrv" / "kvConfig.json"),
             orderMessageEnable=False, rocketmqHome=str(tmp_path))
    d.update(over)
    try:
        from pocketmq.nameserver.config import NamesrvConfig
    except ImportError:  # stand-in with the same camelCase keys
        return SimpleNamespace(**d)
    return NamesrvConfig(**d)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
async def ns(tmp_path, clock):
    server = NameServer(make_config(tmp_path, orderMessageEnable=True), host="127.0.0.1", clock=clock)
    await asyncio.wait_for(server.start(), 5)
    try:
        yield server
    finally:
        await asyncio.wait_for(server.close(), 5)


@pytest.fixture
async def client():
    c = RemotingClient()
    try:
        yield c
    finally:
        await c.close()


def addr(ns) -> str:
    return f"127.0.0.1:{ns.port}"


def topic_table(*names, queues=4):
    return {n: TopicConfig(n, queues, queues, 6) for n in names}


def register_cmd(topics, version=DataVersion(1700000000000, 1), broker_name="broker-a",
                 broker_addr=BROKER_A, broker_id=0, cluster=CLUSTER, crc=True, body=None,
                 compressed=False):
    body = encode_register_broker_body(topics, version) if body is None else body
    ext = {"brokerName": broker_name, "brokerAddr": broker_addr, "clusterName": cluster,
           "haServerAddr": broker_addr.replace("10911", "10912"), "brokerId": str(broker_id),
           "compressed": "true" if compressed else "false",
           "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF) if crc else "0"}
    return RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=ext, body=body)


async def call(client, ns, code, ext=None, body=b""):
    return await client.invoke(addr(ns), RemotingCommand(code, ext_fields=ext or {}, body=body), 5)


def compressed_register_body(topics, version):
    """The broker's compressRegister form (reference 4.7)."""
    parts = []
    dv = dumps(version.to_json())
    parts.append(struct.pack(">i", len(dv)) + dv)
    parts.append(struct.pack(">i", len(topics)))
    for tc in topics.values():
        enc = f"{tc.topic_name} {tc.read_queue_nums} {tc.write_queue_nums} {tc.perm} {tc.topic_filter_type}".encode()
        parts.append(struct.pack(">i", len(enc)) + enc)
    fs = b"[]"
    parts.append(struct.pack(">i", len(fs)) + fs)
    return zlib.compress(b"".join(parts), 9)


@bounded
async def test_readiness_line(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pocketmq.namesrv")
    async with NameServer(make_config(tmp_path), host="127.0.0.1") as server:
        lines = [r.getMessage() for r in caplog.records if "boot success" in r.getMessage()]
        assert len(lines) == 1
        m = re.fullmatch(r"The Name Server boot success\. serializeType=JSON, address (\S+):(\d+)", lines[0])
        assert m and m.group(1) == "127.0.0.1" and int(m.group(2)) == server.port != 0


@bounded
async def test_register_route_cluster_and_topic_lists(ns, client):
    resp = await client.invoke(addr(ns), register_cmd(topic_table("TopicTest", "TBW102")), 5)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    assert resp.body == b""   # no ORDER_TOPIC_CONFIG namespace yet
    assert "masterAddr" not in resp.ext_fields

    resp = await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"})
    assert resp.code == ResponseCode.SUCCESS
    assert b'"brokerAddrs":{"0":"127.0.0.1:10911"}' in resp.body
    route = TopicRouteData.from_body(resp.body)
    assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas] == \
        [("broker-a", 4, 4, 6)]
    assert route.broker_datas[0].broker_addrs == {0: BROKER_A}
    assert route.order_topic_conf is None

    resp = await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Nope"})
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    assert resp.remark.startswith("No topic route info in name server for the topic: Nope")

    resp = await call(client, ns, RequestCode.GET_BROKER_CLUSTER_INFO)
    brokers, clusters = decode_cluster_info(resp.body)
    assert clusters == {CLUSTER: ["broker-a"]}
    assert brokers["broker-a"].broker_addrs == {0: BROKER_A}

    resp = await call(client, ns, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    assert loads(resp.body) == {"topicList": ["TBW102", "TopicTest"]}
    resp = await call(client, ns, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": CLUSTER})
    assert loads(resp.body) == {"topicList": ["TBW102", "TopicTest"]}
    resp = await call(client, ns, RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS)
    assert loads(resp.body) == {"brokerAddr": BROKER_A, "topicList": [CLUSTER, "broker-a"]}


@bounded
async def test_slave_registration_returns_master(ns, client):
    assert (await client.invoke(addr(ns), register_cmd(topic_table("T")), 5)).code == 0
    slave = "127.0.0.2:10911"
    resp = await client.invoke(addr(ns), register_cmd(topic_table("T"), broker_addr=slave, broker_id=1), 5)
    assert resp.code == 0
    assert resp.ext_fields == {"masterAddr": BROKER_A, "haServerAddr": "127.0.0.1:10912"}
    route = TopicRouteData.from_body((await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                 {"topic": "T"})).body)
    assert route.broker_datas[0].broker_addrs == {0: BROKER_A, 1: slave}


@bounded
async def test_register_crc_mismatch_compressed_and_bad_headers(ns, client):
    cmd = register_cmd(topic_table("T"))
    cmd.ext_fields["bodyCrc32"] = "12345"
    resp = await client.invoke(addr(ns), cmd, 5)
    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")

    body = compressed_register_body(topic_table("TZ", queues=8), DataVersion(5, 5))
    resp = await client.invoke(addr(ns), register_cmd({}, body=body, compressed=True), 5)
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    route = TopicRouteData.from_body((await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                 {"topic": "TZ"})).body)
    assert route.queue_datas[0].write_queue_nums == 8

    cmd = register_cmd(topic_table("T"))
    del cmd.ext_fields["brokerName"]
    resp = await client.invoke(addr(ns), cmd, 5)
    assert resp.code == ResponseCode.SYSTEM_ERROR and "brokerName" in resp.remark

    resp = await client.invoke(addr(ns), register_cmd({}, body=b"{garbage", crc=False), 5)
    assert resp.code == ResponseCode.SYSTEM_ERROR


@bounded
async def test_kv_round_trip_and_order_topic_conf(ns, client):
    ext = {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicTest", "value": "broker-a:8"}
    assert (await call(client, ns, RequestCode.PUT_KV_CONFIG, ext)).code == 0
    resp = await call(client, ns, RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG",
                                                              "key": "TopicTest"})
    assert resp.code == 0 and resp.ext_fields == {"value": "broker-a:8"}
    resp = await call(client, ns, RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"})
    assert loads(resp.body) == {"table": {"TopicTest": "broker-a:8"}}
    resp = await call(client, ns, RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "none"})
    assert resp.code == ResponseCode.QUERY_NOT_FOUND

    # REGISTER_BROKER answers with the ORDER_TOPIC_CONFIG namespace; routes carry orderTopicConf.
    resp = await client.invoke(addr(ns), register_cmd(topic_table("TopicTest")), 5)
    assert loads(resp.body) == {"table": {"TopicTest": "broker-a:8"}}
    route = TopicRouteData.from_body((await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                 {"topic": "TopicTest"})).body)
    assert route.order_topic_conf == "broker-a:8"

    assert (await call(client, ns, RequestCode.DELETE_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG",
                                                                   "key": "TopicTest"})).code == 0
    resp = await call(client, ns, RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG",
                                                              "key": "TopicTest"})
    assert resp.code == ResponseCode.QUERY_NOT_FOUND
    assert resp.remark == "No config item, Namespace: ORDER_TOPIC_CONFIG Key: TopicTest"


@bounded
async def test_kv_persisted_across_restart(tmp_path):
    config = make_config(tmp_path)
    c = RemotingClient()
    try:
        async with NameServer(config, host="127.0.0.1") as server:
            resp = await call(c, server, RequestCode.PUT_KV_CONFIG, {"namespace": "ns", "key": "k", "value": "v"})
            assert resp.code == 0
        await c.close()
        assert loads((tmp_path / "namesrv" / "kvConfig.json").read_bytes()) == {"configTable": {"ns": {"k": "v"}}}
        assert not (tmp_path / "namesrv" / "kvConfig.json.tmp").exists()
        c = RemotingClient()
        async with NameServer(config, host="127.0.0.1") as server:
            resp = await call(c, server, RequestCode.GET_KV_CONFIG, {"namespace": "ns", "key": "k"})
            assert resp.ext_fields == {"value": "v"}
    finally:
        await c.close()


@bounded
async def test_corrupt_kv_file_refuses_to_start(tmp_path):
    config = make_config(tmp_path)
    path = tmp_path / "namesrv" / "kvConfig.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"{not json")
    server = NameServer(config, host="127.0.0.1")
    with pytest.raises(Exception, match="kvConfig"):
        await server.start()
    await server.close()
    assert path.read_bytes() == b"{not json"   # never overwritten by an empty table


@bounded
async def test_admin_requests_and_string_headers(ns, client):
    await client.invoke(addr(ns), register_cmd(topic_table("T1", "T2")), 5)
    resp = await call(client, ns, RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert resp.code == 0 and resp.ext_fields == {"wipeTopicCount": "2"}
    route = TopicRouteData.from_body((await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                                 {"topic": "T1"})).body)
    assert route.queue_datas[0].perm == 4
    resp = await call(client, ns, RequestCode.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
    assert resp.ext_fields == {"addTopicCount": "2"}

    resp = await call(client, ns, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "T1"})
    assert resp.code == 0
    resp = await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"})
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST

    dv = DataVersion(1700000000000, 1)
    qext = {"brokerName": "broker-a", "brokerAddr": BROKER_A, "clusterName": CLUSTER, "brokerId": "0"}
    resp = await call(client, ns, RequestCode.QUERY_DATA_VERSION, qext, dumps(dv.to_json()))
    assert resp.code == 0 and resp.ext_fields == {"changed": "false"}
    assert DataVersion.from_json(loads(resp.body)) == dv
    resp = await call(client, ns, RequestCode.QUERY_DATA_VERSION, qext, dumps(DataVersion(1, 2).to_json()))
    assert resp.ext_fields == {"changed": "true"}

    resp = await call(client, ns, RequestCode.GET_NAMESRV_CONFIG)
    assert resp.code == 0
    assert "orderMessageEnable=true\n" in resp.body.decode()

    resp = await call(client, ns, RequestCode.UNREGISTER_BROKER, qext)
    assert resp.code == 0
    resp = await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T2"})
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST


@bounded
async def test_unknown_code_is_not_supported(ns, client):
    resp = await call(client, ns, 9999)
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    resp = await call(client, ns, RequestCode.SEND_MESSAGE)
    assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


@bounded
async def test_garbage_closes_only_that_connection(ns, client):
    assert (await client.invoke(addr(ns), register_cmd(topic_table("T")), 5)).code == 0
    reader, writer = await asyncio.open_connection("127.0.0.1", ns.port)
    try:
        writer.write(b"\xff\xff\xff\xffnot a rocketmq frame at all")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""   # closed by the server
    finally:
        writer.close()
    # The other connection (and the broker registered over it) still work.
    resp = await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    assert resp.code == ResponseCode.SUCCESS


@bounded
async def test_closed_registering_connection_removes_broker(ns, client):
    broker = RemotingClient()
    try:
        assert (await broker.invoke(addr(ns), register_cmd(topic_table("T")), 5)).code == 0
        resp = await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        assert resp.code == ResponseCode.SUCCESS
    finally:
        await broker.close()
    # Bounded polling: the close reaches the server asynchronously.
    for _ in range(200):
        resp = await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            break
        await asyncio.sleep(0.01)
    assert resp.code == ResponseCode.TOPIC_NOT_EXIST
    resp = await call(client, ns, RequestCode.GET_BROKER_CLUSTER_INFO)
    assert decode_cluster_info(resp.body) == ({}, {})


@bounded
async def test_expiry_scan_drops_silent_broker_and_closes_its_connection(ns, client, clock):
    broker = RemotingClient()
    try:
        assert (await broker.invoke(addr(ns), register_cmd(topic_table("T")), 5)).code == 0
        clock.now += 120_000
        assert ns.scan_not_active_broker() == []
        clock.now += 1
        removed = ns.scan_not_active_broker()
        assert [r.broker_addr for r in removed] == [BROKER_A]
        resp = await call(client, ns, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        assert resp.code == ResponseCode.TOPIC_NOT_EXIST
        for _ in range(200):   # the server closed the broker's connection
            if not broker.connections:
                break
            await asyncio.sleep(0.01)
        assert not broker.connections
    finally:
        await broker.close()


@bounded
async def test_idle_connection_closed_after_server_channel_max_idle_time(tmp_path):
    clock = FakeClock()
    config = make_config(tmp_path, serverChannelMaxIdleTimeSeconds=120)
    async with NameServer(config, host="127.0.0.1", clock=clock) as server:
        c = RemotingClient()
        try:
            resp = await call(c, server, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
            assert resp.code == 0
            assert server.close_idle_connections() == 0     # it just read: active now
            clock.now += 119_999
            assert server.close_idle_connections() == 0
            clock.now += 1
            assert server.close_idle_connections() == 1
            for _ in range(200):
                if not c.connections:
                    break
                await asyncio.sleep(0.01)
            assert not c.connections
            # A fresh connection works; reconnect is on demand.
            assert (await call(c, server, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).code == 0
        finally:
            await c.close()


@bounded
async def test_main_config_error_exits_2(capsys):
    pytest.importorskip("pocketmq.nameserver.config")
    from pocketmq.nameserver.__main__ import main
    assert main(["--noSuchKey=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mqnamesrv: ") and "noSuchKey" in err


@bounded
async def test_mqnamesrv_process_ready_line_and_sigterm(tmp_path):
    pytest.importorskip("pocketmq.nameserver.config")
    kv_path = tmp_path / "kv" / "kvConfig.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pocketmq.nameserver", "--listenPort=0", f"--kvConfigPath={kv_path}",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    c = RemotingClient()
    try:
        port = None
        lines = []
        while port is None:
            line = (await asyncio.wait_for(proc.stderr.readline(), 10)).decode()
            assert line, "mqnamesrv exited before it was ready:\n" + "".join(lines)
            lines.append(line)
            m = re.search(r"The Name Server boot success\. serializeType=JSON, address (\S+):(\d+)", line)
            if m:
                port = int(m.group(2))
        assert port != 0
        ns_addr = f"127.0.0.1:{port}"
        resp = await c.invoke(ns_addr, RemotingCommand(RequestCode.PUT_KV_CONFIG, ext_fields={
            "namespace": "ns", "key": "k", "value": "v"}), 5)
        assert resp.code == 0
        await c.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        assert loads(kv_path.read_bytes()) == {"configTable": {"ns": {"k": "v"}}}
    finally:
        await c.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
