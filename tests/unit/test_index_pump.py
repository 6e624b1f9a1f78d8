"""IndexPump (broker/services/index_pump.py): the message index built on the event loop right
behind the dispatcher, a step at a time, and the store's index_backlog_bytes / index_some.
A real MessageStore (files in tmp_path); the loop is the test's, no sockets, no sleeps."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pocketmq.broker.services.index_pump import IndexPump
from pocketmq.broker.store.api import MessageToStore
from pocketmq.broker.store.memory_store import MemoryStore
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig

HOST = (bytes([10, 0, 0, 7]), 40000)
STORE_HOST = (bytes([10, 0, 0, 1]), 10911)
ALL = (0, 1 << 62)


def opened(tmp_path, **kw) -> MessageStore:
    base = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 1024,
                store_host=STORE_HOST, total_physical_memory_bytes=1 << 34,
                max_hash_slot_num=64, max_index_num=4096, message_index_enable=True)
    base.update(kw)
    s = MessageStore(StoreConfig(str(tmp_path / "store"), **base))
    s.open()
    return s


@pytest.fixture
def s(tmp_path):
    store = opened(tmp_path)
    yield store
    store.close()


def put(s, i: int, now: int = 1_000_000) -> None:
    r = s.put_message(MessageToStore("T", 0, 0, b"body", f"KEYS\x01k{i}\x02UNIQ_KEY\x01U{i}", 0, now - 1,
                                     HOST, now + i))
    assert r.wrote_offset >= 0, r


def pump_over(s, n: int, step_records: int, backlog_bytes: int) -> IndexPump:
    """A pump of these settings over store s after n puts."""
    for i in range(n):
        put(s, i)
    pump = IndexPump(s)
    pump.step_records = step_records
    pump.backlog_bytes = backlog_bytes
    return pump


async def _settle(pump: IndexPump) -> None:
    # every scheduled step has run once no step is scheduled any more
    while pump._scheduled:
        await asyncio.sleep(0)


async def test_pump_indexes_right_behind_the_dispatcher_in_steps(s):
    pump = pump_over(s, 200, 8, 1000)
    backlog = s.index_backlog_bytes()
    assert backlog > 1000
    pump.kick()
    pump.kick()                     # one step scheduled at a time
    assert pump._scheduled
    await _settle(pump)
    assert s.index_backlog_bytes() < 1000
    assert pump.steps >= 200 // 8 - 10 and pump.records >= 200 - 1000 // 60
    # what is indexed is found by key without a flush pass (the query would catch up
    # itself: check the index alone, below the progress point)
    indexed = list(s._index.candidates("T#k7", *ALL))
    assert indexed, "k7 should be in the index already"


async def test_pump_leaves_a_small_backlog_to_the_flush_pass(s):
    pump = IndexPump(s)
    pump.backlog_bytes = 1 << 20
    for i in range(5):
        put(s, i)
    pump.kick()
    assert not pump._scheduled and pump.steps == 0
    assert s.index_backlog_bytes() > 0
    s.flush_consume_queues()        # the flush thread's pass indexes the tail
    assert s.index_backlog_bytes() == 0
    r = s.query_message("T", "k3", 10, *ALL)
    assert len(r.offsets) == 1


async def test_pump_stops_when_closed_and_survives_a_failing_store(s):
    pump = pump_over(s, 50, 4, 100)
    pump.kick()
    pump.close()
    await asyncio.sleep(0)
    assert pump.steps == 0          # scheduled before close, never run
    pump.kick()
    assert not pump._scheduled

    class Failing:
        def index_backlog_bytes(self):
            return 1 << 30

        def index_some(self, n):
            raise RuntimeError("store closed")
    bad = IndexPump(Failing())
    bad.kick()
    await _settle(bad)
    assert bad.steps == 0 and not bad._scheduled     # logged, not rescheduled forever


def test_index_off_and_memory_store_have_no_backlog(tmp_path):
    s = opened(tmp_path, message_index_enable=False)
    try:
        put(s, 1)
        assert s.index_backlog_bytes() == 0 and s.index_some(10) == 0
    finally:
        s.close()
    m = MemoryStore(StoreConfig(str(tmp_path / "mem"), store_host=STORE_HOST))
    assert m.index_backlog_bytes() == 0 and m.index_some(10) == 0


def test_index_some_failure_is_transient(s, monkeypatch):
    for i in range(20):
        put(s, i)

    def boom(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(s, "_index_catch_up", boom)
    assert s.index_some(8) == 0             # logged, nothing indexed, sends unaffected
    put(s, 99)
    monkeypatch.undo()
    assert s.index_some(1000) == 21
    assert s.index_backlog_bytes() == 0


async def test_pump_indexes_a_turns_dispatch_in_one_step_and_spreads_a_long_backlog(s):
    pump = pump_over(s, 200, 8, 100)
    pump.kick()
    await asyncio.sleep(0)          # one loop turn: everything dispatched before it
    assert s.index_backlog_bytes() < 100 and not pump._scheduled
    for i in range(200, 400):
        put(s, i)
    pump.step_budget_s = 0          # past the budget after each sub-step: one per turn
    pump.kick()
    await asyncio.sleep(0)
    assert pump._scheduled and s.index_backlog_bytes() > 100
    before = pump.records
    await asyncio.sleep(0)
    assert pump.records == before + 8
    await _settle(pump)
    assert s.index_backlog_bytes() < 100


def test_a_step_never_waits_for_the_flush_threads_pass(s):
    """While another thread holds the index (the flush thread's pass: its catch-up and
    fdatasync took 7-11 ms, the event loop waiting up to 6 ms behind it), index_some
    answers 0 at once instead of blocking the event loop; the backlog is indexed after."""
    for i in range(50):
        put(s, i)
    held, release = threading.Event(), threading.Event()

    def flush_pass():
        with s._index.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=flush_pass)
    t.start()
    try:
        assert held.wait(10)
        t0 = time.monotonic()
        assert s.index_some(32) == 0
        assert time.monotonic() - t0 < 1.0     # (blocking, it would wait the 10 s)
        assert s.index_backlog_bytes() > 0
    finally:
        release.set()
        t.join()
    while s.index_some(32):
        pass
    assert s.index_backlog_bytes() == 0
    assert s.query_message("T", "k7", 8, *ALL).offsets


class _Poll:
    """A server BusyPoll's `sharing` as the pump reads it."""
    sharing = False


async def test_pump_steps_after_every_dispatch_while_the_cpu_is_its_own(s):
    # sync sends with the CPU to ourselves: each dispatch's record or two indexed right
    # away (the few-records path), no request waiting behind a group's step
    poll = _Poll()
    pump = IndexPump(s, poll)
    put(s, 0)
    pump.kick()
    assert pump._scheduled
    await _settle(pump)
    assert s.index_backlog_bytes() == 0 and pump.steps == 1 and pump.records == 1
    # a runnable peer shares the CPU: steps wait for backlog_bytes_sharing, amortised over a
    # group, in sub-steps of step_records_sharing (one sub-step here: the whole group)
    poll.sharing = True
    pump.backlog_bytes_sharing = 4096
    put(s, 1)
    pump.kick()
    assert not pump._scheduled and 0 < s.index_backlog_bytes() < pump.backlog_bytes_sharing
    i = 2
    while s.index_backlog_bytes() < pump.backlog_bytes_sharing:
        put(s, i)
        i += 1
    assert i - 2 > pump.step_records        # more than one sub-step of the CPU-alone size
    steps = pump.steps
    pump._record_cost_s = 1e-6              # (measured: a cheap record, see the sizing's test)
    pump.kick()
    assert pump._scheduled
    await _settle(pump)
    assert s.index_backlog_bytes() == 0 and pump.records == i and pump.steps == steps + 1
    # no busy poll (busyPollMicros=0): nobody knows, groups of backlog_bytes
    plain = IndexPump(s)
    plain.backlog_bytes = 1000
    j = i
    while s.index_backlog_bytes() < plain.backlog_bytes:
        put(s, j)
        j += 1
        if j == i + 1:
            plain.kick()
            assert not plain._scheduled
    plain.kick()
    assert plain._scheduled
    await _settle(plain)
    assert s.index_backlog_bytes() == 0 and plain.steps == -(-(j - i) // plain.step_records)


def test_the_pumps_modes():
    """The three modes' settings: alone (every dispatch), shared (large groups, large
    sub-steps), unknown (no busy poll: 4 KiB groups)."""
    poll = _Poll()
    assert IndexPump(None)._mode() == (4096, 32)
    assert IndexPump(None, poll)._mode() == (1, 32)
    poll.sharing = True
    assert IndexPump(None, poll)._mode() == (128 * 1024, 1024)


async def test_hold_leaves_the_backlog_until_released(s):
    """A slave behind its master (hold true) copies first: kicks do nothing, a step that is
    already running stops; once hold is false the next kick indexes everything."""
    behind = [True]
    pump = pump_over(s, 200, step_records=32, backlog_bytes=1)
    pump.hold = lambda: behind[0]
    pump.kick()
    await _settle(pump)
    assert pump.records == 0 and s.index_backlog_bytes() > 0
    behind[0] = False
    pump.kick()
    await _settle(pump)
    assert pump.records == 200 and s.index_backlog_bytes() == 0
    # a step running when the slave falls behind stops after its sub-step
    for i in range(200, 400):
        put(s, i)
    calls = [0]

    def hold():
        calls[0] += 1
        return calls[0] > 1          # free at the kick, behind from the first sub-step on
    pump.hold = hold
    pump.kick()
    await _settle(pump)
    assert pump.records == 200 + 32


class _TimedStore:
    """index_some(n) as a store whose records each take `cost` seconds of a fake clock."""

    def __init__(self, records: int, cost: float, clock: list):
        self.left, self.cost, self.clock, self.asked = records, cost, clock, []

    def index_backlog_bytes(self) -> int:
        return self.left * 300

    def index_some(self, n: int) -> int:
        self.asked.append(n)
        n = min(n, self.left)
        self.left -= n
        self.clock[0] += n * self.cost
        return n


@pytest.mark.parametrize(("cost", "expected"), [
    # cheap records: one measured sub-step of step_records, then the largest that fits
    (1e-6, [32, 1024, 1024]),
    # 1 ms a record (many KEYS each): never more than fits what is left of the budget, and at
    # least step_records; the budget (10 ms) ends the callback after the first sub-step
    (1e-3, [32]),
    # 100 µs a record: the second sub-step fills the rest of the 10 ms (~68 records)
    (1e-4, [32, 68]),
])
async def test_shared_mode_sizes_its_sub_steps_to_fit_the_budget(monkeypatch, cost, expected):
    from pocketmq.broker.services import index_pump
    clock = [100.0]
    monkeypatch.setattr(index_pump, "perf_counter", lambda: clock[0])
    store = _TimedStore(5000, cost, clock)
    poll = _Poll()
    poll.sharing = True
    pump = IndexPump(store, poll)
    pump.backlog_bytes_sharing = 1
    pump.kick()
    assert pump._scheduled
    await asyncio.sleep(0)                  # one loop callback
    got = store.asked[:len(expected)]
    assert len(got) == len(expected) and all(abs(a - b) <= 1 for a, b in zip(got, expected)), got  # (float time)
    taken = sum(min(a, 5000) for a in store.asked)
    # the callback ran over its budget by at most one sub-step of step_records
    assert clock[0] - 100.0 <= pump.step_budget_s + pump.step_records * cost + 1e-12
    if store.left:
        assert pump._scheduled and taken < 5000     # the rest on the next loop turns
    pump.close()
