"""ConsumeQueue: the per topic/queue index into the commit log.

Path `{root}/consumequeue/{topic}/{queueId}/{20-digit byte offset of the file's first unit}`.
Files of `mapped_file_size_consume_queue` bytes (default 300 000 units = 6 000 000 bytes).

Unit (20 bytes, big-endian), logical offset n at byte n * 20:

| offset | size | field                                                        |
|--------|------|--------------------------------------------------------------|
| 0      | 8    | commit-log offset of the record                              |
| 8      | 4    | record size (TOTALSIZE)                                      |
| 12     | 8    | tagsCode: Java hashCode of TAGS sign-extended, 0 without tags; for SCHEDULE_TOPIC_XXXX the delivery time (ms) |

A filler unit (0, 0x7FFFFFFF, 0) stands for a slot without a message (RocketMQ pre-fills the
head of a queue whose first file starts past offset 0). Readers skip fillers.

Consume queues are derived data: the dispatcher (store.reput) writes them from the commit
log and recovery rebuilds them idempotently, so they are flushed lazily. Recovery finds
each queue's end as the first all-zero unit of its last file and zeroes anything after it.
"""
from __future__ import annotations

import logging
import os
import shutil
import struct
from functools import lru_cache

from pocketmq.broker.store.api import CQ_FILLER_SIZE
from pocketmq.broker.store.mapped_file import FileOps, MappedFile, MappedFileQueue, last_nonzero
from pocketmq.common.constants import CQ_UNIT_SIZE
from pocketmq.protocol.message import RECORD_HEAD_MIN

__all__ = ["ConsumeQueue", "CQ_UNIT", "FILLER_UNIT", "EXISTS", "APPENDED", "FILLED", "unit_columns", "unit_tags",
           "sizes_plain"]

log = logging.getLogger("pocketmq.store")

CQ_UNIT = struct.Struct(">qiq")   # commit_log_offset, size, tags_code: CQ_UNIT_SIZE bytes
assert CQ_UNIT.size == CQ_UNIT_SIZE
FILLER_UNIT = CQ_UNIT.pack(0, CQ_FILLER_SIZE, 0)
_ZERO_UNIT = bytes(CQ_UNIT_SIZE)

EXISTS, APPENDED, FILLED = "EXISTS", "APPENDED", "FILLED"


# One Struct per chunk size m: the filtered pull judges at most 256 units at once
# (read._CHUNK_MAX), so each is at most ~40 KB and the caches a few MB.
@lru_cache(maxsize=128)
def _columns_struct(m: int) -> struct.Struct:
    return struct.Struct(">" + "qi8x" * m)


@lru_cache(maxsize=128)
def _tags_struct(m: int) -> struct.Struct:
    return struct.Struct(">" + "12xq" * m)


def unit_columns(buf, pos: int, m: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(commit-log offsets, sizes) of the m units at buf[pos:], from one unpack (one
    cached Struct per m, no tuple per unit, tags codes skipped): the filtered pull's reader."""
    units = _columns_struct(m).unpack_from(buf, pos)
    return units[0::2], units[1::2]


# The size field's bytes inside a unit (big-endian int at offset 8).
_SIZE_AT = 8


def sizes_plain(buf, m: int) -> bool:
    """Whether each of the first m units of buf has 0 < size < 16 MiB: no filler
    (0x7FFFFFFF), no zero unit (what a crash leaves before reput repairs it), no negative
    size. Read from the size fields' bytes, without an int per unit (the unfiltered pull
    asks it of ~1,000 units a pull): every size's high byte is 0 (a filler's is 0x7F, a
    negative one's >= 0x80), and the OR of the three low bytes is not 0 in any unit."""
    # one copy of the units, then C-level strided slices of it (a strided memoryview's
    # bytes() copies element by element: 4x slower)
    raw = bytes(buf[:m * CQ_UNIT_SIZE])
    high = raw[_SIZE_AT::CQ_UNIT_SIZE]
    if len(high) != m or high.count(0) != m:
        return False
    step = CQ_UNIT_SIZE
    low = (int.from_bytes(raw[_SIZE_AT + 1::step], "big") | int.from_bytes(raw[_SIZE_AT + 2::step], "big")
           | int.from_bytes(raw[_SIZE_AT + 3::step], "big"))
    return 0 not in low.to_bytes(m, "big")


def unit_tags(buf, pos: int, m: int) -> tuple[int, ...]:
    """The tags codes of the m units at buf[pos:], from one unpack."""
    return _tags_struct(m).unpack_from(buf, pos)


def _find_end(view, size: int, fd: int = -1, check_rest: bool = True) -> tuple[int, bool]:
    """(byte end of the valid prefix of units, whether non-zero bytes follow it). `fd`, the
    file's descriptor, lets the check that the rest is zero skip what the file system
    reports as never written (last_nonzero); `check_rest=False` (after a clean shutdown:
    every unit was flushed in order) trusts the binary search."""
    units = size // CQ_UNIT_SIZE
    lo, hi = 0, units            # first all-zero unit, assuming units are a prefix
    while lo < hi:
        mid = (lo + hi) // 2
        if view[mid * CQ_UNIT_SIZE:(mid + 1) * CQ_UNIT_SIZE] == _ZERO_UNIT:
            hi = mid
        else:
            lo = mid + 1
    end = lo * CQ_UNIT_SIZE
    if not check_rest or last_nonzero(view, fd, end, size) == end:
        # a valid unit has size > 0 (Java's rule): check the prefix ends cleanly
        k = lo
        while k > 0:
            _phys, sz, _tag = CQ_UNIT.unpack_from(view, (k - 1) * CQ_UNIT_SIZE)
            if _phys >= 0 and sz > 0:
                break
            k -= 1
        return k * CQ_UNIT_SIZE, k != lo
    # a hole: take the first invalid unit as the end, the rest is garbage
    pos = 0
    for phys, sz, _tag in CQ_UNIT.iter_unpack(view[:units * CQ_UNIT_SIZE]):
        if phys < 0 or sz <= 0:
            break
        pos += CQ_UNIT_SIZE
    return pos, True


class ConsumeQueue:
    __slots__ = ("topic", "queue_id", "directory", "queue", "file_size", "units_per_file",
                 "min_offset", "max_offset", "needs_dir_sync", "room_until")

    def __init__(self, topic: str, queue_id: int, root: str, file_size: int, ops: FileOps) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(root, topic, str(queue_id))
        self.queue = MappedFileQueue(self.directory, file_size, ops)
        self.file_size = file_size
        self.units_per_file = file_size // CQ_UNIT_SIZE
        self.min_offset = 0          # logical, first readable unit
        self.max_offset = 0          # logical, one past the last unit
        self.needs_dir_sync = False
        self.room_until = 0          # logical: units below it have a file (the last file's end)

    def _set_room(self) -> None:
        mf = self.queue.last
        self.room_until = mf.end // CQ_UNIT_SIZE if mf is not None else 0

    # ------------------------------------------------------------------ recovery

    def load(self, check_rest: bool = True) -> int:
        """Map the files and find the end. Returns the number of garbage bytes zeroed.
        `check_rest`: also check that the last file is all zeros past the end (after a
        crash: a lost page may hide later units), else trust the units' prefix."""
        self.queue.load()
        self._set_room()
        files = self.queue.files
        if not files:
            return 0
        for mf in files[:-1]:
            mf.wrote = mf.size
        last = files[-1]
        end, garbage = _find_end(last.view, last.size, last.fd, check_rest)
        zeroed = 0
        if garbage:
            zeroed = last.size - end
            last.view[end:] = bytes(zeroed)
            log.warning("consume queue %s/%d: zeroed garbage after unit %d", self.topic,
                        self.queue_id, (last.start + end) // CQ_UNIT_SIZE)
        last.wrote = end
        self.max_offset = (last.start + end) // CQ_UNIT_SIZE
        self.min_offset = files[0].start // CQ_UNIT_SIZE
        return zeroed

    def truncate_from_phys(self, phys_end: int) -> int:
        """Drop the units at the tail that point at or past commit-log offset phys_end.
        Returns how many were dropped."""
        new_max = self.max_offset
        while new_max > self.min_offset:
            u = self.unit(new_max - 1)
            if u is None or (u[0] < phys_end and u[1] != 0):     # (a zero unit: a lost page)
                break
            new_max -= 1
        dropped = self.max_offset - new_max
        if dropped:
            self._cut_to(new_max)
        return dropped

    def _cut_to(self, new_max: int) -> None:
        new_end = new_max * CQ_UNIT_SIZE
        files = self.queue.files
        deleted = False
        while len(files) > 1 and files[-1].start >= new_end:
            self.queue.delete_last()
            files = self.queue.files
            deleted = True
        self._set_room()
        mf = files[-1]
        pos = new_end - mf.start
        if pos < mf.wrote:
            mf.view[pos:mf.wrote] = bytes(mf.wrote - pos)
        mf.wrote = pos
        mf.flushed = min(mf.flushed, pos)
        # Make the cut durable now: flush() only syncs files that grew, and units left
        # behind by a lost cut would point into offsets new records reuse.
        if mf.fd >= 0:
            self.queue.ops.fdatasync(mf.fd)
        if deleted:
            self.queue.sync_dir()
        self.max_offset = new_max
        self.min_offset = min(self.min_offset, new_max)

    # ------------------------------------------------------------------ reads

    def unit(self, offset: int) -> tuple[int, int, int] | None:
        if not self.min_offset <= offset < self.max_offset:
            return None
        byte = offset * CQ_UNIT_SIZE
        mf = self.queue.find(byte)
        if mf is None:
            return None
        return CQ_UNIT.unpack_from(mf.mm, byte - mf.start)

    def index_buffer(self, offset: int):
        """memoryview of the units from `offset` to the end of the written part of the file
        holding it, or None when that file is gone."""
        if offset < self.min_offset:
            return None
        byte = offset * CQ_UNIT_SIZE
        mf = self.queue.find(byte)
        if mf is None:
            return None
        pos = byte - mf.start
        if pos >= mf.wrote:
            return None
        return mf.view[pos:mf.wrote]

    @property
    def has_files(self) -> bool:
        return bool(self.queue.files)

    def file_ranges(self) -> list[tuple[int, int]]:
        """(first logical offset, one past the last written) of each file, oldest first
        (files wholly below min_offset included: they are deleted by clean())."""
        return [(mf.start // CQ_UNIT_SIZE, (mf.start + mf.wrote) // CQ_UNIT_SIZE) for mf in self.queue.files]

    def unit_at(self, offset: int) -> tuple[int, int, int]:
        """The unit at a logical offset inside one of file_ranges() (min/max not checked)."""
        byte = offset * CQ_UNIT_SIZE
        mf = self.queue.find(byte)
        return CQ_UNIT.unpack_from(mf.mm, byte - mf.start)

    def roll_next_file(self, offset: int) -> int:
        return offset + self.units_per_file - offset % self.units_per_file

    # ------------------------------------------------------------------ writes

    def _place(self, byte: int) -> MappedFile:
        """The file that holds byte offset `byte`, creating the next one when needed."""
        mf = self.queue.last
        if mf is None:
            self.needs_dir_sync = True
            mf = self.queue.create(byte - byte % self.file_size)
        elif byte >= mf.end:
            mf = self.queue.create(mf.end)
        else:
            return mf
        self._set_room()
        return mf

    def make_room(self) -> None:
        """Create the file for the next unit (only ever when the last one is full, so a
        file never exists before the one ahead of it is full: what load() assumes).
        Raises NotOpened (transient)."""
        self._place(self.max_offset * CQ_UNIT_SIZE)

    def _write_fillers(self, count: int) -> None:
        while count > 0:
            byte = self.max_offset * CQ_UNIT_SIZE
            mf = self._place(byte)
            pos = byte - mf.start
            n = min(count, (mf.size - pos) // CQ_UNIT_SIZE)
            mf.view[pos:pos + n * CQ_UNIT_SIZE] = FILLER_UNIT * n
            mf.wrote = pos + n * CQ_UNIT_SIZE
            self.max_offset += n
            count -= n

    def put_many(self, queue_offset: int, data: bytes) -> None:
        """Append consecutive units, already packed (CQ_UNIT each), starting at queue_offset.
        One write when they all go at the end of the current file; else unit by unit."""
        mo = self.max_offset
        mf = self.queue.last
        n = len(data) // CQ_UNIT_SIZE
        if queue_offset == mo and mf is not None:
            byte = mo * CQ_UNIT_SIZE
            if mf.start <= byte and byte + len(data) <= mf.end:
                pos = byte - mf.start
                mf.mm[pos:pos + len(data)] = data
                mf.wrote = pos + len(data)
                self.max_offset = mo + n
                return
        for i, (phys, size, code) in enumerate(CQ_UNIT.iter_unpack(data)):
            self.put(queue_offset + i, phys, size, code)

    def put(self, queue_offset: int, phys: int, size: int, tags_code: int) -> str:
        """Write the unit for `queue_offset` (idempotent). Raises OSError when a file cannot
        be created. Returns APPENDED, EXISTS (already there: skipped) or FILLED (there was a
        gap before it, filled with filler units and logged as an error)."""
        mo = self.max_offset
        if queue_offset == mo:
            byte = mo * CQ_UNIT_SIZE
            mf = self.queue.last
            if mf is None or byte >= mf.end:
                mf = self._place(byte)
            pos = byte - mf.start
            CQ_UNIT.pack_into(mf.mm, pos, phys, size, tags_code)
            mf.wrote = pos + CQ_UNIT_SIZE
            self.max_offset = mo + 1
            return APPENDED
        if queue_offset < mo:
            u = self.unit(queue_offset)
            if u is not None and (u[1] == 0 or (u[0] == phys and u != (phys, size, tags_code))):
                # Only reput comes here, for records past the checkpoint's dispatch point,
                # whose units were not synced: a crash may have lost them (a zero unit
                # before later ones that reached the disk) or torn them at a sector
                # boundary (right offset, wrong size). Repair those from the commit log.
                # (A unit pointing at another record is kept: a topic deleted and created
                # again has two records per queue offset, and a rebuild keeps the first.)
                byte = queue_offset * CQ_UNIT_SIZE
                mf = self.queue.find(byte)
                CQ_UNIT.pack_into(mf.mm, byte - mf.start, phys, size, tags_code)
                mf.flushed = min(mf.flushed, byte - mf.start)
                log.warning("consume queue %s/%d unit %d was %s, record at %d claims it: repaired",
                            self.topic, self.queue_id, queue_offset, u, phys)
                return APPENDED
            if u is not None and u[0] != phys and u[1] != CQ_FILLER_SIZE:
                log.error("consume queue %s/%d unit %d points at %d, record at %d claims it",
                          self.topic, self.queue_id, queue_offset, u[0], phys)
            return EXISTS
        result = FILLED
        if mo == 0 and not self.queue.files:
            # a queue whose first file starts past 0 (its older records are gone)
            start_units = queue_offset - queue_offset % self.units_per_file
            self._place(start_units * CQ_UNIT_SIZE)
            self.max_offset = self.min_offset = start_units
            self._write_fillers(queue_offset - start_units)
            self.min_offset = queue_offset
            result = APPENDED
        else:
            # A gap. Units are written in commit-log order, so no record of this queue can be
            # missing unless there is room for it between the queue's last record and this
            # one: a gap wider than that means this record's QUEUEOFFSET is damaged (the
            # format has no header checksum), and filling it could mean 2^60 filler units.
            last = self.unit(mo - 1) if mo > self.min_offset else None
            last_end = last[0] + last[1] if last is not None and last[1] != CQ_FILLER_SIZE else 0
            if phys < last_end:
                log.error("consume queue %s/%d: record at %d (QUEUEOFFSET %d) lies before the queue's last "
                          "unit %d; not indexed again", self.topic, self.queue_id, phys, queue_offset, mo - 1)
                return EXISTS
            if queue_offset - mo > (phys - last_end) // RECORD_HEAD_MIN:
                log.error("consume queue %s/%d: record at %d has QUEUEOFFSET %d, no room for the %d units "
                          "before it; indexed as unit %d", self.topic, self.queue_id, phys, queue_offset,
                          queue_offset - mo, mo)
                return self.put(mo, phys, size, tags_code)
            log.error("consume queue %s/%d: gap, expected unit %d, record at %d has %d; filled",
                      self.topic, self.queue_id, mo, phys, queue_offset)
            self._write_fillers(queue_offset - mo)
        self.put(queue_offset, phys, size, tags_code)
        return result

    # ------------------------------------------------------------------ maintenance

    def correct_min_offset(self, cl_min: int) -> None:
        """min_offset = first unit pointing at or after commit-log offset cl_min (max when none)."""
        # real units are in commit-log order; a filler stands for the next real unit after it
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            j = self._next_real(mid, hi)
            if j == hi or self.unit(j)[0] >= cl_min:
                hi = mid
            else:
                lo = j + 1
        self.min_offset = self._next_real(lo, self.max_offset)

    def _next_real(self, offset: int, limit: int) -> int:
        """First offset in [offset, limit) holding a real (non-filler) unit, else limit."""
        while offset < limit:
            u = self.unit(offset)
            if u is not None and u[1] != CQ_FILLER_SIZE:
                return offset
            offset += 1
        return limit

    def clean(self, cl_min: int) -> int:
        """Delete the files (never the last) whose units all point below cl_min; fix min_offset."""
        files = self.queue.files
        count = 0
        for mf in files[:-1]:
            phys = CQ_UNIT.unpack_from(mf.mm, mf.size - CQ_UNIT_SIZE)[0]
            if phys >= cl_min:
                break
            count += 1
        if count:
            self.queue.delete_first(count)
            self.min_offset = max(self.min_offset, self.queue.files[0].start // CQ_UNIT_SIZE)
        self.correct_min_offset(cl_min)
        return count

    def flush(self) -> None:
        """fdatasync the files with unsynced units. Raises OSError."""
        ops = self.queue.ops
        if self.needs_dir_sync:
            root = os.path.dirname(os.path.dirname(self.directory))
            for d in (self.directory, os.path.dirname(self.directory), root):
                ops.fsync_dir(d)
            self.needs_dir_sync = False
        files = list(self.queue.files)
        for mf in files:
            wrote = mf.wrote
            if wrote > mf.flushed and mf.fd >= 0:
                ops.fdatasync(mf.fd)
                mf.flushed = wrote
        new_files = [mf for mf in files if not mf.dir_synced]
        if new_files:
            self.queue.sync_dir()
            for mf in new_files:
                mf.dir_synced = True

    def close(self) -> None:
        self.queue.close()

    def destroy(self) -> None:
        self.queue.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        parent = os.path.dirname(self.directory)
        try:
            os.rmdir(parent)     # the topic directory, when this was its last queue
        except OSError:
            pass
