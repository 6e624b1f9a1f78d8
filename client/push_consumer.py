"""PushConsumer (asyncio): clustering or broadcasting, concurrent consumption.

    async def on_message(msg):            # or a plain function
        ...                               # raise / return RECONSUME_LATER to retry later

    consumer = PushConsumer("CG", "127.0.0.1:9876", listener=on_message)
    consumer.subscribe("T", "TagA || TagB")
    async with consumer:
        await stop_event.wait()           # close() drains, commits, unregisters

The flow follows RocketMQ's push consumer (see docs/client.md):

* rebalance every 20 s and at once on NOTIFY_CONSUMER_IDS_CHANGED: sorted
  queues and sorted consumer ids through the allocation strategy; dropped
  queues stop being consumed, wait for their running listeners, commit, and
  are removed; added queues start at the broker's offset (consumeFromWhere
  only when the group has none) after a short hand-over delay when other
  consumers exist, so the previous owner's commit lands first;
* one pull loop per queue with long polling (suspend 15 s, timeout 30 s) and
  flow control (ProcessQueue thresholds, delay 50 ms);
* a bounded pool of workers runs the listener; the commit point of a queue is
  its smallest in-flight offset; failures go back to the broker
  (CONSUMER_SEND_MSG_BACK) or, if that fails, are retried locally after 5 s;
* offsets are pushed every 5 s, at queue removal and at shutdown.

`close()` / `drain(timeout)`: stop pulling, let every cached message be
consumed, commit, then unregister, so a restarted consumer of the group
receives nothing twice.
"""
from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from enum import Enum

from pocketmq.common.constants import is_retry_topic, retry_topic
from pocketmq.client.errors import (
    ClientStateError,
    InvalidArgumentError,
    MQClientError,
    SubscriptionError,
)
from pocketmq.client.instance import PullResult, acquire_consumer_instance, mono_ms, now_ms, pull_sys_flag
from pocketmq.client.message import MessageExt
from pocketmq.client.offset_store import LocalOffsetStore, RemoteOffsetStore
from pocketmq.client.process_queue import FLOW_CONTROL_DELAY_MS, FlowLimits, ProcessQueue
from pocketmq.client.producer import check_group, check_topic
from pocketmq.client.rebalance import (
    AllocateAveragely,
    AllocateStrategy,
    plan_broadcasting,
    plan_clustering,
)
from pocketmq.protocol.message import property_value
from pocketmq.protocol.bodies import (
    ConsumerData,
    MessageQueue,
    SubscriptionData,
    build_subscription,
)

# The consumer whose worker runs the current code (a worker task, and the executor thread
# running a plain listener for it): a listener that calls close()/drain() of its own
# consumer must not wait for itself.
_IN_WORKER: contextvars.ContextVar[PushConsumer | None] = contextvars.ContextVar("pocketmq_in_worker",
                                                                                  default=None)

log = logging.getLogger("pocketmq.client.consumer")



class ConsumeStatus(Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


CONSUME_SUCCESS = ConsumeStatus.CONSUME_SUCCESS
RECONSUME_LATER = ConsumeStatus.RECONSUME_LATER

CONSUME_FROM = {
    "LAST_OFFSET": "CONSUME_FROM_LAST_OFFSET",
    "FIRST_OFFSET": "CONSUME_FROM_FIRST_OFFSET",
    "TIMESTAMP": "CONSUME_FROM_TIMESTAMP",
}


def tag_filter(sub: SubscriptionData):
    """Client-side tag check after the broker's hash-code filter (None = everything), on the
    tuples of protocol.message.decode_records_raw (TAGS read from the properties text)."""
    if sub.is_all or sub.expression_type != "TAG":
        return None
    tags = frozenset(sub.tags_set)
    return lambda rec: property_value(rec[4], "TAGS") in tags


class WorkQueue:
    """FIFO of (mq, pq, msgs) items for the listener workers: a deque plus the futures
    of idle workers. Cheaper per item than asyncio.Queue; a worker that takes an item
    while more are waiting wakes one idle worker, so slow (awaiting) listeners still
    run up to consume_concurrency at a time while a fast one needs no task switches."""

    __slots__ = ("idle", "items")

    def __init__(self):
        self.items: deque = deque()
        self.idle: deque = deque()

    def put_nowait(self, item) -> None:
        self.items.append(item)
        self.wake_one()

    def extend(self, items) -> None:
        self.items.extend(items)
        self.wake_one()

    def wake_one(self) -> None:
        idle = self.idle
        while idle:
            fut = idle.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def wait(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.idle.append(fut)
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()

    def qsize(self) -> int:
        return len(self.items)


class RouteRetry:
    """A topic without a route yet (just auto-created, or %RETRY%<group> before the broker
    registered it) is looked up again after 1, 2, 4, 8, 16 s instead of waiting for the
    20 s rebalance timer."""

    def __init__(self, first_s: float = 1.0, max_s: float = 16.0):
        self.first_s = first_s
        self.max_s = max_s
        self.next_s = first_s
        self.handle = None

    def schedule(self, missing: bool, fn) -> None:
        if not missing:
            self.next_s = self.first_s
            return
        if self.next_s > self.max_s or (self.handle is not None and not self.handle.cancelled()
                                        and self.handle.when() > asyncio.get_running_loop().time()):
            return
        self.handle = asyncio.get_running_loop().call_later(self.next_s, fn)
        self.next_s *= 2

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


async def compute_pull_from_where(instance, offset_store, group: str, mq: MessageQueue,
                                  consume_from_where: str, consume_timestamp_ms: int) -> int:
    """Java RebalancePushImpl.computePullFromWhere: the broker's offset if the group has
    one, else LAST (max offset; 0 for retry topics) / FIRST (0) / TIMESTAMP (search)."""
    last = await offset_store.read_store(mq)
    if last >= 0:
        return last
    if is_retry_topic(mq.topic):
        return 0
    if consume_from_where == "FIRST_OFFSET":
        return 0
    if consume_from_where == "TIMESTAMP":
        return await instance.search_offset(mq, consume_timestamp_ms)
    return await instance.max_offset(mq)


class PushConsumer:
    def __init__(self, group: str, namesrv_addr: str, *, listener: Callable | None = None,
                 batch_listener: Callable | None = None, consume_batch_size: int = 1,
                 message_model: str = "CLUSTERING", consume_from_where: str = "LAST_OFFSET",
                 consume_timestamp_ms: int | None = None,
                 allocate_strategy: AllocateStrategy | None = None, consume_concurrency: int = 20,
                 pull_batch_size: int = 128, flow_limits: FlowLimits | None = None,
                 instance_name: str | None = None, max_reconsume_times: int = 16,
                 suspend_timeout_ms: int = 15000, pull_timeout_ms: int = 30000,
                 persist_interval_s: float = 5.0, pull_error_delay_ms: int = 1000,
                 handover_delay_ms: int = 1000, sync_listener_in_thread: bool = True,
                 broadcast_offset_dir: str | None = None, close_timeout_s: float = 30.0,
                 serialize_type: int | None = None):
        check_group(group)
        if listener is not None and batch_listener is not None:
            raise InvalidArgumentError("give listener or batch_listener, not both")
        if message_model not in ("CLUSTERING", "BROADCASTING"):
            raise InvalidArgumentError("message_model must be CLUSTERING or BROADCASTING")
        if consume_from_where not in CONSUME_FROM:
            raise InvalidArgumentError(f"consume_from_where must be one of {', '.join(CONSUME_FROM)}")
        if not 1 <= consume_concurrency <= 1000:
            raise InvalidArgumentError("consume_concurrency must be in [1, 1000]")
        if not 1 <= pull_batch_size <= 1024:
            raise InvalidArgumentError("pull_batch_size must be in [1, 1024]")
        if not 1 <= consume_batch_size <= 1024:
            raise InvalidArgumentError("consume_batch_size must be in [1, 1024]")
        if pull_timeout_ms <= suspend_timeout_ms:
            raise InvalidArgumentError("pull_timeout_ms must exceed suspend_timeout_ms")
        self.group = group
        self.namesrv_addr = namesrv_addr
        self.listener = listener
        self.batch_listener = batch_listener
        self.consume_batch_size = consume_batch_size if batch_listener else 1
        self.message_model = message_model
        self.consume_from_where = consume_from_where
        self.consume_timestamp_ms = consume_timestamp_ms if consume_timestamp_ms is not None else now_ms() - 30 * 60 * 1000
        self.allocate_strategy = allocate_strategy or AllocateAveragely()
        self.consume_concurrency = consume_concurrency
        self.pull_batch_size = pull_batch_size
        self.flow_limits = flow_limits or FlowLimits()
        self.instance_name = instance_name
        self.max_reconsume_times = max_reconsume_times
        self.suspend_timeout_ms = suspend_timeout_ms
        self.pull_timeout_ms = pull_timeout_ms
        self.persist_interval_s = persist_interval_s
        self.pull_error_delay_ms = pull_error_delay_ms
        self.handover_delay_ms = handover_delay_ms
        self.sync_listener_in_thread = sync_listener_in_thread
        self.broadcast_offset_dir = broadcast_offset_dir or os.path.join(
            os.path.expanduser("~"), ".pocketmq_offsets")
        self.close_timeout_s = close_timeout_s
        self.serialize_type = serialize_type

        self.subscriptions: dict[str, SubscriptionData] = {}
        self._filters: dict[str, object] = {}
        self.pqs: dict[MessageQueue, ProcessQueue] = {}
        self._pull_tasks: dict[MessageQueue, asyncio.Task] = {}
        self._work: WorkQueue | None = None
        self._workers: list[asyncio.Task] = []
        self._persist_task: asyncio.Task | None = None
        self._retry_handles: set = set()
        self._route_retry = RouteRetry()
        self._rebalance_lock: asyncio.Lock | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._listener_is_async = False
        self.instance = None
        self.offset_store = None
        self.state = "CREATED"      # CREATED -> RUNNING -> DRAINING -> CLOSED
        self._drain_task: asyncio.Task | None = None
        self.stats = {"consumed": 0, "failed": 0, "sent_back": 0, "pulls": 0}

    # -- configuration ---------------------------------------------------------------------
    def subscribe(self, topic: str, expression: str = "*") -> None:
        check_topic(topic)
        if self.state != "CREATED":
            raise ClientStateError("subscribe before start()")
        self.subscriptions[topic] = build_subscription(topic, expression or "*", "TAG", now_ms())

    def register_listener(self, listener: Callable) -> None:
        self.listener = listener

    def topics(self) -> set[str]:
        return set(self.subscriptions)

    @property
    def client_id(self) -> str:
        return self.instance.client_id if self.instance else ""

    def consumer_data(self) -> ConsumerData | None:
        if self.state not in ("RUNNING", "DRAINING"):
            return None
        return ConsumerData(self.group, "CONSUME_PASSIVELY", self.message_model,
                            CONSUME_FROM[self.consume_from_where], list(self.subscriptions.values()))

    def running_info(self) -> dict:
        return {"properties": {"consumerGroup": self.group, "messageModel": self.message_model,
                               "consumeType": "CONSUME_PASSIVELY", "language": "PYTHON"},
                "mqTable": {f"{mq.topic}@{mq.broker_name}@{mq.queue_id}": {
                    "cachedMsgCount": pq.msg_count, "commitOffset": pq.commit_offset()}
                    for mq, pq in self.pqs.items()},
                "stats": dict(self.stats)}

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> PushConsumer:
        if self.state != "CREATED":
            raise ClientStateError(f"consumer is {self.state}")
        fn = self.listener or self.batch_listener
        if fn is None:
            raise ClientStateError("no listener registered")
        if not self.subscriptions:
            raise ClientStateError("no subscription")
        self._listener_is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None))
        if self.message_model == "CLUSTERING":
            self.subscriptions.setdefault(retry_topic(self.group),
                                          build_subscription(retry_topic(self.group), "*", "TAG", now_ms()))
        self._filters = {t: tag_filter(s) for t, s in self.subscriptions.items()}
        inst = await acquire_consumer_instance(self)
        self.instance = inst
        if self.message_model == "CLUSTERING":
            self.offset_store = RemoteOffsetStore(inst, self.group)
        else:
            self.offset_store = LocalOffsetStore(inst, self.group, self.broadcast_offset_dir,
                                                 self.instance_name)
        await self.offset_store.load()
        self._rebalance_lock = asyncio.Lock()
        self._work = WorkQueue()
        if not self._listener_is_async and self.sync_listener_in_thread:
            self._executor = ThreadPoolExecutor(self.consume_concurrency,
                                                thread_name_prefix=f"consume-{self.group}")
        self._workers = [asyncio.create_task(self._worker(), name=f"{self.group}:worker{i}")
                         for i in range(self.consume_concurrency)]
        self._persist_task = asyncio.create_task(self._persist_loop(), name=f"{self.group}:persist")
        self.state = "RUNNING"
        await self._update_routes()
        await inst.heartbeat_all()
        # The broker creates %RETRY%<group> on our heartbeat: look for its route again.
        await self._update_routes(only_missing=True)
        try:
            await self.rebalance()
        except MQClientError as e:
            log.warning("%s: first rebalance failed (will retry): %s", self.group, e)
        return self

    async def _update_routes(self, only_missing: bool = False) -> None:
        for topic in self.subscriptions:
            if only_missing and topic in self.instance.routes:
                continue
            try:
                await self.instance.update_route(topic)
            except MQClientError as e:
                log.info("%s: no route yet for %s: %s", self.group, topic, e)

    async def __aenter__(self) -> PushConsumer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.drain(self.close_timeout_s)

    async def drain(self, timeout_s: float = 30.0) -> bool:
        """Stop pulling, consume what is cached, commit, unregister. True if everything
        cached was consumed within `timeout_s` (else the rest is redelivered later).

        Called again while draining, it waits for the same drain. Called from inside a
        listener, it starts the drain and returns False at once: the drain has to wait for
        that very listener to return."""
        if self._drain_task is None:
            if self.state == "CLOSED":
                return True
            if self.state == "CREATED":
                self.state = "CLOSED"
                return True
            # Its own task, outside any worker's context, so it can wait for every worker.
            self._drain_task = asyncio.get_running_loop().create_task(
                self._drain(timeout_s), name=f"{self.group}:drain", context=contextvars.Context())
        if _IN_WORKER.get() is self:
            return False
        return await asyncio.shield(self._drain_task)

    async def _drain(self, timeout_s: float) -> bool:
        self.state = "DRAINING"
        async with self._rebalance_lock:
            tasks = list(self._pull_tasks.values())
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._pull_tasks.clear()
        deadline = mono_ms() + int(timeout_s * 1000)
        clean = True
        while any(pq.msg_count for pq in self.pqs.values()):
            if mono_ms() >= deadline:
                clean = False
                log.warning("%s: drain timed out with %d messages cached", self.group,
                            sum(pq.msg_count for pq in self.pqs.values()))
                break
            await asyncio.sleep(0.01)
        for pq in self.pqs.values():
            pq.dropped = True
        # Running listeners (only when timed out) get a moment to finish before the commit.
        while any(pq.in_flight for pq in self.pqs.values()) and mono_ms() < deadline + 1000:
            await asyncio.sleep(0.01)
        await self._stop_workers()
        if self._persist_task is not None:
            self._persist_task.cancel()
            await asyncio.gather(self._persist_task, return_exceptions=True)
        for mq, pq in self.pqs.items():
            off = pq.commit_offset()
            if off >= 0:
                self.offset_store.update(mq, off, increase_only=True)
        try:
            await self.offset_store.persist()
        except Exception as e:  # never leave the instance registered because of a commit error
            log.warning("%s: final commit failed: %s", self.group, e)
        self.pqs.clear()
        inst = self.instance
        inst.unregister_consumer(self.group)
        try:
            await asyncio.wait_for(inst.unregister_client(consumer_group=self.group), 5)
        except (TimeoutError, MQClientError):
            pass
        await inst.release()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
        self.state = "CLOSED"
        return clean

    async def _stop_workers(self) -> None:
        self._route_retry.cancel()
        for h in list(self._retry_handles):
            h.cancel()
        self._retry_handles.clear()
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    async def _persist_loop(self) -> None:
        while True:
            await asyncio.sleep(self.persist_interval_s)
            try:
                self._sync_offsets()
                await self.offset_store.persist()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("%s: periodic commit failed: %s", self.group, e)

    # -- rebalance ------------------------------------------------------------------------
    async def rebalance(self) -> None:
        if self.state != "RUNNING":
            return
        async with self._rebalance_lock:
            if self.state != "RUNNING":
                return
            inst = self.instance
            missing = False
            for topic in list(self.subscriptions):
                try:
                    missing |= await self._rebalance_topic(topic)
                except MQClientError as e:
                    log.warning("%s: rebalance of %s failed (retrying soon): %s", self.group, topic, e)
                    missing = True
                if self.state != "RUNNING":
                    return
            for mq in [m for m in self.pqs if m.topic not in self.subscriptions]:
                await self._remove_queue(mq)
            self._route_retry.schedule(missing, inst.rebalance_now)

    async def _rebalance_topic(self, topic: str) -> bool:
        """One topic's round; True when it should be retried soon (no route / not listed yet)."""
        inst = self.instance
        mq_all = await inst.subscribe_queues(topic, refresh=topic not in inst.routes)
        if not mq_all:
            return True
        if self.message_model == "CLUSTERING":
            cids = await inst.consumer_id_list(self.group, topic)
            if inst.client_id not in cids:
                # The broker has not seen our heartbeat yet: keep what we have.
                log.info("%s: %s not yet in the consumer list %s", self.group, inst.client_id, cids)
                await inst.heartbeat_all()
                return True
            plan = plan_clustering(topic, self.group, inst.client_id, mq_all, cids, self.pqs,
                                   self.allocate_strategy)
            alone = len(cids) == 1
        else:
            plan = plan_broadcasting(topic, mq_all, self.pqs)
            alone = True
        if plan.changed:
            log.info("%s: rebalance %s: -%s +%s", self.group, topic,
                     [m.queue_id for m in plan.to_remove], [m.queue_id for m in plan.to_add])
        await asyncio.gather(*(self._remove_queue(mq) for mq in plan.to_remove))
        if plan.to_add and not alone and self.handover_delay_ms > 0:
            # Let the previous owners commit what they consumed before we read the offsets.
            await asyncio.sleep(self.handover_delay_ms / 1000)
            if self.state != "RUNNING":
                return False
        await asyncio.gather(*(self._add_queue(mq) for mq in plan.to_add))
        return False

    async def _add_queue(self, mq: MessageQueue) -> None:
        try:
            offset = await compute_pull_from_where(self.instance, self.offset_store, self.group, mq,
                                                   self.consume_from_where, self.consume_timestamp_ms)
        except MQClientError as e:
            log.warning("%s: cannot compute the start offset of %s (retry next rebalance): %s",
                        self.group, mq, e)
            return
        if self.state != "RUNNING" or mq in self.pqs:
            return
        pq = ProcessQueue(mono_ms())
        self.pqs[mq] = pq
        self._pull_tasks[mq] = asyncio.create_task(self._pull_loop(mq, pq, offset),
                                                   name=f"{self.group}:pull:{mq.topic}:{mq.broker_name}:{mq.queue_id}")

    async def _remove_queue(self, mq: MessageQueue, wait_s: float = 10.0, commit: bool = True) -> None:
        """Stop consuming `mq`: no more pulls, wait (up to wait_s) for its listeners, then
        commit what was consumed (unless `commit` is False: an offset reset replaces it)."""
        pq = self.pqs.get(mq)
        if pq is None:
            return
        pq.dropped = True
        task = self._pull_tasks.pop(mq, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        deadline = mono_ms() + int(wait_s * 1000)
        while pq.in_flight and mono_ms() < deadline:
            await asyncio.sleep(0.005)
        if commit:
            off = pq.commit_offset()
            if off >= 0:
                self.offset_store.update(mq, off, increase_only=True)
            try:
                await self.offset_store.persist([mq])
            except Exception as e:
                log.warning("%s: commit of removed queue %s failed: %s", self.group, mq, e)
        if self.pqs.get(mq) is pq:
            del self.pqs[mq]
        self.offset_store.remove(mq)

    async def reset_offsets(self, table: dict[MessageQueue, int]) -> None:
        """A broker-initiated reset (mqadmin resetOffsetByTime): each queue of `table` this
        consumer owns stops (its listeners finish, nothing is committed over the reset),
        the new offset is committed, and the queue restarts there, like Java's
        resetOffset. Queues owned by other members are theirs to reset."""
        if self.state != "RUNNING":
            return
        async with self._rebalance_lock:
            owned = [mq for mq in table if mq in self.pqs]
            if not owned:
                return
            await asyncio.gather(*(self._remove_queue(mq, commit=False) for mq in owned))
            for mq in owned:
                self.offset_store.update(mq, table[mq], increase_only=False)
            await self.offset_store.persist(owned)
            if self.state != "RUNNING":
                return
            # _add_queue reads the start offset back from the offset store (the broker's
            # table in clustering mode, the local file in broadcasting mode).
            await asyncio.gather(*(self._add_queue(mq) for mq in owned))

    # -- pulling --------------------------------------------------------------------------
    async def _pull_loop(self, mq: MessageQueue, pq: ProcessQueue, next_offset: int) -> None:
        inst = self.instance
        sub = self.subscriptions[mq.topic]
        accept = self._filters.get(mq.topic)
        clustering = self.message_model == "CLUSTERING"
        limits = self.flow_limits
        timeout_s = self.pull_timeout_ms / 1000
        failures = 0
        while not pq.dropped:
            if pq.flow_control(limits) is not None:
                await asyncio.sleep(FLOW_CONTROL_DELAY_MS / 1000)
                continue
            commit = pq.commit_offset() if clustering else -1
            sys_flag = pull_sys_flag(commit > 0, True, True)
            try:
                addr = await inst.master_addr_refreshing(mq.broker_name, mq.topic)
                res = await inst.pull_message(addr, mq.broker_name, self.group, mq, next_offset,
                                              self.pull_batch_size, sys_flag, max(commit, 0),
                                              self.suspend_timeout_ms, sub.sub_string, sub.sub_version,
                                              timeout_s, raw=True)
            except MQClientError as e:
                if pq.dropped:
                    break
                failures += 1
                # Transient errors at INFO; the same offset failing on and on is a stuck queue.
                (log.warning if failures >= 5 else log.info)(
                    "%s: pull %s@%d failed (%d in a row): %s", self.group, mq, next_offset, failures, e)
                if isinstance(e, SubscriptionError):
                    await inst.heartbeat_all()
                await asyncio.sleep(self.pull_error_delay_ms / 1000)
                continue
            except asyncio.CancelledError:
                raise
            except Exception:
                # A bug must not silently end this queue's pull loop (rebalance would not restart it).
                if pq.dropped:
                    break
                failures += 1
                log.exception("%s: pull %s@%d failed unexpectedly", self.group, mq, next_offset)
                await asyncio.sleep(self.pull_error_delay_ms / 1000)
                continue
            failures = 0
            self.stats["pulls"] += 1
            if pq.dropped:
                break
            status = res.status
            pq.pull_offset = res.next_begin_offset
            if status == PullResult.FOUND:
                next_offset = res.next_begin_offset
                bn = mq.broker_name
                recs = res.records if accept is None else [r for r in res.records if accept(r)]
                if recs:
                    from_raw = MessageExt.from_raw
                    msgs = [from_raw(r, bn) for r in recs]
                    known = pq.msgs
                    if known and any(m.queue_offset in known for m in msgs):
                        # Offsets already cached (the pull offset moved back): never hand a
                        # message to the listener twice at once.
                        msgs = [m for m in msgs if m.queue_offset not in known]
                    if msgs:
                        pq.put_messages(msgs, mono_ms())
                        self._dispatch(mq, pq, msgs)
            elif status in (PullResult.NO_NEW_MSG, PullResult.NO_MATCHED_MSG):
                next_offset = res.next_begin_offset
            else:  # OFFSET_ILLEGAL
                log.warning("%s: offset %d of %s illegal (min %d, max %d); moving to %d", self.group,
                            next_offset, mq, res.min_offset, res.max_offset, res.next_begin_offset)
                next_offset = res.next_begin_offset
                if pq.msg_count == 0 and self.pqs.get(mq) is pq:
                    self.offset_store.update(mq, next_offset, increase_only=False)
                    await self.offset_store.persist([mq])

    def _sync_offsets(self) -> None:
        """Copy each live queue's commit point into the offset store (done before every
        commit rather than per message: the process queue is the source of truth)."""
        update = self.offset_store.update
        for mq, pq in self.pqs.items():
            if not pq.dropped:
                off = pq.commit_offset()
                if off >= 0:
                    update(mq, off, increase_only=True)

    # -- consuming ------------------------------------------------------------------------
    def _dispatch(self, mq: MessageQueue, pq: ProcessQueue, msgs: list) -> None:
        n = self.consume_batch_size
        if n == 1:
            self._work.extend([(mq, pq, (m,)) for m in msgs])
        else:
            self._work.extend([(mq, pq, tuple(msgs[i:i + n])) for i in range(0, len(msgs), n)])

    # A worker that never has to wait (fast listener) yields to the loop after this many
    # items, so pull responses are handled while a large backlog is being consumed.
    WORKER_ITEMS_PER_TURN = 64

    async def _worker(self) -> None:
        _IN_WORKER.set(self)   # this task's own context
        work = self._work
        items = work.items
        idle = work.idle
        fast = self.batch_listener is None and self._listener_is_async
        fn = self.listener
        stats = self.stats
        per_turn = self.WORKER_ITEMS_PER_TURN
        done_in_turn = 0
        while True:
            if not items:
                done_in_turn = 0
                await work.wait()
                continue
            if done_in_turn >= per_turn:
                done_in_turn = 0
                await asyncio.sleep(0)
                continue
            done_in_turn += 1
            mq, pq, msgs = items.popleft()
            if items and idle:
                work.wake_one()
            if pq.dropped:
                continue   # queue moved to another consumer (or drain gave up): leave these for later
            pq.in_flight += 1
            try:
                if fast:
                    try:
                        r = await fn(msgs[0])
                        ok = (r is None or r is True or r is ConsumeStatus.CONSUME_SUCCESS
                              or r == "CONSUME_SUCCESS")
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("%s: listener raised; the message(s) will be consumed again later",
                                      self.group)
                        ok = False
                    if ok:
                        stats["consumed"] += 1
                        pq.remove_messages(msgs, mono_ms())
                        continue
                else:
                    ok = await self._call_listener(msgs)
                await self._consumed(mq, pq, msgs, ok)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: processing the consume result failed", self.group)
            finally:
                pq.in_flight -= 1

    async def _call_listener(self, msgs) -> bool:
        fn = self.batch_listener
        arg = list(msgs)
        if fn is None:
            fn = self.listener
            arg = msgs[0]
        try:
            if self._listener_is_async:
                r = await fn(arg)
            elif self._executor is not None:
                # in the worker's context (like asyncio.to_thread): a listener closing its
                # own consumer through the sync facade is then seen as inside a worker
                r = await asyncio.get_running_loop().run_in_executor(
                    self._executor, contextvars.copy_context().run, fn, arg)
                if inspect.isawaitable(r):   # a plain wrapper around an async function
                    r = await r
            else:
                r = fn(arg)
                if inspect.isawaitable(r):
                    r = await r
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: listener raised; the message(s) will be consumed again later", self.group)
            return False
        if r is None or r is True or r is ConsumeStatus.CONSUME_SUCCESS or r == "CONSUME_SUCCESS":
            return True
        return False

    async def _consumed(self, mq: MessageQueue, pq: ProcessQueue, msgs, ok: bool) -> None:
        done = msgs
        if ok:
            self.stats["consumed"] += len(msgs)
        else:
            self.stats["failed"] += len(msgs)
            if self.message_model == "CLUSTERING":
                done, later = [], []
                for m in msgs:
                    if await self._send_back(mq, m):
                        done.append(m)
                    else:
                        later.append(m)
                if later:
                    self._retry_locally(mq, pq, later)
            # BROADCASTING: failures are dropped, like the Java client.
        pq.remove_messages(done, mono_ms())

    async def _send_back(self, mq: MessageQueue, m: MessageExt) -> bool:
        try:
            addr = await self.instance.master_addr_refreshing(mq.broker_name, mq.topic)
            await self.instance.send_back(addr, self.group, m.commit_log_offset, 0, m.msg_id, m.topic,
                                          self.max_reconsume_times)
            self.stats["sent_back"] += 1
            return True
        except MQClientError as e:
            log.warning("%s: send back of %s failed: %s", self.group, m.msg_id, e)
            return False

    def _retry_locally(self, mq: MessageQueue, pq: ProcessQueue, msgs, delay_s: float = 5.0) -> None:
        loop = asyncio.get_running_loop()

        def fire():
            self._retry_handles.discard(handle)
            if self._work is not None and self._workers:
                for m in msgs:
                    self._work.put_nowait((mq, pq, (m,)))
        handle = loop.call_later(delay_s, fire)
        self._retry_handles.add(handle)
