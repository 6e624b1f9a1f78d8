"""The client's hot-path shortcuts produce exactly what the general code produces."""
import asyncio
import dataclasses
import random

import pytest

from pocketmq.client.connection import ClientConnection
from pocketmq.client.message import Message
from pocketmq.client.producer import send_ext_fields
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.codes import RequestCode, SerializeType
from pocketmq.protocol.command import FrameDecoder, RemotingCommand
from pocketmq.protocol.headers.typed import SendMessageRequestHeader, encode_send_header


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


# --- pull bodies: one-pass raw decode + lazy MessageExt == eager decode ------------------

from pocketmq.client.message import MessageExt  # noqa: E402
from pocketmq.client.push_consumer import WorkQueue, tag_filter  # noqa: E402
from pocketmq.protocol.bodies import build_subscription  # noqa: E402
from tests.unit.test_message_codec import A3_HEX  # noqa: E402


def _random_record(rnd: random.Random, i: int) -> bytes:
    props = {}
    if rnd.random() < 0.7:
        props["TAGS"] = rnd.choice(["A", "B", "Tag" + "é" * rnd.randrange(3)])
    if rnd.random() < 0.5:
        props["UNIQ_KEY"] = "%032X" % rnd.getrandbits(128)
    if rnd.random() < 0.3:
        props["KEYS"] = "k1 k2"
    if rnd.random() < 0.2:
        props["RETRY_TOPIC"] = "Orig"
    for j in range(rnd.randrange(3)):
        props[f"u{j}"] = "v" * rnd.randrange(5)
    body = bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(0, 300)))
    sys_flag = 0
    if rnd.random() < 0.1 and body:
        body, sys_flag = msgcodec.compress_body(body), msgcodec.MessageSysFlag.COMPRESSED_FLAG
    born = (bytes([10, 0, 0, rnd.randrange(256)]), 1234) if rnd.random() < 0.8 else (bytes(range(16)), 5)
    store = (bytes([127, 0, 0, 1]), 10911) if rnd.random() < 0.8 else (bytes(range(1, 17)), 7)
    topic = rnd.choice(["T", "%RETRY%G", "Topic-" + "x" * rnd.randrange(100)])
    return msgcodec.encode_record(topic, rnd.randrange(8), rnd.randrange(1 << 31), body,
                                  msgcodec.encode_properties(props), sys_flag, rnd.getrandbits(40), born,
                                  store, rnd.randrange(3), 0, i, rnd.getrandbits(40), rnd.getrandbits(40))


def _eager_view(rec, broker_name):
    return MessageExt.from_record(rec, broker_name)


def _decode_one_by_one(body) -> list:
    """The reference: decode_record record after record (decode_records is built on the
    one-pass decode_records_raw, so it cannot be the reference for it)."""
    out, pos = [], 0
    while pos < len(body):
        rec = msgcodec.decode_record(body, pos)
        out.append(rec)
        pos += rec.store_size
    return out


def test_decode_records_raw_matches_decode_records_on_vector_and_random_bodies():
    rnd = random.Random(11)
    bodies = [bytes.fromhex(A3_HEX), bytes.fromhex(A3_HEX) * 3]
    for _ in range(60):
        bodies.append(b"".join(_random_record(rnd, i) for i in range(rnd.randrange(1, 40))))
    for body in bodies:
        eager = _decode_one_by_one(body)
        assert msgcodec.decode_records(body) == eager
        raw = msgcodec.decode_records_raw(body)
        assert len(raw) == len(eager)
        for r, e in zip(raw, eager):
            assert (r[0], r[1], r[2], r[3], r[5], r[6], r[7], r[8], r[10], r[12], r[13], r[14], r[15]) == (
                e.topic, e.body, e.queue_id, e.queue_offset, e.flag, e.sys_flag, e.commit_log_offset,
                e.born_timestamp, e.store_timestamp, e.reconsume_times, e.prepared_transaction_offset,
                e.body_crc, e.store_size)
            assert msgcodec.decode_properties(r[4]) == e.properties
            assert msgcodec.format_host(*r[9]) == e.born_host and msgcodec.format_host(*r[11]) == e.store_host
            lazy, want = MessageExt.from_raw(r, "broker-a"), _eager_view(e, "broker-a")
            assert lazy == want
            assert (lazy.msg_id, lazy.offset_msg_id, lazy.tags, lazy.keys, lazy.topic, lazy.queue,
                    lazy.user_properties, lazy.born_host, lazy.store_host, lazy.delay_level) == (
                want.msg_id, want.offset_msg_id, want.tags, want.keys, want.topic, want.queue,
                want.user_properties, want.born_host, want.store_host, want.delay_level)
            assert dict(lazy.properties) == e.properties


def test_decode_records_raw_rejects_what_decode_records_rejects():
    rnd = random.Random(5)
    body = b"".join(_random_record(rnd, i) for i in range(5))
    cases = [body[:cut] for cut in range(1, len(body)) if rnd.random() < 0.2]
    for _ in range(200):
        b = bytearray(body)
        b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
        cases.append(bytes(b))
    for case in cases:
        try:
            want = _decode_one_by_one(case)
        except ValueError:
            with pytest.raises(ValueError):
                msgcodec.decode_records_raw(case)
            with pytest.raises(ValueError):
                msgcodec.decode_records(case)
            continue
        got = msgcodec.decode_records_raw(case)
        assert [g[3] for g in got] == [w.queue_offset for w in want]
        assert [msgcodec.decode_properties(g[4]) for g in got] == [w.properties for w in want]


def test_message_ext_is_immutable_and_compares_by_value():
    m = MessageExt("T", b"b", 1, 2, properties={"TAGS": "A"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.topic = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        m.properties["b"] = "2"  # type: ignore[index]
    assert m == MessageExt("T", b"b", 1, 2, properties={"TAGS": "A"})
    assert m != MessageExt("T", b"b", 1, 3, properties={"TAGS": "A"})
    with pytest.raises(TypeError):
        hash(m)


def test_tag_filter_on_raw_records():
    rnd = random.Random(3)
    body = b"".join(_random_record(rnd, i) for i in range(50))
    raw = msgcodec.decode_records_raw(body)
    accept = tag_filter(build_subscription("T", "A || B", "TAG", 1))
    want = [r for r, e in zip(raw, _decode_one_by_one(body)) if e.properties.get("TAGS") in ("A", "B")]
    assert want and [r for r in raw if accept(r)] == want


async def test_work_queue_wakes_idle_workers_in_order():
    q = WorkQueue()
    got = []

    async def worker(name):
        while True:
            if not q.items:
                await q.wait()
                continue
            got.append((name, q.items.popleft()))
            await asyncio.sleep(0)
    tasks = [asyncio.create_task(worker(i)) for i in range(3)]
    await asyncio.sleep(0)
    q.extend(range(5))
    q.put_nowait(5)
    for _ in range(10):
        await asyncio.sleep(0)
    assert sorted(v for _, v in got) == list(range(6))
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert all(f.done() for f in q.idle)


def test_batch_elements_equal_encode_batch_body_and_ids_sequential():
    from pocketmq.client.message import UniqIdGenerator
    from pocketmq.client.producer import split_batch
    from pocketmq.protocol.message import encode_batch_elements
    rnd = random.Random(9)
    msgs = [Message("T", bytes(rnd.randrange(50)), tags=rnd.choice([None, "A"]), flag=rnd.randrange(9),
                    properties={"u": "é"} if rnd.random() < 0.3 else None) for _ in range(50)]
    gen = UniqIdGenerator(now_ms=lambda: 1_700_000_000_000)
    ids = gen.next_ids(50)
    assert len(set(ids)) == 50 and all(len(i) == 32 for i in ids)
    assert [int(i[-4:], 16) for i in ids] == [(int(ids[0][-4:], 16) + k) & 0xFFFF for k in range(50)]
    dicts = [m.wire_properties(u) for m, u in zip(msgs, ids)]
    texts = [m.wire_properties_text(u).encode() for m, u in zip(msgs, ids)]
    assert encode_batch_elements([(m.flag, m.body, t) for m, t in zip(msgs, texts)]) == \
        msgcodec.encode_batch_body([(m.flag, m.body, d) for m, d in zip(msgs, dicts)])
    assert split_batch(msgs, texts, 1000) == split_batch(msgs, dicts, 1000)


# --- the batch send path: one template per batch == the per-message path ---------------

def _message_reference(topic, body=b"", tags=None, keys=(), properties=None, delay_level=0, flag=0,
                       wait_store_msg_ok=True, deliver_at_ms=None) -> tuple:
    """Message's fields as the dataclass-generated __init__ + the former __post_init__ set them."""
    if type(body) is not bytes:
        if isinstance(body, str):
            body = body.encode()
        elif not isinstance(body, bytes):
            body = bytes(body)
    if keys != ():
        keys = msgcodec.keys_tuple(keys)
    props = properties if properties is not None else {}
    if type(props) is not msgcodec.FrozenProperties:
        props = msgcodec.frozen_properties(props)
    return (topic, body, tags, keys, props, delay_level, flag, wait_store_msg_ok, deliver_at_ms)


def test_message_init_equals_the_generated_one():
    rnd = random.Random(4)
    cases = [((), {}), (("T",), {}), (("T", "héllo"), {}), (("T", bytearray(b"ab")), {}),
             (("T", memoryview(b"mv")), {"keys": ""}), (("T", b"x"), {"keys": "k1  k2"}),
             (("T", b"x"), {"keys": ["a", 1]}), (("T", b"x"), {"properties": {"a": 1, 2: "b"}}),
             (("T", b"x"), {"properties": msgcodec.frozen_properties({"z": "1"})}),
             (("T", b"x", "tag", ("k",), {}, 3, 7, False), {}), (("T", b"x", "tag", ("k",), {}, 0, 7, False, 5), {})]
    for _ in range(200):
        kw = {k: v for k, v in (("tags", rnd.choice([None, "A"])), ("keys", rnd.choice([(), "a b", ("c",)])),
                                ("properties", rnd.choice([None, {}, {"p": "q"}])),
                                ("delay_level", rnd.randrange(3)), ("flag", rnd.randrange(3)),
                                ("wait_store_msg_ok", rnd.random() < 0.5),
                                ("deliver_at_ms", rnd.choice([None, 0, 1_700_000_000_000]))) if rnd.random() < 0.5}
        cases.append((("T", bytes(rnd.randrange(4))), kw))
    for args, kw in cases[1:]:
        m = Message(*args, **kw)
        want = _message_reference(*args, **kw)
        got = tuple(getattr(m, f.name) for f in dataclasses.fields(Message))
        assert got == want and [type(v) for v in got] == [type(v) for v in want]
    with pytest.raises(TypeError):
        Message()                                       # topic is required, as before
    m = Message("T", b"b", tags="A", properties={"a": "1"})
    assert dataclasses.replace(m, body="x") == Message("T", b"x", tags="A", properties={"a": "1"})
    assert m.properties is not Message("T", b"b", tags="A", properties={"a": "1"}).properties
    assert Message("T").properties is Message("U").properties == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.topic = "U"  # type: ignore[misc]


def test_send_result_init_equals_the_generated_one():
    """SendResult's hand-written __init__ against a frozen dataclass of the same fields with
    the generated one: same values (positional, keyword, defaults), equality, hash, repr
    (but the name), still frozen; the subclass keeps its own generated __init__."""
    from pocketmq.client.message import SendResult, SendStatus
    from pocketmq.client.transaction_producer import LocalTransactionState, TransactionSendResult

    # the same fields and defaults, with the __init__ dataclass generates for them
    Generated = dataclasses.make_dataclass(
        "Generated", [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(SendResult)],
        frozen=True, slots=True)
    names = [f.name for f in dataclasses.fields(SendResult)]
    assert names[:5] == ["status", "msg_id", "offset_msg_id", "queue", "queue_offset"]
    q = MessageQueue("T", "b", 3)
    full = (SendStatus.FLUSH_DISK_TIMEOUT, "U", "O1,O2", q, 9, "tx", "R", False)
    cases = [(full[:5], {}), (full, {}), (full[:5], {"trace_on": False, "transaction_id": "t"}),
             ((), dict(zip(names, full))), (full[:2], {"offset_msg_id": "", "queue": q, "queue_offset": -1})]
    for args, kw in cases:
        got, want = SendResult(*args, **kw), Generated(*args, **kw)
        assert [getattr(got, n) for n in names] == [getattr(want, n) for n in names]
        assert got == SendResult(*args, **kw) and hash(got) == hash(SendResult(*args, **kw))
        assert repr(got) == "SendResult(" + repr(want).partition("(")[2]
    for args, kw in (((), {}), (full[:4], {}), (full, {"status": SendStatus.SEND_OK}), (full[:5], {"x": 1})):
        with pytest.raises(TypeError):
            Generated(*args, **kw)
        with pytest.raises(TypeError):
            SendResult(*args, **kw)
    r = SendResult(*full[:5])
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.msg_id = "V"  # type: ignore[misc]
    assert dataclasses.replace(r, queue_offset=10) == SendResult(*full[:4], 10)
    t = TransactionSendResult(*full, local_state=LocalTransactionState.COMMIT)
    assert [getattr(t, n) for n in names] == list(full) and t.local_state is LocalTransactionState.COMMIT
    assert t != SendResult(*full)


def test_send_results_equal_the_constructor():
    """send_results (a coalesced group's results, built without a constructor call each)
    against SendResult(...) field by field: equal, same hash and repr, of type SendResult
    (never its slots twin), still frozen; split_batch_result through it."""
    from pocketmq.client.message import SendResult, SendStatus, send_results
    from pocketmq.client.producer import split_batch_result

    names = [f.name for f in dataclasses.fields(SendResult)]
    rnd = random.Random(35)
    for _ in range(200):
        n = rnd.randrange(0, 40)
        status = rnd.choice(list(SendStatus))
        q = MessageQueue(rnd.choice(["T", "Topic-é"]), "b", rnd.randrange(8))
        ids = [f"U{i:04X}" for i in rnd.sample(range(65536), n)]
        offs = [rnd.choice(["", f"O{i}"]) for i in range(n)]
        qos = [rnd.choice([-1, 0, 2**40 + i]) for i in range(n)]
        tail = rnd.choice([(), ("tx",), (None, "R"), ("tx", "R", False)])
        got = send_results(status, ids, offs, q, qos, *tail)
        want = [SendResult(status, a, b, q, c, *tail) for a, b, c in zip(ids, offs, qos)]
        assert got == want and [type(x) for x in got] == [SendResult] * n
        assert [hash(x) for x in got] == [hash(x) for x in want] and list(map(repr, got)) == list(map(repr, want))
        assert [[getattr(x, k) for k in names] for x in got] == [[getattr(x, k) for k in names] for x in want]
    r = send_results(SendStatus.SEND_OK, ["U"], ["O"], MessageQueue("T", "b", 0), [5])[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.msg_id = "V"  # type: ignore[misc]
    assert r.ok and dataclasses.replace(r, queue_offset=6).queue_offset == 6
    # the batch's answer split: offsets from the first, the offsetMsgIds in order (or empty)
    q = MessageQueue("T", "b", 1)
    whole = SendResult(SendStatus.SEND_OK, "U1,U2,U3", "O1,O2,O3", q, 7, "tx", "R", False)
    assert split_batch_result(whole, ["U1", "U2", "U3"]) == [
        SendResult(SendStatus.SEND_OK, f"U{i}", f"O{i}", q, 6 + i, "tx", "R", False) for i in (1, 2, 3)]
    odd = SendResult(SendStatus.SEND_OK, "U1,U2", "O1", q, -1)
    assert split_batch_result(odd, ["U1", "U2"]) == [SendResult(SendStatus.SEND_OK, u, "", q, -1) for u in ("U1", "U2")]


def test_encode_batch_run_equals_encode_batch_elements():
    rnd = random.Random(21)
    for _ in range(400):
        n = rnd.randrange(0, 70)
        same_len = rnd.random() < 0.5
        bl = rnd.randrange(0, 300)
        bodies = [bytes(rnd.getrandbits(8) for _ in range(bl if same_len else rnd.randrange(0, 300)))
                  for _ in range(n)]
        prefix = ("WAIT\x01true\x02UNIQ_KEY\x01" + "é" * rnd.randrange(3)).encode()
        k = rnd.choice([0, 1, 4, 4, 4, 7])
        suffixes = bytes(rnd.choice(b"0123456789ABCDEFxyz") for _ in range(n * k))
        flag = rnd.choice([0, 1, -1, 1 << 30])
        elements = [(flag, b, prefix + suffixes[i * k:(i + 1) * k]) for i, b in enumerate(bodies)]
        want = msgcodec.encode_batch_elements(elements)
        assert msgcodec.encode_batch_run(flag, bodies, prefix, suffixes, k) == want
        assert msgcodec.encode_batch_run(flag, bodies, prefix, suffixes, k, [len(b) for b in bodies]) == want
        if n:
            assert [(f, bytes(b), p) for f, b, p in msgcodec.parse_batch_body(want)] == elements
    for n, bl in ((60, 1000), (40, 2000), (64, 1024), (65, 1024)):    # both sides of _STRIDED_BODIES_MAX
        bodies = [bytes([i]) * bl for i in range(n)]
        suffixes = b"".join(b"%04X" % i for i in range(n))
        want = msgcodec.encode_batch_elements([(7, b, b"P" + suffixes[4 * i:4 * i + 4]) for i, b in enumerate(bodies)])
        assert msgcodec.encode_batch_run(7, bodies, b"P", suffixes, 4) == want
    with pytest.raises(ValueError):
        msgcodec.encode_batch_run(0, [b"a"], b"p", b"", 4)           # 1 body, 0 suffixes
    with pytest.raises(ValueError):
        msgcodec.encode_batch_run(0, [b"a"], b"p" * 32767, b"0000", 4)


@pytest.mark.parametrize("start", [0, 7, 0xFFF0, 0xFFFF, 0x1FFFE])
def test_next_id_counters_equal_next_ids(start):
    import itertools
    from pocketmq.client.message import UniqIdGenerator
    for n in (1, 2, 17, 64, 70_000, 140_000):
        a = UniqIdGenerator(ip=b"\x0a\0\0\1", pid=9, now_ms=lambda: 1_700_000_000_000)
        b = UniqIdGenerator(ip=b"\x0a\0\0\1", pid=9, now_ms=lambda: 1_700_000_000_000)
        b._prefix = a._prefix
        a._counter, b._counter = itertools.count(start), itertools.count(start)
        head, counters = b.next_id_counters(n)
        assert len(counters) == 2 * n
        assert [head + counters[2 * i:2 * i + 2].hex().upper() for i in range(n)] == a.next_ids(n)
        assert b.next_id() == a.next_id()               # the counter moved on alike


def test_next_id_counters_stay_unique_across_threads():
    # a batch's counters are taken in one step: another thread's next_id() cannot land
    # inside them (it did when the first value and the skip of the rest were two steps)
    import sys
    import threading
    from pocketmq.client.message import UniqIdGenerator
    g = UniqIdGenerator(ip=b"\x0a\0\0\1", pid=9, now_ms=lambda: 1_700_000_000_000)
    ids_a, ids_b = [], []

    def batches():
        for _ in range(3000):
            head, counters = g.next_id_counters(4)
            ids_a.extend(head + counters[2 * i:2 * i + 2].hex().upper() for i in range(4))

    def singles():
        for _ in range(12000):
            ids_b.append(g.next_id())
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=batches), threading.Thread(target=singles)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert len(set(ids_a + ids_b)) == len(ids_a) + len(ids_b) == 24000


def test_uniq_ids_reseeded_in_a_forked_child():
    import os
    from pocketmq.client import producer
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    parent_prefix = producer._uniq._prefix
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child: report its prefix and exit
        try:
            os.write(w, producer._uniq._prefix.encode())
        finally:
            os._exit(0)
    os.close(w)
    child_prefix = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert child_prefix and child_prefix != parent_prefix
    assert child_prefix[:8] == parent_prefix[:8]     # same host, its own pid and random part


class _CapturingProducer:
    """A Producer whose wire send is recorded (what _send_with_retry was given), not sent."""

    def __init__(self, max_message_size_bytes=4 * 1024 * 1024):
        from pocketmq.client.producer import Producer
        self.p = Producer("PG", "127.0.0.1:1", max_message_size_bytes=max_message_size_bytes)
        self.p.instance = object()
        self.sent = []

        async def send(inst, topic, props, body, sys_flag, flag, uniq, queue, *, batch, timeout_s):
            from pocketmq.client.message import SendResult, SendStatus
            from pocketmq.protocol.bodies import MessageQueue
            self.sent.append((topic, props, body, sys_flag, flag, uniq, queue, batch, timeout_s))
            return SendResult(SendStatus.SEND_OK, uniq, "", MessageQueue(topic, "b", 0), 5)
        self.p._send_with_retry = send


def _same_ids(monkeypatch):
    """Both runs get the same UNIQ_KEYs (a fresh generator with a fixed clock and counter)."""
    import itertools
    from pocketmq.client import producer
    from pocketmq.client.message import UniqIdGenerator
    gen = UniqIdGenerator(ip=b"\x0a\0\0\1", pid=3, now_ms=lambda: 1_700_000_000_000)
    gen._prefix = "0A00000100030123ABCD"                 # (its 4 random bytes)
    gen._counter = itertools.count(0xFFE0)               # wraps within the batches below
    monkeypatch.setattr(producer, "_uniq", gen)


async def test_send_batch_template_path_sends_what_the_general_path_sends(monkeypatch):
    from pocketmq.client.producer import Producer
    rnd = random.Random(13)
    runs_encoded = []
    real_run = msgcodec.encode_batch_run
    monkeypatch.setattr(msgcodec, "encode_batch_run", lambda *a: runs_encoded.append(1) or real_run(*a))
    shapes = [{}, {"tags": "TagA"}, {"keys": "k1 k2", "flag": 5}, {"wait_store_msg_ok": False},
              {"tags": "é", "properties": msgcodec.frozen_properties({"u": "ü", "v": ""})}]
    for shape in shapes:
        for n in (1, 2, 64, 100):
            msgs = [Message("T", bytes(rnd.randrange(1, 200)), **shape) for _ in range(n)]
            runs = []
            limit = rnd.choice([4 * 1024 * 1024, 3000])    # 3000: split into sub-batches
            for fast in (True, False):
                cp = _CapturingProducer(max_message_size_bytes=limit)
                if not fast:
                    monkeypatch.setattr(cp.p, "_batch_run", lambda msgs: None)
                _same_ids(monkeypatch)
                runs.append((await cp.p.send_batch(msgs), cp.sent))
            (r_fast, sent_fast), (r_plain, sent_plain) = runs
            if limit == 4 * 1024 * 1024:
                assert len(sent_plain) == 1 and runs_encoded   # one request, by the template
            runs_encoded.clear()
            assert sent_fast == sent_plain and r_fast == r_plain
    # equal properties, one object per message (a dict literal per Message()): the template
    # when the key order is the same, the general path when it is not; the same bytes
    for orders in ([("a", "b"), ("a", "b")], [("a", "b"), ("b", "a")]):
        msgs = [Message("T", b"m%d" % i, properties={k: k.upper() for k in orders[i % 2]}) for i in range(6)]
        runs = []
        for fast in (True, False):
            cp = _CapturingProducer()
            if not fast:
                monkeypatch.setattr(cp.p, "_batch_run", lambda msgs: None)
            _same_ids(monkeypatch)
            runs.append((await cp.p.send_batch(msgs), cp.sent))
        assert runs[0] == runs[1]
        assert (_CapturingProducer().p._batch_run(msgs) is None) == (orders[0] != orders[1])
    # batches of mixed shapes, or not of Message, take the general path (same errors)
    cp = _CapturingProducer()
    assert cp.p._batch_run([Message("T", b"a"), Message("T", b"b", tags="X")]) is None
    assert cp.p._batch_run([Message("T", b"a"), Message("T", b"a", properties={"a": "1"})]) is None
    assert cp.p._batch_run([Message("T", b"a"), Message("T", b"")]) is None
    assert cp.p._batch_run([Message("%RETRY%G", b"a")]) is None
    assert cp.p._batch_run([Message("T", b"ab"), Message("T", b"c")]) == ([b"ab", b"c"], [2, 1], 3)
    big = cp.p.max_message_size_bytes + 1
    assert cp.p._batch_run([Message("T", b"a"), Message("T", b"x" * big)]) is None
    assert cp.p._batch_run([Message("T", b"a"), Message("T", b"a", delay_level=1)]) is None
    assert cp.p._batch_run([Message("T", b"a"), Message("U", b"a")]) is None
    from pocketmq.client.errors import InvalidArgumentError
    with pytest.raises(InvalidArgumentError):
        await cp.p.send_batch([Message("T", b"a"), Message("T", b"")])
    with pytest.raises(InvalidArgumentError):
        await cp.p.send_batch([Message("T", b"a"), "not a message"])
    assert isinstance(Producer.send_batch, type(Producer.send))


async def test_send_batch_of_bodies_sends_what_a_batch_of_messages_sends(monkeypatch):
    rnd = random.Random(31)
    shapes = [{}, {"tags": "TagA"}, {"keys": "k1 k2", "flag": 5}, {"keys": ["a", "b"]},
              {"wait_store_msg_ok": False},
              {"tags": "é", "properties": {"u": "ü", "v": ""}}]
    for shape in shapes:
        for n in (1, 2, 64, 100):
            same = rnd.random() < 0.5
            bodies = [bytes(rnd.randrange(1, 200)) if not same else b"b" * 40 for _ in range(n)]
            if rnd.random() < 0.3:
                bodies[0] = "é" * 3                                   # str: UTF-8, as Message does
            limit = rnd.choice([4 * 1024 * 1024, 3000])
            runs = []
            for as_bodies in (True, False):
                cp = _CapturingProducer(max_message_size_bytes=limit)
                _same_ids(monkeypatch)
                if as_bodies:
                    r = await cp.p.send_batch(bodies, topic="T", **shape)
                else:
                    r = await cp.p.send_batch([Message("T", b, **shape) for b in bodies])
                runs.append((r, cp.sent))
            assert runs[0] == runs[1]
            if limit == 4 * 1024 * 1024:
                assert len(runs[0][1]) == 1
    # bytearray / memoryview bodies are copied to bytes; a generator is taken whole
    cp = _CapturingProducer()
    _same_ids(monkeypatch)
    await cp.p.send_batch((b for b in [bytearray(b"ab"), memoryview(b"cd")]), topic="T")
    got = [(f, bytes(b), p) for f, b, p in msgcodec.parse_batch_body(cp.sent[0][2])]
    assert [b for _, b, _ in got] == [b"ab", b"cd"]


async def test_send_batch_of_bodies_refuses_what_a_batch_refuses():
    from pocketmq.client.errors import InvalidArgumentError, MessageTooLargeError
    cp = _CapturingProducer(max_message_size_bytes=1000)
    bad = [([], {}, InvalidArgumentError, "empty batch"),
           ([b"a", b""], {}, InvalidArgumentError, "message 1 of the batch"),
           ([b"a", b"x" * 1001], {}, MessageTooLargeError, "message 1 of the batch"),
           ([b"a", 5], {}, InvalidArgumentError, "body 1 of the batch is a int"),
           ([Message("T", b"a")], {}, InvalidArgumentError, "takes no topic="),
           ([b"a"], {"properties": {"TAGS": "x"}}, InvalidArgumentError, "TAGS"),
           ([b"a"], {"topic": "%RETRY%G"}, InvalidArgumentError, "Retry Group"),
           ([b"a"], {"topic": "bad topic"}, InvalidArgumentError, "illegal characters")]
    for bodies, kw, exc, text in bad:
        with pytest.raises(exc, match=text):
            await cp.p.send_batch(bodies, **{"topic": "T", **kw})
    with pytest.raises(InvalidArgumentError, match="pass topic="):
        await cp.p.send_batch([Message("T", b"a")], tags="A")
    for one in ("hello", b"hello", bytearray(b"hi")):   # one body, not a list: refused, not split
        with pytest.raises(InvalidArgumentError, match="list of bodies"):
            await cp.p.send_batch(one, topic="T")
    with pytest.raises(ValueError, match="32767"):
        await cp.p.send_batch([b"a"], topic="T", properties={"p": "x" * 40000})
    assert cp.sent == []


def test_pulled_message_view_is_the_message_ext_of_its_values():
    """decode_messages' common records are views of the pull body (_PulledMessageExt):
    every field, derived value and protocol (equality, repr, pickle, copy, dataclasses)
    as the MessageExt built from the same record."""
    import copy
    import dataclasses
    import pickle
    rnd = random.Random(5)
    body = b"".join(_random_record(rnd, i) for i in range(30))
    want = [MessageExt.from_raw(r, "bk") for r in msgcodec.decode_records_raw(body)]
    got = msgcodec.decode_messages(body, "bk")
    views = [g for g in got if type(g) is msgcodec._PulledMessageExt]
    assert views, "no record took the view path"
    for g, w in zip(got, want):
        assert isinstance(g, MessageExt)
        for name in ("topic", "body", "queue_id", "queue_offset", "flag", "sys_flag", "commit_log_offset",
                     "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
                     "prepared_transaction_offset", "body_crc", "store_size", "broker_name", "real_topic",
                     "offset_msg_id", "msg_id", "tags", "keys", "delay_level", "user_properties", "queue"):
            assert getattr(g, name) == getattr(w, name), name
        assert dict(g.properties) == dict(w.properties)
        # read from the text, the parsed properties built or not: the same values
        assert (g.msg_id, g.tags, g.keys, g.delay_level) == (w.msg_id, w.tags, w.keys, w.delay_level)
        assert g == w and w == g and not (g != w)
        assert repr(g) == repr(w)
        for clone in (pickle.loads(pickle.dumps(g)), copy.copy(g), copy.deepcopy(g)):
            assert clone == w and type(clone) is MessageExt
        assert dataclasses.asdict(g) == dataclasses.asdict(w)
        r = dataclasses.replace(g, topic="Other")
        assert type(r) is MessageExt and r.topic == "Other" and r.body == w.body
        with pytest.raises(dataclasses.FrozenInstanceError):
            g.body = b"x"
        assert MessageExt.from_record(g, "bk2") == MessageExt.from_record(w, "bk2")
    assert got != [dataclasses.replace(w, queue_offset=w.queue_offset + 1) for w in want]


def test_decode_messages_equals_decode_records_raw_then_from_raw():
    rnd = random.Random(17)
    bodies = [b"", bytes.fromhex(A3_HEX) * 2]
    for _ in range(60):
        bodies.append(b"".join(_random_record(rnd, i) for i in range(rnd.randrange(1, 40))))
    for body in bodies:
        want = [MessageExt.from_raw(r, "broker-b") for r in msgcodec.decode_records_raw(body)]
        got = msgcodec.decode_messages(body, "broker-b")
        assert got == want and [g._values() for g in got] == [w._values() for w in want]
        assert [(g.topic, g.real_topic, g.broker_name, dict(g.properties)) for g in got] == \
            [(w.topic, w.real_topic, w.broker_name, dict(w.properties)) for w in want]
        assert msgcodec.decode_messages(memoryview(body), "broker-b") == want
    # the same ValueError as the raw decoder for what does not decode
    body = b"".join(_random_record(rnd, i) for i in range(5))
    for _ in range(200):
        b = bytearray(body)
        b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
        try:
            want = [MessageExt.from_raw(r, "x") for r in msgcodec.decode_records_raw(bytes(b))]
        except ValueError as e:
            with pytest.raises(ValueError) as got:
                msgcodec.decode_messages(bytes(b), "x")
            assert str(got.value) == str(e)
            continue
        assert msgcodec.decode_messages(bytes(b), "x") == want


def test_fetcher_decode_found_salvages_like_the_pull_did():
    from pocketmq.client.api import decode_pull_body
    from pocketmq.client.errors import MQClientError
    from pocketmq.client.fetcher import decode_found
    from pocketmq.protocol.bodies import MessageQueue
    mq = MessageQueue("T", "broker-c", 1)
    rnd = random.Random(2)
    good = [_random_record(rnd, i) for i in range(4)]
    assert decode_found(b"".join(good), mq, "a:1") == msgcodec.decode_messages(b"".join(good), "broker-c")
    host = (bytes([127, 0, 0, 1]), 1)
    poisoned = msgcodec.encode_record("T", 1, 0, b"x", b"TAGS\x01\xff\xfe", 0, 1, host, host, 0, 0, 9, 1, 2)
    body = good[0] + poisoned + good[1]
    want = [MessageExt.from_raw(r, "broker-c") for r in decode_pull_body(body, mq, "a:1", True)]
    assert len(want) == 2 and decode_found(body, mq, "a:1") == want
    with pytest.raises(MQClientError):
        decode_found(good[0] + b"\x00\x00\x00\x05junk", mq, "a:1")


def test_message_dataclass_subclass_gets_the_same_conversions():
    @dataclasses.dataclass(frozen=True, slots=True)
    class Traced(Message):
        trace_id: str = ""
    m = Traced("T", "é", keys="a b", properties={"p": 1}, trace_id="t1")
    assert (m.body, m.keys, m.properties, m.trace_id) == (b"\xc3\xa9", ("a", "b"), {"p": "1"}, "t1")
    assert type(m.properties) is msgcodec.FrozenProperties
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.trace_id = "x"  # type: ignore[misc]


# --- consume path (clientconsume): each shortcut equals the general code -----------------

def _v4_record(i: int, topic: str = "T", props: str = "UNIQ_KEY\x01ABC\x02WAIT\x01true", body: bytes = b"b",
               born=(bytes([10, 0, 0, 1]), 1234), store=(bytes([127, 0, 0, 1]), 10911), sys_flag: int = 0) -> bytes:
    return msgcodec.encode_record(topic, 1, 7, body, props, sys_flag, 1_700_000_000_000 + i, born, store,
                                  0, 0, i, 1000 + 300 * i, 1_700_000_000_500 + i)


def _general(body, bn):
    """decode_messages' reference: the general loop alone, from the first record."""
    return msgcodec._decode_pull_body(body, True, bn)


def test_v4_run_takes_the_common_records_and_hands_the_rest_to_the_general_loop():
    plain = b"".join(_v4_record(i) for i in range(5))
    out = []
    assert msgcodec._decode_v4_run(plain, "bn", out, 0) == len(plain)
    assert out == _general(plain, "bn") and [m._values() for m in out] == [m._values() for m in _general(plain, "bn")]
    assert all(type(m) is msgcodec._PulledMessageExt for m in out)
    v6 = _v4_record(5, born=(bytes(range(16)), 5))
    zipped = _v4_record(6, body=msgcodec.compress_body(b"z" * 50), sys_flag=msgcodec.MessageSysFlag.COMPRESSED_FLAG)
    retry = _v4_record(7, topic="%RETRY%G", props="RETRY_TOPIC\x01Orig\x02TAGS\x01a")
    for odd in (v6, zipped):
        body = plain + odd + plain
        out = []
        assert msgcodec._decode_v4_run(body, "bn", out, 0) == len(plain)     # stops at the odd one
        got = msgcodec.decode_messages(body, "bn")
        assert got == _general(body, "bn") and len(got) == 11
        # the odd one alone goes through the general loop: the records after it are views again
        assert [type(m) is msgcodec._PulledMessageExt for m in got] == [True] * 5 + [False] + [True] * 5
        assert msgcodec._decode_v4_run(body, "bn", [], len(plain) + len(odd)) == len(body)
    got = msgcodec.decode_messages(plain + retry + _v4_record(8, topic="U"), "bn")
    assert [(m.topic, m.real_topic) for m in got] == [("T", "T")] * 5 + [("Orig", "%RETRY%G"), ("U", "U")]
    assert got == _general(plain + retry + _v4_record(8, topic="U"), "bn")


def test_decode_messages_equals_the_general_loop_on_random_and_damaged_bodies():
    rnd = random.Random(23)
    bodies = []
    for _ in range(40):
        bodies.append(b"".join(_random_record(rnd, i) if rnd.random() < 0.3 else _v4_record(i, rnd.choice(["T", "Tx"]))
                               for i in range(rnd.randrange(1, 30))))
    base = b"".join(_v4_record(i) for i in range(6))
    for _ in range(300):            # bit flips and cuts anywhere: same records or the same ValueError
        b = bytearray(base)
        if rnd.random() < 0.2:
            b = b[:rnd.randrange(1, len(b))]
        else:
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
        bodies.append(bytes(b))
    for body in bodies:
        try:
            want = _general(body, "bn")
        except ValueError as e:
            with pytest.raises(ValueError) as got:
                msgcodec.decode_messages(body, "bn")
            assert str(got.value) == str(e)
            continue
        got = msgcodec.decode_messages(body, "bn")
        assert got == want and [g._values() for g in got] == [w._values() for w in want]


def test_pull_ext_fields_equal_the_encoded_header():
    from pocketmq.client.api import PullRequest, pull_ext_fields
    from pocketmq.protocol.bodies import MessageQueue
    from pocketmq.protocol.headers.typed import PullMessageRequestHeader, encode_pull_header
    mq = MessageQueue("T", "broker-a", 3)
    for sub, etype in ((None, "TAG"), ("a || b", "TAG"), ("x > 1", "SQL92"), ("*", None)):
        for commit in (0, 77):
            req = PullRequest("a:1", "G", mq, 12345, 32, 3 if commit else 2, commit, 15000, sub, 99, 30.0, etype)
            h = PullMessageRequestHeader("G", "T", 3, 12345, 32, req.sys_flag, commit, 15000, sub, 99,
                                         etype if sub is not None else None)
            assert pull_ext_fields(req) == encode_pull_header(h)


class _ReadyConn:
    """A prepared connection: records what ClientAPI hands to request()."""

    def __init__(self, serialize_type):
        self.closed = False
        self.attrs = {"ready": True, "serialize_type": serialize_type}
        self.requests = []

    async def request(self, cmd, timeout_s):
        self.requests.append((cmd, timeout_s))
        return RemotingCommand(0, ext_fields={"nextBeginOffset": "5", "minOffset": "0", "maxOffset": "9"},
                               flag=1)


async def test_pull_and_offset_commit_over_a_ready_connection_send_what_invoke_would():
    from pocketmq.client.api import ClientAPI, PullRequest, PULL_BODY, pull_ext_fields
    from pocketmq.protocol.bodies import MessageQueue
    from pocketmq.protocol.codes import LanguageCode
    from tests.unit.test_client_api import RecordingTransport
    mq = MessageQueue("T", "broker-a", 3)
    t = RecordingTransport(RemotingCommand(0, ext_fields={"nextBeginOffset": "5"}), RemotingCommand(0))
    conn = t.remoting.connections["b:1"] = _ReadyConn(SerializeType.MSGPACK)
    api = ClientAPI(t)
    req = PullRequest("b:1", "G", mq, 4, 32, 2, 0, 15000, "*", 1, 30.0, "TAG", PULL_BODY)
    res = await api.pull_message(req)
    await api.update_consumer_offset("b:1", "G", mq, 77)
    assert res.next_begin_offset == 5 and t.sent == []          # nothing went through invoke
    (pull, pull_t), (upd, upd_t) = conn.requests
    assert (pull.code, pull.ext_fields, pull_t) == (RequestCode.PULL_MESSAGE, pull_ext_fields(req), 30.0)
    assert (upd.code, upd.ext_fields, upd_t) == (RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "G", "topic": "T", "queueId": "3", "commitOffset": "77"}, api.timeout_s)
    for cmd in (pull, upd):
        assert (cmd.language, cmd.serialize_type, cmd.flag) == (LanguageCode.PYTHON, SerializeType.MSGPACK, 0)
    # no prepared connection: the transport's invoke, with the same request
    conn.closed = True
    await api.pull_message(req)
    await api.update_consumer_offset("b:1", "G", mq, 78)
    assert [(how, c.code, c.ext_fields) for _, c, how in t.sent] == [
        ("invoke", RequestCode.PULL_MESSAGE, pull_ext_fields(req)),
        ("invoke", RequestCode.UPDATE_CONSUMER_OFFSET,
         {"consumerGroup": "G", "topic": "T", "queueId": "3", "commitOffset": "78"})]


class _OffsetInstance:
    def __init__(self):
        self.api = self
        self.sent = []
        self.fail = False

    async def master_addr_refreshing(self, broker_name, topic):
        return "b:1"

    async def update_consumer_offset(self, addr, group, mq, offset, oneway=False):
        if self.fail:
            from pocketmq.client.errors import RemotingFailure
            raise RemotingFailure("down")
        self.sent.append((mq, offset))


async def test_persist_of_one_queue_equals_the_general_persist():
    from pocketmq.client.offset_store import OffsetTable, RemoteOffsetStore
    from pocketmq.protocol.bodies import MessageQueue
    mqs = [MessageQueue("T", "broker-a", q) for q in range(3)]
    rnd = random.Random(3)
    for _ in range(200):
        a, b = OffsetTable(), OffsetTable()
        for _ in range(rnd.randrange(6)):
            mq, off = rnd.choice(mqs), rnd.randrange(-1, 5)
            a.update(mq, off), b.update(mq, off)
        mq = rnd.choice(mqs)
        got = a.take_one(mq)
        want = b.take_dirty([mq])
        assert (got is None and want == {}) or want == {mq: got}
        assert (a.offsets, a.dirty) == (b.offsets, b.dirty)
    inst = _OffsetInstance()
    store = RemoteOffsetStore(inst, "G")
    store.update(mqs[0], 5)
    assert await store.persist([mqs[0]]) == 1 and await store.persist([mqs[0]]) == 0    # sent once
    inst.fail = True
    store.update(mqs[0], 6)
    assert await store.persist([mqs[0]]) == 0 and mqs[0] in store.table.dirty          # stays dirty
    inst.fail = False
    store.update(mqs[1], 1)
    assert await store.persist() == 2 and sorted(inst.sent) == [(mqs[0], 5), (mqs[0], 6), (mqs[1], 1)]


class _Msg:
    def __init__(self, off, body=b"xy"):
        self.queue_offset = off
        self.body = body


def _put_one_by_one(pq, msgs, now_ms):
    """ProcessQueue.put_messages' general loop (the reference for its bulk path)."""
    added = 0
    for m in msgs:
        if m.queue_offset in pq.msgs:
            continue
        pq.msgs[m.queue_offset] = m
        added += 1
        pq.msg_size_bytes += len(m.body) if m.body is not None else 0
        pq.queue_offset_max = max(pq.queue_offset_max, m.queue_offset)
    pq.msg_count += added
    pq.last_pull_ms = now_ms
    return added


def test_process_queue_bulk_put_and_remove_one_equal_the_general_code():
    from pocketmq.client.process_queue import ProcessQueue
    rnd = random.Random(9)
    for _ in range(100):
        a, b = ProcessQueue(), ProcessQueue()
        nxt = 0
        for step in range(rnd.randrange(1, 12)):
            if rnd.random() < 0.2:
                nxt = max(0, nxt - rnd.randrange(1, 20))            # a seek back: offsets seen again
            n = rnd.randrange(0, 8)
            offs = [nxt + i for i in range(n)]
            if rnd.random() < 0.1 and offs:
                offs.append(offs[0])                                # the same offset twice in one pull
            nxt += n
            msgs = [_Msg(o, None if rnd.random() < 0.1 else b"x" * rnd.randrange(4)) for o in offs]
            assert a.put_messages(msgs, step) == _put_one_by_one(b, msgs, step)
            for m in [m for m in msgs if rnd.random() < 0.4]:
                a.remove_one(m, step)
                b.remove_messages((m,), step)
            assert list(a.msgs.items()) == list(b.msgs.items())
            assert [(p.msg_count, p.msg_size_bytes, p.queue_offset_max, p.consumed_total, p.last_consume_ms,
                     p.last_pull_ms, p.commit_offset()) for p in (a, b)][0] == \
                (b.msg_count, b.msg_size_bytes, b.queue_offset_max, b.consumed_total, b.last_consume_ms,
                 b.last_pull_ms, b.commit_offset())
