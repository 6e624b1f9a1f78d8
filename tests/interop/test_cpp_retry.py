"""Retries, dead letters and auto-created topics with the Apache C++ push consumer
(rocketmq==0.4.4, C++ client 1.2.x) against our daemons.

What the C++ consumer does (rocketmq-client-cpp 1.2.x): a failed message is sent back
with CONSUMER_SEND_MSG_BACK carrying only offset (the commit-log offset of the copy it
received), group and delayLevel 0 (no maxReconsumeTimes, no originMsgId/originTopic),
so the broker counts from the stored copy's RECONSUME_TIME and the group's
retryMaxTimes decides; it restores the original topic itself from RETRY_TOPIC.
Its C API hands one pulled batch (up to 32 messages) to the callback one message at a
time and gives up at the first failure, and the whole batch is then sent back: the
messages after the failing one are counted as attempts without ever reaching the
callback. That is why a run with many messages in flight can see 0 then 2; the broker
counts every send-back it receives, exactly as Java's does.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from pocketmq.client import Message, Producer
from pocketmq.client.instance import ClientInstance
from pocketmq.protocol.bodies import MessageQueue, SubscriptionGroupConfig
from pocketmq.protocol.codes import ResponseCode as C
from pocketmq.protocol.message import decode_records
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import pull_cmd

# the `cluster` fixture: a module-scoped mqnamesrv + mqbroker with non-uniform delay levels
# (levels 1-2 long, level 3 (first retry) 1 s, level 4 (second) 2 s, then 1 s)
from tests.integration.test_broker_subscription_groups import levels_cluster  # noqa: F401

pytestmark = [pytest.mark.interop, pytest.mark.slow]


async def produce(cluster, topic: str, bodies: list[bytes]) -> None:
    async with Producer("CppRetryPG", cluster.namesrv_addr) as p:
        for b in bodies:
            await p.send(Message(topic, b))


async def set_group(cluster, cfg: SubscriptionGroupConfig) -> None:
    inst = ClientInstance("test@cpp-retry", cluster.namesrv_addr)
    try:
        await inst.api.update_subscription_group(cluster.broker_addr, cfg)
    finally:
        await inst.close()


async def dead_letters(cluster, group: str) -> list:
    c = RemotingClient()
    try:
        r = await c.invoke(cluster.broker_addr, pull_cmd(f"%DLQ%{group}", 0, 0, group="inspector"))
        return decode_records(r.body) if r.code == C.SUCCESS else []
    finally:
        await c.close()


def deliveries(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "msg"]


def run_push(agent, cluster, group, topic, *extra, timeout=120):
    return agent.run("push", "--ns", cluster.namesrv_addr, "--group", group, "--topic", topic, *extra,
                     timeout=timeout)


async def test_cpp_consumer_sees_reconsume_times_in_order_with_the_topic_restored(agent, cluster):
    topic, group = "CppRetryOrder", "CppRetryOrderG"
    await produce(cluster, topic, [b"retry me"])
    ev = await asyncio.to_thread(run_push, agent, cluster, group, topic, "--fail-until", "2",
                                 "--expect", "3", "--linger", "3", "--seconds", "60")
    got = deliveries(ev)
    assert [(m["reconsume_times"], m["topic"], m["body"], m["failed"]) for m in got] == [
        (0, topic, "retry me", True), (1, topic, "retry me", True), (2, topic, "retry me", False)]
    uniq = {m["props"]["UNIQ_KEY"] for m in got}
    assert len(uniq) == 1 and uniq != {""}
    assert [m["props"]["RETRY_TOPIC"] for m in got] == ["", topic, topic]
    assert got[1]["props"]["ORIGIN_MESSAGE_ID"] and got[1]["props"]["ORIGIN_MESSAGE_ID"] == \
        got[2]["props"]["ORIGIN_MESSAGE_ID"]
    assert await dead_letters(cluster, group) == []


async def test_cpp_always_failing_message_is_dead_after_one_plus_retry_max_times(agent, cluster):
    topic = "CppRetryDead"
    # the group's default (16): the C++ client sends no maxReconsumeTimes
    await produce(cluster, topic, [b"poison"])
    ev = await asyncio.to_thread(run_push, agent, cluster, "CppDeadDefaultG", topic, "--fail-until", "-1",
                                 "--expect", "17", "--linger", "3", "--seconds", "90", timeout=150)
    got = deliveries(ev)
    assert [m["reconsume_times"] for m in got] == list(range(17))
    assert {m["topic"] for m in got} == {topic}
    (letter,) = await dead_letters(cluster, "CppDeadDefaultG")
    assert letter.body == b"poison" and letter.reconsume_times == 17 and letter.properties["RETRY_TOPIC"] == topic
    # retryMaxTimes set for the group: 1 + 3 deliveries
    await set_group(cluster, SubscriptionGroupConfig("CppDeadThreeG", retryMaxTimes=3))
    ev = await asyncio.to_thread(run_push, agent, cluster, "CppDeadThreeG", topic, "--fail-until", "-1",
                                 "--expect", "4", "--linger", "3", "--seconds", "60")
    assert [m["reconsume_times"] for m in deliveries(ev)] == [0, 1, 2, 3]
    (letter,) = await dead_letters(cluster, "CppDeadThreeG")
    assert letter.body == b"poison" and letter.reconsume_times == 4


async def test_cpp_batches_fail_together_and_the_broker_counts_each_send_back(agent, cluster):
    """Ten messages in one pulled batch: the C API stops at the first failure and the whole
    batch is sent back, so some attempts are never shown to the callback; what the callback
    does see only ever goes up, every message ends consumed, none is dead-lettered."""
    topic, group = "CppRetryBatch", "CppRetryBatchG"
    await produce(cluster, topic, [f"b{i}".encode() for i in range(10)])
    ev = await asyncio.to_thread(run_push, agent, cluster, group, topic, "--fail-until", "2",
                                 "--expect", "10", "--linger", "4", "--seconds", "60")
    by_body: dict[str, list[int]] = {}
    for m in deliveries(ev):
        by_body.setdefault(m["body"], []).append(m["reconsume_times"])
    assert sorted(by_body) == sorted(f"b{i}" for i in range(10))
    for body, times in by_body.items():
        assert times == sorted(set(times)) and times[-1] == 2, (body, times)
    assert await dead_letters(cluster, group) == []
    inst = ClientInstance("test@cpp-retry-batch", cluster.namesrv_addr)
    try:
        # every send-back became one retry message: 10 at reconsume 1, 10 at reconsume 2
        assert await inst.api.max_offset(cluster.broker_addr, MessageQueue(f"%RETRY%{group}", "broker-a", 0)) == 20
    finally:
        await inst.close()


async def test_new_cpp_group_on_an_auto_created_topic_receives_what_was_sent_before_it_started(
        agent, cluster, tmp_path):
    topic, start = "CppAutoCreated", str(tmp_path / "start")
    # The consumer process is loaded and waiting; it starts the moment the sends are answered
    # (--seconds counts from its start: everything must arrive within 5 s of it). A route
    # registered after the answer would make it find no topic and wait for its 30 s timer.
    p = agent.start("push", "--ns", cluster.namesrv_addr, "--group", "CppAutoCreatedG", "--topic", topic,
                    "--expect", "5", "--linger", "0.2", "--seconds", "5", "--start-file", start)
    try:
        line = await asyncio.to_thread(p.stdout.readline)
        assert '"ready"' in line, line
        await produce(cluster, topic, [f"early-{i}".encode() for i in range(5)])   # auto-creates the topic
        open(start, "w").close()
        out, err = await asyncio.to_thread(p.communicate, timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err[-2000:]
    got = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert sorted(m["body"] for m in deliveries(got)) == [f"early-{i}" for i in range(5)]
