"""Commit-log recovery: torn tails, bit flips, garbage, lost segments, consume-queue repair."""
from __future__ import annotations

import os
import shutil
import struct

import pytest

from pocketmq.broker.store.api import MessageToStore
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.protocol.message import decode_record, decode_records

HOST = (bytes([10, 0, 0, 7]), 40000)
SEG = 4096


def config(root, **kw) -> StoreConfig:
    base = dict(mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=20 * 16,
                store_host=(bytes([10, 0, 0, 1]), 10911))
    base.update(kw)
    return StoreConfig(str(root), **base)


def msg(i, topic="TopicR", qid=0, body=None):
    body = body if body is not None else bytes([65 + i % 26]) * (20 + i % 50)
    return MessageToStore(topic, qid, 0, body, f"TAGS\x01t{i % 3}\x02UNIQ_KEY\x01U{i}", 0, 1000 + i, HOST, 2000 + i)


def seg_path(cfg, offset):
    return os.path.join(cfg.commit_log_dir, "%020d" % (offset - offset % SEG))


def patch(cfg, offset, data: bytes):
    """Write bytes into the segment holding `offset` (the store must be closed/abandoned)."""
    with open(seg_path(cfg, offset), "r+b") as f:
        f.seek(offset % SEG)
        f.write(data)


def read_at(cfg, offset, n):
    with open(seg_path(cfg, offset), "rb") as f:
        f.seek(offset % SEG)
        return f.read(n)


def all_messages(s, topic="TopicR", qid=0):
    out = []
    off = s.get_min_offset_in_queue(topic, qid)
    while off < s.get_max_offset_in_queue(topic, qid):
        r = s.get_message(topic, qid, off, 1000)
        out += decode_records(b"".join(bytes(b) for b in r.buffers))
        off = r.next_begin_offset
    return out


@pytest.fixture(scope="module")
def crashed_store(tmp_path_factory):
    """A store holding records across a few segments, killed (abort file left) after the last
    put. The checkpoint covers the first 60 records; the last 11 were never flushed: they are
    what recovery checks (the records below the checkpoint's flushed offset were fsynced)."""
    root = tmp_path_factory.mktemp("crashed") / "store"
    cfg = config(root)
    s = MessageStore(cfg)
    s.open()
    results = [s.put_message(msg(i)) for i in range(60)]
    s.flush()
    s.flush_consume_queues()
    results += [s.put_message(msg(i)) for i in range(60, 70)]
    assert all(r.ok for r in results)
    results.append(s.put_message(msg(70, body=b"\xEE" * 150)))   # the last, unflushed record
    s.abandon()
    assert os.path.exists(cfg.abort_path)
    return root, results


def fresh_copy(crashed_store, tmp_path):
    root, results = crashed_store
    dst = tmp_path / "copy"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(root, dst)
    return config(dst), results


def reopen(cfg):
    s = MessageStore(cfg)
    return s, s.open()


def test_crash_without_damage_loses_nothing(crashed_store, tmp_path):
    cfg, results = fresh_copy(crashed_store, tmp_path)
    s, rep = reopen(cfg)
    assert rep.abnormal and rep.truncated_from == -1 and rep.records_scanned > 0
    assert rep.commit_log_max_offset == results[-1].end_offset
    assert [m.commit_log_offset for m in all_messages(s)] == [r.wrote_offset for r in results]
    s.close()


def test_last_record_truncated_at_every_byte(crashed_store, tmp_path):
    """Zero the last record from byte k on (a torn write) for every k: recovery cuts exactly
    at its start, keeps every earlier record, and the store takes new writes there."""
    last = crashed_store[1][-1]
    original = read_at(config(crashed_store[0]), last.wrote_offset, last.wrote_bytes)
    for k in range(last.wrote_bytes):
        cfg, results = fresh_copy(crashed_store, tmp_path)
        patch(cfg, last.wrote_offset + k, bytes(last.wrote_bytes - k))
        s, rep = reopen(cfg)
        assert rep.commit_log_max_offset == last.wrote_offset, k
        if any(original[:k]):       # else the torn record is all zeros: just the end of data
            assert rep.truncated_from == last.wrote_offset and rep.cut_reason, k
            assert rep.truncated_to == last.wrote_offset + len(original[:k].rstrip(b"\x00")), k
        else:
            assert rep.truncated_from == -1, k
        msgs = all_messages(s)
        assert [m.commit_log_offset for m in msgs] == [r.wrote_offset for r in results[:-1]], k
        assert s.get_max_offset_in_queue("TopicR", 0) == len(results) - 1
        again = s.put_message(msg(99))
        assert (again.wrote_offset, again.queue_offset) == (last.wrote_offset, last.queue_offset)
        s.close()


def test_file_cut_short_is_extended_and_recovered(crashed_store, tmp_path):
    cfg, results = fresh_copy(crashed_store, tmp_path)
    last = results[-1]
    os.truncate(seg_path(cfg, last.wrote_offset), last.wrote_offset % SEG + 50)
    s, rep = reopen(cfg)
    assert rep.commit_log_max_offset == last.wrote_offset
    assert os.path.getsize(seg_path(cfg, last.wrote_offset)) == SEG
    s.close()


# byte ranges of the checked parts of an IPv4 record: flips there must be caught
CHECKED_FIELDS = {
    "TOTALSIZE": range(0, 4), "MAGICCODE": range(4, 8), "BODYCRC": range(8, 12),
    "PHYSICALOFFSET": range(28, 36), "BODYLENGTH": range(84, 88),
}


@pytest.mark.parametrize("field", ["body", "TOTALSIZE", "MAGICCODE", "BODYCRC", "PHYSICALOFFSET",
                                   "BODYLENGTH", "TOPICLENGTH", "PROPERTIESLENGTH"])
def test_bit_flip_detected_and_cut(crashed_store, tmp_path, field):
    """A flipped bit in the body or a checked header field of a record in the recovered range
    cuts the log right before that record; nothing before it is lost."""
    root, results = crashed_store
    victim_index = len(results) - 4
    victim = results[victim_index]
    raw = read_at(config(root), victim.wrote_offset, victim.wrote_bytes)
    body_len = struct.unpack_from(">i", raw, 84)[0]
    props_len_at = 89 + body_len + len("TopicR")
    ranges = dict(CHECKED_FIELDS, body=range(88, 88 + body_len), TOPICLENGTH=range(88 + body_len, 89 + body_len),
                  PROPERTIESLENGTH=range(props_len_at, props_len_at + 2))
    for pos in list(ranges[field])[:8]:
        for bit in (0, 3, 7):
            cfg, _ = fresh_copy(crashed_store, tmp_path)
            b = read_at(cfg, victim.wrote_offset + pos, 1)[0]
            patch(cfg, victim.wrote_offset + pos, bytes([b ^ (1 << bit)]))
            s, rep = reopen(cfg)
            assert rep.truncated_from == victim.wrote_offset, (field, pos, bit, rep)
            assert rep.truncated_to >= results[-1].end_offset - 1
            assert [m.commit_log_offset for m in all_messages(s)] == [r.wrote_offset for r in results[:victim_index]]
            s.close()


def test_any_bit_flip_cuts_there_or_costs_nothing(crashed_store, tmp_path):
    """RocketMQ's format only checksums the body: a flip in FLAG, a timestamp, a host address
    or a topic character that stays valid survives. Every single-bit flip anywhere in a record
    either cuts the log exactly before that record or loses nothing at all."""
    _, results = crashed_store
    victim_index = len(results) - 3
    victim = results[victim_index]
    outcomes = {"cut": 0, "kept": 0}
    for pos in range(victim.wrote_bytes):
        cfg, _ = fresh_copy(crashed_store, tmp_path)
        b = read_at(cfg, victim.wrote_offset + pos, 1)[0]
        patch(cfg, victim.wrote_offset + pos, bytes([b ^ (1 << (pos % 8))]))
        s, rep = reopen(cfg)
        offsets = [m.commit_log_offset for m in all_messages(s)]
        if rep.truncated_from == -1:
            assert offsets == [r.wrote_offset for r in results], pos
            outcomes["kept"] += 1
        else:
            assert rep.truncated_from == victim.wrote_offset, pos
            assert offsets == [r.wrote_offset for r in results[:victim_index]], pos
            outcomes["cut"] += 1
        s.close()
    assert outcomes["cut"] > 0 and outcomes["kept"] > 0


def test_garbage_after_the_end_is_zeroed_and_reported(crashed_store, tmp_path):
    cfg, results = fresh_copy(crashed_store, tmp_path)
    end = results[-1].end_offset
    patch(cfg, end + 100, b"\x01garbage")
    s, rep = reopen(cfg)
    assert rep.truncated_from == end and rep.truncated_to == end + 108
    assert rep.lost_bytes == 108
    assert read_at(cfg, end, 120) == bytes(120)
    assert len(all_messages(s)) == len(results)
    s.close()
    s, rep = reopen(cfg)
    assert rep.truncated_from == -1 and not rep.abnormal
    s.close()


def test_cut_deletes_later_segments_and_consume_queue_units(tmp_path):
    cfg = config(tmp_path / "store")
    s = MessageStore(cfg)
    s.open()
    results = [s.put_message(msg(i, qid=i % 2)) for i in range(90)]
    s.flush_consume_queues()       # checkpoint: consume queues durable up to here
    s.abandon()
    segs = sorted(os.listdir(cfg.commit_log_dir))
    assert len(segs) >= 3
    # break the magic of the first record of the second-to-last segment
    victim = next(r for r in results if r.wrote_offset >= (len(segs) - 2) * SEG)
    patch(cfg, victim.wrote_offset + 4, b"\x00\x00\x00\x00")
    s, rep = reopen(cfg)
    assert rep.truncated_from == victim.wrote_offset
    assert rep.segments_removed == 1
    assert sorted(os.listdir(cfg.commit_log_dir)) == segs[:-1]
    kept = [r for r in results if r.wrote_offset < victim.wrote_offset]
    assert rep.cq_entries_truncated == len(results) - len(kept)
    for qid in (0, 1):
        mine = [r for i, r in enumerate(results) if i % 2 == qid and r.wrote_offset < victim.wrote_offset]
        assert s.get_max_offset_in_queue("TopicR", qid) == len(mine)
        assert [m.commit_log_offset for m in all_messages(s, qid=qid)] == [r.wrote_offset for r in mine]
    nxt = s.put_message(msg(500))
    assert nxt.wrote_offset == victim.wrote_offset
    s.close()


def test_normal_recovery_finds_exact_position(tmp_path):
    cfg = config(tmp_path / "store")
    s = MessageStore(cfg)
    s.open()
    results = [s.put_message(msg(i)) for i in range(30)]
    s.close()
    s, rep = reopen(cfg)
    assert not rep.abnormal and rep.records_scanned == 0
    assert rep.commit_log_max_offset == results[-1].end_offset
    assert s.put_message(msg(31)).wrote_offset in (results[-1].end_offset, (results[-1].end_offset // SEG + 1) * SEG)
    s.close()
    os.unlink(cfg.checkpoint_path)      # no checkpoint: scan the last segments
    s, rep = reopen(cfg)
    assert rep.records_scanned > 0 and rep.truncated_from == -1
    assert len(all_messages(s)) == 31
    s.close()


@pytest.mark.parametrize("damage", ["hole", "last_file_lost"])
def test_consume_queue_damage_repaired(tmp_path, damage):
    cfg = config(tmp_path / "store")
    s = MessageStore(cfg)
    s.open()
    results = [s.put_message(msg(i)) for i in range(40)]
    s.abandon()           # no checkpoint was written: recovery dispatches from the commit-log start
    qdir = os.path.join(cfg.consume_queue_dir, "TopicR", "0")
    files = sorted(os.listdir(qdir))
    assert len(files) == 3
    if damage == "hole":  # a unit lost in the middle of the last file, stale bytes after
        with open(os.path.join(qdir, files[-1]), "r+b") as f:
            f.seek(20)
            f.write(bytes(20))
            f.seek(200)
            f.write(b"\x07" * 20)
    else:
        os.unlink(os.path.join(qdir, files[-1]))
    s, rep = reopen(cfg)
    assert rep.reput_from_offset == 0 and rep.records_dispatched > 0
    assert [m.commit_log_offset for m in all_messages(s)] == [r.wrote_offset for r in results]
    s.close()


def test_reads_return_records_byte_exact_after_recovery(crashed_store, tmp_path):
    cfg, results = fresh_copy(crashed_store, tmp_path)
    s, _ = reopen(cfg)
    for r in results[::7]:
        raw = s.look_message_by_offset(r.wrote_offset)
        m = decode_record(raw, check_crc=True)
        assert m.commit_log_offset == r.wrote_offset and len(raw) == r.wrote_bytes
    s.close()
