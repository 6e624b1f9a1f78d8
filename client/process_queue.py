"""ProcessQueue: the client-side snapshot of one assigned queue (pure, no asyncio).

Pulled messages wait here, keyed by queue offset in a SortedDict, until the
listener has finished with them. The commit point of the queue is derived
from what is still in flight:

* the smallest offset still in the tree (that message is not done yet, so the
  broker must hand it out again if we die), or
* when the tree is empty (everything pulled is done): the offset the next
  pull starts from (`pull_offset`, set by the pull loop; it also covers
  messages the tag filter skipped), or `queue_offset_max + 1` if unknown.

Flow control (Java DefaultMQPushConsumer defaults) is a pure decision taken
before each pull: more than `pull_threshold_for_queue` cached messages, more
than `pull_threshold_size_for_queue_bytes` cached body bytes, or (concurrent
mode) a span between the smallest and largest cached offsets above
`consume_concurrently_max_span` delays the next pull by 50 ms.

Times are integer milliseconds passed in by the caller (no clock reads here).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from sortedcontainers import SortedDict

PULL_THRESHOLD_FOR_QUEUE = 1000
PULL_THRESHOLD_SIZE_FOR_QUEUE_BYTES = 100 * 1024 * 1024
CONSUME_CONCURRENTLY_MAX_SPAN = 2000
FLOW_CONTROL_DELAY_MS = 50


class FlowControl(Enum):
    COUNT = "cached message count above pullThresholdForQueue"
    SIZE = "cached message size above pullThresholdSizeForQueue"
    SPAN = "offset span above consumeConcurrentlyMaxSpan"


@dataclass(frozen=True, slots=True)
class FlowLimits:
    pull_threshold_for_queue: int = PULL_THRESHOLD_FOR_QUEUE
    pull_threshold_size_for_queue_bytes: int = PULL_THRESHOLD_SIZE_FOR_QUEUE_BYTES
    consume_concurrently_max_span: int = CONSUME_CONCURRENTLY_MAX_SPAN

    def __post_init__(self):
        if not 1 <= self.pull_threshold_for_queue <= 65535:
            raise ValueError("pull_threshold_for_queue must be in [1, 65535]")
        if not 1 <= self.pull_threshold_size_for_queue_bytes <= 1024 * 1024 * 1024:
            raise ValueError("pull_threshold_size_for_queue_bytes must be in [1, 1 GiB]")
        if not 1 <= self.consume_concurrently_max_span <= 65535:
            raise ValueError("consume_concurrently_max_span must be in [1, 65535]")


def _body_len(msg) -> int:
    body = getattr(msg, "body", None)
    return len(body) if body is not None else 0


class ProcessQueue:
    """Messages of one queue between pull and listener completion.

    `msg` objects need `queue_offset` and `body` attributes.
    """

    __slots__ = (
        "consumed_total",
        "dropped",
        "in_flight",
        "last_consume_ms",
        "last_pull_ms",
        "msg_count",
        "msg_size_bytes",
        "msgs",
        "pull_offset",
        "queue_offset_max",
    )

    def __init__(self, now_ms: int = 0):
        self.msgs: SortedDict = SortedDict()
        self.msg_count = 0
        self.msg_size_bytes = 0
        self.queue_offset_max = -1       # largest offset ever put
        self.pull_offset = -1            # where the next pull starts (-1: not known)
        self.dropped = False
        self.last_pull_ms = now_ms
        self.last_consume_ms = now_ms
        self.in_flight = 0               # listener calls running for this queue
        self.consumed_total = 0

    # -- pull side ---------------------------------------------------------------------
    def put_messages(self, msgs, now_ms: int = 0) -> int:
        """Add pulled messages (duplicates by offset are ignored). Returns how many were new."""
        added = 0
        tree = self.msgs
        for m in msgs:
            off = m.queue_offset
            if off in tree:
                continue
            tree[off] = m
            added += 1
            self.msg_size_bytes += _body_len(m)
            self.queue_offset_max = max(self.queue_offset_max, off)
        self.msg_count += added
        self.last_pull_ms = now_ms
        return added

    # -- consume side --------------------------------------------------------------------
    def remove_messages(self, msgs, now_ms: int = 0) -> int:
        """Forget messages the listener is done with; return the new commit point.

        -1 when the tree was already empty (nothing to commit), like Java's
        ProcessQueue.removeMessage.
        """
        tree = self.msgs
        if not tree:
            return -1
        self.last_consume_ms = now_ms
        for m in msgs:
            old = tree.pop(m.queue_offset, None)
            if old is not None:
                self.msg_count -= 1
                self.msg_size_bytes -= _body_len(old)
                self.consumed_total += 1
        return self.commit_offset()

    def commit_offset(self) -> int:
        """Next offset to consume as far as this queue knows: smallest in-flight
        offset; when nothing is in flight the next pull offset, else max+1;
        -1 if nothing is known."""
        if self.msgs:
            return self.msgs.keys()[0]
        if self.pull_offset >= 0:
            return self.pull_offset
        return self.queue_offset_max + 1 if self.queue_offset_max >= 0 else -1

    @property
    def max_span(self) -> int:
        if not self.msgs:
            return 0
        keys = self.msgs.keys()
        return keys[-1] - keys[0]

    def clear(self) -> None:
        self.msgs.clear()
        self.msg_count = 0
        self.msg_size_bytes = 0

    def flow_control(self, limits: FlowLimits, orderly: bool = False) -> FlowControl | None:
        """None if the next pull may go now, else why it must wait FLOW_CONTROL_DELAY_MS."""
        if self.msg_count > limits.pull_threshold_for_queue:
            return FlowControl.COUNT
        if self.msg_size_bytes > limits.pull_threshold_size_for_queue_bytes:
            return FlowControl.SIZE
        if not orderly and self.max_span > limits.consume_concurrently_max_span:
            return FlowControl.SPAN
        return None

    @property
    def idle(self) -> bool:
        return self.in_flight == 0

    def __repr__(self) -> str:
        return (f"ProcessQueue(count={self.msg_count}, size={self.msg_size_bytes}B, "
                f"span={self.max_span}, max={self.queue_offset_max}, dropped={self.dropped})")
