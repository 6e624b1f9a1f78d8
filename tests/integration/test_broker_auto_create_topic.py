"""A send that auto-creates its topic is answered only once the topic is durable and
routable (Java 4.9's createTopicInSendMessageMethod): topics.json written, every
nameserver told, bounded when a nameserver does not answer."""
import asyncio
import json
import logging
import os

import pytest

from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import pull_cmd, send_cmd
from tests.support.daemons import Cluster
from tests.support.local import local_cluster

pytestmark = pytest.mark.asyncio


def topics_on_disk(root: str) -> dict:
    with open(os.path.join(root, "store", "config", "topics.json"), "rb") as f:
        return json.loads(f.read())["topicConfigTable"]


async def test_route_and_topics_json_exist_when_the_send_is_answered(tmp_path):
    async with local_cluster(str(tmp_path)) as (ns, broker):
        c = RemotingClient()
        c.set_namesrv_addr(ns)
        try:
            r = await c.invoke(broker.addr, send_cmd("AutoRoute", b"first"))
            assert r.code == C.SUCCESS, r.remark
            # No waiting: both were done before the answer.
            assert "AutoRoute" in topics_on_disk(str(tmp_path))
            route = await c.invoke_namesrv(RemotingCommand(R.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "AutoRoute"}))
            assert route.code == C.SUCCESS, route.remark
            assert broker.unpublished_topics == set()
            # Many concurrent first sends to new topics: all answered, all routed, all on disk.
            names = [f"AutoMany{i}" for i in range(12)]
            rs = await asyncio.gather(*(c.invoke(broker.addr, send_cmd(t, b"x")) for t in names for _ in range(2)))
            assert {x.code for x in rs} == {C.SUCCESS}
            assert set(names) <= set(topics_on_disk(str(tmp_path)))
            for t in names:
                route = await c.invoke_namesrv(RemotingCommand(R.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": t}))
                assert route.code == C.SUCCESS, (t, route.remark)
                got = await c.invoke(broker.addr, pull_cmd(t, int(rs[names.index(t) * 2].ext_fields["queueId"]), 0))
                assert got.code == C.SUCCESS
        finally:
            await c.close()


async def test_a_silent_nameserver_delays_the_answer_only_up_to_the_register_timeout(tmp_path, caplog):
    accepted = []

    async def silent(reader, writer):   # accepts, reads, never answers
        accepted.append(writer)
        await reader.read()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    silent_addr = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with local_cluster(str(tmp_path), "-n", silent_addr, "--registerBrokerTimeoutMills=300",
                                 with_namesrv=False) as (_, broker):
            c = RemotingClient()
            try:
                caplog.clear()
                with caplog.at_level(logging.WARNING, logger="pocketmq.broker"):
                    r = await asyncio.wait_for(c.invoke(broker.addr, send_cmd("AutoSilent", b"x"), 10), 10)
                assert r.code == C.SUCCESS, r.remark
                assert any("register to nameserver " + silent_addr in m and "TimeoutError" in m
                           for m in caplog.messages), caplog.messages
                assert "AutoSilent" in topics_on_disk(str(tmp_path))
                assert broker.topics.get("AutoSilent") is not None
            finally:
                await c.close()
    finally:
        for w in accepted:
            w.close()
        server.close()


async def test_the_send_is_refused_when_topics_json_cannot_be_written(tmp_path, monkeypatch):
    from pocketmq.broker import app

    async with local_cluster(str(tmp_path)) as (ns, broker):
        def failing(path, data):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(app, "_write_atomic", failing)
        c = RemotingClient()
        try:
            r = await c.invoke(broker.addr, send_cmd("AutoNoDisk", b"x"))
            assert r.code == C.SYSTEM_ERROR and "AutoNoDisk" in r.remark and "No space left" in r.remark
            assert broker.store.get_max_offset_in_queue("AutoNoDisk", 0) == 0   # nothing stored
            monkeypatch.undo()
            r = await c.invoke(broker.addr, send_cmd("AutoNoDisk", b"x", queue_id=0))
            assert r.code == C.SUCCESS, r.remark
            assert "AutoNoDisk" in topics_on_disk(str(tmp_path))
        finally:
            await c.close()


async def test_a_broker_killed_right_after_an_auto_creating_send_keeps_the_topic(tmp_path):
    cluster = Cluster(str(tmp_path / "c"))
    await asyncio.to_thread(cluster.start)
    c = RemotingClient()
    try:
        r = await c.invoke(cluster.broker_addr, send_cmd("AutoKilled", b"kept", queue_id=1))
        assert r.code == C.SUCCESS, r.remark
        await asyncio.to_thread(cluster.restart_broker, True)   # SIGKILL, then start again
        await c.close()
        c = RemotingClient()
        r = await c.invoke(cluster.broker_addr, RemotingCommand(R.GET_ALL_TOPIC_CONFIG))
        assert "AutoKilled" in json.loads(r.body)["topicConfigTable"]
        got = await c.invoke(cluster.broker_addr, pull_cmd("AutoKilled", 1, 0))
        assert got.code == C.SUCCESS
    finally:
        await c.close()
        await asyncio.to_thread(cluster.stop)
