"""The Message paths' shortcuts (issue 35 item 3) produce exactly what the plain code does:
Message() and SendResult() stored through a slots twin, the plain message's properties
text, and coalesced sends whose UNIQ_KEYs are given when their group leaves."""
import asyncio
import dataclasses
import pickle
import random

import pytest

from pocketmq.client import message as climsg
from pocketmq.client.errors import MessageIllegalError
from pocketmq.client.message import Message, SendResult, SendStatus
from pocketmq.client.producer import Producer
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import MessageQueue


def test_message_and_send_result_are_their_own_class_after_init_and_after_a_failed_init():
    m = Message("T", "é", "A", "k1 k2", {"p": 1}, 2, 3, False, None)
    assert type(m) is Message and m.__class__ is Message
    assert (m.body, m.keys, m.properties) == (b"\xc3\xa9", ("k1", "k2"), {"p": "1"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.tags = "B"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(m)) == m and dataclasses.replace(m, flag=4).flag == 4
    # conversions that raise run before the swap: the half-built object stays a Message
    for bad in ({"body": object()}, {"keys": 5}, {"properties": 7}):
        obj = object.__new__(Message)
        with pytest.raises((TypeError, AttributeError)):
            Message.__init__(obj, "T", **bad)
        assert type(obj) is Message
    r = SendResult(SendStatus.SEND_OK, "U", "O", MessageQueue("T", "b", 0), 5)
    assert type(r) is SendResult and (r.region_id, r.trace_on, r.transaction_id) == ("DefaultRegion", True, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.msg_id = "V"  # type: ignore[misc]
    # the twins are layout twins (checked at import) that nobody sees
    assert climsg._MessageSlots.__slots__ == Message.__slots__
    assert climsg._SendResultSlots.__slots__ == SendResult.__slots__


def test_plain_message_properties_text_equals_the_dict_route():
    for wait in (True, False):
        for uniq in (None, "", "0A0B"):
            m = Message("T", b"b", wait_store_msg_ok=wait)
            assert m.wire_properties_text(uniq) == msgcodec.encode_properties(m.wire_properties(uniq))
    rnd = random.Random(35)
    for _ in range(300):
        kw = {k: v for k, v in (("tags", rnd.choice([None, "", "A"])), ("keys", rnd.choice([(), "a b"])),
                                ("properties", rnd.choice([None, {}, {"p": "q"}])),
                                ("delay_level", rnd.choice([-1, 0, 2])),
                                ("deliver_at_ms", rnd.choice([None, 0, 1_700_000_000_000])),
                                ("wait_store_msg_ok", rnd.random() < 0.5)) if rnd.random() < 0.4}
        m = Message("T", b"b", **kw)
        uniq = rnd.choice([None, "", "ABCDEF"])
        assert m.wire_properties_text(uniq) == msgcodec.encode_properties(m.wire_properties(uniq)), kw


class _Recorder(Producer):
    """A producer whose requests are recorded, not sent: (props, body, uniq, batch) each,
    answered SEND_OK with comma-joined offset ids for a batch; `refuse_batches` answers a
    batch MESSAGE_ILLEGAL (the group then goes one request per message)."""

    def __init__(self, refuse_batches=False):
        super().__init__("PG", "127.0.0.1:1", coalesce_max_messages=8)
        self.instance = object()
        self.sent = []
        self.refuse_batches = refuse_batches

    async def _send_with_retry(self, inst, topic, props, body, sys_flag, flag, uniq, queue, *, batch, timeout_s):
        self.sent.append((props, body, flag, uniq, batch))
        if batch and self.refuse_batches:
            raise MessageIllegalError("no batches here")
        n = uniq.count(",") + 1
        return SendResult(SendStatus.SEND_OK, uniq, ",".join(f"OFF{i}" for i in range(n)),
                          MessageQueue(topic, "b", 0), 100)


async def _coalesced(p: _Recorder, msgs: list[Message]) -> list[SendResult]:
    p._sends_in_flight = 1          # another send awaits its answer: these coalesce
    return await asyncio.gather(*(p.send(m) for m in msgs))


def _plain_body(msgs, uniqs) -> bytes:
    """The group body as the plain path wrote it: each message's wire_properties_text with
    its own id, through encode_batch_elements."""
    return msgcodec.encode_batch_elements([(m.flag, m.body, m.wire_properties_text(u).encode())
                                           for m, u in zip(msgs, uniqs)])


@pytest.mark.parametrize("shape", ["one", "mixed"])
async def test_coalesced_group_body_equals_the_plain_path(shape):
    rnd = random.Random(3)
    if shape == "one":
        msgs = [Message("T", bytes(rnd.randrange(1, 300))) for _ in range(8)]
    else:
        msgs = [Message("T", bytes(rnd.randrange(1, 300)), tags=rnd.choice([None, "A"]), keys=rnd.choice([(), "k"]),
                        properties=rnd.choice([None, {"u": "1"}]), flag=rnd.randrange(2)) for _ in range(8)]
    p = _Recorder()
    results = await _coalesced(p, msgs)
    assert len(p.sent) == 1
    props, body, flag, ids, batch = p.sent[0]
    uniqs = ids.split(",")
    assert batch and props == "WAIT\x01true" and flag == 0 and len(set(uniqs)) == 8
    assert all(len(u) == 32 for u in uniqs)
    assert body == _plain_body(msgs, uniqs)
    assert [r.msg_id for r in results] == uniqs
    assert [(r.offset_msg_id, r.queue_offset) for r in results] == [(f"OFF{i}", 100 + i) for i in range(8)]


async def test_coalesced_groups_split_at_the_bound_and_a_refused_batch_goes_one_by_one():
    msgs = [Message("T", b"x%d" % i, tags="A" if i % 3 else None) for i in range(10)]
    p = _Recorder()
    await _coalesced(p, msgs)
    assert [batch for *_, batch in p.sent] == [True, True]      # 8 + 2 (coalesce_max_messages=8)
    bodies = [msgcodec.parse_batch_body(body, b"") for _, body, _, _, _ in p.sent]
    assert [len(b) for b in bodies] == [8, 2]
    for (_, body, _, ids, _), part in zip(p.sent, (msgs[:8], msgs[8:])):
        assert body == _plain_body(part, ids.split(","))
    p = _Recorder(refuse_batches=True)
    results = await _coalesced(p, msgs[:3])
    singles = [s for s in p.sent if not s[4]]
    assert len(singles) == 3
    uniqs = p.sent[0][3].split(",")
    for m, u, (props, body, flag, uniq, _), r in zip(msgs, uniqs, singles, results):
        assert (props, body, flag, uniq) == (m.wire_properties_text(u), m.body, m.flag, u) and r.msg_id == u
    # one send alone in its group: a SEND_MESSAGE_V2 of the plain properties
    p = _Recorder()
    [r] = await _coalesced(p, [msgs[1]])
    [(props, body, flag, uniq, batch)] = p.sent
    assert not batch and props == msgs[1].wire_properties_text(uniq) and r.msg_id == uniq


async def test_sends_that_cannot_join_a_group_keep_their_own_request():
    p = _Recorder()
    timer = Message("T", b"t", deliver_at_ms=1_700_000_000_000)
    user_timer = Message("T", b"u", properties={"TIMER_DELAY_SEC": "5"})
    delayed = Message("T", b"d", delay_level=2)
    retry = Message("%RETRY%G", b"r")
    msgs = [timer, user_timer, delayed, retry]
    await _coalesced(p, msgs)
    assert [batch for *_, batch in p.sent] == [False] * 4
    for m, (props, body, _, uniq, _) in zip(msgs, p.sent):
        assert props == m.wire_properties_text(uniq) and body == m.body


class _JoinSpy(_Recorder):
    """A _Recorder that also records what joins a group: (key, element) each, and the
    timeout each request got. `shortcut=False` turns _join_plain off (the general path)."""

    def __init__(self, shortcut: bool, **settings):
        super().__init__()
        self.joined = []
        self.timeouts = []
        self.shortcut = shortcut
        for k, v in settings.items():
            setattr(self, k, v)

    def _join_plain(self, msg, timeout_ms):
        return super()._join_plain(msg, timeout_ms) if self.shortcut else None

    def _join(self, key, element, size):
        self.joined.append((key, element, size))
        return super()._join(key, element, size)

    async def _send_with_retry(self, inst, topic, props, body, sys_flag, flag, uniq, queue, *, batch, timeout_s):
        self.timeouts.append(timeout_s)
        return await super()._send_with_retry(inst, topic, props, body, sys_flag, flag, uniq, queue,
                                              batch=batch, timeout_s=timeout_s)


async def _outcome(p: _JoinSpy, m, timeout_ms):
    """What send(m) did with another send in flight: the error, or what joined a group and
    the requests made (each UNIQ_KEY replaced: ids differ between producers)."""
    p._sends_in_flight = 1
    try:
        r = await p.send(m, timeout_ms=timeout_ms)
    except Exception as e:      # noqa: BLE001 -- the error is what is compared
        return ("error", type(e), str(e))
    sent = []
    for props, body, flag, uniq, batch in p.sent:
        for u in uniq.split(","):
            props = props.replace(u, "<id>")
        sent.append((props, body, flag, batch))
    return ("sent", p.joined, sent, p.timeouts, r.msg_id == p.sent[-1][3].split(",")[-1])


async def test_the_common_sends_shortcut_does_what_the_general_path_does():
    """_join_plain against send() without it: every message shape, producer setting and
    state the shortcut looks at, the same group element, size, key, requests and errors
    (and the shortcut taken for the plain ones, so the comparison is not vacuous)."""
    rnd = random.Random(24)
    taken = refused = 0
    bodies = [b"", b"x", bytes(100), bytes(4095), bytes(4096), bytes(5000)]
    topics = ["T", "T2", "%RETRY%G", "bad topic", "T" * 300, 5, ["T"]]
    for _ in range(1500):
        kw = {k: v for k, v in (("tags", rnd.choice([None, "", "A"])), ("keys", rnd.choice([(), "a b"])),
                                ("properties", rnd.choice([None, {}, {"p": "q"}, {"UNIQ_KEY": "x"}])),
                                ("delay_level", rnd.choice([-1, 0, 2, None, "", True])),
                                ("flag", rnd.choice([0, 7])),
                                ("deliver_at_ms", rnd.choice([None, 0, 1_700_000_000_000])),
                                ("wait_store_msg_ok", rnd.choice([True, False, 1, 0]))) if rnd.random() < 0.15}
        m = Message(rnd.choice(topics), rnd.choice(bodies), **kw)
        settings = {k: v for k, v in (("max_message_size_bytes", rnd.choice([4096, 4400, 4500, 1 << 22])),
                                      ("compress_over_bytes", rnd.choice([1, 4096, 1 << 30])),
                                      ("coalesce_sends", rnd.random() < 0.9),
                                      ("send_timeout_ms", rnd.choice([3000, 1500])),
                                      ("_closed", rnd.random() < 0.05)) if rnd.random() < 0.3}
        checked = [t for t in topics[:3] if rnd.random() < 0.7]     # topics a send already checked
        timeout_ms = rnd.choice([None, None, 0, 1000])
        unstarted = rnd.random() < 0.05
        outcomes = []
        for shortcut in (True, False):
            p = _JoinSpy(shortcut, **settings)
            p._topics_checked.update(checked)
            if unstarted:
                p.instance = None
            if shortcut:
                took = p._join_plain(m, timeout_ms) is not None
                p._groups.clear()
                p.joined.clear()
            outcomes.append(await _outcome(p, m, timeout_ms))
        assert outcomes[0] == outcomes[1], (m, settings, checked, timeout_ms)
        taken += took
        refused += not took and outcomes[0][0] == "sent" and bool(outcomes[0][1])
    # the shortcut took the common sends, and left to the general path some that joined
    assert taken > 80 and refused > 50, (taken, refused)
