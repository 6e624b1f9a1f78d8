"""Allocation strategies vs the output of the Java 4.9 algorithms.

Expected tables were derived by hand from AllocateMessageQueueAveragely's
arithmetic (average = n_mq // n_cid, the first n_mq % n_cid consumers get one
more, contiguous pages; more consumers than queues -> one each, the rest none).
"""
import hashlib
import itertools

import pytest

from pocketmq.client.rebalance import (
    AllocateAveragely,
    AllocateAveragelyByCircle,
    AllocateByConfig,
    AllocateByMachineRoom,
    AllocateConsistentHash,
    AllocateError,
    plan_clustering,
    strategy_by_name,
)
from pocketmq.client.rebalance.allocate import java_mq_string, md5_hash32
from pocketmq.protocol.bodies import MessageQueue


def mqs(n, topic="T", broker="broker-a"):
    return [MessageQueue(topic, broker, i) for i in range(n)]


def cids(n):
    return [f"10.0.0.{i}@{i}" for i in range(n)]


# (queues, consumers) -> queue ids per consumer index, as Java returns them.
AVG_CASES = {
    (8, 3): [[0, 1, 2], [3, 4, 5], [6, 7]],
    (8, 1): [[0, 1, 2, 3, 4, 5, 6, 7]],
    (8, 2): [[0, 1, 2, 3], [4, 5, 6, 7]],
    (8, 4): [[0, 1], [2, 3], [4, 5], [6, 7]],
    (8, 5): [[0, 1], [2, 3], [4, 5], [6], [7]],
    (8, 8): [[0], [1], [2], [3], [4], [5], [6], [7]],
    (8, 10): [[0], [1], [2], [3], [4], [5], [6], [7], [], []],
    (4, 3): [[0, 1], [2], [3]],
    (16, 3): [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]],
    (10, 4): [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]],
    (1, 2): [[0], []],
    (3, 7): [[0], [1], [2], [], [], [], []],
    (7, 3): [[0, 1, 2], [3, 4], [5, 6]],
}

CIRCLE_CASES = {
    (8, 3): [[0, 3, 6], [1, 4, 7], [2, 5]],
    (4, 3): [[0, 3], [1], [2]],
    (3, 5): [[0], [1], [2], [], []],
}


@pytest.mark.parametrize("shape", sorted(AVG_CASES))
def test_averagely_matches_java_table(shape):
    n_mq, n_cid = shape
    q, c = mqs(n_mq), cids(n_cid)
    got = [[m.queue_id for m in AllocateAveragely().allocate("G", cid, q, c)] for cid in c]
    assert got == AVG_CASES[shape]


@pytest.mark.parametrize("shape", sorted(CIRCLE_CASES))
def test_by_circle_matches_java_table(shape):
    n_mq, n_cid = shape
    q, c = mqs(n_mq), cids(n_cid)
    got = [[m.queue_id for m in AllocateAveragelyByCircle().allocate("G", cid, q, c)] for cid in c]
    assert got == CIRCLE_CASES[shape]


@pytest.mark.parametrize("strategy", [AllocateAveragely(), AllocateAveragelyByCircle(),
                                      AllocateConsistentHash()])
def test_every_strategy_splits_disjointly_and_completely(strategy):
    for n_mq, n_cid in itertools.product(range(1, 20), range(1, 9)):
        q, c = mqs(n_mq), cids(n_cid)
        parts = [strategy.allocate("G", cid, q, c) for cid in c]
        flat = [m for p in parts for m in p]
        assert len(flat) == len(set(flat)) == n_mq, (n_mq, n_cid)


def test_unknown_consumer_gets_nothing_and_bad_input_raises():
    assert AllocateAveragely().allocate("G", "x@1", mqs(4), cids(2)) == []
    with pytest.raises(AllocateError):
        AllocateAveragely().allocate("G", "", mqs(4), cids(2))
    with pytest.raises(AllocateError):
        AllocateAveragely().allocate("G", "a", [], ["a"])
    with pytest.raises(AllocateError):
        AllocateAveragely().allocate("G", "a", mqs(1), [])


def test_two_brokers_sorted_like_java():
    q = sorted(mqs(4, broker="broker-b") + mqs(4, broker="broker-a"))
    assert [m.broker_name for m in q[:4]] == ["broker-a"] * 4
    c = cids(3)
    got = [[(m.broker_name[-1], m.queue_id) for m in AllocateAveragely().allocate("G", cid, q, c)]
           for cid in c]
    assert got == [[("a", 0), ("a", 1), ("a", 2)], [("a", 3), ("b", 0), ("b", 1)], [("b", 2), ("b", 3)]]


def test_consistent_hash_ring_follows_java_definition():
    q, c = mqs(8), cids(3)
    assert java_mq_string(q[1]) == "MessageQueue [topic=T, brokerName=broker-a, queueId=1]"
    assert md5_hash32("abc") == int.from_bytes(hashlib.md5(b"abc").digest()[:4], "big")
    # Recompute the ring independently: 10 virtual nodes "cid-i" per consumer.
    ring = sorted((md5_hash32(f"{cid}-{i}"), cid) for cid in c for i in range(10))

    def owner(mq):
        h = md5_hash32(java_mq_string(mq))
        for k, cid in ring:
            if k >= h:
                return cid
        return ring[0][1]
    for cid in c:
        assert AllocateConsistentHash().allocate("G", cid, q, c) == [m for m in q if owner(m) == cid]


def test_by_config_and_machine_room():
    fixed = mqs(2)
    assert AllocateByConfig(fixed).allocate("G", "a", mqs(8), ["a", "b"]) == fixed
    q = sorted(mqs(3, broker="hz@broker-a") + mqs(2, broker="sh@broker-b") + mqs(2, broker="broker-c"))
    strat = AllocateByMachineRoom({"hz", "sh"})
    c = ["a", "b"]
    got = [strat.allocate("G", cid, q, c) for cid in c]
    # 5 eligible queues, 2 consumers: blocks of 2, the remainder (index 4) to consumer 0.
    eligible = [m for m in q if "@" in m.broker_name]
    assert got[0] == eligible[0:2] + [eligible[4]]
    assert got[1] == eligible[2:4]


def test_strategy_by_name():
    assert isinstance(strategy_by_name("avg"), AllocateAveragely)
    with pytest.raises(AllocateError):
        strategy_by_name("nope")


def test_plan_clustering_diffs_held_queues():
    q = mqs(8)
    c = cids(2)
    held = {q[0], q[6], MessageQueue("Other", "broker-a", 0)}
    plan = plan_clustering("T", "G", c[0], reversed(q), reversed(c), held, AllocateAveragely())
    assert plan.allocated == frozenset(q[:4])
    assert plan.to_remove == (q[6],)
    assert plan.to_add == (q[1], q[2], q[3])
    assert plan.changed
    # consumer list order does not matter (sorted first)
    plan2 = plan_clustering("T", "G", c[0], q, c, set(q[:4]), AllocateAveragely())
    assert not plan2.changed
