"""LitePullConsumer (asyncio): the application polls; the client pulls in the background.

    async with LitePullConsumer("G", "127.0.0.1:9876") as c:
        c.subscribe("T", "*")                 # group rebalance, like the push consumer
        # or: c.assign([MessageQueue("T", "broker-a", 0)])   (no rebalance)
        async for msg in c:                   # or: msgs = await c.poll(timeout_s=1)
            ...

Position model (RocketMQ DefaultLitePullConsumer / aiokafka):

* the *pull offset* of a queue is where the background pull task reads next;
* the *consume offset* is the offset after the last message `poll()` returned
  for that queue; `commit()` stores consume offsets at the broker, and with
  `auto_commit` (default) they are stored every 5 s and at close;
* `seek(mq, offset)` moves both and drops what was buffered for the queue;
  `seek_to_begin` / `seek_to_end` use the broker's min / max offset;
  `offset_for_timestamp(mq, ts)` asks the broker; `committed(mq)` reads the
  stored offset back (-1 if none);
* `pause(mqs)` stops fetching and returning messages of those queues until
  `resume(mqs)`.

Messages are buffered per queue, at most `pull_threshold_for_queue` each;
`poll()` returns up to `max_poll_records` messages in queue-offset order per
queue.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable

from pocketmq.client.errors import (
    ClientStateError,
    InvalidArgumentError,
    MQClientError,
    SubscriptionError,
)
from pocketmq.client.instance import PullResult, acquire_consumer_instance, now_ms, pull_sys_flag
from pocketmq.client.message import MessageExt
from pocketmq.client.offset_store import RemoteOffsetStore
from pocketmq.client.producer import check_group, check_topic
from pocketmq.client.push_consumer import (
    CONSUME_FROM,
    RouteRetry,
    compute_pull_from_where,
    tag_filter,
)
from pocketmq.client.rebalance import AllocateAveragely, AllocateStrategy, plan_clustering
from pocketmq.protocol.bodies import (
    ConsumerData,
    MessageQueue,
    SubscriptionData,
    build_subscription,
)

log = logging.getLogger("pocketmq.client.lite")


class _QueueState:
    __slots__ = ("buffer", "consume_offset", "mq", "paused", "pull_offset", "seq", "task")

    def __init__(self, mq: MessageQueue):
        self.mq = mq
        self.pull_offset = -1
        self.consume_offset = -1
        self.buffer: deque = deque()
        self.paused = False
        self.task: asyncio.Task | None = None
        self.seq = 0          # bumped by seek: results of older pulls are dropped


class LitePullConsumer:
    def __init__(self, group: str, namesrv_addr: str, *, instance_name: str | None = None,
                 consume_from_where: str = "LAST_OFFSET", consume_timestamp_ms: int | None = None,
                 auto_commit: bool = True, auto_commit_interval_s: float = 5.0,
                 max_poll_records: int = 10, pull_batch_size: int = 32,
                 pull_threshold_for_queue: int = 1000, suspend_timeout_ms: int = 20000,
                 pull_timeout_ms: int = 30000, pull_error_delay_ms: int = 1000,
                 allocate_strategy: AllocateStrategy | None = None,
                 serialize_type: int | None = None):
        check_group(group)
        if consume_from_where not in CONSUME_FROM:
            raise InvalidArgumentError(f"consume_from_where must be one of {', '.join(CONSUME_FROM)}")
        if not 1 <= max_poll_records <= 10000:
            raise InvalidArgumentError("max_poll_records must be in [1, 10000]")
        if pull_timeout_ms <= suspend_timeout_ms:
            raise InvalidArgumentError("pull_timeout_ms must exceed suspend_timeout_ms")
        self.group = group
        self.namesrv_addr = namesrv_addr
        self.instance_name = instance_name
        self.consume_from_where = consume_from_where
        self.consume_timestamp_ms = consume_timestamp_ms if consume_timestamp_ms is not None else now_ms() - 30 * 60 * 1000
        self.auto_commit = auto_commit
        self.auto_commit_interval_s = auto_commit_interval_s
        self.max_poll_records = max_poll_records
        self.pull_batch_size = pull_batch_size
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.suspend_timeout_ms = suspend_timeout_ms
        self.pull_timeout_ms = pull_timeout_ms
        self.pull_error_delay_ms = pull_error_delay_ms
        self.allocate_strategy = allocate_strategy or AllocateAveragely()
        self.serialize_type = serialize_type
        self.subscriptions: dict[str, SubscriptionData] = {}
        self._filters: dict = {}
        self.assigned: dict[MessageQueue, _QueueState] = {}
        self._manual: bool | None = None          # True after assign(), False after subscribe()
        self._pending_assignment: set = set()
        self._arrived = asyncio.Event()
        self._rebalance_lock: asyncio.Lock | None = None
        self._commit_task: asyncio.Task | None = None
        self._rr = 0
        self._route_retry = RouteRetry()
        self.instance = None
        self.offset_store: RemoteOffsetStore | None = None
        self.state = "CREATED"

    # -- configuration ------------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*") -> None:
        check_topic(topic)
        if self._manual:
            raise ClientStateError("subscribe() and assign() cannot be mixed")
        self._manual = False
        self.subscriptions[topic] = build_subscription(topic, expression or "*", "TAG", now_ms())
        self._filters[topic] = tag_filter(self.subscriptions[topic])
        if self.state == "RUNNING":
            self.instance.rebalance_now()

    def unsubscribe(self, topic: str) -> None:
        self.subscriptions.pop(topic, None)
        self._filters.pop(topic, None)
        if self.state == "RUNNING":
            self.instance.rebalance_now()

    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        """Manual assignment (no rebalance, no group membership needed)."""
        if self._manual is False:
            raise ClientStateError("subscribe() and assign() cannot be mixed")
        self._manual = True
        mqs = set(mqs)
        for mq in mqs:
            if mq.topic not in self.subscriptions:
                self.subscriptions[mq.topic] = build_subscription(mq.topic, "*", "TAG", now_ms())
                self._filters[mq.topic] = None
        if self.state == "RUNNING":
            self._apply_assignment(mqs)
        else:
            self._pending_assignment = mqs

    def topics(self) -> set[str]:
        return set(self.subscriptions)

    def assignment(self) -> set[MessageQueue]:
        return set(self.assigned)

    def consumer_data(self) -> ConsumerData | None:
        if self.state != "RUNNING" or self._manual:
            return None
        return ConsumerData(self.group, "CONSUME_ACTIVELY", "CLUSTERING",
                            CONSUME_FROM[self.consume_from_where], list(self.subscriptions.values()))

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> LitePullConsumer:
        if self.state != "CREATED":
            raise ClientStateError(f"consumer is {self.state}")
        inst = await acquire_consumer_instance(self)
        self.instance = inst
        self.offset_store = RemoteOffsetStore(inst, self.group)
        self._rebalance_lock = asyncio.Lock()
        self.state = "RUNNING"
        if self.auto_commit:
            self._commit_task = asyncio.create_task(self._auto_commit_loop(), name=f"{self.group}:autocommit")
        for topic in self.subscriptions:
            try:
                await inst.update_route(topic)
            except MQClientError as e:
                log.info("%s: no route yet for %s: %s", self.group, topic, e)
        if self._manual:
            self._apply_assignment(self._pending_assignment)
        elif self.subscriptions:
            await inst.heartbeat_all()
            try:
                await self.rebalance()
            except MQClientError as e:
                log.warning("%s: first rebalance failed (will retry): %s", self.group, e)
        return self

    async def close(self) -> None:
        if self.state != "RUNNING":
            self.state = "CLOSED"
            return
        self.state = "CLOSING"
        if self._rebalance_lock is not None:
            # A rebalance in progress could add queues after their tasks were cancelled:
            # let it finish first (it sees CLOSING on its next turn).
            async with self._rebalance_lock:
                pass
        self._route_retry.cancel()
        if self._commit_task is not None:
            self._commit_task.cancel()
            await asyncio.gather(self._commit_task, return_exceptions=True)
        tasks = [st.task for st in self.assigned.values() if st.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.auto_commit:
            try:
                await self.commit()
            except MQClientError as e:
                log.warning("%s: final commit failed: %s", self.group, e)
        inst = self.instance
        inst.unregister_consumer(self.group)
        if not self._manual:
            try:
                await asyncio.wait_for(inst.unregister_client(consumer_group=self.group), 5)
            except (TimeoutError, MQClientError):
                pass
        await inst.release()
        self.state = "CLOSED"
        self._arrived.set()

    async def __aenter__(self) -> LitePullConsumer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _check_running(self) -> None:
        if self.state != "RUNNING":
            raise ClientStateError(f"consumer is {self.state}")

    # -- assignment -------------------------------------------------------------------------
    def _apply_assignment(self, mqs: set) -> None:
        for mq in [m for m in self.assigned if m not in mqs]:
            self._drop(mq)
        for mq in sorted(mqs - set(self.assigned)):
            self.assigned[mq] = _QueueState(mq)
            self._start_task(self.assigned[mq])

    def _drop(self, mq: MessageQueue) -> _QueueState | None:
        st = self.assigned.pop(mq, None)
        if st is not None and st.task is not None:
            st.task.cancel()
        return st

    async def rebalance(self) -> None:
        if self.state != "RUNNING" or self._manual:
            return
        async with self._rebalance_lock:
            inst = self.instance
            wanted: set = set()
            missing = False
            for topic in list(self.subscriptions):
                try:
                    mq_all = await inst.subscribe_queues(topic, refresh=topic not in inst.routes)
                    cids = await inst.consumer_id_list(self.group, topic) if mq_all else []
                except MQClientError as e:
                    log.warning("%s: rebalance of %s failed (retrying soon): %s", self.group, topic, e)
                    mq_all, cids = [], []
                if not mq_all or inst.client_id not in cids:
                    missing = True
                    if mq_all:
                        await inst.heartbeat_all()
                    wanted.update(m for m in self.assigned if m.topic == topic)
                    continue
                plan = plan_clustering(topic, self.group, inst.client_id, mq_all, cids, self.assigned,
                                       self.allocate_strategy)
                wanted.update(plan.allocated)
            removed = [m for m in self.assigned if m not in wanted]
            for mq in removed:
                st = self._drop(mq)
                if st is not None and st.consume_offset >= 0 and self.auto_commit:
                    self.offset_store.update(mq, st.consume_offset, increase_only=False)
            if removed and self.auto_commit:
                await self.offset_store.persist(removed)
            for mq in removed:
                self.offset_store.remove(mq)
            if self.state != "RUNNING":
                return          # close() began while we were asking the brokers: add nothing
            for mq in sorted(wanted - set(self.assigned)):
                self.assigned[mq] = _QueueState(mq)
                self._start_task(self.assigned[mq])
            self._route_retry.schedule(missing, inst.rebalance_now)

    # -- pulling ----------------------------------------------------------------------------
    def _start_task(self, st: _QueueState) -> None:
        if st.task is not None:
            st.task.cancel()
        st.task = asyncio.create_task(self._pull_loop(st),
                                      name=f"{self.group}:lite:{st.mq.topic}:{st.mq.broker_name}:{st.mq.queue_id}")

    async def _pull_loop(self, st: _QueueState) -> None:
        inst = self.instance
        mq = st.mq
        while st.pull_offset < 0 and self.state == "RUNNING":
            try:
                off = await compute_pull_from_where(inst, self.offset_store, self.group, mq,
                                                    self.consume_from_where, self.consume_timestamp_ms)
            except MQClientError as e:
                log.info("%s: start offset of %s unknown: %s", self.group, mq, e)
                await asyncio.sleep(self.pull_error_delay_ms / 1000)
                continue
            if st.pull_offset < 0:          # a seek may have happened meanwhile
                st.pull_offset = off
                st.consume_offset = off
        sub = self.subscriptions[mq.topic]
        accept = self._filters.get(mq.topic)
        timeout_s = self.pull_timeout_ms / 1000
        while self.state == "RUNNING":
            if st.paused or len(st.buffer) >= self.pull_threshold_for_queue:
                await asyncio.sleep(0.05)
                continue
            seq = st.seq
            offset = st.pull_offset
            try:
                addr = await inst.master_addr_refreshing(mq.broker_name, mq.topic)
                res = await inst.pull_message(addr, mq.broker_name, self.group, mq, offset,
                                              self.pull_batch_size, pull_sys_flag(False, True, True), 0,
                                              self.suspend_timeout_ms, sub.sub_string, sub.sub_version,
                                              timeout_s, raw=True)
            except MQClientError as e:
                log.info("%s: pull %s@%d failed: %s", self.group, mq, offset, e)
                if isinstance(e, SubscriptionError):
                    await inst.heartbeat_all()
                await asyncio.sleep(self.pull_error_delay_ms / 1000)
                continue
            if seq != st.seq:
                continue                    # seek() moved the queue while we were pulling
            if res.status == PullResult.FOUND:
                recs = res.records if accept is None else [r for r in res.records if accept(r)]
                bn = mq.broker_name
                from_raw = MessageExt.from_raw
                st.buffer.extend(from_raw(r, bn) for r in recs)
                if recs:
                    self._arrived.set()
                elif not st.buffer:
                    st.consume_offset = max(st.consume_offset, res.next_begin_offset)
                st.pull_offset = res.next_begin_offset
            elif res.status in (PullResult.NO_NEW_MSG, PullResult.NO_MATCHED_MSG):
                if not st.buffer and res.next_begin_offset > st.consume_offset:
                    st.consume_offset = res.next_begin_offset
                st.pull_offset = res.next_begin_offset
            else:
                log.warning("%s: offset %d of %s illegal, moving to %d", self.group, offset, mq,
                            res.next_begin_offset)
                st.pull_offset = res.next_begin_offset
                if not st.buffer:
                    st.consume_offset = res.next_begin_offset

    # -- polling ----------------------------------------------------------------------------
    def _take(self, max_records: int) -> list:
        out = []
        states = [st for st in self.assigned.values() if st.buffer and not st.paused]
        if not states:
            return out
        self._rr = (self._rr + 1) % len(states)
        for st in states[self._rr:] + states[:self._rr]:
            buf = st.buffer
            while buf and len(out) < max_records:
                m = buf.popleft()
                out.append(m)
                st.consume_offset = m.queue_offset + 1
            if not buf and st.pull_offset > st.consume_offset:
                st.consume_offset = st.pull_offset     # tag-filtered tail
            if len(out) >= max_records:
                break
        return out

    async def poll(self, timeout_s: float = 5.0, max_records: int | None = None) -> list[MessageExt]:
        """Up to max_records messages (default max_poll_records); [] after timeout_s."""
        self._check_running()
        n = max_records or self.max_poll_records
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            self._arrived.clear()
            out = self._take(n)
            if out:
                return out
            remaining = deadline - loop.time()
            if remaining <= 0 or self.state != "RUNNING":
                return []
            try:
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
            except TimeoutError:
                return []

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        while self.state == "RUNNING":
            for m in await self.poll(1.0):
                yield m

    # -- positions ------------------------------------------------------------------------
    def _state(self, mq: MessageQueue) -> _QueueState:
        st = self.assigned.get(mq)
        if st is None:
            raise InvalidArgumentError(f"{mq} is not assigned to this consumer")
        return st

    def seek(self, mq: MessageQueue, offset: int) -> None:
        self._check_running()
        if offset < 0:
            raise InvalidArgumentError("offset must be >= 0")
        st = self._state(mq)
        st.seq += 1
        st.buffer.clear()
        st.pull_offset = offset
        st.consume_offset = offset
        self._start_task(st)      # abandon a held pull at the old position

    async def reset_offsets(self, table: dict[MessageQueue, int]) -> None:
        """A broker-initiated reset (mqadmin resetOffsetByTime): the assigned queues of
        `table` seek to the given offsets, which are committed at once (what was polled
        before and not committed is not committed over them)."""
        if self.state != "RUNNING":
            return
        moved = {mq: off for mq, off in table.items() if mq in self.assigned}
        for mq, off in moved.items():
            self.seek(mq, off)
        if moved:
            await self.commit(moved)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        self.seek(mq, await self.instance.min_offset(mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        self.seek(mq, await self.instance.max_offset(mq))

    async def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        self._check_running()
        return await self.instance.search_offset(mq, timestamp_ms)

    async def committed(self, mq: MessageQueue) -> int:
        """The offset stored at the broker for this group (-1 if none)."""
        self._check_running()
        return await self.instance.query_consumer_offset(self.group, mq)

    def position(self, mq: MessageQueue) -> int:
        return self._state(mq).consume_offset

    async def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """Store consume offsets (or the given ones) at the broker and wait for it."""
        if self.instance is None:
            raise ClientStateError("consumer not started")
        if offsets is None:
            offsets = {mq: st.consume_offset for mq, st in self.assigned.items() if st.consume_offset >= 0}
        for mq, off in offsets.items():
            self.offset_store.update(mq, off)
        await self.offset_store.persist(list(offsets))

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        self._check_running()
        return await self.instance.subscribe_queues(topic, refresh=True)

    def pause(self, mqs: Iterable[MessageQueue]) -> None:
        for mq in mqs:
            self._state(mq).paused = True

    def resume(self, mqs: Iterable[MessageQueue]) -> None:
        for mq in mqs:
            self._state(mq).paused = False
        self._arrived.set()

    async def _auto_commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval_s)
            try:
                await self.commit()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("%s: auto commit failed: %s", self.group, e)
