"""Bounded recovery (issue 11 item 7): after a crash the store checks only what lies past
the checkpoint's flushed offset, looks past the end of data only where the file system
reports data, survives a crash at every durable step of recovery itself, and says what it
did in one line."""
from __future__ import annotations

import mmap
import os
import shutil

import pytest

from pocketmq.broker.store import mapped_file
from pocketmq.broker.store.api import MessageToStore
from pocketmq.broker.store.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from pocketmq.broker.store.consumequeue import EXISTS, ConsumeQueue
from pocketmq.broker.store.mapped_file import FileOps, data_extents, last_nonzero
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.protocol.message import decode_records

HOST = (bytes([10, 0, 0, 7]), 40000)
MIB = 1 << 20


def config(root, seg=MIB, **kw) -> StoreConfig:
    return StoreConfig(str(root), mapped_file_size_commit_log=seg, mapped_file_size_consume_queue=20 * 64,
                       store_host=(bytes([10, 0, 0, 1]), 10911), **kw)


def msg(i, qid=0):
    return MessageToStore("TopicB", qid, 0, bytes([65 + i % 26]) * (30 + i % 40),
                          f"TAGS\x01t{i % 3}\x02UNIQ_KEY\x01U{i}", 0, 1000 + i, HOST, 2000 + i)


def offsets(s, qid=0):
    out = []
    off = s.get_min_offset_in_queue("TopicB", qid)
    while off < s.get_max_offset_in_queue("TopicB", qid):
        r = s.get_message("TopicB", qid, off, 1000)
        out += [m.commit_log_offset for m in decode_records(b"".join(bytes(b) for b in r.buffers))]
        off = r.next_begin_offset
    return out


def crash_after(cfg, checkpointed: int, unflushed: int):
    """Put `checkpointed` records, flush them and write the checkpoint, put `unflushed` more,
    then drop the store like a SIGKILL (the writes stay in the page cache)."""
    s = MessageStore(cfg)
    s.open()
    results = [s.put_message(msg(i, i % 2)) for i in range(checkpointed)]
    s.flush()
    s.flush_consume_queues()
    results += [s.put_message(msg(i, i % 2)) for i in range(checkpointed, checkpointed + unflushed)]
    s.abandon()
    return results


def test_crash_recovery_checks_only_the_records_after_the_flushed_offset(tmp_path):
    cfg = config(tmp_path / "store")
    results = crash_after(cfg, 300, 7)
    ck = read_checkpoint(cfg.checkpoint_path)
    assert ck.flushed_physical_offset == results[299].end_offset
    s = MessageStore(cfg)
    rep = s.open()
    assert rep.abnormal and rep.truncated_from == -1
    assert rep.scan_from_offset == ck.flushed_physical_offset and rep.records_scanned == 7
    assert rep.reput_from_offset == ck.logics_physical_offset
    for qid in (0, 1):
        assert offsets(s, qid) == [r.wrote_offset for i, r in enumerate(results) if i % 2 == qid]
    s.close()
    s = MessageStore(cfg)
    rep = s.open()                  # clean shutdown: nothing to check at all
    assert not rep.abnormal and rep.records_scanned == 0
    s.close()


def test_checkpoint_at_the_end_of_a_full_last_segment(tmp_path):
    """The flushed offset can be the very end of the last segment (its successor was never
    created, or lost): recovery starts there, scans nothing and the next put rolls over."""
    seg = 4096
    cfg = config(tmp_path / "store", seg=seg)
    s = MessageStore(cfg)
    s.open()
    results = []
    while not results or results[-1].wrote_offset < seg:
        results.append(s.put_message(msg(len(results))))
    s.abandon()
    os.unlink(os.path.join(cfg.commit_log_dir, "%020d" % seg))     # the new segment is lost
    write_checkpoint(cfg.checkpoint_path, Checkpoint(0, 0, 0, seg, seg, 1))
    s = MessageStore(cfg)
    rep = s.open()
    assert rep.scan_from_offset == seg and rep.records_scanned == 0 and rep.commit_log_max_offset == seg
    assert rep.truncated_from == -1
    kept = [r for r in results if r.wrote_offset < seg]
    assert offsets(s) == [r.wrote_offset for r in kept]
    nxt = s.put_message(msg(999))
    assert nxt.ok and nxt.wrote_offset == seg and nxt.queue_offset == len(kept)
    s.close()


class CountingView:
    """A memoryview stand-in counting the bytes read through slices."""

    def __init__(self, view):
        self.view = view
        self.read = 0

    def __getitem__(self, key):
        part = self.view[key]
        self.read += len(part)
        return part


def _sparse_file(tmp_path, size):
    path = str(tmp_path / "seg")
    fd = FileOps(preallocate=True).create(path, size)
    mm = mmap.mmap(fd, size)
    return path, fd, mm


def test_last_nonzero_reads_only_what_the_file_system_reports_as_data(tmp_path):
    size = 256 * MIB
    _, fd, mm = _sparse_file(tmp_path, size)
    try:
        mm[0:5000] = b"\x01" * 5000
        mm[100 * MIB:100 * MIB + 3] = b"abc"
        extents = data_extents(fd, 0, size)
        if extents is None or sum(h - d for d, h in extents) >= size:
            pytest.skip("this file system does not report unwritten extents (SEEK_DATA)")
        with memoryview(mm) as mv:
            view = CountingView(mv)
            assert last_nonzero(view, fd, 5000, size) == 100 * MIB + 3
            assert view.read < 64 * MIB              # the extents around the writes, not 256 MiB
            view.read = 0
            assert last_nonzero(view, fd, 100 * MIB + 3, size) == 100 * MIB + 3
            assert view.read < 64 * MIB
            # the answer is the same as a full read's
            assert last_nonzero(mv, -1, 5000, size) == 100 * MIB + 3
    finally:
        mm.close()
        os.close(fd)


def test_last_nonzero_without_seek_data_reads_everything(tmp_path, monkeypatch):
    size = 4 * MIB
    _, fd, mm = _sparse_file(tmp_path, size)
    try:
        mm[3 * MIB:3 * MIB + 2] = b"zz"
        monkeypatch.delattr(mapped_file.os, "SEEK_DATA")
        assert data_extents(fd, 0, size) is None
        with memoryview(mm) as mv:
            view = CountingView(mv)
            assert last_nonzero(view, fd, 0, size) == 3 * MIB + 2
            assert view.read >= MIB
    finally:
        mm.close()
        os.close(fd)


def test_garbage_far_past_the_end_of_a_big_segment_is_found_and_zeroed(tmp_path):
    """A torn write that landed 40 MiB past a lost one (power loss) is still seen: the file
    system reports its page as data."""
    seg = 64 * MIB
    cfg = config(tmp_path / "store", seg=seg)
    results = crash_after(cfg, 50, 5)
    end = results[-1].end_offset
    with open(os.path.join(cfg.commit_log_dir, "%020d" % 0), "r+b") as f:
        f.seek(40 * MIB)
        f.write(b"\x05stale")
    s = MessageStore(cfg)
    rep = s.open()
    assert rep.truncated_from == end and rep.truncated_to == 40 * MIB + 6
    assert sorted(offsets(s, 0) + offsets(s, 1)) == [r.wrote_offset for r in results]
    s.close()
    with open(os.path.join(cfg.commit_log_dir, "%020d" % 0), "rb") as f:
        f.seek(40 * MIB)
        assert f.read(6) == bytes(6)


class CrashAt(FileOps):
    """FileOps that 'kills the process' (raises) at the n-th durable step of an open."""

    class Killed(BaseException):
        pass

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def _step(self):
        self.n -= 1
        if self.n < 0:
            raise CrashAt.Killed()

    def fdatasync(self, fd):
        self._step()
        super().fdatasync(fd)

    def fsync_dir(self, path):
        self._step()
        super().fsync_dir(path)


def test_a_crash_at_any_durable_step_of_recovery_is_recovered_by_the_next_open(tmp_path):
    """Recovery is itself crash-safe: kill it (raise) before each fdatasync / directory sync
    it makes (the cut, the flush, the consume queues, the checkpoint, the abort file), after
    a crash that left a torn record; the next open ends with the log and queues an
    uninterrupted recovery gives. (Killed after the cut was made durable, the next open
    finds nothing to cut: the report of that loss is what such a kill costs.)"""
    cfg0 = config(tmp_path / "orig")
    results = crash_after(cfg0, 40, 6)
    victim = results[-3]
    with open(os.path.join(cfg0.commit_log_dir, "%020d" % 0), "r+b") as f:     # tear it
        f.seek(victim.wrote_offset + 60)
        f.write(bytes(victim.wrote_bytes - 60))
    kept = [r.wrote_offset for r in results[:-3]]
    n = 0
    while True:
        root = tmp_path / f"copy{n}"
        shutil.copytree(tmp_path / "orig", root)
        cfg = config(root)
        ops = CrashAt(n)
        s = MessageStore(cfg, file_ops=ops)
        try:
            rep = s.open()
            ops.n = 1 << 30                     # the open ran to its end: no more kills
        except CrashAt.Killed:
            s.abandon()
            s = MessageStore(cfg)
            rep = s.open()
            assert rep.abnormal, n
            assert rep.commit_log_max_offset == victim.wrote_offset, n
            assert sorted(offsets(s, 0) + offsets(s, 1)) == kept, n
            assert s.put_message(msg(500)).wrote_offset == victim.wrote_offset, n
            s.close()
            n += 1
            continue
        # n exceeds the number of durable steps: this open ran to the end
        assert rep.truncated_from == victim.wrote_offset and rep.commit_log_max_offset == victim.wrote_offset
        assert sorted(offsets(s, 0) + offsets(s, 1)) == kept
        s.close()
        break
    assert n >= 3                               # the cut, the flush, the checkpoint at least


def test_every_interrupted_open_recovers_the_same_state(tmp_path):
    """Like the test above, comparing each interrupted-then-reopened store to one clean run."""
    cfg0 = config(tmp_path / "orig")
    results = crash_after(cfg0, 30, 8)
    with open(os.path.join(cfg0.commit_log_dir, "%020d" % 0), "r+b") as f:
        f.seek(results[-1].end_offset + 3000)
        f.write(b"\x09junk")                    # stale bytes past the end
    ref_root = tmp_path / "ref"
    shutil.copytree(tmp_path / "orig", ref_root)
    s = MessageStore(config(ref_root))
    ref_rep = s.open()
    ref = (ref_rep.commit_log_max_offset, offsets(s, 0), offsets(s, 1))
    s.close()
    assert ref_rep.lost_bytes > 0
    for n in range(8):
        root = tmp_path / f"c{n}"
        shutil.copytree(tmp_path / "orig", root)
        ops = CrashAt(n)
        s = MessageStore(config(root), file_ops=ops)
        try:
            s.open()
            ops.n = 1 << 30
            s.close()
        except CrashAt.Killed:
            s.abandon()
        s = MessageStore(config(root))
        rep = s.open()
        assert (rep.commit_log_max_offset, offsets(s, 0), offsets(s, 1)) == ref, n
        s.close()


def test_consume_queue_refuses_an_impossible_gap(tmp_path):
    """A record whose QUEUEOFFSET was damaged (no header checksum) must not make the queue
    fill 2^60 filler units; it is indexed where it belongs, or not again when it lies before
    the queue's last unit."""
    cq = ConsumeQueue("TopicB", 0, str(tmp_path), 20 * 64, FileOps())
    assert cq.put(0, 0, 100, 0) != EXISTS
    assert cq.put(1, 100, 100, 0) != EXISTS
    cq.put(1 << 60, 200, 100, 0)               # right after the last record: no room for a gap
    assert cq.max_offset == 3 and cq.unit(2)[0] == 200
    assert cq.put(1 << 40, 150, 100, 0) == EXISTS      # lies before the last unit
    assert cq.max_offset == 3
    cq.put(5, 300 + 3 * 91, 100, 0)            # room for 3 missing records: a plausible gap
    assert cq.max_offset == 6 and cq.unit(5)[0] == 300 + 3 * 91
    cq.close()


def test_summary_is_one_line_saying_what_recovery_did(tmp_path):
    cfg = config(tmp_path / "store")
    results = crash_after(cfg, 20, 4)
    with open(os.path.join(cfg.commit_log_dir, "%020d" % 0), "r+b") as f:
        f.seek(results[-1].wrote_offset + 4)
        f.write(b"\x00\x00\x00")           # the last record's magic code: a torn header
    s = MessageStore(cfg)
    rep = s.open()
    line = rep.summary(12.3)
    assert "\n" not in line
    assert line.startswith("store recovery: abnormal shutdown")
    assert "recovered in 12 ms" in line and "records scanned" in line
    assert f"{rep.lost_bytes} bytes truncated at {results[-1].wrote_offset}" in line
    assert "consume queues: 2 loaded" in line
    s.close()
    s = MessageStore(cfg)
    line = s.open().summary(1)
    assert line.startswith("store recovery: clean shutdown") and "0 bytes truncated" in line
    s.close()
