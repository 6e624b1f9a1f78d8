"""POP consumption over the 4.x remoting wire (POP_MESSAGE / ACK_MESSAGE /
CHANGE_MESSAGE_INVISIBLETIME, RocketMQ 5's headers) against a real broker process:
pop and ack, an unacked message back after its invisible time with reconsume_times + 1,
changed invisibility, forged and stale handles refused with nothing changed, max attempts
-> %DLQ%<group>, FIFO blocking / same attempt id / redelivery, long polling woken by a
send, and the crash test (SIGKILL with messages popped and not acked). Invisible times of
a second or less: the broker's own lower bound is 1 ms (the gRPC endpoint applies 10 s)."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from pocketmq.common.constants import pop_retry_topic
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.message import decode_records
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import pull_cmd, send_cmd
from tests.support.daemons import Cluster
from tests.support.pop_client import PopClient

pytestmark = pytest.mark.asyncio


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("pop"))).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
async def pc(cluster):
    client = RemotingClient()
    try:
        yield PopClient(client, cluster.broker_addr)
    finally:
        await client.close()


async def send(pc: PopClient, topic: str, bodies, queue_id: int = 0) -> None:
    for b in bodies:
        r = await pc.call(send_cmd(topic, body=b, queue_id=queue_id))
        assert r.code == C.SUCCESS, r.remark


async def group(pc: PopClient, name: str, **cfg) -> None:
    r = await pc.call(RemotingCommand(R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                                      body=json.dumps({"groupName": name, **cfg}).encode()))
    assert r.code == C.SUCCESS, r.remark


async def committed(pc: PopClient, g: str, topic: str, qid: int = 0) -> int:
    r = await pc.call(RemotingCommand(R.QUERY_CONSUMER_OFFSET, ext_fields={
        "consumerGroup": g, "topic": topic, "queueId": str(qid)}))
    return int(r.ext_fields["offset"]) if r.code == C.SUCCESS else -1


async def pop_until(pc: PopClient, g: str, topic: str, want: int, wait_ms: int = 8000, **kw):
    """Pop (long polls) until `want` messages came or wait_ms passed: [(message, extraInfo, reconsume, at_ms)]."""
    out = []
    deadline = time.monotonic() + wait_ms / 1000
    while len(out) < want and time.monotonic() < deadline:
        p = await pc.pop(g, topic, poll_ms=max(1, int((deadline - time.monotonic()) * 1000)), **kw)
        at = now_ms()
        assert p.code in (C.SUCCESS, C.POLLING_TIMEOUT), (p.code, p.remark)
        out += [(m, e, r, at) for m, e, r in zip(p.messages, p.extra_infos, p.reconsume)]
    return out


async def test_pop_ack_and_the_unacked_come_back_after_their_invisible_time(pc):
    await send(pc, "PopT1", [b"a", b"b", b"c"])
    p = await pc.pop("PG1", "PopT1", invisible_ms=1000)
    assert p.code == C.SUCCESS and [m.body for m in p.messages] == [b"a", b"b", b"c"]
    assert [m.reconsume_times for m in p.messages] == [0, 0, 0]
    pop_time = int(p.ext["popTime"])
    assert p.ext["startOffsetInfo"] == "0 0 0" and p.ext["msgOffsetInfo"] == "0 0 0,1,2"
    assert (await pc.ack("PG1", "PopT1", p.extra_infos[1])).code == C.SUCCESS
    again = await pc.ack("PG1", "PopT1", p.extra_infos[1])
    assert again.code == C.NO_MESSAGE and "invalid receipt handle" in again.remark
    assert (await pc.pop("PG1", "PopT1")).code == C.POLLING_TIMEOUT      # all three invisible
    assert await committed(pc, "PG1", "PopT1") == 0                      # offset 0 still leased
    back = await pop_until(pc, "PG1", "PopT1", 2)
    assert sorted(m.body for m, *_ in back) == [b"a", b"c"]
    for m, extra, reconsume, at in back:
        assert m.topic == pop_retry_topic("PG1", "PopT1") and m.reconsume_times == reconsume == 1
        assert at >= pop_time + 1000                                     # never before its time
        # a Java 5 client acks a retried message naming the topic it read from
        assert (await pc.ack("PG1", m.topic, extra)).code == C.SUCCESS
    assert await committed(pc, "PG1", "PopT1") == 3                      # consumerProgress sees it
    assert (await pc.pop("PG1", "PopT1")).code == C.POLLING_TIMEOUT


async def test_change_invisible_and_forged_or_stale_handles_change_nothing(pc):
    await send(pc, "PopT2", [b"x"])
    p = await pc.pop("PG2", "PopT2", invisible_ms=60_000)
    [old] = p.extra_infos
    f = old.split(" ")
    forged = [" ".join(f[:1] + [str(int(f[1]) + 1)] + f[2:]),                 # another pop time
              " ".join(f[:7] + ["5"]),                                        # another offset
              old + " 00112233445566778899aabbccddeeff",                      # a bad signature
              "not a handle"]
    for h in forged:
        assert (await pc.ack("PG2", "PopT2", h)).code == C.NO_MESSAGE, h
        r, _ = await pc.change("PG2", "PopT2", h, 100)
        assert r.code == C.NO_MESSAGE, h
    assert (await pc.ack("PG1", "PopT2", old)).code == C.NO_MESSAGE           # another group
    r, new = await pc.change("PG2", "PopT2", old, 300)
    assert r.code == C.SUCCESS and new != old and r.ext_fields["invisibleTime"] == "300"
    assert (await pc.ack("PG2", "PopT2", old)).code == C.NO_MESSAGE           # stale now
    changed_at = int(r.ext_fields["popTime"])
    [(m, extra, reconsume, at)] = await pop_until(pc, "PG2", "PopT2", 1)
    assert m.body == b"x" and reconsume == 1 and at >= changed_at + 300
    assert (await pc.ack("PG2", "PopT2", new)).code == C.NO_MESSAGE           # redelivered: stale
    assert (await pc.ack("PG2", "PopT2", extra)).code == C.SUCCESS


async def test_past_max_attempts_the_message_goes_to_the_groups_dlq(pc):
    await group(pc, "PG3", retryMaxTimes=1)
    await send(pc, "PopT3", [b"poison"])
    p = await pc.pop("PG3", "PopT3", invisible_ms=200)
    assert [m.body for m in p.messages] == [b"poison"]
    [(m, _, reconsume, _)] = await pop_until(pc, "PG3", "PopT3", 1, invisible_ms=200)
    assert reconsume == 1                                                     # the last attempt
    # not back: its time (200 ms) passes during this poll and it goes to the DLQ instead
    assert (await pc.pop("PG3", "PopT3", poll_ms=1500)).code == C.POLLING_TIMEOUT
    r = await pc.call(pull_cmd("%DLQ%PG3", 0, 0, group="PG3"))
    assert r.code == C.SUCCESS, r.remark
    [dead] = decode_records(r.body)
    assert dead.body == b"poison" and dead.reconsume_times == 2
    assert await committed(pc, "PG3", pop_retry_topic("PG3", "PopT3")) == 1


async def test_fifo_queue_blocks_until_acked_same_attempt_id_regets_redelivers_in_place(pc):
    await group(pc, "PG4", consumeMessageOrderly=True)
    await send(pc, "PopT4", [b"m0", b"m1", b"m2", b"m3"])
    p = await pc.pop("PG4", "PopT4", queue_id=0, max_nums=2, invisible_ms=60_000, attempt_id="A")
    assert [m.body for m in p.messages] == [b"m0", b"m1"] and p.ext["reviveQid"] == "999"
    assert p.reconsume == [0, 0]
    assert (await pc.pop("PG4", "PopT4", queue_id=0, attempt_id="B")).code == C.POLLING_TIMEOUT   # blocked
    again = await pc.pop("PG4", "PopT4", queue_id=0, max_nums=2, invisible_ms=60_000, attempt_id="A")
    assert [m.body for m in again.messages] == [b"m0", b"m1"] and again.reconsume == [0, 0]
    assert (await pc.ack("PG4", "PopT4", p.extra_infos[0])).code == C.NO_MESSAGE   # the first answer's: stale
    assert (await pc.ack("PG4", "PopT4", again.extra_infos[0])).code == C.SUCCESS
    assert (await pc.pop("PG4", "PopT4", queue_id=0)).code == C.POLLING_TIMEOUT   # m1 still leased
    assert await committed(pc, "PG4", "PopT4") == 1
    assert (await pc.ack("PG4", "PopT4", again.extra_infos[1])).code == C.SUCCESS
    assert await committed(pc, "PG4", "PopT4") == 2
    nxt = await pc.pop("PG4", "PopT4", queue_id=0, invisible_ms=300)
    assert [m.body for m in nxt.messages] == [b"m2", b"m3"]
    back = await pop_until(pc, "PG4", "PopT4", 2, queue_id=0, invisible_ms=60_000)   # not acked: in place
    assert [(m.body, m.topic, reconsume) for m, _, reconsume, _ in back] == [(b"m2", "PopT4", 1), (b"m3", "PopT4", 1)]
    for _, extra, _, _ in back:
        assert (await pc.ack("PG4", "PopT4", extra)).code == C.SUCCESS
    assert await committed(pc, "PG4", "PopT4") == 4


async def test_long_polling_pop_is_woken_by_a_send(pc):
    await send(pc, "PopT5", [b"first"])                  # creates the topic
    [(_, extra, _, _)] = await pop_until(pc, "PG5", "PopT5", 1, init_mode=0)
    assert (await pc.ack("PG5", "PopT5", extra)).code == C.SUCCESS
    t0 = time.monotonic()
    waiting = asyncio.ensure_future(pc.pop("PG5", "PopT5", poll_ms=20_000, queue_id=-1))
    # the pop parks inside the broker process: nothing there to await from here
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await send(pc, "PopT5", [b"woken"], queue_id=1)
    p = await waiting
    assert p.code == C.SUCCESS and [m.body for m in p.messages] == [b"woken"]
    assert time.monotonic() - t0 < 5


async def test_popped_unacked_messages_come_back_after_a_sigkill_acked_ones_do_not(tmp_path):
    cluster = Cluster(str(tmp_path)).start()
    client = RemotingClient()
    try:
        pc = PopClient(client, cluster.broker_addr)
        await send(pc, "PopCrash", [b"k0", b"k1", b"k2", b"k3"])
        p = await pc.pop("PGC", "PopCrash", invisible_ms=2000)
        assert [m.body for m in p.messages] == [b"k0", b"k1", b"k2", b"k3"]
        pop_time = int(p.ext["popTime"])
        for i in (0, 2):
            assert (await pc.ack("PGC", "PopCrash", p.extra_infos[i])).code == C.SUCCESS
        await client.close()
        await asyncio.to_thread(cluster.restart_broker, True)          # SIGKILL, then start again
        assert "revive log records replayed" in cluster.broker.log_text()   # rebuilt from the CommitLog
        client = RemotingClient()
        pc = PopClient(client, cluster.broker_addr)
        assert (await pc.ack("PGC", "PopCrash", p.extra_infos[0])).code == C.NO_MESSAGE   # still acked
        back = await pop_until(pc, "PGC", "PopCrash", 2, wait_ms=10_000)
        assert sorted(m.body for m, *_ in back) == [b"k1", b"k3"]
        assert all(at >= pop_time + 2000 and reconsume == 1 for _, _, reconsume, at in back)
        for _, extra, _, _ in back:
            assert (await pc.ack("PGC", "PopCrash", extra)).code == C.SUCCESS
        assert (await pc.pop("PGC", "PopCrash", poll_ms=1000)).code == C.POLLING_TIMEOUT   # nothing else
        assert await committed(pc, "PGC", "PopCrash") == 4
    finally:
        await client.close()
        cluster.stop()
