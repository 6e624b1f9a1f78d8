"""send_batch of bodies (topic=, tags=, keys=, properties=) against real `mqnamesrv` /
`mqbroker` processes: the stored messages are those a batch of Messages gives."""
from __future__ import annotations

import asyncio

import pytest

from pocketmq.client import Message, Producer
from pocketmq.protocol.bodies import MessageQueue
from tests.integration.test_client_cluster import cluster, create_topic, drain_lite, uniq  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow


async def test_send_batch_of_bodies_round_trips(cluster):  # noqa: F811 (the fixture)
    async with asyncio.timeout(60):
        topic = uniq("BatchBodies")
        await create_topic(cluster, topic, 1)
        mq = MessageQueue(topic, "broker-a", 0)
        bodies = [f"body-{i}".encode() * (1 + i % 3) for i in range(70)] + ["é-str"]
        async with Producer("ItBodies", cluster.namesrv_addr, instance_name=uniq("pb")) as p:
            rs = await p.send_batch(bodies, topic=topic, tags="TagB", keys=("k1", "k2"),
                                    properties={"origin": "bodies"}, flag=3)
            same = await p.send_batch([b"x" * 64] * 64, topic=topic)            # one body length
            await p.send_batch([Message(topic, b"ref", tags="TagB", keys=("k1", "k2"),
                                              properties={"origin": "bodies"}, flag=3)])
        assert len(rs) == 1 and rs[0].ok and rs[0].queue_offset == 0
        ids = rs[0].msg_id.split(",") + same[0].msg_id.split(",")
        assert len(set(ids)) == 71 + 64 and all(len(i) == 32 for i in ids)
        assert same[0].queue_offset == 71
        got = await drain_lite(cluster.namesrv_addr, uniq("BodiesReader"), [mq], 71 + 64 + 1)
        assert [m.queue_offset for m in got] == list(range(71 + 64 + 1))
        want = [b if isinstance(b, bytes) else b.encode() for b in bodies] + [b"x" * 64] * 64 + [b"ref"]
        assert [m.body for m in got] == want
        assert [m.msg_id for m in got[:-1]] == ids
        r = got[-1]
        for m in got[:71]:
            assert (m.tags, m.keys, m.flag, m.user_properties) == ("TagB", ("k1", "k2"), 3, {"origin": "bodies"})
            # the properties a Message batch stores, but for the UNIQ_KEY
            assert {k: v for k, v in m.properties.items() if k != "UNIQ_KEY"} == \
                {k: v for k, v in r.properties.items() if k != "UNIQ_KEY"}
        assert all(m.tags is None and m.keys == () and m.flag == 0 for m in got[71:-1])
