"""QUERY_MESSAGE end to end without sockets: the typed headers, the broker's processor
over a MemoryStore, and the client's merging and paging (client/query.py) over a fake
ClientAPI."""
from __future__ import annotations

import dataclasses

import pytest

from pocketmq.client.errors import MessageNotFoundError, NoRouteError
from pocketmq.client.query import query_route, view_route
from pocketmq.protocol.bodies import BrokerData, QueueData, TopicRouteData
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import (QueryMessageRequestHeader, QueryMessageResponseHeader,
                                             decode_query_message_header, decode_query_message_response_header,
                                             encode_query_message_header, encode_query_message_response_header)
from pocketmq.protocol.errors import HeaderError
from pocketmq.protocol.message import decode_records
from tests.unit.test_broker_processors import Env, send_cmd


def test_headers_round_trip_and_errors():
    h = QueryMessageRequestHeader("T", "k", 32, 0, 99, True)
    ext = encode_query_message_header(h)
    assert ext == {"topic": "T", "key": "k", "maxNum": "32", "beginTimestamp": "0", "endTimestamp": "99",
                   "_UNIQUE_KEY_QUERY": "true"}
    assert decode_query_message_header(ext) == h
    assert "_UNIQUE_KEY_QUERY" not in encode_query_message_header(dataclasses.replace(h, unique_key=False))
    with pytest.raises(HeaderError, match="key"):
        decode_query_message_header({"topic": "T", "maxNum": "1", "beginTimestamp": "0", "endTimestamp": "1"})
    with pytest.raises(HeaderError, match="maxNum"):
        decode_query_message_header({**ext, "maxNum": "x"})
    r = QueryMessageResponseHeader(5, 6)
    assert decode_query_message_response_header(encode_query_message_response_header(r)) == r


def indexed_env(tmp_path, **cfg) -> Env:
    env = Env(tmp_path, **cfg)
    env.store.config = dataclasses.replace(env.store.config, message_index_enable=True)
    return env


def query_cmd(topic, key, max_num=32, begin=0, end=1 << 62, unique=False):
    return RemotingCommand(R.QUERY_MESSAGE, opaque=3, ext_fields=encode_query_message_header(
        QueryMessageRequestHeader(topic, key, max_num, begin, end, unique)))


def test_query_message_processor(tmp_path):
    env = indexed_env(tmp_path)
    for i in range(3):
        env.now += 10
        assert env.call(send_cmd("TopicQ", f"b{i}".encode(), props={"KEYS": "k1 k2", "UNIQ_KEY": f"U{i}"})).code == C.SUCCESS
    r = env.call(query_cmd("TopicQ", "k2"))
    assert r.code == C.SUCCESS and r.opaque == 3
    assert [m.body for m in decode_records(r.body)] == [b"b2", b"b1", b"b0"]
    assert int(r.ext_fields["indexLastUpdateTimestamp"]) == env.now
    assert int(r.ext_fields["indexLastUpdatePhyoffset"]) > 0
    assert [m.body for m in decode_records(env.call(query_cmd("TopicQ", "k1", max_num=2)).body)] == [b"b2", b"b1"]
    # a unique-key query answers up to defaultQueryMaxNum, whatever maxNum says
    r = env.call(query_cmd("TopicQ", "U1", max_num=0, unique=True))
    assert [m.body for m in decode_records(r.body)] == [b"b1"]
    r = env.call(query_cmd("TopicQ", "nope"))
    assert r.code == C.QUERY_NOT_FOUND and "maybe time range not correct" in r.remark
    assert "indexLastUpdateTimestamp" in r.ext_fields
    assert env.call(query_cmd("TopicQ", "k1", end=1000)).code == C.QUERY_NOT_FOUND
    bad = RemotingCommand(R.QUERY_MESSAGE, ext_fields={"topic": "bad topic!", "key": "k", "maxNum": "1",
                                                       "beginTimestamp": "0", "endTimestamp": "1"})
    with pytest.raises(HeaderError):
        env.call(bad)


def test_view_message_by_id_processor(tmp_path):
    env = indexed_env(tmp_path)
    env.call(send_cmd("TopicQ", b"x"))
    ok = env.call(RemotingCommand(R.VIEW_MESSAGE_BY_ID, ext_fields={"offset": "0"}))
    assert ok.code == C.SUCCESS and decode_records(ok.body)[0].body == b"x"
    for off in ("1", "999999", "-1"):
        r = env.call(RemotingCommand(R.VIEW_MESSAGE_BY_ID, ext_fields={"offset": off}))
        assert r.code == C.SYSTEM_ERROR and f"by the offset, {off}" in r.remark


# --------------------------------------------------------------------------- client paging


class FakeMsg:
    def __init__(self, topic, off, ts, keys=("K",), uniq=None):
        self.topic, self.commit_log_offset, self.store_timestamp = topic, off, ts
        self.keys = keys
        self.msg_id = uniq or f"ID{off}"


class FakeAPI:
    """A broker's index: answers newest first, at most `cap` per request, inclusive range."""

    def __init__(self, per_addr, cap=64):
        self.per_addr = per_addr
        self.cap = cap
        self.requests = []

    async def query_message(self, addr, h):
        self.requests.append((addr, h))
        hits = [m for m in self.per_addr.get(addr, [])
                if h.begin_timestamp <= m.store_timestamp <= h.end_timestamp
                and (h.key in m.keys or m.msg_id == h.key)]
        hits.sort(key=lambda m: m.commit_log_offset, reverse=True)
        return hits[:min(h.max_num, self.cap if not h.unique_key else 32)], QueryMessageResponseHeader(0, 0)

    async def view_message(self, addr, offset):
        for m in self.per_addr.get(addr, []):
            if m.commit_log_offset == offset:
                return m
        from pocketmq.client.errors import error_for
        raise error_for(C.SYSTEM_ERROR, f"can not find message by the offset, {offset}", addr)


def route(*names):
    return TopicRouteData([QueueData(n, 4, 4, 6, 0) for n in names],
                          [BrokerData("C", n, {0: f"10.0.0.{i}:10911"}) for i, n in enumerate(names, 1)])


async def test_paging_past_the_cap_with_shared_milliseconds():
    # 300 messages, 5 per millisecond (a page of 64 always ends inside a millisecond)
    msgs = [FakeMsg("T", i * 100, 1000 + i // 5) for i in range(300)]
    api = FakeAPI({"10.0.0.1:10911": msgs})
    got = await query_route(api, route("a"), "T", "K", 1000)
    assert [m.commit_log_offset for m in got] == [m.commit_log_offset for m in reversed(msgs)]
    assert 5 <= len(api.requests) <= 8
    assert [m.commit_log_offset for m in await query_route(api, route("a"), "T", "K", 7)] == [29900 - 100 * i
                                                                                            for i in range(7)]


async def test_too_many_in_one_millisecond_steps_back(caplog):
    msgs = [FakeMsg("T", 200 + i, 5000) for i in range(100)] + [FakeMsg("T", i, 4000) for i in range(3)]
    api = FakeAPI({"10.0.0.1:10911": msgs}, cap=64)
    got = await query_route(api, route("a"), "T", "K", 1000)
    # 64 of the 100 in millisecond 5000 are reachable, then the pager moves past it; no page
    # showed the broker's cap (every one held a single millisecond), so nothing says that
    # millisecond held more than the 64 seen: no warning
    assert len(got) == 67 and "more records than one page" not in caplog.text
    # with newer records first, the first page spans two milliseconds and shows the cap
    msgs += [FakeMsg("T", 1000 + i, 6000) for i in range(10)]
    caplog.clear()
    got = await query_route(api, route("a"), "T", "K", 1000)
    assert len(got) == 77 and "more records than one page in millisecond 5000" in caplog.text


async def test_one_message_found_without_a_warning(caplog):
    api = FakeAPI({"10.0.0.1:10911": [FakeMsg("T", 7, 5000)]})
    got = await query_route(api, route("a"), "T", "K", 64)
    assert [m.commit_log_offset for m in got] == [7]
    assert "more records than one page" not in caplog.text
    # the first page, the same millisecond again (the broker's cap is unknown), then older
    assert [(h.begin_timestamp, h.end_timestamp) for _a, h in api.requests][1:] == [(0, 5000), (0, 4999)]


async def test_merge_across_brokers_and_filters():
    a = [FakeMsg("T", 10, 100), FakeMsg("T", 20, 300), FakeMsg("Other", 30, 400)]
    b = [FakeMsg("T", 10, 200), FakeMsg("T", 40, 50, keys=("K2",))]
    api = FakeAPI({"10.0.0.1:10911": a, "10.0.0.2:10911": b})
    got = await query_route(api, route("a", "b"), "T", "K", 10)
    assert [(m.commit_log_offset, m.store_timestamp) for m in got] == [(20, 300), (10, 200), (10, 100)]
    assert await query_route(api, route("a", "b"), "T", "K", 10, 150, 250) == [b[0]]
    with pytest.raises(ValueError):
        await query_route(api, route("a"), "T", "K", 10, 5, 4)
    with pytest.raises(ValueError):
        await query_route(api, route("a"), "T", "K", 0)


async def test_view_route_offset_id_and_unique_key():
    m = FakeMsg("T", 0x1234, 100, uniq="C0A80001000018B4AAC2123456780000")
    api = FakeAPI({"10.0.0.1:10911": [m]})
    oid = "0A000001" + "00002A9F" + "0000000000001234"
    assert await view_route(api, oid, None, None) is m
    assert await view_route(api, oid.lower(), "T", route("a")) is m
    # a client msgId has the same length; with the topic it is found through the index
    assert await view_route(api, m.msg_id, "T", route("a")) is m
    assert all(addr == "10.0.0.1:10911" for addr, _h in api.requests)
    with pytest.raises(MessageNotFoundError, match="pass topic="):
        await view_route(api, "xyz", None, None)
    with pytest.raises(MessageNotFoundError, match="not found on broker"):
        await view_route(api, "0A000001" + "00002A9F" + "0000000000009999", None, None)
    with pytest.raises(MessageNotFoundError, match="no message"):
        await view_route(api, "C0A80001000018B4AAC2123456789999", "T", route("a"))
    assert NoRouteError   # (the instance-level functions raise it for an unknown topic)
