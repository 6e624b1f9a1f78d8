"""Inputs, results, statuses and shared rules of the storage engine, used by MessageStore
(files) and MemoryStore (the test reference, which imports nothing else of the store).
Expected outcomes are status values; bugs raise.

Rules both stores apply: which topic names can be stored (valid_topic: a topic is a
directory name), the tags code of a SCHEDULE_TOPIC_XXXX unit (schedule_tags_code).
"""
from __future__ import annotations

import enum
import re
from typing import Any, Callable, NamedTuple, Protocol

from pocketmq.common.constants import CQ_FILLER_SIZE, VALID_NAME_CHARS, VALID_NAME_RE
from pocketmq.protocol.message import TOPIC_LENGTH_BYTES_MAX

__all__ = [
    "PutMessageStatus", "GetMessageStatus", "MessageToStore", "MessageBatchToStore",
    "PutMessageResult", "GetMessageResult", "RecoveryReport", "StoreError", "CleanResult",
    "DispatchListener", "MessageFilter", "RecordFilter", "CQ_FILLER_SIZE", "Store", "valid_topic",
    "valid_topic_bytes", "schedule_tags_code",
]

_TOPIC_RE = VALID_NAME_RE
_TOPIC_RE_B = re.compile(VALID_NAME_CHARS.encode())


def valid_topic(topic: str) -> bool:
    """A topic the store accepts: 1..127 bytes of [%|a-zA-Z0-9_-], not . or .. (it names
    the consume-queue directory)."""
    return (0 < len(topic) <= TOPIC_LENGTH_BYTES_MAX and _TOPIC_RE.fullmatch(topic) is not None
            and topic not in (".", ".."))


def valid_topic_bytes(topic_b: bytes) -> bool:
    """The charset part of valid_topic, on a stored record's TOPIC bytes."""
    return _TOPIC_RE_B.fullmatch(topic_b) is not None


def schedule_tags_code(queue_id: int, store_timestamp: int, delay_levels_ms: tuple[int, ...]) -> int:
    """Tags code of a SCHEDULE_TOPIC_XXXX unit: the delivery time (level = queue_id + 1)."""
    level = queue_id + 1
    if 1 <= level <= len(delay_levels_ms):
        return store_timestamp + delay_levels_ms[level - 1]
    return store_timestamp + 1000


def nearest_by_time(low: int, high: int, timestamp: int, ts_at) -> int | None:
    """RocketMQ's ConsumeQueue.getOffsetInQueueByTime binary search, over positions
    low..high of one queue file; both stores call it (each reads store times its own way).

    ts_at(pos) -> the store time of the unit there; None for a unit to step over (its record
    expired, or a filler: the search moves right of it); negative when the record cannot be
    read (the search gives up: None). Returns the position whose time equals `timestamp`,
    else the nearer of its neighbours (the right one on a tie), -1 when none was read."""
    target = left = right = -1
    left_ts = right_ts = -1
    while high >= low:
        mid = (low + high) // 2
        ts = ts_at(mid)
        if ts is None:
            low = mid + 1
            left = mid
            continue
        if ts < 0:
            return None
        if ts == timestamp:
            target = mid
            break
        if ts > timestamp:
            high = mid - 1
            right, right_ts = mid, ts
        else:
            low = mid + 1
            left, left_ts = mid, ts
    if target != -1:
        return target
    if left_ts == -1:
        return right
    if right_ts == -1:
        return left
    return right if abs(timestamp - left_ts) > abs(timestamp - right_ts) else left


class CleanResult(tuple):
    """(commit_log_segments_deleted, consume_queue_files_deleted)."""

    __slots__ = ()

    def __new__(cls, segments: int, cq_files: int):
        return tuple.__new__(cls, (segments, cq_files))

    @property
    def segments(self) -> int:
        return self[0]

    @property
    def cq_files(self) -> int:
        return self[1]

# A consume-queue unit (0, CQ_FILLER_SIZE, 0) fills slots that have no message (RocketMQ's
# pre-blank); the constant is common's, re-exported for the store's callers.


class StoreError(Exception):
    """The store cannot open: a layout it refuses to guess about (wrong segment size,
    a hole between segments, locked by another process)."""


class PutMessageStatus(enum.Enum):
    """RocketMQ's PutMessageStatus names (the broker maps them to response codes)."""

    PUT_OK = 0
    FLUSH_DISK_TIMEOUT = 1          # set by the broker shell (SYNC_FLUSH), never by the store
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3
    SERVICE_NOT_AVAILABLE = 4       # store not open, or sticky-failed after an I/O error
    CREATE_MAPEDFILE_FAILED = 5     # the next segment could not be created (nothing written)
    MESSAGE_ILLEGAL = 6             # too big, topic too long / bad characters, bad host, bad batch
    PROPERTIES_SIZE_EXCEEDED = 7    # properties > 32767 bytes
    OS_PAGECACHE_BUSY = 8
    UNKNOWN_ERROR = 9


class GetMessageStatus(enum.Enum):
    FOUND = 0
    NO_MATCHED_MESSAGE = 1
    MESSAGE_WAS_REMOVING = 2
    OFFSET_FOUND_NULL = 3
    OFFSET_OVERFLOW_BADLY = 4
    OFFSET_OVERFLOW_ONE = 5
    OFFSET_TOO_SMALL = 6
    NO_MATCHED_LOGIC_QUEUE = 7
    NO_MESSAGE_IN_QUEUE = 8


class MessageToStore(NamedTuple):
    """One message as the broker hands it to the store (MessageExtBrokerInner).

    properties_str is stored as given (the broker adds CLUSTER, removes WAIT...).
    now_ms becomes STORETIMESTAMP: the store never reads the clock.
    """

    topic: str
    queue_id: int
    flag: int
    body: bytes
    properties_str: str
    sys_flag: int
    born_timestamp: int
    born_host: tuple[bytes, int]
    now_ms: int
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


class MessageBatchToStore(NamedTuple):
    """N messages for one queue, stored as N consecutive records in one segment.
    messages: [(flag, body, properties_str)] (already merged with batch-level properties)."""

    topic: str
    queue_id: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[bytes, int]
    now_ms: int
    messages: list[tuple[int, bytes, str]]
    reconsume_times: int = 0


class PutMessageResult(NamedTuple):
    """wrote_offset: commit-log offset of the (first) record; wrote_bytes: bytes of the
    record(s); a SYNC_FLUSH shell waits for flushed_offset >= wrote_offset + wrote_bytes.
    queue_offset: (first) logical offset; msg_id: offsetMsgId(s), comma-joined for batches."""

    status: PutMessageStatus
    wrote_offset: int = 0
    wrote_bytes: int = 0
    queue_offset: int = 0
    msg_id: str = ""
    store_timestamp: int = 0
    msg_count: int = 0

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK

    @property
    def end_offset(self) -> int:
        return self.wrote_offset + self.wrote_bytes


class GetMessageResult(NamedTuple):
    """buffers: slices of the commit log (memoryviews of the segment mappings for the file
    store), physically adjacent records coalesced; b"".join(buffers) is a PULL body."""

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    message_count: int = 0
    buffers: list | tuple = ()
    buffer_total_size: int = 0


class RecoveryReport(NamedTuple):
    abnormal: bool                  # the abort file was there: the last run did not close cleanly
    records_scanned: int            # commit-log records checked during recovery
    scan_from_offset: int
    commit_log_min_offset: int
    commit_log_max_offset: int      # the write position found
    truncated_from: int             # cut point (== commit_log_max_offset); -1 when nothing was cut
    truncated_to: int               # best guess of where the cut data ended; -1 when nothing was cut
    cut_reason: str                 # why the first bad record was refused ("" when nothing was cut)
    segments_removed: int           # later segments deleted by the cut
    cq_entries_truncated: int       # consume-queue units that pointed at or past the cut
    reput_from_offset: int
    records_dispatched: int         # new consume-queue units written by the recovery reput
    queues_truncated: int = 0       # consume queues cut (units past the log's end, garbage after a hole)
    queues_redispatched: int = 0    # consume queues that got units from the recovery reput
    full_rebuild: bool = False      # every consume queue re-dispatched from the log's start
    queues_loaded: int = 0          # consume queues found on disk

    @property
    def lost_bytes(self) -> int:
        return max(0, self.truncated_to - self.truncated_from) if self.truncated_from >= 0 else 0

    def summary(self, duration_ms: float | None = None) -> str:
        """One readable line saying what recovery did (the broker logs it once at start)."""
        parts = ["abnormal shutdown (abort file found)" if self.abnormal else "clean shutdown"]
        if duration_ms is not None:
            parts.append(f"recovered in {duration_ms:.0f} ms")
        parts.append(f"commit log [{self.commit_log_min_offset}, {self.commit_log_max_offset})")
        parts.append(f"{self.records_scanned} records scanned from {self.scan_from_offset}")
        if self.truncated_from >= 0:
            parts.append(f"{self.lost_bytes} bytes truncated at {self.truncated_from} ({self.cut_reason})")
        else:
            parts.append("0 bytes truncated")
        if self.segments_removed:
            parts.append(f"{self.segments_removed} later segment(s) removed")
        parts.append(f"consume queues: {self.queues_loaded} loaded, {self.queues_truncated} truncated "
                     f"({self.cq_entries_truncated} units dropped), {self.queues_redispatched} "
                     f"{'rebuilt from the log start' if self.full_rebuild else 're-dispatched'} "
                     f"({self.records_dispatched} units from {self.reput_from_offset})")
        return "store recovery: " + ", ".join(parts)


class QueryMessageResult(NamedTuple):
    """store.query_message's answer: the matching records' commit-log offsets (newest
    first) and the index's progress (Java's QueryMessageResult)."""

    offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


# on_dispatch(topic, queue_id, next_max_offset, tags_code, store_timestamp): called after
# consume-queue units are written; a batch is announced once per distinct tags code with
# the batch's end offset (enough to wake every held pull a per-message call would wake).
DispatchListener = Callable[[str, int, int, int, int], None]
# message_filter(tags_code) -> keep?
MessageFilter = Callable[[int], bool]
# record_filter(buffer, position) -> keep? Called with the stored record at buffer[position:]
# after the tags-code check, before the record is taken (the SQL92 filter reads its
# properties there); a record it refuses counts as scanned, like a tag mismatch.
RecordFilter = Callable[[Any, int], bool]


class Store(Protocol):
    """The public API shared by MessageStore (files) and MemoryStore (reference)."""

    on_dispatch: DispatchListener | None

    def open(self) -> RecoveryReport: ...
    def close(self) -> None: ...
    def abandon(self) -> None: ...
    def put_message(self, msg: MessageToStore) -> PutMessageResult: ...
    def put(self, topic: str, queue_id: int, flag: int, body: bytes, props_b: bytes, sys_flag: int,
            born_timestamp: int, born_host: tuple[bytes, int], now: int, reconsume_times: int = 0,
            prepared_transaction_offset: int = 0) -> PutMessageResult:
        """put_message with the fields as arguments and the properties as UTF-8 bytes."""
    def put_messages(self, batch: MessageBatchToStore) -> PutMessageResult: ...
    def put_batch_body(self, topic: str, queue_id: int, sys_flag: int, born_timestamp: int,
                       born_host: tuple[bytes, int], now: int, body, append_properties: bytes = b"",
                       reconsume_times: int = 0, body_bytes_max: int | None = None) -> PutMessageResult:
        """put_messages of a SEND_BATCH_MESSAGE body; ValueError when it is malformed."""
    def reput(self) -> int: ...

    def catch_up_dispatch(self) -> bool: ...
    def get_message(self, topic: str, queue_id: int, offset: int, max_msg_nums: int,
                    message_filter: MessageFilter | None = None,
                    record_filter: RecordFilter | None = None) -> GetMessageResult: ...
    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int: ...
    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int: ...
    def get_earliest_message_time(self, topic: str, queue_id: int) -> int: ...
    def get_message_store_timestamp(self, topic: str, queue_id: int, offset: int) -> int: ...
    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int: ...
    def look_message_by_offset(self, commit_log_offset: int) -> bytes | None: ...
    def query_message(self, topic: str, key: str, max_num: int, begin_ms: int,
                      end_ms: int) -> QueryMessageResult: ...
    def check_in_disk_by_consume_offset(self, topic: str, queue_id: int, offset: int) -> bool: ...
    def delete_topics(self, topics) -> int: ...
    def clean_expired_files(self, now_ms: int, force: bool = False) -> tuple[int, int]: ...
    def clean_expired_consume_queues(self) -> int: ...
    def flush(self) -> int: ...
    def flush_consume_queues(self) -> int: ...
    def set_warm_waker(self, wake) -> None:
        """`wake()` runs when the writer reaches the commit-log pages last warmed ahead of it."""
    def warm_commit_log(self, ahead: int, buf) -> int:
        """Read the next commit-log pages past the write position into the page cache (a
        warmer thread); the bytes warmed, 0 when `ahead` bytes past it are warm."""
    def end_warming(self) -> None:
        """The warmer thread's last call (closes what warm_commit_log opened)."""
    def index_backlog_bytes(self) -> int:
        """Commit-log bytes dispatched but not yet in the message index (0: none or no index)."""
    def index_some(self, max_records: int) -> int:
        """Index at most max_records of that backlog now; the number of records walked."""
    def topics(self) -> list[str]: ...
    def queue_ids(self, topic: str) -> list[int]: ...

    @property
    def commit_log_min_offset(self) -> int: ...
    @property
    def commit_log_max_offset(self) -> int: ...
    @property
    def flushed_offset(self) -> int: ...
    @property
    def reput_from_offset(self) -> int: ...
    @property
    def is_open(self) -> bool: ...
