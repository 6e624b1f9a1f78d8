"""Deleting from the file store: expired commit-log segments and the consume-queue files
they leave pointing nowhere (clean_expired_files), and whole topics' consume queues
(delete_topics). Runs under `_file_lock`, away from the flush thread.
"""
from __future__ import annotations

import logging
import os
import shutil

from pocketmq.broker.store.api import CleanResult, valid_topic

log = logging.getLogger("pocketmq.store")


class CleaningPart:
    """MessageStore's maintenance methods (a part of the MessageStore class: state in store.py)."""

    def delete_topics(self, topics) -> int:
        """Drop the consume queues of these topics (their records stay in the commit log until
        it expires). Returns the number of queues removed."""
        removed = 0
        with self._file_lock:
            for topic in topics:
                table = self._cq_table.pop(topic, None)
                if table:
                    self._judged.clear()        # results judged ahead for these queues (read.py)
                    for cq in table.values():
                        cq.destroy()
                        removed += 1
                tdir = os.path.join(self._cq_root, topic)
                if valid_topic(topic) and os.path.isdir(tdir):
                    shutil.rmtree(tdir, ignore_errors=True)
        if self._open:
            # move the checkpoint's dispatch point past the deleted topics' records, so a
            # restart does not dispatch them again
            self.flush_consume_queues()
        return removed

    def clean_expired_files(self, now_ms: int, force: bool = False) -> CleanResult:
        """Delete commit-log segments (never the active one) whose mtime is older than
        file_reserved_time_hours (any age with force), oldest first, stopping at the first
        one kept; then the consume-queue files wholly below the new commit-log minimum.
        Consume-queue min offsets move up accordingly."""
        if not self._open:
            return CleanResult(0, 0)
        reserved_ms = self.config.file_reserved_time_hours * 3_600_000
        with self._file_lock:
            cl = self._commitlog
            victims = cl.expired_segments(self._reput_from, now_ms, reserved_ms, force)
            if victims:
                cl.delete_first_segments(victims)
                log.info("deleted %d expired commit-log segment(s); min offset now %d",
                         victims, cl.min_offset)
            cq_files = self._clean_consume_queues()
            cl.reap()
        return CleanResult(victims, cq_files)

    def clean_expired_consume_queues(self) -> int:
        """Delete the consume-queue files (never a queue's last) whose units all point below
        the commit log's min offset, and move each queue's min offset up to its first unit
        still readable (Java's cleanExpiredConsumerQueue, mqadmin cleanExpiredCQ); what
        clean_expired_files does after deleting segments, on demand. Returns the number of
        files deleted."""
        if not self._open:
            return 0
        with self._file_lock:
            return self._clean_consume_queues()

    def _clean_consume_queues(self) -> int:
        cl_min = self._commitlog.min_offset
        cq_files = 0
        for table in self._cq_table.values():
            for cq in table.values():
                cq_files += cq.clean(cl_min)
        return cq_files
