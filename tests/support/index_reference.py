"""The message index's plain builder, as it was before the batch builder (commit b0bc055
of broker/store/index.py): one record at a time, keys found by the property getters,
Java's String.hashCode computed per character, three struct calls per entry and the
header written after each record. The fast builder in index.py must write the same bytes;
tests/unit/test_index_fast.py runs the same scenarios with each and compares the files,
and bench/bench_index.py times both.

`reference_catch_up(store, max_records)` has the signature and contract of
`MessageStore._index_catch_up`: patch it in (monkeypatch.setattr(MessageStore,
"_index_catch_up", reference_catch_up)) to build an index the old way. It writes through
the IndexService's files (`IndexService._active`, the IndexFile's attributes and
mapping), which the fast builder shares, so only the walk, the keys, the hashes and the
entry writes are the reference's own.
"""
from __future__ import annotations

import struct

from pocketmq.broker.store.index import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, INDEX_SLOT_SIZE
from pocketmq.protocol.message import (BLANK_MAGIC_CODE, KEY_SEPARATOR, KEYS, MAX_INT, MESSAGE_MAGIC_CODE, UNIQ_KEY,
                                       MessageSysFlag, index_fields_at, java_string_hash, property_getter,
                                       unpack_size_magic)

__all__ = ["reference_catch_up", "reference_key_hash", "reference_raw_keys"]

_HEADER = struct.Struct(">qqqqii")
_SLOT = struct.Struct(">i")
_ENTRY = struct.Struct(">iqii")
_MIN_INT = -0x80000000

_uniq_of = property_getter(UNIQ_KEY)
_keys_of = property_getter(KEYS)
_KEY_SEPARATOR_B = KEY_SEPARATOR.encode()


def reference_key_hash(key: str) -> int:
    """Java IndexFile.indexKeyHashMethod: abs(String.hashCode()), Integer.MIN_VALUE -> 0."""
    h = java_string_hash(key)
    return 0 if h == _MIN_INT else abs(h)


def reference_raw_keys(props: bytes) -> list[bytes]:
    """UNIQ_KEY then each non-empty KEYS word, as stored (Java's buildIndex order)."""
    out = []
    uniq = _uniq_of(props)
    if uniq:
        out.append(uniq)
    keys = _keys_of(props)
    if keys:
        out.extend(k for k in keys.split(_KEY_SEPARATOR_B) if k)
    return out


def _put_keys(f, hashes: list[int], phy: int, store_ts: int) -> int:
    """IndexFile.put_keys of b0bc055 (Java putKey, per key): returns how many fit."""
    mm = f.mm
    slot_num = f.slot_num
    idx = f.index_count
    if idx <= 1:
        f.begin_ts = store_ts
        f.begin_phy = phy
    begin_ts = f.begin_ts
    diff = 0 if begin_ts <= 0 else (store_ts - begin_ts) // 1000
    diff = 0 if diff < 0 else (diff if diff <= MAX_INT else MAX_INT)
    entries_base = INDEX_HEADER_SIZE + slot_num * INDEX_SLOT_SIZE
    room = f.index_num - idx
    n = 0
    for h in hashes:
        if n >= room:
            break
        slot_pos = INDEX_HEADER_SIZE + (h % slot_num) * INDEX_SLOT_SIZE
        prev = _SLOT.unpack_from(mm, slot_pos)[0]
        if prev <= 0 or prev > idx:
            prev = 0
            f.slot_count += 1
        _ENTRY.pack_into(mm, entries_base + idx * INDEX_ENTRY_SIZE, h, phy, diff, prev)
        _SLOT.pack_into(mm, slot_pos, idx)
        idx += 1
        n += 1
    if n:
        f.index_count = idx
        f.end_ts = store_ts
        f.end_phy = phy
        _HEADER.pack_into(mm, 0, begin_ts, store_ts, f.begin_phy, phy, f.slot_count, idx)
    return n


def _put_hashes(svc, hashes: list[int], phy: int, store_ts: int) -> None:
    """IndexService.put_hashes of b0bc055: fill the active file, roll over when full."""
    while hashes:
        f = svc._active(store_ts)
        n = _put_keys(f, hashes, phy, store_ts)
        if f not in svc._dirty:
            svc._dirty.append(f)
        hashes = hashes[n:]


def reference_catch_up(store, max_records: int = 0, hand_over: bool = False, blocking: bool = True) -> int:
    """MessageStore._index_catch_up of b0bc055 (without its GIL hand-over, which writes
    nothing: hand_over and blocking are taken and ignored; nor the IndexHints, which write
    the same)."""
    svc = store._index
    if svc is None:
        return 0
    with svc.lock:
        limit = store._reput_from
        start = max(store._index_from, store._commitlog.min_offset)
        done_through = store._index_done_through
        n = 0
        find = store._commitlog.queue.find
        half_bit = MessageSysFlag.TRANSACTION_PREPARED_TYPE
        stop_at = max_records if max_records > 0 else -1
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
                break
            if start > done_through:
                sys_flag, store_ts, topic_b, props = index_fields_at(view, pos)
                if props and not sys_flag & half_bit:
                    keys = reference_raw_keys(props)
                    if keys:
                        topic = topic_b.decode("utf-8", "replace")
                        _put_hashes(svc, [reference_key_hash(f"{topic}#{k.decode('utf-8', 'replace')}")
                                          for k in keys], start, store_ts)
            start += total
            n += 1
        store._index_from = start
        svc.expire(store._commitlog.min_offset)
        return n
