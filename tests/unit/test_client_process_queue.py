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
