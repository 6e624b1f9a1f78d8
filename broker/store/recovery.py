"""Opening and closing the file store: the directory lock, the abort file, recovery.

Owns the lifecycle (open, close, abandon) and what open decides after a crash:

- the abort file `{root}/abort` exists while the store is open; finding it at open means
  the last run did not close cleanly (abnormal recovery);
- the commit log is checked from the checkpoint's flushed offset (after a clean shutdown
  and after a crash: what lies below it was fsynced; the last few segments without a
  checkpoint) and cut at the first bad record (CommitLog.recovery_start / recover); past
  the end only what the file system reports as data is read;
- consume queues are loaded, cut where they point past the new end, and re-dispatched
  from the checkpoint's dispatch point (every unit below it was fsynced), or all rebuilt
  when some were deleted or there is no checkpoint;
- the checkpoint is rewritten at once (a stale one could point into reused offsets).
"""
from __future__ import annotations

import fcntl
import logging
import os

from pocketmq.broker.store.api import RecoveryReport, StoreError, valid_topic
from pocketmq.broker.store.checkpoint import read_checkpoint, write_checkpoint
from pocketmq.broker.store.commitlog import CommitLog
from pocketmq.broker.store.consumequeue import ConsumeQueue
from pocketmq.broker.store.epoch import EPOCH_FILE_NAME, read_epoch_file, write_epoch_file
from pocketmq.broker.store.fileops import FileOps

log = logging.getLogger("pocketmq.store")


class RecoveryPart:
    """MessageStore's lifecycle (a part of the MessageStore class: state in store.py)."""

    def open(self) -> RecoveryReport:
        """Recover and start accepting puts. Raises StoreError on a layout it will not guess
        about, OSError on I/O errors."""
        if self._open:
            raise StoreError("store already open")
        cfg = self.config
        root = cfg.store_path_root_dir
        os.makedirs(root, exist_ok=True)
        os.makedirs(cfg.commit_log_dir, exist_ok=True)
        cq_dir_missing = not os.path.isdir(self._cq_root)
        os.makedirs(self._cq_root, exist_ok=True)
        self._take_lock()
        try:
            return self._recover(cq_dir_missing)
        except BaseException:
            self._release_files()
            self._release_lock()
            raise

    def _recover(self, cq_dir_missing: bool) -> RecoveryReport:
        cfg = self.config
        abnormal = os.path.exists(cfg.abort_path)
        ck = read_checkpoint(cfg.checkpoint_path)
        cl = self._commitlog = CommitLog(cfg.commit_log_dir, self._file_size, self._ops)
        cl.load()
        scan_from = cl.recovery_start(ck.flushed_physical_offset if ck is not None else None,
                                      cfg.recover_segments_without_checkpoint)
        outcome = cl.recover(scan_from, self._delay_levels, check_tail=abnormal or ck is None)
        end = cl.wrote_offset
        cl_min = cl.min_offset
        cl.flushed_offset = min(scan_from, end)

        truncated = 0
        queues_truncated = 0
        cq_count = 0
        self._cq_table = {}
        if os.path.isdir(self._cq_root):
            for topic in sorted(os.listdir(self._cq_root)):
                tdir = os.path.join(self._cq_root, topic)
                if not os.path.isdir(tdir) or not valid_topic(topic):
                    log.warning("ignoring %s in consumequeue/", topic)
                    continue
                for qname in sorted(os.listdir(tdir)):
                    if not qname.isdigit() or not os.path.isdir(os.path.join(tdir, qname)):
                        log.warning("ignoring %s/%s in consumequeue/", topic, qname)
                        continue
                    cq = ConsumeQueue(topic, int(qname), self._cq_root, self._cq_size, self._ops)
                    zeroed = cq.load(check_rest=abnormal or ck is None)
                    if cq.has_files:
                        cq_count += 1
                    dropped = cq.truncate_from_phys(end)
                    truncated += dropped
                    queues_truncated += bool(dropped or zeroed)
                    cq.correct_min_offset(cl_min)
                    self._cq_table.setdefault(topic, {})[cq.queue_id] = cq
        if truncated:
            log.warning("recovery dropped %d consume-queue units pointing past %d", truncated, end)

        full_rebuild = ck is None or cq_dir_missing or cq_count < ck.consume_queue_count
        if full_rebuild:
            # consume queues were deleted (or nothing says how far they went): rebuild them
            # all from the commit log, idempotently
            reput_from = cl_min
        else:
            # every unit of the records below the checkpoint's dispatch point was fsynced
            # before the checkpoint was written: only the records after it (at most one
            # checkpoint interval) are read again, whatever the segment size
            reput_from = min(max(ck.logics_physical_offset, cl_min), end)
        self._reput_from = reput_from
        self._failed = None
        self._open = True
        before = {(t, q): cq.max_offset for t, table in self._cq_table.items() for q, cq in table.items()}
        dispatched = self._reput()
        queues_redispatched = sum(1 for t, table in self._cq_table.items() for q, cq in table.items()
                                  if before.get((t, q)) != cq.max_offset)
        # the message index (index.py): drop what a crash may have left unflushed, rebuild from the log
        self._open_index(abnormal, ck.index_msg_timestamp if ck is not None else 0)
        cl.flush()                       # what recovery accepted is now durable
        # a checkpoint from before a cut may point past the new end, into offsets that new
        # records will reuse: replace it now
        self.flush_consume_queues()
        self._create_abort_file()
        report = RecoveryReport(
            abnormal=abnormal, records_scanned=outcome.records_scanned,
            scan_from_offset=outcome.scan_from_offset, commit_log_min_offset=cl_min,
            commit_log_max_offset=end, truncated_from=outcome.truncated_from,
            truncated_to=outcome.truncated_to, cut_reason=outcome.reason,
            segments_removed=outcome.segments_removed, cq_entries_truncated=truncated,
            reput_from_offset=reput_from, records_dispatched=dispatched,
            queues_truncated=queues_truncated, queues_redispatched=queues_redispatched,
            full_rebuild=full_rebuild, queues_loaded=cq_count)
        # logged once, by the shell that opened the store (it knows how long it took)
        return report

    def close(self) -> None:
        """Flush everything, write the checkpoint, remove the abort file. A sticky-failed
        store keeps its abort file so the next open runs the abnormal recovery."""
        if not self._open:
            return
        clean = False
        try:
            if self._failed is None:
                # a transient failure (a file not opened) leaves something unflushed or
                # the checkpoint old: then the abort file stays too
                clean = self.flush() == self._commitlog.wrote_offset and \
                    self.flush_consume_queues() == self._reput_from
        except StoreError:
            pass                         # failed: the abort file stays
        finally:
            with self._file_lock:
                self._open = False
                self._release_files()
            if clean:
                try:
                    self._ops.unlink(self.config.abort_path)
                    self._ops.fsync_dir(self.config.store_path_root_dir)
                except FileNotFoundError:
                    pass
                except OSError as e:     # not durably removed: the next open may recover needlessly
                    log.warning("abort file: %s", e)
            self._release_lock()

    def abandon(self) -> None:
        """Drop the store like a killed process would: no flush, no checkpoint, the abort
        file stays. Writes already in the mappings survive (they are in the page cache)."""
        with self._file_lock:
            self._open = False
            self._release_files()
        self._release_lock()

    def _release_files(self) -> None:
        self._checkpoint_ok = False      # the next open starts from the checkpoint it finds
        self._dispatch_behind = False
        self._close_index()
        self._commitlog.close()
        for table in self._cq_table.values():
            for cq in table.values():
                cq.close()
        self._cq_table = {}

    def _take_lock(self) -> None:
        fd = os.open(self.config.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(f"{self.config.store_path_root_dir} is locked by another store") from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _create_abort_file(self) -> None:
        fd = self._ops.open(self.config.abort_path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._ops.close(fd)
        self._ops.fsync_dir(self.config.store_path_root_dir)


def truncate_files(config, offset: int, ops: FileOps | None = None) -> int:
    """Cut a CLOSED store's commit log at `offset` (a record boundary) before it is opened
    again: controller mode's truncation of what a replica held past the point where its log
    and its new master's agree. The checkpoint is lowered to the cut (recovery then finds
    the end there: consume queues are cut past it and re-dispatched, index files pointing
    past it are dropped and rebuilt) and the epoch file loses the entries past it. Returns
    the bytes dropped."""
    ops = ops or FileOps()
    cl = CommitLog(config.commit_log_dir, config.mapped_file_size_commit_log, ops)
    cl.load()
    try:
        dropped = cl.truncate_to(offset)
    finally:
        cl.close()
    ck = read_checkpoint(config.checkpoint_path)
    if ck is not None and (ck.flushed_physical_offset > offset or ck.logics_physical_offset > offset):
        write_checkpoint(config.checkpoint_path, ck._replace(
            flushed_physical_offset=min(ck.flushed_physical_offset, offset),
            logics_physical_offset=min(ck.logics_physical_offset, offset)))
    epath = os.path.join(config.store_path_root_dir, EPOCH_FILE_NAME)
    entries = read_epoch_file(epath)
    kept = [e for e in entries if e[1] <= offset]
    if kept != entries:
        write_epoch_file(epath, kept)
    if dropped:
        log.warning("commit log truncated at %d: %d bytes past it dropped (they were never confirmed to "
                    "the group)", offset, dropped)
    return dropped
