"""The revive log's records: what POP consumption writes into the CommitLog (pure).

Every pop, ack, invisibility change and redelivery is a record of the system topic
`rmq_sys_REVIVE_LOG_<cluster>` (common/constants.py `revive_topic`), queue 0, written
before the request that caused it is answered. The CommitLog is the only truth: after a
crash the broker replays this queue from its checkpoint (the consumer offset of
`CID_RMQ_SYS_REVIVE_GROUP`) and gets back every popped message that was not acked,
with its lease (broker/core/pop.py `PopState.apply`). RocketMQ keeps the same facts
(PopCheckPoint, AckMsg) in its revive topic; the body here is our own.

Record: a stored message whose BODY is one UTF-8 JSON object and whose TAGS is the kind
(so `mqadmin queryMsgByOffset` shows what it is). Fields:

| key  | type        | kinds          | meaning |
|------|-------------|----------------|---------|
| `k`  | str         | all            | kind: `ck` leased, `ack`, `chg` lease changed, `rev` given back |
| `g`  | str         | all            | consumer group |
| `t`  | str         | all            | the topic the messages were read from (a `%RETRY%<group>_<topic>` for retries) |
| `q`  | int         | all            | queue id |
| `pt` | int         | all            | pop time (ms): the lease's id; for `ack`/`chg`/`rev` the lease acted on |
| `it` | int         | `ck`, `chg`    | invisible time (ms): visible again at `pt + it` (`chg`: at `npt + it`) |
| `o`  | [int]       | `ck`           | queue offsets leased |
| `o`  | int         | `ack`,`chg`,`rev` | the one queue offset acted on |
| `c`  | [int]       | `ck`           | their commit-log offsets (the revive step reads the message there) |
| `a`  | [int]       | `ck`           | their delivery attempts (1 = first delivery) |
| `f`  | 0/1         | `ck`           | orderly (FIFO) pop: redelivered in place, never through the retry topic |
| `ai` | str         | `ck`           | the pop's attempt id (FIFO: the same id, the same batch); or absent |
| `npt`| int         | `chg`          | the new lease's pop time (its handle's id) |

`rev`: the message was copied to the retry topic or the DLQ. A `ck` of offsets already
leased (a FIFO redelivery) replaces their leases.
"""
from __future__ import annotations

import json
from typing import NamedTuple

CK = "ck"
ACK = "ack"
CHANGE = "chg"
REVIVED = "rev"
KINDS = frozenset({CK, ACK, CHANGE, REVIVED})


class LogRecord(NamedTuple):
    kind: str
    group: str
    topic: str
    queue_id: int
    pop_time: int
    invisible_ms: int = 0
    offsets: tuple[int, ...] = ()          # ck: the leased offsets; others: (the offset,)
    commit_log_offsets: tuple[int, ...] = ()
    attempts: tuple[int, ...] = ()
    fifo: bool = False
    attempt_id: str | None = None
    new_pop_time: int = 0


def encode_ck(group: str, topic: str, queue_id: int, pop_time: int, invisible_ms: int,
              offsets, commit_log_offsets, attempts, fifo: bool, attempt_id: str | None) -> bytes:
    d = {"k": CK, "g": group, "t": topic, "q": queue_id, "pt": pop_time, "it": invisible_ms,
         "o": list(offsets), "c": list(commit_log_offsets), "a": list(attempts), "f": int(fifo)}
    if attempt_id:
        d["ai"] = attempt_id
    return json.dumps(d, separators=(",", ":")).encode()


def encode_one(kind: str, group: str, topic: str, queue_id: int, offset: int, pop_time: int,
               new_pop_time: int = 0, invisible_ms: int = 0) -> bytes:
    """An `ack`, `rev` or `chg` record of one offset."""
    d = {"k": kind, "g": group, "t": topic, "q": queue_id, "o": offset, "pt": pop_time}
    if kind == CHANGE:
        d["npt"] = new_pop_time
        d["it"] = invisible_ms
    return json.dumps(d, separators=(",", ":")).encode()


def _int(d: dict, key: str) -> int:
    v = d.get(key)
    if type(v) is not int:
        raise ValueError(f"revive log record: {key!r} is not an integer: {v!r}")
    return v


def _ints(d: dict, key: str) -> tuple[int, ...]:
    v = d.get(key)
    if not isinstance(v, list) or any(type(x) is not int for x in v):
        raise ValueError(f"revive log record: {key!r} is not a list of integers: {v!r}")
    return tuple(v)


def decode(body: bytes) -> LogRecord:
    """A record's body; ValueError naming what is wrong (the replay skips and logs it)."""
    try:
        d = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"revive log record is not JSON: {e}") from None
    if not isinstance(d, dict):
        raise ValueError("revive log record is not a JSON object")
    kind = d.get("k")
    if kind not in KINDS:
        raise ValueError(f"revive log record of unknown kind {kind!r}")
    group, topic = d.get("g"), d.get("t")
    if not isinstance(group, str) or not isinstance(topic, str) or not group or not topic:
        raise ValueError("revive log record without group or topic")
    qid, pt = _int(d, "q"), _int(d, "pt")
    if kind == CK:
        offsets, clos, attempts = _ints(d, "o"), _ints(d, "c"), _ints(d, "a")
        if not (len(offsets) == len(clos) == len(attempts)) or not offsets:
            raise ValueError("revive log checkpoint: offsets, commit-log offsets and attempts differ in length")
        ai = d.get("ai")
        return LogRecord(CK, group, topic, qid, pt, _int(d, "it"), offsets, clos, attempts, bool(d.get("f")),
                         ai if isinstance(ai, str) and ai else None)
    offset = _int(d, "o")
    if kind == CHANGE:
        return LogRecord(CHANGE, group, topic, qid, pt, _int(d, "it"), (offset,), new_pop_time=_int(d, "npt"))
    return LogRecord(kind, group, topic, qid, pt, offsets=(offset,))
