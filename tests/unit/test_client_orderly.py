"""Orderly consumption's pure rules (client/process_queue.py) and the broker's lock table
(broker/core/locks.py), with integer clocks."""
from dataclasses import dataclass, replace

import pytest

from pocketmq.broker.core.locks import RebalanceLockManager
from pocketmq.client.consumer_config import PushConsumerConfig
from pocketmq.client.errors import InvalidArgumentError
from pocketmq.client.process_queue import (
    MAX_TIME_CONSUME_CONTINUOUSLY_MS,
    REBALANCE_LOCK_INTERVAL_MS,
    REBALANCE_LOCK_MAX_LIVE_MS,
    OrderlyStep,
    ProcessQueue,
    next_lock_renewal_ms,
    orderly_step,
    split_exhausted,
)
from pocketmq.protocol.bodies import MessageQueue


@dataclass(frozen=True)
class M:
    queue_offset: int
    body: bytes = b"x"
    reconsume_times: int = 0


def test_java_constants():
    assert (REBALANCE_LOCK_MAX_LIVE_MS, REBALANCE_LOCK_INTERVAL_MS, MAX_TIME_CONSUME_CONTINUOUSLY_MS) == \
        (30_000, 20_000, 60_000)


def test_local_lock_expires_30s_after_the_last_renewal():
    pq = ProcessQueue(0)
    assert not pq.holds_lock(0)                  # never locked
    pq.set_locked(1_000)
    assert pq.holds_lock(1_000) and pq.holds_lock(31_000)
    assert not pq.holds_lock(31_001) and pq.lock_expired(31_001)
    pq.set_locked(31_001)                         # a renewal after expiry makes it valid again
    assert pq.holds_lock(61_001)
    pq.lose_lock()                                # the broker refused it
    assert not pq.holds_lock(31_002)


def test_renewal_every_20s_keeps_the_lock_and_one_missed_renewal_does_too_but_two_do_not():
    assert next_lock_renewal_ms(0) == 20_000 and next_lock_renewal_ms(20_000) == 40_000
    pq = ProcessQueue(0)
    pq.set_locked(0)
    renewals = [0]
    for now in range(0, 200_001, 1_000):
        if now >= next_lock_renewal_ms(renewals[-1]):
            renewals.append(now)
            pq.set_locked(now)
        assert pq.holds_lock(now), now
    assert renewals[:4] == [0, 20_000, 40_000, 60_000]
    # renewals stop at 200 s (broker unreachable): the lock is still good 30 s later, not after
    assert pq.holds_lock(230_000) and not pq.holds_lock(230_001)
    # so consumption (and pulling) stops before the broker's own 60 s lock lets another take it
    assert REBALANCE_LOCK_MAX_LIVE_MS < 60_000


def test_orderly_step_checks_in_javas_order():
    pq = ProcessQueue(0)
    pq.set_locked(0)
    assert orderly_step(pq, 0, 10, True) is OrderlyStep.IDLE
    pq.put_messages([M(0), M(1)])
    assert orderly_step(pq, 0, 10, True) is OrderlyStep.CONSUME
    # lock too old: relock first, even with messages (CLUSTERING) ...
    assert orderly_step(pq, 0, REBALANCE_LOCK_MAX_LIVE_MS + 1, True) is OrderlyStep.NEED_LOCK
    # ... BROADCASTING needs none
    assert orderly_step(pq, 0, REBALANCE_LOCK_MAX_LIVE_MS + 1, False) is OrderlyStep.CONSUME
    # 60 s of continuous consumption: yield to the other queues, then a new round starts
    pq.set_locked(59_000)
    assert orderly_step(pq, 0, MAX_TIME_CONSUME_CONTINUOUSLY_MS, True) is OrderlyStep.CONSUME
    assert orderly_step(pq, 0, MAX_TIME_CONSUME_CONTINUOUSLY_MS + 1, True) is OrderlyStep.YIELD
    assert orderly_step(pq, 60_001, 60_002, True) is OrderlyStep.CONSUME
    pq.dropped = True
    assert orderly_step(pq, 0, 10, True) is OrderlyStep.STOP


def test_take_messages_in_queue_order_and_the_commit_point_waits_for_success():
    pq = ProcessQueue(0)
    pq.put_messages([M(5), M(3), M(4), M(6)])
    assert [m.queue_offset for m in pq.take_messages(1)] == [3]
    assert [m.queue_offset for m in pq.take_messages(3)] == [3, 4, 5]
    assert pq.commit_offset() == 3 and pq.msg_count == 4     # taken, not done
    pq.remove_messages(pq.take_messages(2))
    assert pq.commit_offset() == 5
    assert [m.queue_offset for m in pq.take_messages(10)] == [5, 6]
    pq.remove_messages(pq.take_messages(10))
    assert pq.take_messages(1) == [] and pq.take_messages(4) == []
    assert pq.commit_offset() == 7


def test_retries_count_locally_and_exhausted_messages_go_to_the_dlq():
    pq = ProcessQueue(0)
    pq.put_messages([M(0), M(1)])
    msgs = pq.take_messages(2)
    for _ in range(3):
        dead, retry = split_exhausted(msgs, 3)
        assert dead == [] and retry == msgs
        pq.replace_messages([replace(m, reconsume_times=m.reconsume_times + 1) for m in retry])
        msgs = pq.take_messages(2)
    assert [m.reconsume_times for m in msgs] == [3, 3]
    dead, retry = split_exhausted(msgs, 3)
    assert dead == msgs and retry == []
    assert split_exhausted([M(0, reconsume_times=1), M(1)], 1) == ([M(0, reconsume_times=1)], [M(1)])
    assert pq.msg_count == 2 and pq.msg_size_bytes == 2       # replacing changes no accounting


def test_orderly_options_are_checked():
    cfg = PushConsumerConfig(orderly=True)
    assert cfg.suspend_current_queue_time_ms == 1000 and cfg.max_reconsume_times is None
    with pytest.raises(InvalidArgumentError, match="suspend_current_queue_time_ms"):
        PushConsumerConfig(orderly=True, suspend_current_queue_time_ms=-1)
    with pytest.raises(InvalidArgumentError, match="max_reconsume_times"):
        PushConsumerConfig(max_reconsume_times=-2)


def test_broker_lock_table_refuses_others_until_released_or_expired_and_unlock_client():
    locks = RebalanceLockManager(60_000)
    q0, q1 = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    assert locks.try_lock_batch("G", [q0, q1], "A", 0) == {q0, q1}
    assert locks.try_lock_batch("G", [q0, q1], "B", 1) == set()
    assert locks.try_lock_batch("G2", [q0], "B", 1) == {q0}           # another group
    assert locks.try_lock_batch("G", [q0], "A", 30_000) == {q0}        # renewal
    assert locks.try_lock_batch("G", [q1], "B", 60_001) == {q1}        # q1 expired
    assert locks.try_lock_batch("G", [q0], "B", 60_001) == set()       # q0 renewed at 30 s
    assert locks.unlock_client("G", "A") == [q0]
    assert locks.try_lock_batch("G", [q0], "B", 60_002) == {q0}
    assert locks.unlock_client("G", "A") == [] and locks.unlock_client("nope", "A") == []


def test_a_closing_connection_releases_only_the_locks_last_taken_over_it():
    locks = RebalanceLockManager()
    q0, q1 = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    conn1, conn2 = object(), object()
    assert locks.try_lock_batch("G", [q0, q1], "A", 0, conn1) == {q0, q1}
    # A reconnected and renewed q0 over its new connection before the old one's close is seen
    assert locks.try_lock_batch("G", [q0], "A", 1_000, conn2) == {q0}
    assert locks.unlock_client("G", "A", conn1) == [q1]
    assert locks.try_lock_batch("G", [q0, q1], "B", 2_000, object()) == {q1}
    assert locks.is_locked("G", q0, "A", 2_000)
    assert locks.unlock_client("G", "A", conn2) == [q0]
    assert locks.try_lock_batch("G", [q0], "B", 3_000) == {q0}


# -- the consume tasks (client/consume_orderly.py) with an integer clock, no broker -----------

@dataclass(frozen=True)
class QM:
    queue_id: int
    queue_offset: int
    body: bytes = b"x"
    reconsume_times: int = 0


class FakeConsumer:
    """What OrderlyService reads of its PushConsumer; each listener call takes 1 s."""
    group = "G"
    message_model = "BROADCASTING"       # no locks: only the consume tasks are exercised
    max_reconsume_times = None
    suspend_current_queue_time_ms = 0
    consume_batch_size = 1
    consume_concurrency = 1              # one slot: queues take turns
    state = "RUNNING"

    def __init__(self, clock, sink):
        self.clock = clock
        self.sink = sink
        self.stats = {"consumed": 0, "failed": 0, "sent_back": 0}

    def enter_worker_context(self):
        pass

    async def call_orderly_listener(self, msgs):
        self.clock[0] += 1_000
        self.sink.append((msgs[0].queue_id, msgs[0].queue_offset))
        return True


async def test_a_queue_consumed_for_60s_yields_its_slot_to_the_others():
    from pocketmq.client.consume_orderly import OrderlyService
    from pocketmq.client.subscription_state import QueueState
    from tests.support.events import Sink

    clock = [0]
    got = Sink()
    svc = OrderlyService(FakeConsumer(clock, got))
    svc.now_ms = lambda: clock[0]
    qa = QueueState(MessageQueue("T", "b", 0), 0, ProcessQueue(0))
    qb = QueueState(MessageQueue("T", "b", 1), 0, ProcessQueue(0))
    qa.pq.put_messages([QM(0, i) for i in range(100)])
    qb.pq.put_messages([QM(1, i) for i in range(5)])
    svc.start()
    try:
        svc.wake(qa)
        svc.wake(qb)
        await got.until(lambda s: len(s) == 105)
    finally:
        await svc.stop()
    # 61 messages of queue 0 (61 s > 60 s), then queue 1 gets the slot, then queue 0 again
    assert got[:61] == [(0, i) for i in range(61)]
    assert got[61:66] == [(1, i) for i in range(5)]
    assert got[66:] == [(0, i) for i in range(61, 100)]
    assert qa.pq.commit_offset() == 100 and qb.pq.commit_offset() == 5


def test_remove_head_forgets_the_taken_messages_even_if_an_earlier_one_was_cached_meanwhile():
    pq = ProcessQueue(0)
    pq.put_messages([M(3), M(4), M(5)])
    pq.remove_head(pq.take_messages(2), 7)
    assert list(pq.msgs) == [5] and pq.msg_count == 1 and pq.msg_size_bytes == 1
    assert pq.last_consume_ms == 7 and pq.consumed_total == 2
    taken = pq.take_messages(1)
    pq.put_messages([M(1)])                      # the pull offset moved back meanwhile
    pq.remove_head(taken)
    assert list(pq.msgs) == [1] and pq.msg_count == 1
    pq.remove_head([M(9)])                       # not cached: nothing happens
    assert list(pq.msgs) == [1] and pq.msg_count == 1
    pq.remove_head([M(1)])
    pq.remove_head([M(1)])                       # empty
    assert pq.msg_count == 0 and pq.commit_offset() == 6
