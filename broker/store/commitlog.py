"""CommitLog: the one append-only log of every message of every topic — the store's truth.

Directory `{root}/commitlog/` of fixed-size segments named by their start offset
(20 zero-padded digits). Records (protocol/message.py layout) are laid back to back;
physical offset = segment start + position. A record never spans two segments:

| situation                                 | what is written at the current position         |
|-------------------------------------------|-------------------------------------------------|
| record + 8 fits in the rest of the segment| the record                                      |
| otherwise                                 | [int remaining][int BLANK_MAGIC_CODE], then the record at the start of the next segment |
| never written                             | zeros (files are preallocated)                  |

So after any record at least 8 bytes remain for a blank marker.

Recovery checks each record fully (`check_record`): TOTALSIZE within the segment and
leaving room for a marker, MAGICCODE, PHYSICALOFFSET equal to the record's position,
lengths adding up to TOTALSIZE, topic 1..127 bytes of [%|a-zA-Z0-9_-], properties UTF-8,
non-negative ids/offsets/timestamps, ports in range, BODYCRC, and a non-zero last byte when
there are properties (the store appends a \x02 to a properties string ending in NUL, which
parsers ignore, so a record that ends in 0 was torn: a zero-filled tail is always caught,
body and topic by BODYCRC and the topic charset, properties by this rule). It cuts at the first bad
record: zeroes the rest of that segment, deletes the later segments, reports the range.
The RocketMQ format only checksums the body: a flipped bit in FLAG, timestamps, hosts,
RECONSUMETIMES or QUEUEID (when still plausible) cannot be detected.
"""
from __future__ import annotations

import logging
import os
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

from pocketmq.broker.store.api import schedule_tags_code, valid_topic_bytes
from pocketmq.broker.store.mapped_file import FileOps, MappedFileQueue, last_nonzero
from pocketmq.common.constants import SCHEDULE_TOPIC
from pocketmq.protocol.message import (
    BLANK_MAGIC_CODE,
    BLANK_MARKER_SIZE,
    MESSAGE_MAGIC_CODE,
    PORT_MAX,
    PROPERTIES_LENGTH_BYTES_MAX,
    RECORD_HEAD_MIN,
    TOPIC_LENGTH_BYTES_MAX,
    head_struct_at,
    pack_blank_marker,
    record_struct,
    sys_flag_at,
    tags_code_of_properties,
    tags_codes_of_properties,
    unpack_size_magic,
)
from pocketmq.protocol.message import body_crc as _body_crc

__all__ = ["CommitLog", "DispatchRequest", "UniformRun", "check_record", "check_uniform_run", "RECORD", "BLANK",
           "END", "CORRUPT", "BLANK_MARKER_SIZE"]

log = logging.getLogger("pocketmq.store")

RECORD, BLANK, END, CORRUPT = "RECORD", "BLANK", "END", "CORRUPT"
# BLANK_MARKER_SIZE: protocol.message's (the filler's layout), re-exported for the store
_ZERO_CHUNK = bytes(1 << 20)
_TOPICS: dict[bytes, str] = {}      # topic bytes already checked -> str


class DispatchRequest(NamedTuple):
    """What the reput dispatcher needs from one record."""

    topic: str
    queue_id: int
    commit_log_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    sys_flag: int


def check_record(view, pos: int, file_size: int, phys: int, delay_levels_ms: tuple[int, ...],
                 full: bool = True, dispatch: bool = True) -> tuple[str, int, "DispatchRequest | str | None"]:
    """Classify the bytes at `pos` of a segment mapping.

    Returns (RECORD, size, DispatchRequest or None) | (BLANK, remaining, None) | (END, 0, None)
    | (CORRUPT, 0, reason). `full` adds the BODYCRC, topic charset, last-byte and UTF-8
    checks; `dispatch` builds the DispatchRequest (tags code included).
    """
    remaining = file_size - pos
    if remaining < BLANK_MARKER_SIZE:
        return CORRUPT, 0, f"only {remaining} bytes left in the segment"
    total, magic = unpack_size_magic(view, pos)
    if magic != MESSAGE_MAGIC_CODE:
        if magic == BLANK_MAGIC_CODE:
            if total != remaining:
                return CORRUPT, 0, f"blank marker says {total} bytes, {remaining} remain"
            return BLANK, remaining, None
        if total == 0 and magic == 0:
            return END, 0, None
        return CORRUPT, 0, f"bad magic code {magic & 0xFFFFFFFF:#010x}"
    if total < RECORD_HEAD_MIN or total > remaining - BLANK_MARKER_SIZE:
        return CORRUPT, 0, f"record size {total} out of bounds ({remaining} bytes left)"
    head = head_struct_at(view, pos)
    hs = head.size
    if total < hs + 4:
        return CORRUPT, 0, f"record size {total} below the fixed overhead"
    (_t, _m, crc, queue_id, _flag, queue_offset, physical_offset, sys_flag, born_ts, _ba,
     born_port, store_ts, _sa, store_port, reconsume, prepared, bl) = head.unpack_from(view, pos)
    if physical_offset != phys:
        return CORRUPT, 0, f"PHYSICALOFFSET {physical_offset} != position {phys}"
    if bl < 0 or hs + bl + 3 > total:
        return CORRUPT, 0, f"body length {bl} does not fit"
    p = pos + hs + bl
    tl = view[p]
    if tl == 0 or tl > TOPIC_LENGTH_BYTES_MAX or hs + bl + 3 + tl > total:
        return CORRUPT, 0, f"topic length {tl} invalid"
    pp = p + 3 + tl
    pl = (view[pp - 2] << 8) | view[pp - 1]
    if pl > PROPERTIES_LENGTH_BYTES_MAX or pp + pl != pos + total:
        return CORRUPT, 0, f"properties length {pl} does not match record size {total}"
    if (queue_id < 0 or queue_offset < 0 or born_ts < 0 or store_ts < 0 or reconsume < 0
            or prepared < 0 or not 0 <= born_port <= PORT_MAX or not 0 <= store_port <= PORT_MAX):
        return CORRUPT, 0, "implausible header field"
    topic_b = bytes(view[p + 1:p + 1 + tl])
    topic = _TOPICS.get(topic_b)
    if topic is None:
        if valid_topic_bytes(topic_b):
            topic = topic_b.decode("ascii")
            if len(_TOPICS) >= 10_000:
                _TOPICS.clear()
            _TOPICS[topic_b] = topic
        elif full:
            return CORRUPT, 0, "topic has characters outside [%|a-zA-Z0-9_-]"
        else:
            topic = topic_b.decode("utf-8", "replace")      # the dispatcher refuses it
    if full:
        if _body_crc(view[pos + hs:p]) != crc:
            return CORRUPT, 0, "BODYCRC mismatch"
        if pl:
            if view[pp + pl - 1] == 0:
                # the store never writes properties ending in NUL (it appends a \x02), so a
                # zero last byte is a torn write that lost the record's tail
                return CORRUPT, 0, "record ends in a zero byte (torn write)"
            try:
                str(view[pp:pp + pl], "utf-8")
            except UnicodeDecodeError:
                return CORRUPT, 0, "properties not UTF-8"
    if not dispatch:
        return RECORD, total, None
    if topic == SCHEDULE_TOPIC:
        code = schedule_tags_code(queue_id, store_ts, delay_levels_ms)
    else:
        code = tags_code_of_properties(bytes(view[pp:pp + pl]))
    return RECORD, total, DispatchRequest(topic, queue_id, phys, total, code, store_ts,
                                          queue_offset, sys_flag)


_LAST_BYTE = itemgetter(-1)
_PORTS_OK = range(PORT_MAX + 1)


class UniformRun(NamedTuple):
    """What check_uniform_run found: `count` records checked, their DispatchRequests and
    properties as stored; `one_queue` when they are consecutive units of one queue (one
    topic, queue id and sys flag, queue offsets counting up by one)."""
    requests: list
    properties: tuple
    count: int
    one_queue: bool


def _agree(col, value, k: int) -> int:
    """How many of the first k values of `col` equal `value` before the first that does not."""
    head = col[:k] if k < len(col) else col
    if head.count(value) == k:
        return k
    return list(map(value.__ne__, head)).index(True)


def check_uniform_run(view, pos: int, size: int, m: int, phys: int,
                      delay_levels_ms: tuple[int, ...]) -> UniformRun | None:
    """check_record(full=True) of records of `size` bytes laid back to back at view[pos:]
    (phys: the first one's offset; at most `m`, which the caller has checked lie in one
    segment with room for a marker after them), as many as share the first one's layout
    (TOTALSIZE, magic code, host sizes, body, topic and properties lengths) in a row, read
    column by column (record_struct's iter_unpack) instead of a record at a time. None when
    fewer than two do, or any check of them fails: the caller then checks one record at a
    time, which names a bad one. Pinned to check_record by tests/unit/test_store_replica.py."""
    if m < 2:
        return None
    bits = (sys_flag_at(view, pos) >> 4) & 3
    hs = head_struct_at(view, pos).size
    if size < hs + 3:
        return None
    bl = int.from_bytes(view[pos + hs - 4:pos + hs], "big", signed=True)
    if bl < 0 or hs + bl + 3 > size:
        return None
    tl = view[pos + hs + bl]
    pl = size - hs - bl - 3 - tl
    if not 0 < tl <= TOPIC_LENGTH_BYTES_MAX or not 0 <= pl <= PROPERTIES_LENGTH_BYTES_MAX:
        return None
    st = record_struct(bits, bl, tl, pl)
    if st.size != size:
        return None
    cols = list(zip(*st.iter_unpack(view[pos:pos + m * size])))
    # the records past the first of another layout are not this Struct's: cut there
    k = m
    for i, value in ((0, size), (1, MESSAGE_MAGIC_CODE), (16, bl), (18, tl), (20, pl)):
        k = _agree(cols[i], value, k)
    k = min(k, _agree(list(map(_host_bits, cols[7])), bits, k))
    if k < 2:
        return None
    if k < m:
        cols = [c[:k] for c in cols]
    (_totals, _magics, crcs, qids, _flags, qoffs, physs, sys_flags, borns, _bh, born_ports, stores, _sh,
     store_ports, reconsumes, prepareds, _bls, bodies, _tls, topics, _pls, props) = cols
    if (list(physs) != list(range(phys, phys + k * size, size))
            or min(qids) < 0 or min(qoffs) < 0 or min(borns) < 0 or min(stores) < 0 or min(reconsumes) < 0
            or min(prepareds) < 0 or not (min(born_ports) in _PORTS_OK and max(born_ports) in _PORTS_OK)
            or not (min(store_ports) in _PORTS_OK and max(store_ports) in _PORTS_OK)):
        return None
    names = {}
    for topic_b in set(topics):
        topic = _TOPICS.get(topic_b)
        if topic is None:
            if not valid_topic_bytes(topic_b):
                return None
            topic = topic_b.decode("ascii")
            if len(_TOPICS) >= 10_000:
                _TOPICS.clear()
            _TOPICS[topic_b] = topic
        names[topic_b] = topic
    if list(map(_body_crc, bodies)) != list(crcs):
        return None
    if pl:
        if 0 in bytes(map(_LAST_BYTE, props)):
            return None
        try:
            str(b"\x02".join(props), "utf-8")     # valid joined <=> each valid: \x02 is ASCII
        except UnicodeDecodeError:
            return None
    if len(names) == 1:
        topic = next(iter(names.values()))
        topic_names = [topic] * k
    else:
        topic = None
        topic_names = list(map(names.__getitem__, topics))
    if SCHEDULE_TOPIC in names.values():
        codes = [schedule_tags_code(q, ts, delay_levels_ms) if t == SCHEDULE_TOPIC else tags_code_of_properties(pr)
                 for t, q, ts, pr in zip(topic_names, qids, stores, props)]
    else:
        codes = tags_codes_of_properties(props)
    one_queue = (topic is not None and qids.count(qids[0]) == k and sys_flags.count(sys_flags[0]) == k
                 and list(qoffs) == list(range(qoffs[0], qoffs[0] + k)))
    reqs = list(map(DispatchRequest, topic_names, qids, physs, repeat(size), codes, stores, qoffs, sys_flags))
    return UniformRun(reqs, props, k, one_queue)


def _host_bits(sys_flag: int) -> int:
    return (sys_flag >> 4) & 3


def _zero(view, start: int, end: int) -> None:
    step = len(_ZERO_CHUNK)
    while start < end:
        n = min(step, end - start)
        view[start:start + n] = _ZERO_CHUNK[:n]
        start += n


class RecoveryOutcome(NamedTuple):
    records_scanned: int
    scan_from_offset: int
    truncated_from: int
    truncated_to: int
    reason: str
    segments_removed: int


def warm_span(wrote: int, warmed: int, seg_start: int, seg_end: int, ahead: int) -> tuple[int, int]:
    """The bytes of the active segment [seg_start, seg_end) to read into the page cache so
    that the `ahead` bytes past the write position `wrote` are there (commit-log offsets):
    (start, end), start == end when `warmed` (where the last warming ended) covers them.
    A `warmed` outside the segment (it rolled, or a truncation moved the log back) counts
    from the write position. Warming stops at the segment's end: the next segment does
    not exist before the roll."""
    if not seg_start <= warmed <= seg_end:
        warmed = wrote
    start = max(warmed, wrote, seg_start)
    end = min(wrote + ahead, seg_end)
    return (start, end) if start < end else (start, start)


class CommitLog:
    def __init__(self, directory: str, file_size: int, ops: FileOps) -> None:
        self.queue = MappedFileQueue(directory, file_size, ops)
        self.file_size = file_size
        self.wrote_offset = 0        # end of the last complete record (global)
        self.flushed_offset = 0      # durable up to here
        # Page warming (services/warm.py): once the write position reaches warm_mark,
        # on_warm_mark() (the warmer's wake-up, set by the shell) runs; the warmer then reads
        # the next pages into the page cache from its own thread (warm_step).
        self.warm_mark = 1 << 62
        self.on_warm_mark = None
        self._warmed = 0             # commit-log offset the last warm_step read up to

    # ------------------------------------------------------------------ geometry

    @property
    def min_offset(self) -> int:
        first = self.queue.first
        return first.start if first is not None else self.wrote_offset

    @property
    def max_offset(self) -> int:
        return self.wrote_offset

    def load(self) -> None:
        self.queue.load()

    # ------------------------------------------------------------------ append

    def room(self) -> int:
        """Bytes of records that can still go into the active segment without rolling to
        the next one (-1 when there is no segment yet)."""
        mf = self.queue.last
        if mf is None:
            return -1
        return mf.size - mf.wrote - BLANK_MARKER_SIZE

    def reserve(self, size: int) -> int:
        """Make room for `size` bytes in one segment (rolling with a blank marker when
        needed); returns the commit-log offset where they go, written by append_reserved.
        Raises OSError when the next segment cannot be created: then nothing has been written."""
        mf = self.queue.last
        if mf is None:
            return self.queue.create(self.wrote_offset - self.wrote_offset % self.file_size).start
        pos = mf.wrote
        remaining = mf.size - pos
        if size + BLANK_MARKER_SIZE <= remaining:
            return mf.start + pos
        nxt = self.queue.create(mf.end)
        if remaining >= BLANK_MARKER_SIZE:
            pack_blank_marker(mf.mm, pos, remaining)
        mf.wrote = mf.size
        self.wrote_offset = nxt.start
        return nxt.start

    def append_reserved(self, data) -> None:
        """Write records (bytes) at the offset the last reserve(len(data)) returned, and
        make them part of the log."""
        mf = self.queue.files[-1]
        pos = mf.wrote
        end = pos + len(data)
        mf.mm[pos:end] = data
        mf.wrote = end
        self.wrote_offset = mf.start + end
        if self.wrote_offset >= self.warm_mark:
            self.warm_mark = 1 << 62        # once until the warmer sets the next mark
            if self.on_warm_mark is not None:
                self.on_warm_mark()

    def write_ahead(self, phys: int, data) -> None:
        """Write `data` at `phys`, at or past the write position inside the active segment,
        without making it part of the log (the write position does not move; readers never
        look past it): a slave's replicated bytes, checked in place before they count. A
        system call, not a copy into the mapping: the pages a large write touches for the
        first time would each cost a page fault (FileOps.pwrite)."""
        mf = self.queue.files[-1]
        pos = phys - mf.start
        if pos < mf.wrote or pos + len(data) > mf.size:
            raise ValueError(f"write of {len(data)} bytes at {phys} outside the active segment's free part")
        self.queue.ops.pwrite(mf.fd, data, pos)

    def warm_step(self, ahead: int, max_bytes: int):
        """From the warmer's thread: (fd, segment start, position, length) of the active
        segment's next bytes to read into the page cache (at most max_bytes), or None when
        the `ahead` bytes past the write position are warm; then the next mark is set at
        half the distance, so the writer wakes the warmer again before it reaches cold
        pages (services/warm.py says why). Called under the store's file lock; reads the
        write position the event loop moves (an int: whatever value it reads, the span
        stays inside the segment)."""
        files = self.queue.files
        if ahead <= 0:
            return None
        if not files:
            self.warm_mark = 0               # the first append creates one: wake then
            return None
        mf = files[-1]
        wrote = self.wrote_offset
        seg_end = mf.start + mf.size
        start, end = warm_span(wrote, self._warmed, mf.start, seg_end, ahead)
        if start >= end:
            self._warmed = start
            # warm to the segment's end: the next wake is the roll's first append
            self.warm_mark = max(start - ahead // 2, wrote + 1) if start < seg_end else seg_end
            return None
        end = min(end, start + max_bytes)
        self._warmed = end
        return mf.fd, mf.start, start - mf.start, end - start

    # ------------------------------------------------------------------ read

    def read(self, phys: int, size: int):
        """memoryview of [phys, phys+size) when it lies in one segment's written part."""
        mf = self.queue.find(phys)
        if mf is None:
            return None
        pos = phys - mf.start
        if pos < 0 or size < 0 or pos + size > mf.wrote:
            return None
        return mf.view[pos:pos + size]

    def readable_view(self, phys: int, size: int):
        """(memoryview of the whole segment holding [phys, phys+size) in its written part,
        the segment's start offset, the offset where its written part ends), or None
        (deleted, or not written yet). For readers that walk records and coalesce those
        lying back to back (the pull path): later records inside [start, written end) are
        in the same view at phys - start, valid until the next append or deletion."""
        files = self.queue.files
        if not files:
            return None
        first = files[0].start
        idx = (phys - first) // self.file_size
        if phys < first or idx >= len(files):
            return None
        mf = files[idx]
        if phys - mf.start + size > mf.wrote:
            return None
        return mf.view, mf.start, mf.start + mf.wrote

    def record_size_at(self, phys: int) -> int:
        """TOTALSIZE of the record at phys, or -1 when there is no record there."""
        mf = self.queue.find(phys)
        if mf is None:
            return -1
        pos = phys - mf.start
        if pos < 0 or pos + RECORD_HEAD_MIN > mf.wrote:
            return -1
        total, magic = unpack_size_magic(mf.mm, pos)
        if magic != MESSAGE_MAGIC_CODE or total <= 0 or pos + total > mf.wrote:
            return -1
        return total

    # ------------------------------------------------------------------ flush

    def flush(self) -> int:
        """fdatasync every segment holding bytes below the current write position that are
        not yet durable; returns the new flushed offset. Raises OSError (the caller makes
        the store sticky-failed: a failed fsync is never retried), NotOpened when the
        directory could not be opened for its fsync (transient: nothing moved)."""
        target = self.wrote_offset
        if target <= self.flushed_offset:
            return self.flushed_offset
        ops = self.queue.ops
        files = list(self.queue.files)       # after reading target: holds every byte below it
        for mf in files:
            if mf.end <= self.flushed_offset or mf.start >= target or mf.fd < 0:
                continue
            ops.fdatasync(mf.fd)
        new_files = [mf for mf in files if not mf.dir_synced]
        if new_files:
            self.queue.sync_dir()       # NotOpened (transient): flushed_offset stays, retried next time
            for mf in new_files:
                mf.dir_synced = True
        self.flushed_offset = target
        return target

    # ------------------------------------------------------------------ recovery

    def recover(self, scan_from: int, delay_levels_ms: tuple[int, ...], check_tail: bool,
                on_record=None) -> RecoveryOutcome:
        """Find the write position by checking records from `scan_from` (a record boundary
        or segment start); cut at the first bad record. `check_tail`: also treat non-zero
        bytes after the end of data as lost data to be zeroed (abnormal shutdown)."""
        files = self.queue.files
        if not files:
            self.wrote_offset = self.flushed_offset = 0
            return RecoveryOutcome(0, 0, -1, -1, "", 0)
        scan_from = min(max(scan_from, files[0].start), files[-1].start + files[-1].size)
        mf = self.queue.find(scan_from) or files[-1]
        pos = scan_from - mf.start      # == mf.size: the checkpoint says the last segment is full
        idx = files.index(mf)
        for earlier in files[:idx]:
            earlier.wrote = earlier.size
        scanned = 0
        reason = ""
        while pos < mf.size:
            kind, size, info = check_record(mf.view, pos, mf.size, mf.start + pos, delay_levels_ms,
                                            dispatch=on_record is not None)
            if kind == RECORD:
                if on_record is not None:
                    on_record(info)
                pos += size
                scanned += 1
                continue
            if kind == BLANK:
                if idx + 1 < len(files):
                    mf.wrote = mf.size
                    idx += 1
                    mf = files[idx]
                    pos = 0
                    continue
                pos = mf.size   # a blank marker closing the last segment: it is full
                break
            if kind == CORRUPT:
                reason = info
            break
        mf.wrote = pos
        end = mf.start + pos
        later = files[idx + 1:]
        truncated_from = truncated_to = -1
        data_end = -1
        if later:
            last = later[-1]
            data_end = last.start + last_nonzero(last.view, last.fd, 0, last.size)
        if reason or later or check_tail:
            # only the extents the file system reports as data are read: a 1 GiB segment's
            # never-written (preallocated) pages are neither read nor made resident
            tail_end = last_nonzero(mf.view, mf.fd, pos, mf.size) if pos < mf.size else pos
            if tail_end > pos:
                data_end = max(data_end, mf.start + tail_end)
                _zero(mf.view, pos, tail_end)
                # make the cut durable now: stale records left past the new end could be
                # read as valid after the next crash if new writes stopped at their boundary
                self.queue.ops.fdatasync(mf.fd)
        if data_end > end or reason:
            truncated_from = end
            truncated_to = max(data_end, end)
            reason = reason or "non-zero bytes after the end of data"
            log.error("commit log cut at %d (%s); lost range [%d, %d), %d later segment(s) removed",
                      end, reason, truncated_from, truncated_to, len(later))
        if later:
            self.queue.delete_after(mf)
            self.queue.sync_dir()
        self.wrote_offset = end
        self.flushed_offset = end
        return RecoveryOutcome(scanned, scan_from, truncated_from, truncated_to, reason, len(later))

    def truncate_to(self, offset: int) -> int:
        """Cut the (closed-for-writes) log at `offset`, a record boundary: zero what follows in
        its segment, delete later segments, make it durable. Controller mode's truncation of
        a replica's unconfirmed tail (broker/core/failover.py consistent_point). Returns the
        bytes dropped (from the offset to the last non-zero byte)."""
        files = self.queue.files
        if not files:
            return 0
        last = files[-1]
        old_end = last.start + last_nonzero(last.view, last.fd, 0, last.size)
        if offset >= old_end:
            return 0
        if offset < files[0].start:
            offset = files[0].start
        mf = self.queue.find(offset)
        if mf is None:
            return 0
        pos = offset - mf.start
        tail_end = last_nonzero(mf.view, mf.fd, pos, mf.size)
        if tail_end > pos:
            _zero(mf.view, pos, tail_end)
            self.queue.ops.fdatasync(mf.fd)
        if mf is not files[-1]:
            self.queue.delete_after(mf)
            self.queue.sync_dir()
        mf.wrote = pos
        self.wrote_offset = min(self.wrote_offset, offset)
        self.flushed_offset = min(self.flushed_offset, offset)
        return old_end - offset

    def iter_dispatch(self, start: int, delay_levels_ms: tuple[int, ...]):
        """(next_offset, DispatchRequest | None) for records from `start` to the write position.
        Blank markers are stepped over (None); a record that cannot be parsed stops the walk
        with a logged error (it can only be a bug: recovery has already checked the log)."""
        end = self.wrote_offset
        while start < end:
            mf = self.queue.find(start)
            if mf is None:
                nxt = self.min_offset
                if nxt <= start:
                    log.error("reput: no segment holds offset %d", start)
                    return
                start = nxt
                continue
            pos = start - mf.start
            kind, size, info = check_record(mf.view, pos, mf.size, start, delay_levels_ms, full=False)
            if kind == RECORD:
                start += size
                yield start, info
            elif kind == BLANK:
                start = mf.end
                yield start, None
            else:
                log.error("reput stopped at %d: %s", start, info or kind)
                return

    def recovery_start(self, flushed_offset: int | None, segments_without_checkpoint: int) -> int:
        """Where recovery starts checking records: the checkpoint's flushed offset, after a
        clean shutdown and after a crash alike; without a checkpoint, the start of the last
        `segments_without_checkpoint` segments (RocketMQ's normal recovery).

        Why the flushed offset is enough after a crash (RocketMQ 4.9 instead rescans whole
        segments, from the newest whose first record is older than the checkpoint): the
        checkpoint records an offset only after fdatasync of every byte below it returned,
        and it is replaced atomically, so the bytes below it are exactly the records this
        store wrote (each built and checked by the put path) and made durable; a crash cannot
        change them. What a crash can damage is the unflushed tail, and recovery checks all
        of it, record by record, from that offset on. Rescanning durable data would only
        catch media corruption, and cutting the log there would drop every acknowledged
        message after the flipped bit; the flushed offset is a record boundary (flush()
        syncs up to the write position), so scanning can start there."""
        files = self.queue.files
        if not files:
            return 0
        if flushed_offset is None:
            return files[max(0, len(files) - segments_without_checkpoint)].start
        return min(max(flushed_offset, files[0].start), files[-1].end)

    def expired_segments(self, below: int, now_ms: int, reserved_ms: int, force: bool) -> int:
        """How many segments from the oldest on may be deleted: never the active one, only
        those wholly below `below` (dispatched), and (unless `force`) whose mtime is at least
        reserved_ms old; stops at the first one kept."""
        count = 0
        for mf in self.queue.files[:-1]:
            if mf.end > below:
                break
            if not force:
                try:
                    mtime_ms = os.stat(mf.path).st_mtime_ns // 1_000_000
                except OSError:
                    break
                if mtime_ms + reserved_ms > now_ms:
                    break
            count += 1
        return count

    def delete_first_segments(self, count: int) -> None:
        self.queue.delete_first(count)

    def reap(self) -> None:
        """Close deleted segments whose mappings were still exported (pull responses)."""
        self.queue.reap()

    def close(self) -> None:
        self.queue.close()
