"""Consumer offset stores.

RemoteOffsetStore (clustering): the broker keeps the group's offsets
(QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET); the client keeps the
latest local value per queue and pushes the changed ones every 5 s, when a
queue is removed, and at shutdown. The stored value is the **next** offset to
consume. Offsets go to the group's master, or to a slave while the route has no
master (`find_addr`, client/replica.py): a 4.x slave takes them, so progress made
while the master is down is kept. An offset that landed on a slave stays dirty
until it lands on the master: a master coming back has its old offsets, and its
slaves copy them over theirs (Java re-sends every offset every 5 s, so it gets there
too; this store sends only changed ones, and those).

LocalOffsetStore (broadcasting): the same table persisted in a JSON file
(tmp -> fsync -> replace), since broadcasting offsets are per client.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os

from pocketmq.client.errors import MQClientError
from pocketmq.client.log_throttle import FailureLog
from pocketmq.client.replica import MASTER_ID
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.remoting.clock import monotonic_ms

log = logging.getLogger("pocketmq.client.offset")


class OffsetTable:
    """Pure part: offsets per queue plus a dirty set."""

    def __init__(self):
        self.offsets: dict[MessageQueue, int] = {}
        self.dirty: set[MessageQueue] = set()

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> bool:
        if offset < 0:
            return False
        old = self.offsets.get(mq)
        if old is not None and (old == offset or (increase_only and offset < old)):
            return False
        self.offsets[mq] = offset
        self.dirty.add(mq)
        return True

    def read(self, mq: MessageQueue) -> int:
        return self.offsets.get(mq, -1)

    def remove(self, mq: MessageQueue) -> None:
        self.offsets.pop(mq, None)
        self.dirty.discard(mq)

    def take_one(self, mq: MessageQueue) -> int | None:
        """take_dirty([mq]) without the dict: mq's offset if it was dirty (now clean), else None."""
        dirty = self.dirty
        if mq not in dirty:
            return None
        off = self.offsets.get(mq)
        if off is None:
            return None
        dirty.discard(mq)
        return off

    def take_dirty(self, mqs=None) -> dict[MessageQueue, int]:
        chosen = self.dirty if mqs is None else self.dirty.intersection(mqs)
        out = {mq: self.offsets[mq] for mq in chosen if mq in self.offsets}
        self.dirty.difference_update(out)
        return out


class RemoteOffsetStore:
    def __init__(self, instance, group: str, clock=monotonic_ms, *, find_addr=None):
        self.instance = instance
        self.group = group
        # (broker_name, topic) -> (addr, broker_id) of the member that takes offsets: the
        # consumers give their instance's admin_addr_refreshing (the master, else a slave);
        # None: the master only (instance.master_addr_refreshing).
        self.find_addr = find_addr or self._master_addr
        self.table = OffsetTable()
        # while a broker is down every commit round fails for each of its queues: log the
        # first failure, a summary now and then, and the recovery (client/log_throttle.py)
        self.clock = clock
        self.commit_failures = FailureLog("offset commit", via="to")

    def _log(self, line) -> None:
        if line is not None:
            log.log(line[0], "%s: %s", self.group, line[1])

    async def _master_addr(self, broker_name: str, topic: str) -> tuple[str, int]:
        return await self.instance.master_addr_refreshing(broker_name, topic), MASTER_ID

    async def load(self) -> None:
        return None

    def update(self, mq: MessageQueue, offset: int, increase_only: bool = False) -> None:
        self.table.update(mq, offset, increase_only)

    def read_memory(self, mq: MessageQueue) -> int:
        return self.table.read(mq)

    async def read_store(self, mq: MessageQueue) -> int:
        """Broker's stored offset (-1 when none), also cached locally."""
        addr, _ = await self.find_addr(mq.broker_name, mq.topic)
        off = await self.instance.api.query_consumer_offset(addr, self.group, mq)
        if off >= 0:
            self.table.offsets[mq] = off
        return off

    async def persist(self, mqs=None, *, oneway: bool = False) -> int:
        """Push changed offsets (of `mqs`, or all). Failed ones stay dirty. Returns how many went."""
        if type(mqs) is list and len(mqs) == 1:
            # a lite consumer's commit of its one queue: no dict, no task
            mq = mqs[0]
            off = self.table.take_one(mq)
            return 0 if off is None else await self._persist_one(mq, off, oneway)
        todo = self.table.take_dirty(mqs)
        if len(todo) == 1:
            return await self._persist_one(*next(iter(todo.items())), oneway)
        if not todo:
            return 0
        return sum(await asyncio.gather(*(self._persist_one(mq, off, oneway) for mq, off in todo.items())))

    async def _persist_one(self, mq: MessageQueue, off: int, oneway: bool) -> int:
        """One queue's UPDATE_CONSUMER_OFFSET: 1 when it went; on failure 0, logged, and the
        offset stays dirty (unless a newer one replaced it meanwhile)."""
        inst = self.instance
        bn = mq.broker_name
        failures = self.commit_failures
        try:
            addr, broker_id = await self.find_addr(bn, mq.topic)
            await inst.api.update_consumer_offset(addr, self.group, mq, off, oneway=oneway)
        except MQClientError as e:
            self._log(failures.failed(bn, _item(mq), f"{e} (offset {off})", type(e).__name__, self.clock()))
            if self.table.offsets.get(mq) == off:
                self.table.dirty.add(mq)
            return 0
        if broker_id != MASTER_ID and self.table.offsets.get(mq) == off:
            self.table.dirty.add(mq)        # on a slave: again until the master has it
        if failures.failing(bn):        # (succeeded() is None without an episode)
            self._log(failures.succeeded(bn, _item(mq), self.clock()))
        return 1

    def remove(self, mq: MessageQueue) -> None:
        self.table.remove(mq)
        self._log(self.commit_failures.forget(mq.broker_name, _item(mq), self.clock()))


def _item(mq: MessageQueue) -> str:
    return f"{mq.topic}:{mq.queue_id}"


def _mq_key(mq: MessageQueue) -> str:
    return f"{mq.topic}@{mq.broker_name}@{mq.queue_id}"


class LocalOffsetStore(RemoteOffsetStore):
    """Broadcasting: offsets in `<dir>/<clientId>/<group>/offsets.json`."""

    def __init__(self, instance, group: str, directory: str, instance_name: str | None = None):
        super().__init__(instance, group)
        # The path must survive a restart: the clientId carries the process id by default,
        # so use ip@<instance name, or "DEFAULT" as Java's broadcasting consumers do>.
        ip = instance.client_id.split("@", 1)[0]
        stable_cid = f"{ip}@{instance_name or 'DEFAULT'}"
        safe_cid = stable_cid.replace(":", "_").replace("/", "_")
        self.path = os.path.join(directory, safe_cid, group, "offsets.json")

    async def load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                d = json.loads(f.read())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            log.warning("cannot read %s: %s", self.path, e)
            return
        for key, off in (d.get("offsetTable") or {}).items():
            topic, broker, qid = key.rsplit("@", 2)
            self.table.offsets[MessageQueue(topic, broker, int(qid))] = int(off)

    async def read_store(self, mq: MessageQueue) -> int:
        return self.table.read(mq)

    async def persist(self, mqs=None, *, oneway: bool = False) -> int:
        todo = self.table.take_dirty(mqs)
        if not todo:
            return 0
        data = {"offsetTable": {_mq_key(mq): off for mq, off in sorted(self.table.offsets.items())}}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps(data, sort_keys=True).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return len(todo)
