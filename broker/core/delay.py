"""Delay levels, retry and dead-letter rules (pure; reference 8.4 and 8.5).

A message with DELAY=n (n > 0) is not stored in its topic but in
SCHEDULE_TOPIC_XXXX queue n-1, with REAL_TOPIC/REAL_QID remembering where it
belongs; the consume-queue tag slot of such an entry holds its delivery time
(the store computes storeTimestamp + delay(n)). The schedule service walks each
level's queue in order with a cursor (persisted as delayOffset.json) and
re-writes due messages to their real topic without DELAY.

A consumer that fails a message sends it back (CONSUMER_SEND_MSG_BACK): it
goes to %RETRY%<group> through the same delay mechanism (level 3 + number of
attempts by default), or to %DLQ%<group> once it was retried maxReconsumeTimes
(16) times or the consumer asked for it (delayLevel < 0).
"""
from __future__ import annotations

import json

from pocketmq.common.constants import SCHEDULE_TOPIC
from pocketmq.protocol.bodies import decode_delay_offset_wrapper, loads
from pocketmq.protocol.message import (DELAY, ORIGIN_MESSAGE_ID, REAL_QID, REAL_TOPIC, RETRY_TOPIC,
                              WAIT, decode_properties, encode_properties, property_value)



def delay_level(props: str) -> int:
    """The DELAY property as an int (0 when absent or not a number)."""
    v = property_value(props, DELAY) if props else None
    if not v:
        return 0
    try:
        return int(v)
    except ValueError:
        return 0


def to_schedule(topic: str, queue_id: int, props: str, level: int, levels: int) -> tuple[str, int, str]:
    """Where a delayed message is parked: (SCHEDULE_TOPIC_XXXX, level-1, properties with
    REAL_TOPIC/REAL_QID). Levels above the table are clamped to the last one."""
    level = min(level, levels)
    d = decode_properties(props)
    d[DELAY] = str(level)
    d[REAL_TOPIC] = topic
    d[REAL_QID] = str(queue_id)
    return SCHEDULE_TOPIC, level - 1, encode_properties(d)


def is_due(deliver_ms: int, now_ms: int, delay_ms: int) -> bool:
    # A delivery time further away than the whole delay can only come from a clock
    # that went back or a changed level table: deliver now rather than hold it forever.
    return deliver_ms <= now_ms or deliver_ms > now_ms + delay_ms


def real_place(props: dict) -> tuple[str, int] | None:
    """(REAL_TOPIC, REAL_QID) of a parked message (delayed here, or a transaction's half
    message); None when it does not say where it belongs."""
    topic = props.get(REAL_TOPIC)
    try:
        qid = int(props.get(REAL_QID, ""))
    except ValueError:
        return None
    if not topic or qid < 0:
        return None
    return topic, qid


def from_schedule(props: dict) -> tuple[str, int, str] | None:
    """(real topic, real queue id, properties to store) for a due message; None when the
    parked message does not say where it belongs."""
    place = real_place(props)
    if place is None:
        return None
    topic, qid = place
    d = dict(props)
    d.pop(DELAY, None)
    d[WAIT] = "false"
    return topic, qid, encode_properties(d)


def send_back_properties(props: dict, topic: str, msg_id: str, level: int) -> str:
    """Properties of a message returned by a consumer: remembers its first topic and id."""
    d = dict(props)
    d.setdefault(RETRY_TOPIC, topic)
    d.setdefault(ORIGIN_MESSAGE_ID, msg_id)
    d[WAIT] = "false"
    if level > 0:
        d[DELAY] = str(level)
    else:
        d.pop(DELAY, None)
    return encode_properties(d)


class ScheduleCursors:
    """delayOffset.json: level -> next SCHEDULE_TOPIC_XXXX queue offset to deliver."""

    def __init__(self):
        self.offsets: dict[int, int] = {}
        self.dirty = False

    def get(self, level: int) -> int:
        return self.offsets.get(level, 0)

    def advance(self, level: int, offset: int) -> None:
        if offset != self.offsets.get(level):
            self.offsets[level] = offset
            self.dirty = True

    def encode(self) -> bytes:
        return json.dumps({"offsetTable": {str(k): v for k, v in sorted(self.offsets.items())}}, indent=1).encode()

    def load(self, data: bytes) -> None:
        d = loads(data)
        self.offsets = {int(k): int(v) for k, v in ((d or {}).get("offsetTable") or {}).items()}

    def adopt(self, body) -> bool:
        """Take a whole table from another broker (a slave's GET_ALL_DELAY_OFFSET from its
        master), in memory: True, and dirty to be persisted, when it differs from ours.
        Raises BodyError for a malformed body, leaving the table as it was."""
        offsets = decode_delay_offset_wrapper(body)
        if offsets == self.offsets:
            return False
        self.offsets = offsets
        self.dirty = True
        return True
