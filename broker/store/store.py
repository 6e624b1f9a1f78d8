"""MessageStore: the file storage engine (CommitLog + ConsumeQueues + checkpoint/abort recovery).

Synchronous, no network, no clock: callers pass now_ms. Layout and formats: docs/store.md;
the record format is protocol/message.py's.

MessageStore is one class assembled from parts, one module each; its state is declared
in __init__ below (the one place), the parts' methods read and update it:

| module        | part          | owns                                                          |
|---------------|---------------|---------------------------------------------------------------|
| recovery.py   | RecoveryPart  | open (recovery), close, abandon, directory lock, abort file   |
| append.py     | AppendPart    | put_message, put, put_messages, put_batch_body                |
| dispatch.py   | DispatchPart  | reput: commit-log records -> consume-queue units, on_dispatch |
| read.py       | ReadPart      | get_message (the pull path), look_message_by_offset, bounds   |
| search.py     | SearchPart    | store timestamps, get_offset_in_queue_by_time                 |
| flush.py      | FlushPart     | flush, flush_consume_queues, the checkpoint                   |
| cleaning.py   | CleaningPart  | clean_expired_files, delete_topics                            |
| index.py      | IndexPart     | the IndexFile (query by key): catch-up, query_message         |
| replica.py    | ReplicaPart   | the HA stream's ends: replica_read (master), replica_append   |

Below them: commitlog.py (segments, record checks, recovery scan), consumequeue.py
(the per-queue index), mapped_file.py (the files), checkpoint.py, api.py (inputs,
results, shared rules; the MemoryStore reference model uses only that).

Threads: everything runs on the caller's (event-loop) thread except `flush()` and
`flush_consume_queues()`, which a flush thread may call concurrently with appends. They
only fdatasync descriptors and write the checkpoint; `_file_lock` keeps them away from
files being deleted (clean_expired_files, delete_topics, close).

Failure policy (docs/store.md "Storage faults"): the first failed fdatasync of a store
file makes the store sticky-failed (`failed` holds the reason, one CRITICAL line); puts
then answer SERVICE_NOT_AVAILABLE until a restart, whose recovery decides what survived.
A failed fsync is never retried. Failing to create or open a file (a segment, a
consume-queue file, the checkpoint's temp file, a directory to fsync) is transient: the
affected puts answer CREATE_MAPEDFILE_FAILED with nothing written, a failed checkpoint
write keeps the old one, one line per 10 s counts them, and the next put or flush
retries by itself.
"""
from __future__ import annotations

import logging
import threading
import time

from pocketmq.protocol.message import BLANK_MARKER_SIZE, host_flags, offset_msg_id_prefix
from pocketmq.broker.store.api import DispatchListener
from pocketmq.broker.store.append import AppendPart
from pocketmq.broker.store.cleaning import CleaningPart
from pocketmq.broker.store.commitlog import CommitLog
from pocketmq.broker.store.consumequeue import ConsumeQueue
from pocketmq.broker.store.dispatch import DispatchPart
from pocketmq.broker.store.flush import FlushPart
from pocketmq.broker.store.fileops import FileOps
from pocketmq.broker.store.index import IndexPart, IndexService
from pocketmq.broker.store.read import ReadPart
from pocketmq.broker.store.recovery import RecoveryPart
from pocketmq.broker.store.replica import ReplicaPart
from pocketmq.broker.store.search import SearchPart
from pocketmq.broker.store.store_config import StoreConfig

__all__ = ["MessageStore"]

log = logging.getLogger("pocketmq.store")


class MessageStore(RecoveryPart, AppendPart, DispatchPart, ReadPart, SearchPart, FlushPart, CleaningPart,
                   IndexPart, ReplicaPart):
    def __init__(self, config: StoreConfig, *, file_ops: FileOps | None = None,
                 on_dispatch: DispatchListener | None = None) -> None:
        self.config = config
        self.on_dispatch = on_dispatch
        self._ops = file_ops or FileOps(config.preallocate_files)
        # geometry and limits (from the config, fixed)
        self._delay_levels = config.delay_levels_ms
        self._file_size = config.mapped_file_size_commit_log
        self._max_record = min(config.max_message_size, self._file_size - BLANK_MARKER_SIZE)
        self._store_host = config.store_host
        self._store_alen = len(config.store_host[0])
        self._host_bits = {alen: host_flags(0, alen, self._store_alen) for alen in (4, 16)}
        self._msg_id_prefix = offset_msg_id_prefix(*config.store_host)
        self._memory_limit = config.memory_bytes() * config.access_message_in_memory_max_ratio // 100
        self._cq_root = config.consume_queue_dir
        self._cq_size = config.mapped_file_size_consume_queue
        # the files (recovery replaces them)
        self._commitlog = CommitLog(config.commit_log_dir, self._file_size, self._ops)
        self._cq_table: dict[str, dict[int, ConsumeQueue]] = {}
        self._topic_parts: dict[str, bytes] = {}     # topic -> TOPICLENGTH + TOPIC (append)
        # progress: dispatch point, store timestamps of the last put / dispatch / flush
        self._reput_from = 0
        self._last_store_ts = 0
        self._dispatched_ts = 0
        self._flushed_store_ts = 0
        self._checkpoint_dispatched = 0
        # the message index (index.py; None when disabled): records below _index_from were
        # walked; those at or below _index_done_through were already in the files at open
        self._index: IndexService | None = None
        self._index_from = 0
        self._index_done_through = -1
        self._index_flushed_ts = 0          # the checkpoint's indexMsgTimestamp
        self._index_hashers: dict = {}               # topic bytes -> index._TopicHashes (its hash memo)
        # IndexHints of the batches stored column-wise (append._put_uniform), taken by the
        # index instead of reading those records back (deque; None when the index is off)
        self._index_hints = None
        # a slave's replicated bytes waiting for the rest of their record (replica.py)
        self._replica_pending = bytearray()
        self._replica_stalled = False        # a segment for them could not be created (transient)
        # controller mode (read.py set_confirm_offset): consumers read records ending at or
        # below it only (None: all); queues a read found held back -> the offset to wake them at
        self._confirm_offset: int | None = None
        self._confirm_waiting: dict[tuple[str, int], int] = {}
        # the filtered pull's units judged ahead (read._get_matching)
        self._judged: dict = {}
        # lifecycle
        self._failed: str | None = None
        self._open = False
        self._file_lock = threading.Lock()
        self._warm_fd = -1              # the page warmer's own descriptor (flush.py warm_commit_log)
        self._warm_seg = -1
        self._lock_fd = -1
        self._dispatch_behind = False    # a consume-queue file could not be created: puts wait
        self._checkpoint_ok = False      # a checkpoint was written since open
        self._transient: dict[str, list] = {}    # what -> [failures not yet logged, last log (monotonic s)]

    def _fail(self, reason: str) -> None:
        if self._failed is None:
            self._failed = reason
            log.critical("store failed, refusing writes until restart: %s", reason)

    TRANSIENT_LOG_INTERVAL_S = 10.0

    def _note_transient(self, what: str, e: OSError) -> None:
        """A transient failure (a file not created): while it lasts every put or flush fails
        the same way, so one line per interval with the count, not one per message (which
        would fill a full disk with logs too)."""
        now = time.monotonic()
        entry = self._transient.get(what)
        if entry is None:
            entry = self._transient[what] = [0, -1e9]
        entry[0] += 1
        if now - entry[1] >= self.TRANSIENT_LOG_INTERVAL_S:
            log.error("cannot %s: %s (%d failures since the last report; retried by the next "
                      "put or flush)", what, e, entry[0])
            entry[0] = 0
            entry[1] = now

    @property
    def failed(self) -> str | None:
        """Why the store stopped accepting writes, or None."""
        return self._failed

    @property
    def is_open(self) -> bool:
        return self._open

    # ------------------------------------------------------------------ consume queues

    def _cq(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The consume queue of topic/queue_id, created when new."""
        table = self._cq_table.get(topic)
        if table is None:
            table = self._cq_table[topic] = {}
        cq = table.get(queue_id)
        if cq is None:
            cq = table[queue_id] = ConsumeQueue(topic, queue_id, self._cq_root, self._cq_size, self._ops)
        return cq

    def _find_cq(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        table = self._cq_table.get(topic)
        return table.get(queue_id) if table is not None else None

    def topics(self) -> list[str]:
        return sorted(t for t, table in self._cq_table.items() if table)

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(self._cq_table.get(topic, {}))

    @property
    def commit_log_min_offset(self) -> int:
        return self._commitlog.min_offset

    @property
    def commit_log_max_offset(self) -> int:
        return self._commitlog.max_offset
