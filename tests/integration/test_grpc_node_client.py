"""The gRPC endpoint driven by the REAL official RocketMQ 5.x Node.js client,
rocketmq-client-nodejs 1.0.8 (npm, installed in a cache dir of its own and run in a node
subprocess: tests/support/node_rmq5.py): its Producer and SimpleConsumer against real
nameserver and broker processes; what it sends is also consumed over the 4.x remoting
protocol by our LitePullConsumer."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("grpc", reason="the grpc extra (pip install pocketmq[grpc]) is not installed")

from pocketmq.protocol import message as msgcodec  # noqa: E402
from tests.integration.test_client_cluster import uniq  # noqa: E402
from tests.integration.test_grpc_rmq5_client import consume  # noqa: E402
from tests.support.node_rmq5 import node_rmq5_fixture  # noqa: E402,F401 (the fixture node_rmq5)
from tests.support.node_rmq5 import run_node_driver  # noqa: E402
from tests.support.rmq5 import proxy_cluster  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = proxy_cluster(str(tmp_path_factory.mktemp("grpcnode")))
    c.start()
    yield c
    c.stop()


async def node(node_dir, cluster, scenario, **args):
    return await asyncio.to_thread(run_node_driver, node_dir, cluster.grpc_endpoint, scenario, **args)


async def test_node_producer_and_simple_consumer(cluster, node_rmq5):
    topic, group = uniq("NodeT"), uniq("NodeG")
    specs = [{"body": "n0", "tag": "TagA", "keys": ["k0"], "props": {"color": "red"}},
             {"body": "n1", "tag": "TagB"},
             {"body": "n2", "tag": "TagA", "group": "order-7"}]
    sent = await node(node_rmq5, cluster, "send", topic=topic, messages=specs)
    assert [e["i"] for e in sent] == [0, 1, 2] and len({e["message_id"] for e in sent}) == 3
    # as Java's proxy answers (the client's own tests check both): the transaction id of any
    # send is its message id; a FIFO message shows its group as the __SHARDINGKEY property
    assert all(e["transaction_id"] == e["message_id"] for e in sent)
    events = await node(node_rmq5, cluster, "receive", topic=topic, group=group, expect=2, tag="TagA")
    msgs = {e["body"]: e for e in events if e["event"] == "msg"}
    assert sorted(msgs) == ["n0", "n2"] and [e["event"] for e in events].count("acked") == 2
    n0, n2 = msgs["n0"], msgs["n2"]
    assert (n0["message_id"], n0["tag"], n0["keys"], n0["props"], n0["attempt"], n0["corrupted"]) == \
        (sent[0]["message_id"], "TagA", ["k0"], {"color": "red"}, 1, False)
    assert n2["message_group"] == "order-7" and n2["message_id"] == sent[2]["message_id"]
    assert n2["props"] == {"__SHARDINGKEY": "order-7"}
    # and over 4.x remoting
    got = {m.body: m for m in await consume(cluster, topic, 3)}
    assert got[b"n0"].msg_id == sent[0]["message_id"] and got[b"n0"].properties["color"] == "red"
    assert got[b"n2"].properties[msgcodec.SHARDING_KEY] == "order-7"


async def test_node_simple_consumer_change_invisible_duration(cluster, node_rmq5):
    topic, group = uniq("NodeNack"), uniq("NodeNackG")
    await node(node_rmq5, cluster, "send", topic=topic, messages=[{"body": "again"}])
    events = await node(node_rmq5, cluster, "nack", topic=topic, group=group)
    assert [e["event"] for e in events] == ["msg", "changed", "msg", "acked"], events
    assert (events[0]["attempt"], events[2]["attempt"]) == (1, 2)
    assert events[0]["message_id"] == events[2]["message_id"]
