"""Durability of the file store: flushing the commit log and the consume queues, and
writing the checkpoint (checkpoint.py's format) that bounds the next recovery.

Runs on a flush thread concurrently with appends: it only fdatasyncs descriptors and
writes the checkpoint, under `_file_lock` (which keeps it away from files being deleted).

Failures (docs/store.md "Storage faults"): a failed fdatasync (or directory fsync) makes
the store sticky-failed, never retried — the kernel may have dropped the dirty pages, so
a retry that succeeds would claim durability for lost data. A directory that cannot be
opened for its fsync, or a checkpoint that cannot be written (its temp file not created,
written or synced: the old checkpoint stays valid), is transient: the flushed offset or
the checkpoint does not move, one line per interval counts it, the next flush retries.
"""
from __future__ import annotations

from pocketmq.broker.store.api import StoreError
from pocketmq.broker.store.checkpoint import Checkpoint, write_checkpoint
from pocketmq.broker.store.fileops import NotOpened


class FlushPart:
    """MessageStore's flush methods (a part of the MessageStore class: state in store.py)."""

    @property
    def flushed_offset(self) -> int:
        return self._commitlog.flushed_offset

    def flush(self) -> int:
        """Make the commit log durable up to its current end; returns the flushed offset.
        Safe from a flush thread (SYNC_FLUSH group commit waits for flushed_offset >=
        PutMessageResult.end_offset). Also flushes the consume queues and writes the
        checkpoint once dispatch has moved checkpoint_interval_bytes past the last one, so
        crash recovery stays bounded even if nobody calls flush_consume_queues().
        Raises StoreError when the store has failed (now or earlier): never retried."""
        with self._file_lock:
            if self._failed is not None:
                raise StoreError(self._failed)
            if not self._open:
                return self._commitlog.flushed_offset
            ts = self._last_store_ts
            try:
                flushed = self._commitlog.flush()
            except NotOpened as e:
                self._note_transient("open the commit-log directory to fsync it", e)
                return self._commitlog.flushed_offset
            except OSError as e:
                self._fail(f"commit log fdatasync failed: {e}")
                raise StoreError(self._failed) from e
            self._flushed_store_ts = ts
            if self._reput_from - self._checkpoint_dispatched >= self.config.checkpoint_interval_bytes:
                self._flush_consume_queues_locked()
            return flushed

    def set_warm_waker(self, wake) -> None:
        """`wake()` (from the event loop's thread) when the writer reaches the pages the
        last warming left ahead of it (services/warm.py)."""
        self._commitlog.on_warm_mark = wake
        self._commitlog.warm_mark = 0

    def warm_commit_log(self, ahead: int, buf: memoryview) -> int:
        """Read the commit log's next pages past the write position (up to `ahead` bytes
        past it, len(buf) at most) into the page cache; the bytes warmed, 0 when they
        are all there or the store is closed. For one warmer thread: the step is taken
        under `_file_lock`, the read is not (it would hold up a flush): it goes through
        the warmer's own descriptor of the segment (a dup made for a round, closed at
        its end, only by this method and end_warming), which a deletion of the segment
        cannot close or hand to another file. A failed read is only a missed hint: its
        bytes count as done. (A store is opened once: a reopened one would need its
        waker set again, its commit log being new.)"""
        with self._file_lock:
            if self._failed is not None or not self._open:
                self._close_warm_fd_locked()
                return 0
            step = self._commitlog.warm_step(ahead, len(buf))
            if step is None:
                # the round is over: the descriptor goes too, so a segment deleted before
                # the next round (expired, cleaned) has no reader keeping its space
                self._close_warm_fd_locked()
                return 0
            fd, seg_start, pos, length = step
            if self._warm_seg != seg_start or self._warm_fd < 0:
                self._close_warm_fd_locked()
                try:
                    self._warm_fd = self._ops.dup(fd)
                except OSError:
                    return length
                self._warm_seg = seg_start
            wfd = self._warm_fd
        try:
            self._ops.pread_into(wfd, buf[:length], pos)
        except OSError:
            pass
        return length

    def end_warming(self) -> None:
        """The warmer thread's last call: close its descriptor."""
        with self._file_lock:
            self._close_warm_fd_locked()

    def _close_warm_fd_locked(self) -> None:
        if self._warm_fd >= 0:
            try:
                self._ops.close(self._warm_fd)
            except OSError:
                pass
            self._warm_fd = -1
            self._warm_seg = -1

    def flush_consume_queues(self) -> int:
        """fdatasync the consume queues and write the checkpoint (RocketMQ flushes them every
        second). Returns the commit-log offset below which every consume-queue unit is
        durable. Safe from a flush thread. Raises StoreError when the store has failed."""
        with self._file_lock:
            if self._failed is not None:
                raise StoreError(self._failed)
            if not self._open:
                return self._checkpoint_dispatched
            return self._flush_consume_queues_locked()

    def _flush_consume_queues_locked(self) -> int:
        dispatched = self._reput_from
        logics_ts = self._dispatched_ts
        physic_ts = self._flushed_store_ts
        try:
            count = 0
            for table in list(self._cq_table.values()):
                for cq in list(table.values()):
                    cq.flush()
                    if cq.has_files:
                        count += 1
        except NotOpened as e:
            self._note_transient("open a consume-queue directory to fsync it", e)
            return self._checkpoint_dispatched
        except OSError as e:
            self._fail(f"consume queue fdatasync failed: {e}")
            raise StoreError(self._failed) from e
        index_ts = self._flush_index()      # derived data: its failures are transient (index.py)
        path = self.config.checkpoint_path
        try:
            write_checkpoint(path, Checkpoint(
                physic_ts, logics_ts, index_ts, self._commitlog.flushed_offset, dispatched, count), self._ops)
        except OSError as e:
            self._note_transient("write the checkpoint", e)
            if not self._checkpoint_ok:
                # The checkpoint on disk is the one open() found; after a cut it may point
                # past the new end, into offsets new records reuse. Without one, the next
                # recovery scans and rebuilds (slower, always right).
                try:
                    self._ops.unlink(path)
                except FileNotFoundError:
                    self._checkpoint_ok = True      # nothing stale left
                except OSError:
                    pass
                else:
                    self._checkpoint_ok = True
            return self._checkpoint_dispatched
        self._checkpoint_ok = True
        self._checkpoint_dispatched = dispatched
        return dispatched
