"""ClientAPI: one method per request code, the only place the client builds request headers.

Like the Java client's MQClientAPIImpl: every method takes the broker (or nameserver)
address it talks to plus a small request value, builds the RemotingCommand, and turns
the response into a value (statuses that are expected outcomes, such as PULL_NOT_FOUND,
are values) or a typed exception from client.errors (`error_for`: the one code-to-class
table). Nothing here knows routes, consumers or timers: callers resolve addresses
(ClientInstance.master_addr_refreshing, the nameserver's cluster info...).

The transport is the ClientInstance (`instance.api`): its `invoke` prepares a broker
connection on first use (header codec, heartbeat). An admin tool without producers or
consumers uses the same object: `ClientInstance(client_id, namesrv).api`, no start()
needed (connections are dialled on demand; no heartbeat is sent when nothing is
registered).

| method                      | request code                          |
|-----------------------------|---------------------------------------|
| send_message                | SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE  |
| pull_message                | PULL_MESSAGE                          |
| query_consumer_offset       | QUERY_CONSUMER_OFFSET                 |
| update_consumer_offset      | UPDATE_CONSUMER_OFFSET                |
| max_offset / min_offset     | GET_MAX_OFFSET / GET_MIN_OFFSET       |
| search_offset               | SEARCH_OFFSET_BY_TIMESTAMP            |
| earliest_msg_store_time     | GET_EARLIEST_MSG_STORETIME            |
| consumer_id_list            | GET_CONSUMER_LIST_BY_GROUP            |
| send_back                   | CONSUMER_SEND_MSG_BACK                |
| lock_batch / unlock_batch   | LOCK_BATCH_MQ / UNLOCK_BATCH_MQ       |
| heartbeat                   | HEART_BEAT                            |
| unregister_client           | UNREGISTER_CLIENT                     |
| get_route / get_route_json  | GET_ROUTEINFO_BY_TOPIC (nameserver)   |
| cluster_info                | GET_BROKER_CLUSTER_INFO (nameserver)  |
| topic_list                  | GET_ALL_TOPIC_LIST_FROM_NAMESERVER    |
| put_kv_config               | PUT_KV_CONFIG (nameserver)            |
| delete_topic_in_namesrv     | DELETE_TOPIC_IN_NAMESRV               |
| create_topic                | UPDATE_AND_CREATE_TOPIC               |
| delete_topic_in_broker      | DELETE_TOPIC_IN_BROKER                |
| topic_stats                 | GET_TOPIC_STATS_INFO                  |
| broker_runtime_info         | GET_BROKER_RUNTIME_INFO               |
| view_broker_stats_data      | VIEW_BROKER_STATS_DATA                |
| broker_ha_status            | GET_BROKER_HA_STATUS                  |
| query_topic_consume_by_who  | QUERY_TOPIC_CONSUME_BY_WHO            |
| consume_stats               | GET_CONSUME_STATS                     |
| consumer_connection_list    | GET_CONSUMER_CONNECTION_LIST          |
| consumer_running_info       | GET_CONSUMER_RUNNING_INFO (via broker)|
| consume_message_directly    | CONSUME_MESSAGE_DIRECTLY (via broker) |
| view_message                | VIEW_MESSAGE_BY_ID                    |
| query_message               | QUERY_MESSAGE                         |
| reset_offset                | INVOKE_BROKER_TO_RESET_OFFSET         |
| update_subscription_group   | UPDATE_AND_CREATE_SUBSCRIPTIONGROUP   |
| delete_subscription_group   | DELETE_SUBSCRIPTIONGROUP              |
| all_subscription_groups     | GET_ALL_SUBSCRIPTIONGROUP_CONFIG      |
| check_client_config         | CHECK_CLIENT_CONFIG                   |
| end_transaction             | END_TRANSACTION                       |
| producer_connection_list    | GET_PRODUCER_CONNECTION_LIST          |
| broker_config               | GET_BROKER_CONFIG                     |
| update_broker_config        | UPDATE_BROKER_CONFIG                  |
| clean_expired_consume_queue | CLEAN_EXPIRED_CONSUMEQUEUE            |
| clone_group_offset          | CLONE_GROUP_OFFSET                    |
| wipe_write_perm             | WIPE_WRITE_PERM_OF_BROKER (nameserver)|
| add_write_perm              | ADD_WRITE_PERM_OF_BROKER (nameserver) |
| delete_kv_config            | DELETE_KV_CONFIG (nameserver)         |
| namesrv_config              | GET_NAMESRV_CONFIG (nameserver)       |
"""
from __future__ import annotations

import logging
from typing import NamedTuple

from pocketmq.client.errors import (
    QueryNotFoundError,
    error_for,
    wrap_remoting,
)
from pocketmq.common.properties_file import ConfigError, decode_properties, format_properties, parse_properties
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import (
    DataVersion,
    MessageQueue,
    SubscriptionGroupConfig,
    ConsumeMessageDirectlyResult,
    TopicConfig,
    TopicRouteData,
    decode_cluster_info,
    decode_consumer_running_info,
    decode_mq_set,
    decode_reset_offset_body,
    decode_subscription_group_wrapper,
    dumps,
    encode_lock_body,
    loads,
)
from pocketmq.protocol.codes import (
    CURRENT_VERSION,
    LanguageCode,
    PullSysFlag,
    RequestCode,
    ResponseCode,
)
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.errors import BodyError
from pocketmq.protocol.headers.typed import (
    ConsumeMessageDirectlyRequestHeader,
    EndTransactionRequestHeader,
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    SendMessageRequestHeader,
    decode_query_message_response_header,
    encode_consume_message_directly_header,
    encode_end_transaction_header,
    encode_query_message_header,
    encode_send_header,
)
from pocketmq.remoting.connection import RemotingError

log = logging.getLogger("pocketmq.client")

DEFAULT_TIMEOUT_S = 3.0
SEND_BACK_TIMEOUT_S = 5.0

_PYTHON = int(LanguageCode.PYTHON)
_SEND_OK_CODES = (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT,
                  ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE)


# -- request values -------------------------------------------------------------------------

class PullRequest(NamedTuple):
    """One PULL_MESSAGE. FOUND records are protocol.message.MessageExt, or with raw=True the
    tuples of protocol.message.decode_records_raw (for MessageExt.from_raw), or with
    raw=PULL_BODY none: the PullResult carries the undecoded body (for a column-wise
    reader; decode_pull_body decodes it as the other modes would)."""
    addr: str
    group: str
    mq: MessageQueue
    offset: int
    max_nums: int
    sys_flag: int
    commit_offset: int
    suspend_ms: int
    subscription: str | None
    sub_version: int
    timeout_s: float
    expression_type: str = "TAG"
    raw: bool | str = False


PULL_BODY = "body"      # PullRequest.raw: hand the FOUND body out undecoded (PullResult.body)


class SendBackRequest(NamedTuple):
    """One CONSUMER_SEND_MSG_BACK: the broker re-sends the message to %RETRY%<group>
    (or the DLQ after max_reconsume_times; None: the header is left out and the
    subscription group's retryMaxTimes applies, which a sent value would override)."""
    addr: str
    group: str
    commit_log_offset: int
    delay_level: int
    origin_msg_id: str
    origin_topic: str
    max_reconsume_times: int | None


class ResetOffsetRequest(NamedTuple):
    """INVOKE_BROKER_TO_RESET_OFFSET: the broker resets `group` on `topic` to `timestamp_ms`
    (-1: to the max offsets) and tells the group's online consumers."""
    topic: str
    group: str
    timestamp_ms: int
    force: bool = True


class PullResult:
    """Outcome of one PULL_MESSAGE (a value: statuses are not errors)."""
    __slots__ = (
        "max_offset",
        "min_offset",
        "body",
        "next_begin_offset",
        "records",
        "status",
        "suggest_which_broker_id",
    )

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"

    def __init__(self, status, next_begin_offset, min_offset, max_offset, records, suggest=0, body=None):
        self.body = body        # the undecoded FOUND body of a raw=PULL_BODY pull, else None
        self.status = status
        self.next_begin_offset = next_begin_offset
        self.min_offset = min_offset
        self.max_offset = max_offset
        self.records = records
        self.suggest_which_broker_id = suggest

    def __repr__(self):
        return (f"PullResult({self.status}, next={self.next_begin_offset}, min={self.min_offset}, "
                f"max={self.max_offset}, n={len(self.records)})")


_PULL_STATUS = {
    ResponseCode.SUCCESS: PullResult.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullResult.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullResult.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullResult.OFFSET_ILLEGAL,
}


def pull_sys_flag(commit_offset: bool, suspend: bool, subscription: bool) -> int:
    flag = 0
    if commit_offset:
        flag |= PullSysFlag.COMMIT_OFFSET
    if suspend:
        flag |= PullSysFlag.SUSPEND
    if subscription:
        flag |= PullSysFlag.SUBSCRIPTION
    return flag


def pull_ext_fields(req: PullRequest) -> dict:
    """A PULL_MESSAGE's extFields straight from the request: equal to
    encode_pull_header(PullMessageRequestHeader(...)) (pinned by
    tests/unit/test_client_fastpaths.py), without the header object per pull."""
    mq = req.mq
    d = {"consumerGroup": req.group, "topic": mq.topic, "queueId": str(mq.queue_id),
         "queueOffset": str(req.offset), "maxMsgNums": str(req.max_nums), "sysFlag": str(req.sys_flag),
         "commitOffset": str(req.commit_offset), "suspendTimeoutMillis": str(req.suspend_ms),
         "subVersion": str(req.sub_version)}
    if req.subscription is not None:
        d["subscription"] = req.subscription
        if req.expression_type is not None:
            d["expressionType"] = req.expression_type
    return d


def _queue_ext(mq: MessageQueue) -> dict:
    return {"topic": mq.topic, "queueId": str(mq.queue_id)}


def _str_ext(ext: dict) -> dict:
    # extFields travel as strings (Java's HashMap<String, String>)
    return {k: v if type(v) is str else ("true" if v is True else "false" if v is False else str(v))
            for k, v in ext.items()}


def decode_pull_body(body, mq: MessageQueue, addr: str, raw: bool = True) -> list:
    """A FOUND pull body -> its records (decode_records_raw tuples, or MessageExt with
    raw=False), salvaging around undecodable records (_salvage); a body whose framing is
    broken raises SYSTEM_ERROR. What pull_message does with the body, for a caller that
    asked for it undecoded (PULL_BODY)."""
    decode = msgcodec.decode_records_raw if raw else msgcodec.decode_records
    try:
        return decode(body)
    except ValueError as e:
        records = _salvage(body, decode, mq, e)
        if records is None:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"undecodable pull body: {e}", addr) from None
        return records


def _salvage(body, decode, mq, error) -> list | None:
    """A pull body with a record that cannot be decoded (a body that does not inflate,
    properties that are not UTF-8...): keep the good records and skip the bad ones with an
    error log, so one poisoned message cannot stall its queue forever. None when the
    framing itself is broken (record sizes make no sense): nothing can be trusted."""
    salvaged = msgcodec.decode_records_skipping(body, decode)
    if salvaged is None:
        return None
    records, skipped = salvaged
    for queue_offset, reason in skipped:
        log.error("skipping undecodable message %s offset %d: %s", mq, queue_offset, reason)
    log.warning("pull body of %s had undecodable records (%s); %d decoded", mq, error, len(records))
    return records


class ClientAPI:
    """The request methods over a transport (a ClientInstance: invoke, invoke_oneway,
    invoke_unprepared, invoke_namesrv and its remoting's connection table)."""

    def __init__(self, transport, timeout_s: float = DEFAULT_TIMEOUT_S):
        self._t = transport
        # The deadline of requests whose method is given none (mqadmin waits longer, like
        # RocketMQ's tools); sends and pulls always carry their own.
        self.timeout_s = timeout_s

    # -- raw plumbing --------------------------------------------------------------------
    def _err(self, resp: RemotingCommand, addr: str | None):
        """The exception for an error response (an ACL deny names the account we signed as)."""
        creds = getattr(self._t, "credentials", None)
        return error_for(resp.code, resp.remark, addr, creds.access_key if creds is not None else None)

    async def _call(self, addr: str, code: int, ext: dict | None = None, body: bytes | None = None,
                    timeout_s: float | None = None) -> RemotingCommand:
        cmd = RemotingCommand(code, ext_fields=ext or {}, body=body if body is not None else b"")
        return await self._t.invoke(addr, cmd, timeout_s or self.timeout_s)

    async def _ok(self, addr: str, code: int, ext: dict | None = None, body: bytes | None = None,
                  timeout_s: float | None = None) -> RemotingCommand:
        resp = await self._call(addr, code, ext, body, timeout_s)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, addr)
        return resp

    def _ready_conn(self, addr: str):
        """The prepared connection to `addr` (heartbeat sent, header codec known), else None:
        the consumer's hot requests (pull, offset commit) then call its request() directly
        instead of the transport's invoke, as the send hot path does."""
        conn = self._t.remoting.connections.get(addr)
        if conn is not None and not conn.closed and "ready" in conn.attrs:
            return conn
        return None

    async def _hot(self, addr: str, code: int, ext: dict, timeout_s: float) -> RemotingCommand:
        """A consumer hot-path request: over the prepared connection when there is one."""
        conn = self._ready_conn(addr)
        if conn is None:
            return await self._t.invoke(addr, RemotingCommand(code, ext_fields=ext), timeout_s)
        try:
            return await conn.request(RemotingCommand(code, 0, 0, None, ext, b"", _PYTHON, CURRENT_VERSION,
                                                      conn.attrs["serialize_type"]), timeout_s)
        except RemotingError as e:
            raise wrap_remoting(e, addr) from None

    async def _maybe_oneway(self, addr: str, cmd: RemotingCommand, oneway: bool) -> None:
        """Oneway (nothing to check), or request and check for SUCCESS."""
        if oneway:
            await self._t.invoke_oneway(addr, cmd)
            return
        resp = await self._t.invoke(addr, cmd, self.timeout_s)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, addr)

    async def _namesrv(self, code: int, ext: dict | None = None, namesrv_addr: str | None = None,
                       timeout_s: float | None = None) -> RemotingCommand:
        """A nameserver request: to `namesrv_addr`, or the configured ones in rotation."""
        timeout_s = timeout_s or self.timeout_s
        cmd = RemotingCommand(code, ext_fields=ext or {})
        try:
            if namesrv_addr is None:
                return await self._t.remoting.invoke_namesrv(cmd, timeout_s)
            return await self._t.remoting.invoke(namesrv_addr, cmd, timeout_s)
        except RemotingError as e:
            raise wrap_remoting(e, namesrv_addr) from None

    @staticmethod
    def _json(resp: RemotingCommand, addr: str, what: str):
        try:
            return loads(resp.body_bytes() or b"{}")
        except (BodyError, ValueError) as e:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"unreadable {what}: {e}", addr) from None

    # -- producer ------------------------------------------------------------------------
    async def send_message(self, addr: str, header: SendMessageRequestHeader | dict, body: bytes, *,
                           batch: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
                           oneway: bool = False) -> RemotingCommand | None:
        """SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE; `header` is a SendMessageRequestHeader or its
        already encoded V2 extFields (client.producer.send_ext_fields). Returns the response
        (SendResult fields are read by the producer), None when oneway."""
        code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
        ext = header if type(header) is dict else encode_send_header(header, v2=True)
        if oneway:
            await self._t.invoke_oneway(addr, RemotingCommand(code, ext_fields=ext, body=body))
            return None
        conn = self._t.remoting.connections.get(addr)
        if conn is not None and not conn.closed and "ready" in conn.attrs:
            # the send hot path: invoke() inlined (one coroutine layer less per send)
            cmd = RemotingCommand(code, 0, 0, None, ext, body, _PYTHON, CURRENT_VERSION,
                                  conn.attrs["serialize_type"])
            try:
                resp = await conn.request(cmd, timeout_s)
            except RemotingError as e:
                raise wrap_remoting(e, addr) from None
        else:
            resp = await self._t.invoke(addr, RemotingCommand(code, ext_fields=ext, body=body), timeout_s)
        if resp.code not in _SEND_OK_CODES:
            raise self._err(resp, addr)
        return resp

    # -- consumer ------------------------------------------------------------------------
    async def pull_message(self, req: PullRequest) -> PullResult:
        """PULL_MESSAGE -> PullResult (FOUND / NO_NEW_MSG / NO_MATCHED_MSG / OFFSET_ILLEGAL)."""
        mq = req.mq
        addr = req.addr
        offset = req.offset
        resp = await self._hot(addr, RequestCode.PULL_MESSAGE, pull_ext_fields(req), req.timeout_s)
        status = _PULL_STATUS.get(resp.code)
        if status is None:
            raise self._err(resp, addr)
        ext = resp.ext_fields
        try:
            nbo = int(ext.get("nextBeginOffset", offset))
            mn = int(ext.get("minOffset", 0))
            mx = int(ext.get("maxOffset", 0))
            suggest = int(ext.get("suggestWhichBrokerId", 0))
        except ValueError:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"bad pull response header {ext}", addr) from None
        records = []
        if status == PullResult.FOUND:
            if req.raw == PULL_BODY:
                return PullResult(status, nbo, mn, mx, records, suggest, resp.body or b"")
            records = decode_pull_body(resp.body, mq, addr, bool(req.raw))
        return PullResult(status, nbo, mn, mx, records, suggest)

    async def _offset(self, code: int, addr: str, ext: dict, timeout_s: float | None = None) -> int:
        resp = await self._ok(addr, code, ext, None, timeout_s)
        key = "timestamp" if code == RequestCode.GET_EARLIEST_MSG_STORETIME else "offset"
        try:
            return int(resp.ext_fields[key])
        except (KeyError, ValueError):
            raise error_for(ResponseCode.SYSTEM_ERROR, f"response without {key}: {resp.ext_fields}", addr) from None

    async def query_consumer_offset(self, addr: str, group: str, mq: MessageQueue) -> int:
        """Stored offset of `group` on `mq`, or -1 when the broker has none (QUERY_NOT_FOUND)."""
        try:
            return await self._offset(RequestCode.QUERY_CONSUMER_OFFSET, addr,
                                      {"consumerGroup": group, **_queue_ext(mq)})
        except QueryNotFoundError:
            return -1

    async def update_consumer_offset(self, addr: str, group: str, mq: MessageQueue, offset: int, *,
                                     oneway: bool = False) -> None:
        ext = {"consumerGroup": group, "topic": mq.topic, "queueId": str(mq.queue_id), "commitOffset": str(offset)}
        if oneway:
            await self._t.invoke_oneway(addr, RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=ext))
            return
        resp = await self._hot(addr, RequestCode.UPDATE_CONSUMER_OFFSET, ext, self.timeout_s)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, addr)

    async def max_offset(self, addr: str, mq: MessageQueue) -> int:
        return await self._offset(RequestCode.GET_MAX_OFFSET, addr, _queue_ext(mq))

    async def min_offset(self, addr: str, mq: MessageQueue) -> int:
        return await self._offset(RequestCode.GET_MIN_OFFSET, addr, _queue_ext(mq))

    async def search_offset(self, addr: str, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self._offset(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, addr,
                                  {**_queue_ext(mq), "timestamp": str(timestamp_ms)})

    async def earliest_msg_store_time(self, addr: str, mq: MessageQueue) -> int:
        return await self._offset(RequestCode.GET_EARLIEST_MSG_STORETIME, addr, _queue_ext(mq))

    async def consumer_id_list(self, addr: str, group: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP: the client ids of `group` the broker knows."""
        resp = await self._ok(addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        d = loads(resp.body) if resp.body else {}
        ids = d.get("consumerIdList") if isinstance(d, dict) else None
        return [str(i) for i in ids or []]

    async def send_back(self, req: SendBackRequest) -> None:
        ext = {"offset": str(req.commit_log_offset), "group": req.group, "delayLevel": str(req.delay_level),
               "originMsgId": req.origin_msg_id, "originTopic": req.origin_topic, "unitMode": "false"}
        if req.max_reconsume_times is not None:
            ext["maxReconsumeTimes"] = str(req.max_reconsume_times)
        await self._ok(req.addr, RequestCode.CONSUMER_SEND_MSG_BACK, ext, None, SEND_BACK_TIMEOUT_S)

    async def lock_batch(self, addr: str, group: str, client_id: str, mqs) -> list[MessageQueue]:
        """LOCK_BATCH_MQ: the queues of `mqs` now locked by `client_id` (orderly consumption)."""
        resp = await self._ok(addr, RequestCode.LOCK_BATCH_MQ, None, encode_lock_body(group, client_id, mqs))
        return decode_mq_set(resp.body, "lockOKMQSet")

    async def unlock_batch(self, addr: str, group: str, client_id: str, mqs, *, oneway: bool = False) -> None:
        await self._maybe_oneway(addr, RemotingCommand(RequestCode.UNLOCK_BATCH_MQ,
                                                       body=encode_lock_body(group, client_id, mqs)), oneway)

    async def end_transaction(self, addr: str, header: EndTransactionRequestHeader, *,
                              oneway: bool = True) -> None:
        """END_TRANSACTION: oneway, as Java sends it (a lost one is settled by the broker's
        check-back); oneway=False waits for the answer and raises on an error code."""
        await self._maybe_oneway(addr, RemotingCommand(RequestCode.END_TRANSACTION,
                                                       ext_fields=encode_end_transaction_header(header)), oneway)

    # -- client registration ---------------------------------------------------------------
    async def heartbeat(self, addr: str, body: bytes, timeout_s: float | None = None) -> None:
        """HEART_BEAT with an encoded HeartbeatData body. Goes over the bare connection
        (invoke_unprepared): it is itself part of preparing a broker connection."""
        timeout_s = timeout_s or self.timeout_s
        resp = await self._t.invoke_unprepared(addr, RemotingCommand(RequestCode.HEART_BEAT, body=body),
                                               timeout_s)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, addr)

    async def check_client_config(self, addr: str, group: str, client_id: str, subscription,
                                  timeout_s: float | None = None) -> None:
        """CHECK_CLIENT_CONFIG: can this broker filter by `subscription` (a SubscriptionData)?
        Raises the broker's answer otherwise (SYSTEM_ERROR when it does not filter by
        SQL92, SUBSCRIPTION_PARSE_FAILED naming the column of a bad expression)."""
        body = dumps({"clientId": client_id, "group": group, "subscriptionData": subscription.to_json()})
        await self._ok(addr, RequestCode.CHECK_CLIENT_CONFIG, None, body, timeout_s)

    async def unregister_client(self, addr: str, client_id: str, *, producer_group: str | None = None,
                                consumer_group: str | None = None,
                                timeout_s: float | None = None) -> None:
        ext = {"clientID": client_id}
        if producer_group:
            ext["producerGroup"] = producer_group
        if consumer_group:
            ext["consumerGroup"] = consumer_group
        await self._call(addr, RequestCode.UNREGISTER_CLIENT, ext, None, timeout_s)

    # -- nameserver ----------------------------------------------------------------------
    async def get_route(self, topic: str, namesrv_addr: str | None = None) -> TopicRouteData | None:
        """GET_ROUTEINFO_BY_TOPIC; None when the nameserver does not know the topic."""
        resp = await self._namesrv(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                   {"topic": topic, "acceptStandardJsonOnly": "true"}, namesrv_addr)
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, namesrv_addr or "nameserver")
        if not resp.body:
            return None
        return TopicRouteData.from_body(resp.body)

    async def get_route_json(self, topic: str, namesrv_addr: str | None = None) -> dict | None:
        """The route as the nameserver's JSON object (what mqadmin topicRoute prints)."""
        resp = await self._namesrv(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, namesrv_addr)
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        where = namesrv_addr or "nameserver"
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, where)
        return self._json(resp, where, f"route of {topic}")

    async def cluster_info(self, namesrv_addr: str | None = None) -> tuple[dict, dict]:
        """GET_BROKER_CLUSTER_INFO -> ({brokerName: BrokerData}, {cluster: [brokerName]})."""
        where = namesrv_addr or "nameserver"
        resp = await self._namesrv(RequestCode.GET_BROKER_CLUSTER_INFO, None, namesrv_addr)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, where)
        try:
            return decode_cluster_info(resp.body_bytes() or b"{}")
        except (BodyError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"unreadable cluster info: {e}", where) from None

    async def topic_list(self, namesrv_addr: str | None = None) -> list[str]:
        where = namesrv_addr or "nameserver"
        resp = await self._namesrv(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, None, namesrv_addr)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, where)
        d = self._json(resp, where, "topic list")
        topics = d.get("topicList") if isinstance(d, dict) else None
        return [str(t) for t in topics or []]

    async def put_kv_config(self, namespace: str, key: str, value: str,
                            namesrv_addr: str | None = None) -> None:
        resp = await self._namesrv(RequestCode.PUT_KV_CONFIG,
                                   {"namespace": namespace, "key": key, "value": value}, namesrv_addr)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, namesrv_addr or "nameserver")

    async def delete_kv_config(self, namespace: str, key: str, namesrv_addr: str | None = None) -> None:
        resp = await self._namesrv(RequestCode.DELETE_KV_CONFIG, {"namespace": namespace, "key": key},
                                   namesrv_addr)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, namesrv_addr or "nameserver")

    async def _perm_of_broker(self, code: int, count_key: str, broker_name: str,
                              namesrv_addr: str | None) -> int:
        where = namesrv_addr or "nameserver"
        resp = await self._namesrv(code, {"brokerName": broker_name}, namesrv_addr)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, where)
        try:
            return int(resp.ext_fields[count_key])
        except (KeyError, ValueError):
            raise error_for(ResponseCode.SYSTEM_ERROR, f"response without {count_key}: {resp.ext_fields}",
                            where) from None

    async def wipe_write_perm(self, broker_name: str, namesrv_addr: str | None = None) -> int:
        """WIPE_WRITE_PERM_OF_BROKER: the nameserver drops the write permission of every
        queue of `broker_name` in its routes; returns how many topics changed."""
        return await self._perm_of_broker(RequestCode.WIPE_WRITE_PERM_OF_BROKER, "wipeTopicCount",
                                          broker_name, namesrv_addr)

    async def add_write_perm(self, broker_name: str, namesrv_addr: str | None = None) -> int:
        """ADD_WRITE_PERM_OF_BROKER: every queue of `broker_name` becomes read-write again."""
        return await self._perm_of_broker(RequestCode.ADD_WRITE_PERM_OF_BROKER, "addTopicCount",
                                          broker_name, namesrv_addr)

    async def namesrv_config(self, namesrv_addr: str | None = None) -> dict[str, str]:
        """GET_NAMESRV_CONFIG: the nameserver's config as {key: value}."""
        where = namesrv_addr or "nameserver"
        resp = await self._namesrv(RequestCode.GET_NAMESRV_CONFIG, None, namesrv_addr)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, where)
        return self._properties(resp, where, "nameserver config")

    @staticmethod
    def _properties(resp: RemotingCommand, addr: str, what: str) -> dict[str, str]:
        try:
            return {e.key: e.value for e in parse_properties(decode_properties(resp.body_bytes() or b""))}
        except ConfigError as e:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"unreadable {what}: {e}", addr) from None

    async def delete_topic_in_namesrv(self, topic: str, namesrv_addr: str | None = None) -> None:
        resp = await self._namesrv(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic}, namesrv_addr)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, namesrv_addr or "nameserver")

    # -- broker administration ---------------------------------------------------------------
    async def create_topic(self, addr: str, config: TopicConfig, default_topic: str) -> None:
        """UPDATE_AND_CREATE_TOPIC with a TopicConfig."""
        ext = _str_ext({"topic": config.topic_name, "defaultTopic": default_topic,
                        "readQueueNums": config.read_queue_nums, "writeQueueNums": config.write_queue_nums,
                        "perm": config.perm, "topicFilterType": config.topic_filter_type,
                        "topicSysFlag": config.topic_sys_flag, "order": config.order})
        await self._ok(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)

    async def delete_topic_in_broker(self, addr: str, topic: str) -> None:
        await self._ok(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})

    async def topic_stats(self, addr: str, topic: str) -> dict:
        """GET_TOPIC_STATS_INFO: the broker's TopicStatsTable as parsed JSON."""
        return self._json(await self._ok(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}),
                          addr, "topic stats")

    async def broker_runtime_info(self, addr: str, *, unprepared: bool = False) -> dict:
        """GET_BROKER_RUNTIME_INFO: {"table": {key: value}}. `unprepared`: over the bare
        connection (the ClientInstance asks it to choose the connection's header codec)."""
        cmd = RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO)
        if unprepared:
            resp = await self._t.invoke_unprepared(addr, cmd, self.timeout_s)
        else:
            resp = await self._t.invoke(addr, cmd, self.timeout_s)
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, addr)
        return self._json(resp, addr, "runtime info")

    async def view_broker_stats_data(self, addr: str, stats_name: str, stats_key: str) -> dict:
        """VIEW_BROKER_STATS_DATA: Java's BrokerStatsData {statsMinute, statsHour, statsDay:
        {sum, tps, avgpt}} of one stats item (e.g. TOPIC_PUT_NUMS + topic, GROUP_GET_NUMS +
        "topic@group"); a broker that has no such item answers SYSTEM_ERROR."""
        resp = await self._ok(addr, RequestCode.VIEW_BROKER_STATS_DATA,
                              {"statsName": stats_name, "statsKey": stats_key})
        return self._json(resp, addr, "broker stats data")

    async def broker_ha_status(self, addr: str) -> dict:
        """GET_BROKER_HA_STATUS: RocketMQ 5's HARuntimeInfo as parsed JSON (`master`,
        `haConnectionInfo` on a master, `haClientRuntimeInfo` on a slave; pocketmq's fields:
        broker/processors/ha_status.py)."""
        return self._json(await self._ok(addr, RequestCode.GET_BROKER_HA_STATUS), addr, "HA status")

    async def query_topic_consume_by_who(self, addr: str, topic: str) -> list[str]:
        """QUERY_TOPIC_CONSUME_BY_WHO: the groups that consume `topic` on the broker at `addr`
        (subscribed now or with committed offsets)."""
        d = self._json(await self._ok(addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": topic}),
                       addr, "topic consumers")
        groups = d.get("groupList") if isinstance(d, dict) else None
        return sorted(str(g) for g in groups or ())

    async def consume_stats(self, addr: str, group: str, topic: str | None = None) -> dict:
        ext = {"consumerGroup": group}
        if topic:
            ext["topic"] = topic
        return self._json(await self._ok(addr, RequestCode.GET_CONSUME_STATS, ext), addr, "consume stats")

    async def consumer_connection_list(self, addr: str, group: str) -> dict:
        return self._json(await self._ok(addr, RequestCode.GET_CONSUMER_CONNECTION_LIST,
                                         {"consumerGroup": group}), addr, "consumer connections")

    async def producer_connection_list(self, addr: str, group: str) -> dict:
        """GET_PRODUCER_CONNECTION_LIST: {"connectionSet": [{clientId, clientAddr, language,
        version}]} of the group's producers connected to that broker."""
        return self._json(await self._ok(addr, RequestCode.GET_PRODUCER_CONNECTION_LIST,
                                         {"producerGroup": group}), addr, "producer connections")

    async def broker_config(self, addr: str) -> tuple[dict[str, str], dict]:
        """GET_BROKER_CONFIG -> ({key: value}, the config's dataVersion as JSON)."""
        resp = await self._ok(addr, RequestCode.GET_BROKER_CONFIG)
        version = {}
        if resp.ext_fields and resp.ext_fields.get("version"):
            try:
                version = loads(resp.ext_fields["version"].encode())
            except (BodyError, ValueError):
                version = {}
        return self._properties(resp, addr, "broker config"), version

    async def update_broker_config(self, addr: str, properties: dict[str, str]) -> str | None:
        """UPDATE_BROKER_CONFIG with `key=value` lines; returns the broker's remark (pocketmq
        says there when the change could not be persisted)."""
        resp = await self._ok(addr, RequestCode.UPDATE_BROKER_CONFIG, None,
                              format_properties(properties.items()).encode("utf-8"))
        return resp.remark

    async def clean_expired_consume_queue(self, addr: str) -> str | None:
        """CLEAN_EXPIRED_CONSUMEQUEUE; returns the broker's remark (what it deleted)."""
        return (await self._ok(addr, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE)).remark

    async def clone_group_offset(self, addr: str, src_group: str, dest_group: str, topic: str | None,
                                 offline: bool) -> int | None:
        """CLONE_GROUP_OFFSET: dest_group's offsets on that broker become src_group's. Returns
        how many topics had offsets to clone (None from a broker that does not say: Java's)."""
        ext = {"srcGroup": src_group, "destGroup": dest_group, "offline": "true" if offline else "false"}
        if topic:
            ext["topic"] = topic
        resp = await self._ok(addr, RequestCode.CLONE_GROUP_OFFSET, ext)
        try:
            return int(resp.ext_fields["clonedTopicCount"])
        except (KeyError, TypeError, ValueError):
            return None

    async def consumer_running_info(self, addr: str, group: str, client_id: str, jstack: bool = False) -> dict:
        """The client `client_id`'s ConsumerRunningInfo, relayed by the broker at `addr`
        (decode_consumer_running_info's dict)."""
        resp = await self._ok(addr, RequestCode.GET_CONSUMER_RUNNING_INFO,
                              {"consumerGroup": group, "clientId": client_id,
                               "jstackEnable": "true" if jstack else "false"}, timeout_s=15.0)
        try:
            return decode_consumer_running_info(resp.body_bytes() or b"{}")
        except (BodyError, ValueError) as e:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"unreadable consumer running info: {e}", addr) from None

    async def consume_message_directly(self, addr: str, group: str, client_id: str, msg_id: str,
                                       timeout_s: float = 15.0) -> ConsumeMessageDirectlyResult:
        """CONSUME_MESSAGE_DIRECTLY: the broker at `addr` (the one storing the message) hands the
        message `msg_id` (its offsetMsgId) to the client `client_id` of `group`, whose listener
        runs on it without committing anything; returns that client's answer. The broker waits
        10 s for the client (CONSUME_MSG_TIMEOUT after that), so the default wait here is longer."""
        header = ConsumeMessageDirectlyRequestHeader(group, client_id, msg_id)
        resp = await self._ok(addr, RequestCode.CONSUME_MESSAGE_DIRECTLY,
                              encode_consume_message_directly_header(header), timeout_s=timeout_s)
        try:
            return ConsumeMessageDirectlyResult.decode(resp.body_bytes() or b"")
        except (BodyError, ValueError) as e:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"unreadable ConsumeMessageDirectlyResult: {e}",
                            addr) from None

    async def view_message(self, addr: str, commit_log_offset: int):
        """VIEW_MESSAGE_BY_ID -> protocol.message.MessageExt of the record at that offset."""
        resp = await self._ok(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(commit_log_offset)})
        try:
            return msgcodec.decode_record(resp.body_bytes())
        except ValueError as e:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"undecodable message: {e}", addr) from None

    async def query_message(self, addr: str, header: QueryMessageRequestHeader) -> tuple[list, QueryMessageResponseHeader]:
        """QUERY_MESSAGE -> (the MessageExts the broker's index found, newest first, and the
        index's progress). QUERY_NOT_FOUND is an empty list, not an error."""
        resp = await self._call(addr, RequestCode.QUERY_MESSAGE, encode_query_message_header(header))
        head = decode_query_message_response_header(resp.ext_fields or {})
        if resp.code == ResponseCode.QUERY_NOT_FOUND:
            return [], head
        if resp.code != ResponseCode.SUCCESS:
            raise self._err(resp, addr)
        try:
            return msgcodec.decode_records(resp.body_bytes()), head
        except ValueError as e:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"undecodable query answer: {e}", addr) from None

    async def update_subscription_group(self, addr: str, config: SubscriptionGroupConfig) -> None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: `config` replaces the group's config on the
        broker at `addr` (answered once the broker persisted it)."""
        await self._ok(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, dumps(config.to_json()))

    async def delete_subscription_group(self, addr: str, group: str, remove_offset: bool = False) -> None:
        """DELETE_SUBSCRIPTIONGROUP (and the group's committed offsets with remove_offset)."""
        await self._ok(addr, RequestCode.DELETE_SUBSCRIPTIONGROUP,
                       {"groupName": group, "removeOffset": "true" if remove_offset else "false"})

    async def all_subscription_groups(self, addr: str) -> tuple[dict[str, SubscriptionGroupConfig], DataVersion]:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG: the broker's groups by name and its data version."""
        resp = await self._ok(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        try:
            return decode_subscription_group_wrapper(loads(resp.body_bytes() or b"{}"))
        except (BodyError, ValueError) as e:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"unreadable subscription groups: {e}", addr) from None

    async def reset_offset(self, addr: str, req: ResetOffsetRequest) -> dict[MessageQueue, int]:
        """INVOKE_BROKER_TO_RESET_OFFSET -> {MessageQueue: new offset} on that broker."""
        ext = {"topic": req.topic, "group": req.group, "timestamp": str(req.timestamp_ms),
               "isForce": "true" if req.force else "false"}
        resp = await self._ok(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext)
        if not resp.body:
            return {}
        try:
            return decode_reset_offset_body(resp.body_bytes())
        except (BodyError, ValueError) as e:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"unreadable reset offset answer: {e}", addr) from None

    # -- plain ACL (admin codes 50-54) ----------------------------------------------------
    async def update_acl_config(self, addr: str, config: dict) -> None:
        """UPDATE_AND_CREATE_ACL_CONFIG (50): create or update one account. `config` holds
        accessKey, secretKey and optionally whiteRemoteAddress, admin, defaultTopicPerm,
        defaultGroupPerm, topicPerms and groupPerms (lists, sent comma-joined as Java's
        PlainAccessConfig header). Failure: UPDATE_AND_CREATE_ACL_CONFIG_FAILED (209)."""
        ext = {}
        for key, value in config.items():
            if value is None:
                continue
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, (list, tuple)):
                value = ",".join(value)
            ext[key] = str(value)
        await self._ok(addr, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, ext)

    async def delete_acl_config(self, addr: str, access_key: str) -> None:
        """DELETE_ACL_CONFIG (51). Failure: DELETE_ACL_CONFIG_FAILED (210)."""
        await self._ok(addr, RequestCode.DELETE_ACL_CONFIG, {"accessKey": access_key})

    async def acl_version_info(self, addr: str) -> dict:
        """GET_BROKER_CLUSTER_ACL_INFO (52): the answer's header, with `version` (the main
        file's DataVersion) and `allAclFileVersion` ({file: DataVersion}) decoded."""
        resp = await self._ok(addr, RequestCode.GET_BROKER_CLUSTER_ACL_INFO)
        head = dict(resp.ext_fields or {})
        try:
            head["version"] = loads((head.get("version") or "{}").encode())
            head["allAclFileVersion"] = loads((head.get("allAclFileVersion") or "{}").encode())
        except (BodyError, ValueError) as e:
            raise error_for(ResponseCode.SYSTEM_ERROR, f"unreadable ACL version info: {e}", addr) from None
        return head

    async def update_global_white_addrs(self, addr: str, addrs: str, acl_file: str | None = None) -> None:
        """UPDATE_GLOBAL_WHITE_ADDRS_CONFIG (53): `addrs` a comma list (replaces the file's
        globalWhiteRemoteAddresses; the main file unless `acl_file`). Failure: 211."""
        ext = {"globalWhiteAddrs": addrs}
        if acl_file:
            ext["aclFileFullPath"] = acl_file
        await self._ok(addr, RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, ext)

    async def acl_config(self, addr: str) -> dict:
        """GET_BROKER_CLUSTER_ACL_CONFIG (54): {"globalWhiteAddrs": [...], "plainAccessConfigs":
        [{accessKey, secretKey, whiteRemoteAddress, admin, defaultTopicPerm, defaultGroupPerm,
        topicPerms, groupPerms}, ...]}."""
        resp = await self._ok(addr, RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG)
        return self._json(resp, addr, "ACL config")


__all__ = [
    "ClientAPI",
    "PULL_BODY",
    "PullRequest",
    "PullResult",
    "ResetOffsetRequest",
    "SendBackRequest",
    "decode_pull_body",
    "pull_sys_flag",
]
