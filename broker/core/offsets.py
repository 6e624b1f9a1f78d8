"""Consumer offsets (pure): table `topic@group` -> {queueId: next offset to consume}.

Persisted as consumerOffset.json in RocketMQ's shape, but as standard JSON
(quoted queue ids); the loader also reads Java's fastjson form with unquoted
numeric keys.
"""
from __future__ import annotations

import json

from pocketmq.protocol.bodies import loads


def reset_table(committed: dict[int, int], by_time: dict[int, int], force: bool) -> dict[int, int]:
    """The offsets a reset moves a group to (Java Broker2Client.resetOffset's rule): each
    queue goes to its offset at the requested time when forced, or when that is behind
    its committed offset (a reset without force only rewinds). `committed` lacks the
    queues the group never committed; those move to the time's offset."""
    out = {}
    for qid, target in by_time.items():
        target = max(0, target)
        cur = committed.get(qid, -1)
        out[qid] = target if force or cur < 0 or target < cur else cur
    return out


class ConsumerOffsetManager:
    def __init__(self):
        self.table: dict[str, dict[int, int]] = {}
        self.dirty = False

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}@{group}"

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.table.setdefault(self.key(topic, group), {})[queue_id] = offset
        self.dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int:
        return self.table.get(self.key(topic, group), {}).get(queue_id, -1)

    def groups_of_topic(self, topic: str) -> set[str]:
        out = set()
        for k in self.table:
            t, _, g = k.partition("@")
            if t == topic:
                out.add(g)
        return out

    def topics_of_group(self, group: str) -> set[str]:
        out = set()
        for k in self.table:
            t, _, g = k.rpartition("@")
            if g == group:
                out.add(t)
        return out

    def clone_group(self, src: str, dest: str, topic: str) -> bool:
        """CLONE_GROUP_OFFSET: dest's offsets on `topic` become a copy of src's (False when
        src committed none there)."""
        table = self.table.get(self.key(topic, src))
        if not table:
            return False
        self.table[self.key(topic, dest)] = dict(table)
        self.dirty = True
        return True

    def remove_topic(self, topic: str) -> None:
        for k in [k for k in self.table if k.partition("@")[0] == topic]:
            del self.table[k]
            self.dirty = True

    def remove_group(self, group: str) -> None:
        """DELETE_SUBSCRIPTIONGROUP with removeOffset: the group's offsets on every topic."""
        for k in [k for k in self.table if k.rpartition("@")[2] == group]:
            del self.table[k]
            self.dirty = True

    def encode(self) -> bytes:
        return json.dumps({"offsetTable": {k: {str(q): o for q, o in sorted(v.items())}
                                           for k, v in sorted(self.table.items())}}, indent=1).encode()

    def load(self, data: bytes) -> None:
        d = loads(data)
        table = d.get("offsetTable") or {} if isinstance(d, dict) else {}
        self.table = {str(k): {int(q): int(o) for q, o in v.items()} for k, v in table.items()}
