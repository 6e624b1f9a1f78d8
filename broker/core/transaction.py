"""Transactional messages: the rules, pure (reference 8.6; Java 4.9's
TransactionalMessageServiceImpl / EndTransactionProcessor).

A half message is the producer's message stored in RMQ_SYS_TRANS_HALF_TOPIC queue 0
with its real topic and queue in REAL_TOPIC / REAL_QID and its transaction bits reset
to NOT_TYPE (so it gets a consume-queue entry there and nowhere else: no consumer
subscribes to the half topic). A decision (END_TRANSACTION commit or rollback, or a
discard after transactionCheckMax checks) is recorded by an op record in
RMQ_SYS_TRANS_OP_HALF_TOPIC queue 0: tag "d", body = the decided half message's queue
offset as decimal text (Java's layout), plus our TRAN_PREPARED_QUEUE_OFFSET property
naming its *origin*.

Origin: each check re-stores the half message at the end of the half queue with
TRANSACTION_CHECK_TIMES + 1 (that is how the count survives a restart, as in Java), so
one transaction may have several half records. All of them carry the origin (the
first record's queue offset) in TRAN_PREPARED_QUEUE_OFFSET (the first one has it
implicitly). A decision is about the origin: once one record of a transaction is
decided, no later END_TRANSACTION (a late producer, a second check answer) applies
another one (Java would store the message twice).

Everything here is a function of its arguments; the clock comes in as now_ms.
"""
from __future__ import annotations

import enum
from typing import Iterable, NamedTuple

from pocketmq.broker.core.delay import real_place
from pocketmq.common.constants import TRANS_HALF_TOPIC
from pocketmq.protocol.codes import ResponseCode
from pocketmq.protocol.message import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TAGS,
    TRAN_MSG,
    TRAN_PREPARED_QUEUE_OFFSET,
    TRANSACTION_CHECK_TIMES,
    MessageSysFlag,
    decode_properties,
    encode_properties,
)

HALF_QUEUE_ID = 0
OP_QUEUE_ID = 0
REMOVE_TAG = "d"          # Java's TransactionalMessageUtil.REMOVETAG

NOT_TYPE = MessageSysFlag.TRANSACTION_NOT_TYPE
PREPARED = MessageSysFlag.TRANSACTION_PREPARED_TYPE
COMMIT = MessageSysFlag.TRANSACTION_COMMIT_TYPE
ROLLBACK = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE


# -- the half message ----------------------------------------------------------------------

def half_properties(props: str, topic: str, queue_id: int, producer_group: str) -> str:
    """The properties a prepared message is stored with: its real place, and PGROUP (the
    group asked at check time) taken from the send header when the client left it out."""
    d = decode_properties(props)
    d[REAL_TOPIC] = topic
    d[REAL_QID] = str(queue_id)
    if not d.get(PGROUP):
        d[PGROUP] = producer_group
    return encode_properties(d)


def half_sys_flag(sys_flag: int) -> int:
    return MessageSysFlag.reset_transaction_value(sys_flag, NOT_TYPE)


def origin_of(props: dict, queue_offset: int) -> int:
    """The transaction's first half-queue offset (see the module docstring)."""
    v = props.get(TRAN_PREPARED_QUEUE_OFFSET)
    if v:
        try:
            return int(v)
        except ValueError:
            pass
    return queue_offset


def check_times_of(props: dict) -> int:
    try:
        return max(0, int(props.get(TRANSACTION_CHECK_TIMES) or 0))
    except ValueError:
        return 0


def renewed_properties(props: dict, origin: int, check_times: int) -> str:
    """The properties of the half record re-stored for a check."""
    d = dict(props)
    d[TRAN_PREPARED_QUEUE_OFFSET] = str(origin)
    d[TRANSACTION_CHECK_TIMES] = str(check_times)
    return encode_properties(d)


class RealMessage(NamedTuple):
    topic: str
    queue_id: int
    properties: str


def real_message(props: dict) -> RealMessage | None:
    """Where a committed half message goes and the properties it is stored with (the
    half-message bookkeeping removed), or None when it does not say."""
    place = real_place(props)
    if place is None:
        return None
    topic, qid = place
    d = dict(props)
    for k in (REAL_TOPIC, REAL_QID, TRAN_MSG, TRAN_PREPARED_QUEUE_OFFSET):
        d.pop(k, None)
    return RealMessage(topic, qid, encode_properties(d))


# -- op records ------------------------------------------------------------------------------

def op_record(half_queue_offset: int, origin: int) -> tuple[bytes, str]:
    """(body, properties) of the op record deciding a half message."""
    return str(half_queue_offset).encode(), encode_properties(
        {TAGS: REMOVE_TAG, TRAN_PREPARED_QUEUE_OFFSET: str(origin)})


def parse_op(body: bytes, props: dict) -> int | None:
    """The origin an op record decides, or None for a record that is not one of ours or
    Java's (logged and skipped by the caller)."""
    if props.get(TAGS) != REMOVE_TAG:
        return None
    try:
        half_offset = int(body.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return origin_of(props, half_offset)


class DecidedTransactions:
    """The origins decided so far: rebuilt from the op queue at start (every op record the
    store still has), then kept up to date by END_TRANSACTION and discards."""

    __slots__ = ("origins",)

    def __init__(self) -> None:
        self.origins: set[int] = set()

    def __contains__(self, origin: int) -> bool:
        return origin in self.origins

    def __len__(self) -> int:
        return len(self.origins)

    def add(self, origin: int) -> None:
        self.origins.add(origin)


# -- END_TRANSACTION -----------------------------------------------------------------------

def check_end_transaction(topic: str, props: dict, queue_offset: int, producer_group: str,
                          tran_state_table_offset: int, commit_or_rollback: int) -> tuple[int, str] | None:
    """(code, remark) when an END_TRANSACTION cannot apply to the record found at its
    commitLogOffset, else None. Java's remarks where Java has one."""
    if commit_or_rollback not in (COMMIT, ROLLBACK):
        return ResponseCode.SYSTEM_ERROR, (f"commitOrRollback {commit_or_rollback} is not 8 (commit) "
                                           f"or 12 (rollback)")
    if topic != TRANS_HALF_TOPIC:
        return ResponseCode.SYSTEM_ERROR, (f"the message at this commitLogOffset is not a half message "
                                           f"(topic {topic}, not {TRANS_HALF_TOPIC})")
    if props.get(PGROUP) != producer_group:
        return ResponseCode.SYSTEM_ERROR, "The producer group wrong"
    if queue_offset != tran_state_table_offset:
        return ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong"
    return None


# -- the check-back decision ------------------------------------------------------------------

class HalfView(NamedTuple):
    """What the check decision needs of one half record."""
    queue_offset: int
    origin: int
    store_timestamp: int
    check_times: int
    immunity_ms: int | None    # CHECK_IMMUNITY_TIME_IN_SECONDS, when the producer set one


def half_view(queue_offset: int, store_timestamp: int, props: dict) -> HalfView:
    immunity = None
    v = props.get(CHECK_IMMUNITY_TIME_IN_SECONDS)
    if v:
        try:
            immunity = int(v) * 1000
        except ValueError:
            immunity = None
    return HalfView(queue_offset, origin_of(props, queue_offset), store_timestamp, check_times_of(props),
                    immunity)


class CheckAction(enum.Enum):
    SKIP = "skip"          # decided already: nothing to do
    CHECK = "check"        # re-store with one more check, ask the producer group
    DISCARD = "discard"    # checked transactionCheckMax times: give up on it


class CheckPlan(NamedTuple):
    actions: list[tuple[CheckAction, HalfView]]
    next_offset: int       # the service's new progress in the half queue


def plan_checks(halves: Iterable[HalfView], start_offset: int, decided: DecidedTransactions, *,
                now_ms: int, pass_start_ms: int, timeout_ms: int, check_max: int) -> CheckPlan:
    """Walk half records in queue order from `start_offset` and decide each one.

    A record stored since this pass started (a copy this pass made, or a message that
    just arrived) stops the walk: copies are asked again at the next pass, i.e. every
    transactionCheckInterval. A first check waits until the message is transactionTimeOut
    old (CHECK_IMMUNITY_TIME_IN_SECONDS overrides it), measured on the broker's own store
    timestamps so producer clocks do not matter; records are in store order, so the
    first one too young stops the walk. A clock that went back (negative age) checks
    now rather than never. Records decided already are skipped; one checked check_max
    times is discarded."""
    actions: list[tuple[CheckAction, HalfView]] = []
    offset = start_offset
    for h in halves:
        if h.queue_offset < offset:
            continue
        if h.origin in decided:
            actions.append((CheckAction.SKIP, h))
        elif h.store_timestamp >= pass_start_ms:
            break
        elif h.check_times >= check_max:
            actions.append((CheckAction.DISCARD, h))
        else:
            if h.check_times == 0:
                timeout = h.immunity_ms if h.immunity_ms is not None else timeout_ms
                age = now_ms - h.store_timestamp
                if 0 <= age < timeout:
                    break
            actions.append((CheckAction.CHECK, h))
        offset = h.queue_offset + 1
    return CheckPlan(actions, offset)
