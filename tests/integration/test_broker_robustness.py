"""Misbehaving clients and bad files: the broker answers, bounds itself, keeps its data."""
import asyncio
import json
import time

import pytest

from pocketmq.broker.app import MetadataError
from pocketmq.protocol import bodies
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand, encode
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import send_cmd
from tests.support.local import local_cluster

pytestmark = pytest.mark.asyncio


async def test_a_client_that_does_not_read_is_not_buffered_without_bound(tmp_path):
    async with local_cluster(str(tmp_path)) as (ns, broker):
        host, port = broker.addr.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        frame = encode(RemotingCommand(R.GET_ALL_TOPIC_CONFIG, opaque=1))   # ~2 KB reply each
        peak = 0
        for _ in range(40):
            writer.write(frame * 1000)
            try:
                await asyncio.wait_for(writer.drain(), 0.2)
            except asyncio.TimeoutError:
                pass   # the broker stopped reading us: that is the point
            for conn in broker.server.connections:
                if conn.transport is not None:
                    peak = max(peak, conn.transport.get_write_buffer_size())
        # 40,000 requests x ~2 KB = ~80 MB of replies if nothing pushed back.
        assert peak < 16 * 1024 * 1024, peak
        writer.close()
        c = RemotingClient()
        try:
            r = await c.invoke(broker.addr, RemotingCommand(R.GET_MAX_OFFSET, ext_fields={"topic": "T", "queueId": "0"}))
            assert r.code == C.SUCCESS
        finally:
            await c.close()


async def test_corrupt_metadata_refuses_start_and_keeps_the_file(tmp_path):
    async with local_cluster(str(tmp_path)) as (ns, broker):
        pass
    path = tmp_path / "store" / "config" / "consumerOffset.json"
    path.write_bytes(b'{"offsetTable":{"T@G":{0:')
    with pytest.raises(MetadataError, match="consumerOffset.json"):
        async with local_cluster(str(tmp_path)):
            pass
    assert path.read_bytes() == b'{"offsetTable":{"T@G":{0:'


async def test_heartbeat_creating_many_groups_does_not_stall_the_broker(tmp_path):
    async with local_cluster(str(tmp_path)) as (ns, broker):
        hb = bodies.HeartbeatData("c@1", [], [bodies.ConsumerData(f"G{i}", subscription_data_set=[
            bodies.build_subscription("T", "*")]) for i in range(500)])
        c = RemotingClient()
        try:
            t0 = time.perf_counter()
            r = await c.invoke(broker.addr, RemotingCommand(R.HEART_BEAT, body=bodies.dumps(hb.to_json())), 10)
            assert r.code == C.SUCCESS
            assert time.perf_counter() - t0 < 0.5
            path = tmp_path / "store" / "config" / "topics.json"
            for _ in range(100):   # written shortly after, off the event loop
                if path.exists() and "%RETRY%G499" in path.read_text():
                    break
                await asyncio.sleep(0.05)
            assert "%RETRY%G499" in json.loads(path.read_text())["topicConfigTable"]
        finally:
            await c.close()


async def test_offset_commits_only_for_real_queues(tmp_path):
    async with local_cluster(str(tmp_path)) as (ns, broker):
        c = RemotingClient()
        try:
            assert (await c.invoke(broker.addr, send_cmd("TO", b"x"))).code == C.SUCCESS
            ok = {"consumerGroup": "G", "topic": "TO", "queueId": "0", "commitOffset": "1"}
            assert (await c.invoke(broker.addr, RemotingCommand(R.UPDATE_CONSUMER_OFFSET, ext_fields=ok))).code == 0
            bad_topic = dict(ok, topic="Made_Up")
            r = await c.invoke(broker.addr, RemotingCommand(R.UPDATE_CONSUMER_OFFSET, ext_fields=bad_topic))
            assert r.code == C.TOPIC_NOT_EXIST
            r = await c.invoke(broker.addr, RemotingCommand(R.UPDATE_CONSUMER_OFFSET, ext_fields=dict(ok, queueId="999")))
            assert r.code == C.SYSTEM_ERROR
            assert broker.offsets.topics_of_group("G") == {"TO"}
        finally:
            await c.close()


async def test_pull_during_shutdown_is_answered_not_parked(tmp_path):
    from tests.integration.test_broker import pull_cmd
    async with local_cluster(str(tmp_path)) as (ns, broker):
        c = RemotingClient()
        try:
            assert (await c.invoke(broker.addr, send_cmd("TS", b"x"))).code == C.SUCCESS
            broker.closing = True
            t0 = time.perf_counter()
            r = await c.invoke(broker.addr, pull_cmd("TS", 0, 1, suspend_ms=10000), 5)
            assert r.code == C.PULL_NOT_FOUND and time.perf_counter() - t0 < 1
            assert broker.held_pulls.count == 0
        finally:
            broker.closing = False
            await c.close()
