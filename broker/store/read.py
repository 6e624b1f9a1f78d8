"""Reading the file store: get_message (the PULL path), look_message_by_offset, queue bounds.

Owns the pull rules (RocketMQ 4.9.4's getMessage): the status for an offset outside the
queue, the transfer limits (bytes and count, tighter for records no longer in memory),
tag filtering on the units' tags codes, the record filter (SQL92: reads the record's
properties in the segment, no copy of the record), stepping over fillers and over records already
deleted with their segment. Records are handed out as slices of the commit log
(CommitLog.read: memoryviews of the mappings, zero copy), physically adjacent ones
coalesced. `_get_unfiltered` is the common pull's fast path (no filter, records in one
segment in memory): the units' columns unpacked at once, the limits by a running sum, runs
of adjacent records found by comparing columns, no Python step per unit.
`_get_matching` is the filtered pull's (a record filter with a `match_many` form, the
SQL92 filter's): the units decoded and the records judged a chunk at a time, then only
the matches walked; anything it does not handle (fillers, records out of memory or in a
deleted segment) goes to the general per-unit loop, whose result it reproduces.
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import compress, islice, repeat
from operator import add, ne, sub

from pocketmq.common.constants import CQ_UNIT_SIZE
from pocketmq.broker.store.api import (CQ_FILLER_SIZE, GetMessageResult, GetMessageStatus, MessageFilter,
                                       RecordFilter, StoreError)
from pocketmq.broker.store.consumequeue import CQ_UNIT, sizes_plain, unit_columns, unit_tags

_FOUND = GetMessageStatus.FOUND
_NO_MATCHED = GetMessageStatus.NO_MATCHED_MESSAGE
_REMOVING = GetMessageStatus.MESSAGE_WAS_REMOVING
# record filter -> the share of records it matched lately: how many units _get_matching
# judges at once (too few: another round; too many: work on units the pull never reaches).
# A plain dict (a weak one costs microseconds a pull), emptied when it grows past the bound.
_match_rates: dict = {}
_MATCH_RATES_MAX = 1024
# units judged at once at most: bounds the unpack Structs consumequeue caches per chunk size
# (a rarely matching filter would otherwise ask for thousands of units in one go)
_CHUNK_MAX = 256
# _get_matching judges up to this many times the units a pull needs, for the pulls after it
JUDGE_AHEAD = 3
# (record filter, consume queue) -> (first queue offset, commit-log offsets, sizes, results)
# of the units judged ahead (MessageStore._judged), emptied when it grows past the bound
_JUDGED_MAX = 256


def _fitting(sizes, limit: int, cap: int) -> tuple[int, int]:
    """(k, their total): the first record whatever its size, then each later one of the
    first `limit` while the running sum stays within `cap` (sizes > 0: the sums grow). The
    sums are C-level sum()s of a guessed prefix, moved a record at a time to the exact
    answer, instead of an int object per running sum (the records of a pull differ little
    in size: the guess is off by a few). tests/unit/test_store.py pins it to the running sum."""
    total = sum(islice(sizes, limit))
    if total <= cap:
        return limit, total
    k = max(1, limit * cap // total)        # total > cap: k < limit
    total = sum(islice(sizes, k))
    while k > 1 and total > cap:
        k -= 1
        total -= sizes[k]
    while k < limit and total + sizes[k] <= cap:
        total += sizes[k]
        k += 1
    return k, total


class ReadPart:
    """MessageStore's read methods (a part of the MessageStore class: state in store.py)."""

    def get_message(self, topic: str, queue_id: int, offset: int, max_msg_nums: int,
                    message_filter: MessageFilter | None = None,
                    record_filter: RecordFilter | None = None) -> GetMessageResult:
        if not self._open:
            raise StoreError("store is not open")
        table = self._cq_table.get(topic)
        cq = table.get(queue_id) if table is not None else None
        if cq is None:
            min_offset = max_offset = 0
        else:
            min_offset = cq.min_offset
            max_offset = cq.max_offset
            if self._confirm_offset is not None:
                visible = self._visible_max(cq, max_offset, offset)
                if visible <= offset <= max_offset and visible < max_offset:
                    # stored, not yet confirmed: "nothing new yet" (the pull is held and woken
                    # when the confirm offset passes it), never a correction of the
                    # consumer's offset (OFFSET_OVERFLOW_BADLY would send it back to 0)
                    return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, visible)
                max_offset = visible
        if max_offset == 0:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, min_offset, max_offset)
        if offset < min_offset:
            return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
        if offset == max_offset:
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
        if offset > max_offset:
            # RocketMQ 4.9.4: back to 0 when the queue still starts at 0, else to the end
            nxt = min_offset if min_offset == 0 else max_offset
            return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, nxt, min_offset, max_offset)
        buf = cq.index_buffer(offset)
        if buf is None:
            return GetMessageResult(GetMessageStatus.OFFSET_FOUND_NULL, cq.roll_next_file(offset),
                                    min_offset, max_offset)
        limit = max(16000, max_msg_nums * CQ_UNIT_SIZE)
        if self._confirm_offset is not None:
            limit = min(limit, (max_offset - offset) * CQ_UNIT_SIZE)
        if len(buf) > limit:
            buf = buf[:limit - limit % CQ_UNIT_SIZE]
        cfg = self.config
        if message_filter is None and record_filter is None:
            fast = self._get_unfiltered(buf, offset, max_msg_nums, min_offset, max_offset)
            if fast is not None:
                return fast
        elif record_filter is not None:
            match_many = getattr(record_filter, "match_many", None)
            if match_many is not None:
                found = self._get_matching(buf, offset, max_msg_nums, min_offset, max_offset, message_filter,
                                           record_filter, match_many, cq)
                if found is not None:
                    return found
        cl = self._commitlog
        readable_view = cl.readable_view
        fsize = self._file_size
        cl_max = cl.wrote_offset
        mem_limit = self._memory_limit
        mem_bytes = cfg.max_transfer_bytes_on_message_in_memory
        mem_count = cfg.max_transfer_count_on_message_in_memory
        disk_bytes = cfg.max_transfer_bytes_on_message_in_disk
        disk_count = cfg.max_transfer_count_on_message_in_disk
        status = _NO_MATCHED
        slices = []
        # the run of records being coalesced: cur_view[cur_start:cur_end] (a segment's view)
        cur_view = view = rec_buf = None
        cur_start = cur_end = 0
        seg_lo, seg_hi = 0, -1          # the written part of the segment `view` maps
        total = 0
        count = 0
        scanned = 0
        skip_below = -1
        for phys, size, tag in CQ_UNIT.iter_unpack(buf):
            if phys < skip_below or size == CQ_FILLER_SIZE:
                scanned += 1
                continue
            if count:
                if count >= max_msg_nums:
                    break
                if cl_max - phys > mem_limit:
                    if total + size > disk_bytes or count >= disk_count:
                        break
                elif total + size > mem_bytes or count >= mem_count:
                    break
            if message_filter is not None and not message_filter(tag):
                scanned += 1
                continue
            if seg_lo <= phys and phys + size <= seg_hi:
                pos = phys - seg_lo         # in the segment of the last record read
            else:
                found = readable_view(phys, size)
                if found is None:
                    # deleted with its segment (or not there): skip the rest of that segment
                    if not total:
                        status = _REMOVING
                    skip_below = phys + fsize - phys % fsize
                    scanned += 1
                    continue
                view, seg_lo, seg_hi = found
                pos = phys - seg_lo
                if record_filter is not None:
                    # the filter reads the segment's mapping itself (same offsets as the view
                    # of the whole segment): slicing an mmap gives bytes at once, a memoryview
                    # slice would first build another view
                    rec_buf = view.obj
                    if len(rec_buf) != view.nbytes:
                        rec_buf = view
            if record_filter is not None and not record_filter(rec_buf, pos):
                if not total:
                    status = _NO_MATCHED
                scanned += 1
                continue
            if view is cur_view and pos == cur_end:
                cur_end += size
            else:
                if cur_view is not None:
                    slices.append(cur_view[cur_start:cur_end])
                cur_view = view
                cur_start = pos
                cur_end = pos + size
            total += size
            count += 1
            status = _FOUND
            skip_below = -1
            scanned += 1
        if cur_view is not None:
            slices.append(cur_view[cur_start:cur_end])
        return GetMessageResult(status, offset + scanned, min_offset, max_offset, count, slices, total)

    def _get_unfiltered(self, buf, offset: int, max_msg_nums: int, min_offset: int,
                        max_offset: int) -> GetMessageResult | None:
        """The common pull: no filter, and the units' records lie in one segment still in
        memory. Then the general loop's answer is computed from the units' columns at once,
        with no Python step per unit: the sizes checked from their bytes (sizes_plain), one
        unpack (unit_columns), the transfer limits by sums of the sizes (_fitting), and
        records that lie back to back coalesced by
        comparing each record's offset with the previous one's end (one slice when all
        are adjacent: one queue's records written together; a few when queues interleave
        in the commit log). None when anything else holds (a filler among the units the loop
        would visit, a unit of size 0 or less, a record out of memory or outside the first
        record's segment, offsets not in order): the general loop decides.
        tests/unit/test_store.py pins the two together."""
        cfg = self.config
        n = len(buf) // CQ_UNIT_SIZE
        limit = min(max_msg_nums, cfg.max_transfer_count_on_message_in_memory, n)
        if limit <= 0:
            return None
        cap = cfg.max_transfer_bytes_on_message_in_memory
        # the loop also visits the unit after the last it takes (a filler there is stepped over)
        m = min(limit + 1, n)
        # The units the byte cap lets the pull reach, guessed from the first record's size
        # with an eighth to spare (a pull's records differ little in size): ~1,000 units a
        # pull were unpacked when ~800 fit. A guess the cap does not stop within is redone
        # with all m.
        guess = m
        first = CQ_UNIT.unpack_from(buf, 0)[1]
        if first > 0:
            guess = cap // first
            guess += guess // 8 + 2
        cl = self._commitlog
        for mm in ((guess, m) if guess < m else (m,)):
            if not sizes_plain(buf, mm):
                # a filler, or a unit no record makes (a zero unit a crash left before reput
                # repairs it, a negative size), or one of 16 MiB or more: the running sum and
                # the order below assume none of them
                return None
            phys, sizes = unit_columns(buf, 0, mm)
            p0 = phys[0]
            if cl.wrote_offset - p0 > self._memory_limit:
                return None     # out of memory: the disk limits apply (offsets only grow after it)
            k, total = _fitting(sizes, min(limit, mm), cap)
            if k < mm or mm == m:
                break           # unit k, the one after the last taken, is among those checked
        found = cl.readable_view(p0, sizes[0])
        if found is None:
            return None
        view, seg_lo, seg_hi = found
        end = phys[k - 1] + sizes[k - 1]
        if end > seg_hi:
            return None
        ends = tuple(map(add, islice(phys, k - 1), islice(sizes, k - 1)))  # records' ends (a tuple, as phys)
        later = phys[1:k]
        if later == ends:           # each record starts where the one before ends: one run
            cuts = []
        else:
            # a run ends where the next record does not start at this one's end
            cuts = list(compress(range(1, k), map(ne, later, ends)))
            # inside a run records follow each other (sizes > 0: in order); at a cut the next
            # must start past this one's end, else the offsets are out of order or overlap,
            # which the memory and segment checks above assume: not what a queue holds, the
            # loop decides (checked at the cuts only: one pass over the units less)
            for c in cuts:
                if phys[c] < ends[c - 1]:
                    return None
        firsts = [0] + cuts
        lasts = [c - 1 for c in cuts] + [k - 1]
        slices = [view[phys[a] - seg_lo:phys[b] + sizes[b] - seg_lo] for a, b in zip(firsts, lasts)]
        return GetMessageResult(_FOUND, offset + k, min_offset, max_offset, k, slices, total)

    def _get_matching(self, buf, offset: int, max_msg_nums: int, min_offset: int, max_offset: int,
                      message_filter, record_filter, match_many, cq=None) -> GetMessageResult | None:
        """The general loop's result for a pull with a record filter that judges many records at
        once (`match_many(segment, commit_log_offsets, sizes, segment_start) -> [bool]` for
        records of this queue in one segment). Units are decoded and judged a chunk at a time
        (sized from the filter's recent match rate, so little is judged beyond where the pull
        stops), then only the matches are walked, with the loop's limits: max_msg_nums and the
        in-memory count and byte caps, checked at every unit after the first taken one (a unit
        the byte cap stops at ends the pull even when it would be refused). None (the loop
        decides) on a filler unit, a record out of memory, or one not in a readable segment.

        Judging ahead: a consumer's next pull starts where this one stops, so a chunk judged
        without a tag filter reaches up to JUDGE_AHEAD times further than this pull needs
        (not past a filler or the segment's end), and its results are kept per (filter,
        consume queue) in `_judged`; a pull starting inside them takes their results for
        units whose commit-log offsets and sizes are still the same. One judging call then
        serves about three pulls (its fixed cost shared) and no unit is judged twice."""
        cl = self._commitlog
        cfg = self.config
        mem_bytes = cfg.max_transfer_bytes_on_message_in_memory
        limit = min(max_msg_nums, cfg.max_transfer_count_on_message_in_memory)
        try:
            rate = _match_rates.get(record_filter, 0.5)
        except TypeError:               # an unhashable filter: no memory of its rate
            rate = 0.5
        n_units = len(buf) // CQ_UNIT_SIZE
        slices = []
        cur_view = None
        cur_start = cur_end = 0
        total = 0
        count = 0
        judged = matched = 0
        i = 0                           # next unit to judge
        scanned = n_units               # where the pull stops
        done = False
        judged_key = (record_filter, cq) if cq is not None and message_filter is None else None
        try:
            ahead = self._judged.get(judged_key) if judged_key is not None else None
        except TypeError:               # an unhashable filter: nothing judged ahead
            judged_key = ahead = None
        while i < n_units and not done:
            j = min(n_units, i + min(_CHUNK_MAX, max(16, int((limit - count) / max(rate, 0.01)) + 4)))
            need = j - i
            flags = None
            known = ()                  # results judged ahead for the chunk's first units
            if ahead is not None and 0 <= offset + i - ahead[0] < len(ahead[1]):
                # judged ahead by an earlier pull: the units must still be the same
                d = offset + i - ahead[0]
                k = min(need, len(ahead[1]) - d)
                phys, sizes = unit_columns(buf, i * CQ_UNIT_SIZE, k)
                if ahead[1][d:d + k] == phys and ahead[2][d:d + k] == sizes:
                    known = ahead[3][d:d + k]
                    if k == need:
                        flags = known
                ahead = None
            if flags is None:
                span = min(n_units - i, _CHUNK_MAX, need * JUDGE_AHEAD) if judged_key is not None else need
                phys, sizes = unit_columns(buf, i * CQ_UNIT_SIZE, span)
            if CQ_FILLER_SIZE in sizes:
                f = sizes.index(CQ_FILLER_SIZE)
                if f < need:
                    return None
                phys, sizes = phys[:f], sizes[:f]       # judge ahead up to the filler only
            if cl.wrote_offset - phys[0] > self._memory_limit:
                return None
            found = cl.readable_view(phys[0], sizes[0])
            if found is None:
                return None
            view, seg_lo, seg_hi = found
            m = len(phys)
            if phys[-1] + sizes[-1] > seg_hi:       # the chunk ends in the next segment
                m = bisect_left(phys, seg_hi)
                if phys[m - 1] + sizes[m - 1] > seg_hi:
                    return None
                phys, sizes = phys[:m], sizes[:m]
            rec_buf = view.obj                      # the mapping itself: slices are bytes
            if len(rec_buf) != view.nbytes:
                rec_buf = view
            if flags is None or len(flags) > m:
                k = min(len(known), m)
                try:
                    flags = [*known[:k], *match_many(rec_buf, phys[k:], sizes[k:], seg_lo)] if k < m else known[:m]
                except Exception:
                    # a record the batch reader cannot read (damaged: struct.error,
                    # IndexError...) somewhere in the chunk, maybe beyond where the pull
                    # stops: the per-unit loop, the reference, decides (and reads only what
                    # the pull reaches)
                    return None
                if judged_key is not None and m > need:
                    table = self._judged
                    if len(table) >= _JUDGED_MAX:
                        table.clear()
                    table[judged_key] = (offset + i, phys, sizes, flags)
            if message_filter is not None:
                tags = unit_tags(buf, i * CQ_UNIT_SIZE, m)
                flags = [f and message_filter(t) for f, t in zip(flags, tags)]
            judged += m
            matched += flags.count(True)
            biggest = max(sizes)
            take = list(islice(compress(range(m), flags), limit - count))
            took = list(islice(compress(sizes, flags), limit - count))
            if take and total + sum(took) + biggest > mem_bytes:
                # the byte cap may stop this chunk: the matches taken before it does
                c = _taken_before_byte_cap(sizes, take, total, count, mem_bytes)
                take, took = take[:c], took[:c]
            if take:
                # one slice per run of records back to back
                starts = list(map(sub, islice(compress(phys, flags), len(take)), repeat(seg_lo)))
                ends = list(map(add, starts, took))
                if view is cur_view and starts[0] == cur_end:
                    run = cur_start                 # the first continues the current run
                else:
                    if cur_view is not None:
                        slices.append(cur_view[cur_start:cur_end])
                    run = starts[0]
                for t in compress(range(1, len(starts)), map(ne, starts[1:], ends)):
                    slices.append(view[run:ends[t - 1]])
                    run = starts[t]
                cur_view = view
                cur_start = run
                cur_end = ends[-1]
                total += sum(took)
                count += len(take)
            if take and count >= limit:
                scanned = i + take[-1] + 1
                # the loop steps over fillers before it checks the count: so do we (none
                # inside the chunk, which stops before any; they may start the next one,
                # never decoded)
                while scanned >= i + m and scanned < n_units \
                        and unit_columns(buf, scanned * CQ_UNIT_SIZE, 1)[1][0] == CQ_FILLER_SIZE:
                    scanned += 1
                done = True
            elif count:
                # the units after the last one taken: the loop checks the byte cap at each
                # (the unit that stops it ends the pull, taken or not)
                after = take[-1] + 1 if take else 0
                if after < m and max(sizes[after:]) > mem_bytes - total:
                    scanned = i + _first_above(sizes, after, mem_bytes - total)
                    done = True
            i += m
        if cur_view is not None:
            slices.append(cur_view[cur_start:cur_end])
        if judged:
            if len(_match_rates) >= _MATCH_RATES_MAX:
                _match_rates.clear()
            try:
                _match_rates[record_filter] = 0.5 * rate + 0.5 * matched / judged
            except TypeError:
                pass
        return GetMessageResult(_FOUND if count else _NO_MATCHED, offset + scanned, min_offset, max_offset,
                                count, slices, total)

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._find_cq(topic, queue_id)
        if cq is None:
            return 0
        if self._confirm_offset is not None:
            return self._visible_max(cq, cq.max_offset, -1)
        return cq.max_offset

    # -- controller mode: consumers never read past the confirm offset --------------------

    @property
    def confirm_offset(self) -> int | None:
        return self._confirm_offset

    def set_confirm_offset(self, offset: int | None) -> None:
        """Serve consumers only records ending at or below `offset` (None: every record).
        A master in controller mode sets the min ack of its SyncStateSet, a slave what its
        master sent: a record past it may be cut by a failover, so no consumer may see it
        (RocketMQ 5's confirmOffset). Raising it wakes the held pulls of the queues a read
        found held back (through on_dispatch, any tags code)."""
        old = self._confirm_offset
        self._confirm_offset = offset
        waiting = self._confirm_waiting
        if not waiting or (old is not None and offset is not None and offset <= old):
            return
        woke = [key for key, need in waiting.items() if offset is None or offset >= need]
        for key in woke:
            del waiting[key]
            if self.on_dispatch is not None:
                cq = self._find_cq(*key)
                if cq is not None:
                    limit = cq.max_offset if offset is None else self._visible_max(cq, cq.max_offset, -1)
                    self._notify(key[0], key[1], limit, None, self._dispatched_ts)

    def _visible_max(self, cq, max_offset: int, asked: int) -> int:
        """The queue's end as consumers see it: the first unit whose record ends past the
        confirm offset (units are in commit-log order within a queue: a binary search over
        the tail; O(1) when the last unit is confirmed, the common case). A read `asked` at
        or past that end registers the queue to be woken when the confirm offset passes it."""
        limit = self._confirm_offset
        lo = cq.min_offset
        if max_offset <= lo:
            return max_offset
        u = cq.unit(max_offset - 1)
        if u is None or u[0] + u[1] <= limit or u[1] == CQ_FILLER_SIZE:
            return max_offset
        hi = max_offset - 1             # unit hi is not confirmed; find the first such
        while lo < hi:
            mid = (lo + hi) // 2
            m = cq.unit(mid)
            if m is not None and m[1] != CQ_FILLER_SIZE and m[0] + m[1] > limit:
                hi = mid
            else:
                lo = mid + 1
        if asked >= lo:
            first = cq.unit(lo)
            waiting = self._confirm_waiting
            if first is not None and (len(waiting) < 100_000 or (cq.topic, cq.queue_id) in waiting):
                waiting[(cq.topic, cq.queue_id)] = first[0] + first[1]
        return lo

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self._find_cq(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    def look_message_by_offset(self, commit_log_offset: int) -> bytes | None:
        """The record stored at a commit-log offset (a copy), or None."""
        size = self._commitlog.record_size_at(commit_log_offset)
        if size < 0:
            return None
        view = self._commitlog.read(commit_log_offset, size)
        return bytes(view) if view is not None else None

    def check_in_disk_by_consume_offset(self, topic: str, queue_id: int, offset: int) -> bool:
        cq = self._find_cq(topic, queue_id)
        if cq is None:
            return False
        u = cq.unit(offset)
        if u is None or u[1] == CQ_FILLER_SIZE:     # a filler stands for no message
            return False
        return self._commitlog.wrote_offset - u[0] > self._memory_limit


def _taken_before_byte_cap(sizes, take: list[int], total: int, count: int, mem_bytes: int) -> int:
    """How many of the matches `take` (unit indices of a chunk) the pull takes before the
    in-memory byte cap stops it, the cap checked at every unit after the first message
    taken, as the per-unit loop does: refused units too."""
    last = -1
    for c, k in enumerate(take):
        if (count or c) and max(sizes[last + 1:k + 1]) > mem_bytes - total:
            return c
        total += sizes[k]
        last = k
    return len(take)


def _first_above(sizes, start: int, room: int) -> int:
    """The first index from `start` whose size does not fit in `room` (there is one)."""
    k = start
    while sizes[k] <= room:
        k += 1
    return k
