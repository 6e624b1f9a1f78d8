"""Automatic failover's pure rules (broker/core/failover.py), the epoch file and truncation."""
from __future__ import annotations

import os

import pytest

from pocketmq.broker.core.failover import (
    AliveInfo,
    GroupState,
    StateError,
    SyncStateTracker,
    bootstrap,
    candidates,
    consistent_point,
    elected,
)
from pocketmq.broker.store.api import GetMessageStatus as GS
from pocketmq.broker.store.epoch import EPOCH_FILE_NAME, EpochFileError, read_epoch_file, write_epoch_file
from pocketmq.broker.store.recovery import truncate_files
from tests.unit.test_store import config, msg, opened, tags


def alive(rid, end, epoch=1):
    return AliveInfo(rid, f"h:{rid}", f"h:{rid + 100}", end, epoch)


def test_state_round_trip_and_bad_values():
    st = GroupState(1, 3, frozenset({1, 2}), 5, ((1, 0), (3, 900)))
    assert GroupState.decode(st.encode()) == st
    for bad in (b"nope", b"[]", b'{"master":1,"epoch":"x","syncStateSet":[1],"syncStateSetEpoch":1}',
                b'{"master":3,"epoch":1,"syncStateSet":[1],"syncStateSetEpoch":1}',
                b'{"master":1,"epoch":1,"syncStateSet":[-1],"syncStateSetEpoch":1}'):
        with pytest.raises(StateError):
            GroupState.decode(bad)


def test_only_live_sync_state_set_members_are_candidates():
    st = GroupState(1, 2, frozenset({1, 2}), 4, ((2, 0),))
    # the master (1) is dead; 3 is alive and ahead but not in the set: never elected cleanly
    assert candidates(st, {2: alive(2, 500), 3: alive(3, 900)}, unclean=False) == [2]
    assert candidates(st, {3: alive(3, 900)}, unclean=False) == []
    assert candidates(st, {3: alive(3, 900)}, unclean=True) == [3]
    # ranked by epoch, then max offset, then the lowest id
    st3 = GroupState(1, 2, frozenset({1, 2, 3, 4}), 4)
    order = candidates(st3, {2: alive(2, 500), 3: alive(3, 700), 4: alive(4, 700, epoch=0)}, unclean=False)
    assert order == [3, 2, 4]


def test_elected_bumps_epochs_and_records_the_start():
    st = bootstrap(1, 0)
    assert st.master == 1 and st.epoch == 1 and st.sync_state_set == {1}
    nxt = elected(st, 2, 4096)
    assert (nxt.master, nxt.epoch, nxt.sync_state_set, nxt.sync_state_set_epoch) == (2, 2, {2}, 2)
    assert nxt.history[-1] == (2, 4096)
    # history entries past the winner's end are not its log: dropped
    again = elected(GroupState(2, 2, frozenset({2, 3}), 3, ((1, 0), (2, 5000))), 3, 4000)
    assert again.history == ((1, 0), (3, 4000))


@pytest.mark.parametrize("local, lend, master, mend, want", [
    ([(1, 0)], 1000, [(1, 0)], 1000, 1000),            # same log
    ([(1, 0)], 1200, [(1, 0), (2, 1000)], 1500, 1000),  # old master: its tail past the new epoch's start
    ([(1, 0)], 800, [(1, 0), (2, 1000)], 1500, 800),    # behind: nothing to cut
    ([(1, 0), (2, 1000)], 1300, [(1, 0), (3, 1100)], 2000, 1000),  # epoch 2 never became the group's
    ([], 900, [(1, 0), (2, 400)], 1000, 400),           # data from before controller mode is epoch 0.. no: 1
    ([(5, 0)], 100, [(1, 0)], 500, -1),                # nothing shared: never guessed
    ([], 0, [(1, 0)], 500, 0),                         # empty
])
def test_consistent_point(local, lend, master, mend, want):
    if local == [] and lend == 900:
        # a log written before controller mode is epoch 0 from 0; a master that bootstrapped
        # with data wrote (0, 0) first (bootstrap), so the shared epoch is 0
        master = [(0, 0), (1, 400), (2, 700)]
        want = 400
    assert consistent_point(local, lend, master, mend) == want


def test_sync_state_tracker_confirm_join_and_shrink():
    t = SyncStateTracker(master=1, committed=frozenset({1}), max_not_catchup_ms=1000)
    assert t.confirm_offset(500) == 500          # alone: everything written is confirmed
    t.on_connect(2, 0)
    t.on_ack(2, 400, 500, 0)
    # within the join gap: joins at once (counted), proposed only once it holds the end (500)
    assert t.proposal(500, 10, join_gap=200) is None
    assert t.awaited == {2}
    assert t.acked_by(1, 600) == 400             # sends after the join wait for it...
    assert t.confirm_offset(600) == 600          # ...but it holds back no reads (not electable yet)
    t.on_ack(2, 500, 600, 20)
    assert t.proposal(600, 30, join_gap=200) == {1, 2}
    t.committed_as(frozenset({1, 2}))
    assert t.joining == {}
    assert t.acked_by(1, 600) == 500 and t.acked_by(2, 600) == -1
    # not caught up for longer than max_not_catchup_ms: proposed out, still awaited until committed
    t.on_ack(2, 550, 9000, 40)
    assert t.proposal(9000, 2000, join_gap=200) == {1}
    assert t.confirm_offset(9000) == 550
    t.committed_as(frozenset({1}))
    assert t.confirm_offset(9000) == 9000
    # disconnected members leave at once
    t2 = SyncStateTracker(master=1, committed=frozenset({1, 3}))
    t2.on_connect(3, 0)
    t2.on_ack(3, 100, 100, 0)
    assert t2.proposal(100, 1, join_gap=0) is None
    t2.on_disconnect(3)
    assert t2.proposal(100, 2, join_gap=0) == {1}


def test_epoch_file_round_trip_and_refusals(tmp_path):
    path = str(tmp_path / EPOCH_FILE_NAME)
    assert read_epoch_file(path) == []
    write_epoch_file(path, [(1, 0), (2, 4096)])
    assert read_epoch_file(path) == [(1, 0), (2, 4096)]
    data = open(path, "rb").read()
    open(path, "wb").write(data.replace(b"4096", b"4097"))
    with pytest.raises(EpochFileError, match="crc"):
        read_epoch_file(path)
    with pytest.raises(EpochFileError):
        write_epoch_file(path, [(2, 0), (1, 10)])


def test_truncate_files_cuts_log_queues_and_epochs(tmp_path):
    cfg = config(tmp_path)
    s = opened(cfg)
    ends = []
    for i in range(60):                          # several 4 KiB segments
        r = s.put_message(msg(qid=i % 2, body=b"x" * 150, props=tags(i), now=1000 + i))
        ends.append(r.wrote_offset + r.wrote_bytes)
    cut = ends[29]
    full_end = s.commit_log_max_offset
    assert full_end > cut + 4096
    s.close()
    write_epoch_file(os.path.join(cfg.store_path_root_dir, EPOCH_FILE_NAME), [(1, 0), (2, cut), (3, ends[40])])
    dropped = truncate_files(cfg, cut)
    assert dropped == full_end - cut
    assert read_epoch_file(os.path.join(cfg.store_path_root_dir, EPOCH_FILE_NAME)) == [(1, 0), (2, cut)]
    s = opened(cfg)
    try:
        assert s.commit_log_max_offset == cut
        assert s.get_max_offset_in_queue("TopicA", 0) + s.get_max_offset_in_queue("TopicA", 1) == 30
        r = s.get_message("TopicA", 0, 15, 32)
        assert r.status is GS.OFFSET_OVERFLOW_ONE
        # new writes continue at the cut and are readable
        r = s.put_message(msg(qid=0, body=b"new", props=tags(99), now=5000))
        assert r.wrote_offset in (cut, (cut // 4096 + 1) * 4096)    # (a blank marker if it does not fit)
        got = s.get_message("TopicA", 0, 15, 32)
        assert got.status is GS.FOUND and got.message_count == 1
    finally:
        s.close()
    # truncating past the end changes nothing
    assert truncate_files(cfg, 10 ** 9) == 0


def test_consumers_never_read_past_the_confirm_offset(tmp_path):
    s = opened(config(tmp_path))
    woken = []
    s.on_dispatch = lambda topic, qid, max_offset, code, ts: woken.append((topic, qid, max_offset, code))
    try:
        ends = []
        for i in range(10):
            r = s.put_message(msg(qid=0, body=b"m%d" % i, props=tags(i), now=1000 + i))
            ends.append(r.wrote_offset + r.wrote_bytes)
        s.put_message(msg(topic="TopicB", qid=0, body=b"other", now=2000))
        woken.clear()
        s.set_confirm_offset(ends[3])
        assert s.get_max_offset_in_queue("TopicA", 0) == 4
        r = s.get_message("TopicA", 0, 0, 32)
        assert r.status is GS.FOUND and r.message_count == 4 and r.max_offset == 4
        r = s.get_message("TopicA", 0, 4, 32)
        assert r.status is GS.OFFSET_OVERFLOW_ONE and r.next_begin_offset == 4
        # a consumer further on (it read there before the confirm offset was known, or
        # elsewhere): held where it is, never sent back (OVERFLOW_BADLY would reset it)
        r = s.get_message("TopicA", 0, 7, 32)
        assert r.status is GS.OFFSET_OVERFLOW_ONE and r.next_begin_offset == 7 and r.max_offset == 4
        # one unit more confirmed: the queue a read was held back on is woken, with its new end
        s.set_confirm_offset(ends[4])
        assert woken == [("TopicA", 0, 5, None)]
        assert s.get_message("TopicA", 0, 4, 32).message_count == 1
        assert s.get_max_offset_in_queue("TopicB", 0) == 0
        # no limit: everything, and every held-back queue woken
        s.get_message("TopicA", 0, 5, 32)
        s.set_confirm_offset(None)
        assert woken[-1] == ("TopicA", 0, 10, None)
        assert s.get_max_offset_in_queue("TopicA", 0) == 10 and s.get_max_offset_in_queue("TopicB", 0) == 1
    finally:
        s.close()
