"""Stored-record codec, properties, tags hash, batch body, message ids (protocol/message.py)."""
from __future__ import annotations

import random
import struct
import zlib

import pytest

from pocketmq.protocol import message as m
from pocketmq.protocol.message import (BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, MessageSysFlag,
                              decode_batch_body, decode_offset_msg_id, decode_properties,
                              decode_record, decode_records, encode_batch_body,
                              encode_properties, encode_record, encode_record_into,
                              java_string_hash, offset_msg_id, parse_host, patch_record,
                              tags_code)

LOCAL = bytes([127, 0, 0, 1])

A3_HEX = (
    "0000007CDAA320A758932AAC00000000"
    "00000000000000000000000000000000"
    "00000000000000000000018BCFE56800"
    "7F0000010000C3500000018BCFE5687B"
    "7F00000100002A9F0000000000000000"
    "000000000000000268690154001E4B45"
    "5953016B310254414753015461674102"
    "554E49515F4B455901414243"
)
A3_PROPS = "KEYS\x01k1\x02TAGS\x01TagA\x02UNIQ_KEY\x01ABC"


def a3_record() -> bytes:
    return encode_record("T", 0, 0, b"hi", A3_PROPS, 0, 1700000000000, (LOCAL, 50000),
                         (LOCAL, 10911), 0, 0, 0, 0, 1700000000123)


def test_constants():
    assert MESSAGE_MAGIC_CODE == struct.unpack(">i", bytes.fromhex("DAA320A7"))[0]
    assert BLANK_MAGIC_CODE == struct.unpack(">i", bytes.fromhex("CBD43194"))[0]
    from pocketmq.common import constants
    assert constants.SCHEDULE_TOPIC == "SCHEDULE_TOPIC_XXXX" and constants.CQ_UNIT_SIZE == 20
    assert MessageSysFlag.transaction_value(0x30C) == 0xC


def test_a3_encode_byte_exact():
    rec = a3_record()
    assert len(rec) == 124
    assert rec.hex().upper() == A3_HEX
    assert struct.unpack_from(">i", rec, 8)[0] == 0x58932AAC


def test_a3_encode_into_byte_exact():
    buf = bytearray(200)
    n = encode_record_into(buf, 10, b"T", 0, 0, b"hi", A3_PROPS.encode(), 0, 1700000000000,
                           (LOCAL, 50000), (LOCAL, 10911), 0, 0, 0, 0, 1700000000123)
    assert n == 124
    assert bytes(buf[10:134]).hex().upper() == A3_HEX


def test_a3_decode():
    msg = decode_record(bytes.fromhex(A3_HEX))
    assert msg.topic == "T" and msg.body == b"hi" and msg.queue_id == 0
    assert msg.properties == {"KEYS": "k1", "TAGS": "TagA", "UNIQ_KEY": "ABC"}
    assert msg.tags == "TagA" and msg.keys == ("k1",)   # one MessageExt: KEYS as a tuple
    assert msg.born_timestamp == 1700000000000 and msg.store_timestamp == 1700000000123
    assert msg.born_host == "127.0.0.1:50000" and msg.store_host == "127.0.0.1:10911"
    assert msg.store_size == 124 and msg.body_crc == 0x58932AAC
    assert msg.offset_msg_id == "7F00000100002A9F0000000000000000"
    assert msg.msg_id == "ABC"
    # decode from a memoryview at an offset
    buf = bytearray(7) + bytes.fromhex(A3_HEX)
    assert decode_record(memoryview(buf), 7) == msg


def test_patch_record():
    buf = bytearray(a3_record())
    patch_record(buf, 0, 7, 4096, 1700000009999)
    msg = decode_record(bytes(buf))
    assert (msg.queue_offset, msg.commit_log_offset, msg.store_timestamp) == (7, 4096, 1700000009999)
    # IPv6 born host shifts STORETIMESTAMP
    v6 = parse_host("[::1]:5")[0]
    buf = bytearray(encode_record("T", 1, 2, b"b", "", 0, 1, (v6, 5), (LOCAL, 6), 0, 0, 0, 0, 3))
    patch_record(buf, 0, 11, 22, 33)
    msg = decode_record(bytes(buf))
    assert (msg.queue_offset, msg.commit_log_offset, msg.store_timestamp, msg.born_timestamp) == (11, 22, 33, 1)


@pytest.mark.parametrize("born,store", [("127.0.0.1:1", "::1:10911"), ("[fe80::1]:2", "10.0.0.1:3"),
                                        ("[2001:db8::5]:60000", "[2001:db8::6]:10911")])
def test_ipv6_round_trip(born, store):
    bh = parse_host(born)
    sh = parse_host(store)
    rec = encode_record("TopicV6", 3, 9, b"body", "TAGS\x01x", 0, 5, bh, sh, 2, 7, 8, 9, 10)
    msg = decode_record(rec)
    assert parse_host(msg.born_host) == bh and parse_host(msg.store_host) == sh
    assert bool(msg.sys_flag & 0x10) == (len(bh[0]) == 16)
    assert bool(msg.sys_flag & 0x20) == (len(sh[0]) == 16)
    assert (msg.topic, msg.queue_id, msg.flag, msg.body, msg.reconsume_times,
            msg.prepared_transaction_offset, msg.queue_offset, msg.commit_log_offset,
            msg.store_timestamp) == ("TopicV6", 3, 9, b"body", 2, 7, 8, 9, 10)
    assert len(rec) == m.record_size(4, 7, 6, msg.sys_flag)
    assert len(msg.offset_msg_id) == (32 if len(sh[0]) == 4 else 56)
    assert decode_offset_msg_id(msg.offset_msg_id)[1:] == (sh[1], 9)


@pytest.mark.parametrize("tag,code,hexbytes", [
    ("TagA", 2598919, "000000000027A807"),
    ("中文", 646394, "000000000009DCFA"),
    ("TagNeg_xyz_12345", -1465635644, "FFFFFFFFA8A42CC4"),
])
def test_a4_tag_hashes(tag, code, hexbytes):
    assert java_string_hash(tag) == code
    assert tags_code(tag) == code
    assert struct.pack(">q", tags_code(tag)).hex().upper() == hexbytes


def test_tags_code_misc():
    assert tags_code(None) == 0 and tags_code("") == 0
    assert java_string_hash("TagB") == 2598920
    # a supplementary-plane char hashes as two UTF-16 units
    assert java_string_hash("\U0001F600") == (31 * 0xD83D + 0xDE00)


def test_a5_zlib():
    data = b"hello hello hello hello"
    assert m.compress_body(data).hex() == "785ecb48cdc9c957c8402701680308b1"
    assert m.decompress_body(m.compress_body(data)) == data
    body, bits = m.maybe_compress(b"x" * 4096)
    assert bits == MessageSysFlag.COMPRESSED_FLAG and zlib.decompress(body) == b"x" * 4096
    assert m.maybe_compress(b"x" * 4095) == (b"x" * 4095, 0)


def test_compressed_record_inflates():
    data = b"payload " * 1000
    for flag in (0x1, 0x301):
        rec = encode_record("T", 0, 0, m.compress_body(data), "", flag, 1, (LOCAL, 1), (LOCAL, 2), 0, 0, 0, 0, 0)
        assert decode_record(rec).body == data
        assert decode_record(rec, decompress=False).body == m.compress_body(data)
    lz4 = encode_record("T", 0, 0, b"xx", "", 0x101, 1, (LOCAL, 1), (LOCAL, 2), 0, 0, 0, 0, 0)
    with pytest.raises(ValueError):
        decode_record(lz4)
    bad = encode_record("T", 0, 0, b"not zlib", "", 0x1, 1, (LOCAL, 1), (LOCAL, 2), 0, 0, 0, 0, 0)
    with pytest.raises(ValueError):
        decode_record(bad)


def test_properties_trailing_separator():
    want = {"KEYS": "k1", "TAGS": "TagA"}
    assert decode_properties("KEYS\x01k1\x02TAGS\x01TagA") == want
    assert decode_properties("KEYS\x01k1\x02TAGS\x01TagA\x02") == want
    assert encode_properties(want) == "KEYS\x01k1\x02TAGS\x01TagA"
    assert encode_properties({"A": "1", "B": None}) == "A\x011"


def test_properties_java_rules():
    # \x01 first or last, or missing: dropped; value may contain \x01
    s = "\x01v\x02k\x01\x02novalue\x02a\x01b\x01c\x02\x02x\x01y\x02x\x01z"
    assert decode_properties(s) == {"a": "b\x01c", "x": "z"}
    assert decode_properties("") == {}
    for s in (A3_PROPS, A3_PROPS + "\x02", "TAGS\x01", "XTAGS\x01a\x02TAGS\x01b", "a\x01TAGS\x01q",
              "TAGS\x01中文\x02K\x01v", "TAGS\x01a\x02TAGS\x01TagNeg_xyz_12345", "", "\x02TAGS\x01\x02"):
        assert m.property_value(s, "TAGS") == decode_properties(s).get("TAGS"), s
        assert m.tags_code_of_properties(s.encode()) == tags_code(decode_properties(s).get("TAGS")), s
    with pytest.raises(ValueError):
        encode_properties({"a\x01": "b"})
    with pytest.raises(ValueError):
        encode_properties({"a": "b\x02"})


def test_batch_round_trip():
    items = [(0, b"one", "UNIQ_KEY\x01A"), (5, b"", ""), (-1, b"\x00" * 300, "TAGS\x01t\x02KEYS\x01k k2")]
    body = encode_batch_body(items)
    assert decode_batch_body(body) == items
    assert struct.unpack_from(">i", body, 0)[0] == 22 + 3 + 10
    # C++ 1.2.x writes TOTALSIZE = 20 + n + 2 + m - 2: ignored like Java does
    cpp = bytearray(body)
    struct.pack_into(">i", cpp, 0, 20 + 3 + 10)
    assert decode_batch_body(bytes(cpp)) == items
    assert decode_batch_body(encode_batch_body([(1, b"x", {"a": "b"})])) == [(1, b"x", "a\x01b")]


def test_batch_garbage():
    body = encode_batch_body([(0, b"one", "UNIQ_KEY\x01A")])
    for cut in range(len(body)):
        with pytest.raises(ValueError):
            decode_batch_body(body[:cut])
    bad = bytearray(body)
    struct.pack_into(">i", bad, 16, -1)
    with pytest.raises(ValueError):
        decode_batch_body(bytes(bad))
    rng = random.Random(1)
    for _ in range(500):
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        try:
            decode_batch_body(blob)
        except ValueError:
            pass


def test_msg_id_round_trip():
    mid = offset_msg_id(bytes([10, 0, 0, 1]), 10911, 1234)
    assert mid == "0A00000100002A9F00000000000004D2"
    assert decode_offset_msg_id(mid) == ("10.0.0.1", 10911, 1234)
    assert m.offset_msg_id_prefix(bytes([10, 0, 0, 1]), 10911) + format(1234, "016X") == mid
    v6 = parse_host("[2001:db8::1]:10911")[0]
    mid6 = offset_msg_id(v6, 10911, 2 ** 40)
    assert len(mid6) == 56
    assert decode_offset_msg_id(mid6) == ("2001:db8::1", 10911, 2 ** 40)
    for bad in ("", "XYZ", "0A00000100002A9F00000000000004D", "G" * 32, "0A00000100002A9F80000000000004D2"):
        with pytest.raises(ValueError):
            decode_offset_msg_id(bad)


def test_parse_host():
    assert parse_host("10.0.0.1:10911") == (bytes([10, 0, 0, 1]), 10911)
    assert parse_host("::1:10911") == parse_host("[::1]:10911")
    assert m.format_host(*parse_host("[::1]:10911")) == "::1:10911"
    for bad in ("10.0.0.1", "x:1", "10.0.0.1:99999", ":5", "10.0.0.1:abc"):
        with pytest.raises(ValueError):
            parse_host(bad)


def test_decode_records_concatenated():
    recs = [encode_record(f"T{i}", i, i, bytes([i]) * i, f"UNIQ_KEY\x01{i}", 0, i, (LOCAL, i), (LOCAL, 9), 0, 0, i, i * 1000, i)
            for i in range(5)]
    msgs = decode_records(b"".join(recs))
    assert [x.topic for x in msgs] == [f"T{i}" for i in range(5)]
    assert [x.msg_id for x in msgs] == [str(i) for i in range(5)]


def test_encode_limits():
    with pytest.raises(ValueError):
        encode_record("T" * 128, 0, 0, b"", "", 0, 0, (LOCAL, 1), (LOCAL, 1), 0, 0, 0, 0, 0)
    with pytest.raises(ValueError):
        encode_record("T", 0, 0, b"", "a\x01" + "b" * 32766, 0, 0, (LOCAL, 1), (LOCAL, 1), 0, 0, 0, 0, 0)
    with pytest.raises(ValueError):
        encode_record("T", 0, 0, b"", "", 0, 0, (b"\x01\x02", 1), (LOCAL, 1), 0, 0, 0, 0, 0)
    rec = encode_record("T" * 127, 0, 0, b"", "a\x01" + "b" * 32765, 0, 0, (LOCAL, 1), (LOCAL, 1), 0, 0, 0, 0, 0)
    assert decode_record(rec).topic == "T" * 127


def test_decode_garbage_only_value_error():
    rec = a3_record()
    for cut in range(len(rec)):
        with pytest.raises(ValueError):
            decode_record(rec[:cut])
    rng = random.Random(7)
    for _ in range(3000):
        buf = bytearray(rec)
        for _ in range(rng.randrange(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        try:
            decode_record(bytes(buf))
        except ValueError:
            pass
    for _ in range(500):
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        try:
            decode_records(blob)
        except ValueError:
            pass
    flipped = bytearray(rec)
    flipped[88] ^= 1    # first body byte
    with pytest.raises(ValueError):
        decode_record(bytes(flipped), check_crc=True)
    assert decode_record(bytes(flipped)).body == b"ii"


def test_batch_decode_appends_batch_properties_and_bounds_bodies():
    import pytest
    from pocketmq.protocol.message import decode_batch_body, encode_batch_body
    body = encode_batch_body([(1, b"a", "K\x01v"), (2, b"bb", ""), (3, b"c", "X\x01y\x02")])
    got = decode_batch_body(body, raw_properties=True, append_properties=b"CLUSTER\x01C")
    assert got == [(1, b"a", b"K\x01v\x02CLUSTER\x01C"), (2, b"bb", b"CLUSTER\x01C"),
                   (3, b"c", b"X\x01y\x02CLUSTER\x01C")]
    with pytest.raises(ValueError, match="exceeds"):
        decode_batch_body(body, raw_properties=True, body_bytes_max=1)
    with pytest.raises(ValueError):
        decode_batch_body(body, append_properties=b"x")


# --- the layout's one owner: positions, helpers, the one writer, the one batch parser -------------

def test_layout_positions_match_the_encoder():
    v6 = bytes(range(16))
    for born, store in ((LOCAL, LOCAL), (v6, LOCAL), (LOCAL, v6), (v6, v6)):
        rec = encode_record("T", 3, 5, b"body", "TAGS\x01A", 0x4, 1111, (born, 1), (store, 2), 7, 8,
                            9, 4096, 2222)
        sys_flag = m.sys_flag_at(rec)
        assert sys_flag & m.HOST_V6_FLAGS == m.host_flags(0, len(born), len(store))
        assert struct.unpack_from(">q", rec, m.POS_QUEUE_OFFSET)[0] == 9
        assert struct.unpack_from(">q", rec, m.POS_PHYSICAL_OFFSET)[0] == 4096
        assert struct.unpack_from(">q", rec, m.POS_BORN_TIMESTAMP)[0] == 1111
        assert rec[m.POS_BORN_HOST:m.POS_BORN_HOST + len(born)] == born
        assert m.store_timestamp_at(rec) == 2222
        assert m.store_timestamp_at(rec, 0, m.store_timestamp_pos(sys_flag) + 7) == -1
        assert m.store_timestamp_at(rec[:m.RECORD_HEAD_MIN - 1]) == -1
        assert m.head_struct_at(rec, 0) is m.head_struct(sys_flag)
        assert len(rec) == m.record_overhead(sys_flag) + 4 + 1 + 6
        assert m.unpack_size_magic(rec, 0) == (len(rec), MESSAGE_MAGIC_CODE)
        assert struct.unpack_from(">i", rec, 8)[0] == m.body_crc(b"body")
    assert m.host_flags(0x30, 4, 4) == 0 and m.host_flags(0, 5, 4) is None and m.host_flags(0, 4, 6) is None
    buf = bytearray(16)
    m.pack_blank_marker(buf, 4, 12)
    assert m.unpack_size_magic(buf, 4) == (12, BLANK_MAGIC_CODE) and m.BLANK_MARKER_SIZE == 8


def test_join_records_single_and_batch_equal_encode_record():
    size = m.record_overhead(0) + 2 + 1 + len(A3_PROPS)
    rec = m.join_records(0, 0, 0, 0, 1700000000000, (LOCAL, 50000), 1700000000123, (LOCAL, 10911), 0, 0,
                         m.topic_field(b"T"), [(size, 0, memoryview(b"xhi")[1:], A3_PROPS.encode())])
    assert rec.hex().upper() == A3_HEX
    # a batch (the shared header fields packed once): offsets count up, each record as
    # encode_record writes it, IPv4 and IPv6 hosts
    v6 = bytes(range(16))
    for born, store in ((LOCAL, LOCAL), (v6, LOCAL), (LOCAL, v6), (v6, v6)):
        sys_flag = m.host_flags(0, len(born), len(store))
        elements = [(m.record_overhead(sys_flag) + len(b) + 1 + 3, 7, b, b"k\x01v") for b in (b"a", b"bb", b"")]
        batch = m.join_records(3, 10, 4096, sys_flag, 1700000000000, (born, 50000), 1700000000123, (store, 10911),
                               2, 0, m.topic_field(b"T"), elements)
        want, phys = b"", 4096
        for i, (size, flag, b, p) in enumerate(elements):
            want += encode_record("T", 3, flag, b, p, 0, 1700000000000, (born, 50000), (store, 10911), 2, 0,
                                  10 + i, phys, 1700000000123)
            phys += size
        assert batch == want


def test_indexed_rule():
    S = MessageSysFlag
    assert S.indexed(0) and S.indexed(S.TRANSACTION_COMMIT_TYPE) and S.indexed(0x10 | 0x1)
    assert not S.indexed(S.TRANSACTION_PREPARED_TYPE) and not S.indexed(S.TRANSACTION_ROLLBACK_TYPE)


def test_parse_batch_body_is_decode_batch_body():
    body = encode_batch_body([(1, b"a", "TAGS\x01X"), (2, b"", ""), (3, b"ccc", "k\x01v\x02")])
    got = [(f, bytes(d), p) for f, d, p in m.parse_batch_body(body, b"CLUSTER\x01C")]
    assert got == decode_batch_body(body, raw_properties=True, append_properties=b"CLUSTER\x01C")
    assert got[0][2] == b"TAGS\x01X\x02CLUSTER\x01C" and got[1][2] == b"CLUSTER\x01C"
    assert got[2][2] == b"k\x01v\x02CLUSTER\x01C"
    assert type(m.parse_batch_body(body)[0][1]) is memoryview      # bodies not copied
    with pytest.raises(ValueError, match="batch element 1: body of 3B exceeds the limit 2B"):
        m.parse_batch_body(encode_batch_body([(1, b"a", ""), (2, b"ccc", "")]), body_bytes_max=2)


def test_decode_records_skipping_keeps_good_records():
    good = [encode_record("T", 0, 0, b"m%d" % i, "TAGS\x01A", 0, 1, (LOCAL, 1), (LOCAL, 2), 0, 0, i, i * 100, 5)
            for i in range(3)]
    bad = bytearray(encode_record("T", 0, 0, b"x", "k\x01\xff", 0, 1, (LOCAL, 1), (LOCAL, 2), 0, 0, 7, 50, 5))
    bad[-1] = 0xFF      # properties no longer UTF-8 (c3 ff)
    body = good[0] + bytes(bad) + good[1] + good[2]
    with pytest.raises(ValueError):
        decode_records(body)
    recs, skipped = m.decode_records_skipping(body)
    assert [r.body for r in recs] == [b"m0", b"m1", b"m2"] and [q for q, _e in skipped] == [7]
    raw, skipped_raw = m.decode_records_skipping(body, m.decode_records_raw)
    assert [t[1] for t in raw] == [b"m0", b"m1", b"m2"] and skipped_raw == skipped
    assert m.decode_records_skipping(body[:-3]) is None      # framing broken: nothing trusted
    assert m.decode_records_skipping(b"") == ([], [])


def test_one_message_ext_type():
    from pocketmq.client import MessageExt as ClientMessageExt
    from pocketmq.client.message import FrozenProperties
    from pocketmq.common.constants import RETRY_GROUP_TOPIC_PREFIX
    assert ClientMessageExt is m.MessageExt and FrozenProperties is m.FrozenProperties
    assert m.RETRY_GROUP_TOPIC_PREFIX is RETRY_GROUP_TOPIC_PREFIX == "%RETRY%"
    rec = decode_record(encode_record("%RETRY%G", 1, 0, b"b", "RETRY_TOPIC\x01T\x02DELAY\x013", 0, 1,
                                      (LOCAL, 1), (LOCAL, 2), 0, 0, 0, 0, 5))
    assert type(rec) is m.MessageExt and rec.topic == rec.real_topic == "%RETRY%G"
    assert rec.delay_time_level == rec.delay_level == 3 and rec.born_host == "127.0.0.1:1"
    view = m.MessageExt.from_record(rec, "b")
    assert view.topic == "T" and view.real_topic == "%RETRY%G" and view.broker_name == "b"
    assert decode_records(encode_record("T", 0, 0, b"b", "", 0, 1, (LOCAL, 1), (LOCAL, 2), 0, 0, 0, 0, 5)) == \
        [decode_record(encode_record("T", 0, 0, b"b", "", 0, 1, (LOCAL, 1), (LOCAL, 2), 0, 0, 0, 0, 5))]


def test_offset_msg_ids_joined():
    host = bytes([10, 0, 0, 1])
    prefix = m.offset_msg_id_prefix(host, 10911)
    offsets = [0, 1234, 2**40 + 7]
    assert m.offset_msg_ids(prefix, offsets) == ",".join(offset_msg_id(host, 10911, o) for o in offsets)
    assert m.offset_msg_ids(prefix, [5]) == offset_msg_id(host, 10911, 5)
