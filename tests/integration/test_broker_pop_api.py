"""The POP engine's Python API (broker/services/pop.py), what the gRPC endpoint calls, on an
in-process broker: signed handles (an unsigned, forged or other-topic handle is refused,
nothing changes), change_invisible's new handle, delivery_attempt, auto-renew leases held
while their owner lives, forward_to_dlq, the in-flight bound and bad arguments."""
from __future__ import annotations

import time

import pytest

from pocketmq.broker.core.pop import InvalidReceiptHandle, PopError
from pocketmq.protocol.codes import ResponseCode as C
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import pull_cmd, send_cmd
from tests.support.local import local_cluster

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def env(tmp_path):
    async with local_cluster(str(tmp_path), "--maxPopInflightMessagesPerGroup=3", "--enablePropertyFilter=true",
                             with_namesrv=False) as (_, b):
        client = RemotingClient()
        try:
            yield b, client
        finally:
            await client.close()


async def send(env, topic, bodies, queue_id=0, tags="TagA"):
    b, client = env
    for body in bodies:
        r = await client.invoke(b.addr, send_cmd(topic, body=body, queue_id=queue_id, tags=tags), 5)
        assert r.code == C.SUCCESS, r.remark


async def test_signed_handles_ack_and_what_is_refused(env):
    svc = env[0].pop_service
    await send(env, "ApiT1", [b"a", b"b"])
    r = await svc.pop("AG1", "ApiT1", max_nums=2, invisible_ms=60_000)
    assert [(p.message.body, p.message.topic, p.delivery_attempt) for p in r.messages] == [
        (b"a", "ApiT1", 1), (b"b", "ApiT1", 1)]
    h = r.messages[0].receipt_handle
    assert len(h.split(" ")) == 10
    unsigned = " ".join(h.split(" ")[:9])
    tampered = h[:-1] + ("0" if h[-1] != "0" else "1")
    for group, topic, handle in (("AG1", "ApiT1", unsigned), ("AG1", "ApiT1", tampered), ("AG2", "ApiT1", h),
                                 ("AG1", "Other", h), ("AG1", "ApiT1", "junk")):
        with pytest.raises(InvalidReceiptHandle) as e:
            await svc.ack(group, topic, handle)
        assert e.value.code == C.NO_MESSAGE
        with pytest.raises(InvalidReceiptHandle):
            await svc.change_invisible(group, topic, handle, 1000)
    await svc.ack("AG1", "ApiT1", h)                     # still valid: nothing above changed it
    with pytest.raises(InvalidReceiptHandle):
        await svc.ack("AG1", "ApiT1", h)
    assert env[0].offsets.query("AG1", "ApiT1", 0) == 1


async def test_change_invisible_gives_a_new_handle_and_the_message_comes_back_attempt_2(env):
    svc = env[0].pop_service
    await send(env, "ApiT2", [b"x"])
    [p] = (await svc.pop("AG", "ApiT2", invisible_ms=60_000)).messages
    new, lease = await svc.change_invisible("AG", "ApiT2", p.receipt_handle, 100)
    assert new != p.receipt_handle and lease.invisible_ms == 100
    with pytest.raises(InvalidReceiptHandle):
        await svc.ack("AG", "ApiT2", p.receipt_handle)
    t0 = time.monotonic()
    [back] = (await svc.pop("AG", "ApiT2", invisible_ms=60_000, poll_ms=5000)).messages
    assert back.message.body == b"x" and back.delivery_attempt == 2 and back.message.topic == "ApiT2"
    assert back.message.real_topic == "%RETRY%AG_ApiT2" and time.monotonic() - t0 < 3
    await svc.ack("AG", "ApiT2", back.receipt_handle)


async def test_auto_renew_holds_the_lease_while_its_owner_lives(env):
    svc = env[0].pop_service
    await send(env, "ApiT3", [b"r"])
    [p] = (await svc.pop("AG", "ApiT3", invisible_ms=100, auto_renew=True, owner="client-1")).messages
    assert not (await svc.pop("AG", "ApiT3", invisible_ms=100, poll_ms=600)).messages   # renewed meanwhile
    svc.release_owner("client-1")
    [back] = (await svc.pop("AG", "ApiT3", invisible_ms=60_000, poll_ms=3000)).messages
    assert back.message.body == b"r" and back.delivery_attempt == 2
    with pytest.raises(InvalidReceiptHandle):
        await svc.ack("AG", "ApiT3", p.receipt_handle)


async def test_forward_to_dlq_and_the_in_flight_bound(env):
    b, client = env
    svc = b.pop_service
    await send(env, "ApiT4", [b"1", b"2", b"3", b"4"])
    r = await svc.pop("AG", "ApiT4", max_nums=4, invisible_ms=60_000)
    assert len(r.messages) == 3                          # maxPopInflightMessagesPerGroup=3
    with pytest.raises(PopError) as e:
        await svc.pop("AG", "ApiT4", invisible_ms=60_000)
    assert e.value.code == C.SYSTEM_BUSY and "POP_FULL" in e.value.remark
    assert (await svc.pop("AG-other", "ApiT4", invisible_ms=60_000, init_mode=0)).messages   # another group: room
    await svc.forward_to_dlq("AG", "ApiT4", r.messages[0].receipt_handle)
    resp = await client.invoke(b.addr, pull_cmd("%DLQ%AG", 0, 0, group="AG"), 5)
    assert resp.code == C.SUCCESS
    [p] = (await svc.pop("AG", "ApiT4", invisible_ms=60_000)).messages       # room again
    assert p.message.body == b"4"
    with pytest.raises(InvalidReceiptHandle):
        await svc.ack("AG", "ApiT4", r.messages[0].receipt_handle)


@pytest.mark.parametrize("kw, code", [
    ({"max_nums": 33}, C.INVALID_PARAMETER), ({"max_nums": 0}, C.INVALID_PARAMETER),
    ({"invisible_ms": 0}, C.INVALID_PARAMETER), ({"invisible_ms": 12 * 3600_000 + 1}, C.INVALID_PARAMETER),
    ({"queue_id": 9}, C.INVALID_PARAMETER), ({"topic": "NoSuchTopic"}, C.TOPIC_NOT_EXIST),
    ({"expression": "a >", "expression_type": "SQL92"}, C.SUBSCRIPTION_PARSE_FAILED),
])
async def test_bad_arguments_raise_pop_error_with_rocketmq_codes(env, kw, code):
    await send(env, "ApiT5", [b"z"])
    args = {"group": "AG", "topic": "ApiT5", **kw}
    with pytest.raises(PopError) as e:
        await env[0].pop_service.pop(**args)
    assert e.value.code == code


async def test_filters_skip_what_does_not_match_and_the_offset_passes_it(env):
    svc = env[0].pop_service
    await send(env, "ApiT6", [b"a1"], tags="A")
    await send(env, "ApiT6", [b"b1"], tags="B")
    await send(env, "ApiT6", [b"a2"], tags="A")
    r = await svc.pop("AG", "ApiT6", invisible_ms=60_000, expression="B")
    assert [p.message.body for p in r.messages] == [b"b1"]
    await svc.ack("AG", "ApiT6", r.messages[0].receipt_handle)
    assert env[0].offsets.query("AG", "ApiT6", 0) == 3          # a1 and a2 filtered out, passed
    r = await svc.pop("AG2", "ApiT6", invisible_ms=60_000, expression="TAGS = 'A'", expression_type="SQL92")
    assert [p.message.body for p in r.messages] == [b"a1", b"a2"]
