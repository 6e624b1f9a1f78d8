"""The client's hot-path shortcuts produce exactly what the general code produces."""
import asyncio
import random

import pytest

from client.connection import ClientConnection, encode_frame_parts
from client.message import Message
from client.producer import send_ext_fields
from protocol import message as msgcodec
from protocol.codes import LanguageCode, RequestCode, SerializeType
from protocol.command import FrameDecoder, RemotingCommand, encode_parts
from protocol.headers.typed import SendMessageRequestHeader, encode_send_header


@pytest.mark.parametrize("st", [SerializeType.JSON, SerializeType.MSGPACK, SerializeType.ROCKETMQ])
@pytest.mark.parametrize("body", [b"", b"x" * 10, b"y" * 5000])
@pytest.mark.parametrize("ext", [{}, {"a": "PG", "b": "T", "e": "3"}, {"n": 5, "b": True}])
def test_encode_frame_parts_same_bytes(st, body, ext):
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=77, ext_fields=dict(ext), body=body,
                          language=LanguageCode.PYTHON, serialize_type=st, remark=None)
    assert b"".join(encode_frame_parts(cmd)) == b"".join(encode_parts(cmd))
    dec = FrameDecoder()
    dec.feed(b"".join(encode_frame_parts(cmd)))
    got = dec.next_command()
    assert got.opaque == 77 and got.body == body


@pytest.mark.parametrize("batch", [False, True])
def test_send_ext_fields_equal_encoded_header(batch):
    h = SendMessageRequestHeader("PG", "T", "TBW102", 4, 3, 1, 1_700_000_000_123, 9, "WAIT\x01true",
                                 0, False, batch, None)
    want = encode_send_header(h, v2=True)
    got = send_ext_fields("PG", "T", 3, 1, 9, "WAIT\x01true", batch, 1_700_000_000_123)
    assert got == want and list(got) == list(want)


def test_wire_properties_text_equals_dict_route():
    rnd = random.Random(7)
    for _ in range(500):
        kw = {}
        if rnd.random() < 0.5:
            kw["tags"] = rnd.choice(["A", "TagB", "é"])
        if rnd.random() < 0.5:
            kw["keys"] = rnd.choice(["k1", "k1 k2", ("a", "b"), ()])
        if rnd.random() < 0.3:
            kw["properties"] = {f"p{i}": str(rnd.randrange(100)) for i in range(rnd.randrange(3))}
        if rnd.random() < 0.3:
            kw["delay_level"] = rnd.randrange(0, 5)
        kw["wait_store_msg_ok"] = rnd.random() < 0.8
        m = Message("T", b"b", **kw)
        uniq = rnd.choice([None, "ABCDEF"])
        assert m.wire_properties_text(uniq) == msgcodec.encode_properties(m.wire_properties(uniq))
    with pytest.raises(ValueError):
        Message("T", b"b", tags="a\x02b").wire_properties_text("U")
    # system keys among user properties: same (dict-merged) result as the dict route
    m = Message("T", b"b", tags="A", properties={"TAGS": "x", "z": "1"})
    assert m.wire_properties_text("U") == msgcodec.encode_properties(m.wire_properties("U"))


class _Transport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.writes = []
        self.closing = False

    def writelines(self, parts):
        self.writes.append(b"".join(parts))

    def write(self, data):
        self.writes.append(bytes(data))

    def is_closing(self):
        return self.closing

    def close(self):
        self.closing = True

    def get_extra_info(self, name, default=None):
        return default


def _cmd(i):
    return RemotingCommand(RequestCode.HEART_BEAT, opaque=i, serialize_type=SerializeType.MSGPACK)


async def test_coalescing_groups_frames_keeps_order_and_flushes_on_close():
    conn = ClientConnection()
    t = _Transport()
    conn.connection_made(t)
    conn.send(_cmd(1))                       # lone request: written at once
    assert len(t.writes) == 1
    conn.pending.update({i: None for i in range(100, 110)})   # requests in flight: coalesce
    for i in range(2, 2 + 20):
        conn.send(_cmd(i))
    assert len(t.writes) == 2                # the first group of coalesce_frames_max went out
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(t.writes) == 3                # the rest at the end of the iteration
    conn.send(_cmd(99))
    conn.close()                             # queued frames are written before closing
    dec = FrameDecoder()
    for w in t.writes:
        dec.feed(w)
    assert [c.opaque for c in dec.commands()] == [1, *range(2, 22), 99]
