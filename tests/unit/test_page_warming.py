"""Commit-log page warming (store/commitlog.py warm_span / warm_step, store/flush.py
warm_commit_log, services/warm.py PageWarmer): which bytes are read ahead of the writer,
when the writer wakes the warmer, and that warming never changes what is stored."""
from __future__ import annotations

import os
import threading

import pytest

from pocketmq.broker.services.warm import PageWarmer
from pocketmq.broker.store.commitlog import warm_span
from pocketmq.broker.store.fileops import FileOps
from tests.unit.test_store import config, msg, opened, tags

SEG = 64 * 1024


class RecordingOps(FileOps):
    """FileOps that records every warming read (fd, offset, length) and what it returned,
    the descriptors dup'd and closed; `fail` makes the reads raise; `reached` is set once
    a read ends at or past `until` (a position in the segment)."""

    def __init__(self):
        super().__init__()
        self.reads: list[tuple[int, int, int]] = []
        self.got: list[int] = []
        self.dups: list[int] = []
        self.closed: list[int] = []
        self.fail = False
        self.until = None
        self.reached = threading.Event()

    def dup(self, fd):
        new = super().dup(fd)
        self.dups.append(new)
        return new

    def close(self, fd):
        if fd in self.dups:                     # the warmer's descriptors only
            self.closed.append(fd)
        return super().close(fd)

    def pread_into(self, fd, buf, offset):
        self.reads.append((fd, offset, len(buf)))
        if self.until is not None and offset + len(buf) >= self.until:
            self.reached.set()
        if self.fail:
            raise OSError(5, "injected")
        n = super().pread_into(fd, buf, offset)
        self.got.append(n)
        return n

    def wait_for_read_to(self, until: int, timeout: float = 10) -> bool:
        """A read ending at or past `until` was made, or is made within `timeout`."""
        self.until = until                      # reads from now on set `reached`...
        if any(off + n >= until for _, off, n in list(self.reads)):
            return True                         # ...and one before already did
        return self.reached.wait(timeout)


def warming_store(tmp_path):
    """An opened store on RecordingOps whose writer's wake-ups are listed (the write
    position at each)."""
    ops = RecordingOps()
    s = opened(config(tmp_path, mapped_file_size_commit_log=SEG), file_ops=ops)
    wakes = []
    s.set_warm_waker(lambda: wakes.append(s.commit_log_max_offset))
    return s, ops, wakes


def warm_all(s, ahead: int, buf) -> list[int]:
    """A warmer's round: steps until nothing is left; the bytes of each."""
    done = []
    while n := s.warm_commit_log(ahead, buf):
        done.append(n)
    return done


def test_warm_span_rules():
    # fresh: from the write position, `ahead` bytes
    assert warm_span(0, 0, 0, SEG, 4096) == (0, 4096)
    # partly warmed: only the rest
    assert warm_span(1000, 4096, 0, SEG, 8192) == (4096, 9192)
    # warmed past the writer's ahead: nothing
    assert warm_span(1000, 9192, 0, SEG, 8192) == (9192, 9192)
    # the writer ahead of the warming: from the writer, never behind it
    assert warm_span(5000, 100, 0, SEG, 1000) == (5000, 6000)
    # capped at the segment's end
    assert warm_span(SEG - 100, SEG - 100, 0, SEG, 4096) == (SEG - 100, SEG)
    # warmed in another segment (a roll, a truncation): from the write position
    assert warm_span(SEG + 10, SEG - 1 + 2 * SEG, SEG, 2 * SEG, 100) == (SEG + 10, SEG + 110)
    assert warm_span(SEG + 10, 5, SEG, 2 * SEG, 100) == (SEG + 10, SEG + 110)


def test_warming_reads_ahead_of_the_writer_and_the_writer_wakes_it(tmp_path):
    s, ops, wakes = warming_store(tmp_path)
    buf = memoryview(bytearray(1024))
    assert s.warm_commit_log(4096, buf) == 0        # no segment yet: nothing, wake on the first append
    r = s.put_message(msg(body=b"x" * 100, props=tags(1)))
    assert wakes == [r.end_offset]
    # the warmer's round: 1 KiB reads from the write position to 4 KiB past it, then done
    done = warm_all(s, 4096, buf)
    assert sum(done) == 4096 and max(done) <= 1024
    starts = [off for _, off, _ in ops.reads]
    assert starts[0] == r.end_offset and starts == sorted(starts)
    assert ops.got == [n for _, _, n in ops.reads]         # each read read what it asked for
    # the round's descriptor was its own, and closed when the round ended
    assert {fd for fd, _, _ in ops.reads} == {ops.dups[0]} and ops.closed == ops.dups
    assert s._warm_fd == -1
    assert ops.reads[-1][1] + ops.reads[-1][2] == r.end_offset + 4096
    # the writer wakes it again only once past half of that distance
    while s.commit_log_max_offset < r.end_offset + 2048 - 200:
        s.put_message(msg(body=b"y" * 100, props=tags(2)))
    assert len(wakes) == 1
    while len(wakes) == 1:
        s.put_message(msg(body=b"y" * 100, props=tags(2)))
    assert wakes[1] >= r.end_offset + 2048
    n_before = len(ops.reads)
    warm_all(s, 4096, buf)
    new = ops.reads[n_before:]
    assert new[0][1] == r.end_offset + 4096          # continues where it stopped
    assert new[-1][1] + new[-1][2] == s.commit_log_max_offset + 4096
    s.close()


def test_warming_stops_at_the_segment_end_and_resumes_after_the_roll(tmp_path):
    s, ops, wakes = warming_store(tmp_path)
    buf = memoryview(bytearray(8192))
    s.put_message(msg(body=b"x" * 100, props=tags(1)))
    warm_all(s, 4 * SEG, buf)
    assert max(off + n for _, off, n in ops.reads) == SEG       # never past the segment
    while s.commit_log_max_offset < SEG:
        s.put_message(msg(body=b"z" * 500, props=tags(3)))
    assert len(wakes) == 2 and wakes[1] > SEG                   # the roll's first append
    n_before = len(ops.reads)
    warm_all(s, 4 * SEG, buf)
    fds = {fd for fd, _, _ in ops.reads[n_before:]}
    assert len(fds) == 1 and ops.reads[n_before][1] == s.commit_log_max_offset - SEG
    assert ops.reads[-1][1] + ops.reads[-1][2] == SEG           # all of the new segment
    s.close()


def test_a_failed_warming_read_is_only_a_missed_hint(tmp_path):
    s, ops, _ = warming_store(tmp_path)
    r = s.put_message(msg(body=b"x" * 100, props=tags(1)))
    ops.fail = True
    # the round still ends with its mark set: warming goes on at the next wake
    assert sum(warm_all(s, 4096, memoryview(bytearray(1024)))) == 4096
    ops.fail = False
    assert s.put_message(msg(body=b"y", props=tags(2))).ok
    assert s.get_message("TopicA", 0, 0, 10).message_count == 2
    assert r.ok
    s.close()


def test_warming_never_changes_what_is_stored(tmp_path):
    """The same puts with a warmer thread reading ahead all along and without one leave
    byte-identical commit-log segments."""
    bodies = [os.urandom(37 + i % 300) for i in range(600)]

    def run(root, warm: bool):
        ops = RecordingOps()
        s = opened(config(root, mapped_file_size_commit_log=SEG), file_ops=ops)
        warmer = PageWarmer(s, 8192 if warm else 0)
        warmer.start()
        try:
            for i, b in enumerate(bodies):
                assert s.put_message(msg(body=b, props=tags(i), now=1000 + i)).ok
            if warm:
                assert ops.wait_for_read_to(s.commit_log_max_offset % SEG + 1), \
                    "the warmer did not catch up with the writer"
        finally:
            warmer.stop()
        cl_dir = os.path.join(root, "store", "commitlog")
        segs = {name: open(os.path.join(cl_dir, name), "rb").read() for name in sorted(os.listdir(cl_dir))}
        s.close()
        return segs, ops.reads, warmer.warmed_bytes

    plain, no_reads, none = run(tmp_path / "plain", False)
    warmed, reads, warmed_bytes = run(tmp_path / "warm", True)
    assert no_reads == [] and none == 0
    assert reads and warmed_bytes > 0
    assert len(plain) >= 3 and warmed == plain


def test_warmer_off_starts_no_thread(tmp_path):
    s = opened(config(tmp_path))
    w = PageWarmer(s, 0)
    w.start()
    assert w._thread is None
    assert s._commitlog.on_warm_mark is None
    s.put_message(msg())            # no waker set: the writer never calls one
    w.stop()
    s.close()


def test_the_warmers_descriptor_is_its_own_and_closed_when_the_store_closes(tmp_path):
    s, ops, _ = warming_store(tmp_path)
    s.put_message(msg(body=b"x" * 100, props=tags(1)))
    buf = memoryview(bytearray(1024))
    assert s.warm_commit_log(4096, buf) == 1024             # a round begun, not ended
    wfd = s._warm_fd
    seg_fd = s._commitlog.queue.files[-1].fd
    assert wfd == ops.dups[-1] and wfd != seg_fd and ops.reads[-1][0] == wfd
    assert os.fstat(wfd).st_ino == os.fstat(seg_fd).st_ino
    s.close()
    assert wfd not in ops.closed               # the store does not close it under a read...
    assert s.warm_commit_log(4096, buf) == 0   # ...the warmer's next call does
    assert ops.closed[-1] == wfd and s._warm_fd == -1


def test_a_segment_deleted_between_rounds_is_not_held_open(tmp_path):
    """Cleaning deletes an old segment: no descriptor of the warmer keeps its space."""
    s, ops, _ = warming_store(tmp_path)
    buf = memoryview(bytearray(8192))
    s.put_message(msg(body=b"x" * 100, props=tags(1), now=1000))
    warm_all(s, 4096, buf)
    first_dup = ops.dups[0]
    while s.commit_log_max_offset < 3 * SEG:
        s.put_message(msg(body=b"z" * 500, props=tags(3), now=2000))
    assert first_dup in ops.closed and s._warm_fd == -1
    assert s.clean_expired_files(10 ** 12, force=True)[0] >= 1
    held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")]
    assert not [h for h in held if "(deleted)" in h and h.startswith(str(tmp_path))], held
    s.close()


def test_the_writer_without_a_waker_only_moves_its_mark(tmp_path):
    s = opened(config(tmp_path, mapped_file_size_commit_log=SEG))
    s._commitlog.warm_mark = 0                 # a mark but no waker: the append must not fail
    assert s.put_message(msg()).ok
    assert s.get_message("TopicA", 0, 0, 10).message_count == 1
    s.close()


def test_the_warmer_rearms_after_a_failed_round(tmp_path, caplog):
    ops = RecordingOps()
    s = opened(config(tmp_path, mapped_file_size_commit_log=SEG), file_ops=ops)
    real = s.warm_commit_log
    calls = []

    def once_broken(ahead, buf):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real(ahead, buf)
    s.warm_commit_log = once_broken
    real_set = s.set_warm_waker
    armed = []
    rearmed = threading.Event()

    def set_waker(wake):
        real_set(wake)
        armed.append(wake)
        if len(armed) > 1:
            rearmed.set()
    s.set_warm_waker = set_waker
    w = PageWarmer(s, 1 << 20)
    w.start()
    try:
        s.put_message(msg(body=b"x" * 100, props=tags(1)))          # wakes it: the round raises
        assert rearmed.wait(10), "the warmer did not re-arm the writer's mark"
        # the next append wakes it again, and this round warms
        s.put_message(msg(body=b"y" * 100, props=tags(2)))
        assert ops.wait_for_read_to(1), "warming did not resume after the failed round"
    finally:
        w.stop()
    assert "commit-log page warming failed" in caplog.text
    s.close()


def test_warm_ahead_setting():
    from pocketmq.broker.config import BrokerConfig
    from pocketmq.broker.services.warm import warm_ahead_bytes
    assert warm_ahead_bytes(BrokerConfig()) == 16 << 20
    assert warm_ahead_bytes(BrokerConfig(commitLogWarmAheadBytes=0)) == 0
    assert warm_ahead_bytes(BrokerConfig(commitLogWarmAheadBytes=1 << 20)) == 1 << 20
    assert warm_ahead_bytes(BrokerConfig(brokerRole="SLAVE", brokerId=1)) == 0
    for bad in (1, 4096, (1 << 20) - 1, -1, 1 << 31):
        with pytest.raises(Exception, match="commitLogWarmAheadBytes"):
            BrokerConfig(commitLogWarmAheadBytes=bad)


def test_the_warmer_thread_closes_its_descriptor_when_it_stops(tmp_path):
    ops = RecordingOps()
    s = opened(config(tmp_path, mapped_file_size_commit_log=SEG), file_ops=ops)
    w = PageWarmer(s, 8192)
    w.start()
    s.put_message(msg(body=b"x" * 100, props=tags(1)))
    assert ops.wait_for_read_to(1)
    w.stop()
    assert s._warm_fd == -1 and w.warmed_bytes > 0
    s.close()
