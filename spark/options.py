"""Reader and writer options of the pocketmq Spark source: parsing and validation, pure.

Names and semantics follow Spark's Kafka source (anchors.md 4.1) where they exist:

| option            | default     | meaning                                                        |
|-------------------|-------------|----------------------------------------------------------------|
| namesrvAddr       | required    | `host:port[;host:port]`                                        |
| subscribe         | one of two  | comma-separated topics                                         |
| subscribePattern  | one of two  | regex over the nameserver's topic list (fullmatch)             |
| startingOffsets   | earliest    | `earliest`, `latest` or JSON {"topic": {"broker:qid": offset}} |
| endingOffsets     | latest      | same forms; -2 = earliest, -1 = latest (Kafka's)               |
| startingTimestamp | none        | ms; per queue SEARCH_OFFSET_BY_TIMESTAMP; wins over Offsets    |
| endingTimestamp   | none        | ms; likewise for the end bound                                 |
| minPartitions     | none        | split queues into offset ranges until there are this many      |
| subExpression     | `*`         | tag filter `TagA || TagB`                                      |
| failOnDataLoss    | true        | fail when a wanted range starts below the queue's min offset   |
| maxOffsetsPerTrigger | none     | stream: cap of offsets per micro-batch, split over the queues   |
| groupId           | none        | stream: commit each micro-batch's end as this group's offsets   |
| accessKey         | none        | plain ACL: sign every request with this account (source, sink)  |
| secretKey         | none        | its secret; both or neither (default: the driver's environment  |
|                   |             | ROCKETMQ_ACCESS_KEY / ROCKETMQ_SECRET_KEY, read when the query   |
|                   |             | is planned and shipped to the executors with the options)       |
| tlsEnable         | false       | every connection over TLS (RocketMQ's tls.enable; the server's   |
|                   |             | certificate not verified, as RocketMQ's clients default)         |

A stream (`parse_reader_options(..., streaming=True)`) starts at `latest` by default, as
Kafka's streams do, and refuses the batch-only end bounds. The offsets JSON
`{"topic": {"brokerName:queueId": offset}}` is also the form of the stream's offsets in
Spark's checkpoint: `parse_offsets_doc` / `offsets_to_json` are its one reader and writer.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pocketmq.client.credentials import Credentials, resolve_credentials
from pocketmq.client.errors import InvalidArgumentError

EARLIEST = -2
LATEST = -1


class OptionError(ValueError):
    """A bad or missing option; the message names it."""


class _Options:
    """Option lookup by name, case-insensitive like Spark's (its CaseInsensitiveDict hands
    the source lower-cased keys)."""

    def __init__(self, options):
        self._d = {str(k).lower(): v for k, v in dict(options).items()}

    def get(self, name: str, default=None):
        return self._d.get(name.lower(), default)


def _bool(options: dict, name: str, default: bool) -> bool:
    v = options.get(name)
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name} must be true or false, got {v!r}")


def _int(options: dict, name: str) -> int | None:
    v = options.get(name)
    if v is None or str(v).strip() == "":
        return None
    try:
        return int(str(v).strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {v!r}") from None


def parse_credentials(options, environ=None) -> Credentials | None:
    """accessKey / secretKey (else ROCKETMQ_ACCESS_KEY / ROCKETMQ_SECRET_KEY of `environ`,
    the driver's environment; None: no fallback). Credentials never print their secret."""
    try:
        return resolve_credentials(options.get("accessKey"), options.get("secretKey"),
                                   environ if environ is not None else {})
    except InvalidArgumentError as e:
        raise OptionError(f"option {e}") from None


def require_namesrv(options: dict) -> str:
    addr = options.get("namesrvAddr")
    if addr is None or not str(addr).strip():
        raise OptionError("option namesrvAddr is required (the nameserver address, host:port)")
    return str(addr).strip()


def queue_key(broker_name: str, queue_id: int) -> str:
    """The "brokerName:queueId" key of the offsets JSON."""
    return f"{broker_name}:{queue_id}"


def parse_offsets_doc(label: str, doc, min_offset: int = EARLIEST) -> dict[str, dict[tuple[str, int], int]]:
    """A decoded offsets JSON object -> {topic: {(broker_name, queue_id): offset}}; every
    offset must be an integer >= min_offset (EARLIEST lets -2 / -1 through). `label` starts
    each error message ("option startingOffsets")."""
    if not isinstance(doc, dict):
        raise OptionError(f"{label}: JSON must be an object of topics, got {doc!r}")
    out: dict[str, dict[tuple[str, int], int]] = {}
    for topic, queues in doc.items():
        if not isinstance(queues, dict):
            raise OptionError(f"{label}: topic {topic!r} must map \"brokerName:queueId\" to offsets")
        table = out[topic] = {}
        for key, off in queues.items():
            broker, sep, qid = str(key).rpartition(":")
            if not sep or not broker or not qid.isdigit():
                raise OptionError(f"{label}: queue key {key!r} of topic {topic!r} must be brokerName:queueId")
            if type(off) is not int or off < min_offset:
                raise OptionError(f"{label}: offset of {topic} {key} must be an integer >= {min_offset}, "
                                  f"got {off!r}")
            table[(broker, int(qid))] = off
    return out


def offsets_to_json(table: dict[tuple[str, str, int], int]) -> dict[str, dict[str, int]]:
    """{(topic, broker_name, queue_id): offset} -> the offsets JSON object, in one canonical
    order (topics by name, queues by broker name then queue id): Spark compares a stream's
    offsets as JSON text, so equal tables must serialise to equal text."""
    out: dict[str, dict[str, int]] = {}
    for topic, broker, qid in sorted(table):
        out.setdefault(topic, {})[queue_key(broker, qid)] = table[(topic, broker, qid)]
    return out


def offsets_from_json(doc, label: str = "stream offset") -> dict[tuple[str, str, int], int]:
    """The inverse of offsets_to_json (offsets >= 0: a checkpointed position, no -2/-1)."""
    return {(topic, b, q): off for topic, queues in parse_offsets_doc(label, doc, 0).items()
            for (b, q), off in queues.items()}


def parse_offsets_spec(name: str, value: str | None, default: int):
    """`earliest` / `latest` -> EARLIEST / LATEST (applies to every queue); JSON ->
    {topic: {(broker_name, queue_id): offset}} where offset may be EARLIEST / LATEST."""
    if value is None or str(value).strip() == "":
        return default
    s = str(value).strip()
    if s.lower() == "earliest":
        return EARLIEST
    if s.lower() == "latest":
        return LATEST
    try:
        doc = json.loads(s)
    except ValueError:
        raise OptionError(f"option {name} must be earliest, latest or JSON "
                          f'{{"topic": {{"brokerName:queueId": offset}}}}, got {s!r}') from None
    return parse_offsets_doc(f"option {name}", doc)


@dataclass(frozen=True)
class ReaderOptions:
    namesrv_addr: str
    topics: tuple[str, ...]           # from subscribe (empty with a pattern)
    pattern: str | None               # subscribePattern
    starting: object                  # EARLIEST / LATEST / per-queue dict
    ending: object
    starting_timestamp: int | None
    ending_timestamp: int | None
    min_partitions: int | None
    sub_expression: str
    fail_on_data_loss: bool
    max_offsets_per_trigger: int | None = None   # stream only
    group_id: str | None = None                  # stream only
    credentials: Credentials | None = None       # accessKey / secretKey
    tls: bool = False                            # tlsEnable


STREAM_ONLY = ("maxOffsetsPerTrigger", "groupId")
BATCH_ONLY = ("endingOffsets", "endingTimestamp")


def parse_reader_options(options, streaming: bool = False, environ=None) -> ReaderOptions:
    """Batch (streaming=False) or stream reader options. The two differ like Kafka's: a
    stream starts at `latest` by default and has no end bound (endingOffsets and
    endingTimestamp are an OptionError); maxOffsetsPerTrigger and groupId only act on
    streams (a batch read ignores them, as Kafka's batch read ignores its stream options)."""
    options = _Options(options)
    namesrv = require_namesrv(options)
    subscribe = options.get("subscribe")
    pattern = options.get("subscribePattern")
    has_sub = subscribe is not None and str(subscribe).strip() != ""
    has_pat = pattern is not None and str(pattern).strip() != ""
    if has_sub == has_pat:
        raise OptionError("exactly one of the options subscribe (comma-separated topics) and "
                          "subscribePattern (a regex) must be given"
                          + (", not both" if has_sub else ""))
    topics: tuple[str, ...] = ()
    if has_sub:
        topics = tuple(dict.fromkeys(t.strip() for t in str(subscribe).split(",") if t.strip()))
        if not topics:
            raise OptionError(f"option subscribe names no topic: {subscribe!r}")
    else:
        try:
            re.compile(str(pattern))
        except re.error as e:
            raise OptionError(f"option subscribePattern is not a valid regex: {e}") from None
    min_parts = _int(options, "minPartitions")
    if min_parts is not None and min_parts < 1:
        raise OptionError(f"option minPartitions must be >= 1, got {min_parts}")
    sub_expr = str(options.get("subExpression") or "*").strip() or "*"
    if streaming:
        given = [n for n in BATCH_ONLY if options.get(n) is not None and str(options.get(n)).strip()]
        if given:
            raise OptionError(f"option {given[0]} is for batch reads only: a stream has no end "
                              "(use trigger(availableNow=True) to stop at what exists)")
    max_per_trigger = _int(options, "maxOffsetsPerTrigger")
    if max_per_trigger is not None and max_per_trigger < 1:
        raise OptionError(f"option maxOffsetsPerTrigger must be >= 1, got {max_per_trigger}")
    group_id = options.get("groupId")
    group_id = str(group_id).strip() if group_id is not None and str(group_id).strip() else None
    if group_id is not None:
        from pocketmq.client.errors import InvalidArgumentError
        from pocketmq.client.producer import check_group   # the client's group-name rule

        try:
            check_group(group_id)
        except InvalidArgumentError as e:
            raise OptionError(f"option groupId: {e}") from None
    return ReaderOptions(
        namesrv_addr=namesrv, topics=topics, pattern=str(pattern) if has_pat else None,
        starting=parse_offsets_spec("startingOffsets", options.get("startingOffsets"),
                                    LATEST if streaming else EARLIEST),
        ending=LATEST if streaming else parse_offsets_spec("endingOffsets", options.get("endingOffsets"), LATEST),
        starting_timestamp=_int(options, "startingTimestamp"),
        ending_timestamp=None if streaming else _int(options, "endingTimestamp"),
        min_partitions=min_parts, sub_expression=sub_expr,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        max_offsets_per_trigger=max_per_trigger, group_id=group_id,
        credentials=parse_credentials(options, environ), tls=_bool(options, "tlsEnable", False))


def tag_set(sub_expression: str) -> frozenset[str] | None:
    """The tags of `TagA || TagB`; None for `*` (everything)."""
    if sub_expression.strip() in ("", "*"):
        return None
    return frozenset(t.strip() for t in sub_expression.split("||") if t.strip())


@dataclass(frozen=True)
class WriterOptions:
    namesrv_addr: str
    topic: str | None
    producer_group: str
    batch_size: int
    credentials: Credentials | None = None
    tls: bool = False


def parse_writer_options(options, environ=None) -> WriterOptions:
    options = _Options(options)
    namesrv = require_namesrv(options)
    topic = options.get("topic")
    batch = _int(options, "batchSize") or 256
    if batch < 1:
        raise OptionError(f"option batchSize must be >= 1, got {batch}")
    return WriterOptions(namesrv, str(topic).strip() if topic and str(topic).strip() else None,
                         str(options.get("producerGroup") or "spark-writer"), batch,
                         parse_credentials(options, environ), _bool(options, "tlsEnable", False))
