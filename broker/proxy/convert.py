"""RocketMQ 5's gRPC messages <-> the broker's own terms: pure functions, no I/O, no clock
(the time comes in as `now_ms`).

What lives here, and the rule each follows (Java's proxy, `grpc/v2/` of apache/rocketmq):
* `status` / `from_remoting`: every response carries a Status; OK is 20000 (a client reads
  0 as an error). Remoting response codes of the processors map onto v2 codes as
  `ResponseCodeMapping` does.
* `message_to_send`: a v2 Message -> the SEND_MESSAGE header fields and properties the
  send processor takes (`SendMessageActivity.buildMessage`): UNIQ_KEY = the client's
  message_id, TAGS, KEYS, `message_group` -> __SHARDINGKEY (and the queue its group
  hashes to), `delivery_timestamp` -> TIMER_DELIVER_MS, TRANSACTION -> a prepared half
  message of producer group = topic. Bad input answers the v2 code Java answers.
* `record_to_message`: a stored record -> a v2 Message (a transaction check-back's
  payload; ReceiveMessage's deliveries with their receipt handle, delivery attempt and
  invisible duration): user properties are the non-system ones, body_digest an
  uppercase MD5.
* `polling_ms`, `receive_invisible_ms`, `receive_batch`, `ack_status`: ReceiveMessage's and
  AckMessage's rules (`ReceiveMessageActivity`, `AckMessageActivity`): the long poll
  clamped to 5-20 s and the call's deadline, the 10 s - 12 h invisible time (a 60 s
  lease the broker renews with auto_renew), batches of at most 32, one status for many
  ack entries.
* `route_queues`, `assignment_queues`: QueryRoute's and QueryAssignment's answers.
* `settings_reply`: the Telemetry handshake's answer (`GrpcClientSettingsManager`).
* `channel_info_of`: a client's user agent as the remoting registry's language/version.
"""
from __future__ import annotations

import hashlib
import ipaddress
import itertools
from typing import NamedTuple

from pocketmq.broker.core.pop import InvalidReceiptHandle, PopError
from pocketmq.broker.proxy.pb import definition_pb2 as pb
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.codes import CURRENT_VERSION, VERSION_NAMES, LanguageCode, PermName, ResponseCode

Code = pb.Code
OK = Code.OK

# RocketMQ 5's PROPERTY_TIMER_DELIVER_MS: the wall-clock ms a timer message is due (the
# broker's timer store, broker/core/timer.py, delivers it then)
TIMER_DELIVER_MS = msgcodec.TIMER_DELIVER_MS
# Java's MessageConst.PROPERTY_TRANSACTION_ID: a transactional message carries its
# transaction id (= its message id, as Java's proxy answers it) as a property its consumers
# see (the Node client's own tests check it).
TRANSACTION_ID = "__transactionId__"
# System properties Java's proxy still shows consumers as user properties (they are not in
# its MessageConst.STRING_HASH_SET): the message group's __SHARDINGKEY.
SHOWN_SYSTEM_PROPERTIES = frozenset({msgcodec.SHARDING_KEY})
# Java's proxy bounds (ProxyConfig): a message group's length, a tag's and a key's.
MESSAGE_GROUP_LENGTH_MAX = 64
# What every route queue accepts (a topic without Java's `message.type` attribute is MIXED
# here: pocketmq topics have no type, and Python's producer refuses a type not listed).
ALL_MESSAGE_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
# Producer settings (GrpcClientSettingsManager): send retries with exponential backoff
# 10 ms -> 1 s (the Node client asserts the exponential strategy).
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_MS = (10, 1000, 2.0)       # initial, max, multiplier
# Consumer settings: receive batch and long polling (ProxyConfig's defaults).
RECEIVE_BATCH_SIZE = 32
LONG_POLLING_TIMEOUT_MS = 20_000
# ReceiveMessage (ProxyConfig): the long poll's bounds, the first client version told
# ILLEGAL_POLLING_TIME (older ones get BAD_REQUEST), the lease of an auto_renew receive
# (renewSliceTimeMillis: the broker renews it until the message is acked).
MIN_LONG_POLLING_MS = 5_000
MAX_LONG_POLLING_MS = 20_000
ILLEGAL_POLLING_TIME_SINCE = (5, 0, 3)
AUTO_RENEW_INVISIBLE_MS = 60_000


def status(code: int, message: str = "") -> pb.Status:
    return pb.Status(code=code, message=message or ("OK" if code == OK else ""))


# remoting ResponseCode -> v2 Code (Java's ResponseCodeMapping / ProxyException codes)
_FROM_REMOTING = {
    ResponseCode.SUCCESS: Code.OK,
    ResponseCode.SYSTEM_ERROR: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    ResponseCode.FLOW_CONTROL: Code.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: Code.NOT_IMPLEMENTED,
    ResponseCode.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    ResponseCode.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
    ResponseCode.VERSION_NOT_SUPPORTED: Code.VERSION_UNSUPPORTED,
    ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.TRANSACTION_FAILED: Code.INVALID_TRANSACTION_ID,
    # the POP engine's refusals (broker/services/pop.py PopError codes)
    ResponseCode.INVALID_PARAMETER: Code.BAD_REQUEST,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: Code.ILLEGAL_FILTER_EXPRESSION,
    ResponseCode.POLLING_FULL: Code.TOO_MANY_REQUESTS,
}


def from_remoting(code: int, remark: str | None) -> pb.Status:
    """A processor's answer as a v2 Status (unknown codes: INTERNAL_SERVER_ERROR, remark kept)."""
    v2 = _FROM_REMOTING.get(code, Code.INTERNAL_SERVER_ERROR)
    if v2 == OK:
        return status(OK)
    return status(v2, remark or f"remoting code {code}")


def from_pop_error(e: PopError) -> pb.Status:
    """The POP engine's refusal as a v2 Status: a handle that names no live lease (forged,
    stale, acked, another group's) is INVALID_RECEIPT_HANDLE; the rest as from_remoting."""
    if isinstance(e, InvalidReceiptHandle):
        return status(Code.INVALID_RECEIPT_HANDLE, e.remark)
    return from_remoting(e.code, e.remark)


class Refused(Exception):
    """Bad input from a client: the v2 code and the text to answer with."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def status(self) -> pb.Status:
        return status(self.code, self.message)


class SendFields(NamedTuple):
    """What the send processor takes for one v2 message (SEND_MESSAGE's header fields)."""
    topic: str
    producer_group: str
    queue_id: int            # -1: the processor picks (the shell round-robins first)
    sys_flag: int
    born_timestamp: int
    properties: str
    body: bytes
    message_id: str
    transactional: bool


def _ms(ts) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def message_to_send(m: pb.Message, *, max_body_size: int, queue_count: int, max_delay_ms: int,
                    now_ms: int) -> SendFields:
    """A v2 Message as a send (raises Refused for what Java's proxy refuses).

    `queue_count`: the topic's write queues (a FIFO message goes to the queue its group's
    Java hash picks, as SendMessageQueueSelector does); `max_delay_ms`: how far ahead a
    delivery time may be (timerMaxDelaySec)."""
    topic = m.topic.name
    sp = m.system_properties
    body = m.body
    if not body:
        raise Refused(Code.MESSAGE_BODY_EMPTY, f"message {sp.message_id} to {topic} has an empty body")
    if len(body) > max_body_size:
        raise Refused(Code.MESSAGE_BODY_TOO_LARGE,
                      f"message body of {len(body)} bytes exceeds the limit of {max_body_size} bytes")
    if not sp.message_id:
        raise Refused(Code.ILLEGAL_MESSAGE_ID, "the message has no message_id")
    props: dict[str, str] = {}
    group_text = sp.message_group if sp.HasField("message_group") else None
    for k, v in m.user_properties.items():
        if k in SHOWN_SYSTEM_PROPERTIES and v == group_text:
            continue        # a received FIFO message sent on as it came: the group sets it
        if k in msgcodec.SYSTEM_PROPERTY_KEYS:
            raise Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"user property {k!r} is a system property name")
        if not k or "\x01" in k or "\x02" in k or "\x01" in v or "\x02" in v:
            raise Refused(Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                          f"user property {k!r} is empty or holds a control character (\\x01, \\x02)")
        props[k] = v
    if sp.HasField("tag"):
        tag = sp.tag
        if not tag.strip() or "|" in tag or "\x01" in tag or "\x02" in tag:
            raise Refused(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} is blank or holds '|' or a control character")
        props[msgcodec.TAGS] = tag
    if sp.keys:
        for key in sp.keys:
            if not key.strip() or " " in key or "\x01" in key or "\x02" in key:
                raise Refused(Code.ILLEGAL_MESSAGE_KEY, f"key {key!r} is blank or holds a space or control character")
        props[msgcodec.KEYS] = msgcodec.KEY_SEPARATOR.join(sp.keys)
    props[msgcodec.UNIQ_KEY] = sp.message_id
    mtype = sp.message_type
    group = sp.message_group if sp.HasField("message_group") else None
    deliver_at = _ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None
    if mtype == pb.FIFO and not group:
        raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a FIFO message needs a message_group")
    if mtype == pb.DELAY and deliver_at is None:
        raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "a DELAY message needs a delivery_timestamp")
    if group is not None and deliver_at is not None:
        raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                      "a message cannot have both a message_group and a delivery_timestamp")
    queue_id = -1
    if group is not None:
        if not group.strip() or len(group) > MESSAGE_GROUP_LENGTH_MAX or "\x01" in group or "\x02" in group:
            raise Refused(Code.ILLEGAL_MESSAGE_GROUP,
                          f"message_group {group!r} is blank, longer than {MESSAGE_GROUP_LENGTH_MAX} "
                          f"characters or holds a control character")
        props[msgcodec.SHARDING_KEY] = group
        queue_id = fifo_queue(group, queue_count)
    if deliver_at is not None:
        if deliver_at - now_ms > max_delay_ms:
            raise Refused(Code.ILLEGAL_DELIVERY_TIME,
                          f"delivery_timestamp {deliver_at} is more than {max_delay_ms} ms ahead")
        props[TIMER_DELIVER_MS] = str(deliver_at)
    transactional = mtype == pb.TRANSACTION
    sys_flag = 0
    if transactional:
        if deliver_at is not None:
            raise Refused(Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                          "a transactional message cannot have a delivery_timestamp")
        props[msgcodec.TRAN_MSG] = "true"
        props[msgcodec.PGROUP] = topic
        props[TRANSACTION_ID] = sp.message_id
        if sp.HasField("orphaned_transaction_recovery_duration"):
            props[msgcodec.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(
                max(0, sp.orphaned_transaction_recovery_duration.seconds))
        sys_flag |= msgcodec.MessageSysFlag.TRANSACTION_PREPARED_TYPE
    if sp.body_encoding == pb.GZIP:
        sys_flag |= msgcodec.MessageSysFlag.COMPRESSED_FLAG    # zlib-framed, as RocketMQ's
    born = _ms(sp.born_timestamp) if sp.HasField("born_timestamp") else now_ms
    return SendFields(topic, topic, queue_id, sys_flag, born or now_ms, msgcodec.encode_properties(props),
                      bytes(body), sp.message_id, transactional)


def fifo_queue(group: str, queue_count: int) -> int:
    """The queue a message group goes to: Java's String.hashCode of the group, mod the
    write queues (SendMessageQueueSelector: IntMath.mod, never negative)."""
    return msgcodec.java_string_hash(group) % max(1, queue_count)


def _timestamp(field, ms: int) -> None:
    field.seconds, field.nanos = divmod(ms, 1000)
    field.nanos *= 1_000_000


def record_to_message(rec: msgcodec.MessageExt, *, topic: str | None = None, queue_id: int | None = None,
                      delivery_attempt: int | None = None, receipt_handle: str | None = None,
                      invisible_ms: int | None = None) -> pb.Message:
    """A stored record as a v2 Message (GrpcConverter.buildMessage). `topic`/`queue_id`
    override the record's (a half message's real topic); `delivery_attempt` defaults to
    reconsumeTimes + 1; a received message carries its `receipt_handle` and the
    `invisible_ms` of its lease."""
    props = rec.properties
    m = pb.Message()
    m.topic.name = topic if topic is not None else rec.topic
    for k, v in props.items():
        if k not in msgcodec.SYSTEM_PROPERTY_KEYS or k in SHOWN_SYSTEM_PROPERTIES:
            m.user_properties[k] = v
    body = rec.body
    m.body = body
    sp = m.system_properties
    tag = props.get(msgcodec.TAGS)
    if tag:
        sp.tag = tag
    keys = props.get(msgcodec.KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(msgcodec.KEY_SEPARATOR) if k)
    sp.message_id = props.get(msgcodec.UNIQ_KEY) or rec.msg_id
    sp.body_digest.type = pb.MD5
    sp.body_digest.checksum = hashlib.md5(body).hexdigest().upper()
    sp.body_encoding = pb.IDENTITY
    group = props.get(msgcodec.SHARDING_KEY)
    deliver = props.get(TIMER_DELIVER_MS)
    tx = msgcodec.MessageSysFlag.transaction_value(rec.sys_flag) != 0 or props.get(msgcodec.TRAN_MSG) == "true"
    if tx:
        sp.message_type = pb.TRANSACTION
    elif group:
        sp.message_type = pb.FIFO
    elif deliver or props.get(msgcodec.DELAY):
        sp.message_type = pb.DELAY
    else:
        sp.message_type = pb.NORMAL
    if group:
        sp.message_group = group
    if deliver and deliver.isdigit():
        _timestamp(sp.delivery_timestamp, int(deliver))
    _timestamp(sp.born_timestamp, rec.born_timestamp)
    sp.born_host = rec.born_host
    _timestamp(sp.store_timestamp, rec.store_timestamp)
    sp.store_host = rec.store_host
    sp.queue_id = rec.queue_id if queue_id is None else queue_id
    sp.queue_offset = rec.queue_offset
    sp.delivery_attempt = rec.reconsume_times + 1 if delivery_attempt is None else delivery_attempt
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_ms is not None:
        sp.invisible_duration.FromMilliseconds(invisible_ms)
    return m


# ---- receiving ----------------------------------------------------------------------------

def _version(text: str) -> tuple[int, ...] | None:
    parts = []
    for piece in text.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def polling_ms(requested_ms: int | None, remaining_ms: int | None, request_timeout_ms: int,
               client_version: str) -> int:
    """How long a ReceiveMessage may wait for a message (ReceiveMessageActivity): the
    requested long poll, else what the call's deadline leaves after half the client's
    request timeout; clamped to [5 s, 20 s], then to the deadline (`remaining_ms`, None:
    none). A deadline below 5 s is refused: ILLEGAL_POLLING_TIME (BAD_REQUEST for clients
    older than 5.0.3, as Java's proxy answers them)."""
    if remaining_ms is None:
        remaining_ms = 2**62
    ms = requested_ms if requested_ms is not None else remaining_ms - request_timeout_ms // 2
    ms = min(max(ms, MIN_LONG_POLLING_MS), MAX_LONG_POLLING_MS)
    if ms > remaining_ms:
        if remaining_ms < MIN_LONG_POLLING_MS:
            version = _version(client_version)
            code = Code.ILLEGAL_POLLING_TIME if version is not None and version >= ILLEGAL_POLLING_TIME_SINCE \
                else Code.BAD_REQUEST
            raise Refused(code, "The deadline time remaining is not enough for polling, please check network "
                          "condition")
        ms = remaining_ms
    return ms


def receive_invisible_ms(requested_ms: int | None, auto_renew: bool, min_ms: int, max_ms: int) -> int:
    """A receive's lease: AUTO_RENEW_INVISIBLE_MS with auto_renew (the broker renews it),
    else the requested invisible_duration, which must lie in [min_ms, max_ms] (Refused
    ILLEGAL_INVISIBLE_TIME)."""
    if auto_renew:
        return AUTO_RENEW_INVISIBLE_MS
    ms = requested_ms or 0
    if ms < min_ms:
        raise Refused(Code.ILLEGAL_INVISIBLE_TIME, f"the invisibleTime is too small. min is {min_ms}")
    if ms > max_ms:
        raise Refused(Code.ILLEGAL_INVISIBLE_TIME, f"the invisibleTime is too large. max is {max_ms}")
    return ms


def receive_batch(batch_size: int) -> int:
    """How many messages one receive may take: at most RECEIVE_BATCH_SIZE (a larger ask
    is served with 32, as Java's proxy does); below 1 is Refused."""
    if batch_size < 1:
        raise Refused(Code.BAD_REQUEST, f"batch_size {batch_size} must be at least 1")
    return min(batch_size, RECEIVE_BATCH_SIZE)


def ack_status(codes: list[int]) -> pb.Status:
    """AckMessage's top status from its entries' (AckMessageActivity): the common code,
    MULTIPLE_RESULTS when they differ."""
    distinct = set(codes)
    if len(distinct) > 1:
        return status(Code.MULTIPLE_RESULTS, "MULTIPLE_RESULTS")
    if not distinct:
        return status(Code.BAD_REQUEST, "AckMessage carries no entry")
    code = distinct.pop()
    return status(code, pb.Code.Name(code))


# ---- routes -------------------------------------------------------------------------------

def endpoints(host: str, port: int) -> pb.Endpoints:
    """Endpoints with their scheme set (Python dials "ipv4:host:port" built from it)."""
    try:
        scheme = pb.IPv6 if ipaddress.ip_address(host).version == 6 else pb.IPv4
    except ValueError:
        scheme = pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])


def _permission(perm: int) -> int:
    r, w = bool(perm & PermName.READ), bool(perm & PermName.WRITE)
    return pb.READ_WRITE if r and w else pb.READ if r else pb.WRITE if w else pb.NONE


def route_queues(topic: str, read_queue_nums: int, write_queue_nums: int, perm: int,
                 broker: pb.Broker) -> list[pb.MessageQueue]:
    """QueryRoute's queues for one broker (Java's genMessageQueueFromQueueData): queue ids
    below both counts are read-write, the rest read-only or write-only, each with the
    topic's permission; every queue accepts all four message types."""
    out = []
    for qid in range(max(read_queue_nums, write_queue_nums)):
        p = perm
        if qid >= read_queue_nums:
            p &= ~PermName.READ
        if qid >= write_queue_nums:
            p &= ~PermName.WRITE
        out.append(pb.MessageQueue(topic=pb.Resource(name=topic), id=qid, permission=_permission(p),
                                   broker=broker, accept_message_types=ALL_MESSAGE_TYPES))
    return out


def assignment_queues(topic: str, read_queue_nums: int, perm: int, broker: pb.Broker,
                      fifo: bool) -> list[pb.MessageQueue]:
    """QueryAssignment: a FIFO group (consumeMessageOrderly) is assigned each readable
    queue (a queue is consumed in order); any other group gets one entry for the broker,
    queue id -1 (it pops from every queue). Nothing when the topic is not readable."""
    if not perm & PermName.READ or read_queue_nums <= 0:
        return []
    res = pb.Resource(name=topic)
    if fifo:
        return [pb.MessageQueue(topic=res, id=q, permission=_permission(perm), broker=broker,
                                accept_message_types=ALL_MESSAGE_TYPES) for q in range(read_queue_nums)]
    return [pb.MessageQueue(topic=res, id=-1, permission=_permission(perm), broker=broker,
                            accept_message_types=ALL_MESSAGE_TYPES)]


# ---- settings -----------------------------------------------------------------------------

def settings_reply(client: pb.Settings, *, max_body_size: int, fifo: bool = False, max_attempts: int = 17,
                   backoff_ms: tuple[int, ...] = ()) -> pb.Settings:
    """The server's answer to a client's Settings: the client's own, plus what the broker
    decides. Producers: max_body_size (an empty answer makes every Python send fail),
    validate_message_type, exponential backoff. Consumers: receive batch 32, long polling
    20 s, `fifo` (the group's consumeMessageOrderly), backoff max_attempts = retryMaxTimes
    + 1 with the delay levels as customized backoff. Metrics off."""
    s = pb.Settings()
    s.CopyFrom(client)
    policy = s.backoff_policy
    policy.Clear()
    if client.WhichOneof("pub_sub") == "subscription":
        sub = s.subscription
        sub.fifo = fifo
        sub.receive_batch_size = RECEIVE_BATCH_SIZE
        sub.long_polling_timeout.FromMilliseconds(LONG_POLLING_TIMEOUT_MS)
        policy.max_attempts = max_attempts
        for ms in backoff_ms:
            policy.customized_backoff.next.add().FromMilliseconds(ms)
        if not backoff_ms:
            policy.customized_backoff.SetInParent()
    else:
        pub = s.publishing
        pub.max_body_size = max_body_size
        pub.validate_message_type = True
        policy.max_attempts = PRODUCER_MAX_ATTEMPTS
        initial, most, multiplier = PRODUCER_BACKOFF_MS
        policy.exponential_backoff.initial.FromMilliseconds(initial)
        policy.exponential_backoff.max.FromMilliseconds(most)
        policy.exponential_backoff.multiplier = multiplier
    s.metric.Clear()
    s.metric.on = False
    return s


# ---- the client registry ----------------------------------------------------------------

# UA.language -> the remoting LanguageCode mqadmin prints (Java's proxy does the same;
# NODE_JS, OBJECTIVE_C, DART and KOTLIN have no 4.x code: OTHER).
_LANGUAGE = {pb.JAVA: LanguageCode.JAVA, pb.CPP: LanguageCode.CPP, pb.DOT_NET: LanguageCode.DOTNET,
             pb.GOLANG: LanguageCode.GO, pb.RUST: LanguageCode.RUST, pb.PYTHON: LanguageCode.PYTHON,
             pb.PHP: LanguageCode.PHP, pb.RUBY: LanguageCode.RUBY}
_VERSION_ORDINAL = {name: i for i, name in enumerate(VERSION_NAMES)}


def channel_info_of(ua: pb.UA) -> tuple[int, int, str, str]:
    """(LanguageCode, MQVersion ordinal, language name, version text) of a user agent. The
    ordinal is that of "V" + the version with '_' for '.' when RocketMQ has one (5.1.2 ->
    V5_1_2), else CURRENT_VERSION (Java's proxy: MQVersion.Version.valueOf or the current);
    the texts keep what the client said."""
    lang = _LANGUAGE.get(ua.language, LanguageCode.OTHER)
    version = ua.version or ""
    ordinal = _VERSION_ORDINAL.get("V" + version.replace(".", "_").replace("-", "_").upper(), CURRENT_VERSION)
    return int(lang), ordinal, pb.Language.Name(ua.language) if ua.language in pb.Language.values() \
        else str(ua.language), version
