"""Queue allocation strategies (pure): which queues of a topic this consumer owns.

Every strategy is a function of (consumer group, this client id, all queues,
all client ids) and nothing else, so every member of a group that sees the
same queue and client lists computes a disjoint split. Callers pass both lists
**sorted** (queues the way Java's MessageQueue.compareTo sorts them: topic,
brokerName, queueId; client ids as strings), exactly as RebalanceImpl does.

The arithmetic follows the Java 4.9 strategies of the same names so that a
mixed group (Java, C++, Go and pocketmq consumers) splits queues the same way:

| name              | Java class                                |
|-------------------|-------------------------------------------|
| AVG               | AllocateMessageQueueAveragely (default)   |
| AVG_BY_CIRCLE     | AllocateMessageQueueAveragelyByCircle     |
| CONFIG            | AllocateMessageQueueByConfig              |
| MACHINE_ROOM      | AllocateMessageQueueByMachineRoom         |
| CONSISTENT_HASH   | AllocateMessageQueueConsistentHash        |
"""
from __future__ import annotations

import bisect
import hashlib
import logging
from collections.abc import Iterable, Sequence

from pocketmq.protocol.bodies import MessageQueue

log = logging.getLogger("pocketmq.client.rebalance")


class AllocateError(ValueError):
    """Bad input to an allocation strategy (Java throws IllegalArgumentException)."""


def _check(current_cid: str, mq_all: Sequence, cid_all: Sequence) -> None:
    if not current_cid:
        raise AllocateError("currentCID is empty")
    if not mq_all:
        raise AllocateError("mqAll is null or mqAll empty")
    if not cid_all:
        raise AllocateError("cidAll is null or cidAll empty")


class AllocateStrategy:
    name = "?"

    def allocate(self, group: str, current_cid: str, mq_all: Sequence[MessageQueue],
                 cid_all: Sequence[str]) -> list[MessageQueue]:
        raise NotImplementedError

    def __call__(self, group, current_cid, mq_all, cid_all):
        return self.allocate(group, current_cid, mq_all, cid_all)


class AllocateAveragely(AllocateStrategy):
    """Contiguous pages: the first `len(mq) % len(cid)` consumers get one extra queue."""
    name = "AVG"

    def allocate(self, group, current_cid, mq_all, cid_all):
        _check(current_cid, mq_all, cid_all)
        if current_cid not in cid_all:
            log.info("[BUG] group %s: consumer id %s not in %s", group, current_cid, list(cid_all))
            return []
        n_mq, n_cid = len(mq_all), len(cid_all)
        index = list(cid_all).index(current_cid)
        mod = n_mq % n_cid
        if n_mq <= n_cid:
            average = 1
        elif mod > 0 and index < mod:
            average = n_mq // n_cid + 1
        else:
            average = n_mq // n_cid
        start = index * average if (mod > 0 and index < mod) else index * average + mod
        count = min(average, n_mq - start)
        return [mq_all[(start + i) % n_mq] for i in range(max(count, 0))]


class AllocateAveragelyByCircle(AllocateStrategy):
    """Round robin: queue i goes to consumer i % len(cid)."""
    name = "AVG_BY_CIRCLE"

    def allocate(self, group, current_cid, mq_all, cid_all):
        _check(current_cid, mq_all, cid_all)
        if current_cid not in cid_all:
            log.info("[BUG] group %s: consumer id %s not in %s", group, current_cid, list(cid_all))
            return []
        index = list(cid_all).index(current_cid)
        n_cid = len(cid_all)
        return [mq for i, mq in enumerate(mq_all) if i >= index and i % n_cid == index]


class AllocateByConfig(AllocateStrategy):
    """A fixed list of queues, whatever the group looks like."""
    name = "CONFIG"

    def __init__(self, queues: Iterable[MessageQueue]):
        self.queues = list(queues)

    def allocate(self, group, current_cid, mq_all, cid_all):
        return list(self.queues)


class AllocateByMachineRoom(AllocateStrategy):
    """Queues of brokers named `room@name` whose room is in `consumer_idcs`, split in
    equal blocks, the remainder dealt one by one to the first consumers."""
    name = "MACHINE_ROOM"

    def __init__(self, consumer_idcs: Iterable[str]):
        self.consumer_idcs = set(consumer_idcs)

    def allocate(self, group, current_cid, mq_all, cid_all):
        cids = list(cid_all)
        if current_cid not in cids:
            return []
        index = cids.index(current_cid)
        pre = []
        for mq in mq_all:
            parts = mq.broker_name.split("@")
            # Java's String.split drops trailing empty strings: "a@" -> ["a"].
            while len(parts) > 1 and parts[-1] == "":
                parts.pop()
            if len(parts) == 2 and parts[0] in self.consumer_idcs:
                pre.append(mq)
        mod, rem = divmod(len(pre), len(cids))
        out = pre[mod * index:mod * index + mod]
        if rem > index:
            out.append(pre[index + mod * len(cids)])
        return out


def java_mq_string(mq: MessageQueue) -> str:
    """MessageQueue.toString() of the Java client (the consistent-hash key)."""
    return f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"


def md5_hash32(key: str) -> int:
    """ConsistentHashRouter's default hash: the first 4 MD5 bytes as an unsigned number."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


class AllocateConsistentHash(AllocateStrategy):
    """A hash ring of `virtual_node_cnt` virtual nodes per client id (`cid-i`)."""
    name = "CONSISTENT_HASH"

    def __init__(self, virtual_node_cnt: int = 10, hash_fn=md5_hash32):
        if virtual_node_cnt < 0:
            raise AllocateError(f"illegal virtualNodeCnt :{virtual_node_cnt}")
        self.virtual_node_cnt = virtual_node_cnt
        self.hash_fn = hash_fn

    def allocate(self, group, current_cid, mq_all, cid_all):
        _check(current_cid, mq_all, cid_all)
        if current_cid not in cid_all:
            log.info("[BUG] group %s: consumer id %s not in %s", group, current_cid, list(cid_all))
            return []
        ring: dict[int, str] = {}
        for cid in cid_all:
            existing = sum(1 for owner in ring.values() if owner == cid)
            for i in range(self.virtual_node_cnt):
                ring[self.hash_fn(f"{cid}-{i + existing}")] = cid
        if not ring:
            return []
        keys = sorted(ring)
        out = []
        for mq in mq_all:
            h = self.hash_fn(java_mq_string(mq))
            pos = bisect.bisect_left(keys, h)
            owner = ring[keys[pos] if pos < len(keys) else keys[0]]
            if owner == current_cid:
                out.append(mq)
        return out


STRATEGIES = {
    "AVG": AllocateAveragely,
    "AVG_BY_CIRCLE": AllocateAveragelyByCircle,
    "CONSISTENT_HASH": AllocateConsistentHash,
}


def strategy_by_name(name: str) -> AllocateStrategy:
    try:
        return STRATEGIES[name.upper()]()
    except KeyError:
        raise AllocateError(f"unknown allocate strategy {name!r}; "
                            f"known: {', '.join(STRATEGIES)} (CONFIG and MACHINE_ROOM need arguments)") from None
