"""MessageStore API: put/get semantics, segment roll-over, limits, queries, cleaning, failures."""
from __future__ import annotations

import errno
import logging
import os
import shutil
import struct
import threading

import pytest

from pocketmq.broker.store.api import (GetMessageStatus as GS, MessageBatchToStore, MessageToStore,
                              PutMessageStatus as PS, StoreError)
from pocketmq.broker.store.checkpoint import Checkpoint, read_checkpoint
from pocketmq.broker.store.fileops import FileOps, NotOpened
from pocketmq.common.files import read_file, write_file_atomic
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.common.constants import parse_delay_levels
from pocketmq.common.constants import SCHEDULE_TOPIC
from pocketmq.protocol.message import (BLANK_MAGIC_CODE, decode_batch_body, decode_record,
                              decode_records, encode_batch_body, java_string_hash, offset_msg_id)

HOST = (bytes([10, 0, 0, 7]), 40000)
STORE_HOST = (bytes([10, 0, 0, 1]), 10911)
SEG = 4096


def config(tmp_path, **kw) -> StoreConfig:
    base = dict(mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=20 * 64,
                store_host=STORE_HOST, total_physical_memory_bytes=1 << 34)
    base.update(kw)
    return StoreConfig(str(tmp_path / "store"), **base)


def opened(cfg, **kw) -> MessageStore:
    s = MessageStore(cfg, **kw)
    s.open()
    return s


def msg(topic="TopicA", qid=0, body=b"hello", props="", now=1000, sys_flag=0, flag=0, host=HOST):
    return MessageToStore(topic, qid, flag, body, props, sys_flag, max(0, now - 1), host, now)


def tags(t):
    return f"TAGS\x01{t}\x02UNIQ_KEY\x01ID{t}"


def joined(res) -> bytes:
    return b"".join(bytes(b) for b in res.buffers)


def test_put_get_round_trip(tmp_path):
    s = opened(config(tmp_path))
    results = [s.put_message(msg(body=b"m%d" % i, props=tags(i), now=2000 + i)) for i in range(10)]
    assert all(r.status is PS.PUT_OK for r in results)
    assert [r.queue_offset for r in results] == list(range(10))
    assert results[0].wrote_offset == 0
    for a, b in zip(results, results[1:]):
        assert b.wrote_offset == a.wrote_offset + a.wrote_bytes
    assert results[3].msg_id == offset_msg_id(*STORE_HOST, results[3].wrote_offset)
    got = s.get_message("TopicA", 0, 0, 32)
    assert got.status is GS.FOUND and got.message_count == 10 and got.next_begin_offset == 10
    assert len(got.buffers) == 1 and isinstance(got.buffers[0], memoryview)   # coalesced
    msgs = decode_records(joined(got))
    assert [m.body for m in msgs] == [b"m%d" % i for i in range(10)]
    assert [m.queue_offset for m in msgs] == list(range(10))
    assert [m.store_timestamp for m in msgs] == [2000 + i for i in range(10)]
    assert msgs[4].store_host == "10.0.0.1:10911" and msgs[4].born_host == "10.0.0.7:40000"
    assert msgs[4].msg_id == "ID4" and msgs[4].offset_msg_id == results[4].msg_id
    assert s.look_message_by_offset(results[4].wrote_offset) == bytes(
        joined(got)[results[4].wrote_offset:results[4].end_offset])
    assert s.look_message_by_offset(results[4].wrote_offset + 1) is None
    assert s.look_message_by_offset(10 ** 9) is None
    assert s.topics() == ["TopicA"] and s.queue_ids("TopicA") == [0]
    s.close()


def test_segment_roll_over_with_blank_marker(tmp_path):
    cfg = config(tmp_path)
    s = opened(cfg)
    body = bytes(range(200))
    results = [s.put_message(msg(body=body, props=tags("x"), now=10 + i)) for i in range(60)]
    assert all(r.ok for r in results)
    rolled = [r for a, r in zip(results, results[1:]) if r.wrote_offset // SEG != a.wrote_offset // SEG]
    assert rolled, "expected several segments"
    for r in results:       # no record spans two segments
        assert r.wrote_offset // SEG == (r.end_offset - 1) // SEG
        assert r.end_offset % SEG <= SEG - 8 or r.end_offset % SEG == 0
    first_in_1 = next(r for r in results if r.wrote_offset >= SEG)
    assert first_in_1.wrote_offset == SEG
    last_in_0 = [r for r in results if r.wrote_offset < SEG][-1]
    seg0 = read_file(os.path.join(cfg.commit_log_dir, "%020d" % 0))
    assert len(seg0) == SEG
    remaining = SEG - last_in_0.end_offset
    assert struct.unpack_from(">ii", seg0, last_in_0.end_offset) == (remaining, BLANK_MAGIC_CODE)
    names = sorted(os.listdir(cfg.commit_log_dir))
    assert names[:2] == ["%020d" % 0, "%020d" % SEG]
    # a read across files gives one slice per segment, all messages in order
    got = s.get_message("TopicA", 0, 0, 60)
    assert got.message_count == 32            # in-memory count limit
    assert len(got.buffers) == len({r.wrote_offset // SEG for r in results[:32]})
    got2 = s.get_message("TopicA", 0, 32, 60)
    msgs = decode_records(joined(got)) + decode_records(joined(got2))
    assert [m.commit_log_offset for m in msgs] == [r.wrote_offset for r in results]
    s.close()
    s = opened(cfg)
    again = s.get_message("TopicA", 0, 0, 60)
    assert joined(again) == joined(got)
    r = s.put_message(msg(body=body, now=99))
    assert r.wrote_offset == results[-1].end_offset or r.wrote_offset % SEG == 0
    s.close()


def test_get_statuses_and_next_offsets(tmp_path):
    s = opened(config(tmp_path))
    r = s.get_message("Nope", 0, 5, 32)
    assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset) == (GS.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
    for i in range(5):
        s.put_message(msg(props=tags("A" if i % 2 else "B"), now=i + 1))
    r = s.get_message("TopicA", 0, 5, 32)
    assert (r.status, r.next_begin_offset, r.max_offset) == (GS.OFFSET_OVERFLOW_ONE, 5, 5)
    r = s.get_message("TopicA", 0, 9, 32)
    assert (r.status, r.next_begin_offset) == (GS.OFFSET_OVERFLOW_BADLY, 0)   # 4.9.4: min is 0
    code_a = java_string_hash("A")
    r = s.get_message("TopicA", 0, 0, 32, lambda c: c == code_a)
    assert r.status is GS.FOUND and r.message_count == 2 and r.next_begin_offset == 5
    assert [m.tags for m in decode_records(joined(r))] == ["A", "A"]
    r = s.get_message("TopicA", 0, 0, 1, lambda c: c == code_a)
    assert r.message_count == 1 and r.next_begin_offset == 2     # stops before the 2nd match
    r = s.get_message("TopicA", 0, 0, 32, lambda c: False)
    assert (r.status, r.next_begin_offset, r.buffers) == (GS.NO_MATCHED_MESSAGE, 5, [])
    s.close()


def test_scan_limit_and_cq_file_boundary(tmp_path):
    s = opened(config(tmp_path, mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 1000))
    for i in range(1200):
        s.put_message(msg(body=b"", now=i + 1))
    r = s.get_message("TopicA", 0, 0, 32, lambda c: False)
    assert (r.status, r.next_begin_offset) == (GS.NO_MATCHED_MESSAGE, 800)    # 16000 bytes of units
    r = s.get_message("TopicA", 0, 800, 32, lambda c: False)
    assert r.next_begin_offset == 1000                                       # end of the CQ file
    r = s.get_message("TopicA", 0, 990, 32)
    assert r.message_count == 10 and r.next_begin_offset == 1000
    r = s.get_message("TopicA", 0, 0, 1000, lambda c: False)
    assert r.next_begin_offset == 1000                                       # max(16000, 1000*20)
    s.close()


def test_transfer_limits(tmp_path):
    s = opened(config(tmp_path, mapped_file_size_commit_log=1 << 22))
    for i in range(40):
        s.put_message(msg(body=b"x" * 10_000, now=i + 1))
    r = s.get_message("TopicA", 0, 0, 100)
    assert r.message_count == 25 and r.buffer_total_size <= 256 * 1024       # 256 KiB in memory
    r = s.get_message("TopicA", 0, 0, 3)
    assert r.message_count == 3 and r.next_begin_offset == 3
    r = s.get_message("TopicA", 0, 0, 0)
    assert r.message_count == 1                                              # first always taken
    s.close()
    # "in disk": more than 40% of RAM behind the head -> 64 KiB / 8 messages
    s = opened(config(tmp_path, mapped_file_size_commit_log=1 << 22, total_physical_memory_bytes=100_000))
    r = s.get_message("TopicA", 0, 0, 100)
    assert r.message_count == 6 and r.buffer_total_size <= 64 * 1024
    assert s.check_in_disk_by_consume_offset("TopicA", 0, 0)
    assert not s.check_in_disk_by_consume_offset("TopicA", 0, 39)
    s.close()
    s = opened(config(tmp_path, mapped_file_size_commit_log=1 << 22, total_physical_memory_bytes=1 << 40))
    big = s.put_message(msg(topic="Big", body=b"y" * 300_000, now=50))
    assert big.ok
    s.put_message(msg(topic="Big", body=b"z", now=51))
    r = s.get_message("Big", 0, 0, 32)
    assert r.message_count == 1 and r.buffer_total_size == big.wrote_bytes   # first one even if > limit
    s.close()


def test_consume_queue_units_and_tags_codes(tmp_path):
    cfg = config(tmp_path)
    s = opened(cfg)
    r1 = s.put_message(msg(props="TAGS\x01TagA", now=100))
    r2 = s.put_message(msg(props="TAGS\x01TagNeg_xyz_12345\x02", now=101))
    r3 = s.put_message(msg(props="KEYS\x01k", now=102))
    r4 = s.put_message(msg(topic=SCHEDULE_TOPIC, qid=2, props="DELAY\x013\x02TAGS\x01TagA", now=1000))
    r5 = s.put_message(msg(topic=SCHEDULE_TOPIC, qid=40, props="", now=1000))
    s.flush_consume_queues()
    cq = read_file(os.path.join(cfg.consume_queue_dir, "TopicA", "0", "%020d" % 0))
    units = [struct.unpack_from(">qiq", cq, i * 20) for i in range(4)]
    assert units[0] == (r1.wrote_offset, r1.wrote_bytes, 2598919)
    assert units[1] == (r2.wrote_offset, r2.wrote_bytes, -1465635644)
    assert cq[20 + 12:40] == bytes.fromhex("FFFFFFFFA8A42CC4")
    assert units[2] == (r3.wrote_offset, r3.wrote_bytes, 0)
    assert units[3] == (0, 0, 0)
    sched = read_file(os.path.join(cfg.consume_queue_dir, SCHEDULE_TOPIC, "2", "%020d" % 0))
    assert struct.unpack_from(">qiq", sched, 0) == (r4.wrote_offset, r4.wrote_bytes, 1000 + 10_000)
    sched = read_file(os.path.join(cfg.consume_queue_dir, SCHEDULE_TOPIC, "40", "%020d" % 0))
    assert struct.unpack_from(">qiq", sched, 0)[2] == 1000 + 1000                # unknown level
    assert parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")[17] == 7_200_000
    assert r5.ok
    s.close()


def test_transaction_types(tmp_path):
    s = opened(config(tmp_path))
    prep = s.put_message(msg(sys_flag=0x4, now=1))
    roll = s.put_message(msg(sys_flag=0xC, now=2))
    commit = s.put_message(msg(sys_flag=0x8, now=3))
    plain = s.put_message(msg(now=4))
    assert (prep.queue_offset, roll.queue_offset, commit.queue_offset, plain.queue_offset) == (0, 0, 0, 1)
    got = decode_records(joined(s.get_message("TopicA", 0, 0, 32)))
    assert [m.commit_log_offset for m in got] == [commit.wrote_offset, plain.wrote_offset]
    assert decode_record(s.look_message_by_offset(prep.wrote_offset)).sys_flag == 0x4
    s.close()


def test_batch_put(tmp_path):
    s = opened(config(tmp_path))
    s.put_message(msg(now=1))
    items = [(i, b"b%d" % i, f"UNIQ_KEY\x01U{i}") for i in range(5)]
    r = s.put_messages(MessageBatchToStore("TopicA", 0, 0, 5, HOST, 6, items))
    assert r.ok and r.queue_offset == 1 and r.msg_count == 5
    ids = r.msg_id.split(",")
    assert len(ids) == 5
    msgs = decode_records(joined(s.get_message("TopicA", 0, 1, 32)))
    assert [m.flag for m in msgs] == list(range(5))
    assert [m.offset_msg_id for m in msgs] == ids
    assert msgs[0].commit_log_offset == r.wrote_offset
    assert sum(m.store_size for m in msgs) == r.wrote_bytes
    # a batch that does not fit the rest of the segment goes whole into the next one
    big = [(0, b"z" * 500, "") for _ in range(6)]
    r2 = s.put_messages(MessageBatchToStore("TopicA", 0, 0, 7, HOST, 8, big))
    assert r2.ok and r2.wrote_offset == SEG
    assert s.put_messages(MessageBatchToStore("TopicA", 0, 0x4, 7, HOST, 8, items)).status is PS.MESSAGE_ILLEGAL
    assert s.put_messages(MessageBatchToStore("TopicA", 0, 0, 7, HOST, 8, [])).status is PS.MESSAGE_ILLEGAL
    huge = [(0, b"z" * 1000, "") for _ in range(5)]
    assert s.put_messages(MessageBatchToStore("TopicA", 0, 0, 7, HOST, 8, huge)).status is PS.MESSAGE_ILLEGAL
    s.close()


def test_batch_body_stores_the_same_bytes_as_decode_then_put_messages(tmp_path):
    items = [(i % 3, b"b%d" % i * i, f"TAGS\x01T{i % 2}\x02UNIQ_KEY\x01U{i}") for i in range(7)]
    items.append((0, b"", "ODD\x01nul\x00"))
    body = encode_batch_body(items)
    extra = b"CLUSTER\x01DefaultCluster"
    a = opened(config(tmp_path / "a", mapped_file_size_commit_log=1 << 16))
    b = opened(config(tmp_path / "b", mapped_file_size_commit_log=1 << 16))
    for s in (a, b):
        s.put_message(msg(now=1))
    ra = a.put_batch_body("TopicA", 0, 0, 5, HOST, 6, body, extra, 1)
    rb = b.put_messages(MessageBatchToStore("TopicA", 0, 0, 5, HOST, 6,
                                            decode_batch_body(body, raw_properties=True, append_properties=extra), 1))
    assert ra == rb and ra.ok and ra.msg_count == 8
    assert ra.msg_id.split(",") == [offset_msg_id(*STORE_HOST, m.commit_log_offset)
                                    for m in decode_records(joined(a.get_message("TopicA", 0, 1, 32)))]
    assert joined(a.get_message("TopicA", 0, 0, 32)) == joined(b.get_message("TopicA", 0, 0, 32))
    msgs = decode_records(joined(a.get_message("TopicA", 0, 1, 32)))
    assert msgs[2].properties["CLUSTER"] == "DefaultCluster" and msgs[2].tags == "T0"
    assert msgs[-1].properties["CLUSTER"] == "DefaultCluster" and msgs[-1].properties["ODD"] == "nul\x00"
    # malformed bodies: ValueError naming the element, nothing stored
    end = a.commit_log_max_offset
    for bad, what in [(body[:-3], "element 7"), (body[:16] + b"\x7f" + body[17:], "element 0"),
                      (b"", "empty")]:
        with pytest.raises(ValueError, match=what):
            a.put_batch_body("TopicA", 0, 0, 5, HOST, 6, bad, extra)
        assert a.commit_log_max_offset == end and a.get_max_offset_in_queue("TopicA", 0) == 9
    with pytest.raises(ValueError, match="exceeds the limit"):
        a.put_batch_body("TopicA", 0, 0, 5, HOST, 6, body, extra, body_bytes_max=5)
    # the elements before the bad one were written past the commit point and wiped: a crash
    # now must not let recovery find them
    a.flush()
    a.abandon()
    a = opened(config(tmp_path / "a", mapped_file_size_commit_log=1 << 16))
    assert a.commit_log_max_offset == end and a.get_max_offset_in_queue("TopicA", 0) == 9
    a.close()
    b.close()


def test_put_limits(tmp_path):
    s = opened(config(tmp_path, max_message_size=1000))
    assert s.put_message(msg(body=b"x" * 1000)).status is PS.MESSAGE_ILLEGAL
    assert s.put_message(msg(body=b"x" * 800)).ok
    assert s.put_message(msg(topic="T" * 127)).ok
    assert s.put_message(msg(topic="T" * 128)).status is PS.MESSAGE_ILLEGAL
    assert s.put_message(msg(topic="../etc")).status is PS.MESSAGE_ILLEGAL
    assert s.put_message(msg(topic="")).status is PS.MESSAGE_ILLEGAL
    assert s.put_message(msg(qid=-1)).status is PS.MESSAGE_ILLEGAL
    assert s.put_message(msg(host=(b"\x01\x02", 5))).status is PS.MESSAGE_ILLEGAL
    s.close()
    s = opened(config(tmp_path, mapped_file_size_commit_log=1 << 17))
    assert s.put_message(msg(props="a\x01" + "b" * 32766)).status is PS.PROPERTIES_SIZE_EXCEEDED
    assert s.put_message(msg(props="a\x01" + "b" * 32765)).ok
    v6 = s.put_message(msg(host=(bytes(15) + b"\x01", 7), now=5))
    m = decode_record(s.look_message_by_offset(v6.wrote_offset))
    assert m.born_host == "::1:7" and m.sys_flag & 0x10 and m.store_timestamp == 5
    # properties ending in NUL get a trailing separator: same meaning, never a zero last byte
    nul = s.put_message(msg(props="a\x01b\x00", now=6))
    m = decode_record(s.look_message_by_offset(nul.wrote_offset))
    assert m.properties == {"a": "b\x00"} and s.look_message_by_offset(nul.wrote_offset)[-1] == 2
    s.close()


def test_dispatch_listener(tmp_path):
    calls = []
    s = opened(config(tmp_path), on_dispatch=lambda *a: calls.append(a))
    s.put_message(msg(props="TAGS\x01TagA", now=7))
    s.put_messages(MessageBatchToStore("TopicA", 0, 0, 1, HOST, 8, [(0, b"a", ""), (0, b"b", "")]))
    s.put_message(msg(sys_flag=0x4, now=9))
    # A batch is announced once per distinct tag code, with the batch's end offset.
    assert calls == [("TopicA", 0, 1, 2598919, 7), ("TopicA", 0, 3, 0, 8)]
    calls.clear()
    s.put_messages(MessageBatchToStore("TopicA", 0, 0, 1, HOST, 9, [(0, b"a", "TAGS\x01TagA"),
                                                                   (0, b"b", "TAGS\x01TagB"),
                                                                   (0, b"c", "TAGS\x01TagA")]))
    assert sorted(calls) == [("TopicA", 0, 6, 2598919, 9), ("TopicA", 0, 6, 2598920, 9)]
    s.close()


def test_broken_dispatch_listener_does_not_fail_puts(tmp_path):
    def boom(*_a):
        raise RuntimeError("listener bug")

    s = opened(config(tmp_path), on_dispatch=boom)
    assert s.put_message(msg(now=1)).ok
    assert s.put_messages(MessageBatchToStore("TopicA", 0, 0, 1, HOST, 2, [(0, b"a", "")])).ok
    assert s.get_max_offset_in_queue("TopicA", 0) == 2
    s.close()


def test_store_timestamps_and_offset_by_time(tmp_path):
    s = opened(config(tmp_path))
    assert s.get_earliest_message_time("TopicA", 0) == -1
    assert s.get_offset_in_queue_by_time("TopicA", 0, 5) == 0
    times = [100, 200, 300, 400, 500, 600, 700, 800, 900]
    for t in times:
        s.put_message(msg(now=t))
    assert s.get_earliest_message_time("TopicA", 0) == 100
    assert s.get_message_store_timestamp("TopicA", 0, 3) == 400
    assert s.get_message_store_timestamp("TopicA", 0, 30) == -1
    by_time = s.get_offset_in_queue_by_time
    assert by_time("TopicA", 0, 400) == 3
    assert by_time("TopicA", 0, 449) == 3       # nearer to 400
    assert by_time("TopicA", 0, 451) == 4       # nearer to 500
    assert by_time("TopicA", 0, 450) == 3       # tie: left
    assert by_time("TopicA", 0, 1) == 0
    assert by_time("TopicA", 0, 10_000) == 8
    s.close()


def test_clean_expired_files_moves_min_offsets(tmp_path):
    cfg = config(tmp_path, mapped_file_size_consume_queue=20 * 8, file_reserved_time_hours=1)
    s = opened(cfg)
    results = [s.put_message(msg(qid=i % 2, body=b"q" * 300, now=i + 1)) for i in range(60)]
    segments = sorted(os.listdir(cfg.commit_log_dir))
    assert len(segments) >= 5
    now_ms = 10 * 3_600_000
    for name in segments[:3]:
        os.utime(os.path.join(cfg.commit_log_dir, name), ns=(0, 0))
    for name in segments[3:]:
        t = (now_ms - 1000) * 1_000_000
        os.utime(os.path.join(cfg.commit_log_dir, name), ns=(t, t))
    held = s.get_message("TopicA", 0, 0, 4)            # views into segment 0 outlive its deletion
    cleaned = s.clean_expired_files(now_ms)
    assert cleaned.segments == 3
    assert s.commit_log_min_offset == 3 * SEG
    assert sorted(os.listdir(cfg.commit_log_dir)) == segments[3:]
    first_kept = min(i for i, r in enumerate(results) if r.wrote_offset >= 3 * SEG)
    for qid in (0, 1):
        mn = s.get_min_offset_in_queue("TopicA", qid)
        first = next(r for r in results[first_kept:] if results.index(r) % 2 == qid)
        assert mn == first.queue_offset
        r = s.get_message("TopicA", qid, 0, 32)
        assert (r.status, r.next_begin_offset) == (GS.OFFSET_TOO_SMALL, mn)
        r = s.get_message("TopicA", qid, mn, 1)
        assert decode_record(joined(r)).commit_log_offset == first.wrote_offset
        r = s.get_message("TopicA", qid, 500, 1)
        assert (r.status, r.next_begin_offset) == (GS.OFFSET_OVERFLOW_BADLY, r.max_offset)
    assert cleaned.cq_files > 0
    assert decode_record(joined(held)).body == b"q" * 300
    del held
    # force deletes everything but the active segment
    assert s.clean_expired_files(now_ms, force=True).segments == len(segments) - 4
    assert len(os.listdir(cfg.commit_log_dir)) == 1
    assert s.put_message(msg(now=999)).ok
    s.close()
    s = opened(cfg)
    assert s.commit_log_min_offset == (len(segments) - 1) * SEG
    assert s.get_min_offset_in_queue("TopicA", 0) == s.get_min_offset_in_queue("TopicA", 0)
    s.close()


def test_delete_topics(tmp_path):
    cfg = config(tmp_path)
    s = opened(cfg)
    for i in range(5):
        s.put_message(msg(topic="Gone", qid=i % 3, now=i + 1))
        s.put_message(msg(topic="Kept", now=i + 1))
    assert s.delete_topics(["Gone", "Never"]) == 3
    assert s.topics() == ["Kept"]
    assert not os.path.exists(os.path.join(cfg.consume_queue_dir, "Gone"))
    assert s.get_max_offset_in_queue("Gone", 0) == 0
    assert s.put_message(msg(topic="Gone", now=50)).queue_offset == 0
    s.abandon()
    s = opened(cfg)                 # the old records are not dispatched again
    assert s.get_max_offset_in_queue("Gone", 0) == 1
    assert s.get_max_offset_in_queue("Kept", 0) == 5
    s.close()


def test_consume_queues_rebuilt_after_deleting_consumequeue(tmp_path):
    cfg = config(tmp_path, mapped_file_size_consume_queue=20 * 8)
    s = opened(cfg)
    for i in range(80):
        s.put_message(msg(topic="T%d" % (i % 3), qid=i % 4, props=tags(i % 5), body=b"r" * (i * 7 % 200), now=i))
    before = {(t, q): joined(s.get_message(t, q, 0, 1000)) for t in s.topics() for q in s.queue_ids(t)}
    maxes = {(t, q): s.get_max_offset_in_queue(t, q) for t, q in before}
    s.close()
    shutil.rmtree(cfg.consume_queue_dir)
    s = opened(cfg)
    assert s.topics() == ["T0", "T1", "T2"]
    for (t, q), data in before.items():
        assert s.get_max_offset_in_queue(t, q) == maxes[(t, q)]
        got = b""
        off = 0
        while off < maxes[(t, q)]:
            r = s.get_message(t, q, off, 1000)
            got += joined(r)
            off = r.next_begin_offset
        assert got.startswith(data) and decode_records(got)
    s.close()


class FailingOps(FileOps):
    def __init__(self):
        super().__init__()
        self.fail_sync = False
        self.fail_create = False
        self.syncs = 0

    def fdatasync(self, fd):
        self.syncs += 1
        if self.fail_sync:
            raise OSError(errno.EIO, "injected fdatasync failure")
        super().fdatasync(fd)

    def create(self, path, size):
        if self.fail_create:
            raise OSError(errno.ENOSPC, "injected: no space")
        return super().create(path, size)


def test_sticky_write_error(tmp_path):
    cfg = config(tmp_path)
    ops = FailingOps()
    s = opened(cfg, file_ops=ops)
    ok = s.put_message(msg(body=b"one", now=1))
    assert s.flush() == ok.end_offset
    s.put_message(msg(body=b"two", now=2))
    ops.fail_sync = True
    with pytest.raises(StoreError, match="fdatasync"):
        s.flush()
    assert s.flushed_offset == ok.end_offset        # did not move
    assert s.failed and "fdatasync" in s.failed
    assert s.put_message(msg(body=b"three", now=3)).status is PS.SERVICE_NOT_AVAILABLE
    ops.fail_sync = False
    syncs = ops.syncs
    with pytest.raises(StoreError):                 # never retried
        s.flush()
    with pytest.raises(StoreError):
        s.flush_consume_queues()
    assert ops.syncs == syncs and s.flushed_offset == ok.end_offset
    assert s.put_message(msg(body=b"four", now=4)).status is PS.SERVICE_NOT_AVAILABLE
    assert s.get_message("TopicA", 0, 0, 32).message_count == 2     # reads still work
    s.close()
    assert os.path.exists(cfg.abort_path)           # next open runs the abnormal recovery
    s = opened(cfg)
    assert s.get_max_offset_in_queue("TopicA", 0) == 2
    assert s.put_message(msg(body=b"five", now=5)).ok
    s.close()


def test_sticky_error_from_consume_queue_flush(tmp_path):
    ops = FailingOps()
    s = opened(config(tmp_path), file_ops=ops)
    s.put_message(msg(now=1))
    ops.fail_sync = True
    with pytest.raises(StoreError):
        s.flush_consume_queues()
    assert s.put_message(msg(now=2)).status is PS.SERVICE_NOT_AVAILABLE
    s.close()


def test_flush_checkpoints_after_enough_dispatch(tmp_path):
    cfg = config(tmp_path, checkpoint_interval_bytes=2000)
    s = opened(cfg)
    s.put_message(msg(body=b"x" * 100, now=1))
    s.flush()
    assert read_checkpoint(cfg.checkpoint_path).logics_physical_offset == 0     # not yet
    while s.commit_log_max_offset < 2000:
        s.put_message(msg(body=b"x" * 100, now=2))
    s.flush()
    ck = read_checkpoint(cfg.checkpoint_path)
    assert ck.logics_physical_offset == s.commit_log_max_offset == ck.flushed_physical_offset
    s.abandon()
    s = MessageStore(cfg)
    rep = s.open()
    assert rep.abnormal and rep.reput_from_offset == ck.logics_physical_offset
    s.close()


def test_segment_creation_failure_is_not_sticky(tmp_path):
    ops = FailingOps()
    s = opened(config(tmp_path), file_ops=ops)
    ops.fail_create = True
    assert s.put_message(msg(now=1)).status is PS.CREATE_MAPEDFILE_FAILED
    ops.fail_create = False
    first = s.put_message(msg(body=b"a" * 1000, now=2))
    assert first.ok and first.queue_offset == 0
    while s.put_message(msg(body=b"a" * 1000, now=3)).wrote_offset < 2 * SEG - 2000:
        pass
    before = s.commit_log_max_offset
    ops.fail_create = True
    r = s.put_message(msg(body=b"a" * 1000, now=4))
    assert r.status is PS.CREATE_MAPEDFILE_FAILED and s.failed is None
    assert s.commit_log_max_offset == before
    ops.fail_create = False
    assert s.put_message(msg(body=b"a" * 1000, now=5)).wrote_offset == 2 * SEG
    s.close()


def test_segment_creation_failures_are_logged_once_per_interval(tmp_path, caplog):
    # A full disk refuses every send; the log must not grow by a line per refused send.
    ops = FailingOps()
    s = opened(config(tmp_path), file_ops=ops)
    ops.fail_create = True
    with caplog.at_level(logging.ERROR, logger="pocketmq.store"):
        for i in range(500):
            assert s.put_message(msg(now=i + 1)).status is PS.CREATE_MAPEDFILE_FAILED
    # (the queue is new: its first consume-queue file is the one that cannot be created)
    lines = [r for r in caplog.records if "cannot create consume-queue file" in r.getMessage()]
    assert len(lines) == 1 and "no space" in lines[0].getMessage()
    s.close()


def test_checkpoint_abort_and_lock(tmp_path):
    cfg = config(tmp_path)
    s = opened(cfg)
    assert os.path.exists(cfg.abort_path)
    with pytest.raises(StoreError):
        MessageStore(cfg).open()
    r = s.put_message(msg(now=77))
    s.close()
    assert not os.path.exists(cfg.abort_path)
    ck = read_checkpoint(cfg.checkpoint_path)
    assert ck.flushed_physical_offset == r.end_offset == ck.logics_physical_offset
    assert ck.physic_msg_timestamp == 77 and ck.logics_msg_timestamp == 77
    raw = read_file(cfg.checkpoint_path)
    assert len(raw) == 4096 and struct.unpack_from(">q", raw, 0)[0] == 77
    s = MessageStore(cfg)
    rep = s.open()
    assert not rep.abnormal and rep.records_scanned == 0 and rep.commit_log_max_offset == r.end_offset
    s.close()
    assert Checkpoint.decode(b"\x00" * 4096) is None
    bad = bytearray(raw)
    bad[33] ^= 1
    assert Checkpoint.decode(bytes(bad)) is None


def test_write_file_atomic(tmp_path):
    p = str(tmp_path / "cfg" / "topics.json")
    write_file_atomic(p, b"one")
    write_file_atomic(p, b"two")
    assert read_file(p) == b"two"
    assert os.listdir(tmp_path / "cfg") == ["topics.json"]
    assert read_file(str(tmp_path / "nope")) is None


def test_flush_from_another_thread(tmp_path):
    s = opened(config(tmp_path))
    stop = threading.Event()
    flushed = []

    def flusher():
        while not stop.is_set():
            flushed.append(s.flush())
            s.flush_consume_queues()

    t = threading.Thread(target=flusher)
    t.start()
    try:
        for i in range(400):
            assert s.put_message(msg(body=b"t" * 100, now=i)).ok
            if i % 50 == 0:
                s.clean_expired_files(i, force=True)
    finally:
        stop.set()
        t.join()
    assert s.failed is None
    assert flushed == sorted(flushed)
    assert s.flush() == s.commit_log_max_offset
    s.close()


def test_closed_store(tmp_path):
    s = MessageStore(config(tmp_path))
    assert s.put_message(msg()).status is PS.SERVICE_NOT_AVAILABLE
    with pytest.raises(StoreError):
        s.get_message("TopicA", 0, 0, 1)


def _fast_and_general(s, topic, qid, offset, n):
    """get_message's answer, and the general per-unit loop's for the same pull."""
    fast = s.get_message(topic, qid, offset, n)
    general = MessageStore._get_unfiltered
    MessageStore._get_unfiltered = lambda *a, **k: None
    try:
        slow = s.get_message(topic, qid, offset, n)
    finally:
        MessageStore._get_unfiltered = general
    return fast, slow


@pytest.mark.parametrize("shape", ["adjacent-and-interleaved", "segments", "memory", "many-queues", "fillers",
                                   "exact-cap"])
def test_unfiltered_fast_path_agrees_with_the_general_loop(tmp_path, shape):
    """get_message's unfiltered fast path (the units' columns at once, runs of adjacent records
    coalesced) must answer exactly what the per-unit loop answers: status, next offset, count,
    bytes and the records' bytes, for every offset and several pull sizes. Shapes: one queue's
    records adjacent or interleaved with another's, batches, random sizes and a byte cap
    (3,000) that cuts pulls; records across many small commit-log segments (a run cannot
    span two); a memory limit that leaves the oldest records "on disk" (the disk caps apply);
    eight queues written round robin (every record its own run); filler units in the queue
    (the loop steps over them, also right after the last record it takes); records of one
    size with the byte cap exactly three of them (a sum equal to the cap is taken)."""
    import random
    rng = random.Random(7)
    kw = dict(max_transfer_count_on_message_in_memory=1024, max_transfer_bytes_on_message_in_memory=3000)
    if shape == "exact-cap":
        probe = opened(config(tmp_path / "probe"))
        record = probe.put_message(msg(body=b"e" * 77)).wrote_bytes
        probe.close()
        kw.update(max_transfer_bytes_on_message_in_memory=3 * record)
    if shape == "segments":
        kw.update(mapped_file_size_commit_log=1024)
    if shape == "memory":
        kw.update(total_physical_memory_bytes=100 * 40, access_message_in_memory_max_ratio=40,
                  max_transfer_bytes_on_message_in_disk=700, max_transfer_count_on_message_in_disk=4)
    s = opened(config(tmp_path, **kw))
    queues = 8 if shape == "many-queues" else 2
    for i in range(300):
        if shape == "many-queues":
            s.put_message(msg(qid=i % queues, body=b"r" * rng.randrange(1, 120)))
            continue
        if shape == "exact-cap":
            s.put_message(msg(qid=rng.randrange(2), body=b"e" * 77))
            continue
        if shape == "fillers" and rng.random() < 0.1:
            s._cq_table["TopicA"][0]._write_fillers(rng.randrange(1, 4))      # a gap in the queue
        if rng.random() < 0.3:   # interleave another queue: records of queue 0 stop being adjacent
            s.put_message(msg(qid=1, body=b"o" * rng.randrange(1, 200)))
        if rng.random() < 0.2:
            s.put_messages(MessageBatchToStore("TopicA", 0, 0, 1, HOST, 1000,
                                               [(0, b"b%d" % j, tags("B")) for j in range(rng.randrange(1, 6))]))
        else:
            s.put_message(msg(body=b"m" * rng.randrange(1, 300), props=tags("A")))
    taken = 0
    for qid in range(queues):
        mx = s.get_max_offset_in_queue("TopicA", qid)
        for offset in range(0, mx + 2):
            for n in (1, 3, 32, 500):
                fast, slow = _fast_and_general(s, "TopicA", qid, offset, n)
                assert (fast.status, fast.next_begin_offset, fast.message_count, fast.buffer_total_size) == \
                       (slow.status, slow.next_begin_offset, slow.message_count, slow.buffer_total_size), \
                       (qid, offset, n)
                assert joined(fast) == joined(slow)
                taken += fast.message_count
    assert taken > 1000
    s.close()


@pytest.mark.parametrize("case", ["gap-then-overlap", "out-of-order", "zero-unit", "zero-unit-deleted-segment",
                                  "zero-unit-out-of-memory", "negative-size", "zero-unit-back-a-segment"])
def test_unfiltered_fast_path_leaves_units_no_queue_holds_to_the_loop(tmp_path, case):
    """Consume-queue units out of order, overlapping, all zero (what a crash leaves before
    reput repairs it) or of a negative size: the fast path must still answer as the general
    loop (a fresh-eyes review found each of these answered differently before the order and
    size checks): a span equal to the sizes' sum is no proof of adjacency, and a running sum
    with a negative size is not sorted."""
    kw = {}
    if case == "zero-unit-deleted-segment":
        kw = dict(mapped_file_size_commit_log=1024)
    if case == "zero-unit-back-a-segment":
        kw = dict(mapped_file_size_commit_log=1024)
    if case == "zero-unit-out-of-memory":
        kw = dict(mapped_file_size_commit_log=1024, total_physical_memory_bytes=100 * 40,
                  access_message_in_memory_max_ratio=40, max_transfer_count_on_message_in_disk=1)
    if case == "negative-size":
        kw = dict(max_transfer_bytes_on_message_in_memory=3 * 101 // 2)
    s = opened(config(tmp_path, **kw))
    body = b"y" * 200 if case.startswith("zero-unit-") else b"x%03d" % 0
    r = [s.put_message(msg(body=body)) for _ in range(20 if case.startswith("zero-unit-") else 6)]
    size = r[0].wrote_bytes
    s.put_message(msg(topic="TopicB", body=b"seed"))      # TopicB queue 0, unit 0: a real record
    at = [x.wrote_offset for x in r]
    if case.startswith("zero-unit-"):
        pair = [x.wrote_offset for x in r if x.wrote_offset >= 2048][:2]
        assert pair[1] == pair[0] + size
    units = {
        "gap-then-overlap": [(at[0], size), (at[0] + size + 5, size), (at[0] + 2 * size, size)],
        "out-of-order": [(at[0], size), (at[4], size), (at[2], size)],
        "zero-unit": [(at[0], size), (0, 0), (at[1], size)],
        "negative-size": [(at[0], size), (at[1], size), (at[2], -size), (at[1], 0)],
    }.get(case)
    if units is None and case == "zero-unit-back-a-segment":
        # a later unit pointing back into the segment before the first's (out of order):
        # its slice of the first's segment would start below it
        units = [(pair[0], size), (at[0], size), (pair[1], size)]
    elif units is None:
        units = [(pair[0], size), (0, 0), (pair[1], size)]
    cq = s._cq_table["TopicB"][0]
    for phys, n in units:
        cq.put(cq.max_offset, phys, n, 0)
    if case == "zero-unit-deleted-segment":
        s._commitlog.delete_first_segments(1)
    for max_nums in (1, 3, 32):
        fast, slow = _fast_and_general(s, "TopicB", 0, 1, max_nums)
        assert (fast.status, fast.next_begin_offset, fast.message_count, fast.buffer_total_size) == \
               (slow.status, slow.next_begin_offset, slow.message_count, slow.buffer_total_size), max_nums
        assert joined(fast) == joined(slow) and len(fast.buffers) == len(slow.buffers)
    s.close()


def test_unfiltered_fast_path_answers_without_the_general_loop(tmp_path):
    """The fast path is taken (not only agreed with) for interleaved queues: the general loop
    is never reached for pulls of records in one in-memory segment."""
    s = opened(config(tmp_path, mapped_file_size_commit_log=1 << 20))
    for i in range(200):
        s.put_message(msg(qid=i % 4, body=b"x" * 50))
    calls = []
    general = MessageStore._get_unfiltered

    def spy(*a, **k):
        r = general(*a, **k)
        calls.append(r is not None)
        return r
    MessageStore._get_unfiltered = spy
    try:
        r = s.get_message("TopicA", 2, 0, 32)
    finally:
        MessageStore._get_unfiltered = general
    assert calls == [True] and r.message_count == 32 and len(r.buffers) == 32     # each record its own run
    s.close()


def test_clean_expired_consume_queues_on_demand(tmp_path):
    """cleanExpiredCQ: commit-log segments gone while the store was closed (removed by hand,
    or a crash between deleting segments and cleaning the queues) leave consume-queue files
    pointing nowhere; clean_expired_consume_queues drops them and moves min offsets up."""
    cfg = config(tmp_path, mapped_file_size_consume_queue=20 * 8)
    s = opened(cfg)
    results = [s.put_message(msg(qid=0, body=b"q" * 300, now=i + 1)) for i in range(60)]
    s.flush()
    s.flush_consume_queues()
    s.close()
    segments = sorted(os.listdir(cfg.commit_log_dir))
    assert len(segments) >= 5
    for name in segments[:3]:
        os.remove(os.path.join(cfg.commit_log_dir, name))
    s = opened(cfg)
    assert s.commit_log_min_offset == 3 * SEG
    cq_dir = os.path.join(cfg.store_path_root_dir, "consumequeue", "TopicA", "0")
    before = sorted(os.listdir(cq_dir))
    removed = s.clean_expired_consume_queues()
    after = sorted(os.listdir(cq_dir))
    assert removed > 0 and len(after) == len(before) - removed
    first = next(r for r in results if r.wrote_offset >= 3 * SEG)
    assert s.get_min_offset_in_queue("TopicA", 0) == first.queue_offset
    assert s.clean_expired_consume_queues() == 0          # nothing left to clean
    s.close()


class _NoNewConsumeQueueFiles(FileOps):
    """Creating a consume-queue file fails (descriptors exhausted) while `refusing`."""

    def __init__(self):
        super().__init__()
        self.refusing = False

    def create(self, path, size):
        if self.refusing and "consumequeue" in path:
            raise NotOpened(errno.EMFILE, f"cannot create {path}: Too many open files")
        return super().create(path, size)


def test_records_left_undispatched_by_a_failed_queue_file_reach_the_queue_without_another_put(tmp_path):
    """A batch whose units cross into a consume-queue file that cannot be created is stored
    (and acknowledged) but not dispatched; catch_up_dispatch (the broker calls it every
    second) dispatches it once the file can be created, with no further put."""
    ops = _NoNewConsumeQueueFiles()
    s = opened(config(tmp_path, mapped_file_size_consume_queue=4 * 20), file_ops=ops)
    for i in range(3):
        assert s.put_message(msg(now=i + 1)).ok
    ops.refusing = True
    items = [(0, b"b%d" % i, "") for i in range(3)]      # units 3..5: the second file is needed
    r = s.put_messages(MessageBatchToStore("TopicA", 0, 0, 5, HOST, 6, items))
    assert r.ok and r.queue_offset == 3
    assert s.get_max_offset_in_queue("TopicA", 0) < 6
    assert not s.catch_up_dispatch()                     # still refused: nothing changes
    ops.refusing = False
    assert s.catch_up_dispatch()
    assert s.get_max_offset_in_queue("TopicA", 0) == 6
    off, got = 3, 0
    while off < 6:                                       # a pull stops at a queue file's end
        r = s.get_message("TopicA", 0, off, 32)
        assert r.message_count
        off, got = r.next_begin_offset, got + r.message_count
    assert got == 3
    s.close()


def test_fitting_matches_the_running_sum():
    """read._fitting (sums of a guessed prefix, moved to the answer) gives what the running
    sum and bisect give: the first record always, then each while the sum fits the cap."""
    import random
    from bisect import bisect_right
    from itertools import accumulate

    from pocketmq.broker.store.read import _fitting

    rng = random.Random(3)
    for trial in range(3000):
        n = rng.randint(1, 300)
        spread = rng.choice([0, 5, 50, 5000])
        base = rng.randint(1, 2000)
        sizes = tuple(max(1, base + rng.randint(-spread, spread)) for _ in range(n))
        if trial % 7 == 0:
            sizes = (rng.randint(1, 10**6),) + sizes[1:]       # a first record larger than the cap
        limit = rng.randint(1, n)
        cap = rng.choice([1, base, base * rng.randint(1, 400), 10**9])
        acc = list(accumulate(sizes[:limit]))
        k = max(1, bisect_right(acc, cap))
        assert _fitting(sizes, limit, cap) == (k, acc[k - 1]), (sizes, limit, cap)


def test_sizes_plain_reads_the_size_fields_as_the_unpacked_ints():
    """consumequeue.sizes_plain: True exactly when every size of the first m units is in
    (0, 16 MiB), for fillers, zero units, negative and large sizes anywhere, other fields
    holding any bytes, and m short of the buffer's units."""
    import random

    from pocketmq.broker.store.consumequeue import CQ_UNIT, sizes_plain

    rng = random.Random(4)
    odd = [0, -1, -(1 << 31), 0x7FFFFFFF, 1 << 24, (1 << 24) - 1, 1, 255, 256, 65536]
    for trial in range(2000):
        n = rng.randint(1, 60)
        sizes = [rng.randint(1, 5000) for _ in range(n)]
        for _ in range(rng.choice([0, 0, 1, 2])):
            sizes[rng.randrange(n)] = rng.choice(odd)
        units = b"".join(CQ_UNIT.pack(rng.randint(0, 1 << 40), s, rng.randint(-(1 << 63), (1 << 63) - 1))
                         for s in sizes)
        m = rng.randint(1, n)
        want = all(0 < s < (1 << 24) for s in sizes[:m])
        assert sizes_plain(memoryview(units), m) is want, (sizes, m)


@pytest.mark.parametrize("first", ["large", "small", "uniform"])
def test_unfiltered_fast_path_guess_of_the_units_the_cap_reaches(tmp_path, first, monkeypatch):
    """The fast path unpacks the units the byte cap lets a pull reach, guessed from the
    first record's size: a large first record (the guess falls short: redone with all the
    units), a small one (the guess covers all) and records of one size (only the guess's
    units unpacked) all answer as the general loop, and from the fast path itself."""
    from pocketmq.broker.store import read

    s = opened(config(tmp_path, max_transfer_count_on_message_in_memory=1024,
                      max_transfer_bytes_on_message_in_memory=3000))
    big, small = {"large": (b"L" * 600, b"s"), "small": (b"s", b"L" * 600), "uniform": (b"u" * 50, b"u" * 50)}[first]
    s.put_message(msg(body=big))
    for _ in range(60):
        s.put_message(msg(body=small))
    answered = []
    unpacked = []
    general = MessageStore._get_unfiltered
    columns = read.unit_columns

    def spy(*a, **k):
        r = general(*a, **k)
        answered.append(r is not None)
        return r
    monkeypatch.setattr(read, "unit_columns", lambda buf, pos, m: unpacked.append(m) or columns(buf, pos, m))
    MessageStore._get_unfiltered = spy
    try:
        fast = s.get_message("TopicA", 0, 0, 500)
    finally:
        MessageStore._get_unfiltered = general
    assert answered == [True]
    if first == "uniform":
        assert len(unpacked) == 1 and fast.message_count < unpacked[0] < 61, unpacked
    _, slow = _fast_and_general(s, "TopicA", 0, 0, 500)
    assert (fast.status, fast.next_begin_offset, fast.message_count, fast.buffer_total_size) == \
           (slow.status, slow.next_begin_offset, slow.message_count, slow.buffer_total_size)
    assert joined(fast) == joined(slow) and fast.message_count > 3
    s.close()
