"""Looking messages up: by key (QUERY_MESSAGE over every broker of the topic) and by id
(VIEW_MESSAGE_BY_ID for an offsetMsgId; the index for a client msgId). Java's
MQAdminImpl.queryMessage / viewMessage, for ClientInstance users; the producers and
consumers expose them as `query_message` / `view_message` (QueryMixin).

Paging. A broker answers at most its `maxMsgsNumBatch` (64) records per request, newest
first. For a larger `max_num` this module pages the way Java's users do: it asks again
with the end time moved back to the oldest store time it got (inclusive, duplicates
dropped by commit-log offset), until a page brings nothing new. More records of one key
than one page holds stored within the same millisecond cannot be told apart by time:
the pager then steps one millisecond back and says so in the log.
"""
from __future__ import annotations

import logging

from pocketmq.client.errors import (BrokerError, ClientStateError, InvalidArgumentError, MessageNotFoundError,
                                    NoRouteError)
from pocketmq.client.replica import find_broker_address_in_admin
from pocketmq.protocol.headers.typed import LONG_MAX, QueryMessageRequestHeader
from pocketmq.protocol.message import decode_offset_msg_id

__all__ = ["query_message", "query_route", "view_message", "view_route", "QueryMixin", "DEFAULT_UNIQUE_MAX_NUM"]

log = logging.getLogger("pocketmq.client")

DEFAULT_UNIQUE_MAX_NUM = 32      # Java's defaultQueryMaxNum: what a broker answers a unique-key query


def _broker_addrs(route) -> list[tuple[str, str]]:
    """(brokerName, address) per group of the route: reads go to the master, else a slave."""
    out = []
    for bd in sorted(route.broker_datas, key=lambda b: b.broker_name):
        found = find_broker_address_in_admin(bd.broker_addrs)
        if found is not None:
            out.append((bd.broker_name, found[0]))
    return out


def _matches(m, topic: str, key: str, unique: bool) -> bool:
    # a Java broker answers every entry of the key's hash slot: check the records
    if m.topic != topic:
        return False
    if unique:
        return m.msg_id == key
    return key in m.keys or m.msg_id == key


async def _route(inst, topic: str):
    route = await inst.fetch_route(topic)
    if route is None or not route.broker_datas:
        raise NoRouteError(f"topic {topic} is not known to the nameserver")
    return route


async def _query_broker(api, addr: str, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int,
                        unique: bool) -> dict:
    found: dict[int, object] = {}
    hi = end_ms
    # The broker answers at most min(max_num, its maxMsgsNumBatch) records a page, a cap
    # the client does not know; a page that spanned several milliseconds shows it is at
    # least that long.
    page_cap = 0
    while len(found) < max_num and hi >= begin_ms:
        # ask for the whole max_num every time: a page starts with the records already
        # seen in its newest millisecond (hi is inclusive), the new ones come after them
        header = QueryMessageRequestHeader(topic, key, max_num, begin_ms, hi, unique)
        page, _progress = await api.query_message(addr, header)
        if not page:
            break
        new = [m for m in page if m.commit_log_offset not in found]
        for m in new:
            if _matches(m, topic, key, unique):
                found[m.commit_log_offset] = m
        if unique:
            break                 # the broker answered its fixed number; nothing to page
        oldest = min(m.store_timestamp for m in page)
        if oldest < max(m.store_timestamp for m in page):
            page_cap = max(page_cap, len(page))
        if not new:
            if oldest < hi:
                break             # nothing older than what we have
            # Every record of the page is in millisecond hi and already seen: either that
            # is all [begin, hi] holds, or the millisecond holds more than a page. Only a
            # page as long as the client's max_num or as a page seen to be capped says
            # which; otherwise (one message found, say) this is no sign of anything missing.
            if len(page) >= max_num or (page_cap and len(page) >= page_cap):
                log.warning("query %s#%s on %s: more records than one page in millisecond %d; "
                            "some of them may be missing", topic, key, addr, oldest)
            hi = oldest - 1
            continue
        hi = oldest
    return found


def _check_query(key, max_num: int, begin_ms: int, end_ms: int | None) -> int:
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError("key must be a non-empty string")
    if not isinstance(max_num, int) or max_num <= 0:
        raise InvalidArgumentError("max_num must be a positive int")
    end_ms = LONG_MAX if end_ms is None else end_ms
    if begin_ms < 0 or end_ms < begin_ms:
        raise InvalidArgumentError(f"bad time range [{begin_ms}, {end_ms}]")
    return end_ms


async def query_route(api, route, topic: str, key: str, max_num: int = 64, begin_ms: int = 0,
                      end_ms: int | None = None, *, unique_key: bool = False) -> list:
    """query_message over a route already fetched (mqadmin's way in)."""
    end_ms = _check_query(key, max_num, begin_ms, end_ms)
    found: dict = {}
    for broker_name, addr in _broker_addrs(route):
        per_broker = await _query_broker(api, addr, topic, key, max_num, begin_ms, end_ms, unique_key)
        for off, m in per_broker.items():
            found[(broker_name, off)] = m
    msgs = sorted(found.values(), key=lambda m: (m.store_timestamp, m.commit_log_offset), reverse=True)
    return msgs[:max_num]


async def query_message(inst, topic: str, key: str, max_num: int = 64, begin_ms: int = 0,
                        end_ms: int | None = None, *, unique_key: bool = False) -> list:
    """The messages of `topic` whose KEYS hold `key` (or whose msgId is `key`), stored in
    [begin_ms, end_ms], newest first, at most `max_num`, from every broker of the topic's
    route (a broker that cannot be reached fails the call)."""
    _check_query(key, max_num, begin_ms, end_ms)
    return await query_route(inst.api, await _route(inst, topic), topic, key, max_num, begin_ms, end_ms,
                             unique_key=unique_key)


async def view_message(inst, msg_id: str, topic: str | None = None):
    """The message with this id. An offsetMsgId (what the broker returned: store host +
    commit-log offset) is read from that broker; with `topic`, a client msgId (UNIQ_KEY,
    SendResult.msg_id) is looked up in the topic's index too, like Java's
    viewMessage(topic, msgId). Raises MessageNotFoundError."""
    if not isinstance(msg_id, str) or not msg_id.strip():
        raise InvalidArgumentError("msg_id must be a non-empty string")
    route = await _route(inst, topic) if topic is not None else None
    return await view_route(inst.api, msg_id, topic, route)


async def view_route(api, msg_id: str, topic: str | None, route):
    """view_message with the topic's route already fetched (None without a topic)."""
    msg_id = msg_id.strip().upper()
    try:
        ip, port, offset = decode_offset_msg_id(msg_id)
    except ValueError as e:
        decoded = None
        why = str(e)
    else:
        decoded = (f"{ip}:{port}", offset)
        why = None
    if decoded is not None:
        addr, offset = decoded
        # a client msgId has the offsetMsgId's length too: with a topic, only ask a
        # broker of its route (a made-up address would cost a connect timeout)
        if route is None or addr in {a for _n, a in _broker_addrs(route)}:
            try:
                m = await api.view_message(addr, offset)
                if topic is None or m.topic == topic:
                    return m
            except BrokerError as e:
                if route is None:
                    raise MessageNotFoundError(f"message {msg_id} not found on broker {addr}: "
                                               f"{e.remark or e}") from None
    if route is None:
        raise MessageNotFoundError(f"{msg_id} is not an offsetMsgId ({why}); pass topic= to look up a client "
                                   "msgId (UNIQ_KEY)")
    msgs = await query_route(api, route, topic, msg_id, DEFAULT_UNIQUE_MAX_NUM, unique_key=True)
    if not msgs:
        raise MessageNotFoundError(f"no message {msg_id} in topic {topic}")
    return min(msgs, key=lambda m: (m.store_timestamp, m.commit_log_offset))   # the first stored copy


class QueryMixin:
    """query_message / view_message on a started producer or consumer (Java's MQAdmin)."""

    def _query_instance(self):
        inst = getattr(self, "instance", None)
        if inst is None:
            raise ClientStateError(f"{type(self).__name__} not started")
        return inst

    async def query_message(self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0,
                            end_ms: int | None = None) -> list:
        """Messages of `topic` with `key` among their keys, newest first (see client/query.py)."""
        return await query_message(self._query_instance(), topic, key, max_num, begin_ms, end_ms)

    async def view_message(self, msg_id: str, topic: str | None = None):
        """The message with this offsetMsgId, or with this client msgId when `topic` is given."""
        return await view_message(self._query_instance(), msg_id, topic)
