from dataclasses import dataclass

import pytest

from pocketmq.client.process_queue import FlowControl, FlowLimits, ProcessQueue


@dataclass
class M:
    queue_offset: int
    body: bytes = b"x"


def test_commit_offset_is_smallest_in_flight_or_max_plus_one():
    pq = ProcessQueue()
    assert pq.commit_offset() == -1
    assert pq.remove_messages([M(1)]) == -1          # nothing cached: nothing to commit
    pq.put_messages([M(i) for i in range(1001, 1011)])
    assert pq.commit_offset() == 1001
    # 1002..1010 done, 1001 still running: the commit point stays at 1001
    assert pq.remove_messages([M(i) for i in range(1002, 1011)]) == 1001
    assert pq.msg_count == 1
    # 1001 done: the commit point jumps to max + 1
    assert pq.remove_messages([M(1001)]) == 1011
    assert pq.commit_offset() == 1011
    assert pq.msg_count == 0 and pq.msg_size_bytes == 0


def test_out_of_order_completion_and_duplicates():
    pq = ProcessQueue()
    assert pq.put_messages([M(5), M(6), M(7)]) == 3
    assert pq.put_messages([M(6), M(8)]) == 1        # 6 already cached
    assert pq.msg_count == 4 and pq.queue_offset_max == 8
    assert pq.remove_messages([M(7)]) == 5
    assert pq.remove_messages([M(5)]) == 6
    assert pq.remove_messages([M(5)]) == 6           # removing twice changes nothing
    assert pq.max_span == 2
    assert pq.remove_messages([M(6), M(8)]) == 9
    assert pq.consumed_total == 4


def test_flow_control_thresholds():
    limits = FlowLimits()
    assert (limits.pull_threshold_for_queue, limits.pull_threshold_size_for_queue_bytes,
            limits.consume_concurrently_max_span) == (1000, 100 * 1024 * 1024, 2000)
    pq = ProcessQueue()
    pq.put_messages([M(i) for i in range(1000)])
    assert pq.flow_control(limits) is None            # exactly 1000 is allowed
    pq.put_messages([M(1000)])
    assert pq.flow_control(limits) is FlowControl.COUNT

    pq = ProcessQueue()
    pq.put_messages([M(0, b"x" * (100 * 1024 * 1024))])
    assert pq.flow_control(limits) is None
    pq.put_messages([M(1, b"y")])
    assert pq.flow_control(limits) is FlowControl.SIZE

    pq = ProcessQueue()
    pq.put_messages([M(0), M(2000)])
    assert pq.flow_control(limits) is None
    pq.put_messages([M(2001)])
    assert pq.flow_control(limits) is FlowControl.SPAN
    assert pq.flow_control(limits, orderly=True) is None   # span only limits concurrent mode


def test_flow_limits_are_bounded():
    with pytest.raises(ValueError):
        FlowLimits(pull_threshold_for_queue=0)
    with pytest.raises(ValueError):
        FlowLimits(consume_concurrently_max_span=10**6)


def test_commit_offset_covers_filtered_messages_once_empty():
    pq = ProcessQueue()
    pq.put_messages([M(3), M(7)])
    pq.pull_offset = 20            # the pull scanned up to 19; tags filtered out the rest
    assert pq.commit_offset() == 3
    assert pq.remove_messages([M(3)]) == 7
    assert pq.remove_messages([M(7)]) == 20
    empty = ProcessQueue()
    empty.pull_offset = 5          # nothing matched at all
    assert empty.commit_offset() == 5


# -- consume timeout (integer clock) -----------------------------------------------------------

def test_claim_expired_takes_only_calls_older_than_the_timeout_and_drops_their_late_result():
    pq = ProcessQueue()
    msgs = [M(i) for i in range(10, 15)]
    pq.put_messages(msgs)
    pq.start_consuming(msgs[:2], now_ms=1_000)     # 10, 11 started at 1 s
    pq.start_consuming(msgs[2:4], now_ms=5_000)    # 12, 13 at 5 s; 14 not started
    assert pq.oldest_in_flight_age_ms(7_000) == 6_000
    assert pq.claim_expired(now_ms=6_000, timeout_ms=5_000) == []      # exactly 5 s old: not yet
    assert [m.queue_offset for m in pq.claim_expired(now_ms=6_001, timeout_ms=5_000)] == [10, 11]
    assert pq.claim_expired(now_ms=6_001, timeout_ms=5_000) == []      # claimed once only
    assert pq.oldest_in_flight_age_ms(7_000) == 2_000
    # the claimed ones stay cached (holding the commit point) until the shell removes them
    assert pq.commit_offset() == 10
    # the listener returns late for 10 and 12: only 12's result counts
    assert pq.finish_consuming([msgs[0], msgs[2]]) == [msgs[2]]
    assert pq.remove_messages([msgs[0], msgs[1]]) == 12
    assert pq.oldest_in_flight_age_ms(7_000) == 2_000                  # 13 still running
    assert pq.finish_consuming([msgs[3]]) == [msgs[3]]
    assert pq.oldest_in_flight_age_ms(7_000) == 0


def test_claim_expired_skips_messages_no_longer_cached_and_clear_forgets_starts():
    pq = ProcessQueue()
    pq.put_messages([M(1), M(2)])
    pq.start_consuming([M(1), M(2)], now_ms=0)
    pq.remove_messages([M(1)])                      # gone from the cache (e.g. removed by a reset)
    assert [m.queue_offset for m in pq.claim_expired(now_ms=100, timeout_ms=10)] == [2]
    pq.start_consuming([M(2)], now_ms=100)
    pq.clear()
    assert pq.oldest_in_flight_age_ms(1_000) == 0 and pq.claim_expired(1_000, 1) == []
