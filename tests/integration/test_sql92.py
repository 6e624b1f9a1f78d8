"""SQL92 filtering over real TCP: the broker (enablePropertyFilter) driven with raw
RemotingCommands, then our PushConsumer and LitePullConsumer with MessageSelector.by_sql."""
import asyncio
import time

import pytest

from pocketmq.client import LitePullConsumer, Message, MessageSelector, Producer, PushConsumer
from pocketmq.client.push_consumer import CONSUME_SUCCESS
from pocketmq.protocol import bodies
from pocketmq.protocol.codes import PullSysFlag, RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import SendMessageRequestHeader, encode_send_header
from pocketmq.protocol.message import decode_records, encode_properties
from pocketmq.remoting.client import RemotingClient
from tests.support.events import Sink
from tests.support.local import local_cluster

pytestmark = pytest.mark.asyncio

FILTER_ON = "--enablePropertyFilter=true"


def send_cmd(topic, body, props, queue_id=0):
    h = SendMessageRequestHeader("pg", topic, "TBW102", 1, queue_id, 0, int(time.time() * 1000), 0,
                                 encode_properties(props), 0, False, False, None)
    return RemotingCommand(R.SEND_MESSAGE_V2, ext_fields=encode_send_header(h, v2=True), body=body)


def pull_cmd(topic, offset, sql, *, group="g1", suspend_ms=0, with_subscription=True, sub_version=0,
             expression_type="SQL92"):
    flag = (PullSysFlag.SUBSCRIPTION if with_subscription else 0) | (PullSysFlag.SUSPEND if suspend_ms else 0)
    ext = {"consumerGroup": group, "topic": topic, "queueId": "0", "queueOffset": str(offset),
           "maxMsgNums": "32", "sysFlag": str(flag), "commitOffset": "0",
           "suspendTimeoutMillis": str(suspend_ms), "subVersion": str(sub_version)}
    if with_subscription:
        ext["subscription"] = sql
        ext["expressionType"] = expression_type
    return RemotingCommand(R.PULL_MESSAGE, ext_fields=ext)


def heartbeat_cmd(group, topic, sql, sub_version):
    sub = bodies.SubscriptionData(topic, sql, [], [], sub_version, "SQL92")
    hb = bodies.HeartbeatData("10.0.0.9@hb", consumer_data_set=[
        bodies.ConsumerData(group, subscription_data_set=[sub])])
    return RemotingCommand(R.HEART_BEAT, body=bodies.dumps(hb.to_json()))


def check_config_cmd(sql, expression_type="SQL92"):
    body = {"clientId": "10.0.0.9@x", "group": "g1",
            "subscriptionData": {"topic": "T", "subString": sql, "expressionType": expression_type,
                                 "subVersion": 1, "tagsSet": [], "codeSet": [], "classFilterMode": False}}
    return RemotingCommand(R.CHECK_CLIENT_CONFIG, body=bodies.dumps(body))


MIXED = [  # (props, matches "a > 5 AND region = 'eu'")
    ({"a": "7", "region": "eu", "TAGS": "A"}, True),
    ({"a": "3", "region": "eu"}, False),
    ({"a": "9", "region": "us"}, False),
    ({"region": "eu"}, False),                      # a missing: unknown -> not matched
    ({"a": "12", "region": "eu", "TAGS": "B"}, True),
    ({"a": "x", "region": "eu"}, False),            # does not convert: not matched
    ({"a": "6", "region": "eu"}, True),
]
SQL = "a > 5 AND region = 'eu'"


@pytest.fixture
async def filtering(tmp_path):
    async with local_cluster(str(tmp_path), FILTER_ON, "--defaultTopicQueueNums=1") as (ns, broker):
        client = RemotingClient()
        try:
            yield ns, broker, client
        finally:
            await client.close()


async def send_mixed(client, broker, topic="T"):
    for i, (props, _) in enumerate(MIXED):
        r = await client.invoke(broker.addr, send_cmd(topic, b"m%d" % i, props))
        assert r.code == C.SUCCESS, r.remark


async def test_pull_with_sql92_subscription_returns_only_matches(filtering):
    ns, broker, c = filtering
    await send_mixed(c, broker)
    p = await c.invoke(broker.addr, pull_cmd("T", 0, SQL))
    assert p.code == C.SUCCESS, p.remark
    assert [m.body for m in decode_records(p.body)] == [b"m0", b"m4", b"m6"]
    assert p.ext_fields["nextBeginOffset"] == str(len(MIXED))
    # TAGS is a property like any other
    p = await c.invoke(broker.addr, pull_cmd("T", 0, "TAGS IN ('B', 'C') OR a IS NULL"))
    assert [m.body for m in decode_records(p.body)] == [b"m3", b"m4"]


async def test_pull_where_nothing_matches_still_advances(filtering):
    ns, broker, c = filtering
    await send_mixed(c, broker)
    p = await c.invoke(broker.addr, pull_cmd("T", 1, "region = 'asia'"))
    assert p.code == C.PULL_RETRY_IMMEDIATELY and p.remark == "NO_MATCHED_MESSAGE"
    assert p.ext_fields["nextBeginOffset"] == str(len(MIXED))
    assert not p.body


async def test_held_pull_is_woken_by_a_new_message_and_refiltered(filtering):
    ns, broker, c = filtering
    r = await c.invoke(broker.addr, send_cmd("T", b"first", {"a": "1"}))
    assert r.code == C.SUCCESS
    held = asyncio.ensure_future(c.invoke(broker.addr, pull_cmd("T", 1, "a >= 10", suspend_ms=20_000), 30))
    await asyncio.sleep(0)
    t0 = time.monotonic()
    assert (await c.invoke(broker.addr, send_cmd("T", b"late", {"a": "10"}))).code == C.SUCCESS
    p = await held
    assert time.monotonic() - t0 < 5         # woken by the message, not by its 20 s timeout
    assert p.code == C.SUCCESS and [m.body for m in decode_records(p.body)] == [b"late"]
    # a non-matching arrival wakes the pull too; the replay answers NO_MATCHED and moves on
    held = asyncio.ensure_future(c.invoke(broker.addr, pull_cmd("T", 2, "a >= 10", suspend_ms=20_000), 30))
    await asyncio.sleep(0)
    assert (await c.invoke(broker.addr, send_cmd("T", b"small", {"a": "2"}))).code == C.SUCCESS
    p = await held
    assert p.code == C.PULL_RETRY_IMMEDIATELY and p.ext_fields["nextBeginOffset"] == "3"


async def test_invalid_expression_is_refused_with_its_column(filtering):
    ns, broker, c = filtering
    await send_mixed(c, broker)
    p = await c.invoke(broker.addr, pull_cmd("T", 0, "a > 5 AND region = "))
    assert p.code == C.SUBSCRIPTION_PARSE_FAILED
    assert "column 20" in p.remark and "end of input" in p.remark, p.remark
    p = await c.invoke(broker.addr, pull_cmd("T", 0, "a > 'five'"))
    assert p.code == C.SUBSCRIPTION_PARSE_FAILED and "column 5" in p.remark, p.remark
    p = await c.invoke(broker.addr, pull_cmd("T", 0, ""))
    assert p.code == C.SUBSCRIPTION_PARSE_FAILED


async def test_subscription_registered_by_heartbeat_filters_pulls_without_one(filtering):
    ns, broker, c = filtering
    await send_mixed(c, broker)
    assert (await c.invoke(broker.addr, heartbeat_cmd("hbg", "T", SQL, 5))).code == C.SUCCESS
    p = await c.invoke(broker.addr, pull_cmd("T", 0, None, group="hbg", with_subscription=False, sub_version=5))
    assert p.code == C.SUCCESS, p.remark
    assert [m.body for m in decode_records(p.body)] == [b"m0", b"m4", b"m6"]
    # a newer subscription than the registered one is not served
    p = await c.invoke(broker.addr, pull_cmd("T", 0, None, group="hbg", with_subscription=False, sub_version=6))
    assert p.code == C.SUBSCRIPTION_NOT_LATEST
    # a heartbeat with an expression that does not compile is accepted (as Java does);
    # the pulls name the error
    assert (await c.invoke(broker.addr, heartbeat_cmd("hbg", "T", "a >", 7))).code == C.SUCCESS
    p = await c.invoke(broker.addr, pull_cmd("T", 0, None, group="hbg", with_subscription=False, sub_version=7))
    assert p.code == C.SUBSCRIPTION_PARSE_FAILED and "column 4" in p.remark, p.remark


async def test_check_client_config(filtering):
    ns, broker, c = filtering
    r = await c.invoke(broker.addr, check_config_cmd(SQL))
    assert r.code == C.SUCCESS, r.remark
    r = await c.invoke(broker.addr, check_config_cmd("TagA || TagB", "TAG"))
    assert r.code == C.SUCCESS
    r = await c.invoke(broker.addr, check_config_cmd("a BETWEEN 5 AND"))
    assert r.code == C.SUBSCRIPTION_PARSE_FAILED and "column 16" in r.remark, r.remark
    r = await c.invoke(broker.addr, RemotingCommand(R.CHECK_CLIENT_CONFIG))     # no body: nothing to check
    assert r.code == C.SUCCESS


async def test_filter_off_answers_as_java(tmp_path):
    async with local_cluster(str(tmp_path)) as (ns, broker):
        c = RemotingClient()
        try:
            await send_mixed(c, broker)
            p = await c.invoke(broker.addr, pull_cmd("T", 0, SQL))
            assert p.code == C.SYSTEM_ERROR
            assert p.remark == "The broker does not support consumer to filter message by SQL92"
            r = await c.invoke(broker.addr, check_config_cmd(SQL))
            assert r.code == C.SYSTEM_ERROR and "SQL92" in r.remark
            r = await c.invoke(broker.addr, check_config_cmd("*", "TAG"))
            assert r.code == C.SUCCESS
            # the heartbeat itself is accepted; pulls using it are refused
            assert (await c.invoke(broker.addr, heartbeat_cmd("hbg", "T", SQL, 5))).code == C.SUCCESS
            p = await c.invoke(broker.addr, pull_cmd("T", 0, None, group="hbg", with_subscription=False))
            assert p.code == C.SYSTEM_ERROR
        finally:
            await c.close()


# --------------------------------------------------------------------------- our client

def stream(n):
    """A mixed stream: i, with properties a=i%10, region by i%3, TAGS by i%2."""
    for i in range(n):
        yield i, {"a": str(i % 10), "region": ("eu", "us", "asia")[i % 3]}, ("TagA", "TagB")[i % 2]


def expected(n):
    return sorted(i for i, p, tag in stream(n) if int(p["a"]) > 5 and p["region"] == "eu")


async def produce(ns, topic, n):
    async with Producer("PG", ns, instance_name="prod") as p:
        for i, props, tag in stream(n):
            await p.send(Message(topic, b"%d" % i, tags=tag, properties=props))


async def test_push_consumer_by_sql_receives_exactly_the_matching_messages(tmp_path):
    async with asyncio.timeout(60):
        async with local_cluster(str(tmp_path), FILTER_ON) as (ns, broker):
            await produce(ns, "TS", 60)
            want = expected(60)
            got = Sink()

            async def listener(msg):
                got.append(int(msg.body))
                return CONSUME_SUCCESS
            c = PushConsumer("SQLG", ns, listener=listener, instance_name="sq1", consume_from_where="FIRST_OFFSET")
            c.subscribe("TS", MessageSelector.by_sql(SQL))
            async with c:
                await got.until(lambda s: len(s) >= len(want))
                # later messages arrive through held pulls that the broker re-filters
                async with Producer("PG", ns, instance_name="prod2") as p:
                    await p.send(Message("TS", b"1000", properties={"a": "1", "region": "eu"}))
                    await p.send(Message("TS", b"1001", properties={"a": "8", "region": "eu"}))
                await got.until(lambda s: 1001 in s)
            assert sorted(got) == want + [1001]


async def test_lite_pull_consumer_by_sql_and_by_tag(tmp_path):
    async with asyncio.timeout(60):
        async with local_cluster(str(tmp_path), FILTER_ON) as (ns, broker):
            await produce(ns, "TL", 60)
            want = expected(60)
            c = LitePullConsumer("LSQL", ns, instance_name="l1", consume_from_where="FIRST_OFFSET")
            c.subscribe("TL", MessageSelector.by_sql(SQL))
            got = []
            async with c:
                while len(got) < len(want):
                    got += [int(m.body) for m in await c.poll(1.0)]
            assert sorted(got) == want
            c2 = LitePullConsumer("LTAG", ns, instance_name="l2", consume_from_where="FIRST_OFFSET")
            c2.subscribe("TL", MessageSelector.by_tag("TagB"))
            got = []
            async with c2:
                while len(got) < 30:
                    got += [int(m.body) for m in await c2.poll(1.0)]
            assert sorted(got) == list(range(1, 60, 2))



async def route_known(ns, topic):
    c = RemotingClient()
    try:
        for _ in range(250):        # the broker registers an auto-created topic within ~100 ms
            r = await c.invoke(ns, RemotingCommand(R.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic}))
            if r.code == C.SUCCESS:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"no route for {topic}")
    finally:
        await c.close()


async def test_push_consumer_start_fails_with_the_brokers_answer(tmp_path):
    """Java's checkClientInBroker: a push consumer with an SQL92 subscription asks the broker
    (CHECK_CLIENT_CONFIG) before it starts, and start() raises the broker's refusal."""
    from pocketmq.client.errors import BrokerSystemError, SubscriptionError

    async def listener(msg):
        return CONSUME_SUCCESS

    async with asyncio.timeout(60):
        for args, sql, error, words in ((["--enablePropertyFilter=false"], SQL, BrokerSystemError, "SQL92"),
                                        ([FILTER_ON], "a > 5 AND", SubscriptionError, "column 10")):
            root = tmp_path / error.__name__
            async with local_cluster(str(root), *args) as (ns, broker):
                await produce(ns, "TC", 3)
                await route_known(ns, "TC")         # else the check is skipped, as in Java
                c = PushConsumer("CHK", ns, listener=listener, instance_name="chk")
                c.subscribe("TC", MessageSelector.by_sql(sql))
                with pytest.raises(error, match=words):
                    await c.start()
                assert c.state == "CREATED"
                c2 = PushConsumer("CHK", ns, listener=listener, instance_name="chk")
                c2.subscribe("TC", MessageSelector.by_tag("*"))
                async with c2:                      # the failed start left nothing registered
                    assert c2.state == "RUNNING"
