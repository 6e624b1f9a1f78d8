"""Producer against the in-process fake cluster (real TCP on 127.0.0.1, bounded by timeouts)."""
import asyncio
import zlib

import pytest

from client import errors
from client.message import Message, SendStatus
from client.producer import Producer, hash_selector
from client.testing import FakeCluster
from protocol import message as msgcodec
from protocol.bodies import MessageQueue
from protocol.codes import RequestCode, ResponseCode


def stored(broker, topic):
    out = []
    for (t, qid), recs in sorted(broker.queues.items()):
        if t == topic:
            out.extend(msgcodec.decode_record(r) for r in recs)
    return out


async def test_send_round_trip_with_tags_keys_properties_and_delay():
    async with asyncio.timeout(20):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 4)
            async with Producer("PG", cluster.namesrv_addr, instance_name="p1") as p:
                r = await p.send(Message("T", b"hello", tags="TagA", keys=("k1", "k2"),
                                         properties={"color": "red"}, delay_level=2))
                assert r.status is SendStatus.SEND_OK and r.ok
                assert len(r.msg_id) == 32 and len(r.offset_msg_id) == 32
                assert r.queue.topic == "T" and r.queue.broker_name == "broker-a"
                assert r.queue_offset == 0
            [m] = stored(cluster.brokers[0], "T")
            assert m.body == b"hello"
            assert m.properties["TAGS"] == "TagA" and m.properties["KEYS"] == "k1 k2"
            assert m.properties["color"] == "red" and m.properties["DELAY"] == "2"
            assert m.properties["UNIQ_KEY"] == r.msg_id
            assert RequestCode.SEND_MESSAGE_V2 in cluster.brokers[0].requests


async def test_round_robin_explicit_queue_and_sharding_key():
    async with asyncio.timeout(20):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 4)
            async with Producer("PG", cluster.namesrv_addr, instance_name="p2") as p:
                qs = {(await p.send(Message("T", b"x"))).queue.queue_id for _ in range(8)}
                assert qs == {0, 1, 2, 3}
                mq = MessageQueue("T", "broker-a", 2)
                assert (await p.send(Message("T", b"x"), queue=mq)).queue == mq
                r1 = await p.send(Message("T", b"x"), sharding_key="order-42")
                r2 = await p.send(Message("T", b"y"), sharding_key="order-42")
                assert r1.queue == r2.queue
                queues = [MessageQueue("T", "broker-a", i) for i in range(4)]
                assert r1.queue == hash_selector(queues, "order-42")
                r3 = await p.send(Message("T", b"z"), selector=lambda mqs, arg: mqs[arg], arg=3)
                assert r3.queue.queue_id == 3
                assert r3.queue_offset >= 1    # queue 3 already had a round-robin message


def test_hash_selector_matches_java():
    queues = [MessageQueue("T", "b", i) for i in range(8)]
    # "order-42".hashCode() in Java, computed with protocol.message.java_string_hash
    h = msgcodec.java_string_hash("order-42")
    assert hash_selector(queues, "order-42").queue_id == abs(h) % 8
    assert msgcodec.java_string_hash("abc") == 96354


async def test_compression_and_size_check():
    async with asyncio.timeout(20):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            async with Producer("PG", cluster.namesrv_addr, instance_name="p3",
                                max_message_size_bytes=64 * 1024) as p:
                big = bytes(range(256)) * 32      # 8 KiB, compressible
                await p.send(Message("T", big))
                with pytest.raises(errors.MessageTooLargeError):
                    await p.send(Message("T", b"x" * (64 * 1024 + 1)))
                with pytest.raises(errors.InvalidArgumentError):
                    await p.send(Message("T", b""))
                with pytest.raises(errors.InvalidArgumentError):
                    await p.send(Message("bad topic!", b"x"))
            rec = cluster.brokers[0].queues[("T", 0)][0]
            raw = msgcodec.decode_record(rec, decompress=False)
            assert raw.sys_flag & 1 and zlib.decompress(raw.body) == big
            assert msgcodec.decode_record(rec).body == big


async def test_batch_split_to_size_bound():
    async with asyncio.timeout(20):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 2)
            async with Producer("PG", cluster.namesrv_addr, instance_name="p4",
                                max_message_size_bytes=10_000) as p:
                msgs = [Message("T", bytes([i]) * 1000, tags="B", keys=f"k{i}") for i in range(25)]
                results = await p.send_batch(msgs)
                assert len(results) >= 3
                ids = ",".join(r.msg_id for r in results).split(",")
                assert len(ids) == 25 and len(set(ids)) == 25
                with pytest.raises(errors.InvalidArgumentError):
                    await p.send_batch([Message("T", b"a"), Message("U", b"b")])
                with pytest.raises(errors.InvalidArgumentError):
                    await p.send_batch([Message("T", b"a", delay_level=1)])
            got = stored(cluster.brokers[0], "T")
            assert sorted(m.body[0] for m in got) == list(range(25))
            assert {m.properties["UNIQ_KEY"] for m in got} == set(ids)
            assert all(m.properties["TAGS"] == "B" for m in got)
            assert RequestCode.SEND_BATCH_MESSAGE in cluster.brokers[0].requests


async def test_retry_on_another_broker_and_typed_errors():
    async with asyncio.timeout(20):
        async with FakeCluster(brokers=2) as cluster:
            cluster.create_topic("T", 2)
            a, b = cluster.brokers
            a.fail_sends = ResponseCode.SYSTEM_ERROR
            async with Producer("PG", cluster.namesrv_addr, instance_name="p5") as p:
                for _ in range(6):
                    r = await p.send(Message("T", b"x"))
                    assert r.queue.broker_name == "broker-b"
                # broker-a is now avoided without even being tried
                before = a.sends
                for _ in range(4):
                    await p.send(Message("T", b"x"))
                assert a.sends == before
                b.fail_sends = ResponseCode.MESSAGE_ILLEGAL   # not retriable
                with pytest.raises(errors.MessageIllegalError):
                    await p.send(Message("T", b"x"))


async def test_oneway_and_auto_created_topic():
    async with asyncio.timeout(20):
        async with FakeCluster() as cluster:
            async with Producer("PG", cluster.namesrv_addr, instance_name="p6") as p:
                r = await p.send(Message("NewTopic", b"x"))      # via TBW102
                assert r.ok
                await p.send_oneway(Message("NewTopic", b"y"))
                for _ in range(100):
                    if cluster.brokers[0].message_count("NewTopic") == 2:
                        break
                    await asyncio.sleep(0.01)
                assert cluster.brokers[0].message_count("NewTopic") == 2
                assert cluster.brokers[0].topics["NewTopic"] == 4


async def test_no_nameserver_raises_remoting_failure_and_state_errors():
    async with asyncio.timeout(20):
        p = Producer("PG", "127.0.0.1:1", instance_name="p7")
        with pytest.raises(errors.ClientStateError):
            await p.send(Message("T", b"x"))
        await p.start()
        with pytest.raises(errors.RemotingFailure):
            await p.send(Message("T", b"x"))
        await p.close()
        with pytest.raises(errors.ClientStateError):
            await p.send(Message("T", b"x"))


@pytest.mark.parametrize("desc,expected", [("pocketmq-fake", 2), ("V4_9_4", 0)])
async def test_header_codec_negotiated_per_broker(desc, expected):
    async with asyncio.timeout(20):
        async with FakeCluster(version_desc=desc) as cluster:
            cluster.create_topic("T", 1)
            async with Producer("PG", cluster.namesrv_addr, instance_name=f"neg{expected}") as p:
                assert (await p.send(Message("T", b"x"))).ok
            assert cluster.brokers[0].serialize_types == {expected}
            async with Producer("PG", cluster.namesrv_addr, instance_name="forced", serialize_type=0) as p:
                assert (await p.send(Message("T", b"x"))).ok
            assert 0 in cluster.brokers[0].serialize_types


async def test_message_illegal_does_not_isolate_a_healthy_broker():
    async with asyncio.timeout(20):
        async with FakeCluster(brokers=2) as cluster:
            cluster.create_topic("T", 2)
            a, b = cluster.brokers
            async with Producer("PG", cluster.namesrv_addr, instance_name="p-iso") as p:
                a.fail_sends = ResponseCode.MESSAGE_ILLEGAL
                with pytest.raises(errors.MessageIllegalError):
                    for _ in range(4):   # until one lands on broker-a
                        await p.send(Message("T", b"x"))
                a.fail_sends = None
                before = a.sends
                for _ in range(20):
                    await p.send(Message("T", b"x"))
                assert a.sends > before   # still used


async def test_oneway_sends_are_paced_by_the_socket():
    """Oneway sends await no reply; they must still not pile up unbounded in the client."""
    async with asyncio.timeout(60):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            async with Producer("PG", cluster.namesrv_addr, instance_name="ow") as p:
                await p.send(Message("T", b"warm-up"))
                peak = 0
                body = b"x" * 2000
                for i in range(20000):
                    await p.send_oneway(Message("T", body))
                    if i % 500 == 0:
                        for conn in p.instance.remoting.connections.values():
                            if conn.transport is not None:
                                peak = max(peak, conn.transport.get_write_buffer_size())
                assert peak < 4 * 1024 * 1024, peak
