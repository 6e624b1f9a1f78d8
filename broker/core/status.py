"""Store outcome -> response code: the one table for each store status enum (pure).

PUT (SEND_MESSAGE*, CONSUMER_SEND_MSG_BACK, delayed delivery): every
PutMessageStatus member has (response code, remark); the remark of
MESSAGE_ILLEGAL / PROPERTIES_SIZE_EXCEEDED names the broker's body limit, so it
is a template filled by `put_status_response`.

PULL: every GetMessageStatus member has (response code, remark), the remark
being the status name as RocketMQ sends it. NO_MESSAGE_IN_QUEUE has no fixed
code: an empty queue answers PULL_NOT_FOUND to a pull from offset 0 and
PULL_OFFSET_MOVED to any other (`pull_status_response`).
"""
from __future__ import annotations

from pocketmq.broker.store.api import GetMessageStatus as G
from pocketmq.broker.store.api import PutMessageStatus as P
from pocketmq.protocol.codes import ResponseCode as C

_ILLEGAL = ("the message is illegal, maybe msg body or properties length not matched. msg body length "
            "limit {max_message_size}B, msg properties length limit 32KB.")


def _failed(status: P) -> tuple[int, str]:
    return C.SYSTEM_ERROR, f"put message failed: {status.name}"


PUT_STATUS_RESPONSE: dict[P, tuple[int, str | None]] = {
    P.PUT_OK: (C.SUCCESS, None),
    P.FLUSH_DISK_TIMEOUT: _failed(P.FLUSH_DISK_TIMEOUT),
    P.FLUSH_SLAVE_TIMEOUT: _failed(P.FLUSH_SLAVE_TIMEOUT),
    P.SLAVE_NOT_AVAILABLE: _failed(P.SLAVE_NOT_AVAILABLE),
    P.SERVICE_NOT_AVAILABLE: (
        C.SERVICE_NOT_AVAILABLE,
        "service not available now. It may be caused by one of the following reasons: the broker's disk "
        "is full, messages are put to the slave, message store has been shut down, or an fsync failed "
        "(the store refuses writes until restart)"),
    # Java's answer and remark; a transient failure (full disk, no descriptor): the next send
    # retries the creation (docs/store.md "Storage faults")
    P.CREATE_MAPEDFILE_FAILED: (C.SYSTEM_ERROR, "create mapped file failed, server is busy or broken."),
    P.MESSAGE_ILLEGAL: (C.MESSAGE_ILLEGAL, _ILLEGAL),
    P.PROPERTIES_SIZE_EXCEEDED: (C.MESSAGE_ILLEGAL, _ILLEGAL),
    P.OS_PAGECACHE_BUSY: (C.SYSTEM_BUSY, "[PC_SYNCHRONIZED]broker busy, start flow control for a while"),
    P.UNKNOWN_ERROR: _failed(P.UNKNOWN_ERROR),
}

# A put that failed with one of these can never succeed: the message itself is refused.
PUT_NEVER_STORABLE = frozenset({P.MESSAGE_ILLEGAL, P.PROPERTIES_SIZE_EXCEEDED})


def put_status_response(status: P, max_message_size: int) -> tuple[int, str | None]:
    """(response code, remark) of a put; max_message_size is the broker's body limit."""
    code, remark = PUT_STATUS_RESPONSE[status]
    if remark is _ILLEGAL:
        remark = _ILLEGAL.format(max_message_size=max_message_size)
    return code, remark


# None: decided by the requested offset (see the module docstring).
GET_STATUS_RESPONSE: dict[G, tuple[int | None, str]] = {s: (c, s.name) for s, c in (
    (G.FOUND, C.SUCCESS),
    (G.NO_MATCHED_MESSAGE, C.PULL_RETRY_IMMEDIATELY),
    (G.MESSAGE_WAS_REMOVING, C.PULL_RETRY_IMMEDIATELY),
    (G.NO_MATCHED_LOGIC_QUEUE, C.PULL_NOT_FOUND),
    (G.OFFSET_FOUND_NULL, C.PULL_NOT_FOUND),
    (G.OFFSET_OVERFLOW_BADLY, C.PULL_OFFSET_MOVED),
    (G.OFFSET_OVERFLOW_ONE, C.PULL_NOT_FOUND),
    (G.OFFSET_TOO_SMALL, C.PULL_OFFSET_MOVED),
    (G.NO_MESSAGE_IN_QUEUE, None),
)}


def pull_status_response(status: G, queue_offset: int) -> tuple[int, str]:
    """(response code, remark) of a pull from queue_offset that ended with status."""
    code, remark = GET_STATUS_RESPONSE[status]
    if code is None:
        code = C.PULL_OFFSET_MOVED if queue_offset != 0 else C.PULL_NOT_FOUND
    return code, remark
