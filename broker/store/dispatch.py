"""Dispatch (RocketMQ's reput): commit-log records -> consume-queue units -> wake-ups.

Owns `reput_from`, the commit-log offset below which every record has its consume-queue
unit, and the on_dispatch notifications. Appends dispatch their own records directly
when reput_from is at their offset (AppendPart); otherwise, and at recovery, `_reput`
walks the commit log from reput_from (CommitLog.iter_dispatch) and writes the units.
"""
from __future__ import annotations

import logging
from operator import attrgetter

from pocketmq.protocol.message import MessageSysFlag
from pocketmq.broker.store.api import valid_topic
from pocketmq.broker.store.commitlog import DispatchRequest
from pocketmq.broker.store.consumequeue import CQ_UNIT, EXISTS
from pocketmq.broker.store.fileops import NotOpened

log = logging.getLogger("pocketmq.store")

_indexed = MessageSysFlag.indexed
_pack_unit = CQ_UNIT.pack
_PHYS, _SIZE, _CODE = attrgetter("commit_log_offset"), attrgetter("size"), attrgetter("tags_code")


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

    def _dispatch_many(self, runs: list, start: int, end: int) -> int:
        """Dispatch records just appended from `start` (reput_from) to `end` (the slave's
        replicated runs), given as runs of (DispatchRequests, one_queue): the units a queue
        gets are written with one put_many when they continue it, and each queue is
        notified once per distinct tag code with its new end (a held pull wakes if any
        record matches it, as per-record dispatch would). A run marked one_queue (one topic,
        queue and sys flag, consecutive queue offsets: check_uniform_run's verdict) skips the
        grouping. Pinned to per-record `_dispatch` by tests/unit/test_store_replica.py. Falls
        back to `_reput` when dispatch is not at `start`."""
        if self._reput_from != start or self._dispatch_behind:
            return self._reput()
        groups: dict = {}
        for reqs, one_queue in runs:
            if one_queue:
                key = (reqs[0].topic, reqs[0].queue_id)
                if not _indexed(reqs[0].sys_flag):
                    continue
                g = groups.get(key)
                if g is None:
                    groups[key] = list(reqs)
                else:
                    g += reqs
                continue
            for req in reqs:
                if not _indexed(req.sys_flag):
                    continue
                g = groups.get((req.topic, req.queue_id))
                if g is None:
                    groups[(req.topic, req.queue_id)] = [req]
                else:
                    g.append(req)
        n = 0
        try:
            for (topic, queue_id), rs in groups.items():
                if not valid_topic(topic):
                    for req in rs:
                        n += self._dispatch(req)      # logs and skips it
                    continue
                cq = self._cq(topic, queue_id)
                qo0 = rs[0].queue_offset
                if cq.max_offset != qo0 or rs[-1].queue_offset != qo0 + len(rs) - 1:
                    for req in rs:                    # a gap, a repeat: the unit-by-unit rules
                        n += self._dispatch(req)
                    continue
                cq.put_many(qo0, b"".join(list(map(_pack_unit, map(_PHYS, rs), map(_SIZE, rs), map(_CODE, rs)))))
                n += len(rs)
                last = rs[-1]
                self._dispatched_ts = last.store_timestamp
                if self.on_dispatch is not None:
                    for code in set(map(_CODE, rs)):
                        self._notify(topic, queue_id, cq.max_offset, code, last.store_timestamp)
        except NotOpened as e:
            # the queues dispatched so far are idempotent: reput redoes the run from its start
            self._dispatch_behind = True
            self._note_transient("create consume-queue file", e)
            return n
        except OSError as e:
            self._fail(f"consume queue write failed: {e}")
            return n
        self._reput_from = end
        return n

    def _notify(self, topic: str, queue_id: int, next_max_offset: int, code: int, store_ts: int) -> None:
        try:
            self.on_dispatch(topic, queue_id, next_max_offset, code, store_ts)
        except Exception:
            # the message is stored and indexed: a broken listener must not turn that into an error
            log.exception("on_dispatch listener failed")

    @property
    def reput_from_offset(self) -> int:
        return self._reput_from
