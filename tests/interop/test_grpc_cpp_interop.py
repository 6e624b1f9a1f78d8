"""Mixed protocols through one broker: the Apache C++ client (PyPI `rocketmq` 0.4.4, 4.x
remoting, tests/interop/cpp_agent.py), the official RocketMQ 5.x Python client (gRPC,
rocketmq-python-client 5.1.2 in its own venv, tests/support/rmq5.py) and pocketmq's own
client (remoting).

* a C++ producer's messages received by a 5.x SimpleConsumer (POP over gRPC): bodies,
  tags, keys and user properties as the C++ client set them;
* a 5.x producer's messages consumed by our PushConsumer and by the C++ push consumer
  (pulls over remoting, two groups): the 5.x message id is the 4.x msg id (UNIQ_KEY).
"""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("grpc", reason="the grpc extra (pip install pocketmq[grpc]) is not installed")

from pocketmq.client.push_consumer import CONSUME_SUCCESS, PushConsumer  # noqa: E402
from tests.integration.test_client_cluster import uniq  # noqa: E402
from tests.support.events import Sink  # noqa: E402
from tests.support.rmq5 import rmq5_python_fixture  # noqa: E402,F401 (the fixture rmq5_python)
from tests.support.rmq5 import proxy_cluster, run_driver  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = proxy_cluster(str(tmp_path_factory.mktemp("grpccpp")))
    c.start()
    yield c
    c.stop()


async def driver(python, cluster, scenario, **args):
    return await asyncio.to_thread(run_driver, python, cluster.grpc_endpoint, scenario, **args)


async def test_cpp_producer_to_rmq5_simple_consumer(cluster, agent, rmq5_python):
    topic = uniq("CppToRmq5")
    sent = await asyncio.to_thread(agent.run, "produce", "--ns", cluster.namesrv_addr, "--topic", topic,
                                   "--mode", "sync", "--count", "5", "--prefix", "cpp")
    assert len([e for e in sent if e["event"] == "sent"]) == 5
    events = await driver(rmq5_python, cluster, "receive", topic=topic, group=uniq("GCpp"), expect=5)
    msgs = {e["body"]: e for e in events if e["event"] == "msg"}
    assert sorted(msgs) == [f"cpp-{i}" for i in range(5)]
    for i in range(5):
        m = msgs[f"cpp-{i}"]
        assert (m["tag"], m["keys"], m["attempt"], m["corrupted"]) == ("TagA", [f"key-{i}"], 1, False)
        assert m["props"]["idx"] == str(i) and m["props"]["origin"] == "cpp"
    assert [e["event"] for e in events].count("acked") == 5


async def test_rmq5_producer_to_our_push_consumer_and_the_cpp_push_consumer(cluster, agent, rmq5_python):
    topic = uniq("Rmq5ToRemoting")
    specs = [{"body": f"v5-{i}", "tag": "TagA", "keys": [f"k{i}"], "props": {"idx": str(i)}} for i in range(5)]
    sent = await driver(rmq5_python, cluster, "send", topic=topic, messages=specs)
    ids = {f"v5-{i}": e["message_id"] for i, e in enumerate(sent)}
    got = Sink()

    async def listener(msg):
        got.append(msg)
        return CONSUME_SUCCESS

    ours = PushConsumer(uniq("GOurs"), cluster.namesrv_addr, listener=listener, consume_from_where="FIRST_OFFSET")
    ours.subscribe(topic, "TagA")
    async with ours:
        async with asyncio.timeout(30):
            await got.until(lambda s: len(s) >= 5)
    assert sorted(m.body.decode() for m in got) == sorted(ids)
    for m in got:
        assert m.msg_id == ids[m.body.decode()] and m.tags == "TagA" and m.properties["idx"] == m.body.decode()[3:]
    cpp = await asyncio.to_thread(agent.run, "push", "--ns", cluster.namesrv_addr, "--group", uniq("GCppPush"),
                                  "--topic", topic, "--expect", "5", "--seconds", "60", "--linger", "1")
    msgs = [e for e in cpp if e["event"] == "msg"]
    assert sorted(m["body"] for m in msgs) == sorted(ids)
    for m in msgs:
        assert m["tags"] == "TagA" and m["props"]["idx"] == m["body"][3:] and m["keys"] == f"k{m['body'][3:]}"
        assert m["props"]["UNIQ_KEY"] == ids[m["body"]]
