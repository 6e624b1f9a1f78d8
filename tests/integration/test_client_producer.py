"""Producer against the in-process fake cluster (real TCP on 127.0.0.1, bounded by timeouts)."""
import asyncio
import contextlib
import zlib

import pytest

from pocketmq.client import errors
from pocketmq.client.message import Message, SendStatus
from pocketmq.client.producer import COALESCE_MAX_MESSAGES, Producer, hash_selector
from tests.support.fake_broker import FakeCluster
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.codes import RequestCode, ResponseCode


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
                broker = cluster.brokers[0]
                await broker.until(lambda: broker.message_count("NewTopic") == 2)   # the oneway arrived
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


# -- send coalescing -------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def one_broker():
    """A fake cluster of one broker with topic T (4 queues), bounded by a timeout."""
    async with asyncio.timeout(20):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 4)
            yield cluster, cluster.brokers[0]


def record_at(broker, mq, offset):
    return msgcodec.decode_record(broker.queues[(mq.topic, mq.queue_id)][offset])


async def test_concurrent_sends_are_coalesced_with_a_result_per_message():
    async with one_broker() as (cluster, b):
        async with Producer("PG", cluster.namesrv_addr, instance_name="pc1") as p:
            msgs = [Message("T", f"m{i}".encode(), tags=f"Tag{i % 3}", keys=(f"k{i}",),
                            properties={"i": str(i)}, flag=i) for i in range(50)]
            results = await asyncio.gather(*(p.send(m) for m in msgs))
        # one request per send would be 50; groups of at most COALESCE_MAX_MESSAGES after the first send
        assert RequestCode.SEND_BATCH_MESSAGE in b.requests
        assert len(b.requests) - b.requests.count(RequestCode.HEART_BEAT) < 50
        assert b.batch_sizes and max(b.batch_sizes) <= COALESCE_MAX_MESSAGES and sum(b.batch_sizes) <= 49
        assert len(b.batch_sizes) >= -(-49 // COALESCE_MAX_MESSAGES)   # as many groups as 49 sends fill
        assert len({r.msg_id for r in results}) == 50
        assert len({(r.queue, r.queue_offset) for r in results}) == 50
        for i, r in enumerate(results):
            assert r.ok and len(r.offset_msg_id) == 32
            # the result names exactly where this message was stored
            m = record_at(b, r.queue, r.queue_offset)
            assert m.body == f"m{i}".encode() and m.flag == i
            assert m.properties["UNIQ_KEY"] == r.msg_id
            assert m.properties["TAGS"] == f"Tag{i % 3}" and m.properties["KEYS"] == f"k{i}"
            assert m.properties["i"] == str(i) and m.properties["WAIT"] == "true"
            assert r.offset_msg_id == msgcodec.offset_msg_id(b"\x7f\x00\x00\x01", b.port, m.commit_log_offset)


async def test_lone_sends_and_coalesce_off_use_one_request_per_send():
    async with one_broker() as (cluster, b):
        async with Producer("PG", cluster.namesrv_addr, instance_name="pc2") as p:
            for i in range(10):
                await p.send(Message("T", b"x"))
        async with Producer("PG2", cluster.namesrv_addr, instance_name="pc3", coalesce_sends=False) as p:
            await asyncio.gather(*(p.send(Message("T", b"y")) for _ in range(20)))
        sends = [c for c in b.requests if c in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)]
        assert sends == [RequestCode.SEND_MESSAGE_V2] * 30


async def test_messages_a_batch_cannot_carry_are_sent_alone():
    async with one_broker() as (cluster, b):
        mq = MessageQueue("T", "broker-a", 3)
        async with Producer("PG", cluster.namesrv_addr, instance_name="pc4") as p:
            await p.send(Message("T", b"warm-up"))
            b.requests.clear()
            # each pair: a plain send (goes out at once) and one that must not join a batch
            for second in (p.send(Message("T", b"late", delay_level=3)),
                           p.send(Message("T", b"z" * 10000)),          # compressed
                           p.send(Message("T", b"q"), queue=mq),
                           p.send(Message("T", b"s"), sharding_key="order-1"),
                           p.send(Message("%RETRY%G", b"r"))):
                rs = await asyncio.gather(p.send(Message("T", b"plain")), second)
                assert all(r.ok for r in rs)
            # while a send is in flight, two plain ones do share a batch
            await asyncio.gather(*(p.send(Message("T", b"plain")) for _ in range(3)))
        sends = [c for c in b.requests if c in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)]
        assert sends == [RequestCode.SEND_MESSAGE_V2] * 11 + [RequestCode.SEND_BATCH_MESSAGE]
        assert b.batch_sizes == [2]
        got = {m.body: m for m in stored(b, "T")}
        assert got[b"late"].properties["DELAY"] == "3"
        assert got[b"z" * 10000].sys_flag & msgcodec.MessageSysFlag.COMPRESSED_FLAG
        assert [m.body for m in stored(b, "%RETRY%G")] == [b"r"]


async def test_groups_are_bounded_by_count_and_batch_body_size():
    async with one_broker() as (cluster, b):
        async with Producer("PG", cluster.namesrv_addr, instance_name="pc5", coalesce_max_messages=4) as p:
            await asyncio.gather(*(p.send(Message("T", b"x")) for _ in range(13)))
            assert b.batch_sizes == [4, 4, 4]          # the first send went alone
        b.batch_sizes.clear()
        # an element counts as its stored record: 300 B body + 51 B properties + topic + 243
        # (fixed fields and room for the batch's properties) = 595 B: 3 fit in 2,000 bytes
        async with Producer("PG2", cluster.namesrv_addr, instance_name="pc6", max_message_size_bytes=2000,
                            coalesce_max_messages=100) as p:
            rs = await asyncio.gather(*(p.send(Message("T", b"y" * 300)) for _ in range(13)))
            assert all(r.ok for r in rs)
        assert b.batch_sizes == [3, 3, 3, 3]
        with pytest.raises(errors.InvalidArgumentError):
            Producer("PG3", cluster.namesrv_addr, coalesce_max_messages=0)


async def test_a_failed_group_fails_every_send_in_it_with_the_typed_error():
    async with one_broker() as (cluster, b):
        async with Producer("PG", cluster.namesrv_addr, instance_name="pc7") as p:
            await p.send(Message("T", b"ok"))
            b.fail_sends = ResponseCode.SYSTEM_BUSY     # not retried, nor a refusal of batches
            rs = await asyncio.gather(*(p.send(Message("T", b"x")) for _ in range(6)), return_exceptions=True)
            assert all(isinstance(r, errors.SystemBusyError) for r in rs), rs
            assert b.requests.count(RequestCode.SEND_BATCH_MESSAGE) == 1   # one alone, five in a batch
            b.fail_sends = None
            rs = await asyncio.gather(*(p.send(Message("T", b"x")) for _ in range(6)))
            assert all(r.ok for r in rs)


async def test_close_sends_what_was_coalesced_and_a_cancelled_send_spares_its_group():
    async with one_broker() as (cluster, b):
        p = await Producer("PG", cluster.namesrv_addr, instance_name="pc8").start()
        tasks = [asyncio.create_task(p.send(Message("T", f"c{i}".encode()))) for i in range(6)]
        await asyncio.sleep(0)          # all six are in send(): one in flight, five grouped
        tasks[3].cancel()
        await p.close()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[3], asyncio.CancelledError)
        assert all(r.ok for i, r in enumerate(done) if i != 3)
        # a cancelled caller does not take back a message already handed over (like a
        # send cancelled after its request was written)
        assert sorted(m.body for m in stored(b, "T")) == [f"c{i}".encode() for i in range(6)]


def test_split_batch_result():
    from pocketmq.client.message import SendResult
    from pocketmq.client.producer import split_batch_result
    mq = MessageQueue("T", "b", 1)
    r = SendResult(SendStatus.SEND_OK, "U1,U2,U3", "A,B,C", mq, 7)
    assert [(x.msg_id, x.offset_msg_id, x.queue_offset) for x in split_batch_result(r, ["U1", "U2", "U3"])] \
        == [("U1", "A", 7), ("U2", "B", 8), ("U3", "C", 9)]
    # a broker that answers with something else: no ids rather than wrong ones
    r = SendResult(SendStatus.FLUSH_DISK_TIMEOUT, "U1,U2", "A", mq, -1)
    out = split_batch_result(r, ["U1", "U2"])
    assert [(x.offset_msg_id, x.queue_offset, x.status) for x in out] == \
        [("", -1, SendStatus.FLUSH_DISK_TIMEOUT)] * 2


@pytest.mark.parametrize("code", [ResponseCode.MESSAGE_ILLEGAL, ResponseCode.REQUEST_CODE_NOT_SUPPORTED])
async def test_a_refused_batch_is_sent_one_message_per_request(code):
    async with one_broker() as (cluster, b):
        b.refuse_batches = code
        async with Producer("PG", cluster.namesrv_addr, instance_name="pc9") as p:
            rs = await asyncio.gather(*(p.send(Message("T", f"r{i}".encode())) for i in range(8)))
            assert all(r.ok for r in rs)
            assert sorted(m.body for m in stored(b, "T")) == sorted(f"r{i}".encode() for i in range(8))
            for r in rs:
                assert record_at(b, r.queue, r.queue_offset).properties["UNIQ_KEY"] == r.msg_id
            assert b.requests.count(RequestCode.SEND_BATCH_MESSAGE) == 1
            # a broker without batches is not asked again; an illegal batch is no such sign
            await asyncio.gather(*(p.send(Message("T", b"again")) for _ in range(8)))
            expected = 1 if code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED else 2
            assert b.requests.count(RequestCode.SEND_BATCH_MESSAGE) == expected


async def test_close_waits_for_sends_in_flight_and_refuses_new_ones():
    async with one_broker() as (cluster, b):
        p = await Producer("PG", cluster.namesrv_addr, instance_name="pc10").start()
        first = asyncio.create_task(p.send(Message("T", b"in-flight")))
        await asyncio.sleep(0)              # its request is on the way
        closing = asyncio.create_task(p.close())
        await asyncio.sleep(0)
        with pytest.raises(errors.ClientStateError):
            await p.send(Message("T", b"late"))
        await closing
        assert (await first).ok
        assert [m.body for m in stored(b, "T")] == [b"in-flight"]


async def test_a_cancelled_close_still_releases_the_producer():
    async with one_broker() as (cluster, b):
        p = await Producer("PG", cluster.namesrv_addr, instance_name="pc11").start()
        inst = p.instance
        p._sends_in_flight += 1            # a send whose answer never comes: close() waits for it
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(p.close(), 0.05)
        assert p.instance is None and "PG" not in inst.producers
        with pytest.raises(errors.ClientStateError):
            await p.send(Message("T", b"y"))
        await p.close()                    # a no-op now


async def test_sends_of_a_group_cancelled_before_it_ran_do_not_hang():
    async with one_broker() as (cluster, b):
        p = await Producer("PG", cluster.namesrv_addr, instance_name="pc12").start()
        n = COALESCE_MAX_MESSAGES
        tasks = [asyncio.create_task(p.send(Message("T", f"m{i}".encode()))) for i in range(n + 1)]
        await asyncio.sleep(0)          # one alone, n in a full group whose task has not run
        for t in list(p._group_tasks):
            t.cancel()                  # e.g. a shutdown sweep over asyncio.all_tasks()
        done, pending = await asyncio.wait(tasks, timeout=2)
        assert not pending
        assert sum(t.cancelled() for t in done) == n
        await p.close()
