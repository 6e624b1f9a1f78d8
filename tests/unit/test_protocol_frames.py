"""Frame codec: golden frames, every split point, garbage yields only ProtocolError, a read
of one whole frame (FrameDecoder.whole_frame) decodes and fails as the buffer does."""
import json
import random
import struct

import pytest

from pocketmq.protocol.codes import LanguageCode, RequestCode, SerializeType
from pocketmq.protocol.command import FrameDecoder, RemotingCommand, encode, encode_parts
from pocketmq.protocol.errors import ProtocolError
from pocketmq.protocol.headers.codec import ENCODERS, decode_json, decode_rocketmq, encode_rocketmq

JAVA_HB_RESPONSE = b'{"code":0,"flag":1,"language":"JAVA","opaque":3,"serializeTypeCurrentRPC":"JSON","version":401}'


def test_appendix_a1_java_heartbeat_response_frame():
    frame = encode(RemotingCommand(0, opaque=3, flag=1))
    assert len(JAVA_HB_RESPONSE) == 95
    assert frame[:8] == bytes.fromhex("000000630000005F")
    assert frame[8:] == JAVA_HB_RESPONSE
    assert len(frame) == 103


def test_appendix_a2_rocketmq_binary_header():
    hdr = encode_rocketmq(34, LanguageCode.CPP, 63, 7, 0, None, {"a": "b"})
    assert hdr == bytes.fromhex("0022" "01" "003F" "00000007" "00000000" "00000000" "00000008" "0001" "61" "00000001" "62")
    cmd = RemotingCommand(34, opaque=7, ext_fields={"a": "b"}, language=LanguageCode.CPP, version=63,
                          serialize_type=SerializeType.ROCKETMQ)
    frame = encode(cmd)
    assert frame[4:8] == bytes.fromhex("0100001D")
    assert decode_rocketmq(hdr) == (34, 1, 63, 7, 0, None, {"a": "b"})


def test_cpp_request_header_quirks_are_normalised():
    # Numbers inside extFields, "remark":"", trailing newline: what C++ 1.2.x sends.
    text = ('{"code":10,"extFields":{"AccessKey":"","batch":"0","defaultTopicQueueNums":4,"queueId":1,'
            '"sysFlag":0,"flag":0,"unitMode":false},"flag":0,"language":"CPP","opaque":7,"remark":"","version":63}\n')
    code, lang, version, opaque, flag, remark, ext = decode_json(text.encode())
    assert (code, lang, version, opaque, flag, remark) == (10, LanguageCode.CPP, 63, 7, 0, "")
    assert ext["defaultTopicQueueNums"] == "4" and ext["queueId"] == "1" and ext["unitMode"] == "false"
    assert all(isinstance(v, str) for v in ext.values())


def test_response_ext_fields_always_strings():
    cmd = RemotingCommand(0, opaque=1, flag=1, ext_fields={"queueOffset": 5, "ok": True})
    frame = encode(cmd)
    hdr = json.loads(frame[8:])
    assert hdr["extFields"] == {"queueOffset": "5", "ok": "true"}


@pytest.mark.parametrize("stype", list(SerializeType))
def test_round_trip_every_split_point(stype):
    cmds = [RemotingCommand(10 + i, opaque=i, flag=i % 3, remark="r" * i if i % 2 else None,
                            ext_fields={"k": "v" * i, "topic": "中文"}, body=bytes(range(i * 7 % 256)),
                            serialize_type=stype) for i in range(5)]
    stream = b"".join(encode(c) for c in cmds)
    for split in range(len(stream) + 1):
        d = FrameDecoder()
        d.feed(stream[:split])
        out = list(d.commands())
        d.feed(stream[split:])
        out += list(d.commands())
        assert [(c.code, c.opaque, c.flag, c.remark, c.ext_fields, c.body, c.serialize_type) for c in out] == \
               [(c.code, c.opaque, c.flag, c.remark, c.ext_fields, c.body, c.serialize_type) for c in cmds]


def test_fed_one_byte_at_a_time():
    cmd = RemotingCommand(11, opaque=99, ext_fields={"a": "1"}, body=b"xyz" * 100)
    d = FrameDecoder()
    got = []
    for b in encode(cmd):
        d.feed(bytes([b]))
        got += list(d.commands())
    assert len(got) == 1 and got[0].body == b"xyz" * 100 and got[0].ext_fields == {"a": "1"}


def test_body_as_buffer_list_is_written_without_join():
    body = [memoryview(b"abc"), memoryview(b"defg")]
    parts = encode_parts(RemotingCommand(0, flag=1, body=body))
    assert parts[1] is body[0] and parts[2] is body[1]
    d = FrameDecoder()
    d.feed(b"".join(bytes(p) for p in parts))
    assert d.next_command().body == b"abcdefg"


def test_oversize_frame_is_a_protocol_error():
    d = FrameDecoder(frame_size_bytes_max=1024)
    d.feed((2048).to_bytes(4, "big"))
    with pytest.raises(ProtocolError):
        d.next_command()


MALFORMED_FRAMES = [
    b"\x00\x00\x00\x02",                                   # length below 4
    b"\xff\xff\xff\xff",                                   # negative length
    b"\x00\x00\x00\x08\x05\x00\x00\x00abcd",               # unknown serialize type
    b"\x00\x00\x00\x08\x00\x00\x00\xffabcd",               # header longer than frame
    b"\x00\x00\x00\x08\x00\x00\x00\x04abcd",               # JSON garbage
    b"\x00\x00\x00\x06\x00\x00\x00\x02[]",                 # JSON not an object
    b"\x00\x00\x00\x08\x01\x00\x00\x04abcd",               # ROCKETMQ truncated
    b"\x00\x00\x00\x07\x02\x00\x00\x03\x93\x01\x02",       # msgpack wrong arity
]


@pytest.mark.parametrize("bad", MALFORMED_FRAMES)
def test_malformed_frames(bad):
    d = FrameDecoder()
    d.feed(bad)
    with pytest.raises(ProtocolError):
        d.next_command()


def test_random_garbage_yields_only_protocol_errors():
    rng = random.Random(1234)
    for i in range(3000):
        n = rng.randrange(1, 200)
        data = bytes(rng.randrange(256) for _ in range(n))
        if i % 3 == 0:  # plausible prefix, garbage header
            hl = rng.randrange(0, 64)
            data = (4 + hl + 5).to_bytes(4, "big") + bytes([rng.choice([0, 1, 2]), 0, 0, hl]) + data
        elif i % 3 == 1:  # one whole frame of garbage (FrameDecoder.whole_frame's case)
            hl = rng.randrange(0, n + 1)
            data = (4 + n).to_bytes(4, "big") + bytes([rng.choice([0, 1, 2, 3]), 0, 0, hl]) + data
        got = _outcome(lambda: FrameDecoder(frame_size_bytes_max=1 << 16).whole_frame(data))
        if got != ("none",):    # a read whole_frame takes fails (or decodes) as the buffer does
            assert got == _outcome(lambda: _plain(data))
        d = FrameDecoder(frame_size_bytes_max=1 << 16)
        try:
            d.feed(data)
            list(d.commands())
        except ProtocolError:
            pass


@pytest.mark.parametrize("ext,remark", [
    ({}, None), ({"a": "b", "中": "文\n\"q\""}, "some \x01 remark"), ({"n": 5, "t": True, "none": None}, ""),
])
def test_fast_json_encoder_matches_reference(ext, remark):
    from pocketmq.protocol.headers.codec import _encode_json_reference, encode_json
    fast = encode_json(17, LanguageCode.JAVA, 401, 99, 1, remark, ext)
    ref = _encode_json_reference(17, LanguageCode.JAVA, 401, 99, 1, remark, ext)
    assert json.loads(fast) == json.loads(ref)
    assert fast == ref


def test_send_header_fast_and_slow_paths_agree():
    from pocketmq.protocol.errors import HeaderError
    from pocketmq.protocol.headers.typed import SendMessageRequestHeader, decode_send_header, encode_send_header
    h = SendMessageRequestHeader("pg", "T", "TBW102", 4, 1, 0, 1700000000000, 0, "a\x01b", 2, False, True, 16)
    for code, v2 in ((310, True), (320, True), (10, False)):
        assert decode_send_header(code, encode_send_header(h, v2=v2)) == h
    bad = encode_send_header(h, v2=True)
    bad["e"] = "x1"
    with pytest.raises(HeaderError, match="queueId"):
        decode_send_header(310, bad)
    del bad["b"]
    with pytest.raises(HeaderError, match="topic"):
        decode_send_header(310, bad)


def test_hostile_headers_are_protocol_errors():
    import msgpack
    deep = b'{"code":1,"extFields":' + b"[" * 100000 + b"]" * 100000 + b"}"
    bytes_key_map = msgpack.packb([10, 0, 401, 1, 0, None, {"a": {b"\xff": 1}}], use_bin_type=True)
    for stype, header in ((0, deep), (2, bytes_key_map)):
        frame = (4 + len(header)).to_bytes(4, "big") + bytes([stype]) + len(header).to_bytes(3, "big") + header
        d = FrameDecoder()
        d.feed(frame)
        with pytest.raises(ProtocolError):
            d.next_command()


def test_topic_with_trailing_newline_is_invalid():
    from pocketmq.broker.core.topics import validate_topic
    from pocketmq.broker.store.api import valid_topic
    assert validate_topic("Topic\n") and not valid_topic("Topic\n")


def _reference_frame(cmd: RemotingCommand) -> bytes:
    # The frame layout written out from the codec table, without encode_parts' fast path.
    header = ENCODERS[cmd.serialize_type](cmd.code, cmd.language, cmd.version, cmd.opaque,
                                          cmd.flag, cmd.remark, cmd.ext_fields)
    body = cmd.body_bytes()
    return (struct.pack(">ii", 4 + len(header) + len(body), (int(cmd.serialize_type) << 24) | len(header))
            + header + body)


@pytest.mark.parametrize("st", [SerializeType.JSON, SerializeType.MSGPACK, SerializeType.ROCKETMQ])
@pytest.mark.parametrize("body", [b"", b"x" * 10, b"z" * 2048, b"y" * 5000, b"w" * 300_000,
                                  [memoryview(b"ab"), b"cde"]])
@pytest.mark.parametrize("ext", [{}, {"a": "PG", "b": "T", "e": "3"}, {"n": 5, "b": True, "s": "x"},
                                 {"none": None, "k": "v"}])
@pytest.mark.parametrize("remark", [None, "r\u00e9mark"])
def test_encode_parts_fast_path_writes_the_plain_path_bytes(st, body, ext, remark):
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=77, flag=0, remark=remark,
                          ext_fields=dict(ext), body=body, language=LanguageCode.PYTHON,
                          serialize_type=st)
    frame = b"".join(bytes(p) for p in encode_parts(cmd))
    assert frame == _reference_frame(cmd)
    dec = FrameDecoder(frame_size_bytes_max=1 << 20)
    dec.feed(frame)
    got = dec.next_command()
    assert (got.code, got.opaque, got.remark, got.body, got.serialize_type) == \
           (cmd.code, 77, remark, cmd.body_bytes(), st)
    assert got.ext_fields == {k: ("true" if v is True else str(v)) for k, v in ext.items() if v is not None}


def test_msgpack_fast_path_joins_only_small_bytes_bodies():
    def parts(body):
        return encode_parts(RemotingCommand(10, ext_fields={"a": "1"}, body=body,
                                            serialize_type=SerializeType.MSGPACK))
    assert len(parts(b"")) == 1
    assert len(parts(b"x" * 2048)) == 1
    big = b"x" * 2049
    assert len(parts(big)) == 2 and parts(big)[1] is big


def _outcome(fn):
    """What decoding did: ("cmd", fields) / ("none",) / ("error",)."""
    try:
        c = fn()
    except ProtocolError:
        return ("error",)
    if c is None:
        return ("none",)
    return ("cmd", c.code, c.language, c.version, c.opaque, c.flag, c.remark, c.ext_fields, bytes(c.body),
            c.serialize_type)


def _plain(data, frame_max=1 << 16):
    d = FrameDecoder(frame_size_bytes_max=frame_max)
    d.feed(data)
    return d.next_command()


@pytest.mark.parametrize("stype", list(SerializeType))
def test_whole_frame_decodes_as_the_buffer_does(stype):
    """FrameDecoder.whole_frame (a read of exactly one frame, nothing buffered, decoded from
    the read's bytes) gives next_command's command, and declines everything else."""
    for i in range(6):
        cmd = RemotingCommand(10 + i, opaque=i, flag=i % 3, remark="r" * i if i % 2 else None,
                              ext_fields={"k": "v" * i, "topic": "中文"}, body=bytes(range(i * 37 % 256)),
                              serialize_type=stype)
        frame = encode(cmd)
        for data in (frame, bytearray(frame), memoryview(frame)):
            d = FrameDecoder()
            assert _outcome(lambda: d.whole_frame(data)) == _outcome(lambda: _plain(frame))
            assert d.buffered_bytes == 0 and d.whole_frame(frame) is not None   # nothing kept
        # not exactly one frame: declined, the buffer untouched
        for data in (frame[:-1], frame + frame, frame + b"\x00", frame[:7]):
            d = FrameDecoder()
            assert d.whole_frame(data) is None and d.buffered_bytes == 0
        # something buffered: declined (the read continues what the buffer holds)
        d = FrameDecoder()
        d.feed(frame[:3])
        assert d.whole_frame(frame) is None


def test_whole_frame_frees_what_the_buffer_consumed():
    """A large frame read in pieces goes through the buffer; the whole-frame reads after it
    free the consumed bytes (as feed() does), they do not keep them allocated."""
    import sys
    big = encode(RemotingCommand(1, body=b"x" * 900_000))
    small = encode(RemotingCommand(2, body=b"y" * 10))
    d = FrameDecoder()
    for i in range(0, len(big), 65536):
        d.feed(big[i:i + 65536])
    assert d.next_command().body == b"x" * 900_000 and d.next_command() is None
    assert d.whole_frame(small).body == b"y" * 10
    assert d.buffered_bytes == 0 and sys.getsizeof(d._buf) < 4096


@pytest.mark.parametrize("bad", MALFORMED_FRAMES)
def test_whole_frame_fails_as_next_command_does(bad):
    """A bad frame raises from whole_frame (and breaks the decoder, as next_command leaves
    it), or is declined (a length no read of it can match) and then fails in next_command."""
    d = FrameDecoder()
    try:
        declined = d.whole_frame(bad) is None
    except ProtocolError:
        declined = False
    if declined:
        d.feed(bad)
    with pytest.raises(ProtocolError):
        d.next_command()
    assert d.whole_frame(bad) is None


def test_whole_frame_over_the_size_bound_is_left_to_next_command():
    frame = encode(RemotingCommand(1, body=b"x" * 2000))
    d = FrameDecoder(frame_size_bytes_max=1024)
    assert d.whole_frame(frame) is None
    d.feed(frame)
    with pytest.raises(ProtocolError):
        d.next_command()



def test_ha_frame_decoders_share_one_loop_plain_and_with_the_confirm_offset():
    # protocol/ha.py: ConfirmFrameDecoder is FrameDecoder over the 20-byte head; both are
    # fed the same stream cut at every byte
    import pytest as _pytest
    from pocketmq.protocol.ha import (ConfirmFrameDecoder, FrameDecoder, HAProtocolError, encode_confirm_frame_head,
                                      encode_frame_head)
    bodies = [b"", b"abc", b"x" * 70, b""]
    plain = b"".join(encode_frame_head(100 + i, len(b)) + b for i, b in enumerate(bodies))
    confirm = b"".join(encode_confirm_frame_head(100 + i, len(b), 7 * i) + b for i, b in enumerate(bodies))
    for stream, cls, want in ((plain, FrameDecoder, [(100 + i, b) for i, b in enumerate(bodies)]),
                              (confirm, ConfirmFrameDecoder, [(100 + i, b, 7 * i) for i, b in enumerate(bodies)])):
        for cut in range(len(stream) + 1):
            d = cls()
            got = d.feed(stream[:cut]) + d.feed(stream[cut:])
            assert [(f[0], bytes(f[1]), *f[2:]) for f in got] == want
            assert d.buffered == 0
    with _pytest.raises(HAProtocolError, match="confirm -1"):
        ConfirmFrameDecoder().feed(encode_confirm_frame_head(1, 0, -1))
    with _pytest.raises(HAProtocolError, match="size -2"):
        FrameDecoder().feed(encode_frame_head(1, -2))


def _large_stream(stype, seed):
    """Frames of bodies around and far above GATHER_FRAME_BYTES, small ones between them,
    and one whose header alone is longer than a read of it can be."""
    from pocketmq.protocol import command

    rng = random.Random(seed)
    g = command.GATHER_FRAME_BYTES
    sizes = [0, g - 40, g + 1, 10, 5 * g, 3, g * 3 + 7, 1, 0, 2 * g]
    cmds = [RemotingCommand(20 + i, opaque=i, flag=1, remark="r" * (i * 300 if i == 4 else i),
                            ext_fields={"k": "v" * (4000 if i == 6 else i)},
                            body=rng.randbytes(size), serialize_type=stype) for i, size in enumerate(sizes)]
    return cmds, b"".join(encode(c) for c in cmds)


def _decode_in_reads(stream, cuts, gather_bytes=None, monkeypatch=None, kind=bytes):
    from pocketmq.protocol import command

    if gather_bytes is not None:
        monkeypatch.setattr(command, "GATHER_FRAME_BYTES", gather_bytes)
    d = FrameDecoder(frame_size_bytes_max=1 << 22)
    got, held = [], []
    prev = 0
    for cut in cuts + [len(stream)]:
        data = kind(stream[prev:cut])
        prev = cut
        cmd = d.whole_frame(data)
        if cmd is None:
            d.feed(data)
            if kind is bytearray:
                data[:] = b"\xff" * len(data)      # the decoder must not keep a caller's buffer
        else:
            got.append(_outcome(lambda: cmd))
        held.append((d.buffered_bytes, d.pending_frame_bytes()))
        while True:
            cmd = d.next_command()
            if cmd is None:
                break
            got.append(_outcome(lambda: cmd))
        held.append((d.buffered_bytes, d.pending_frame_bytes()))
    return got, held


@pytest.mark.parametrize("stype", list(SerializeType))
def test_large_frames_are_gathered_and_decode_as_the_buffer_does(stype, monkeypatch):
    """Frames over GATHER_FRAME_BYTES split over reads are gathered from the reads' bytes
    (the body joined once) and decode to what the buffer gives (the plain path: the gather
    threshold out of reach), for reads cut anywhere: inside the length prefix or the header,
    right after a frame, with the next frames' bytes after a large frame's end; the
    decoder's buffered and pending figures (the server's read budget) are the same."""
    from pocketmq.protocol import command

    cmds, stream = _large_stream(stype, 5)
    want = [_outcome(lambda c=c: _plain(encode(c), 1 << 22)) for c in cmds]
    rng = random.Random(11)
    starts = [0]
    for c in cmds:
        starts.append(starts[-1] + len(encode(c)))
    gathered = []
    real = command.FrameDecoder._gathered
    monkeypatch.setattr(command.FrameDecoder, "_gathered", lambda self, parts: gathered.append(1) or real(self, parts))
    for trial in range(40):
        if trial < 10:      # reads at every frame's start, and 1, 4, 7, 9 bytes into it
            shift = [0, 1, 4, 7, 9, 300, 0, 2, 5, 8][trial]
            cuts = sorted({min(s + shift, len(stream)) for s in starts[1:-1]} - {0, len(stream)})
        else:
            cuts = sorted(rng.sample(range(1, len(stream)), rng.choice([3, 10, 40, 400])))
        kind = bytearray if trial % 5 == 4 else bytes
        got, held = _decode_in_reads(stream, cuts, kind=kind)
        plain_got, plain_held = _decode_in_reads(stream, cuts, 1 << 30, monkeypatch, kind)
        monkeypatch.setattr(command, "GATHER_FRAME_BYTES", 32 * 1024)
        assert got == want and plain_got == want, trial
        assert held == plain_held, trial
    assert len(gathered) > 40      # the large frames did take the gathered path


@pytest.mark.parametrize("bad", ["serialize-type", "header-longer-than-frame", "header-garbage", "too-long"])
def test_gathered_bad_frames_fail_as_the_buffer_does(bad, monkeypatch):
    from pocketmq.protocol import command

    big = bytearray(encode(RemotingCommand(1, ext_fields={"a": "b"}, body=b"z" * 100_000,
                                           serialize_type=SerializeType.JSON)))
    if bad == "serialize-type":
        big[4] = 9
    elif bad == "header-longer-than-frame":
        big[5:8] = (len(big)).to_bytes(3, "big")
    elif bad == "header-garbage":
        big[8] = ord("]")
    else:
        big[0:4] = (1 << 22).to_bytes(4, "big")
    outcomes = []
    for limit in (32 * 1024, 1 << 30):
        monkeypatch.setattr(command, "GATHER_FRAME_BYTES", limit)
        d = FrameDecoder(frame_size_bytes_max=(1 << 22) - 1)
        try:
            for i in range(0, len(big), 30_000):
                d.feed(bytes(big[i:i + 30_000]))
                if d.next_command() is not None:
                    outcomes.append("cmd")
                    break
            else:
                outcomes.append("none")
        except ProtocolError:
            outcomes.append("error")
            with pytest.raises(ProtocolError):
                d.next_command()        # broken for good
    assert outcomes == ["error", "error"]


def test_a_gathered_frame_trickled_in_tiny_reads_holds_a_few_parts():
    """A large frame read a byte (or a few) at a time is gathered into a few parts, not an
    object per read (a peer trickling a frame would otherwise cost ~40 bytes of objects per
    byte sent), and decodes as sent; large reads between them stay parts of their own."""
    body = bytes(range(256)) * 400
    frame = encode(RemotingCommand(5, opaque=9, ext_fields={"k": "v"}, body=body, serialize_type=SerializeType.JSON))
    d = FrameDecoder()
    d.feed(frame[:100])
    pos, most = 100, 0
    for n, upto in ((1, 30_000), (20_000, 50_000), (3, len(frame))):     # tiny, one large, tiny
        while pos < min(upto, len(frame)):
            d.feed(frame[pos:pos + n])
            pos += n
            most = max(most, len(d._parts or ()))
    cmd = d.next_command()
    assert cmd.body == body and cmd.opaque == 9 and d.next_command() is None
    assert most == 4, most      # the first read, the tiny ones, the large one, the tiny ones
