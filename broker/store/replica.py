"""Replication's two ends in the store: reading a byte range for the HA stream (master) and
appending the master's bytes (slave).

The HA stream (protocol/ha.py) carries raw CommitLog bytes, cut at any byte but never
across a segment. The slave's log must end up byte-identical to the master's, and its
CommitLog stays the only truth, rebuilt from after a crash: so the slave never writes a
partial record into its segments. What arrives is kept in a bounded buffer (`_replica_pending`)
until a whole unit is there, then written at the same offset the master has it:

* records (MAGICCODE = message): wait for TOTALSIZE bytes; a run of whole records is written
  into the segment at once, each checked in place (check_record: PHYSICALOFFSET, lengths,
  BODYCRC, topic, properties), then made part of the log; the first bad one is zeroed with
  what follows it and refused;
* a blank marker ([remaining][BLANK magic]): wait for the segment's remaining bytes (the
  master's zero tail), write the marker: the segment is full;
* anything else: refused, the stream is not a commit log at this offset.

The write position therefore stays at a record boundary (recovery, the checkpoint and
the dispatcher rely on that), and dispatch (consume queues, the index, held pulls woken by
on_dispatch) runs over the new records at once, from what the check returned
(DispatchPart._dispatch_many: one put_many per queue and run), so a record is parsed once.

An empty slave starts at the offset of the first bytes it is sent, which must be a segment's
start (the master sends from its oldest segment; Java's, from its newest).
"""
from __future__ import annotations

from itertools import groupby
from operator import attrgetter

from pocketmq.broker.store.commitlog import RECORD, check_record, check_uniform_run
from pocketmq.broker.store.index import INDEX_HINT_BYTES_MAX
from pocketmq.broker.store.fileops import NotOpened
from pocketmq.protocol.message import (
    BLANK_MAGIC_CODE,
    BLANK_MARKER_SIZE,
    HOST_V6_FLAGS,
    MESSAGE_MAGIC_CODE,
    MessageSysFlag,
    RECORD_HEAD_MIN,
    pack_blank_marker,
    unpack_size_magic,
)

__all__ = ["ReplicaPart", "ReplicaError", "ReplicaBusy"]


_TOPIC_TS = attrgetter("topic", "store_timestamp")
# Records a slave takes even when they exceed its own maxMessageSize (its master's may be
# larger: Java's slave takes any record); beyond, the buffer would hold too much.
REPLICA_RECORD_MAX = 64 * 1024 * 1024
# no IndexHint for transaction halves nor records with IPv6 hosts (append.py's rule)
_NOT_HINTED = MessageSysFlag.TRANSACTION_PREPARED_TYPE | HOST_V6_FLAGS


class ReplicaError(Exception):
    """Replicated bytes that cannot be appended: the log is left exactly as it was."""


class ReplicaBusy(ReplicaError):
    """The bytes are fine but cannot be stored for now (a segment could not be created and
    the buffer is full): the caller reconnects a little later and asks again."""


class ReplicaPart:
    """MessageStore's replication methods (a part of the MessageStore class: state in store.py)."""

    # -- master: what the HA stream sends ----------------------------------------------

    def replica_read(self, offset: int, max_bytes: int) -> bytes | None:
        """Up to `max_bytes` of the commit log from `offset`, never past the end of the
        segment holding it nor past the write position: b"" when there is nothing yet at
        `offset` (the end of the log), None when `offset` is not in the log (below the oldest
        segment, or past the end). A copy: the segment may be deleted while it is sent."""
        cl = self._commitlog
        end = cl.wrote_offset
        if offset == end:
            return b""
        if offset > end or offset < cl.min_offset:
            return None
        mf = cl.queue.find(offset)
        if mf is None:
            return None
        pos = offset - mf.start
        n = min(max_bytes, mf.wrote - pos)
        if n <= 0:
            return b""
        return bytes(mf.view[pos:pos + n])

    # -- slave: appending the master's bytes -----------------------------------------------

    @property
    def replica_received_end(self) -> int:
        """The offset the next replicated bytes must start at: the write position plus what
        waits in the buffer for the rest of its record."""
        return self._commitlog.wrote_offset + len(self._replica_pending)

    @property
    def _replica_record_max(self) -> int:
        """The largest record a slave takes: its master's limit may be above this broker's
        maxMessageSize, so the bound is the segment's (and REPLICA_RECORD_MAX's)."""
        return min(self._file_size - BLANK_MARKER_SIZE, max(self._max_record, REPLICA_RECORD_MAX))

    @property
    def _replica_pending_max(self) -> int:
        # one record not yet whole, plus a read's frames after it
        return self._replica_record_max + BLANK_MARKER_SIZE + (1 << 20)

    @property
    def replica_pending_bytes(self) -> int:
        return len(self._replica_pending)

    def replica_reset(self) -> int:
        """Drop what waits in the buffer (a new HA connection starts again at the write
        position); returns the write position."""
        self._replica_pending.clear()
        self._replica_stalled = False
        return self._commitlog.wrote_offset

    def replica_append(self, offset: int, data) -> int:
        """Append the master's bytes `data`, which lie at `offset` in its log. Returns the
        number of records made part of the log (and dispatched). Raises ReplicaError when
        `offset` is not where this log continues or the bytes are not a valid continuation
        (nothing of `data` is then kept). An empty `data` retries what a transient failure
        (a segment that could not be created) left in the buffer."""
        if not self._open or self._failed is not None:
            raise ReplicaError(f"the store is not writable: {self._failed or 'closed'}")
        cl = self._commitlog
        pending = self._replica_pending
        expected = cl.wrote_offset + len(pending)
        if offset != expected:
            if not (data and not pending and not cl.queue.files and cl.wrote_offset == 0):
                raise ReplicaError(f"the master sent bytes at offset {offset}, this log continues at {expected}")
            if offset % self._file_size:
                raise ReplicaError(f"an empty log can only start at a segment boundary; the master sent "
                                   f"offset {offset} (segment size {self._file_size})")
            cl.wrote_offset = cl.flushed_offset = offset
            self._reput_from = offset
        if len(pending) + len(data) > max(self._replica_pending_max, len(data)):
            if self._replica_stalled:
                pending.clear()
                raise ReplicaBusy(f"a commit-log segment could not be created; {expected - cl.wrote_offset} "
                                  f"bytes from {cl.wrote_offset} wait")
            raise ReplicaError(f"{len(pending) + len(data)} bytes at {expected} hold no complete record "
                               f"(records are at most {self._replica_record_max} bytes)")
        buffered = bool(pending)
        if buffered:
            pending += data
        # slices of a memoryview are not copies (records reach the segment with one copy)
        buf = memoryview(pending) if buffered else memoryview(data)
        try:
            pos, n = self._append_units(buf)
        except ReplicaError:
            buf.release()
            pending.clear()   # what was not stored is dropped: the caller reconnects and asks again
            raise
        rest = len(buf) - pos
        if buffered:
            buf.release()     # (a bytearray with an exported view cannot be resized)
            del pending[:pos]
        elif rest:
            pending += buf[pos:]
        return n

    def _hint_index(self, reqs, props, size: int) -> None:
        """IndexHints for a checked run of records of one size: one per stretch of one topic
        and store time (a master's batch), so the index takes their keys from these columns
        instead of reading the records back, as after a master's column-wise put (index.py,
        IndexHint; its walk checks each hint's first and last record)."""
        hints = self._index_hints
        if hints is None or reqs[0].sys_flag & _NOT_HINTED:
            return
        i = 0
        for (topic, ts), group in groupby(map(_TOPIC_TS, reqs)):
            j = i + sum(1 for _ in group)
            if j - i > 1 and len(props[i]) * (j - i) <= INDEX_HINT_BYTES_MAX:
                hints.append((reqs[i].commit_log_offset, size, j - i, topic.encode(), list(props[i:j]), ts))
            i = j

    def _append_units(self, buf) -> tuple[int, int]:
        """Write the whole units at the head of `buf`; (bytes consumed, records)."""
        cl = self._commitlog
        size = self._file_size
        end = len(buf)
        pos = 0
        n = 0
        while end - pos >= BLANK_MARKER_SIZE:
            phys = cl.wrote_offset
            in_seg = phys % size
            remaining = size - in_seg
            total, magic = unpack_size_magic(buf, pos)
            if magic == BLANK_MAGIC_CODE:
                if total != remaining or in_seg == 0:
                    raise ReplicaError(f"blank marker at {phys} says {total} bytes, the segment has "
                                       f"{remaining} left")
                if end - pos < remaining:
                    break
                mf = cl.queue.last
                if mf is None or not mf.start <= phys < mf.end:
                    raise ReplicaError(f"no segment holds offset {phys}")
                pack_blank_marker(mf.mm, in_seg, remaining)
                mf.wrote = mf.size
                cl.wrote_offset = mf.end
                pos += remaining
                continue
            if magic != MESSAGE_MAGIC_CODE:
                raise ReplicaError(f"no record at offset {phys}: magic code {magic & 0xFFFFFFFF:#010x}")
            if total < RECORD_HEAD_MIN or total > remaining - BLANK_MARKER_SIZE or total > self._replica_record_max:
                raise ReplicaError(f"record at {phys} of {total} bytes does not fit ({remaining} bytes left in "
                                   f"its segment, records at most {self._replica_record_max})")
            if end - pos < total:
                break
            # The records from here that lie in this segment: the bytes that can be theirs are
            # copied at once past the write position (invisible until it moves), then checked
            # in place (each record once: the check also gives what the dispatcher needs); what
            # is left past the last whole good record is zeroed again and stays in the buffer.
            try:
                at = cl.reserve(total)      # the segment exists (it fits: never a roll here)
            except NotOpened as e:
                self._note_transient("create commit-log segment", e)
                self._replica_stalled = True
                break      # kept in the buffer; the next frame (or heartbeat) retries
            self._replica_stalled = False
            if at != phys:
                raise ReplicaError(f"record at {phys} would be written at {at}")
            mf = cl.queue.files[-1]
            p0 = at - mf.start
            avail = min(end - pos, remaining - BLANK_MARKER_SIZE)
            cl.write_ahead(at, buf[pos:pos + avail])      # a memoryview slice: no copy
            view, seg, levels = mf.view, mf.size, self._delay_levels
            runs = []           # (DispatchRequests, one queue): what _dispatch_many takes
            singles = []
            p, stop = p0, p0 + avail
            bad = None
            count = 0
            while stop - p >= BLANK_MARKER_SIZE:
                rsize, magic = unpack_size_magic(view, p)
                if magic != MESSAGE_MAGIC_CODE or rsize < RECORD_HEAD_MIN or p + rsize > stop:
                    break       # a marker, a record not all here yet, or junk: the outer loop decides
                # records of one layout in a row (a batch, or sends of one shape) are checked
                # column by column; any doubt, and the others, one at a time
                run = check_uniform_run(view, p, rsize, (stop - p) // rsize, mf.start + p, levels) \
                    if rsize * 2 <= stop - p else None
                if run is not None:
                    if singles:
                        runs.append((singles, False))
                        singles = []
                    runs.append((run.requests, run.one_queue))
                    self._hint_index(run.requests, run.properties, rsize)
                    p += run.count * rsize
                    count += run.count
                    continue
                kind, rsize, info = check_record(view, p, seg, mf.start + p, levels)
                if kind != RECORD:
                    bad = f"record at {mf.start + p} is not valid: {info or kind}"
                    break
                singles.append(info)
                count += 1
                p += rsize
            if p < stop:
                mf.mm[p:stop] = bytes(stop - p)       # (pages the write above just touched)
            if singles:
                runs.append((singles, False))
            if p > p0:
                mf.wrote = p
                cl.wrote_offset = mf.start + p
                self._last_store_ts = runs[-1][0][-1].store_timestamp     # the checkpoint's physicMsgTimestamp
                self._dispatch_many(runs, mf.start + p0, cl.wrote_offset)
                n += count
            if bad is not None:
                raise ReplicaError(bad)
            if p == p0:
                break           # the first record is not whole yet (checked above: cannot be)
            pos += p - p0
        return pos, n
