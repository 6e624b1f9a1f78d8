"""StoreConfig: the storage engine's settings (snake_case; the broker maps its camelCase
MessageStoreConfig keys onto these fields)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from pocketmq.common.constants import CQ_UNIT_SIZE, DEFAULT_MESSAGE_DELAY_LEVEL, parse_delay_levels
from pocketmq.protocol.message import PORT_MAX

__all__ = ["StoreConfig", "ASYNC_FLUSH", "SYNC_FLUSH"]

ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"


def total_physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


@dataclass(frozen=True)
class StoreConfig:
    store_path_root_dir: str
    store_path_commit_log: str | None = None            # default {root}/commitlog
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * CQ_UNIT_SIZE
    flush_disk_type: str = ASYNC_FLUSH                   # the broker shell implements the modes
    max_message_size: int = 4 * 1024 * 1024              # whole encoded record, like Java's store
    file_reserved_time_hours: int = 72
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    max_transfer_count_on_message_in_disk: int = 8
    access_message_in_memory_max_ratio: int = 40         # percent of RAM
    total_physical_memory_bytes: int = 0                 # 0: ask the OS once at construction
    store_host: tuple[bytes, int] = (b"\x7f\x00\x00\x01", 10911)  # STOREHOST of every record
    cluster_name: str = "DefaultCluster"                 # used by the broker, not the store
    preallocate_files: bool = True                       # posix_fallocate new segments (ENOSPC early)
    recover_segments_without_checkpoint: int = 3         # last N segments scanned when no checkpoint
    checkpoint_interval_bytes: int = 64 * 1024 * 1024    # flush() also checkpoints after this much dispatch
    # the IndexFile (index.py): query by key. Off unless asked for here (the broker passes
    # messageIndexEnable, true by default like Java's), so an embedded store or a test does
    # not get a 420 MB sparse file it did not ask for.
    message_index_enable: bool = False
    max_hash_slot_num: int = 5_000_000                   # index slots per file (Java's maxHashSlotNum)
    max_index_num: int = 5_000_000 * 4                   # index entries per file (Java's maxIndexNum)
    max_msgs_num_batch: int = 64                         # most offsets one query answers (Java's maxMsgsNumBatch)
    index_build_batch: int = 20_000                      # records indexed per flush_consume_queues / query; 0: all

    def __post_init__(self) -> None:
        if self.mapped_file_size_consume_queue <= 0 or self.mapped_file_size_consume_queue % CQ_UNIT_SIZE:
            raise ValueError("mapped_file_size_consume_queue must be a positive multiple of 20")
        if self.mapped_file_size_commit_log < 256:
            raise ValueError("mapped_file_size_commit_log is too small")
        if self.flush_disk_type not in (ASYNC_FLUSH, SYNC_FLUSH):
            raise ValueError(f"flush_disk_type must be {ASYNC_FLUSH} or {SYNC_FLUSH}")
        if len(self.store_host[0]) not in (4, 16) or not 0 <= self.store_host[1] <= PORT_MAX:
            raise ValueError("store_host must be (4 or 16 address bytes, port)")
        parse_delay_levels(self.message_delay_level)
        if self.max_hash_slot_num <= 0 or self.max_index_num <= 1 or self.max_msgs_num_batch <= 0:
            raise ValueError("maxHashSlotNum and maxMsgsNumBatch must be > 0, maxIndexNum > 1")
        if self.index_build_batch < 0:
            raise ValueError("index_build_batch must be >= 0")

    @property
    def commit_log_dir(self) -> str:
        return self.store_path_commit_log or os.path.join(self.store_path_root_dir, "commitlog")

    @property
    def consume_queue_dir(self) -> str:
        return os.path.join(self.store_path_root_dir, "consumequeue")

    @property
    def index_dir(self) -> str:
        return os.path.join(self.store_path_root_dir, "index")

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "checkpoint")

    @property
    def abort_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "abort")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "lock")

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        return parse_delay_levels(self.message_delay_level)

    def memory_bytes(self) -> int:
        return self.total_physical_memory_bytes or total_physical_memory_bytes()
