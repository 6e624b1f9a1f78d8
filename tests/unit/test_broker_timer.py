"""Timer messages' pure rules (broker/core/timer.py): which message is one, the three
properties, the max-delay check, parking and unparking, the bounded schedule (horizon,
reloads) and the rebuild from a checkpoint. Integer clocks; no sockets."""
import random

import pytest

from pocketmq.broker.core import timer as t
from pocketmq.broker.core.timer import TimerCheckpoint, TimerError, TimerSchedule
from pocketmq.common.constants import NOT_ALLOWED_SEND_TOPICS, TIMER_TOPIC
from pocketmq.protocol.message import decode_properties, encode_properties

NOW = 1_700_000_000_000
MAX_SEC = 3 * 24 * 3600


# --- which message, and when ----------------------------------------------------------------

def test_the_three_properties_in_javas_order():
    assert t.deliver_ms({"TIMER_DELIVER_MS": str(NOW + 1234)}, NOW, MAX_SEC) == NOW + 1234
    assert t.deliver_ms({"TIMER_DELAY_SEC": "7"}, NOW, MAX_SEC) == NOW + 7000
    assert t.deliver_ms({"TIMER_DELAY_MS": "250"}, NOW, MAX_SEC) == NOW + 250
    # DELAY_SEC, then DELAY_MS, then DELIVER_MS (HookUtils.transformTimerMessage's order)
    both = {"TIMER_DELIVER_MS": str(NOW + 1), "TIMER_DELAY_MS": "20", "TIMER_DELAY_SEC": "3"}
    assert t.deliver_ms(both, NOW, MAX_SEC) == NOW + 3000
    del both["TIMER_DELAY_SEC"]
    assert t.deliver_ms(both, NOW, MAX_SEC) == NOW + 20


def test_not_a_timer_message():
    assert t.deliver_ms({}, NOW, MAX_SEC) is None
    assert t.deliver_ms({"TAGS": "a"}, NOW, MAX_SEC) is None
    # a delay level wins; "0" is no level
    assert t.deliver_ms({"DELAY": "3", "TIMER_DELAY_SEC": "5"}, NOW, MAX_SEC) is None
    assert t.deliver_ms({"DELAY": "0", "TIMER_DELAY_SEC": "5"}, NOW, MAX_SEC) == NOW + 5000
    # delivered once already (TIMER_OUT_MS) and sent again: an ordinary message
    assert t.deliver_ms({"TIMER_OUT_MS": "5", "TIMER_DELIVER_MS": str(NOW + 9000)}, NOW, MAX_SEC) is None


def test_bad_numbers_and_cancel_are_refused():
    for props in ({"TIMER_DELIVER_MS": "soon"}, {"TIMER_DELAY_SEC": "1.5"}, {"TIMER_DELAY_MS": ""}):
        with pytest.raises(TimerError, match="whole number"):
            t.deliver_ms(props, NOW, MAX_SEC)
    with pytest.raises(TimerError, match="TIMER_DEL_UNIQKEY"):
        t.deliver_ms({"TIMER_DELAY_SEC": "5", "TIMER_DEL_UNIQKEY": "x"}, NOW, MAX_SEC)


def test_max_delay_bound():
    assert t.deliver_ms({"TIMER_DELAY_SEC": str(MAX_SEC)}, NOW, MAX_SEC) == NOW + MAX_SEC * 1000
    with pytest.raises(TimerError) as e:
        t.deliver_ms({"TIMER_DELAY_MS": str(MAX_SEC * 1000 + 1)}, NOW, MAX_SEC)
    assert str(e.value) == ("timer message illegal, the delay time should not be bigger than the max delay "
                            "259200000ms; or if set del msg, the delay time should be bigger than the current time")
    with pytest.raises(TimerError):
        t.deliver_ms({"TIMER_DELIVER_MS": str(NOW + 10_001)}, NOW, 10)


def test_place_park_and_unpark():
    text = encode_properties({"TAGS": "a", "TIMER_DELIVER_MS": str(NOW + 500), "u": "v"})
    topic, qid, props = t.place("Orders", 3, text, NOW, MAX_SEC)
    assert (topic, qid) == (TIMER_TOPIC, t.TIMER_QUEUE)
    d = decode_properties(props)
    assert d["TIMER_OUT_MS"] == str(NOW + 500) and d["REAL_TOPIC"] == "Orders" and d["REAL_QID"] == "3"
    assert d["u"] == "v" and d["TAGS"] == "a"
    assert t.parked_deliver_ms(d, 1) == NOW + 500
    real = t.unpark(d, NOW + 3, NOW + 501)
    assert real[:2] == ("Orders", 3)
    back = decode_properties(real[2])
    assert "REAL_TOPIC" not in back and "REAL_QID" not in back
    assert back["TIMER_ENQUEUE_MS"] == str(NOW + 3) and back["TIMER_DEQUEUE_MS"] == str(NOW + 501)
    assert back["TIMER_OUT_MS"] == str(NOW + 500) and back["u"] == "v"
    # a time now or past: its own topic at once, properties as sent
    for at in (NOW, NOW - 10_000, -5):
        past = encode_properties({"TIMER_DELIVER_MS": str(at)})
        assert t.place("Orders", 1, past, NOW, MAX_SEC) == ("Orders", 1, past)
    assert t.place("Orders", 1, encode_properties({"k": "v"}), NOW, MAX_SEC) is None
    assert t.unpark({"TIMER_OUT_MS": "1"}, 0, 0) is None
    # a damaged parked record is due at once (never held forever)
    assert t.parked_deliver_ms({}, 77) == 77
    assert TIMER_TOPIC in NOT_ALLOWED_SEND_TOPICS


# --- checkpoints ----------------------------------------------------------------------------

def test_checkpoint_round_trip_and_bad_bodies():
    for cp in (TimerCheckpoint(10, (NOW, 4), 3), TimerCheckpoint(0, None, 0)):
        assert TimerCheckpoint.decode(cp.encode()) == cp
    for body in (b"", b"{", b"[]", b'{"enqueueOffset": 1}', b'{"enqueueOffset": 1, "lowOffset": 2, '
                 b'"deliveredBelow": null}', b'{"enqueueOffset": 5, "lowOffset": 1, "deliveredBelow": [1]}',
                 b'{"enqueueOffset": "5", "lowOffset": 1, "deliveredBelow": null}'):
        with pytest.raises(ValueError):
            TimerCheckpoint.decode(body)
    cp = TimerCheckpoint(10, (NOW, 4), 3)
    assert cp.delivered(2, (NOW + 99, 2))           # below L
    assert cp.delivered(5, (NOW - 1, 5)) and not cp.delivered(5, (NOW, 5))
    assert not cp.delivered(10, (0, 10))             # not read when it was written


# --- the schedule ---------------------------------------------------------------------------

class Driver:
    """What services/timer.py does with a TimerSchedule, over a list as the queue."""

    def __init__(self, queue, capacity, start=0, restored=None):
        self.queue = queue                       # offset -> deliver_ms
        self.s = TimerSchedule(capacity, start, restored)
        self.delivered: dict[int, int] = {}      # offset -> when
        self.max_heap = 0

    def step(self, now, slice_=5):
        s = self.s
        for off in range(s.enqueue_offset, min(len(self.queue), s.enqueue_offset + slice_)):
            s.add(off, self.queue[off])
            self.max_heap = max(self.max_heap, len(s.heap))
        if s.needs_reload():
            s.begin_reload()
        if s.reloading:
            pos = s.reload_position()
            for off in range(pos, min(s.enqueue_offset, pos + 2 * slice_)):
                s.reload_add(off, self.queue[off])
            s.reload_finish()
            self.max_heap = max(self.max_heap, len(s.heap))
        for at, off in s.pop_due(now, slice_):
            assert at <= now and self.queue[off] == at
            assert off not in self.delivered, "delivered twice"
            self.delivered[off] = now

    def run_until_idle(self, now):
        for _ in range(10_000):
            before = (len(self.delivered), self.s.enqueue_offset, self.s.reloading, len(self.s.heap))
            self.step(now)
            if (len(self.delivered), self.s.enqueue_offset, self.s.reloading, len(self.s.heap)) == before \
                    and not self.s.reloading and self.s.enqueue_offset == len(self.queue):
                return
        raise AssertionError("no progress")


def test_never_early_in_order_and_bounded_memory():
    rnd = random.Random(7)
    for capacity in (4, 8, 64):
        queue = [NOW + rnd.randrange(0, 5000) for _ in range(300)]
        d = Driver(queue, capacity)
        for now in range(NOW - 10, NOW + 5100, 37):
            d.run_until_idle(now)
            assert d.max_heap <= capacity
            due = {o for o, at in enumerate(queue) if at <= now}
            assert set(d.delivered) == due          # every due one, never one not due
            assert d.s.size == len(queue) - len(due)
        assert len(d.delivered) == len(queue)


def test_messages_arriving_late_with_past_times_and_while_reloading():
    rnd = random.Random(11)
    queue: list[int] = []
    d = Driver(queue, 8)
    now = NOW
    for i in range(400):
        now += rnd.randrange(0, 20)
        queue.append(now + rnd.choice([-500, 0, 1, 50, 3000, 9000]))   # past, now, soon, far
        d.step(now, slice_=3)                   # reads lag behind; reloads interleave
        assert d.max_heap <= 8
        assert all(queue[o] <= at for o, at in d.delivered.items())
    d.run_until_idle(now + 10_000)
    assert sorted(d.delivered) == list(range(len(queue)))


def test_capacity_is_checked():
    with pytest.raises(ValueError):
        TimerSchedule(3, 0)


def test_rebuild_from_checkpoint_loses_nothing_and_repeats_nothing_when_idle():
    rnd = random.Random(3)
    for capacity, crash_at in ((6, NOW + 1500), (100, NOW + 2500), (6, NOW + 100)):
        queue = [NOW + rnd.randrange(0, 5000) for _ in range(120)]
        d = Driver(queue, capacity)
        d.run_until_idle(crash_at)
        cp = d.s.checkpoint()
        assert TimerCheckpoint.decode(cp.encode()) == cp
        before = set(d.delivered)
        # the restart: read from L, skip what the checkpoint says was delivered
        r = Driver(queue, capacity, start=cp.low_offset, restored=cp)
        assert r.s.checkpoint() is None or cp.enqueue_offset <= cp.low_offset   # nothing better yet
        r.run_until_idle(crash_at)
        assert not set(r.delivered) & before, "delivered again after a clean checkpoint"
        r.run_until_idle(NOW + 6000)
        assert set(r.delivered) | before == set(range(len(queue)))
        # a checkpoint of the rebuilt run says as much
        assert r.s.checkpoint().low_offset == len(queue)


def test_rebuild_after_deliveries_past_the_checkpoint_redelivers_them():
    queue = [NOW + i * 10 for i in range(50)]
    d = Driver(queue, 16)
    d.run_until_idle(NOW + 100)
    cp = d.s.checkpoint()
    d.run_until_idle(NOW + 300)                  # delivered after the checkpoint: lost in the crash
    after_cp = {o for o in d.delivered if queue[o] > NOW + 100}
    r = Driver(queue, 16, start=cp.low_offset, restored=cp)
    r.run_until_idle(NOW + 300)
    assert set(r.delivered) == after_cp          # at least once: those again, nothing older


def test_checkpoint_with_due_messages_still_waiting_is_conservative():
    # a message due now but not yet popped holds D down: anything delivered with a later key
    # counts as not delivered (delivered again after a crash), never the other way round
    queue = [NOW + 2000, NOW + 1000]
    d = Driver(queue, 8)
    d.run_until_idle(NOW + 1000)
    assert set(d.delivered) == {1}
    queue.append(NOW - 5)                       # arrives with a past time
    d.s.add(2, queue[2])
    cp = d.s.checkpoint()
    assert cp == TimerCheckpoint(3, (NOW - 5, 2), 0)
    assert not cp.delivered(1, (NOW + 1000, 1))   # delivered, but a crash now repeats it
    assert not cp.delivered(2, (NOW - 5, 2)) and not cp.delivered(0, (NOW + 2000, 0))
    d.step(NOW + 1000)
    assert d.s.checkpoint() == TimerCheckpoint(3, (NOW + 2000, 0), 0)
    assert d.s.checkpoint().delivered(1, (NOW + 1000, 1))


def test_rebuild_with_a_small_capacity_never_reloads_what_the_checkpoint_delivered():
    # offset 0 waits far ahead (keeps L at 0), 1..20 are due in turn; after the checkpoint
    # more arrive with past times, pushing the horizon below the checkpoint's D: the reload
    # that rescans from offset 0 must still skip 1..15
    queue = [NOW + 100_000] + [NOW + i * 10 for i in range(1, 21)]
    d = Driver(queue, 4)
    d.run_until_idle(NOW + 150)
    cp = d.s.checkpoint()
    assert cp.low_offset == 0 and cp.delivered_below == (NOW + 160, 16)
    before = set(d.delivered)
    assert before == set(range(1, 16))
    queue += [NOW - 1000 + i for i in range(20)]
    r = Driver(queue, 4, start=cp.low_offset, restored=cp)
    r.run_until_idle(NOW + 150)
    assert not set(r.delivered) & before
    assert set(r.delivered) == set(range(21, 41))
    r.run_until_idle(NOW + 200_000)
    assert set(r.delivered) == set(range(len(queue))) - before
