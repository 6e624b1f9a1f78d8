"""Timer messages against a real broker process (mqbroker): delivered at their time, never
early (our client's deliver_at_ms and the three properties a 5.x Java client sets); a time
past delivers at once; timerMaxDelaySec refused with Java's code and remark; timers pending
at a SIGKILL delivered after the restart, what was delivered before not again; delay levels
unchanged. Short delays: each test takes a few seconds."""
from __future__ import annotations

import asyncio
import re
import time
import urllib.request

import pytest

from pocketmq.client import Message, Producer
from pocketmq.common.constants import TIMER_TOPIC
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.message import decode_records
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import pull_cmd, send_cmd
from tests.support.daemons import Cluster, free_port

pytestmark = pytest.mark.asyncio

LEVELS = "--messageDelayLevel=1s 1s 1s"


def now_ms() -> int:
    return int(time.time() * 1000)


async def next_message(c, addr, topic, offset, wait_s=8.0, qid=0):
    """The message at `offset` of topic/qid as soon as it is there (a held pull), with the
    wall-clock time it arrived; None if nothing came within wait_s."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        left_ms = int((deadline - time.monotonic()) * 1000)
        r = await c.invoke(addr, pull_cmd(topic, qid, offset, suspend_ms=max(1, left_ms)), left_ms / 1000 + 3)
        if r.code == C.SUCCESS:
            return decode_records(r.body)[0], now_ms()
    return None


async def queue_size(c, addr, topic, qid=0) -> int:
    r = await c.invoke(addr, RemotingCommand(R.GET_MAX_OFFSET, ext_fields={"topic": topic, "queueId": str(qid)}))
    return int(r.ext_fields["offset"]) if r.code == C.SUCCESS else 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("timer")), [LEVELS, "--timerMaxDelaySec=600",
                                                        f"--metricsPort={free_port()}"]).start()
    try:
        yield c
    finally:
        c.stop()


async def test_deliver_at_ms_and_the_three_properties_deliver_on_time_never_early(cluster):
    addr = cluster.broker_addr
    c = RemotingClient()
    try:
        async with Producer("TimerP", cluster.namesrv_addr, instance_name="timer-p") as p:
            at = now_ms() + 700
            res = await p.send(Message("TimerA", b"at", deliver_at_ms=at))
            assert res.ok
            assert await queue_size(c, addr, "TimerA", res.queue.queue_id) == 0   # parked, not in its topic
        m, seen = await next_message(c, addr, "TimerA", 0, qid=res.queue.queue_id)
        assert m.body == b"at" and m.topic == "TimerA"
        assert seen >= at and m.store_timestamp >= at, (seen - at, m.store_timestamp - at)
        assert m.store_timestamp - at < 3000
        assert m.properties["TIMER_OUT_MS"] == str(at) and "REAL_TOPIC" not in m.properties
        assert int(m.properties["TIMER_DEQUEUE_MS"]) >= at > int(m.properties["TIMER_ENQUEUE_MS"])

        for i, (name, value, delay_ms) in enumerate((("TIMER_DELAY_SEC", "1", 1000), ("TIMER_DELAY_MS", "600", 600),
                                                    ("TIMER_DELIVER_MS", None, 500))):
            sent = now_ms()
            props = {name: value if value is not None else str(sent + delay_ms)}
            r = await c.invoke(addr, send_cmd("TimerB", b"p%d" % i, props=props))
            assert r.code == C.SUCCESS, r.remark
            m, seen = await next_message(c, addr, "TimerB", i)
            assert m.body == b"p%d" % i
            due = int(m.properties["TIMER_OUT_MS"])
            assert due >= sent + delay_ms - 5 and m.store_timestamp >= due and seen >= due, name
    finally:
        await c.close()


async def test_past_time_delivers_at_once_and_bad_ones_are_refused(cluster):
    addr = cluster.broker_addr
    c = RemotingClient()
    try:
        r = await c.invoke(addr, send_cmd("TimerC", b"past", props={"TIMER_DELIVER_MS": str(now_ms() - 60_000)}))
        assert r.code == C.SUCCESS
        assert await queue_size(c, addr, "TimerC") == 1          # stored in its topic at once
        r = await c.invoke(addr, send_cmd("TimerC", b"far", props={"TIMER_DELAY_SEC": "601"}))
        assert r.code == C.MESSAGE_ILLEGAL
        assert r.remark == ("timer message illegal, the delay time should not be bigger than the max delay "
                            "600000ms; or if set del msg, the delay time should be bigger than the current time")
        r = await c.invoke(addr, send_cmd("TimerC", b"bad", props={"TIMER_DELAY_MS": "soon"}))
        assert r.code == C.MESSAGE_ILLEGAL and "TIMER_DELAY_MS must be a whole number" in r.remark
        r = await c.invoke(addr, send_cmd(TIMER_TOPIC, b"forged", props={"REAL_TOPIC": "TimerC"}))
        assert r.code == C.NO_PERMISSION
        r = await c.invoke(addr, send_cmd("TimerC", b"", batch=True, props={"TIMER_DELAY_SEC": "5"}))
        assert r.code == C.MESSAGE_ILLEGAL and "batch" in r.remark
        assert await queue_size(c, addr, "TimerC") == 1
    finally:
        await c.close()


async def test_delay_levels_unaffected_and_win_over_timer_properties(cluster):
    addr = cluster.broker_addr
    c = RemotingClient()
    try:
        sent = now_ms()
        r = await c.invoke(addr, send_cmd("TimerD", b"level", props={"DELAY": "1", "TIMER_DELAY_SEC": "300"}))
        assert r.code == C.SUCCESS
        m, seen = await next_message(c, addr, "TimerD", 0)
        assert m.body == b"level" and seen - sent >= 900 and "TIMER_OUT_MS" not in m.properties
        assert m.properties["REAL_TOPIC"] == "TimerD"       # the schedule's copy, as before
    finally:
        await c.close()


async def test_pending_timers_survive_sigkill_and_delivered_ones_are_not_repeated(tmp_path):
    cluster = Cluster(str(tmp_path), ["--timerFlushIntervalMs=100"]).start()
    c = RemotingClient()
    try:
        addr = cluster.broker_addr
        first = now_ms() + 300
        assert (await c.invoke(addr, send_cmd("TimerK", b"first", props={"TIMER_DELIVER_MS": str(first)}))).code == 0
        m, _ = await next_message(c, addr, "TimerK", 0)
        assert m.body == b"first"
        later = [now_ms() + 1500 + 200 * i for i in range(3)]
        for i, at in enumerate(later):
            r = await c.invoke(addr, send_cmd("TimerK", b"later%d" % i, props={"TIMER_DELIVER_MS": str(at)}))
            assert r.code == C.SUCCESS
        # the checkpoint covering "first" (written within timerFlushIntervalMs of a change)
        deadline = time.monotonic() + 5
        while await queue_size(c, addr, TIMER_TOPIC, 1) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert await queue_size(c, addr, TIMER_TOPIC, 1) > 0
        assert await queue_size(c, addr, "TimerK") == 1          # the later ones still waiting
        await c.close()
        cluster.restart_broker(kill=True)                        # SIGKILL
        c = RemotingClient()
        addr = cluster.broker_addr
        for i, at in enumerate(later):
            got = await next_message(c, addr, "TimerK", 1 + i)
            assert got is not None, f"later{i} lost"
            m, seen = got
            assert m.body == b"later%d" % i and m.store_timestamp >= at and seen >= at
        assert await queue_size(c, addr, "TimerK") == 4          # "first" was not delivered again
        assert "timer: rebuilding from queue offset" in cluster.broker.log_text()
    finally:
        await c.close()
        cluster.stop()


async def test_waiting_timers_are_a_metrics_gauge(cluster):
    port = next(a.split("=")[1] for a in cluster.broker_args if a.startswith("--metricsPort="))

    def waiting() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return float(re.search(r"^pocketmq_timer_messages_waiting\{[^}]*\} (\S+)$", text, re.M).group(1))

    c = RemotingClient()
    try:
        before = await asyncio.to_thread(waiting)
        r = await c.invoke(cluster.broker_addr, send_cmd("TimerM", b"later", props={"TIMER_DELAY_SEC": "500"}))
        assert r.code == C.SUCCESS
        assert await asyncio.to_thread(waiting) == before + 1
    finally:
        await c.close()
