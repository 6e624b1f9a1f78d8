"""PushConsumer (asyncio): clustering or broadcasting, concurrent or orderly consumption.

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

Orderly consumption (`orderly=True`, client/consume_orderly.py): one consume task
per queue taking messages in queue order under the broker's queue lock (CLUSTERING);
the listener returns CONSUME_SUCCESS (or None) to commit, or
SUSPEND_CURRENT_QUEUE_A_MOMENT (raises, RECONSUME_LATER) to consume the same messages
again after suspend_current_queue_time_ms.

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
from operator import attrgetter

from pocketmq.client.api import SendBackRequest
from pocketmq.client.consume_orderly import OrderlyService
from pocketmq.client.consumer_config import (
    CONSUME_FROM,
    PushConsumerConfig,
    apply_config,
    build_config,
)
from pocketmq.client.query import QueryMixin
from pocketmq.client.errors import (
    ClientStateError,
    InvalidArgumentError,
    MQClientError,
)
from pocketmq.client.fetcher import Fetcher, wake_room
from pocketmq.client.instance import acquire_consumer_instance, mono_ms, now_ms
from pocketmq.client.message import MessageExt
from pocketmq.client.offset_store import LocalOffsetStore, RemoteOffsetStore
from pocketmq.client.process_queue import FlowLimits, ProcessQueue
from pocketmq.client.producer import check_group, check_topic
from pocketmq.client.rebalancer import Rebalancer, compute_pull_from_where
from pocketmq.client.selector import MessageSelector
from pocketmq.client.subscription_state import QueueState, SubscriptionState
from pocketmq.client.subscription_state import tag_filter as tag_filter  # re-exported
from pocketmq.common.constants import retry_topic
from pocketmq.protocol.bodies import (
    CONSUME_STATUS_FIELDS,
    PROP_CONSUME_ORDERLY,
    ConsumeMessageDirectlyResult,
    PROP_CONSUMER_START_TIMESTAMP,
    PROP_THREADPOOL_CORE_SIZE,
    ConsumerData,
    MessageQueue,
)

# The consumer whose worker runs the current code (a worker task, and the executor thread
# running a plain listener for it): a listener that calls close()/drain() of its own
# consumer must not wait for itself.
_IN_WORKER: contextvars.ContextVar[PushConsumer | None] = contextvars.ContextVar("pocketmq_in_worker",
                                                                                  default=None)

log = logging.getLogger("pocketmq.client.consumer")

_queue_offset = attrgetter("queue_offset")


class ConsumeStatus(Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    # orderly: consume the same messages again after suspend_current_queue_time_ms
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


CONSUME_SUCCESS = ConsumeStatus.CONSUME_SUCCESS
RECONSUME_LATER = ConsumeStatus.RECONSUME_LATER
SUSPEND_CURRENT_QUEUE_A_MOMENT = ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

def direct_consume_result(r) -> tuple[str, str | None]:
    """A listener's return value as Java's CMResult (and a remark), for
    CONSUME_MESSAGE_DIRECTLY. The values mean what they mean to the queues: None, True and
    CONSUME_SUCCESS are success (CR_SUCCESS: pocketmq's listeners may return nothing, so None
    is not Java's CR_RETURN_NULL); RECONSUME_LATER and an orderly listener's
    SUSPEND_CURRENT_QUEUE_A_MOMENT are CR_LATER; anything else is a failure to the queues
    (consumed again later), so CR_LATER with a remark naming the value."""
    if r is None or r is True or r is ConsumeStatus.CONSUME_SUCCESS or r == "CONSUME_SUCCESS":
        return "CR_SUCCESS", None
    if r in (ConsumeStatus.RECONSUME_LATER, ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT, "RECONSUME_LATER",
             "SUSPEND_CURRENT_QUEUE_A_MOMENT"):
        return "CR_LATER", None
    return "CR_LATER", f"the listener returned {r!r:.200}, which counts as a failure"


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


class PushConsumer(QueryMixin):
    """Listener dispatch and send-back over the shared consumer core (SubscriptionState,
    Fetcher, Rebalancer). Options: PushConsumerConfig, given as `config=` and/or as
    keyword arguments (which override the config's values)."""

    def __init__(self, group: str, namesrv_addr: str, *, listener: Callable | None = None,
                 batch_listener: Callable | None = None, config: PushConsumerConfig | None = None,
                 **options):
        check_group(group)
        if listener is not None and batch_listener is not None:
            raise InvalidArgumentError("give listener or batch_listener, not both")
        cfg = build_config(PushConsumerConfig, config, options)
        apply_config(self, cfg, now_ms())
        self.group = group
        self.namesrv_addr = namesrv_addr
        self.listener = listener
        self.batch_listener = batch_listener
        self.consume_batch_size = cfg.consume_batch_size if batch_listener else 1
        self.flow_limits = cfg.flow_limits or FlowLimits()
        self.broadcast_offset_dir = cfg.broadcast_offset_dir or os.path.join(
            os.path.expanduser("~"), ".pocketmq_offsets")

        self.subscription_state = SubscriptionState()
        self.stats = {"consumed": 0, "failed": 0, "sent_back": 0, "pulls": 0, "expired": 0,
                      "late_results": 0, "consumed_directly": 0}
        self.direct_consumes = 0        # listener calls of CONSUME_MESSAGE_DIRECTLY running now
        self.fetcher = Fetcher(group, self.subscription_state, self, pull_batch_size=self.pull_batch_size,
                               suspend_timeout_ms=self.suspend_timeout_ms, pull_timeout_ms=self.pull_timeout_ms,
                               pull_error_delay_ms=self.pull_error_delay_ms, stats=self.stats)
        self.rebalancer = Rebalancer(group, self.subscription_state, message_model=self.message_model,
                                     allocate_strategy=self.allocate_strategy,
                                     handover_delay_ms=self.handover_delay_ms,
                                     running=lambda: self.state == "RUNNING",
                                     add_queues=self._add_queues, remove_queues=self._remove_queues)
        # orderly=True: per-queue consume tasks and queue locks instead of the worker pool
        self.orderly_service = OrderlyService(self) if self.orderly else None
        self._work: WorkQueue | None = None
        self._workers: list[asyncio.Task] = []
        self._persist_task: asyncio.Task | None = None
        self._expire_task: asyncio.Task | None = None
        self._tick_ms = mono_ms()     # coarse clock for stamping listener calls (_expire_loop)
        self._retry_handles: set = set()
        self._executor: ThreadPoolExecutor | None = None
        self._listener_is_async = False
        self.instance = None
        self.offset_store = None
        self.state = "CREATED"      # CREATED -> RUNNING -> DRAINING -> CLOSED
        self._start_wall_ms = 0
        self._drain_task: asyncio.Task | None = None

    # -- configuration ---------------------------------------------------------------------
    @property
    def subscriptions(self) -> dict:
        return self.subscription_state.subscriptions

    @property
    def pqs(self) -> dict[MessageQueue, ProcessQueue]:
        """The held queues and their ProcessQueues (a snapshot)."""
        return {mq: qs.pq for mq, qs in self.subscription_state.assignment.items()}

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        check_topic(topic)
        if self.state != "CREATED":
            raise ClientStateError("subscribe before start()")
        self.subscription_state.subscribe(topic, expression, now_ms())

    def register_listener(self, listener: Callable) -> None:
        self.listener = listener

    def topics(self) -> set[str]:
        return self.subscription_state.topics()

    @property
    def client_id(self) -> str:
        return self.instance.client_id if self.instance else ""

    def masters_changed(self, lost, back) -> None:
        """ClientInstance: the groups (broker names) whose master left the route or came
        back (a master that moved, a failover, is in both). Pulls and offsets find their
        member at each request; orderly queues stop and resume (their locks live on the
        master: client/consume_orderly.py)."""
        if self.orderly_service is not None and self.state in ("RUNNING", "DRAINING"):
            self.orderly_service.masters_changed(lost, back)

    def consumer_data(self) -> ConsumerData | None:
        if self.state not in ("RUNNING", "DRAINING"):
            return None
        return ConsumerData(self.group, "CONSUME_PASSIVELY", self.message_model,
                            CONSUME_FROM[self.consume_from_where], list(self.subscriptions.values()))

    def running_info(self) -> dict:
        """What GET_CONSUMER_RUNNING_INFO reports (ClientInstance adds the instance-wide
        properties and encodes it as Java's ConsumerRunningInfo): the options under the
        names Java's DefaultMQPushConsumer gives them, the subscriptions, one
        ProcessQueueInfo per held queue (timestamps in wall-clock ms, plus pocketmq's
        oldestInFlightAgeMs), and per-topic consume status (pocketmq keeps no RT/TPS
        figures: zeros)."""
        wall, mono = now_ms(), mono_ms()

        def wall_of(t: int) -> int:
            return wall - (mono - t) if t > 0 else 0
        lim = self.flow_limits
        props = {
            "consumerGroup": self.group, "messageModel": self.message_model,
            "consumeFromWhere": CONSUME_FROM[self.consume_from_where],
            "consumeTimestamp": self.consume_timestamp_ms, "consumeThreadMin": self.consume_concurrency,
            "consumeThreadMax": self.consume_concurrency, "pullBatchSize": self.pull_batch_size,
            "consumeMessageBatchMaxSize": self.consume_batch_size,
            "pullThresholdForQueue": lim.pull_threshold_for_queue,
            "pullThresholdSizeForQueue": lim.pull_threshold_size_for_queue_bytes // (1024 * 1024),
            "consumeConcurrentlyMaxSpan": lim.consume_concurrently_max_span,
            "maxReconsumeTimes": -1 if self.max_reconsume_times is None else self.max_reconsume_times,
            "consumeTimeout": self.consume_timeout_min,
            "suspendCurrentQueueTimeMillis": self.suspend_current_queue_time_ms,
            "persistConsumerOffsetInterval": int(self.persist_interval_s * 1000),
            "allocateMessageQueueStrategy": type(self.allocate_strategy).__name__,
            "namesrvAddr": self.namesrv_addr, "instanceName": self.instance_name or "DEFAULT",
            "clientIP": self.client_id.split("@", 1)[0], "unitMode": "false",
            PROP_THREADPOOL_CORE_SIZE: self.consume_concurrency,
            PROP_CONSUME_ORDERLY: "true" if self.orderly else "false",
            PROP_CONSUMER_START_TIMESTAMP: self._start_wall_ms,
        }
        mq_table = {}
        for mq, qs in self.subscription_state.assignment.items():
            pq = qs.pq
            keys = pq.msgs.keys()
            mq_table[mq] = {
                "commitOffset": pq.commit_offset(),
                "cachedMsgMinOffset": keys[0] if keys else 0, "cachedMsgMaxOffset": keys[-1] if keys else 0,
                "cachedMsgCount": pq.msg_count, "cachedMsgSizeInMiB": pq.msg_size_bytes // (1024 * 1024),
                "transactionMsgMinOffset": 0, "transactionMsgMaxOffset": 0, "transactionMsgCount": 0,
                "locked": pq.locked, "tryUnlockTimes": 0, "lastLockTimestamp": wall_of(pq.last_lock_ms),
                "droped": pq.dropped, "lastPullTimestamp": wall_of(pq.last_pull_ms),
                "lastConsumeTimestamp": wall_of(pq.last_consume_ms),
                "oldestInFlightAgeMs": pq.oldest_in_flight_age_ms(mono),
            }
        status = {t: dict.fromkeys(CONSUME_STATUS_FIELDS, 0) for t in self.subscriptions}
        return {"properties": props, "subscriptions": list(self.subscriptions.values()),
                "mq_table": mq_table, "status_table": status}

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
            self.subscription_state.subscribe_default(retry_topic(self.group), now_ms())
        inst = await acquire_consumer_instance(self)
        try:
            await inst.check_filters_in_brokers(self.group, self.subscriptions.values())
        except BaseException:
            inst.unregister_consumer(self.group)
            await inst.release()
            raise
        self.instance = inst
        self.fetcher.instance = inst
        self.fetcher.find_addr = inst.subscribe_addr_refreshing     # master or slave (client/replica.py)
        self.fetcher.request_route_refresh = inst.request_route_refresh     # failover (client/failover.py)
        self.rebalancer.instance = inst
        if self.message_model == "CLUSTERING":
            self.offset_store = RemoteOffsetStore(inst, self.group, find_addr=inst.admin_addr_refreshing)
        else:
            self.offset_store = LocalOffsetStore(inst, self.group, self.broadcast_offset_dir,
                                                 self.instance_name)
        await self.offset_store.load()
        self._work = WorkQueue()
        if not self._listener_is_async and self.sync_listener_in_thread:
            self._executor = ThreadPoolExecutor(self.consume_concurrency,
                                                thread_name_prefix=f"consume-{self.group}")
        if self.orderly_service is not None:
            self.orderly_service.start()
        else:
            self._workers = [asyncio.create_task(self._worker(), name=f"{self.group}:worker{i}")
                             for i in range(self.consume_concurrency)]
            self._tick_ms = mono_ms()
            self._expire_task = asyncio.create_task(self._expire_loop(), name=f"{self.group}:expire")
        self._persist_task = asyncio.create_task(self._persist_loop(), name=f"{self.group}:persist")
        self._start_wall_ms = now_ms()
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
        held = self.subscription_state.assignment
        async with self.rebalancer.lock:
            await self.fetcher.stop_all()
        deadline = mono_ms() + int(timeout_s * 1000)
        clean = True
        while any(qs.pq.msg_count for qs in held.values()):
            if mono_ms() >= deadline:
                clean = False
                log.warning("%s: drain timed out with %d messages cached", self.group,
                            sum(qs.pq.msg_count for qs in held.values()))
                break
            await asyncio.sleep(0.01)
        for qs in held.values():
            qs.drop()
        # Running listeners (only when timed out) get a moment to finish before the commit.
        while any(qs.pq.in_flight for qs in held.values()) and mono_ms() < deadline + 1000:
            await asyncio.sleep(0.01)
        await self._stop_workers()
        for task in (self._persist_task, self._expire_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for mq, qs in held.items():
            off = qs.pq.commit_offset()
            if off >= 0:
                self.offset_store.update(mq, off, increase_only=True)
        try:
            await self.offset_store.persist()
        except Exception as e:  # never leave the instance registered because of a commit error
            log.warning("%s: final commit failed: %s", self.group, e)
        osvc = self.orderly_service
        if osvc is not None and osvc.needs_lock:
            # After the commit: the next owner starts where we stopped. A queue whose
            # listener is still running keeps its lock until the broker expires it.
            await osvc.unlock([mq for mq, qs in held.items() if not qs.pq.in_flight])
        held.clear()
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
        self.rebalancer.cancel()
        for h in list(self._retry_handles):
            h.cancel()
        self._retry_handles.clear()
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        if self.orderly_service is not None:
            await self.orderly_service.stop()

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

    # -- rebalance (Rebalancer hooks) ---------------------------------------------------------
    async def rebalance(self) -> None:
        await self.rebalancer.rebalance()

    async def _add_queues(self, mqs) -> bool:
        """Start consuming `mqs`; True if some could not be taken yet (orderly: locked by
        another member still), so the rebalancer tries again soon."""
        osvc = self.orderly_service
        refused = False
        if osvc is not None and osvc.needs_lock:
            # Java RebalanceImpl: an orderly queue is added only once the broker locked it
            # for us; its start offset is read after that, so it includes the previous
            # owner's last commit (made before it unlocked).
            locked = await osvc.lock(mqs)
            refused = len(locked) < len(mqs)
            if refused:
                log.info("%s: queues locked by another member, retrying soon: %s", self.group,
                         [f"{m.broker_name}:{m.queue_id}" for m in mqs if m not in locked])
            mqs = [mq for mq in mqs if mq in locked]
        if osvc is not None:
            # a listener of this queue's previous stint here has not returned yet
            busy = [mq for mq in mqs if osvc.busy(mq)]
            if busy:
                refused = True
                mqs = [mq for mq in mqs if mq not in busy]
        await asyncio.gather(*(self._add_queue(mq) for mq in mqs))
        return refused

    async def _remove_queues(self, mqs) -> None:
        await asyncio.gather(*(self._remove_queue(mq) for mq in mqs))

    async def _add_queue(self, mq: MessageQueue) -> None:
        try:
            offset = await compute_pull_from_where(self.instance, self.offset_store, mq,
                                                   self.consume_from_where, self.consume_timestamp_ms)
        except MQClientError as e:
            log.warning("%s: cannot compute the start offset of %s (retry next rebalance): %s",
                        self.group, mq, e)
            return
        if self.state != "RUNNING" or mq in self.subscription_state.assignment:
            return
        pq = ProcessQueue(mono_ms())
        if self.orderly_service is not None:
            pq.set_locked(mono_ms())
        qs = self.subscription_state.add(mq, offset, pq)
        self.fetcher.start(qs)

    async def _remove_queue(self, mq: MessageQueue, wait_s: float = 10.0, commit: bool = True,
                            unlock: bool = True) -> None:
        """Stop consuming `mq`: no more pulls, wait (up to wait_s) for its listeners, then
        commit what was consumed (unless `commit` is False: an offset reset replaces it)."""
        qs = self.subscription_state.get(mq)
        if qs is None:
            return
        pq = qs.pq
        qs.drop()
        await self.fetcher.stop(qs)
        deadline = mono_ms() + int(wait_s * 1000)
        while pq.in_flight and mono_ms() < deadline:
            await asyncio.sleep(0.005)
        osvc = self.orderly_service
        if osvc is not None:
            await osvc.stop_queue(qs)
        if commit:
            off = pq.commit_offset()
            if off >= 0:
                self.offset_store.update(mq, off, increase_only=True)
            try:
                await self.offset_store.persist([mq])
            except Exception as e:
                log.warning("%s: commit of removed queue %s failed: %s", self.group, mq, e)
        self.subscription_state.remove(mq, qs)
        self.offset_store.remove(mq)
        if osvc is not None and osvc.needs_lock and unlock and not pq.in_flight:
            # After the commit, so the next owner reads it; never while our listener still
            # runs (the broker's lock then expires by itself): one consumer per queue.
            await osvc.unlock([mq])

    async def give_up_queues(self, mqs) -> None:
        """Orderly: queues whose lock another member holds now. Their cache is dropped
        without a commit (the offset is the other member's) and without an unlock."""
        async with self.rebalancer.lock:
            await asyncio.gather(*(self._remove_queue(mq, commit=False, unlock=False) for mq in mqs
                                   if mq in self.subscription_state.assignment))

    async def reset_offsets(self, table: dict[MessageQueue, int]) -> None:
        """A broker-initiated reset (mqadmin resetOffsetByTime): each queue of `table` this
        consumer owns stops (its listeners finish, nothing is committed over the reset),
        the new offset is committed, and the queue restarts there, like Java's
        resetOffset. Queues owned by other members are theirs to reset."""
        if self.state != "RUNNING":
            return
        async with self.rebalancer.lock:
            owned = [mq for mq in table if mq in self.subscription_state.assignment]
            if not owned:
                return
            await asyncio.gather(*(self._remove_queue(mq, commit=False) for mq in owned))
            for mq in owned:
                self.offset_store.update(mq, table[mq], increase_only=False)
            await self.offset_store.persist(owned)
            if self.state != "RUNNING":
                return
            # _add_queue reads the start offset back from the offset store (the broker's
            # table in clustering mode, the local file in broadcasting mode); orderly
            # queues are locked again first (a refused one comes back at a rebalance).
            await self._add_queues(owned)

    # -- pulling (Fetcher hooks) ---------------------------------------------------------------
    def may_fetch(self, qs: QueueState) -> bool:
        pq = qs.pq
        osvc = self.orderly_service
        # orderly: CLUSTERING pulls only under a valid lock (Java's pullMessage: "the
        # message queue not be able to consume")
        if osvc is not None and osvc.needs_lock and not pq.holds_lock(mono_ms()):
            return False
        return self._under_limits(pq)

    def _under_limits(self, pq: ProcessQueue) -> bool:
        """The process queue's flow-control limits allow a pull (orderly: no span limit,
        one message at a time per queue)."""
        return pq.flow_control(self.flow_limits, orderly=self.orderly_service is not None) is None

    def pull_commit_offset(self, qs: QueueState) -> int:
        return qs.pq.commit_offset() if self.message_model == "CLUSTERING" else -1

    async def start_offset(self, qs: QueueState) -> int:
        return await compute_pull_from_where(self.instance, self.offset_store, qs.mq,
                                             self.consume_from_where, self.consume_timestamp_ms)

    def on_found(self, qs: QueueState, msgs: list, next_begin_offset: int) -> None:
        pq = qs.pq
        pq.pull_offset = next_begin_offset
        if msgs:
            known = pq.msgs
            if (known and min(map(_queue_offset, msgs)) <= pq.queue_offset_max
                    and any(m.queue_offset in known for m in msgs)):
                # Offsets already cached (the pull offset moved back): never hand a
                # message to the listener twice at once.
                msgs = [m for m in msgs if m.queue_offset not in known]
            if msgs:
                pq.put_messages(msgs, mono_ms())
                if self.orderly_service is not None:
                    self.orderly_service.wake(qs)
                else:
                    self._dispatch(qs.mq, pq, msgs)

    def on_no_new(self, qs: QueueState, next_begin_offset: int) -> None:
        qs.pq.pull_offset = next_begin_offset

    async def on_offset_moved(self, qs: QueueState, res, old_offset: int) -> None:
        pq = qs.pq
        pq.pull_offset = res.next_begin_offset
        mq = qs.mq
        if pq.msg_count == 0 and self.subscription_state.get(mq) is qs:
            self.offset_store.update(mq, res.next_begin_offset, increase_only=False)
            await self.offset_store.persist([mq])

    def _sync_offsets(self) -> None:
        """Copy each live queue's commit point into the offset store (done before every
        commit rather than per message: the process queue is the source of truth)."""
        update = self.offset_store.update
        for mq, qs in self.subscription_state.assignment.items():
            pq = qs.pq
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
                    m = msgs[0]
                    off = m.queue_offset
                    consuming = pq.consuming
                    consuming[off] = self._tick_ms
                    try:
                        r = await fn(m)
                        ok = (r is None or r is True or r is ConsumeStatus.CONSUME_SUCCESS
                              or r == "CONSUME_SUCCESS")
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("%s: listener raised; the message(s) will be consumed again later",
                                      self.group)
                        ok = False
                    if consuming.pop(off, None) is None:
                        # timed out meanwhile and sent back by _expire_once: ignore the late result
                        stats["late_results"] += 1
                        continue
                    if ok:
                        stats["consumed"] += 1
                        # (the listener-call clock: last_consume_ms is for running info)
                        pq.remove_one(m, self._tick_ms)
                        if pq.room is not None:     # (checked here too: the per-message path)
                            self.made_room(pq)
                        continue
                else:
                    pq.start_consuming(msgs, self._tick_ms)
                    ok = await self._call_listener(msgs)
                    live = pq.finish_consuming(msgs)
                    if len(live) < len(msgs):
                        stats["late_results"] += len(msgs) - len(live)
                        if not live:
                            continue
                        msgs = tuple(live)
                await self._consumed(mq, pq, msgs, ok)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: processing the consume result failed", self.group)
            finally:
                pq.in_flight -= 1

    def enter_worker_context(self) -> None:
        """Called first in each orderly consume task: a listener closing its own consumer
        is then seen as inside a worker (drain() does not wait for itself)."""
        _IN_WORKER.set(self)

    async def call_orderly_listener(self, msgs) -> bool:
        """One orderly listener call: True on success (commit), False to consume the same
        messages again (an exception, RECONSUME_LATER, SUSPEND_CURRENT_QUEUE_A_MOMENT)."""
        if self._listener_is_async and self.batch_listener is None:
            try:
                r = await self.listener(msgs[0])
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: orderly listener raised; the queue is suspended a moment", self.group)
                return False
            return r is None or r is True or r is ConsumeStatus.CONSUME_SUCCESS or r == "CONSUME_SUCCESS"
        return await self._call_listener(msgs)

    async def _call_listener(self, msgs) -> bool:
        try:
            r = await self._invoke_listener(msgs)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: listener raised; the message(s) will be consumed again later", self.group)
            return False
        if r is None or r is True or r is ConsumeStatus.CONSUME_SUCCESS or r == "CONSUME_SUCCESS":
            return True
        return False

    async def _invoke_listener(self, msgs):
        """The listener's (or batch listener's) own return value for `msgs`; what it raises
        propagates."""
        fn = self.batch_listener
        arg = list(msgs)
        if fn is None:
            fn = self.listener
            arg = msgs[0]
        if self._listener_is_async:
            return await fn(arg)
        if self._executor is not None:
            # in the worker's context (like asyncio.to_thread): a listener closing its
            # own consumer through the sync facade is then seen as inside a worker
            r = await asyncio.get_running_loop().run_in_executor(
                self._executor, contextvars.copy_context().run, fn, arg)
        else:
            r = fn(arg)
        if inspect.isawaitable(r):   # a plain wrapper around an async function
            r = await r
        return r

    # -- consume a message directly (CONSUME_MESSAGE_DIRECTLY, an admin through the broker) ---
    # At most this many direct consumptions run at once per consumer; one more is answered
    # SYSTEM_BUSY by ClientInstance (an admin retrying in a loop must not pile up listener calls).
    DIRECT_CONSUMES_MAX = 8

    def direct_consumes_busy(self) -> bool:
        return self.direct_consumes >= self.DIRECT_CONSUMES_MAX

    async def consume_message_directly(self, msg: MessageExt) -> ConsumeMessageDirectlyResult:
        """Run the listener once on `msg` outside the queues (Java's
        ConsumeMessageConcurrentlyService / OrderlyService.consumeMessageDirectly): no queue,
        lock or offset is touched, nothing is committed and a failure is not sent back; the
        answer says what the listener did (direct_consume_result) and how long it took."""
        self.direct_consumes += 1
        t0 = mono_ms()
        remark = None
        try:
            r = await self._invoke_listener((msg,))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("%s: listener raised on message %s consumed directly: %r", self.group, msg.msg_id, e)
            result, remark = "CR_THROW_EXCEPTION", f"{type(e).__name__}: {e}"
        else:
            result, remark = direct_consume_result(r)
        finally:
            self.direct_consumes -= 1
        self.stats["consumed_directly"] += 1
        log.info("%s: message %s consumed directly: %s", self.group, msg.msg_id, result)
        return ConsumeMessageDirectlyResult(order=bool(self.orderly), auto_commit=True, consume_result=result,
                                            remark=remark, spent_time_mills=max(0, mono_ms() - t0))

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
        self.made_room(pq)

    def made_room(self, pq: ProcessQueue) -> None:
        """Messages left `pq`: its pull, if waiting on flow control, goes now if the limits allow."""
        if pq.room is not None and self._under_limits(pq):
            wake_room(pq.room)

    async def _send_back(self, mq: MessageQueue, m: MessageExt, delay_level: int = 0) -> bool:
        try:
            addr = await self.instance.master_addr_refreshing(mq.broker_name, mq.topic)
            await self.instance.api.send_back(SendBackRequest(addr, self.group, m.commit_log_offset, delay_level,
                                                              m.msg_id, m.topic, self.max_reconsume_times))
            self.stats["sent_back"] += 1
            return True
        except MQClientError as e:
            log.warning("%s: send back of %s failed: %s", self.group, m.msg_id, e)
            self.fetcher.report_failure(mq, e)      # a demoted master refuses it: find the new one
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


    # -- consume timeout (Java: ConsumeMessageConcurrentlyService.cleanExpireMsg) -------------------
    @property
    def consume_timeout_ms(self) -> int:
        return int(self.consume_timeout_min * 60_000)

    def expire_check_interval_s(self) -> float:
        """How often in-flight messages are checked against the consume timeout. Java checks
        every consumeTimeout (15 min), so a stuck message may wait up to twice the timeout;
        checking every min(timeout, 60 s) bounds that overshoot to 60 s, and one check is
        only a scan of the running listener calls (at most consume_concurrency entries)."""
        return min(self.consume_timeout_ms, 60_000) / 1000

    # Listener calls are stamped with this coarse clock (refreshed every TICK_S by the
    # expiry task): reading an attribute per message is a third of the cost of reading the
    # monotonic clock, and a 100 ms error is nothing against a timeout of minutes.
    TICK_S = 0.1

    async def _expire_loop(self) -> None:
        interval_ms = int(self.expire_check_interval_s() * 1000)
        next_check = mono_ms() + interval_ms
        while True:
            await asyncio.sleep(self.TICK_S)
            now = self._tick_ms = mono_ms()
            if now < next_check:
                continue
            next_check = now + interval_ms
            try:
                await self._expire_once(now)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: consume timeout check failed", self.group)

    async def _expire_once(self, now: int) -> int:
        """Send back every message whose listener call outlived the consume timeout (delay
        level 3, as Java's cleanExpireMsg) and drop it from its queue; the listener's late
        result is ignored (ProcessQueue.claim_expired). A failed send-back falls back to the
        local retry after 5 s, like a failed listener call. Returns how many expired."""
        timeout = self.consume_timeout_ms
        n = 0
        for mq, qs in list(self.subscription_state.assignment.items()):
            pq = qs.pq
            if pq.dropped:
                continue
            for m in pq.claim_expired(now, timeout):
                n += 1
                self.stats["expired"] += 1
                log.warning("%s: consume timeout: message %s (%s offset %d) in the listener for more than "
                            "%s min; sending it back for retry", self.group, m.msg_id, mq, m.queue_offset,
                            self.consume_timeout_min)
                if self.message_model == "CLUSTERING":
                    if not await self._send_back(mq, m, delay_level=3):
                        self._retry_locally(mq, pq, [m])
                        continue
                pq.remove_messages([m], mono_ms())
                self.made_room(pq)
        return n

    def in_flight_ages(self) -> dict[MessageQueue, int]:
        """{queue: age in ms of its oldest message still in a listener call (0: none)} for
        every held queue (concurrent mode; orderly queues report 0)."""
        now = mono_ms()
        return {mq: qs.pq.oldest_in_flight_age_ms(now) for mq, qs in self.subscription_state.assignment.items()}
