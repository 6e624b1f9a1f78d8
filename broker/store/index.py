"""The message index (RocketMQ 4.9's IndexFile): commit-log offsets by `topic#key`.

One file per `max_index_num` entries in `{store_path_root_dir}/index/`, named by the
store time of its first entry as Java's `UtilAll.timeMillisToHumanString` does
(yyyyMMddHHmmssSSS, 17 digits, local time). Sizes: 40 + slots*4 + entries*20 bytes
(Java's defaults, 5,000,000 slots and 20,000,000 entries: 420 MB, created sparse).
Big-endian throughout:

| offset                  | size | field                                                        |
|-------------------------|------|--------------------------------------------------------------|
| 0                       | 8    | beginTimestamp: store time of the first entry                |
| 8                       | 8    | endTimestamp: store time of the last entry                   |
| 16                      | 8    | beginPhyOffset: commit-log offset of the first entry         |
| 24                      | 8    | endPhyOffset: commit-log offset of the last entry            |
| 32                      | 4    | hashSlotCount: slots in use                                  |
| 36                      | 4    | indexCount: next entry number; entry 0 is never used (starts at 1) |
| 40 + 4*s                | 4    | hash slot s: number of the newest entry whose keyHash % slots == s (0: none) |
| 40 + 4*slots + 20*n     | 4    | entry n keyHash: abs(Java String.hashCode(topic#key)) (MIN_VALUE -> 0) |
|                         | 8    | phyOffset: the record's commit-log offset                    |
|                         | 4    | timeDiff: (storeTimestamp - beginTimestamp) / 1000, seconds, clamped to 0..2^31-1 |
|                         | 4    | prevIndex: the previous entry of the same slot (0: end of chain) |

A lookup walks the chain from the slot, newest first; entries of other keys that share
the slot are skipped by keyHash, and (unlike Java) every candidate is checked against
the record itself (topic, KEYS / UNIQ_KEY, exact store time), so hash collisions and
the index's one-second resolution never show in results.

Who builds it: not the put path (it stays as fast as without an index). Like Java's
reput thread, the index lags a little and catches up in batches: `_index_catch_up`
walks the records the dispatcher has passed (below `reput_from`) from the index's own
progress point, at most `index_build_batch` (broker key indexBuildBatchNums, 20,000)
records per call, on each `flush_consume_queues` (the flush thread, every second) and
before each query; at open it indexes everything missing. The bound keeps the index
to a bounded share of the one interpreter the broker has (it costs about twice a put
per message); under a sustained load above that rate the index lags, and a query sees
what is indexed so far, as with Java (the answer's indexLastUpdatePhyoffset says how
far). Prepared and rolled-back transaction halves are not indexed (Java's rule).

Durability: the files are mmapped and fdatasync'ed before each checkpoint, which records
the last file's endTimestamp as RocketMQ's indexMsgTimestamp. After a crash, files whose
endTimestamp is newer than that are deleted (Java's rule: they may hold unflushed
entries), as are files pointing past the recovered commit-log end; the index is then
rebuilt from the commit log from the last kept entry on. Files whose entries all point
below the commit log's min offset are deleted (never the last).

Memory: the last (active) file stays mapped; older ones are mapped while a query reads
them, at most `max_open` at a time (least recently used unmapped first).
"""
from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import time
from operator import mul
from datetime import datetime
from typing import Iterator

from pocketmq.broker.store.api import QueryMessageResult
from pocketmq.protocol.message import (BLANK_MAGIC_CODE, KEY_SEPARATOR, KEYS, MAX_INT, MESSAGE_MAGIC_CODE, UNIQ_KEY,
                                       MessageSysFlag, decode_record, index_fields_at, java_string_hash,
                                       property_getter, unpack_size_magic)

__all__ = ["INDEX_HEADER_SIZE", "INDEX_SLOT_SIZE", "INDEX_ENTRY_SIZE", "IndexFile", "IndexService",
           "IndexPart", "index_key_hash", "index_file_size", "index_file_name", "message_index_keys"]


# records indexed between two GIL hand-overs (about 0.1-0.2 ms of work)
GIL_YIELD_EVERY = 32
_sleep = time.sleep
log = logging.getLogger("pocketmq.store")

_HEADER = struct.Struct(">qqqqii")
_SLOT = struct.Struct(">i")
_ENTRY = struct.Struct(">iqii")
INDEX_HEADER_SIZE = _HEADER.size       # 40
INDEX_SLOT_SIZE = _SLOT.size           # 4
INDEX_ENTRY_SIZE = _ENTRY.size         # 20
_MIN_INT = -0x80000000
_indexed = MessageSysFlag.indexed


def index_key_hash(key: str) -> int:
    """Java IndexFile.indexKeyHashMethod: abs(String.hashCode()), Integer.MIN_VALUE -> 0."""
    h = java_string_hash(key)
    return 0 if h == _MIN_INT else abs(h)


# String.hashCode is the polynomial sum(c[i] * 31^(n-1-i)) mod 2^32: for ASCII bytes it
# is a dot product with precomputed powers, which map/sum run in C (used for the parts
# hashed once and cached; the per-record part is short).
_MASK = 0xFFFFFFFF
_POW_N = 256
_POWERS_DESC = [pow(31, _POW_N - 1 - i, 1 << 32) for i in range(_POW_N)]   # 31^255 .. 31^0


def _poly_hash(b: bytes) -> int:
    """Unsigned Java hashCode of ASCII bytes."""
    n = len(b)
    if n <= _POW_N:
        return sum(map(mul, b, _POWERS_DESC[_POW_N - n:])) & _MASK
    h = 0
    for c in b:
        h = (31 * h + c) & _MASK
    return h


_SUFFIX = 12                # the part of a long key hashed per record (a UNIQ_KEY's time + counter)
_PREFIX_CACHE_MAX = 4096    # distinct long-key prefixes remembered per topic (producers)


class _KeyHasher:
    """index_key_hash(topic + "#" + key) for raw key bytes, the topic's part computed once:
    hash(p + k) = hash(p) * 31^len(k) + hash(k) (mod 2^32). A long key's head is cached
    too: a client msgId (UNIQ_KEY) is 20 hex digits naming the producer (address,
    pid, class loader) then 12 that change per message, so per record only those 12 are
    hashed (the per-character loop is most of the index's cost)."""

    __slots__ = ("prefix", "prefix_hash", "heads")

    def __init__(self, topic: str) -> None:
        self.prefix = topic + "#"
        self.prefix_hash = java_string_hash(self.prefix) & _MASK
        self.heads: dict[bytes, int] = {}

    def __call__(self, key: bytes) -> int:
        if not key.isascii():
            return index_key_hash(self.prefix + key.decode("utf-8", "replace"))
        n = len(key)
        if n > _SUFFIX + 4:
            head = key[:n - _SUFFIX]
            h = self.heads.get(head)
            if h is None:
                if len(self.heads) >= _PREFIX_CACHE_MAX:
                    self.heads.clear()
                h = self.heads[head] = self._head_hash(head)
            for c in key[n - _SUFFIX:]:
                h = (31 * h + c) & _MASK
        else:
            h = self.prefix_hash
            for c in key:
                h = (31 * h + c) & _MASK
        if h & 0x80000000:
            h -= 0x100000000
        return 0 if h == _MIN_INT else abs(h)

    def _head_hash(self, head: bytes) -> int:
        """Unsigned hash of prefix + head (ASCII)."""
        m = len(head)
        if m < _POW_N:
            return (self.prefix_hash * _POWERS_DESC[_POW_N - 1 - m] + _poly_hash(head)) & _MASK   # 31^m
        return java_string_hash(self.prefix + head.decode("ascii")) & _MASK


def index_file_size(slot_num: int, index_num: int) -> int:
    return INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE


def index_file_name(timestamp_ms: int) -> str:
    """Java's UtilAll.timeMillisToHumanString: yyyyMMddHHmmssSSS in local time."""
    t = datetime.fromtimestamp(timestamp_ms / 1000.0)
    return "%04d%02d%02d%02d%02d%02d%03d" % (t.year, t.month, t.day, t.hour, t.minute, t.second,
                                             timestamp_ms % 1000)


_uniq_of = property_getter(UNIQ_KEY)
_keys_of = property_getter(KEYS)
_KEY_SEPARATOR_B = KEY_SEPARATOR.encode()


def _raw_keys(props: bytes) -> list[bytes]:
    """The index keys of one record, on its properties as stored, without the topic:
    UNIQ_KEY then each KEYS word (Java's buildIndex order)."""
    out = []
    uniq = _uniq_of(props)
    if uniq:
        out.append(uniq)
    keys = _keys_of(props)
    if keys:
        out.extend(k for k in keys.split(_KEY_SEPARATOR_B) if k)
    return out


def message_index_keys(topic: str, props: str) -> list[str]:
    """The `topic#key` strings a record with these properties is indexed under."""
    return [f"{topic}#{k.decode('utf-8', 'replace')}" for k in _raw_keys(props.encode())]


class IndexFile:
    """One index file: the header kept in attributes and written into the mapping after
    each message, slots and entries written straight into the mapping."""

    __slots__ = ("path", "slot_num", "index_num", "size", "fd", "mm",
                 "begin_ts", "end_ts", "begin_phy", "end_phy", "slot_count", "index_count")

    def __init__(self, path: str, slot_num: int, index_num: int) -> None:
        self.path = path
        self.slot_num = slot_num
        self.index_num = index_num
        self.size = index_file_size(slot_num, index_num)
        self.fd = -1
        self.mm: mmap.mmap | None = None
        self.begin_ts = self.end_ts = self.begin_phy = self.end_phy = 0
        self.slot_count = 0
        self.index_count = 1

    # ------------------------------------------------------------------ files

    @classmethod
    def create(cls, path: str, slot_num: int, index_num: int) -> "IndexFile":
        f = cls(path, slot_num, index_num)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, f.size)       # sparse, like Java's RandomAccessFile.setLength
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        f.fd = fd
        f.mm = mmap.mmap(fd, f.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        f._write_header()
        return f

    @classmethod
    def load(cls, path: str, slot_num: int, index_num: int) -> "IndexFile":
        """Read the header of an existing file (left unmapped). ValueError when the file
        cannot be an index file of this geometry."""
        f = cls(path, slot_num, index_num)
        st = os.stat(path)
        if st.st_size != f.size:
            raise ValueError(f"size {st.st_size}, expected {f.size} (maxHashSlotNum/maxIndexNum changed?)")
        with open(path, "rb") as fh:
            head = fh.read(INDEX_HEADER_SIZE)
        (f.begin_ts, f.end_ts, f.begin_phy, f.end_phy, f.slot_count, f.index_count) = _HEADER.unpack(head)
        if not (1 <= f.index_count <= index_num) or f.end_phy < f.begin_phy or f.begin_phy < 0 \
                or not 0 <= f.slot_count <= slot_num or f.end_ts < 0 or f.begin_ts < 0:
            raise ValueError("header out of range (torn or foreign file)")
        if f.index_count <= 1:
            f.index_count = 1
        return f

    def map(self) -> None:
        if self.mm is None:
            self.fd = os.open(self.path, os.O_RDWR)
            self.mm = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def unmap(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def flush(self, fdatasync) -> None:
        if self.fd >= 0:
            fdatasync(self.fd)

    @property
    def entries(self) -> int:
        return self.index_count - 1

    @property
    def full(self) -> bool:
        return self.index_count >= self.index_num

    def _write_header(self) -> None:
        _HEADER.pack_into(self.mm, 0, self.begin_ts, self.end_ts, self.begin_phy, self.end_phy,
                          self.slot_count, self.index_count)

    # ------------------------------------------------------------------ entries

    def put_keys(self, hashes: list[int], phy: int, store_ts: int,
                 _slot_unpack=_SLOT.unpack_from, _slot_pack=_SLOT.pack_into, _entry_pack=_ENTRY.pack_into) -> int:
        """Add one record's keys (Java putKey, per key); returns how many fit. The header
        is written once, after the last entry, so a reader never sees a count beyond the
        entries written."""
        mm = self.mm
        slot_num = self.slot_num
        idx = self.index_count
        if idx <= 1:
            self.begin_ts = store_ts
            self.begin_phy = phy
        begin_ts = self.begin_ts
        diff = 0 if begin_ts <= 0 else (store_ts - begin_ts) // 1000
        diff = 0 if diff < 0 else (diff if diff <= MAX_INT else MAX_INT)
        entries_base = INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE
        room = self.index_num - idx
        n = 0
        for h in hashes:
            if n >= room:
                break
            slot_pos = INDEX_HEADER_SIZE + (h % slot_num) * INDEX_SLOT_SIZE
            prev = _slot_unpack(mm, slot_pos)[0]
            if prev <= 0 or prev > idx:
                prev = 0
                self.slot_count += 1
            _entry_pack(mm, entries_base + idx * INDEX_ENTRY_SIZE, h, phy, diff, prev)
            _slot_pack(mm, slot_pos, idx)
            idx += 1
            n += 1
        if n:
            self.index_count = idx
            self.end_ts = store_ts
            self.end_phy = phy
            _HEADER.pack_into(mm, 0, begin_ts, store_ts, self.begin_phy, phy, self.slot_count, idx)
        return n

    def select(self, key_hash: int, begin_ms: int, end_ms: int) -> Iterator[int]:
        """Commit-log offsets of the entries with this key hash whose second-resolution
        time may lie in [begin_ms, end_ms], newest first (Java selectPhyOffset)."""
        mm = self.mm
        count = self.index_count
        if count <= 1:
            return
        entries_base = INDEX_HEADER_SIZE + self.slot_num * INDEX_SLOT_SIZE
        cur = _SLOT.unpack_from(mm, INDEX_HEADER_SIZE + (key_hash % self.slot_num) * INDEX_SLOT_SIZE)[0]
        seen = 0
        while 0 < cur < count and seen < count:
            seen += 1        # a corrupt chain with a loop ends here
            h, phy, diff, prev = _ENTRY.unpack_from(mm, entries_base + cur * INDEX_ENTRY_SIZE)
            if diff < 0:
                break
            t = self.begin_ts + diff * 1000      # the real store time is in [t, t + 1000)
            if h == key_hash and t <= end_ms and t + 999 >= begin_ms:
                yield phy
            if prev == cur or t + 1000 <= begin_ms:
                break
            cur = prev

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        return self.index_count > 1 and begin_ms <= self.end_ts and end_ms >= self.begin_ts


class IndexService:
    """The index files of one store: load, recover, add, query, flush, expire."""

    def __init__(self, directory: str, slot_num: int, index_num: int, fdatasync=os.fdatasync,
                 fsync_dir=None, max_open: int = 4) -> None:
        if slot_num <= 0 or index_num <= 1:
            raise ValueError("maxHashSlotNum must be > 0 and maxIndexNum > 1")
        self.dir = directory
        self.slot_num = slot_num
        self.index_num = index_num
        self.files: list[IndexFile] = []
        self._fdatasync = fdatasync
        self._fsync_dir = fsync_dir
        self._max_open = max(1, max_open)
        self._mapped: list[IndexFile] = []        # older files mapped for queries, LRU first
        self._dirty: list[IndexFile] = []         # written since the last flush
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ open / recover

    def load(self, abnormal: bool, checkpoint_ts: int, cl_min: int, cl_end: int) -> tuple[int, int]:
        """Open the directory; drop files a crash may have left incomplete. Returns (the
        record to resume indexing at, the offset through which records are wholly indexed),
        (-1, -1) when nothing is kept."""
        os.makedirs(self.dir, exist_ok=True)
        found = []
        for name in sorted(os.listdir(self.dir)):
            path = os.path.join(self.dir, name)
            if not name.isdigit() or not os.path.isfile(path):
                log.warning("ignoring %s in index/", name)
                continue
            try:
                f = IndexFile.load(path, self.slot_num, self.index_num)
            except (ValueError, OSError) as e:
                log.warning("index file %s dropped: %s", name, e)
                self._unlink(path)
                continue
            found.append(f)
        found.sort(key=lambda f: (f.begin_phy, f.end_phy))
        kept: list[IndexFile] = []
        dropping = False         # after a dropped file, later ones would leave a hole: drop them too
        for f in found:
            why = None
            if dropping:
                why = "follows a dropped file"
            elif f.index_count <= 1:
                why = "empty"
            elif abnormal and f.end_ts > checkpoint_ts:
                why = "newer than the checkpoint's index time"
            elif f.end_phy >= cl_end:
                why = "points past the recovered commit-log end"
            elif kept and f.begin_phy < kept[-1].end_phy:
                why = "overlaps the previous file"
            if why:
                dropping = True
                log.warning("index file %s dropped (%s): rebuilt from the commit log", os.path.basename(f.path), why)
                self._unlink(f.path)
                continue
            kept.append(f)
        self.files = kept
        if kept:
            kept[-1].map()
        self.expire(cl_min)
        if not kept:
            return -1, -1
        # a record's keys may continue in the next file (dropped, or never written when the
        # last file is full): index that record again; queries drop the duplicate offset
        end = kept[-1].end_phy
        return end, (end - 1 if dropping or kept[-1].full else end)

    def close(self) -> None:
        for f in self.files:
            f.unmap()
        self._mapped = []
        self._dirty = []

    # ------------------------------------------------------------------ writing

    def put_hashes(self, hashes: list[int], phy: int, store_ts: int) -> None:
        files = self.files
        f = files[-1] if files else None
        if f is not None and f.index_count + len(hashes) <= f.index_num:
            f.put_keys(hashes, phy, store_ts)        # the common case: the record fits the active file
            if f not in self._dirty:
                self._dirty.append(f)
            return
        while hashes:
            f = self._active(store_ts)
            n = f.put_keys(hashes, phy, store_ts)
            if f not in self._dirty:
                self._dirty.append(f)
            hashes = hashes[n:]

    def _active(self, store_ts: int) -> IndexFile:
        if self.files and not self.files[-1].full:
            return self.files[-1]
        name = index_file_name(store_ts)
        path = os.path.join(self.dir, name)
        while os.path.exists(path):       # two files within one millisecond (tiny test files)
            store_ts += 1
            name = index_file_name(store_ts)
            path = os.path.join(self.dir, name)
        if self.files:
            # the full file is final: make it durable now and drop its mapping (bounded memory)
            last = self.files[-1]
            last.flush(self._fdatasync)
            if last in self._dirty:
                self._dirty.remove(last)
            last.unmap()
        f = IndexFile.create(path, self.slot_num, self.index_num)
        self.files.append(f)
        if self._fsync_dir is not None:
            self._fsync_dir(self.dir)
        return f

    def flush(self) -> int:
        """fdatasync the files written since the last flush; returns the last file's
        endTimestamp (the checkpoint's indexMsgTimestamp)."""
        for f in self._dirty:
            f.flush(self._fdatasync)
        last = self.files[-1] if self.files else None
        self._dirty = []
        return last.end_ts if last is not None else 0

    def expire(self, cl_min: int) -> int:
        """Delete files (never the last) whose entries all point below the commit log's min offset."""
        n = 0
        while len(self.files) > 1 and self.files[0].end_phy < cl_min:
            f = self.files.pop(0)
            if f in self._mapped:
                self._mapped.remove(f)
            if f in self._dirty:
                self._dirty.remove(f)
            f.unmap()
            self._unlink(f.path)
            n += 1
        return n

    # ------------------------------------------------------------------ reading

    def candidates(self, key: str, begin_ms: int, end_ms: int) -> Iterator[int]:
        """Offsets of entries that may be `key` in [begin_ms, end_ms], newest first."""
        h = index_key_hash(key)
        for f in reversed(self.files):
            if not f.overlaps(begin_ms, end_ms):
                if f.index_count > 1 and f.end_ts < begin_ms:
                    break
                continue
            self._use(f)
            yield from f.select(h, begin_ms, end_ms)

    def _use(self, f: IndexFile) -> None:
        if f is self.files[-1]:
            f.map()
            return
        if f in self._mapped:
            self._mapped.remove(f)
        else:
            f.map()
            while len(self._mapped) >= self._max_open:
                self._mapped.pop(0).unmap()
        self._mapped.append(f)

    @property
    def last_update(self) -> tuple[int, int]:
        """(endTimestamp, endPhyOffset) of the last file: QUERY_MESSAGE's
        indexLastUpdateTimestamp / indexLastUpdatePhyoffset."""
        if not self.files:
            return 0, 0
        f = self.files[-1]
        return f.end_ts, f.end_phy

    def _unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class IndexPart:
    """MessageStore's index methods (a part of the MessageStore class: state in store.py)."""

    def _open_index(self, abnormal: bool, index_checkpoint_ts: int) -> None:
        """Recovery's hook: load the index, then index what it misses."""
        cfg = self.config
        if not cfg.message_index_enable:
            self._index = None
            return
        svc = IndexService(cfg.index_dir, cfg.max_hash_slot_num, cfg.max_index_num,
                           fdatasync=self._ops.fdatasync, fsync_dir=self._ops.fsync_dir)
        cl = self._commitlog
        resume, done_through = svc.load(abnormal, index_checkpoint_ts, cl.min_offset, cl.wrote_offset)
        self._index = svc
        self._index_flushed_ts = index_checkpoint_ts
        self._index_hashers = {}
        self._index_done_through = done_through
        self._index_from = start = max(resume, cl.min_offset)
        n = self._index_catch_up()
        if n:
            log.info("index rebuilt for %d records from offset %d", n, start)

    def _close_index(self) -> None:
        svc = self._index
        if svc is not None:
            with svc.lock:
                svc.close()
            self._index = None

    def _index_catch_up(self, max_records: int = 0) -> int:
        """Index the records between the index's progress point and the dispatch point,
        at most `max_records` of them (0: all). Returns the number of records walked.
        Records below the dispatch point were checked by recovery or written by this
        process, so only their frame is read here."""
        svc = self._index
        if svc is None:
            return 0
        with svc.lock:
            limit = self._reput_from
            start = max(self._index_from, self._commitlog.min_offset)
            done_through = self._index_done_through
            n = 0
            find = self._commitlog.queue.find
            hashers = self._index_hashers
            put = svc.put_hashes
            # PREPARED (4) and ROLLBACK (12) have this bit, NOT_TYPE (0) and COMMIT (8) not
            half_bit = MessageSysFlag.TRANSACTION_PREPARED_TYPE
            if max_records > 0:
                stop_at = max_records
            else:
                stop_at = -1
            while start < limit and n != stop_at:
                mf = find(start)
                if mf is None:
                    break
                view = mf.view
                pos = start - mf.start
                total, magic = unpack_size_magic(view, pos)
                if magic != MESSAGE_MAGIC_CODE:
                    if magic == BLANK_MAGIC_CODE:
                        start = mf.end
                        continue
                    log.error("index build stopped at %d: no record there", start)
                    break
                if start > done_through:
                    sys_flag, store_ts, topic_b, props = index_fields_at(view, pos)
                    if props and not sys_flag & half_bit:
                        keys = _raw_keys(props)
                        if keys:
                            hasher = hashers.get(topic_b)
                            if hasher is None:
                                hasher = hashers[topic_b] = _KeyHasher(topic_b.decode("utf-8", "replace"))
                            put([hasher(k) for k in keys], start, store_ts)
                start += total
                n += 1
                if not n % GIL_YIELD_EVERY:
                    # The build runs on the flush thread; in long stretches of pure Python it
                    # would keep the GIL for the interpreter's whole switch interval (5 ms)
                    # each time the event loop let go of it for a socket call: consume and
                    # send p99 went from ~1.5 to ~10 ms. Hand it over every few records.
                    _sleep(0)
            self._index_from = start
            svc.expire(self._commitlog.min_offset)
            return n

    def _flush_index(self) -> int:
        """Flush's hook: catch up, fdatasync; the checkpoint's indexMsgTimestamp."""
        if self._index is None:
            return 0
        try:
            self._index_catch_up(self.config.index_build_batch)
            with self._index.lock:
                self._index_flushed_ts = self._index.flush()
        except OSError as e:
            # The index is rebuilt from the commit log (recovery deletes index files newer
            # than the checkpoint's indexMsgTimestamp), so a file that cannot be created or
            # synced never stops sends: log it (once per interval), keep the last good
            # timestamp in the checkpoint, and try again at the next flush.
            self._note_transient("build or flush the message index", e)
        return self._index_flushed_ts

    def query_message(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int) -> QueryMessageResult:
        """Offsets of the records of `topic` with `key` among their KEYS or as their
        UNIQ_KEY, stored in [begin_ms, end_ms], newest first, at most
        min(max_num, max_msgs_num_batch)."""
        svc = self._index
        if svc is None or not self._open:
            return QueryMessageResult([], 0, 0)
        self._index_catch_up(self.config.index_build_batch)
        max_num = min(max_num, self.config.max_msgs_num_batch)
        out: list[int] = []
        with svc.lock:
            if max_num > 0:
                for phy in svc.candidates(f"{topic}#{key}", begin_ms, end_ms):
                    if self._record_has_key(phy, topic, key, begin_ms, end_ms) and phy not in out:
                        out.append(phy)
                        if len(out) >= max_num:
                            break
            ts, phy = svc.last_update
        return QueryMessageResult(out, ts, phy)

    def _record_has_key(self, phy: int, topic: str, key: str, begin_ms: int, end_ms: int) -> bool:
        size = self._commitlog.record_size_at(phy)
        if size < 0:
            return False              # expired with its segment, or a stale entry
        view = self._commitlog.read(phy, size)
        if view is None:
            return False
        m = decode_record(view, decompress=False)
        if m.topic != topic or not begin_ms <= m.store_timestamp <= end_ms or not _indexed(m.sys_flag):
            return False
        props = m.properties
        if props.get(UNIQ_KEY) == key:
            return True
        keys = props.get(KEYS)
        return bool(keys) and key in keys.split(KEY_SEPARATOR)
