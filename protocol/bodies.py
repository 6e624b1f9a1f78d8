"""JSON bodies of the RocketMQ protocol, with fastjson's quirks handled here only.

What Java peers write (reference 4.0): compact JSON, sorted keys, nulls
omitted, enums by name, and two non-JSON forms: maps with integer keys written
unquoted (`{0:"addr"}`) and maps with bean keys written as objects
(`{{"brokerName":"b","queueId":0,"topic":"T"}:5}`). `loads_lenient` reads
both; `dumps_object_keyed` writes the second for the stats bodies Java admin
tools expect. Route data is always written as standard JSON with quoted keys,
which every 4.x client accepts (reference 4.2).

What the C++ client writes (reference 4.4 and 10.2): enums as ordinals,
subVersion as a string, empty arrays omitted, a bogus codeSet (we recompute
tag hash codes from tagsSet/subString).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from pocketmq.protocol.errors import BodyError
from pocketmq.protocol.names import BROKER, CLIENT_ID, GROUP, TOPIC, name_error


def check_name(kind: str, field: str, value) -> str:
    """`value` when it is a valid name of `kind` (protocol.names), else BodyError naming
    `field`: names in bodies are checked where they are decoded, before anything stores them."""
    err = name_error(kind, field, value)
    if err is not None:
        raise BodyError(err)
    return value

SUB_ALL = "*"


def dumps(obj) -> bytes:
    """Compact sorted JSON as UTF-8. Total: a string UTF-8 cannot hold (a lone surrogate
    that came in through a JSON escape) makes the whole body ASCII with \\uXXXX escapes,
    which is still valid JSON and gives the same value back."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=True, sort_keys=True).encode()


def loads(data) -> object:
    """Standard JSON first (fast), then the lenient fastjson dialect. BodyError for bytes
    that are not UTF-8 or not JSON."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8", errors="strict")
        except UnicodeDecodeError as e:
            raise BodyError(f"body is not UTF-8 (byte {e.start})") from None
    try:
        return json.loads(data)
    except RecursionError:
        raise BodyError("bad JSON body: nesting too deep") from None
    except ValueError:
        return loads_lenient(data)


# --- lenient parser -------------------------------------------------------------------

class _Lenient:
    """Recursive-descent parser for fastjson output: JSON plus bare numeric keys,
    object keys (returned as tuples of sorted items so they are hashable),
    single-quoted strings and trailing commas."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def error(self, what: str):
        raise BodyError(f"bad JSON body at char {self.i}: {what}")

    def ws(self):
        s, i, n = self.s, self.i, len(self.s)
        while i < n and s[i] in " \t\r\n":
            i += 1
        self.i = i

    def value(self, depth=0):
        if depth > 64:
            self.error("nesting too deep")
        self.ws()
        if self.i >= len(self.s):
            self.error("unexpected end")
        c = self.s[self.i]
        if c == "{":
            return self.obj(depth)
        if c == "[":
            return self.arr(depth)
        if c in "\"'":
            return self.string()
        return self.scalar()

    def obj(self, depth):
        if depth > 64:         # object keys nest through here, not through value()
            self.error("nesting too deep")
        self.i += 1
        out = {}
        while True:
            self.ws()
            if self.i >= len(self.s):
                self.error("unterminated object")
            if self.s[self.i] == "}":
                self.i += 1
                return out
            c = self.s[self.i]
            if c == "{":
                k = self.obj(depth + 1)
                key = tuple(sorted(k.items()))
            elif c == "[":
                key = tuple(self.arr(depth + 1))
            elif c in "\"'":
                key = self.string()
            else:
                key = self.scalar()
            self.ws()
            if self.i >= len(self.s) or self.s[self.i] != ":":
                self.error("expected ':'")
            self.i += 1
            out[key] = self.value(depth + 1)
            self.ws()
            if self.i < len(self.s) and self.s[self.i] == ",":
                self.i += 1
            elif self.i < len(self.s) and self.s[self.i] == "}":
                continue
            else:
                self.error("expected ',' or '}'")

    def arr(self, depth):
        if depth > 64:
            self.error("nesting too deep")
        self.i += 1
        out = []
        while True:
            self.ws()
            if self.i >= len(self.s):
                self.error("unterminated array")
            if self.s[self.i] == "]":
                self.i += 1
                return out
            out.append(self.value(depth + 1))
            self.ws()
            if self.i < len(self.s) and self.s[self.i] == ",":
                self.i += 1
            elif self.i < len(self.s) and self.s[self.i] == "]":
                continue
            else:
                self.error("expected ',' or ']'")

    def string(self):
        q = self.s[self.i]
        if q == '"':
            dec = json.JSONDecoder()
            try:
                val, end = dec.raw_decode(self.s, self.i)
            except ValueError as e:
                self.error(str(e))
            self.i = end
            return val
        j = self.s.find("'", self.i + 1)
        if j < 0:
            self.error("unterminated string")
        val = self.s[self.i + 1:j]
        self.i = j + 1
        return val

    def scalar(self):
        s, i, n = self.s, self.i, len(self.s)
        j = i
        while j < n and s[j] not in ",:}] \t\r\n":
            j += 1
        tok = s[i:j]
        self.i = j
        if not tok:
            self.error("expected a value")
        if tok == "true":
            return True
        if tok == "false":
            return False
        if tok == "null":
            return None
        try:
            return int(tok)
        except ValueError:
            pass
        try:
            return float(tok)
        except ValueError:
            pass
        return tok  # bare identifier key


def loads_lenient(text: str):
    p = _Lenient(text)
    v = p.value()
    p.ws()
    if p.i != len(p.s):
        p.error("trailing characters")
    return v


def dumps_object_keyed(table: dict, value_fn=lambda v: v) -> str:
    """fastjson form of a Map<MessageQueue, V>: keys written as JSON objects."""
    items = []
    for mq, v in table.items():
        key = json.dumps(mq.to_json(), separators=(",", ":"), sort_keys=True)
        items.append(key + ":" + json.dumps(value_fn(v), separators=(",", ":"), sort_keys=True))
    return "{" + ",".join(items) + "}"


# --- MessageQueue -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """Sorts like Java's MessageQueue.compareTo: topic, brokerName, queueId."""
    topic: str
    broker_name: str
    queue_id: int

    def to_json(self) -> dict:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}

    @classmethod
    def from_json(cls, d) -> "MessageQueue":
        if isinstance(d, tuple):
            d = dict(d)
        try:
            mq = cls(d["topic"], d["brokerName"], int(d["queueId"]))
        except (KeyError, TypeError, ValueError):
            raise BodyError("bad MessageQueue: needs topic, brokerName and an integer queueId") from None
        check_name(TOPIC, "MessageQueue topic", mq.topic)
        check_name(BROKER, "MessageQueue brokerName", mq.broker_name)
        if not -0x80000000 <= mq.queue_id <= 0x7FFFFFFF:
            raise BodyError(f"MessageQueue queueId {mq.queue_id} out of range [-2147483648, 2147483647]")
        return mq


# --- subscriptions and heartbeats ---------------------------------------------------------

CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
CONSUME_FROM_WHERE = ("CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                      "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET",
                      "CONSUME_FROM_TIMESTAMP")


def _enum_name(value, names: tuple, what: str) -> str:
    """Heartbeat enums arrive as names (Java, Go) or ordinals (C++)."""
    if isinstance(value, str):
        if value in names:
            return value
        if value.isdigit() and int(value) < len(names):
            return names[int(value)]
    elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    raise BodyError(f"bad {what}: {value!r}")


def _int(value, what: str, default: int = 0) -> int:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BodyError(f"bad {what}: {value!r}") from None


@dataclass(slots=True)
class SubscriptionData:
    topic: str
    sub_string: str = SUB_ALL
    tags_set: list = field(default_factory=list)
    code_set: list = field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"
    class_filter_mode: bool = False

    @property
    def is_all(self) -> bool:
        return self.expression_type == "TAG" and (not self.tags_set or self.sub_string.strip() in ("", SUB_ALL))

    def matches_tags_code(self, code: int) -> bool:
        # Consume-queue tag codes are sign-extended longs; compare as Java's (int).
        # An SQL92 subscription passes this stage (Java's isMatchedByConsumeQueue without
        # bloom filters): its expression is checked on the record's properties.
        if self.is_all or self.expression_type != "TAG":
            return True
        code = ((code + 2**31) % 2**32) - 2**31
        return code in self.code_set

    def to_json(self) -> dict:
        return {"classFilterMode": self.class_filter_mode, "codeSet": list(self.code_set),
                "expressionType": self.expression_type, "subString": self.sub_string,
                "subVersion": self.sub_version, "tagsSet": list(self.tags_set), "topic": self.topic}


def build_subscription(topic: str, sub_string: str | None, expression_type: str | None = "TAG",
                       sub_version: int = 0) -> SubscriptionData:
    """Parse a TAG expression ("*", "A || B") the way FilterAPI does; codes are Java hashes."""
    from pocketmq.protocol.message import java_string_hash
    et = (expression_type or "TAG").upper()
    if et != "TAG":
        if et != "SQL92":
            raise BodyError(f"unknown expressionType {expression_type!r}")
        # kept as written (like Java): the broker's parse errors name columns in this text
        return SubscriptionData(topic, sub_string or "", [], [], sub_version, "SQL92")
    s = (sub_string or "").strip()
    if not s or s == SUB_ALL:
        return SubscriptionData(topic, SUB_ALL, [], [], sub_version, "TAG")
    tags = [t.strip() for t in s.split("||") if t.strip()]
    if not tags:
        raise BodyError(f"subscription {sub_string!r} has no tag")
    return SubscriptionData(topic, s, tags, [java_string_hash(t) for t in tags], sub_version, "TAG")


def subscription_from_json(d: dict) -> SubscriptionData:
    if not isinstance(d, dict) or not d.get("topic"):
        raise BodyError("bad SubscriptionData: not an object with a topic")
    check_name(TOPIC, "subscription topic", d["topic"])
    sub_string = d.get("subString") or SUB_ALL
    et = d.get("expressionType") or "TAG"
    sub = build_subscription(d["topic"], str(sub_string), str(et),
                             _int(d.get("subVersion"), "subVersion"))
    tags = d.get("tagsSet")
    if tags is not None and not isinstance(tags, list):
        raise BodyError("tagsSet is not an array")
    if sub.expression_type == "TAG" and not sub.is_all and tags:
        from pocketmq.protocol.message import java_string_hash
        sub.tags_set = [str(t) for t in tags]
        sub.code_set = [java_string_hash(str(t)) for t in tags]
    sub.class_filter_mode = bool(d.get("classFilterMode", False))
    return sub


@dataclass(slots=True)
class ConsumerData:
    group_name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscription_data_set: list = field(default_factory=list)
    unit_mode: bool = False

    def to_json(self) -> dict:
        return {"consumeFromWhere": self.consume_from_where, "consumeType": self.consume_type,
                "groupName": self.group_name, "messageModel": self.message_model,
                "subscriptionDataSet": [s.to_json() for s in self.subscription_data_set],
                "unitMode": self.unit_mode}


@dataclass(slots=True)
class HeartbeatData:
    client_id: str
    producer_groups: list = field(default_factory=list)
    consumer_data_set: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"clientID": self.client_id,
                "consumerDataSet": [c.to_json() for c in self.consumer_data_set],
                "producerDataSet": [{"groupName": g} for g in self.producer_groups]}


def _list(d: dict, key: str) -> list:
    v = d.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise BodyError(f"{key} is not an array")
    return v


def parse_heartbeat(body) -> HeartbeatData:
    """HeartbeatData; BodyError naming the field for a bad shape or a bad name (clientID,
    groupName, subscription topics)."""
    d = loads(body)
    if not isinstance(d, dict) or not isinstance(d.get("clientID"), str) or not d["clientID"]:
        raise BodyError("HeartbeatData without clientID")
    check_name(CLIENT_ID, "clientID", d["clientID"])
    producers = []
    for p in _list(d, "producerDataSet"):
        if isinstance(p, dict) and p.get("groupName"):
            producers.append(check_name(GROUP, "producer groupName", p["groupName"]))
    consumers = []
    for c in _list(d, "consumerDataSet"):
        if not isinstance(c, dict) or not c.get("groupName"):
            raise BodyError("bad ConsumerData: not an object with a groupName")
        consumers.append(ConsumerData(
            group_name=check_name(GROUP, "consumer groupName", c["groupName"]),
            consume_type=_enum_name(c.get("consumeType", "CONSUME_PASSIVELY"), CONSUME_TYPES, "consumeType"),
            message_model=_enum_name(c.get("messageModel", "CLUSTERING"), MESSAGE_MODELS, "messageModel"),
            consume_from_where=_enum_name(c.get("consumeFromWhere", 0), CONSUME_FROM_WHERE, "consumeFromWhere"),
            subscription_data_set=[subscription_from_json(s) for s in _list(c, "subscriptionDataSet")],
            unit_mode=bool(c.get("unitMode", False)),
        ))
    return HeartbeatData(d["clientID"], producers, consumers)


# --- topics, routes, clusters -------------------------------------------------------------

@dataclass(slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_json(self) -> dict:
        return {"order": self.order, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicFilterType": self.topic_filter_type, "topicName": self.topic_name,
                "topicSysFlag": self.topic_sys_flag, "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, d: dict) -> "TopicConfig":
        if not isinstance(d, dict):
            raise BodyError("TopicConfig is not an object")
        check_name(TOPIC, "topicName", d.get("topicName"))
        try:
            return cls(str(d["topicName"]), _int(d.get("readQueueNums", 16), "readQueueNums"),
                       _int(d.get("writeQueueNums", 16), "writeQueueNums"), _int(d.get("perm", 6), "perm"),
                       str(d.get("topicFilterType", "SINGLE_TAG")), _int(d.get("topicSysFlag", 0), "topicSysFlag"),
                       bool(d.get("order", False)))
        except (KeyError, TypeError):
            raise BodyError(f"bad TopicConfig: {d!r}") from None


@dataclass(slots=True)
class DataVersion:
    timestamp: int = 0
    counter: int = 0

    def to_json(self) -> dict:
        return {"counter": self.counter, "timestamp": self.timestamp}

    @classmethod
    def from_json(cls, d) -> "DataVersion":
        if not isinstance(d, dict):
            return cls()
        return cls(_int(d.get("timestamp"), "timestamp"), _int(d.get("counter"), "counter"))

    def next_version(self, now_ms: int) -> "DataVersion":
        return DataVersion(now_ms, self.counter + 1)


def encode_topic_config_wrapper(topics: dict, version: DataVersion) -> dict:
    return {"dataVersion": version.to_json(),
            "topicConfigTable": {name: tc.to_json() for name, tc in topics.items()}}


def decode_topic_config_wrapper(d: dict) -> tuple[dict, DataVersion]:
    if not isinstance(d, dict):
        raise BodyError("TopicConfigSerializeWrapper is not an object")
    table = d.get("topicConfigTable") or {}
    if not isinstance(table, dict):
        raise BodyError("topicConfigTable is not an object")
    topics = {check_name(TOPIC, "topic", name): TopicConfig.from_json(tc) for name, tc in table.items()}
    return topics, DataVersion.from_json(d.get("dataVersion"))


# --- subscription groups ------------------------------------------------------------------

def _strict_bool(value, what: str) -> bool:
    # fastjson reads a JSON boolean or the strings "true"/"false"; anything else is an error
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise BodyError(f"bad {what}: {value!r} (expected true or false)")


def _strict_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BodyError(f"bad {what}: {value!r} (expected an integer)")
    try:
        return int(value)
    except ValueError:
        raise BodyError(f"bad {what}: {value!r} (expected an integer)") from None


@dataclass(slots=True)
class SubscriptionGroupConfig:
    """Java's SubscriptionGroupConfig; the field names are its JSON keys (the body of
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, subscriptionGroup.json), defaults are Java's."""
    groupName: str
    consumeEnable: bool = True
    consumeFromMinEnable: bool = True
    consumeBroadcastEnable: bool = True
    retryQueueNums: int = 1
    retryMaxTimes: int = 16
    brokerId: int = 0
    whichBrokerWhenConsumeSlowly: int = 1
    notifyConsumerIdsChangedEnable: bool = True
    # RocketMQ 5.x: POP consumers of the group get FIFO queues (broker/services/pop.py)
    consumeMessageOrderly: bool = False

    def to_json(self) -> dict:
        d = {"brokerId": self.brokerId, "consumeBroadcastEnable": self.consumeBroadcastEnable,
             "consumeEnable": self.consumeEnable, "consumeFromMinEnable": self.consumeFromMinEnable,
             "groupName": self.groupName, "notifyConsumerIdsChangedEnable": self.notifyConsumerIdsChangedEnable,
             "retryMaxTimes": self.retryMaxTimes, "retryQueueNums": self.retryQueueNums,
             "whichBrokerWhenConsumeSlowly": self.whichBrokerWhenConsumeSlowly}
        if self.consumeMessageOrderly:   # 5.x's key, written when set (4.9's JSON otherwise)
            d["consumeMessageOrderly"] = True
        return d

    @classmethod
    def from_json(cls, d) -> "SubscriptionGroupConfig":
        """Strict: a missing groupName or a field of the wrong type raises BodyError naming it;
        absent fields take Java's defaults; unknown fields (newer Java versions) are ignored."""
        if not isinstance(d, dict):
            raise BodyError(f"SubscriptionGroupConfig is not a JSON object: {d!r}")
        name = d.get("groupName")
        if not isinstance(name, str) or not name.strip():
            raise BodyError(f"SubscriptionGroupConfig needs a groupName, got {name!r}")
        kw = {}
        for key in _GROUP_BOOL_FIELDS:
            if d.get(key) is not None:
                kw[key] = _strict_bool(d[key], key)
        for key in _GROUP_INT_FIELDS:
            if d.get(key) is not None:
                kw[key] = _strict_int(d[key], key)
        return cls(name, **kw)


_GROUP_BOOL_FIELDS = ("consumeEnable", "consumeFromMinEnable", "consumeBroadcastEnable",
                      "notifyConsumerIdsChangedEnable", "consumeMessageOrderly")
_GROUP_INT_FIELDS = ("retryQueueNums", "retryMaxTimes", "brokerId", "whichBrokerWhenConsumeSlowly")


def encode_subscription_group_wrapper(groups: dict, version: DataVersion) -> dict:
    """Java's SubscriptionGroupWrapper: GET_ALL_SUBSCRIPTIONGROUP_CONFIG's body and
    subscriptionGroup.json."""
    return {"dataVersion": version.to_json(),
            "subscriptionGroupTable": {name: cfg.to_json() for name, cfg in groups.items()}}


def decode_subscription_group_wrapper(d) -> tuple[dict, DataVersion]:
    if not isinstance(d, dict):
        raise BodyError("SubscriptionGroupWrapper is not an object")
    table = d.get("subscriptionGroupTable")
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise BodyError("subscriptionGroupTable is not an object")
    groups = {str(name): SubscriptionGroupConfig.from_json(cfg) for name, cfg in table.items()}
    return groups, DataVersion.from_json(d.get("dataVersion"))


def encode_register_broker_body(topics: dict, version: DataVersion) -> bytes:
    return dumps({"filterServerList": [],
                  "topicConfigSerializeWrapper": encode_topic_config_wrapper(topics, version)})


def decode_register_broker_body(body: bytes, compressed: bool = False) -> tuple[dict, DataVersion]:
    if compressed:
        return _decode_compressed_register_body(body)
    d = loads(body)
    if isinstance(d, dict) and "topicConfigSerializeWrapper" in d:
        d = d["topicConfigSerializeWrapper"]
    return decode_topic_config_wrapper(d)


def _decode_compressed_register_body(body: bytes) -> tuple[dict, DataVersion]:
    import struct
    import zlib
    try:
        raw = zlib.decompress(body)
        pos = 0

        def take_int():
            nonlocal pos
            (v,) = struct.unpack_from(">i", raw, pos)
            pos += 4
            return v

        def take(n):
            nonlocal pos
            if n < 0 or pos + n > len(raw):
                raise BodyError("compressed RegisterBrokerBody truncated")
            v = raw[pos:pos + n]
            pos += n
            return v

        version = DataVersion.from_json(loads(take(take_int())))
        topics = {}
        for _ in range(take_int()):
            parts = take(take_int()).decode().split(" ")
            if len(parts) < 5:
                raise BodyError("bad TopicConfig encoding")
            check_name(TOPIC, "topic", parts[0])
            topics[parts[0]] = TopicConfig(parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[4])
        return topics, version
    except BodyError:
        raise
    except (zlib.error, struct.error, ValueError) as e:
        raise BodyError(f"bad compressed RegisterBrokerBody: {type(e).__name__}") from None


@dataclass(slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict:
        # Both spellings: Go still reads topicSynFlag (<= 4.8), Java 4.9 topicSysFlag.
        return {"brokerName": self.broker_name, "perm": self.perm, "readQueueNums": self.read_queue_nums,
                "topicSynFlag": self.topic_sys_flag, "topicSysFlag": self.topic_sys_flag,
                "writeQueueNums": self.write_queue_nums}

    @classmethod
    def from_json(cls, d: dict) -> "QueueData":
        return cls(str(d["brokerName"]), _int(d.get("readQueueNums"), "readQueueNums"),
                   _int(d.get("writeQueueNums"), "writeQueueNums"), _int(d.get("perm"), "perm"),
                   _int(d.get("topicSysFlag", d.get("topicSynFlag", 0)), "topicSysFlag"))


@dataclass(slots=True)
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict  # broker id (int) -> "ip:port"

    def to_json(self) -> dict:
        return {"brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
                "brokerName": self.broker_name, "cluster": self.cluster}

    @classmethod
    def from_json(cls, d: dict) -> "BrokerData":
        addrs = {int(k): str(v) for k, v in (d.get("brokerAddrs") or {}).items()}
        return cls(str(d.get("cluster", "")), str(d["brokerName"]), addrs)

    def master_addr(self) -> str | None:
        return self.broker_addrs.get(0)


@dataclass(slots=True)
class TopicRouteData:
    queue_datas: list
    broker_datas: list
    order_topic_conf: str | None = None

    def to_json(self) -> dict:
        d = {"brokerDatas": [b.to_json() for b in self.broker_datas], "filterServerTable": {},
             "queueDatas": [q.to_json() for q in self.queue_datas]}
        if self.order_topic_conf:
            d["orderTopicConf"] = self.order_topic_conf
        return d

    @classmethod
    def from_body(cls, body) -> "TopicRouteData":
        d = loads(body)
        if not isinstance(d, dict):
            raise BodyError("TopicRouteData is not an object")
        try:
            return cls([QueueData.from_json(q) for q in d.get("queueDatas") or []],
                       [BrokerData.from_json(b) for b in d.get("brokerDatas") or []],
                       d.get("orderTopicConf"))
        except (KeyError, TypeError, ValueError) as e:
            raise BodyError(f"bad TopicRouteData: {e}") from None


def encode_cluster_info(broker_addr_table: dict, cluster_addr_table: dict) -> bytes:
    return dumps({"brokerAddrTable": {n: b.to_json() for n, b in broker_addr_table.items()},
                  "clusterAddrTable": {c: sorted(names) for c, names in cluster_addr_table.items()}})


def decode_cluster_info(body) -> tuple[dict, dict]:
    d = loads(body)
    brokers = {str(n): BrokerData.from_json(b) for n, b in (d.get("brokerAddrTable") or {}).items()}
    clusters = {str(c): list(v) for c, v in (d.get("clusterAddrTable") or {}).items()}
    return brokers, clusters


def encode_lock_body(group: str, client_id: str, mqs) -> bytes:
    return dumps({"clientId": client_id, "consumerGroup": group, "mqSet": [m.to_json() for m in mqs]})


def decode_lock_body(body) -> tuple[str, str, list]:
    d = loads(body)
    if not isinstance(d, dict) or not d.get("consumerGroup") or not d.get("clientId"):
        raise BodyError("lock body needs consumerGroup and clientId")
    return (check_name(GROUP, "consumerGroup", d["consumerGroup"]), check_name(CLIENT_ID, "clientId", d["clientId"]),
            [MessageQueue.from_json(m) for m in _list(d, "mqSet")])


def encode_mq_set(key: str, mqs) -> bytes:
    return dumps({key: [m.to_json() for m in mqs]})


def decode_mq_set(body, key: str) -> list:
    d = loads(body)
    if not isinstance(d, dict):
        raise BodyError(f"{key} body is not an object")
    return [MessageQueue.from_json(m) for m in _list(d, key)]


# --- offset reset (INVOKE_BROKER_TO_RESET_OFFSET 222 / RESET_CONSUMER_CLIENT_OFFSET 220) -------

def encode_reset_offset_body(table: dict) -> bytes:
    """ResetOffsetBody {MessageQueue: offset} in fastjson's object-keyed form (Java clients,
    admin replies): {"offsetTable":{{"brokerName":..,"queueId":..,"topic":..}:42}}."""
    return ('{"offsetTable":' + dumps_object_keyed(dict(sorted(table.items()))) + "}").encode()


def encode_reset_offset_body_for_c(table: dict) -> bytes:
    """ResetOffsetBodyForC: what the C++ client parses, an array of MessageQueueForC."""
    return dumps({"offsetTable": [dict(mq.to_json(), offset=off) for mq, off in sorted(table.items())]})


def object_keyed_items(table: dict):
    """(MessageQueue, value) of a fastjson Map<MessageQueue, V> as parsed by loads() (keys
    as tuples of items, or JSON text). Raises BodyError for a key that is no MessageQueue."""
    for k, v in table.items():
        if isinstance(k, str):      # tolerate a JSON-encoded key
            k = loads(k)
        yield MessageQueue.from_json(k), v


def decode_reset_offset_body(body) -> dict:
    """Either form above -> {MessageQueue: offset}. Raises BodyError when malformed."""
    d = loads(body)
    table = d.get("offsetTable") if isinstance(d, dict) else None
    out = {}
    if isinstance(table, list):                       # ForC
        for e in table:
            if not isinstance(e, dict):
                raise BodyError(f"bad reset offset entry {e!r}")
            out[MessageQueue.from_json(e)] = _int(e.get("offset"), "offset", -1)
    elif isinstance(table, dict):                     # object keys
        for mq, v in object_keyed_items(table):
            out[mq] = _int(v, "offset", -1)
    elif table is not None:
        raise BodyError("reset offset body: offsetTable is neither an object nor an array")
    if any(off < 0 for off in out.values()):
        raise BodyError("reset offset body: negative offset")
    return out


# --- broker offset tables (GET_ALL_CONSUMER_OFFSET 43, GET_ALL_DELAY_OFFSET 45) -----------------
#
# What a slave reads from its master (and a returning master from its slaves). Java writes
# both with fastjson, integer keys bare ({"offsetTable":{"T@G":{0:12}}}); pocketmq quotes
# them ({"offsetTable":{"T@G":{"0":12}}}), which fastjson reads back into its Integer keys.
# Other members (5.x adds dataVersion) are ignored.

def _offset_table(body, what: str) -> dict:
    d = loads(body)
    if not isinstance(d, dict):
        raise BodyError(f"{what} is not an object")
    table = d.get("offsetTable")
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise BodyError(f"{what}: offsetTable is not an object")
    return table


def _offset(value, what: str) -> int:
    off = _strict_int(value, what)
    if off < 0:
        raise BodyError(f"bad {what}: {off} (negative)")
    return off


def decode_consumer_offset_wrapper(body) -> dict[str, dict[int, int]]:
    """Java's ConsumerOffsetSerializeWrapper (GET_ALL_CONSUMER_OFFSET's body; consumerOffset.json)
    -> {"topic@group": {queueId: offset}}. Raises BodyError naming what is malformed: a key
    that is not a valid `topic@group`, a queue id or offset that is no integer. A negative
    offset is left out: it is what a broker stores when a client commits -1 for a queue it
    holds no position in (ali-ons does, for a queue at offset 0), and means "no offset"."""
    out = {}
    for key, queues in _offset_table(body, "ConsumerOffsetSerializeWrapper").items():
        if not isinstance(key, str) or "@" not in key:
            raise BodyError(f"bad consumer offset key {key!r}: expected topic@group")
        topic, _, group = key.partition("@")
        check_name(TOPIC, "consumer offset topic", topic)
        check_name(GROUP, "consumer offset group", group)
        if not isinstance(queues, dict):
            raise BodyError(f"consumer offsets of {key} are not an object")
        offsets = {_strict_int(q, f"queue id of {key}"): _strict_int(o, f"offset of {key}")
                   for q, o in queues.items()}
        out[key] = {q: o for q, o in offsets.items() if o >= 0}
    return out


def decode_delay_offset_wrapper(body) -> dict[int, int]:
    """Java's DelayOffsetSerializeWrapper (GET_ALL_DELAY_OFFSET's body; delayOffset.json)
    -> {delay level: next SCHEDULE_TOPIC_XXXX queue offset}. Raises BodyError when malformed."""
    out = {}
    for level, off in _offset_table(body, "DelayOffsetSerializeWrapper").items():
        level = _strict_int(level, "delay level")
        if level < 1:
            raise BodyError(f"bad delay level {level} (levels start at 1)")
        out[level] = _offset(off, f"delay offset of level {level}")
    return out


# --- consumer running info (GET_CONSUMER_RUNNING_INFO 307, client -> broker -> admin) -----------
#
# Java's ConsumerRunningInfo as fastjson writes it (fields sorted, jstack omitted when null):
#   {"mqTable":{{"brokerName":..,"queueId":..,"topic":..}:{ProcessQueueInfo}},
#    "properties":{"PROP_CONSUME_TYPE":"CONSUME_PASSIVELY",...},        (all values strings)
#    "statusTable":{"<topic>":{ConsumeStatus}},
#    "subscriptionSet":[{SubscriptionData},...]}

PROP_NAMESERVER_ADDR = "PROP_NAMESERVER_ADDR"
PROP_THREADPOOL_CORE_SIZE = "PROP_THREADPOOL_CORE_SIZE"
PROP_CONSUME_ORDERLY = "PROP_CONSUMEORDERLY"          # sic: Java's constant has no underscore
PROP_CONSUME_TYPE = "PROP_CONSUME_TYPE"
PROP_CLIENT_VERSION = "PROP_CLIENT_VERSION"
PROP_CONSUMER_START_TIMESTAMP = "PROP_CONSUMER_START_TIMESTAMP"

# ProcessQueueInfo fields (Java 4.9), in the order its toString prints them.
PROCESS_QUEUE_INFO_FIELDS = (
    "commitOffset", "cachedMsgMinOffset", "cachedMsgMaxOffset", "cachedMsgCount", "cachedMsgSizeInMiB",
    "transactionMsgMinOffset", "transactionMsgMaxOffset", "transactionMsgCount", "locked",
    "tryUnlockTimes", "lastLockTimestamp", "droped", "lastPullTimestamp", "lastConsumeTimestamp",
)
# ConsumeStatus fields (Java 4.9).
CONSUME_STATUS_FIELDS = ("pullRT", "pullTPS", "consumeRT", "consumeOKTPS", "consumeFailedTPS",
                         "consumeFailedMsgs")


def encode_consumer_running_info(properties: dict, subscriptions, mq_table: dict, status_table: dict,
                                 jstack: str | None = None) -> bytes:
    """ConsumerRunningInfo in fastjson's form. `properties` values are written as strings
    (java.util.Properties); `subscriptions` are SubscriptionData; `mq_table` maps
    MessageQueue -> ProcessQueueInfo dict (every PROCESS_QUEUE_INFO_FIELDS key, extra keys
    allowed: fastjson readers ignore them); `status_table` maps topic -> ConsumeStatus dict."""
    for mq, info in mq_table.items():
        missing = [f for f in PROCESS_QUEUE_INFO_FIELDS if f not in info]
        if missing:
            raise BodyError(f"ProcessQueueInfo of {mq} lacks {', '.join(missing)}")
    props = json.dumps({str(k): str(v) for k, v in properties.items()}, separators=(",", ":"),
                       sort_keys=True, ensure_ascii=False)
    subs = json.dumps([s.to_json() for s in sorted(subscriptions, key=lambda s: (s.topic, s.sub_string))],
                      separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    status = json.dumps({t: {f: v.get(f, 0) for f in CONSUME_STATUS_FIELDS} for t, v in status_table.items()},
                        separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    head = "{" if jstack is None else '{"jstack":' + json.dumps(jstack, ensure_ascii=False) + ","
    return (head + '"mqTable":' + dumps_object_keyed(dict(sorted(mq_table.items()))) + ',"properties":' + props
            + ',"statusTable":' + status + ',"subscriptionSet":' + subs + "}").encode()


def decode_consumer_running_info(body) -> dict:
    """ConsumerRunningInfo from a Java, C++ or pocketmq client -> {"properties": {str: str},
    "subscriptionSet": [SubscriptionData], "mqTable": {MessageQueue: dict},
    "statusTable": {topic: dict}, "jstack": str | None}. Raises BodyError when malformed."""
    d = loads(body)
    if not isinstance(d, dict):
        raise BodyError("consumer running info is not a JSON object")
    def field(name, empty):
        v = d.get(name)
        return empty if v is None else v      # an absent or null field is empty, a wrong type is not
    props, table, status, subs = (field("properties", {}), field("mqTable", {}), field("statusTable", {}),
                                  field("subscriptionSet", []))
    if not (isinstance(props, dict) and isinstance(table, dict) and isinstance(status, dict)
            and isinstance(subs, list)):
        raise BodyError("consumer running info: properties/mqTable/statusTable must be objects, "
                        "subscriptionSet an array")
    mqs = {}
    for mq, v in object_keyed_items(table):
        if not isinstance(v, dict):
            raise BodyError(f"ProcessQueueInfo of {mq} is not an object")
        mqs[mq] = v
    return {"properties": {str(k): str(v) for k, v in props.items()},
            "subscriptionSet": [subscription_from_json(s) for s in subs],
            "mqTable": dict(sorted(mqs.items())),
            "statusTable": {str(t): v for t, v in status.items() if isinstance(v, dict)},
            "jstack": d.get("jstack")}


# --- consume a message directly (CONSUME_MESSAGE_DIRECTLY 309, admin -> broker -> client) ---------
#
# The client's answer, Java's ConsumeMessageDirectlyResult as fastjson writes it (fields sorted,
# a null field left out, the enum by name):
#   {"autoCommit":true,"consumeResult":"CR_SUCCESS","order":false,"remark":"..","spentTimeMills":3}
# consumeResult is Java's CMResult; `order` says the client consumes orderly, `autoCommit` is
# an orderly listener's context flag (true for concurrent listeners).

CM_RESULTS = ("CR_SUCCESS", "CR_LATER", "CR_ROLLBACK", "CR_COMMIT", "CR_THROW_EXCEPTION", "CR_RETURN_NULL")


@dataclass(frozen=True, slots=True)
class ConsumeMessageDirectlyResult:
    order: bool = False
    auto_commit: bool = True
    consume_result: str | None = None      # one of CM_RESULTS; None: the listener's status was not one
    remark: str | None = None
    spent_time_mills: int = 0               # (sic: Java's field name)

    def encode(self) -> bytes:
        if self.consume_result is not None and self.consume_result not in CM_RESULTS:
            raise BodyError(f"bad consumeResult {self.consume_result!r} (expected one of {', '.join(CM_RESULTS)})")
        d = {"autoCommit": self.auto_commit, "order": self.order, "spentTimeMills": int(self.spent_time_mills)}
        if self.consume_result is not None:
            d["consumeResult"] = self.consume_result
        if self.remark is not None:
            d["remark"] = self.remark
        return dumps(d)

    @classmethod
    def decode(cls, body) -> "ConsumeMessageDirectlyResult":
        """From a Java or pocketmq client's answer; BodyError when malformed (booleans and
        numbers are also taken as strings, as fastjson reads them)."""
        d = loads(body)
        if not isinstance(d, dict):
            raise BodyError("ConsumeMessageDirectlyResult is not a JSON object")
        result = d.get("consumeResult")
        if result is not None and result not in CM_RESULTS:
            raise BodyError(f"bad consumeResult {result!r} (expected one of {', '.join(CM_RESULTS)})")
        remark = d.get("remark")
        return cls(order=_strict_bool(d["order"], "order") if d.get("order") is not None else False,
                   auto_commit=(_strict_bool(d["autoCommit"], "autoCommit")
                                if d.get("autoCommit") is not None else True),
                   consume_result=result, remark=None if remark is None else str(remark),
                   spent_time_mills=(_strict_int(d["spentTimeMills"], "spentTimeMills")
                                     if d.get("spentTimeMills") is not None else 0))

    def __str__(self) -> str:
        """Java's toString, which mqadmin's queryMsgById -g -d prints."""
        def text(v):
            return "null" if v is None else v
        return (f"ConsumeMessageDirectlyResult [order={str(self.order).lower()}, "
                f"autoCommit={str(self.auto_commit).lower()}, consumeResult={text(self.consume_result)}, "
                f"remark={text(self.remark)}, spentTimeMills={self.spent_time_mills}]")
