"""Typed custom headers (extFields) of the requests pocketmq handles.

Values arrive as strings (the codecs stringify numbers and booleans). Java's
rules apply: a missing required field is an error naming the field; integers
are decimal. Booleans: Java's Boolean.parseBoolean accepts only "true"; we also
accept "1" because the C++ 1.2.x client writes booleans as "0"/"1" and its
batch sends would otherwise be stored as one message (reference 13 item 3).
"""
from __future__ import annotations

from dataclasses import dataclass

from pocketmq.protocol.codes import RequestCode
from pocketmq.protocol.errors import HeaderError
from pocketmq.protocol.names import EXT_NAME_FIELDS, name_error, shown

# Java's int and long: a header number outside its field's type is refused where it is
# parsed, naming the field and the range (not a struct error deep in the store).
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


def req_str(ext: dict, name: str) -> str:
    v = ext.get(name)
    if v is None:
        raise HeaderError(f"the custom field <{name}> is null")
    return v


def opt_str(ext: dict, name: str, default: str | None = None) -> str | None:
    v = ext.get(name)
    # The C++ client sends optional fields as "" (reference 1.3 rule 5).
    return default if v is None or v == "" else v


def _int_in(name: str, v: str, lo: int, hi: int) -> int:
    try:
        n = int(v)
    except ValueError:
        raise HeaderError(f"the custom field <{name}> is not an integer: {shown(v[:64])!r}") from None
    if not lo <= n <= hi:
        raise HeaderError(f"the custom field <{name}> is out of range: {shown(v[:64])} not in [{lo}, {hi}]")
    return n


def req_int(ext: dict, name: str, lo: int = LONG_MIN, hi: int = LONG_MAX) -> int:
    """A required integer, by default a Java long (req_i32 for an int)."""
    v = ext.get(name)
    if v is None:
        raise HeaderError(f"the custom field <{name}> is null")
    return _int_in(name, v, lo, hi)


def opt_int(ext: dict, name: str, default: int | None = None, lo: int = LONG_MIN,
            hi: int = LONG_MAX) -> int | None:
    v = ext.get(name)
    if v is None or v == "":
        return default
    return _int_in(name, v, lo, hi)


def req_i32(ext: dict, name: str) -> int:
    return req_int(ext, name, INT_MIN, INT_MAX)


def opt_i32(ext: dict, name: str, default: int | None = None) -> int | None:
    return opt_int(ext, name, default, INT_MIN, INT_MAX)


# Names check_ext_names found valid, per kind: every request of a client repeats the same
# topic, group and client id, and a regex match per name per request was ~1.5 µs of the
# broker's ~3 µs per pull spent here. Bounded: cleared when a kind holds NAMES_SEEN_MAX.
NAMES_SEEN_MAX = 4096
_names_seen: dict[str, set] = {}


def check_ext_names(ext: dict) -> None:
    """HeaderError naming the first header field that carries a name (topic, consumerGroup,
    producerGroup, group, clientID, brokerName, clusterName...) and breaks the name rules
    (protocol.names). Empty values count as absent (the C++ client sends "" for unused
    optional fields); whether a field is required is the processor's business."""
    if not ext:
        return
    get = ext.get
    seen_of = _names_seen
    for field, kind in EXT_NAME_FIELDS:
        v = get(field)
        if v:
            seen = seen_of.get(kind)
            if seen is None:
                seen = seen_of[kind] = set()
            elif type(v) is str and v in seen:
                continue
            err = name_error(kind, field, v)
            if err is not None:
                raise HeaderError(err)
            if len(seen) >= NAMES_SEEN_MAX:
                seen.clear()
            seen.add(v)


def names_checked(proc):
    """`proc(conn, cmd)` behind check_ext_names: how a role's processor table checks names
    where they enter (the broker's and the nameserver's build_processor_table)."""
    def checked(conn, cmd):
        check_ext_names(cmd.ext_fields)
        return proc(conn, cmd)
    checked.__wrapped__ = proc
    return checked


def parse_bool(v: str | None, default: bool = False) -> bool:
    if v is None or v == "":
        return default
    return v.lower() == "true" or v == "1"


@dataclass(slots=True)
class SendMessageRequestHeader:
    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str | None
    reconsume_times: int
    unit_mode: bool
    batch: bool
    max_reconsume_times: int | None


_V2 = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
       "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
       "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch"}
V1_TO_V2 = {v: k for k, v in _V2.items()}


def decode_send_fields(code: int, ext: dict) -> tuple:
    """The SendMessageRequestHeader fields as a tuple in its field order, without building
    the object (the broker's send hot path). HeaderError names a missing or bad field."""
    v2 = code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)
    try:
        # Fast path: every required field present and decimal.
        g = ext.get
        if v2:
            l_ = g("l")
            t = (ext["a"], ext["b"], ext["c"], int(ext["d"]), int(ext["e"]), int(ext["f"]), int(ext["g"]),
                 int(ext["h"]), g("i"), int(g("j") or 0), parse_bool(g("k")), parse_bool(g("m")),
                 int(l_) if l_ else None)
        else:
            mrt = g("maxReconsumeTimes")
            t = (ext["producerGroup"], ext["topic"], ext["defaultTopic"], int(ext["defaultTopicQueueNums"]),
                 int(ext["queueId"]), int(ext["sysFlag"]), int(ext["bornTimestamp"]), int(ext["flag"]),
                 g("properties"), int(g("reconsumeTimes") or 0), parse_bool(g("unitMode")),
                 parse_bool(g("batch")), int(mrt) if mrt else None)
        # every int field a Java int, bornTimestamp a long; else the slow path names the field
        if (INT_MIN <= t[3] <= INT_MAX and INT_MIN <= t[4] <= INT_MAX and INT_MIN <= t[5] <= INT_MAX
                and LONG_MIN <= t[6] <= LONG_MAX and INT_MIN <= t[7] <= INT_MAX
                and INT_MIN <= t[9] <= INT_MAX and (t[12] is None or INT_MIN <= t[12] <= INT_MAX)):
            return t
    except (KeyError, ValueError):
        pass
    # Slow path: name the missing or malformed field.
    if v2:
        ext = {_V2.get(k, k): v for k, v in ext.items()}
    return (req_str(ext, "producerGroup"), req_str(ext, "topic"), req_str(ext, "defaultTopic"),
            req_i32(ext, "defaultTopicQueueNums"), req_i32(ext, "queueId"), req_i32(ext, "sysFlag"),
            req_int(ext, "bornTimestamp"), req_i32(ext, "flag"), ext.get("properties"),
            opt_i32(ext, "reconsumeTimes", 0), parse_bool(ext.get("unitMode")), parse_bool(ext.get("batch")),
            opt_i32(ext, "maxReconsumeTimes"))


def decode_send_header(code: int, ext: dict) -> SendMessageRequestHeader:
    return SendMessageRequestHeader(*decode_send_fields(code, ext))


def encode_send_header(h: SendMessageRequestHeader, v2: bool = True) -> dict:
    d = {"producerGroup": h.producer_group, "topic": h.topic, "defaultTopic": h.default_topic,
         "defaultTopicQueueNums": str(h.default_topic_queue_nums), "queueId": str(h.queue_id),
         "sysFlag": str(h.sys_flag), "bornTimestamp": str(h.born_timestamp), "flag": str(h.flag),
         "reconsumeTimes": str(h.reconsume_times), "unitMode": "true" if h.unit_mode else "false",
         "batch": "true" if h.batch else "false"}
    if h.properties is not None:
        d["properties"] = h.properties
    if h.max_reconsume_times is not None:
        d["maxReconsumeTimes"] = str(h.max_reconsume_times)
    if v2:
        return {V1_TO_V2[k]: v for k, v in d.items()}
    return d


@dataclass(slots=True)
class PullMessageRequestHeader:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_millis: int
    subscription: str | None
    sub_version: int
    expression_type: str | None


def decode_pull_header(ext: dict) -> PullMessageRequestHeader:
    """The PULL_MESSAGE header; HeaderError names a missing or bad field. Fast path for a
    well-formed header (every pull of every consumer: ~7 µs of the broker's pull was the
    eleven field helpers), else decode_pull_header_checked, the plain field-by-field
    decoder, which names the problem (tests/unit/test_header_fastpaths.py pins the two)."""
    try:
        g = ext.get
        group, topic = ext["consumerGroup"], ext["topic"]
        sv, et = g("subVersion"), g("expressionType")
        h = PullMessageRequestHeader(
            group, topic, int(ext["queueId"]), int(ext["queueOffset"]), int(ext["maxMsgNums"]),
            int(ext["sysFlag"]), int(ext["commitOffset"]), int(ext["suspendTimeoutMillis"]),
            g("subscription"), 0 if sv is None or sv == "" else int(sv),
            None if et is None or et == "" else et)
        if (group is not None and topic is not None
                and INT_MIN <= h.queue_id <= INT_MAX and INT_MIN <= h.max_msg_nums <= INT_MAX
                and INT_MIN <= h.sys_flag <= INT_MAX and LONG_MIN <= h.queue_offset <= LONG_MAX
                and LONG_MIN <= h.commit_offset <= LONG_MAX
                and LONG_MIN <= h.suspend_timeout_millis <= LONG_MAX
                and LONG_MIN <= h.sub_version <= LONG_MAX):
            return h
    except (KeyError, ValueError, TypeError):
        pass
    return decode_pull_header_checked(ext)


def decode_pull_header_checked(ext: dict) -> PullMessageRequestHeader:
    """decode_pull_header field by field: the reference of its fast path, and the error."""
    return PullMessageRequestHeader(
        consumer_group=req_str(ext, "consumerGroup"),
        topic=req_str(ext, "topic"),
        queue_id=req_i32(ext, "queueId"),
        queue_offset=req_int(ext, "queueOffset"),
        max_msg_nums=req_i32(ext, "maxMsgNums"),
        sys_flag=req_i32(ext, "sysFlag"),
        commit_offset=req_int(ext, "commitOffset"),
        suspend_timeout_millis=req_int(ext, "suspendTimeoutMillis"),
        subscription=ext.get("subscription"),
        sub_version=opt_int(ext, "subVersion", 0),
        expression_type=opt_str(ext, "expressionType"),
    )


def encode_pull_header(h: PullMessageRequestHeader) -> dict:
    d = {"consumerGroup": h.consumer_group, "topic": h.topic, "queueId": str(h.queue_id),
         "queueOffset": str(h.queue_offset), "maxMsgNums": str(h.max_msg_nums),
         "sysFlag": str(h.sys_flag), "commitOffset": str(h.commit_offset),
         "suspendTimeoutMillis": str(h.suspend_timeout_millis), "subVersion": str(h.sub_version)}
    if h.subscription is not None:
        d["subscription"] = h.subscription
    if h.expression_type is not None:
        d["expressionType"] = h.expression_type
    return d


# -- transactions (reference 3.6) ------------------------------------------------------------

@dataclass(slots=True)
class EndTransactionRequestHeader:
    """END_TRANSACTION (37), producer -> broker. commit_or_rollback takes MessageSysFlag's
    transaction values: 0 NOT_TYPE (unknown: nothing to do), 8 COMMIT, 12 ROLLBACK."""
    producer_group: str
    tran_state_table_offset: int     # the half message's queue offset
    commit_log_offset: int           # the half message's commit-log offset
    commit_or_rollback: int
    from_transaction_check: bool
    msg_id: str                      # UNIQ_KEY
    transaction_id: str | None


def decode_end_transaction_header(ext: dict) -> EndTransactionRequestHeader:
    return EndTransactionRequestHeader(
        producer_group=req_str(ext, "producerGroup"),
        tran_state_table_offset=req_int(ext, "tranStateTableOffset"),
        commit_log_offset=req_int(ext, "commitLogOffset"),
        commit_or_rollback=req_int(ext, "commitOrRollback"),
        from_transaction_check=parse_bool(ext.get("fromTransactionCheck")),
        msg_id=req_str(ext, "msgId"),
        transaction_id=opt_str(ext, "transactionId"),
    )


def encode_end_transaction_header(h: EndTransactionRequestHeader) -> dict:
    d = {"producerGroup": h.producer_group, "tranStateTableOffset": str(h.tran_state_table_offset),
         "commitLogOffset": str(h.commit_log_offset), "commitOrRollback": str(h.commit_or_rollback),
         "fromTransactionCheck": "true" if h.from_transaction_check else "false", "msgId": h.msg_id}
    if h.transaction_id is not None:
        d["transactionId"] = h.transaction_id
    return d


@dataclass(slots=True)
class CheckTransactionStateRequestHeader:
    """CHECK_TRANSACTION_STATE (39), broker -> producer (oneway); the body is the half
    message in stored format, with its real topic and queue."""
    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str | None
    transaction_id: str | None
    offset_msg_id: str | None


def decode_check_transaction_state_header(ext: dict) -> CheckTransactionStateRequestHeader:
    return CheckTransactionStateRequestHeader(
        tran_state_table_offset=req_int(ext, "tranStateTableOffset"),
        commit_log_offset=req_int(ext, "commitLogOffset"),
        msg_id=opt_str(ext, "msgId"),
        transaction_id=opt_str(ext, "transactionId"),
        offset_msg_id=opt_str(ext, "offsetMsgId"),
    )


def encode_check_transaction_state_header(h: CheckTransactionStateRequestHeader) -> dict:
    d = {"tranStateTableOffset": str(h.tran_state_table_offset), "commitLogOffset": str(h.commit_log_offset)}
    for key, v in (("msgId", h.msg_id), ("transactionId", h.transaction_id), ("offsetMsgId", h.offset_msg_id)):
        if v is not None:
            d[key] = v
    return d


# ext field that marks QUERY_MESSAGE as a unique-key (client msgId) query (Java's
# MixAll.UNIQUE_MSG_QUERY_FLAG); the broker then answers up to defaultQueryMaxNum (32)
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"


@dataclass(slots=True)
class QueryMessageRequestHeader:
    """QUERY_MESSAGE (12), client -> broker: records of `topic` with `key` among their KEYS
    or as their UNIQ_KEY, stored in [begin_timestamp, end_timestamp] (ms)."""
    topic: str
    key: str
    max_num: int
    begin_timestamp: int
    end_timestamp: int
    unique_key: bool = False         # the _UNIQUE_KEY_QUERY ext field


def decode_query_message_header(ext: dict) -> QueryMessageRequestHeader:
    return QueryMessageRequestHeader(
        topic=req_str(ext, "topic"),
        key=req_str(ext, "key"),
        max_num=req_int(ext, "maxNum", INT_MIN, INT_MAX),
        begin_timestamp=req_int(ext, "beginTimestamp"),
        end_timestamp=req_int(ext, "endTimestamp"),
        unique_key=ext.get(UNIQUE_MSG_QUERY_FLAG) == "true",
    )


def encode_query_message_header(h: QueryMessageRequestHeader) -> dict:
    d = {"topic": h.topic, "key": h.key, "maxNum": str(h.max_num),
         "beginTimestamp": str(h.begin_timestamp), "endTimestamp": str(h.end_timestamp)}
    if h.unique_key:
        d[UNIQUE_MSG_QUERY_FLAG] = "true"
    return d


@dataclass(slots=True)
class QueryMessageResponseHeader:
    """QUERY_MESSAGE's answer: the index's progress when it was read."""
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


def decode_query_message_response_header(ext: dict) -> QueryMessageResponseHeader:
    return QueryMessageResponseHeader(
        index_last_update_timestamp=opt_int(ext, "indexLastUpdateTimestamp", 0),
        index_last_update_phyoffset=opt_int(ext, "indexLastUpdatePhyoffset", 0),
    )


def encode_query_message_response_header(h: QueryMessageResponseHeader) -> dict:
    return {"indexLastUpdateTimestamp": str(h.index_last_update_timestamp),
            "indexLastUpdatePhyoffset": str(h.index_last_update_phyoffset)}


@dataclass(slots=True)
class ConsumeMessageDirectlyRequestHeader:
    """CONSUME_MESSAGE_DIRECTLY (309), Java's ConsumeMessageDirectlyResultRequestHeader: an
    admin asks the broker to hand the message `msg_id` (an offsetMsgId) to the client
    `client_id` of `consumer_group`; the broker forwards it to that client with the same
    fields plus its own `broker_name`, and the stored record as the body."""
    consumer_group: str
    client_id: str | None = None
    msg_id: str | None = None
    broker_name: str | None = None


def decode_consume_message_directly_header(ext: dict) -> ConsumeMessageDirectlyRequestHeader:
    return ConsumeMessageDirectlyRequestHeader(
        consumer_group=req_str(ext, "consumerGroup"),
        client_id=opt_str(ext, "clientId"),
        msg_id=opt_str(ext, "msgId"),
        broker_name=opt_str(ext, "brokerName"),
    )


def encode_consume_message_directly_header(h: ConsumeMessageDirectlyRequestHeader) -> dict:
    d = {"consumerGroup": h.consumer_group}
    for key, v in (("clientId", h.client_id), ("msgId", h.msg_id), ("brokerName", h.broker_name)):
        if v is not None:
            d[key] = v
    return d
