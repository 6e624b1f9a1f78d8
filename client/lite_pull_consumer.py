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
from collections.abc import Iterable

from pocketmq.client.consumer_config import (
    CONSUME_FROM,
    LitePullConsumerConfig,
    apply_config,
    build_config,
)
from pocketmq.client.query import QueryMixin
from pocketmq.client.errors import (
    ClientStateError,
    InvalidArgumentError,
    MQClientError,
)
from pocketmq.client.fetcher import Fetcher, wake_fetcher
from pocketmq.client.instance import acquire_consumer_instance, now_ms
from pocketmq.client.message import MessageExt
from pocketmq.client.offset_store import RemoteOffsetStore
from pocketmq.client.producer import check_group, check_topic
from pocketmq.client.rebalancer import Rebalancer, compute_pull_from_where
from pocketmq.client.selector import MessageSelector
from pocketmq.client.subscription_state import QueueState, SubscriptionState
from pocketmq.protocol.bodies import ConsumerData, MessageQueue

log = logging.getLogger("pocketmq.client.lite")



class LitePullConsumer(QueryMixin):
    """poll/seek/commit over the shared consumer core (SubscriptionState, Fetcher,
    Rebalancer). Options: LitePullConsumerConfig, given as `config=` and/or as keyword
    arguments (which override the config's values)."""

    def __init__(self, group: str, namesrv_addr: str, *, config: LitePullConsumerConfig | None = None,
                 **options):
        check_group(group)
        cfg = build_config(LitePullConsumerConfig, config, options)
        apply_config(self, cfg, now_ms())
        self.group = group
        self.namesrv_addr = namesrv_addr
        self.subscription_state = SubscriptionState()
        self.stats = {"pulls": 0}
        self.fetcher = Fetcher(group, self.subscription_state, self, pull_batch_size=self.pull_batch_size,
                               suspend_timeout_ms=self.suspend_timeout_ms, pull_timeout_ms=self.pull_timeout_ms,
                               pull_error_delay_ms=self.pull_error_delay_ms, stats=self.stats, task_prefix="lite",
                               logger=log)
        # No hand-over delay: a lite consumer commits what poll() returned as it goes.
        self.rebalancer = Rebalancer(group, self.subscription_state, message_model="CLUSTERING",
                                     allocate_strategy=self.allocate_strategy, handover_delay_ms=0,
                                     running=lambda: self.state == "RUNNING" and not self.subscription_state.manual,
                                     add_queues=self._add_queues, remove_queues=self._remove_queues)
        self._pending_assignment: set = set()
        self._arrived = asyncio.Event()
        self._commit_task: asyncio.Task | None = None
        self._rr = 0
        self.instance = None
        self.offset_store: RemoteOffsetStore | None = None
        self.state = "CREATED"

    # -- configuration ------------------------------------------------------------------------
    @property
    def subscriptions(self) -> dict:
        return self.subscription_state.subscriptions

    @property
    def assigned(self) -> dict[MessageQueue, QueueState]:
        return self.subscription_state.assignment

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        check_topic(topic)
        ss = self.subscription_state
        if ss.manual:
            raise ClientStateError("subscribe() and assign() cannot be mixed")
        ss.manual = False
        ss.subscribe(topic, expression, now_ms())
        if self.state == "RUNNING":
            self.instance.rebalance_now()

    def unsubscribe(self, topic: str) -> None:
        self.subscription_state.unsubscribe(topic)
        if self.state == "RUNNING":
            self.instance.rebalance_now()

    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        """Manual assignment (no rebalance, no group membership needed)."""
        ss = self.subscription_state
        if ss.manual is False:
            raise ClientStateError("subscribe() and assign() cannot be mixed")
        ss.manual = True
        mqs = set(mqs)
        for mq in mqs:
            if mq.topic not in ss.subscriptions:
                ss.subscribe(mq.topic, "*", now_ms(), with_filter=False)
        if self.state == "RUNNING":
            self._apply_assignment(mqs)
        else:
            self._pending_assignment = mqs

    def topics(self) -> set[str]:
        return self.subscription_state.topics()

    def assignment(self) -> set[MessageQueue]:
        return set(self.subscription_state.assignment)

    def masters_changed(self, lost, back) -> None:
        """ClientInstance: groups whose master left or came back. Nothing to do here: pulls
        and offsets find the member to use at each request, and a lite consumer holds no
        queue locks."""

    def consumer_data(self) -> ConsumerData | None:
        if self.state != "RUNNING" or self.subscription_state.manual:
            return None
        return ConsumerData(self.group, "CONSUME_ACTIVELY", "CLUSTERING",
                            CONSUME_FROM[self.consume_from_where], list(self.subscriptions.values()))

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> LitePullConsumer:
        if self.state != "CREATED":
            raise ClientStateError(f"consumer is {self.state}")
        inst = await acquire_consumer_instance(self)
        self.instance = inst
        self.fetcher.instance = inst
        self.fetcher.find_addr = inst.subscribe_addr_refreshing     # master or slave (client/replica.py)
        self.fetcher.request_route_refresh = inst.request_route_refresh     # failover (client/failover.py)
        self.rebalancer.instance = inst
        self.offset_store = RemoteOffsetStore(inst, self.group, find_addr=inst.admin_addr_refreshing)
        self.state = "RUNNING"
        if self.auto_commit:
            self._commit_task = asyncio.create_task(self._auto_commit_loop(), name=f"{self.group}:autocommit")
        for topic in self.subscriptions:
            try:
                await inst.update_route(topic)
            except MQClientError as e:
                log.info("%s: no route yet for %s: %s", self.group, topic, e)
        if self.subscription_state.manual:
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
        # A rebalance in progress could add queues after their tasks were cancelled:
        # let it finish first (it sees CLOSING on its next turn).
        async with self.rebalancer.lock:
            pass
        self.rebalancer.cancel()
        if self._commit_task is not None:
            self._commit_task.cancel()
            await asyncio.gather(self._commit_task, return_exceptions=True)
        await self.fetcher.stop_all()
        if self.auto_commit:
            try:
                await self.commit()
            except MQClientError as e:
                log.warning("%s: final commit failed: %s", self.group, e)
        inst = self.instance
        inst.unregister_consumer(self.group)
        if not self.subscription_state.manual:
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
        ss = self.subscription_state
        for mq in [m for m in ss.assignment if m not in mqs]:
            self._drop(mq)
        for mq in sorted(mqs - set(ss.assignment)):
            self.fetcher.start(ss.add(mq))

    def _drop(self, mq: MessageQueue) -> QueueState | None:
        st = self.subscription_state.remove(mq)
        if st is not None:
            self.fetcher.cancel(st)
        return st

    async def rebalance(self) -> None:
        await self.rebalancer.rebalance()

    async def _remove_queues(self, mqs) -> None:
        """Rebalancer hook: stop the queues and commit what poll() returned of them."""
        removed = []
        for mq in mqs:
            st = self._drop(mq)
            if st is None:
                continue
            removed.append(mq)
            if st.consume_offset >= 0 and self.auto_commit:
                self.offset_store.update(mq, st.consume_offset, increase_only=False)
        if removed and self.auto_commit:
            await self.offset_store.persist(removed)
        for mq in removed:
            self.offset_store.remove(mq)

    async def _add_queues(self, mqs) -> None:
        """Rebalancer hook: the fetcher finds each queue's start offset itself."""
        if self.state != "RUNNING":
            return          # close() began while we were asking the brokers: add nothing
        ss = self.subscription_state
        for mq in sorted(mqs):
            if mq not in ss.assignment:
                self.fetcher.start(ss.add(mq))

    # -- pulling (Fetcher hooks) ---------------------------------------------------------------
    def may_fetch(self, st: QueueState) -> bool:
        return not st.paused and len(st.buffer) < self.pull_threshold_for_queue

    def pull_commit_offset(self, st: QueueState) -> int:
        return -1           # commits go through commit() / auto commit, not with pulls

    async def start_offset(self, st: QueueState) -> int:
        return await compute_pull_from_where(self.instance, self.offset_store, st.mq,
                                             self.consume_from_where, self.consume_timestamp_ms)

    def on_found(self, st: QueueState, msgs: list, next_begin_offset: int) -> None:
        st.buffer.extend(msgs)
        if msgs:
            self._arrived.set()
        elif not st.buffer:
            st.consume_offset = max(st.consume_offset, next_begin_offset)

    def on_no_new(self, st: QueueState, next_begin_offset: int) -> None:
        if not st.buffer and next_begin_offset > st.consume_offset:
            st.consume_offset = next_begin_offset

    async def on_offset_moved(self, st: QueueState, res, old_offset: int) -> None:
        if not st.buffer:
            st.consume_offset = res.next_begin_offset

    # -- polling ----------------------------------------------------------------------------
    def _take(self, max_records: int) -> list:
        out = []
        states = [st for st in self.subscription_state.assignment.values() if st.buffer and not st.paused]
        if not states:
            return out
        self._rr = (self._rr + 1) % len(states)
        for st in states[self._rr:] + states[:self._rr]:
            buf = st.buffer
            want = max_records - len(out)
            if want >= len(buf):            # the whole buffer: no per-message pop
                out.extend(buf)
                buf.clear()
            else:
                popleft = buf.popleft
                out.extend([popleft() for _ in range(want)])
            # messages of a queue come in queue-offset order: the last one taken sets the offset
            st.consume_offset = out[-1].queue_offset + 1
            if not buf and st.pull_offset > st.consume_offset:
                st.consume_offset = st.pull_offset     # tag-filtered tail
            if st.room is not None and self.may_fetch(st):
                wake_fetcher(st)        # its pull waits for room: there is some now
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
        """`async for msg in consumer`: the messages poll() returns, one at a time, until the
        consumer is closed (leaving `async with`, or close() from another task, ends the loop
        once the batch in hand is delivered: poll() already counted it as consumed)."""
        if self.state == "CREATED":
            raise ClientStateError("consumer not started: iterate inside `async with consumer:` "
                                   "or after `await consumer.start()`")
        return self._iterate()

    async def _iterate(self):
        while self.state == "RUNNING":
            for m in await self.poll(1.0):
                yield m

    # -- positions ------------------------------------------------------------------------
    def _state(self, mq: MessageQueue) -> QueueState:
        st = self.subscription_state.get(mq)
        if st is None:
            raise InvalidArgumentError(f"{mq} is not assigned to this consumer")
        return st

    def seek(self, mq: MessageQueue, offset: int) -> None:
        self._check_running()
        if offset < 0:
            raise InvalidArgumentError("offset must be >= 0")
        st = self._state(mq)
        st.seek(offset)
        self.fetcher.start(st)      # abandon a held pull at the old position

    async def reset_offsets(self, table: dict[MessageQueue, int]) -> None:
        """A broker-initiated reset (mqadmin resetOffsetByTime): the assigned queues of
        `table` seek to the given offsets, which are committed at once (what was polled
        before and not committed is not committed over them)."""
        if self.state != "RUNNING":
            return
        moved = {mq: off for mq, off in table.items() if mq in self.subscription_state.assignment}
        for mq, off in moved.items():
            self.seek(mq, off)
        if moved:
            await self.commit(moved)

    async def _admin_addr(self, mq: MessageQueue) -> str:
        """Where queue bounds and offsets are read: the master, else a slave (client/replica.py)."""
        addr, _ = await self.instance.admin_addr_refreshing(mq.broker_name, mq.topic)
        return addr

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        self.seek(mq, await self.instance.api.min_offset(await self._admin_addr(mq), mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        self.seek(mq, await self.instance.api.max_offset(await self._admin_addr(mq), mq))

    async def offset_for_timestamp(self, mq: MessageQueue, timestamp_ms: int) -> int:
        self._check_running()
        return await self.instance.api.search_offset(await self._admin_addr(mq), mq, timestamp_ms)

    async def committed(self, mq: MessageQueue) -> int:
        """The offset stored at the broker for this group (-1 if none)."""
        self._check_running()
        return await self.instance.api.query_consumer_offset(await self._admin_addr(mq), self.group, mq)

    def position(self, mq: MessageQueue) -> int:
        return self._state(mq).consume_offset

    async def commit(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """Store consume offsets (or the given ones) at the broker and wait for it."""
        if self.instance is None:
            raise ClientStateError("consumer not started")
        store = self.offset_store
        if offsets is None:         # the consume offsets of the assigned queues (no dict built)
            mqs = []
            for mq, st in self.subscription_state.assignment.items():
                off = st.consume_offset
                if off >= 0:
                    store.update(mq, off)
                    mqs.append(mq)
        else:
            for mq, off in offsets.items():
                store.update(mq, off)
            mqs = list(offsets)
        await store.persist(mqs)

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        self._check_running()
        return await self.instance.subscribe_queues(topic, refresh=True)

    def pause(self, mqs: Iterable[MessageQueue]) -> None:
        for mq in mqs:
            self._state(mq).paused = True

    def resume(self, mqs: Iterable[MessageQueue]) -> None:
        for mq in mqs:
            st = self._state(mq)
            st.paused = False
            wake_fetcher(st)
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
