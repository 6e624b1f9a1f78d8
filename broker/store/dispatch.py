"""Dispatch (RocketMQ's reput): commit-log records -> consume-queue units -> wake-ups.

Owns `reput_from`, the commit-log offset below which every record has its consume-queue
unit, and the on_dispatch notifications. Appends dispatch their own records directly
when reput_from is at their offset (AppendPart); otherwise, and at recovery, `_reput`
walks the commit log from reput_from (CommitLog.iter_dispatch) and writes the units.
"""
from __future__ import annotations

import logging

from pocketmq.protocol.message import MessageSysFlag
from pocketmq.broker.store.api import valid_topic
from pocketmq.broker.store.commitlog import DispatchRequest
from pocketmq.broker.store.consumequeue import EXISTS
from pocketmq.broker.store.fileops import NotOpened

log = logging.getLogger("pocketmq.store")

_indexed = MessageSysFlag.indexed


class DispatchPart:
    """MessageStore's dispatcher (a part of the MessageStore class: state in store.py)."""

    def reput(self) -> int:
        """Dispatch every record from reput_from_offset to the commit-log end into the
        consume queues. Returns the number of units written."""
        if not self._open:
            return 0
        return self._reput()

    def _reput(self) -> int:
        n = 0
        dispatch = self._dispatch
        self._dispatch_behind = False
        try:
            for nxt, req in self._commitlog.iter_dispatch(self._reput_from, self._delay_levels):
                if req is not None:
                    n += dispatch(req)
                self._reput_from = nxt
        except NotOpened as e:
            # transient: reput_from stays at the record (units are idempotent); puts retry
            # this first and are refused while it fails (AppendPart._catch_up)
            self._dispatch_behind = True
            self._note_transient("create consume-queue file", e)
        except OSError as e:
            self._fail(f"consume queue write failed: {e}")
        return n

    def _dispatch(self, req: DispatchRequest) -> int:
        if not _indexed(req.sys_flag):
            return 0
        if not valid_topic(req.topic):
            log.error("record at %d has topic %r that cannot be a directory; not dispatched",
                      req.commit_log_offset, req.topic)
            return 0
        cq = self._cq(req.topic, req.queue_id)
        if cq.put(req.queue_offset, req.commit_log_offset, req.size, req.tags_code) == EXISTS:
            return 0
        self._dispatched_ts = req.store_timestamp
        if self.on_dispatch is not None:
            self._notify(req.topic, req.queue_id, cq.max_offset, req.tags_code, req.store_timestamp)
        return 1

    def _notify(self, topic: str, queue_id: int, next_max_offset: int, code: int, store_ts: int) -> None:
        try:
            self.on_dispatch(topic, queue_id, next_max_offset, code, store_ts)
        except Exception:
            # the message is stored and indexed: a broken listener must not turn that into an error
            log.exception("on_dispatch listener failed")

    @property
    def reput_from_offset(self) -> int:
        return self._reput_from
