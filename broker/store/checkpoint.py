"""The store checkpoint file `{root}/checkpoint` (4096 bytes, big-endian).

| offset | size | field                       | meaning                                                   |
|--------|------|-----------------------------|-----------------------------------------------------------|
| 0      | 8    | physicMsgTimestamp          | STORETIMESTAMP of the last flushed commit-log record (RocketMQ) |
| 8      | 8    | logicsMsgTimestamp          | STORETIMESTAMP of the last record whose CQ units are flushed (RocketMQ) |
| 16     | 8    | indexMsgTimestamp           | endTimestamp of the last index file when it was flushed; 0: none (RocketMQ) |
| 24     | 8    | magic "PKMQCKP1"            | marks the pocketmq fields below; absent in Java's file    |
| 32     | 8    | flushed_physical_offset     | commit log durable up to here (a record boundary)         |
| 40     | 8    | logics_physical_offset      | every consume-queue unit of records below this is durable |
| 48     | 8    | consume_queue_count         | queues that had files then; finding fewer at open means some were deleted: rebuild all |
| 56     | 4    | crc32 of bytes 0..55        | a torn or foreign file is ignored                         |
| 60     | ...  | zero                        |                                                           |

Written with write_file_atomic (tmp, fsync, rename, fsync dir), so it is old or new, never torn.
The first 24 bytes keep RocketMQ's meaning, so Java tooling reading them still works.
"""
from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from pocketmq.common.files import OS_FILES, FileLayer, read_file, write_file_atomic

__all__ = ["Checkpoint", "read_checkpoint", "write_checkpoint", "CHECKPOINT_FILE_SIZE"]

CHECKPOINT_FILE_SIZE = 4096
_MAGIC = b"PKMQCKP1"
_LAYOUT = struct.Struct(">qqq8sqqq")
_CRC = struct.Struct(">I")


class Checkpoint(NamedTuple):
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    flushed_physical_offset: int = 0
    logics_physical_offset: int = 0
    consume_queue_count: int = 0

    def encode(self) -> bytes:
        head = _LAYOUT.pack(self.physic_msg_timestamp, self.logics_msg_timestamp,
                            self.index_msg_timestamp, _MAGIC, self.flushed_physical_offset,
                            self.logics_physical_offset, self.consume_queue_count)
        head += _CRC.pack(zlib.crc32(head))
        return head + bytes(CHECKPOINT_FILE_SIZE - len(head))

    @classmethod
    def decode(cls, data: bytes) -> "Checkpoint | None":
        """None when the bytes are not a complete pocketmq checkpoint."""
        if len(data) < _LAYOUT.size + 4:
            return None
        fields = _LAYOUT.unpack_from(data, 0)
        (crc,) = _CRC.unpack_from(data, _LAYOUT.size)
        if fields[3] != _MAGIC or crc != zlib.crc32(data[:_LAYOUT.size]):
            return None
        ck = cls(fields[0], fields[1], fields[2], fields[4], fields[5], fields[6])
        if min(ck.flushed_physical_offset, ck.logics_physical_offset, ck.consume_queue_count) < 0:
            return None
        return ck


def read_checkpoint(path: str) -> Checkpoint | None:
    data = read_file(path)
    if data is None:
        return None
    return Checkpoint.decode(data)


def write_checkpoint(path: str, ck: Checkpoint, files: FileLayer = OS_FILES) -> None:
    """Raises OSError; the old checkpoint then stays (a failed write is retried by the next flush)."""
    write_file_atomic(path, ck.encode(), files)
