"""The store's replication ends: replica_read (master) and replica_append (slave).

A slave fed the master's bytes in arbitrary cuts ends byte-identical over the replicated
range, with the same consume queues; bad bytes are refused without touching the log.
"""
from __future__ import annotations

import os
import random

import pytest

from pocketmq.broker.store.api import GetMessageStatus as GS
from pocketmq.broker.store.api import MessageBatchToStore
from pocketmq.broker.store.replica import ReplicaError
from tests.unit.test_store import SEG, config, joined, msg, opened, tags

BATCH = 32 * 1024


def fill(master, n=200, seed=1):
    rnd = random.Random(seed)
    for i in range(n):
        if i % 17 == 0:
            bodies = [(b"b%d-%d" % (i, j) * rnd.randint(1, 30)) for j in range(rnd.randint(2, 6))]
            batch = MessageBatchToStore("TopicB", i % 3, 0, 1000 + i, msg().born_host, 1000 + i,
                                        [(0, b, tags(j)) for j, b in enumerate(bodies)])
            assert master.put_messages(batch).status.name == "PUT_OK"
        else:
            body = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 700)))
            r = master.put_message(msg(topic=rnd.choice(["TopicA", "TopicB"]), qid=rnd.randrange(4), body=body,
                                       props=tags(i), now=1000 + i))
            assert r.status.name == "PUT_OK"


def copy(master, slave, rnd, start=None, chunk_max=BATCH):
    """The HA stream's work: frames of at most chunk_max, never across a segment."""
    offset = slave.replica_received_end if start is None else start
    if offset == 0:
        offset = master.commit_log_min_offset
    while True:
        data = master.replica_read(offset, rnd.randint(1, chunk_max))
        if not data:
            return
        # the network may cut the frame's body again (it is still one frame here)
        slave.replica_append(offset, data)
        offset += len(data)


def segments(store) -> dict[str, bytes]:
    d = store.config.commit_log_dir
    return {name: open(os.path.join(d, name), "rb").read() for name in sorted(os.listdir(d))}


def test_slave_is_byte_identical_and_serves_the_same_pulls(tmp_path):
    master = opened(config(tmp_path / "m"))
    slave = opened(config(tmp_path / "s", store_host=(bytes([10, 0, 0, 2]), 10911)))
    fill(master)
    assert len(master._commitlog.queue.files) > 5      # several segments with blank markers
    rnd = random.Random(7)
    copy(master, slave, rnd)
    assert slave.commit_log_max_offset == master.commit_log_max_offset
    assert slave.replica_pending_bytes == 0
    assert segments(slave) == segments(master)
    for topic in ("TopicA", "TopicB"):
        for qid in range(4):
            a = master.get_message(topic, qid, 0, 1000)
            b = slave.get_message(topic, qid, 0, 1000)
            assert (a.status, a.next_begin_offset, a.max_offset) == (b.status, b.next_begin_offset, b.max_offset)
            assert joined(a) == joined(b)


def test_one_byte_frames_and_restart_in_the_middle(tmp_path):
    master = opened(config(tmp_path / "m"))
    fill(master, n=60, seed=3)
    scfg = config(tmp_path / "s")
    slave = opened(scfg)
    rnd = random.Random(3)
    half = master.commit_log_max_offset // 2
    offset = 0
    while offset < half:
        data = master.replica_read(offset, rnd.randint(1, 40))
        slave.replica_append(offset, data)
        offset += len(data)
    # a partial record waits in memory only: the log ends at a record boundary
    stored = slave.commit_log_max_offset
    assert stored <= offset
    slave.close()
    slave = opened(scfg)
    assert slave.commit_log_max_offset == stored      # restart: what was stored is kept
    copy(master, slave, rnd)
    assert segments(slave) == segments(master)
    fill(master, n=30, seed=4)
    copy(master, slave, rnd)
    assert segments(slave) == segments(master)


def test_dispatch_listener_sees_replicated_records(tmp_path):
    master = opened(config(tmp_path / "m"))
    seen = []
    slave = opened(config(tmp_path / "s"), on_dispatch=lambda t, q, mo, code, ts: seen.append((t, q, mo, code)))
    for i in range(5):
        master.put_message(msg(qid=1, body=b"x%d" % i, props=tags(i)))
    slave.replica_append(0, master.replica_read(0, 100_000))
    # one run: the queue is told its new end once per distinct tag code
    codes = {master.get_message("TopicA", 1, i, 1).buffers and i for i in range(5)}
    assert {(t, q, mo) for t, q, mo, _c in seen} == {("TopicA", 1, 5)}
    assert len({c for *_x, c in seen}) == len(codes) == 5


def _notified(store_dir, master, chunk, force_plain):
    """(consume-queue files, per queue: last end told and the tag codes told) of a slave fed
    the master's log in chunks, dispatching through _dispatch_many or, forced, the per-record
    reput."""
    told: dict = {}
    slave = opened(config(store_dir), on_dispatch=lambda t, q, mo, code, ts: told.setdefault(
        (t, q), [0, set()]).__setitem__(0, mo) or told[(t, q)][1].add(code))
    if force_plain:
        slave._dispatch_many = lambda runs, start, end: slave._reput()
    copy(master, slave, random.Random(chunk), chunk_max=chunk)
    units = {}
    for topic in slave.topics():
        for qid in slave.queue_ids(topic):
            cq = slave._find_cq(topic, qid)
            units[(topic, qid)] = [cq.unit(i) for i in range(cq.min_offset, cq.max_offset)]
    return units, {k: (v[0], v[1]) for k, v in told.items()}


@pytest.mark.parametrize("chunk", [97, 4096, 32 * 1024])
def test_dispatch_many_equals_per_record_dispatch(tmp_path, chunk):
    master = opened(config(tmp_path / "m"))
    fill(master, n=150, seed=chunk)
    fast = _notified(tmp_path / "fast", master, chunk, False)
    plain = _notified(tmp_path / "plain", master, chunk, True)
    assert fast[0] == plain[0]
    # every queue is told its final end, and every tag code it got (a held pull for any of
    # them wakes): the same as per-record dispatch
    assert {k: (mo, codes) for k, (mo, codes) in fast[1].items()} == plain[1]


def test_empty_slave_starts_at_the_masters_oldest_segment(tmp_path):
    master = opened(config(tmp_path / "m"))
    fill(master, n=120, seed=5)
    master.clean_expired_files(now_ms=10**15, force=True)
    start = master.commit_log_min_offset
    assert start > 0 and start % SEG == 0
    slave = opened(config(tmp_path / "s"))
    copy(master, slave, random.Random(2))
    assert slave.commit_log_min_offset == start
    assert segments(slave) == {k: v for k, v in segments(master).items()}
    # queues start past 0 where the oldest records are gone: the same messages from both
    found = 0
    for topic in ("TopicA", "TopicB"):
        for qid in range(4):
            if qid not in slave.queue_ids(topic):
                # no record of it is left in the log: the master keeps its old queue file
                assert master.get_message(topic, qid, 0, 1000).status is not GS.FOUND
                continue
            lo = slave.get_min_offset_in_queue(topic, qid)
            assert lo > 0
            a, b = master.get_message(topic, qid, lo, 1000), slave.get_message(topic, qid, lo, 1000)
            assert (a.status, a.next_begin_offset) == (b.status, b.next_begin_offset)
            assert joined(a) == joined(b)
            found += a.status is GS.FOUND
    assert found


def test_refuses_a_gap_an_unaligned_start_and_bad_bytes(tmp_path):
    master = opened(config(tmp_path / "m"))
    for i in range(20):
        master.put_message(msg(body=b"y" * 100, props=tags(i)))
    slave = opened(config(tmp_path / "s"))
    with pytest.raises(ReplicaError, match="segment boundary"):
        slave.replica_append(100, master.replica_read(100, 50))
    data = master.replica_read(0, 1000)
    slave.replica_append(0, data[:300])
    end = slave.replica_received_end
    with pytest.raises(ReplicaError, match=f"continues at {end}"):
        slave.replica_append(end + 1, data[301:400])
    assert slave.replica_pending_bytes > 0        # a gap keeps the buffer; a new connection drops it
    assert slave.replica_reset() == slave.commit_log_max_offset
    assert slave.replica_pending_bytes == 0
    # a flipped body byte: BODYCRC catches it; the record is not stored, the log unchanged
    stored = slave.commit_log_max_offset
    before = segments(slave)
    bad = bytearray(master.replica_read(stored, 1000))
    bad[200] ^= 0xFF
    with pytest.raises(ReplicaError, match="not valid"):
        slave.replica_append(stored, bytes(bad))
    assert slave.commit_log_max_offset == stored and segments(slave) == before
    assert slave.replica_pending_bytes == 0
    # garbage where a record should start
    with pytest.raises(ReplicaError, match="no record"):
        slave.replica_append(stored, b"\x00\x00\x01\x00" + b"\x12" * 300)
    # the right bytes still go in afterwards
    copy(master, slave, random.Random(9))
    assert segments(slave) == segments(master)


def test_replica_read_bounds(tmp_path):
    master = opened(config(tmp_path / "m"))
    assert master.replica_read(0, 100) == b""
    master.put_message(msg())
    end = master.commit_log_max_offset
    assert master.replica_read(end, 100) == b""
    assert master.replica_read(end + 1, 100) is None
    assert len(master.replica_read(0, 10)) == 10
    assert master.replica_read(0, 10_000) == master.replica_read(0, end)


def _segment_with(tmp_path, batches, seed):
    """A master store holding `batches` (lists of (topic, qid, body, props)) put as batches;
    returns (the active segment's view, its records' (pos, size) in order)."""
    master = opened(config(tmp_path / f"m{seed}", mapped_file_size_commit_log=1 << 20))
    for i, b in enumerate(batches):
        topic, qid = b[0][0], b[0][1]
        r = master.put_messages(MessageBatchToStore(topic, qid, 0, 1000 + i, msg().born_host, 5000 + i,
                                                    [(0, body, props) for _t, _q, body, props in b]))
        assert r.status.name == "PUT_OK"
    mf = master._commitlog.queue.files[-1]
    from pocketmq.protocol.message import unpack_size_magic
    recs, pos = [], 0
    while pos < mf.wrote:
        size = unpack_size_magic(mf.view, pos)[0]
        recs.append((pos, size))
        pos += size
    return master, mf, recs


@pytest.mark.parametrize("seed", range(6))
def test_uniform_run_check_equals_check_record(tmp_path, seed):
    """check_uniform_run gives, for the records it takes, exactly check_record's requests;
    it stops at the first record of another layout, and refuses (None) a run holding a bad
    record (which check_record then names)."""
    from pocketmq.broker.store.commitlog import RECORD, check_record, check_uniform_run
    rnd = random.Random(seed)
    batches = []
    for _ in range(12):
        n = rnd.randint(1, 9)
        same = rnd.random() < 0.7
        blen = rnd.randint(1, 40)
        batches.append([("TopicU" if rnd.random() < 0.8 else "TopicV", rnd.randrange(2),
                         bytes(rnd.getrandbits(8) for _ in range(blen if same else rnd.randint(1, 40))),
                         tags(rnd.randrange(3)) if same else tags(rnd.randrange(30)))
                        for _ in range(n)])
    master, mf, recs = _segment_with(tmp_path, batches, seed)
    levels = master._delay_levels
    view = mf.view
    i = 0
    while i < len(recs):
        pos, size = recs[i]
        m = sum(1 for _ in recs[i:])
        run = check_uniform_run(view, pos, size, m, mf.start + pos, levels) \
            if all(s == size for _p, s in recs[i:i + 2]) and len(recs) - i >= 2 else None
        if run is None:
            kind, _s, info = check_record(view, pos, mf.size, mf.start + pos, levels)
            assert kind == RECORD
            i += 1
            continue
        expect = [check_record(view, p, mf.size, mf.start + p, levels)[2] for p, _s in recs[i:i + run.count]]
        assert run.requests == expect
        assert all(s == size for _p, s in recs[i:i + run.count])
        if i + run.count < len(recs):
            # it stopped at a record of another size or layout, never before one of the same
            nxt_pos, nxt_size = recs[i + run.count]
            assert nxt_size != size or check_uniform_run(view, nxt_pos - size, size, 2, mf.start + nxt_pos - size,
                                                         levels) is None
        i += run.count
    # a flipped body byte inside a run: the run is refused and check_record names it
    pos, size = recs[0]
    k = next(j for j in range(1, len(recs)) if recs[j][1] != size) if any(s != size for _p, s in recs) else len(recs)
    if k >= 3:
        p_bad = recs[1][0] + 88        # the body's first byte (IPv4 hosts): BODYCRC covers it
        old = mf.mm[p_bad]
        mf.mm[p_bad] = old ^ 0x55
        assert check_uniform_run(view, pos, size, k, mf.start + pos, levels) is None
        assert check_record(view, recs[1][0], mf.size, mf.start + recs[1][0], levels)[0] != RECORD
        mf.mm[p_bad] = old


def test_a_segment_that_cannot_be_created_is_busy_not_refused(tmp_path):
    """A slave that cannot create its next segment for now keeps what arrived; once its
    buffer is full it says busy (ReplicaBusy: the caller asks again later), never that the
    master's bytes are bad; then, the file system back, it ends identical."""
    from tests.unit.test_store import FailingOps
    from pocketmq.broker.store.replica import ReplicaBusy
    master = opened(config(tmp_path / "m"))
    while master.commit_log_max_offset < SEG + (1 << 20) + 64 * 1024:    # past the buffer's bound
        fill(master, n=200, seed=master.commit_log_max_offset)
    ops = FailingOps()
    slave = opened(config(tmp_path / "s"), file_ops=ops)
    offset = 0
    first = master.replica_read(0, SEG)
    slave.replica_append(0, first)
    offset = len(first)
    ops.fail_create = True
    with pytest.raises(ReplicaBusy):
        while True:
            data = master.replica_read(offset, 32 * 1024)
            assert data, "the buffer never filled"
            slave.replica_append(offset, data)
            offset += len(data)
    assert slave.commit_log_max_offset == SEG and slave.failed is None
    ops.fail_create = False
    slave.replica_reset()
    copy(master, slave, random.Random(3))
    assert segments(slave) == segments(master)


def test_a_slave_takes_records_over_its_own_message_size(tmp_path):
    """A master's limit may be above its slave's maxMessageSize: the slave takes the record
    however the frames cut it (Java's slave takes any record)."""
    master = opened(config(tmp_path / "m", max_message_size=3000))
    master.put_message(msg(body=b"s" * 100))
    master.put_message(msg(body=b"L" * 2500))
    data = master.replica_read(0, SEG)
    for cut in (len(data), 150, 7):
        slave = opened(config(tmp_path / f"s{cut}", max_message_size=2000))
        pos = 0
        while pos < len(data):
            slave.replica_append(pos, data[pos:pos + cut])
            pos += cut
        assert slave.commit_log_max_offset == master.commit_log_max_offset
