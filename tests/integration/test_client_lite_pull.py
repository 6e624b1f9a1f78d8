"""LitePullConsumer against the in-process fake cluster."""
import asyncio

import pytest

from pocketmq.client.lite_pull_consumer import LitePullConsumer
from pocketmq.client.message import Message
from pocketmq.client.producer import Producer
from tests.support.fake_broker import FakeCluster
from pocketmq.protocol.bodies import MessageQueue


async def produce(addr, topic, n, start=0, queue=None, tags=None):
    async with Producer("PG", addr, instance_name="lprod") as p:
        out = []
        for i in range(start, start + n):
            out.append(await p.send(Message(topic, f"m{i}".encode(), tags=tags), queue=queue))
        return out


async def poll_n(c, n, timeout_s=10):
    got = []
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while len(got) < n and loop.time() < end:
        got.extend(await c.poll(0.5))
    return got


async def test_assign_poll_seek_commit_and_committed():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 2)
            mq0 = MessageQueue("T", "broker-a", 0)
            await produce(cluster.namesrv_addr, "T", 20, queue=mq0)
            c = LitePullConsumer("LG", cluster.namesrv_addr, instance_name="l1",
                                 consume_from_where="FIRST_OFFSET", auto_commit=False, max_poll_records=7)
            c.assign([mq0])
            async with c:
                first = await c.poll(5)
                assert [m.body for m in first] == [f"m{i}".encode() for i in range(7)]
                assert c.position(mq0) == 7
                assert await c.committed(mq0) == -1
                await c.commit()
                assert await c.committed(mq0) == 7
                rest = await poll_n(c, 13)
                assert [m.queue_offset for m in rest] == list(range(7, 20))
                c.seek(mq0, 3)
                again = await poll_n(c, 17)
                assert [m.queue_offset for m in again] == list(range(3, 20))
                await c.seek_to_end(mq0)
                assert await c.poll(0.3) == []
                await produce(cluster.namesrv_addr, "T", 1, start=20, queue=mq0)
                [m] = await poll_n(c, 1)
                assert m.body == b"m20"
                await c.seek_to_begin(mq0)
                assert (await c.poll(5))[0].queue_offset == 0
                assert await c.offset_for_timestamp(mq0, 0) == 0
                assert await c.offset_for_timestamp(mq0, 2**62) == 21


async def test_resume_at_committed_offset_and_auto_commit_on_close():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 4)
            await produce(cluster.namesrv_addr, "T", 40)
            c = LitePullConsumer("LG2", cluster.namesrv_addr, instance_name="l2",
                                 consume_from_where="FIRST_OFFSET", max_poll_records=5)
            c.subscribe("T")
            async with c:
                got = await poll_n(c, 25)
            assert len(got) >= 25
            c2 = LitePullConsumer("LG2", cluster.namesrv_addr, instance_name="l2",
                                  consume_from_where="FIRST_OFFSET")
            c2.subscribe("T")
            async with c2:
                rest = await poll_n(c2, 40 - len(got))
                assert await c2.poll(0.3) == []
            bodies = [m.body for m in got] + [m.body for m in rest]
            assert len(bodies) == 40 and len(set(bodies)) == 40


async def test_async_iteration_pause_resume_and_tag_filter():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            await produce(cluster.namesrv_addr, "T", 5, tags="A")
            await produce(cluster.namesrv_addr, "T", 5, start=5, tags="B")
            c = LitePullConsumer("LG3", cluster.namesrv_addr, instance_name="l3",
                                 consume_from_where="FIRST_OFFSET")
            c.subscribe("T", "B")
            async with c:
                seen = []
                async for m in c:
                    seen.append(m.body)
                    if len(seen) == 5:
                        break
                assert seen == [f"m{i}".encode() for i in range(5, 10)]
                [mq] = c.assignment()
                assert c.position(mq) == 10
                c.pause([mq])
                await produce(cluster.namesrv_addr, "T", 2, start=10, tags="B")
                assert await c.poll(0.5) == []
                c.resume([mq])
                assert len(await poll_n(c, 2)) == 2


async def test_two_lite_consumers_share_queues():
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 4)
            a = LitePullConsumer("LG4", cluster.namesrv_addr, instance_name="la")
            b = LitePullConsumer("LG4", cluster.namesrv_addr, instance_name="lb")
            for c in (a, b):
                c.subscribe("T")
                await c.start()
            loop = asyncio.get_running_loop()
            end = loop.time() + 10
            while loop.time() < end:
                qa, qb = a.assignment(), b.assignment()
                if len(qa) == 2 and len(qb) == 2 and not qa & qb:
                    break
                await asyncio.sleep(0.05)
            assert len(a.assignment()) == 2 and not a.assignment() & b.assignment()
            await a.close()
            await b.close()


def _fail_once(monkeypatch, where):
    """Make the first pull (where="pull") or the first handling of a pulled message
    (where="decode") raise a RuntimeError: a bug, not a broker or network error."""
    from pocketmq.client.api import ClientAPI
    failed = asyncio.Event()
    if where == "pull":
        real_pull = ClientAPI.pull_message

        async def pull(self, req):
            if not failed.is_set():
                failed.set()
                raise RuntimeError("injected bug in pull")
            return await real_pull(self, req)
        monkeypatch.setattr(ClientAPI, "pull_message", pull)
    else:
        from pocketmq.client import fetcher
        real_decode = fetcher.decode_messages

        def decode_messages(body, broker_name):
            if not failed.is_set():
                failed.set()
                raise RuntimeError("injected bug in decoding")
            return real_decode(body, broker_name)
        monkeypatch.setattr(fetcher, "decode_messages", decode_messages)
    return failed


@pytest.mark.parametrize("where", ["pull", "decode"])
async def test_pulling_survives_an_unexpected_exception(monkeypatch, where):
    """A bug raising in the pull loop is logged and retried; the queue keeps being pulled
    (before the shared fetcher, the lite consumer's loop ended silently)."""
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            mq0 = MessageQueue("T", "broker-a", 0)
            await produce(cluster.namesrv_addr, "T", 5, queue=mq0)
            failed = _fail_once(monkeypatch, where)
            c = LitePullConsumer("LGX", cluster.namesrv_addr, instance_name="lx", pull_error_delay_ms=20,
                                 consume_from_where="FIRST_OFFSET", auto_commit=False)
            c.assign([mq0])
            async with c:
                got = await poll_n(c, 5)
                assert failed.is_set()
                assert [m.queue_offset for m in got] == list(range(5))
                assert not c.assigned[mq0].task.done()


async def test_a_full_buffer_resumes_pulling_when_poll_makes_room(monkeypatch):
    """Flow control waits for room, not a fixed delay: with the delay made 60 s, a queue
    whose buffer (threshold 10) fills after every pull is still drained in seconds,
    because each poll() that takes messages wakes its pull at once."""
    import pocketmq.client.fetcher as fetcher
    monkeypatch.setattr(fetcher, "FLOW_CONTROL_DELAY_MS", 60_000)
    async with asyncio.timeout(30):
        async with FakeCluster() as cluster:
            cluster.create_topic("T", 1)
            mq0 = MessageQueue("T", "broker-a", 0)
            async with Producer("PG", cluster.namesrv_addr, instance_name="lprod") as p:
                await p.send_batch([b"m%d" % i for i in range(200)], topic="T")
            c = LitePullConsumer("LG", cluster.namesrv_addr, instance_name="l1", consume_from_where="FIRST_OFFSET",
                                 auto_commit=False, pull_threshold_for_queue=10, pull_batch_size=16)
            c.assign([mq0])
            async with c:
                got = await poll_n(c, 200, timeout_s=20)
                assert [m.queue_offset for m in got] == list(range(200))
                st = c.fetcher.stats
                assert st["flow_control_waits"] > 0            # the buffer did fill...
                assert st["flow_control_timeouts"] == 0        # ...and no wait ran its 60 s
