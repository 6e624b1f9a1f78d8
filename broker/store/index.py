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

Who builds it: not the put path (it stays as fast as without an index). `_index_catch_up`
walks the records the dispatcher has passed (below `reput_from`) from the index's own
progress point. Like Java's reput thread, the index keeps pace with the dispatcher: the
broker's event loop calls `index_some` right behind it, a loop turn at a time
(broker/services/index_pump.py, once `index_backlog_bytes` reaches 4 KiB, or after every
dispatch while the broker has its CPU to itself; a few records are then taken one at a
time, `_index_few`); the tail
below that, and whatever a restart left, is walked on each `flush_consume_queues` (the
flush thread, every second) and before each query, at most `index_build_batch` (broker
key indexBuildBatchNums, 20,000) records per call; at open it indexes everything missing.
A query sees what is indexed so far, as with Java (the answer's indexLastUpdatePhyoffset
says how far). Prepared and rolled-back transaction
halves are not indexed (Java's rule).

How (`_index_records`): one pass over each commit-log segment's mapping. A run of
records of the common layout (IPv4 hosts, not a transaction half) is gathered with one
unpack of each head, and its keys taken column-wise (`_run_keys`: topics and properties
sliced in C loops; UNIQ_KEY and KEYS by one property_slots split when the texts share a
layout, else by one regex per text); any other record alone, as before. Every
GIL_YIELD_EVERY records the keys gathered are hashed (`_key_hashes`: C loops over
per-topic memos of `topic#head` and a table of two-byte tails; keys of one head and topic,
a producer batch's UNIQ_KEYs, from that head's hash and a table of byte pairs read from
strided slices) and written (`_put_entries`: the entries, consecutive in the file, as one
array, the offsets' words split by stride, the slots in one C loop, the header once; a
hint's keys hashed at once, `_counter_run` below, are written at once, after the keys
gathered before them, and the progress point moved past them),
then the GIL is handed over (on the flush thread only:
a `time.sleep(0)` costs ~80 µs of wall time on this project's VMs, and on the event loop
nothing waits for the GIL). The bytes are those of the plain one-key-at-a-time builder it
replaced (tests/support/index_reference.py), pinned by tests/unit/test_index_fast.py.

IndexHint: a batch stored column-wise (append._put_uniform) also leaves the index its
columns, `(commit-log offset, record size, record count, topic bytes, properties texts as
stored, store time)`, in a bounded deque (`MessageStore._index_hints`), as Java's
dispatcher hands its index a DispatchRequest instead of the index reading the log. The
walk takes a hint when it reaches exactly its offset and the first and last record there
have its size, store time and the common layout (anything else: the records are walked,
the hint dropped); reading the records back was a third of the index's cost per record
(the broker's batch send: 6.4-6.8 -> 5.1-5.2 µs of CPU a message, docs/benchmarks.md).
A hint whose texts are one text but the last four bytes of its UNIQ_KEY value (the
producer's coalesced sends: one head, a counter's hex digits) has its keys hashed at once
from strided slices of the texts joined (`_counter_run`), not split into properties per
record (bench_index.py --behind 32 --batch-put: 1.91 -> 1.63-1.73 µs of CPU a record).
Pinned to the walk by tests/unit/test_index_hints.py. (The loop thread appends, the
index's holder of svc.lock pops; an append to a full deque may drop the hint the other
thread is looking at: the walk reads each hint once, so it uses the one it checked, and
pops only that one.) A bounded step (`max_records`) stops before a hint it cannot take
whole; one that starts at a hint takes it whole and stops there.

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
import re
import struct
import sys
import threading
import time
from array import array
from collections import deque
from itertools import chain, repeat
from operator import add, floordiv, getitem, itemgetter, mod, mul, sub
from datetime import datetime
from typing import Iterator

from pocketmq.broker.store.api import QueryMessageResult
from pocketmq.protocol.message import (BLANK_MAGIC_CODE, HOST_V6_FLAGS, KEY_SEPARATOR, KEYS, MAX_INT,
                                       MESSAGE_MAGIC_CODE, NAME_VALUE_SEPARATOR, POS_SYSFLAG, PROPERTY_SEPARATOR,
                                       UNIQ_KEY, MessageSysFlag, decode_record, head_struct, java_string_hash,
                                       property_slots, store_timestamp_pos, unpack_size_magic)

__all__ = ["INDEX_HEADER_SIZE", "INDEX_SLOT_SIZE", "INDEX_ENTRY_SIZE", "IndexFile", "IndexService",
           "IndexPart", "index_key_hash", "index_file_size", "index_file_name", "message_index_keys"]


# records indexed between two GIL hand-overs (about 0.1-0.2 ms of work)
GIL_YIELD_EVERY = 64
# IndexHints kept (one per batch stored column-wise; the index takes them right behind
# the dispatcher, a loop turn later): a bound, not a working size. The oldest go first:
# the walk covers them. A batch whose properties texts add up to more than
# INDEX_HINT_BYTES_MAX gets no hint (bounded memory: at most 64 x 64 KiB held).
INDEX_HINTS_MAX = 64
INDEX_HINT_BYTES_MAX = 64 * 1024
_sleep = time.sleep
log = logging.getLogger("pocketmq.store")

_HEADER = struct.Struct(">qqqqii")
_SLOT = struct.Struct(">i")
_SLOT_U = struct.Struct(">I")       # a slot read back (any bits: a damaged one is > MAX_INT)
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


# String.hashCode is the polynomial sum(c[i] * 31^(n-1-i)) mod 2^32, so for a key split
# as head + tail, hash(head + tail) = hash(head) * 31^len(tail) + hash(tail). The build
# hashes `topic#key` as hash("topic#" + key[:-2]) * 31^2 + hash(key[-2:]): the tail from
# a table of every ASCII pair, `topic#` + head memoized per topic (_TopicHashes), itself
# from its own head and tail on a miss. A client msgId (UNIQ_KEY) is 32 hex digits of
# which only the last few change from one message to the next, and words of KEYS share
# their heads as often: per key that is C loops over dict hits, no loop over characters.
_MASK = 0xFFFFFFFF
_POW_N = 256                     # heads longer than this are hashed directly (no recursion)
_POW31_2 = 31 * 31
_HEAD_HASHES_MAX = 4096          # memoized heads per topic (cleared when full: a bounded memory)
_TOPIC_MEMOS_MAX = 1024          # topics with a memo (all dropped when full)


def _poly_hash(b: bytes) -> int:
    """Unsigned Java hashCode (mod 2^32) of ASCII bytes."""
    h = 0
    for c in b:
        h = (31 * h + c) & _MASK
    return h


class _TailHashes(dict):
    """The hash of every string of at most two ASCII bytes (16,513 of them, made at
    import); other bytes (from non-ASCII keys, whose hashes are taken another way) are
    computed on demand."""

    __slots__ = ()

    def __missing__(self, k: bytes) -> int:
        return _poly_hash(k)


_TAIL_HASHES = _TailHashes({b"": 0})
_TAIL_HASHES.update((bytes((a,)), a) for a in range(128))
_TAIL_HASHES.update((bytes((a, b)), a * 31 + b) for a in range(128) for b in range(128))


class _TopicHashes(dict):
    """One topic's memo: ASCII head bytes -> unsigned hash of `topic#head` (mod 2^32). The
    empty head is `topic#` itself; a miss is its own head's hash (usually known) * 31^2 +
    its last two bytes' (the table); heads longer than _POW_N are hashed directly.
    Cleared when full (bounded memory)."""

    __slots__ = ()

    def __missing__(self, k: bytes) -> int:
        n = len(k)
        if n > _POW_N:
            h = (self[b""] * pow(31, n, 1 << 32) + _poly_hash(k)) & _MASK
        elif n == 1:
            h = (self[b""] * 31 + k[0]) & _MASK
        else:
            h = (self[k[:-2]] * _POW31_2 + _TAIL_HASHES[k[-2:]]) & _MASK
        if len(self) >= _HEAD_HASHES_MAX:
            prefix = self[b""]
            self.clear()
            self[b""] = prefix
        self[k] = h
        return h


def _topic_hashes(topic: bytes) -> _TopicHashes:
    """A new memo for a topic (as the record stores it, any characters)."""
    return _TopicHashes({b"": java_string_hash(topic.decode("utf-8", "replace") + "#") & _MASK})


def _key_hash_slow(topic: bytes, key: bytes) -> int:
    """index_key_hash of topic#key from the stored bytes (non-ASCII keys: UTF-16 units)."""
    return index_key_hash(f"{topic.decode('utf-8', 'replace')}#{key.decode('utf-8', 'replace')}")


def index_file_size(slot_num: int, index_num: int) -> int:
    return INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE + index_num * INDEX_ENTRY_SIZE


def index_file_name(timestamp_ms: int) -> str:
    """Java's UtilAll.timeMillisToHumanString: yyyyMMddHHmmssSSS in local time."""
    t = datetime.fromtimestamp(timestamp_ms / 1000.0)
    return "%04d%02d%02d%02d%02d%02d%03d" % (t.year, t.month, t.day, t.hour, t.minute, t.second,
                                             timestamp_ms % 1000)


# KEYS and UNIQ_KEY of a record in one pass over its properties as stored: every
# name\x01value chunk named one of them, the last one of each name winning (Java's
# HashMap.put while parsing; the same answer as property_getter's rfind). A value runs to
# the next \x02 (it may hold \x01); an empty value is no key.
_KEYS_B = KEYS.encode()
_UNIQ_B = UNIQ_KEY.encode()
_KEY_SEPARATOR_B = KEY_SEPARATOR.encode()
_KEY_PROPS = re.compile(b"(?:^|" + re.escape(PROPERTY_SEPARATOR.encode()) + b")(" + re.escape(_UNIQ_B) + b"|"
                        + re.escape(_KEYS_B) + b")" + re.escape(NAME_VALUE_SEPARATOR.encode()) + b"([^"
                        + re.escape(PROPERTY_SEPARATOR.encode()) + b"]*)")
_find_key_props = _KEY_PROPS.findall


def _raw_keys(props: bytes) -> list[bytes]:
    """The index keys of one record, on its properties as stored, without the topic:
    UNIQ_KEY then each non-empty KEYS word (Java's buildIndex order)."""
    return _found_keys(dict(_find_key_props(props)))


def _found_keys(found: dict) -> list[bytes]:
    """_raw_keys from the regex's finds (name -> value, the last of each name)."""
    k = found.get(_UNIQ_B)
    ks = [k] if k else []
    k = found.get(_KEYS_B)
    if k:
        words = k.split(_KEY_SEPARATOR_B)
        ks += words if b"" not in words else [w for w in words if w]
    return ks


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

    def put_keys(self, hashes: list[int], phy: int, store_ts: int) -> int:
        """Add one record's keys (Java putKey, per key); returns how many fit (the build
        adds many records' keys at once with _put_entries, which this calls)."""
        n = min(len(hashes), self.index_num - self.index_count)
        if n > 0:
            _put_entries(self, hashes[:n], [phy] * n, [store_ts] * n)
        return max(n, 0)

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
        self.keys_added = 0                       # entries the build has written (open's log)

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


# ---------------------------------------------------------------------- the build

_U32 = "I" if array("I").itemsize == 4 else "L"
_SWAP = sys.byteorder == "little"        # the files are big-endian; arrays are native


def _slim_head(sys_flag: int) -> tuple[struct.Struct, int]:
    """(TOTALSIZE, MAGICCODE, SYSFLAG, STORETIMESTAMP, BODYLENGTH) of a record with these
    host sizes in one unpack, and the size of its head (protocol's positions)."""
    head = head_struct(sys_flag)
    ts_pos = store_timestamp_pos(sys_flag)
    fmt = ">ii%dxi%dxq%dxi" % (POS_SYSFLAG - 8, ts_pos - POS_SYSFLAG - 4, head.size - 4 - ts_pos - 8)
    slim = struct.Struct(fmt)
    assert slim.size == head.size
    return slim, head.size


_BORN_V6 = MessageSysFlag.BORNHOST_V6_FLAG
_STORE_V6 = MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
_SLIM_HEADS = {flag: _slim_head(flag) for flag in (0, _BORN_V6, _STORE_V6, _BORN_V6 | _STORE_V6)}


_HEAD_OF = itemgetter(slice(None, -2))
_HEAD4_OF = itemgetter(slice(None, -4))
# hash of every two bytes (a, b) (ASCII: their Java hashCode, a * 31 + b; other bytes give
# keys whose hashes are taken another way), indexed by the native 16-bit word of a, b
# (little-endian: a + 256 * b); built by one comprehension, at import (~3 ms)
_PAIR_HASHES = ([a * 31 + b for b in range(256) for a in range(256)] if sys.byteorder == "little"
                else [a * 31 + b for a in range(256) for b in range(256)])
_PAIR_HASHES_31_2 = [h * _POW31_2 for h in _PAIR_HASHES]
_POW31_4 = 31 ** 4
_TAIL_OF = itemgetter(slice(-2, None))
_ZERO_WORD = array(_U32, [0])


def _key_hashes(keys: list[bytes], memos: list) -> list[int]:
    """keyHash (abs of Java's hashCode of topic#key, MIN_VALUE -> 0) of non-empty ASCII
    keys, each with its topic's memo, in C loops over the list:
    hash(topic# + key[:-2]) * 31^2 + hash(key[-2:]), taken mod 2^32 and as a Java int
    by reading the low half of each 64-bit sum as a signed 32-bit word.

    Keys of one topic that differ only in their last four bytes (one producer's batch:
    a UNIQ_KEY is a fixed head and a counter's four hex digits) share one head's hash:
    hash(topic# + head) * 31^4 + hash(tail's first pair) * 31^2 + hash(its second pair),
    the pairs read as 16-bit words from strided slices of the keys joined (every key is
    then len(head) + 4 bytes long) and looked up in a table of all 65,536 pairs."""
    m = len(keys)
    if not m:
        return []
    heads = list(map(_HEAD4_OF, keys))
    head = heads[0]
    if head and heads.count(head) == m and memos.count(memos[0]) == m:
        size = len(head) + 4
        return _tail_hashes(memos[0][head], b"".join(keys), size - 4, size, m)
    sums = array("Q", map(add, map(mul, map(getitem, memos, map(_HEAD_OF, keys)), repeat(_POW31_2)),
                          map(_TAIL_HASHES.__getitem__, map(_TAIL_OF, keys))))
    if 1 in map(len, keys):                     # a one-byte key: hash(topic#) * 31 + its byte
        for j, k in enumerate(keys):
            if len(k) == 1:
                sums[j] = (memos[j][b""] * 31 + k[0]) & _MASK
    return _key_hashes_of_sums(sums)


def _tail_hashes(head_hash: int, joined: bytes, at: int, stride: int, m: int) -> list[int]:
    """keyHash of m ASCII keys `head + tail` of one topic, from the unsigned hash of
    `topic#head` and the tails: the four bytes at `at`, `at + stride`, ... of `joined`
    (read by strided slices as two 16-bit words each, looked up in the pair tables)."""
    pairs = bytearray(4 * m)          # the tails' first pairs, then their second pairs
    pairs[0:2 * m:2] = joined[at::stride]
    pairs[1:2 * m:2] = joined[at + 1::stride]
    pairs[2 * m::2] = joined[at + 2::stride]
    pairs[2 * m + 1::2] = joined[at + 3::stride]
    words = array("H", pairs)
    return _key_hashes_of_sums(array("Q", map(add, map(add, map(_PAIR_HASHES_31_2.__getitem__, words[:m]),
                                                        map(_PAIR_HASHES.__getitem__, words[m:])),
                                               repeat(head_hash * _POW31_4 & _MASK))))


def _key_hashes_of_sums(sums: array) -> list[int]:
    """Unsigned 64-bit sums -> keyHash: the low word of each as a Java int, its abs
    (Integer.MIN_VALUE -> 0)."""
    out = list(map(abs, memoryview(sums).cast("B").cast("i")[_LOW_WORD::2]))
    if _MIN_ABS in out:                                      # abs(Integer.MIN_VALUE): Java's 0
        out = [0 if x == _MIN_ABS else x for x in out]
    return out


_LOW_WORD = 0 if sys.byteorder == "little" else 1
_HIGH_WORD = 1 - _LOW_WORD
_MIN_ABS = 1 << 31


def _put_entries(f: IndexFile, hashes: list[int], phys: list[int], tss: list[int]) -> None:
    """Java putKey for each key in order, into f, which has room for all of them: the
    entries (consecutive) as one array, the slots in one C loop, the header once. The
    chain needs each slot's previous entry: read from the file for all keys at once; a
    slot met twice in this call (rare with Java's 5M slots) or an out-of-range slot value
    (a damaged file) takes the per-key path, the same rule one key at a time."""
    m = len(hashes)
    idx0 = f.index_count
    slot_num = f.slot_num
    if idx0 <= 1:
        f.begin_ts = tss[0]
        f.begin_phy = phys[0]
    begin_ts = f.begin_ts
    slot_of = list(map(mod, hashes, repeat(slot_num)))
    view = memoryview(f.mm)
    try:
        slots = view[INDEX_HEADER_SIZE:INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE].cast(_U32)
        try:
            prevs = array(_U32, map(slots.__getitem__, slot_of))
            if _SWAP:
                prevs.byteswap()
            if max(prevs) <= idx0 and len(set(slot_of)) == m:
                new_slots = prevs.count(0)
            else:
                new_slots = 0
                seen: dict[int, int] = {}
                for j, s in enumerate(slot_of):
                    idx = idx0 + j
                    prev = seen.get(s)
                    if prev is None:
                        prev = prevs[j]
                        if prev > MAX_INT or prev == 0 or prev > idx:    # <= 0 as a Java int, or ahead
                            prev = 0
                            new_slots += 1
                    prevs[j] = prev
                    seen[s] = idx
            ts0 = tss[0]
            if begin_ts <= 0:
                diffs = _ZERO_WORD * m
            elif tss.count(ts0) == m and 0 <= ts0 - begin_ts < MAX_INT * 1000:
                # one store time (a batch's records, or a run stored within a millisecond)
                diffs = array(_U32, [(ts0 - begin_ts) // 1000]) * m
            elif min(tss) >= begin_ts and max(tss) - begin_ts < MAX_INT * 1000:
                diffs = array(_U32, map(floordiv, map(sub, tss, repeat(begin_ts)), repeat(1000)))
            else:       # a store time before the file's first, or 68 years after: clamped
                diffs = array(_U32, [min(max((ts - begin_ts) // 1000, 0), MAX_INT) for ts in tss])
            ents = _ZERO_WORD * (5 * m)
            ents[0::5] = array(_U32, hashes)
            # phyOffset's two words: the offsets as native 64-bit words, split by stride
            words = memoryview(array("Q", phys)).cast("B").cast(_U32)
            ents[1::5] = array(_U32, words[_HIGH_WORD::2].tobytes())
            ents[2::5] = array(_U32, words[_LOW_WORD::2].tobytes())
            ents[3::5] = diffs
            ents[4::5] = prevs
            numbers = array(_U32, range(idx0, idx0 + m))
            if _SWAP:
                ents.byteswap()
                numbers.byteswap()
            pos = INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE + idx0 * INDEX_ENTRY_SIZE
            view[pos:pos + m * INDEX_ENTRY_SIZE] = memoryview(ents).cast("B")
            deque(map(slots.__setitem__, slot_of, numbers), maxlen=0)   # in order: a slot's last entry stays
        finally:
            slots.release()
    finally:
        view.release()
    f.index_count = idx0 + m
    f.slot_count += new_slots
    f.end_ts = tss[-1]
    f.end_phy = phys[-1]
    f._write_header()


def _write_entries(svc: "IndexService", hashes: list[int], phys: list[int], tss: list[int]) -> None:
    """Keys' entries (their hashes, records' offsets and store times, in commit-log order)
    put into the active file, a new one started whenever it fills."""
    a = 0
    m = len(hashes)
    while a < m:
        f = svc._active(tss[a])               # the last file, or a new one when it is full
        b = min(m, a + f.index_num - f.index_count)
        _put_entries(f, hashes[a:b], phys[a:b], tss[a:b])
        if f not in svc._dirty:
            svc._dirty.append(f)
        a = b
    svc.keys_added += m


def _counter_run(memo: "_TopicHashes", props: list[bytes], m: int) -> tuple[list[int], int] | None:
    """The keys of an IndexHint's records hashed at once when their properties texts are
    one ASCII text but for the last four bytes of its UNIQ_KEY value (a producer's batch:
    a head and a counter's hex digits, _send_group): (the hashes, record by record in
    _found_keys' order, and the keys each record has), else None (then _keys_of_run).
    The texts are then one length and equal outside those bytes, which hold no property
    separator: every text has the first text's properties, its UNIQ_KEY (the last of the
    name) one head and one tail of four bytes, read from strided slices (_tail_hashes);
    KEYS words, the same in every text, are hashed once."""
    t0 = props[0]
    found = dict(_find_key_props(t0))
    uniq = found.get(_UNIQ_B)
    if not uniq or len(uniq) < 5 or not t0.isascii():
        return None
    at = t0.rfind(_SEP_UNIQ_PROP)             # the last UNIQ_KEY property (a value holds no \x02)
    if at >= 0:
        v0 = at + len(_SEP_UNIQ_PROP)
    elif t0.startswith(_UNIQ_PROP):
        v0 = len(_UNIQ_PROP)
    else:
        return None
    v1 = t0.find(_SEP, v0)              # (t0[v0:v1] is the regex's last UNIQ_KEY value: uniq)
    if v1 < 0:
        v1 = len(t0)
    size = len(t0)
    joined = b"".join(props)
    if len(joined) != m * size:
        return None
    tail_at = v1 - 4
    if m > 1:
        if list(map(itemgetter(slice(None, tail_at)), props)).count(t0[:tail_at]) != m \
                or list(map(itemgetter(slice(v1, None)), props)).count(t0[v1:]) != m:
            return None
        for j in range(tail_at, v1):
            column = joined[j::size]
            if _SEP in column or not column.isascii():
                return None
    hashes = _tail_hashes(memo[uniq[:-4]], joined, tail_at, size, m)
    words = _found_keys(found)[1:]
    if not words:
        return hashes, 1
    word_hashes = _key_hashes(words, [memo] * len(words))
    return list(chain.from_iterable(map(add, map(list, zip(hashes)), repeat(word_hashes)))), 1 + len(words)


def _new_memo(memos: dict, topic: bytes) -> "_TopicHashes":
    """A topic's memo made and kept (all dropped first when _TOPIC_MEMOS_MAX are kept)."""
    if len(memos) >= _TOPIC_MEMOS_MAX:
        memos.clear()
    memo = memos[topic] = _topic_hashes(topic)
    return memo


_UNIQ_NAMES = (UNIQ_KEY,)
_UNIQ_PROP = _UNIQ_B + NAME_VALUE_SEPARATOR.encode()           # b"UNIQ_KEY\x01"
_UNIQ_NAME_OF = itemgetter(slice(None, len(_UNIQ_PROP)))
_SEP_UNIQ_PROP = PROPERTY_SEPARATOR.encode() + _UNIQ_PROP         # b"\x02UNIQ_KEY\x01"
_UNIQ_VALUE_OF = itemgetter(slice(len(_UNIQ_PROP), None))
_SEP = PROPERTY_SEPARATOR.encode()
_KEYS_NAME = _KEYS_B + NAME_VALUE_SEPARATOR.encode()                # b"KEYS\x01"
_KEYS_NAME_OF = itemgetter(slice(None, len(_KEYS_NAME)))
_KEYS_VALUE_OF = itemgetter(slice(len(_KEYS_NAME), None))
_UNIQ_KEYS_NAMES = (UNIQ_KEY, KEYS)
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_KEYS_PROP = _SEP + _KEYS_NAME                                     # b"\x02KEYS\x01"
_EMPTY_KEYS_PROP = _KEYS_PROP + _SEP                             # ... with an empty value
_STORE_TS_OF = itemgetter(3)            # of a slim head (_SLIM_HEADS)
_BODY_LEN_OF = itemgetter(4)


def _run_keys(mm, base: int, at: list, heads: list, end: int, head_size: int, memos: dict,
              keys: list, key_phys: list, key_tss: list, key_memos: list, slow: list) -> None:
    """The index keys of consecutive records of one head layout (`at`: their positions in
    the segment mapping `mm` at commit-log offset `base`, `heads`: their slim head unpacks,
    `end`: where the last one ends), appended to the chunk's columns as _index_records'
    loop does one record at a time, in C loops over the run: topics and properties sliced
    by the length fields; UNIQ_KEY and KEYS values by one property_slots split when the
    texts share a layout (one producer's messages, the common case), else by the regex on
    each text; then, when every record has a UNIQ_KEY and either no KEYS value or
    single-spaced KEYS words, the keys of all at once. Any other run (a record without a
    UNIQ_KEY, empty words, non-ASCII keys): _found_keys per record."""
    get = mm.__getitem__
    tpos = list(map(add, map(add, at, map(_BODY_LEN_OF, heads)), repeat(head_size)))   # TOPICLENGTH
    tlens = list(map(get, tpos))
    t1 = list(map(add, tpos, repeat(1)))
    topics = list(map(get, map(slice, t1, map(add, t1, tlens))))
    # PROPERTIES (after its 2-byte length) runs to the record's end: the next record's start
    props = list(map(get, map(slice, map(add, map(add, t1, tlens), repeat(2)), at[1:] + [end])))
    _keys_of_run(topics, props, list(map(add, at, repeat(base))), list(map(_STORE_TS_OF, heads)), memos,
                 keys, key_phys, key_tss, key_memos, slow)


def _keys_of_run(topics: list, props: list, phys: list, tss: list, memos: dict, keys: list, key_phys: list,
                 key_tss: list, key_memos: list, slow: list) -> None:
    """_run_keys' second half, from the run's columns (each record's topic and properties
    as stored, commit-log offset, store time): what a put's IndexHint hands over without
    reading the records back."""
    m = len(props)
    topic = topics[0]
    if topics.count(topic) == m:
        memo = memos.get(topic)
        run_memos = [memo if memo is not None else _new_memo(memos, topic)] * m
    else:
        run_memos = [memos.get(t) or _new_memo(memos, t) for t in topics]
    # Each text's UNIQ_KEY and KEYS values (None: absent): for texts of one layout (ASCII)
    # by one property_slots split, else by the regex on each (the last of a name wins).
    joined = _SEP + _SEP.join(props) + _SEP
    ascii_run = joined.isascii()
    keys_valued = joined.count(_KEYS_PROP) != joined.count(_EMPTY_KEYS_PROP)
    uniqs = kvals = founds = None
    if ascii_run:
        if not keys_valued:
            slots = property_slots(props, _UNIQ_NAMES)
            if slots is not None and list(map(_UNIQ_NAME_OF, slots)).count(_UNIQ_PROP) == m:
                uniqs = list(map(_UNIQ_VALUE_OF, slots))
        else:
            slots = property_slots(props, _UNIQ_KEYS_NAMES)
            if slots is not None:
                us = list(map(_FIRST, slots))
                ks = list(map(_SECOND, slots))
                if list(map(_UNIQ_NAME_OF, us)).count(_UNIQ_PROP) == m \
                        and list(map(_KEYS_NAME_OF, ks)).count(_KEYS_NAME) == m:
                    uniqs = list(map(_UNIQ_VALUE_OF, us))
                    kvals = list(map(_KEYS_VALUE_OF, ks))
    if uniqs is None:
        founds = list(map(dict, map(_find_key_props, props)))
        uniqs = list(map(dict.get, founds, repeat(_UNIQ_B)))
        if keys_valued:
            kvals = list(map(dict.get, founds, repeat(_KEYS_B)))
    kss = None
    if None not in uniqs and b"" not in uniqs:
        if not keys_valued:             # one key a record, its UNIQ_KEY (one producer's messages)
            if ascii_run:
                keys += uniqs
                key_phys += phys
                key_tss += tss
                key_memos += run_memos
                return
        elif None not in kvals and b"" not in kvals:
            # a UNIQ_KEY and single-spaced KEYS words each: [uniq] + words
            wordss = list(map(bytes.split, kvals, repeat(_KEY_SEPARATOR_B)))
            if b"" not in chain.from_iterable(wordss):
                kss = list(map(add, map(list, zip(uniqs)), wordss))
    if kss is None:                     # anything else: a record at a time
        if founds is None:
            founds = list(map(dict, map(_find_key_props, props)))
        kss = list(map(_found_keys, founds))
    counts = list(map(len, kss))
    first = len(keys)
    keys += chain.from_iterable(kss)
    c = counts[0]
    if counts.count(c) == m:            # as many keys each: each column's value c times
        key_phys += chain.from_iterable(zip(*(phys,) * c))
        key_tss += chain.from_iterable(zip(*(tss,) * c))
        key_memos += chain.from_iterable(zip(*(run_memos,) * c))
    else:
        key_phys += chain.from_iterable(map(repeat, phys, counts))
        key_tss += chain.from_iterable(map(repeat, tss, counts))
        key_memos += chain.from_iterable(map(repeat, run_memos, counts))
    if not ascii_run:                   # (key number, topic, key) of each non-ASCII key
        j = first
        for topic, ks in zip(topics, kss):
            for k in ks:
                if not k.isascii():
                    slow.append((j, topic, k))
                j += 1


def _hint_holds(mm, pos: int, size: int, m: int, ts: int, unpack, magic_code: int, odd_bits: int) -> bool:
    """An IndexHint's m records of `size` bytes at `pos` are there: the first and the last
    have that size, the magic code, IPv4 hosts, no transaction-half bit and the hint's
    store time (what the put wrote; the hint's own columns say the rest)."""
    for p in (pos, pos + (m - 1) * size):
        try:
            total, magic, sys_flag, store_ts, _ = unpack(mm, p)
        except struct.error:
            return False
        if total != size or magic != magic_code or sys_flag & odd_bits or store_ts != ts:
            return False
    return True


def _index_records(store, svc: "IndexService", find, start: int, limit: int, max_records: int,
                   done_through: int, memos: dict, chunk: int, hints=None, hand_over: bool = False) -> int:
    """Index the records from `start` to `limit`, at most max_records (< 0: all), moving
    store._index_from along; returns the records walked. One pass over each commit-log
    segment's mapping: runs of records of the common layout gathered with one unpack of
    each head and their keys taken column-wise (_run_keys), any other record alone (its
    properties sliced by the lengths, its keys found by one regex); records an IndexHint
    describes (`hints`, the deque of MessageStore._index_hints) taken from it instead of
    read back (_hint_holds, _keys_of_run); every `chunk` records the keys gathered are
    hashed and written (_key_hashes, _put_entries) and, with hand_over (the flush thread's
    pass), the GIL is handed over."""
    find_keys = _find_key_props
    slim_v4, head_v4 = _SLIM_HEADS[0]
    slim_heads = _SLIM_HEADS
    unpack_v4 = slim_v4.unpack_from
    magic_code = MESSAGE_MAGIC_CODE
    half_bit = MessageSysFlag.TRANSACTION_PREPARED_TYPE   # PREPARED (4), ROLLBACK (12): not indexed
    v6_bits = HOST_V6_FLAGS
    odd_bits = half_bit | v6_bits
    n = 0
    stopped = False
    keys: list[bytes] = []               # the chunk's keys, and per key its record's
    key_phys: list[int] = []             # commit-log offset,
    key_tss: list[int] = []              # store time,
    key_memos: list = []                 # topic memo (_TopicHashes)
    slow: list[tuple[int, bytes, bytes]] = []     # (key number, topic, key) of non-ASCII keys

    def flush_chunk() -> None:
        hashes = _key_hashes(keys, key_memos)
        for j, topic, k in slow:                 # non-ASCII keys
            hashes[j] = _key_hash_slow(topic, k)
        _write_entries(svc, hashes, key_phys, key_tss)
        keys.clear()
        key_phys.clear()
        key_tss.clear()
        key_memos.clear()
        slow.clear()

    def yield_now(at: int) -> None:
        """A chunk's end: its keys written, progress recorded at `at`, the GIL handed over."""
        if keys:
            flush_chunk()
        store._index_from = at
        # The build runs on the flush thread; in long stretches of pure Python it
        # would keep the GIL for the interpreter's whole switch interval (5 ms)
        # each time the event loop let go of it for a socket call: consume and
        # send p99 went from ~1.5 to ~10 ms. Hand it over every chunk. Not on the
        # event loop (IndexPump): nothing waits for the GIL there, and a sleep(0)
        # takes ~80 µs of wall time on this project's VMs (a timer armed and fired).
        if hand_over:
            _sleep(0)

    next_yield = chunk                  # the record count at which the next chunk ends
    # the records this call may walk (a hint taken whole, at the call's start, may pass it)
    n_max = max_records if max_records >= 0 else 1 << 62
    paused = False
    pos = base = 0
    while start < limit and n < n_max and not stopped and not paused:
        mf = find(start)
        if mf is None:
            break
        mm = mf.mm
        base = mf.start
        pos = start - base
        end = min(limit - base, mf.size)
        while pos < end and n < n_max:
            if hints and base + pos > done_through:
                # The records a put described (IndexHint): their columns as the put had
                # them, not read back; anything about them in doubt, the walk below.
                while hints and hints[0][0] < base + pos:
                    hints.popleft()         # walked already (or never to be met again)
                # One read of the hint: the loop thread's append to a full deque may drop it
                # meanwhile (another thread's put, between two reads), and a second read
                # would be the next hint, checked against these records' offset by nobody.
                h = hints[0] if hints else None
                if h is not None and h[0] == base + pos:
                    _, size, m, topic, props, ts = h
                    if pos + m * size <= end and _hint_holds(mm, pos, size, m, ts, unpack_v4, magic_code,
                                                             odd_bits):
                        if n and n + m > n_max:
                            paused = True   # the next call takes them whole
                            break
                        if hints and hints[0] is h:
                            hints.popleft()
                        phy = base + pos
                        memo = memos.get(topic) or _new_memo(memos, topic)
                        run = _counter_run(memo, props, m)
                        if run is None:
                            _keys_of_run([topic] * m, props, list(range(phy, phy + m * size, size)), [ts] * m,
                                         memos, keys, key_phys, key_tss, key_memos, slow)
                        else:
                            # hashed already: written now, after the keys before them, and the
                            # progress point moved past them at once (a failure later in this
                            # call must not have a retry write them again)
                            if keys:
                                flush_chunk()
                            hashes, c = run
                            physs = range(phy, phy + m * size, size)
                            _write_entries(svc, hashes, list(physs) if c == 1
                                           else list(chain.from_iterable(zip(*(physs,) * c))), [ts] * (m * c))
                            store._index_from = phy + m * size
                        n += m
                        pos += m * size
                        if n >= next_yield:
                            next_yield = n - n % chunk + chunk
                            yield_now(base + pos)
                        continue
            # A run of records of the common layout (IPv4 hosts, not a transaction half,
            # past done_through), up to the chunk's end: gathered with one unpack each,
            # their keys then taken column-wise (_run_keys). Anything else, one record below.
            heads = None
            if base + pos > done_through:
                want = next_yield - n
                if n_max - n < want:
                    want = n_max - n
                run_end = end
                if hints and hints[0][0] - base < end:
                    run_end = hints[0][0] - base    # the run stops where described records start
                heads = []
                at = []
                p = pos
                for _ in repeat(None, want):
                    if p >= run_end:
                        break
                    try:
                        h = unpack_v4(mm, p)
                    except struct.error:
                        break
                    if h[1] != magic_code or h[2] & odd_bits:
                        break
                    heads.append(h)
                    at.append(p)
                    p += h[0]
            if heads:
                _run_keys(mm, base, at, heads, p, head_v4, memos, keys, key_phys, key_tss, key_memos, slow)
                n += len(heads)
                pos = p
            else:
                try:
                    total, magic, sys_flag, ts, body_len = unpack_v4(mm, pos)
                    head_size = head_v4
                except struct.error:         # fewer bytes left than a head: a blank marker
                    total, magic = unpack_size_magic(mm, pos)
                    if magic == magic_code:
                        magic = 0            # no record is that short
                if magic != magic_code:
                    if magic == BLANK_MAGIC_CODE:
                        pos = mf.size        # the segment's end: the next one
                        break
                    log.error("index build stopped at %d: no record there", base + pos)
                    stopped = True
                    break
                phy = base + pos
                if phy > done_through and not sys_flag & half_bit:
                    if sys_flag & v6_bits:
                        slim, head_size = slim_heads[sys_flag & v6_bits]
                        total, magic, sys_flag, ts, body_len = slim.unpack_from(mm, pos)
                    i = pos + head_size + body_len
                    tlen = mm[i]
                    props = mm[i + tlen + 3:pos + total]     # PROPERTIES: the record's last field
                    if props:
                        found = dict(find_keys(props))
                        if found:
                            ks = _found_keys(found)
                            if ks:
                                topic = mm[i + 1:i + 1 + tlen]
                                memo = memos.get(topic)
                                if memo is None:
                                    memo = _new_memo(memos, topic)
                                if not props.isascii():
                                    slow += [(len(keys) + j, topic, k) for j, k in enumerate(ks) if not k.isascii()]
                                c = len(ks)
                                keys += ks
                                if c == 1:
                                    key_phys.append(phy)
                                    key_tss.append(ts)
                                    key_memos.append(memo)
                                else:
                                    key_phys += [phy] * c
                                    key_tss += [ts] * c
                                    key_memos += [memo] * c
                pos += total
                n += 1
            if n >= next_yield:
                next_yield = n - n % chunk + chunk
                yield_now(base + pos)
        start = base + pos
    if keys:
        flush_chunk()
    store._index_from = start
    return n


# A step over a few records (the pump's, under sync sends: a record or two a dispatch):
# not through the walk's column-wise machinery, whose fixed cost (~18 µs a call:
# closures, column lists, array setup) is paid per call, but one record and one key at a
# time (_index_few, _put_key): ~4 µs a record against ~20 for a one-record walk. The
# bytes are the walk's (tests/unit/test_index_few.py).
FEW_BYTES_MAX = 2048
FEW_RECORDS_MAX = 8
_SLIM_V4, _HEAD_V4 = _SLIM_HEADS[0]
_UNPACK_V4 = _SLIM_V4.unpack_from
_FEW_ODD_BITS = MessageSysFlag.TRANSACTION_PREPARED_TYPE | HOST_V6_FLAGS
_ENTRIES_AT = INDEX_HEADER_SIZE       # + slot_num * INDEX_SLOT_SIZE: where entry 0 starts


def _put_key(f: IndexFile, h: int, phy: int, ts: int) -> None:
    """_put_entries for one key (Java putKey): f has room for it."""
    idx = f.index_count
    if idx <= 1:
        f.begin_ts = ts
        f.begin_phy = phy
    begin_ts = f.begin_ts
    mm = f.mm
    slot_num = f.slot_num
    slot_pos = INDEX_HEADER_SIZE + (h % slot_num) * INDEX_SLOT_SIZE
    prev = _SLOT_U.unpack_from(mm, slot_pos)[0]
    if prev == 0 or prev > idx:          # none, or not a Java int / ahead (a damaged slot)
        prev = 0
        f.slot_count += 1
    diff = 0 if begin_ts <= 0 else min(max((ts - begin_ts) // 1000, 0), MAX_INT)
    _ENTRY.pack_into(mm, _ENTRIES_AT + slot_num * INDEX_SLOT_SIZE + idx * INDEX_ENTRY_SIZE, h, phy, diff, prev)
    _SLOT.pack_into(mm, slot_pos, idx)
    f.index_count = idx + 1
    f.end_ts = ts
    f.end_phy = phy
    f._write_header()


def _index_few(store, svc: "IndexService", find, start: int, limit: int, max_records: int, memos: dict,
               hints) -> int | None:
    """Index the few records from `start` to `limit` (all past done_through) one at a
    time, as _index_records would; None, having changed nothing, when they are not all
    of the common layout (IPv4 hosts, not a transaction half) in one segment, or more
    than max_records: the walk takes them then."""
    mf = find(start)
    if mf is None:
        return None
    base = mf.start
    pos, end = start - base, limit - base
    if end > mf.size:               # (the blank marker at a segment's end would stop it too)
        return None
    mm = mf.mm
    recs = []
    while pos < end:
        if len(recs) >= max_records:
            return None
        try:
            total, magic, sys_flag, ts, body_len = _UNPACK_V4(mm, pos)
        except struct.error:
            return None
        if magic != MESSAGE_MAGIC_CODE or sys_flag & _FEW_ODD_BITS:
            return None
        i = pos + _HEAD_V4 + body_len
        tlen = mm[i]
        recs.append((base + pos, ts, i, tlen, pos + total))
        pos += total
    if pos != end:
        return None
    find_keys = _find_key_props
    for phy, ts, i, tlen, rec_end in recs:
        props = mm[i + tlen + 3:rec_end]       # PROPERTIES: the record's last field
        if not props:
            continue
        found = dict(find_keys(props))
        if not found:
            continue
        ks = _found_keys(found)
        if not ks:
            continue
        topic = mm[i + 1:i + 1 + tlen]
        memo = memos.get(topic)
        if memo is None:
            memo = _new_memo(memos, topic)
        for k in ks:
            if k.isascii():         # _key_hashes' sum, one key: abs of the low word as a Java int
                u = (memo[k[:-2]] * _POW31_2 + _TAIL_HASHES[k[-2:]] if len(k) > 1
                     else memo[b""] * 31 + k[0]) & _MASK
                h = u if u < _MIN_ABS else (0x100000000 - u) & MAX_INT
            else:
                h = _key_hash_slow(topic, k)
            f = svc._active(ts)
            _put_key(f, h, phy, ts)
            if f not in svc._dirty:
                svc._dirty.append(f)
        svc.keys_added += len(ks)
    store._index_from = limit
    while hints and hints[0][0] < limit:
        hints.popleft()             # described records walked here (a hint is only a shortcut)
    return len(recs)


class IndexPart:
    """MessageStore's index methods (a part of the MessageStore class: state in store.py)."""

    def _open_index(self, abnormal: bool, index_checkpoint_ts: int) -> None:
        """Recovery's hook: load the index, then index what it misses."""
        cfg = self.config
        if not cfg.message_index_enable:
            self._index = None
            self._index_hints = None
            return
        svc = IndexService(cfg.index_dir, cfg.max_hash_slot_num, cfg.max_index_num,
                           fdatasync=self._ops.fdatasync, fsync_dir=self._ops.fsync_dir)
        cl = self._commitlog
        resume, done_through = svc.load(abnormal, index_checkpoint_ts, cl.min_offset, cl.wrote_offset)
        self._index = svc
        self._index_hints = deque(maxlen=INDEX_HINTS_MAX)
        self._index_flushed_ts = index_checkpoint_ts
        self._index_hashers = {}
        self._index_done_through = done_through
        self._index_from = start = max(resume, cl.min_offset)
        before = svc.keys_added
        n = self._index_catch_up()
        # (the walk starts at the last record indexed, whose keys may continue in a new
        # file: after a clean stop it walks that one record and adds nothing)
        added = svc.keys_added - before
        if added or n > 1:
            log.info("index rebuilt from offset %d: %d records walked, %d keys added", start, n, added)

    def _close_index(self) -> None:
        svc = self._index
        if svc is not None:
            with svc.lock:
                svc.close()
            self._index = None
        self._index_hints = None

    def _index_catch_up(self, max_records: int = 0, hand_over: bool = False, blocking: bool = True) -> int:
        """Index the records between the index's progress point and the dispatch point,
        at most `max_records` of them (0: all; a batch's IndexHint, met first, is taken
        whole even if larger). Returns the number of records walked. Records below the
        dispatch point were checked by recovery or written by this process, so only their
        frame is read here. hand_over: hand the GIL over every GIL_YIELD_EVERY records, on
        the flush thread's pass only (the event loop's steps and queries, and the open,
        before the loop serves anything, have nobody to hand it to). blocking=False: 0 at
        once when another thread holds the index (the event loop's steps)."""
        svc = self._index
        if svc is None:
            return 0
        if not svc.lock.acquire(blocking):
            return 0
        try:
            start = max(self._index_from, self._commitlog.min_offset)
            self._index_from = start
            limit = self._reput_from
            n = None if start < limit else 0
            if n is None and limit <= start + FEW_BYTES_MAX and start > self._index_done_through:
                n = _index_few(self, svc, self._commitlog.queue.find, start, limit,
                               max_records if 0 < max_records < FEW_RECORDS_MAX else FEW_RECORDS_MAX,
                               self._index_hashers, self._index_hints)
            if n is None:
                n = _index_records(self, svc, self._commitlog.queue.find, start, limit,
                                   max_records if max_records > 0 else -1, self._index_done_through,
                                   self._index_hashers, GIL_YIELD_EVERY, self._index_hints, hand_over)
            svc.expire(self._commitlog.min_offset)
            return n
        finally:
            svc.lock.release()

    def index_backlog_bytes(self) -> int:
        """Commit-log bytes the dispatcher has passed that the index has not walked yet
        (0 with the index off). Cheap: the broker's loop asks after each dispatch."""
        if self._index is None:
            return 0
        return self._reput_from - self._index_from

    def index_some(self, max_records: int) -> int:
        """Index at most max_records of the backlog now; the number walked. The broker's
        IndexPump (broker/services/index_pump.py) calls it on the event loop right behind the
        dispatcher. A failure is transient (as in _flush_index): logged, 0 returned, and the
        flush thread's pass or the next call tries again. Never waits for the index: while
        the flush thread's pass holds it (its catch-up and fdatasync, 7-11 ms a second
        measured under sync sends, the loop waiting up to 6 ms), 0 at once, and the pump
        tries again after the next dispatch."""
        if self._index is None:
            return 0
        try:
            return self._index_catch_up(max_records, blocking=False)
        except OSError as e:
            self._note_transient("build the message index", e)
            return 0

    def _flush_index(self) -> int:
        """Flush's hook: catch up, fdatasync; the checkpoint's indexMsgTimestamp."""
        if self._index is None:
            return 0
        try:
            self._index_catch_up(self.config.index_build_batch, hand_over=True)
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
