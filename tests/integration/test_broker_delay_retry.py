"""Delay levels, CONSUMER_SEND_MSG_BACK retry and DLQ, over TCP with raw commands."""
import asyncio
import time

import pytest

from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.message import decode_records
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import pull_cmd, send_cmd
from tests.support.local import local_cluster

pytestmark = pytest.mark.asyncio

# Level n = n seconds for levels 1..3, so retries (level 3 + attempts) stay short in tests.
LEVELS = "--messageDelayLevel=1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s 1s"


async def pull_all(c, addr, topic, qid=0, offset=0, group="g", wait_s=0.0):
    deadline = time.monotonic() + wait_s
    while True:
        r = await c.invoke(addr, pull_cmd(topic, qid, offset, group=group))
        if r.code == C.SUCCESS:
            return decode_records(r.body)
        if time.monotonic() >= deadline:
            return []
        await asyncio.sleep(0.05)


async def test_delayed_message_is_delivered_after_its_delay(tmp_path):
    async with local_cluster(str(tmp_path), LEVELS) as (ns, broker):
        c = RemotingClient()
        try:
            t0 = time.monotonic()
            r = await c.invoke(broker.addr, send_cmd("TD", b"later", queue_id=2, props={"DELAY": "2", "k": "v"}))
            assert r.code == C.SUCCESS and r.ext_fields["queueId"] == "2"
            assert await pull_all(c, broker.addr, "TD", 2) == []          # not visible yet
            got = await pull_all(c, broker.addr, "TD", 2, wait_s=5)
            elapsed = time.monotonic() - t0
            assert [m.body for m in got] == [b"later"]
            assert 0.9 <= elapsed < 4, elapsed
            m = got[0]
            assert m.tags == "TagA" and m.properties["k"] == "v" and "DELAY" not in m.properties
            assert m.properties["REAL_TOPIC"] == "TD" and m.topic == "TD" and m.queue_id == 2
            # Tag filtering works on the delivered copy (its tag code is recomputed).
            r = await c.invoke(broker.addr, pull_cmd("TD", 2, 0, sub="TagA"))
            assert r.code == C.SUCCESS
        finally:
            await c.close()


async def test_delay_cursor_survives_restart_without_redelivery(tmp_path):
    async with local_cluster(str(tmp_path), LEVELS) as (ns, broker):
        c = RemotingClient()
        try:
            assert (await c.invoke(broker.addr, send_cmd("TR", b"once", props={"DELAY": "1"}))).code == C.SUCCESS
            assert len(await pull_all(c, broker.addr, "TR", wait_s=5)) == 1
        finally:
            await c.close()
    async with local_cluster(str(tmp_path), LEVELS) as (ns, broker):
        await asyncio.sleep(1.5)
        assert broker.store.get_max_offset_in_queue("TR", 0) == 1   # not delivered a second time


async def test_send_back_retries_then_dead_letters(tmp_path):
    async with local_cluster(str(tmp_path), LEVELS) as (ns, broker):
        broker.groups.find("G", 0).retryMaxTimes = 2
        c = RemotingClient()
        try:
            assert (await c.invoke(broker.addr, send_cmd("TF", b"fails", props={"k": "v"}))).code == C.SUCCESS
            (m,) = await pull_all(c, broker.addr, "TF")
            current = m
            for attempt in range(1, 3):
                r = await c.invoke(broker.addr, RemotingCommand(R.CONSUMER_SEND_MSG_BACK, ext_fields={
                    "offset": str(current.commit_log_offset), "group": "G", "delayLevel": "0"}))
                assert r.code == C.SUCCESS, r.remark
                got = await pull_all(c, broker.addr, "%RETRY%G", offset=attempt - 1, group="G", wait_s=6)
                assert len(got) == 1, attempt
                current = got[0]
                assert current.body == b"fails" and current.reconsume_times == attempt
                assert current.properties["RETRY_TOPIC"] == "TF"
                assert current.properties["ORIGIN_MESSAGE_ID"] == m.msg_id
                assert current.properties["k"] == "v"
            # Third failure: reconsumeTimes (2) >= retryMaxTimes (2) -> %DLQ%G, no delay.
            r = await c.invoke(broker.addr, RemotingCommand(R.CONSUMER_SEND_MSG_BACK, ext_fields={
                "offset": str(current.commit_log_offset), "group": "G", "delayLevel": "0"}))
            assert r.code == C.SUCCESS
            (dead,) = await pull_all(c, broker.addr, "%DLQ%G", group="G", wait_s=2)
            assert dead.body == b"fails" and dead.reconsume_times == 3
            assert dead.properties["RETRY_TOPIC"] == "TF"
            # delayLevel < 0 sends straight to the DLQ.
            r = await c.invoke(broker.addr, RemotingCommand(R.CONSUMER_SEND_MSG_BACK, ext_fields={
                "offset": str(m.commit_log_offset), "group": "G", "delayLevel": "-1"}))
            assert r.code == C.SUCCESS
            assert len(await pull_all(c, broker.addr, "%DLQ%G", group="G", wait_s=2)) == 2
            bad = await c.invoke(broker.addr, RemotingCommand(R.CONSUMER_SEND_MSG_BACK, ext_fields={
                "offset": "987654321", "group": "G", "delayLevel": "0"}))
            assert bad.code == C.SYSTEM_ERROR and "987654321" in bad.remark
            # an origin id or topic holding a property separator: refused, named, nothing stored
            before = broker.store.commit_log_max_offset
            for field in ("originMsgId", "originTopic"):
                bad = await c.invoke(broker.addr, RemotingCommand(R.CONSUMER_SEND_MSG_BACK, ext_fields={
                    "offset": str(m.commit_log_offset), "group": "G", "delayLevel": "0", field: "x\x02y"}))
                assert bad.code == C.SYSTEM_ERROR and field in bad.remark, (bad.code, bad.remark)
            assert broker.store.commit_log_max_offset == before
        finally:
            await c.close()


async def test_python_push_consumer_reconsume_later_goes_through_retry_topic(tmp_path):
    """RECONSUME_LATER -> CONSUMER_SEND_MSG_BACK -> SCHEDULE -> %RETRY%G -> listener again."""
    from pocketmq.client import CONSUME_SUCCESS, RECONSUME_LATER, Message, Producer, PushConsumer
    async with local_cluster(str(tmp_path), LEVELS) as (ns, broker):
        seen = []
        done = asyncio.Event()

        async def listener(msg):
            seen.append((msg.topic, msg.body, msg.reconsume_times))
            if msg.reconsume_times == 0:
                return RECONSUME_LATER
            done.set()
            return CONSUME_SUCCESS
        async with Producer("PG", ns) as p:
            await p.send(Message("TP", b"retry me"))
        consumer = PushConsumer("G", ns, listener=listener, consume_from_where="FIRST_OFFSET")
        consumer.subscribe("TP")
        async with consumer:
            await asyncio.wait_for(done.wait(), 20)
        assert seen[0] == ("TP", b"retry me", 0)
        assert seen[-1] == ("TP", b"retry me", 1)          # original topic restored for the listener
        assert broker.store.get_max_offset_in_queue("%RETRY%G", 0) == 1   # it really went through the broker
