"""Orderly consumption for PushConsumer(orderly=True) (asyncio shell).

The rules are pure and live in client.process_queue (lock validity, orderly_step,
split_exhausted, next_lock_renewal_ms); this module owns the tasks, the clock and the
broker requests, following Java 4.9's ConsumeMessageOrderlyService and
RebalanceImpl.lock/lockAll/unlock:

* CLUSTERING: a queue is added only after LOCK_BATCH_MQ named it ours (`lock`); every
  REBALANCE_LOCK_INTERVAL_MS the locks of all held queues are renewed in one request per
  broker (`_renew_loop`); a queue the broker refuses to renew is given up (another client
  holds it now): its cache is dropped without a commit and the next rebalance may take
  it again. A queue whose local lock is older than REBALANCE_LOCK_MAX_LIVE_MS is neither
  pulled nor consumed until a renewal succeeds. Dropped queues are unlocked by the
  consumer after their last commit (`unlock`), and all of them at shutdown.
  Locks live on the group's master only (client/replica.py): when the route shows a
  group without master (`masters_changed`, from the ClientInstance) its queues stop at
  once (their local lock is dropped: no pull, no consumption, so nothing is consumed
  out of order meanwhile) but stay held; when the master is back the locks are renewed
  at once and they go on where they stopped. A renewal that could not reach a broker
  that still has a master changes nothing: the local lock runs out by itself (Java).
  BROADCASTING: no locks (each member has its own offsets; Java's orderly service only
  locks in CLUSTERING).
* one consume task per queue; it takes a slot of `consume_concurrency` (the consume
  thread pool of Java) while it consumes, and gives the slot back when the queue is
  empty, when it waits (suspend, relock) or after MAX_TIME_CONSUME_CONTINUOUSLY_MS, so
  a busy queue cannot starve the others;
* messages are taken in queue order (consume_batch_size at a time for a batch
  listener) and stay cached until the listener succeeded, so the commit point never
  passes a message that is not done;
* a failure (an exception, RECONSUME_LATER or SUSPEND_CURRENT_QUEUE_A_MOMENT) counts
  reconsume_times up locally and consumes the same messages again after
  suspend_current_queue_time_ms; a message already retried max_reconsume_times (16
  unless set) is sent to %DLQ%<group> with CONSUMER_SEND_MSG_BACK (delayLevel -1, the
  broker's "straight to the dead-letter queue") and the queue moves past it; if that
  send fails, it is retried like any failure.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import defaultdict

from pocketmq.client.api import SendBackRequest
from pocketmq.client.errors import MQClientError
from pocketmq.client.instance import mono_ms
from pocketmq.client.process_queue import (
    ORDERLY_MAX_RECONSUME_TIMES,
    OrderlyStep,
    next_lock_renewal_ms,
    orderly_step,
    split_exhausted,
)
from pocketmq.client.subscription_state import QueueState
from pocketmq.protocol.bodies import MessageQueue

log = logging.getLogger("pocketmq.client.consumer")

# Java's tryLockLaterAndReconsume: a queue without a valid lock tries again this much later.
RELOCK_DELAY_S = 1.0
# Java's submitConsumeRequestLater(10 ms) after the continuous-consumption limit.
YIELD_DELAY_S = 0.01
# A queue task that never has to wait (fast listener) yields to the loop after this many
# messages, so pull responses and other queues are served during a large backlog.
ITEMS_PER_TURN = 64


class OrderlyService:
    """The orderly half of a PushConsumer: per-queue consume tasks and the queue locks."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.group = consumer.group
        self.needs_lock = consumer.message_model == "CLUSTERING"
        mrt = consumer.max_reconsume_times
        self.max_reconsume_times = ORDERLY_MAX_RECONSUME_TIMES if mrt is None else mrt
        self.suspend_s = consumer.suspend_current_queue_time_ms / 1000
        self.batch_size = consumer.consume_batch_size
        self.tasks: dict[MessageQueue, asyncio.Task] = {}
        self.wakeups: dict[MessageQueue, asyncio.Event] = {}
        self.slots: asyncio.Semaphore | None = None
        self._renew_task: asyncio.Task | None = None
        self._renew_now = asyncio.Event()     # renew before the timer (a master came back)
        self.now_ms = mono_ms          # injectable for tests of the shell

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self.slots = asyncio.Semaphore(self.consumer.consume_concurrency)
        if self.needs_lock:
            self._renew_task = asyncio.create_task(self._renew_loop(), name=f"{self.group}:lock-renew")

    async def stop(self) -> None:
        tasks = list(self.tasks.values())
        if self._renew_task is not None:
            tasks.append(self._renew_task)
            self._renew_task = None
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()
        self.wakeups.clear()

    # -- locks ------------------------------------------------------------------------------
    def _by_broker(self, mqs) -> dict[str, list[MessageQueue]]:
        out: dict[str, list[MessageQueue]] = defaultdict(list)
        for mq in mqs:
            out[mq.broker_name].append(mq)
        return out

    async def lock(self, mqs) -> set[MessageQueue]:
        """LOCK_BATCH_MQ for `mqs` (one request per broker): the ones now ours. Held queues
        among them get their local lock refreshed."""
        return (await self._lock(mqs))[0]

    async def _lock(self, mqs) -> tuple[set[MessageQueue], set[str]]:
        """lock(), and the brokers that could not be asked (no master, or the request failed):
        their queues were not refused."""
        inst = self.consumer.instance
        ok: set[MessageQueue] = set()
        unasked: set[str] = set()
        for bn, group_mqs in self._by_broker(mqs).items():
            try:
                addr = await inst.master_addr_refreshing(bn, group_mqs[0].topic)
                ok.update(await inst.api.lock_batch(addr, self.group, inst.client_id, group_mqs))
            except MQClientError as e:
                unasked.add(bn)
                log.warning("%s: locking %d queues on %s failed: %s", self.group, len(group_mqs), bn, e)
        now = self.now_ms()
        for mq in ok:
            qs = self.consumer.subscription_state.get(mq)
            if qs is not None:
                qs.pq.set_locked(now)
        return ok, unasked

    def masters_changed(self, lost, back) -> None:
        """The route shows the groups `lost` without master and `back` with one again (a
        group whose master moved to another address, a failover, is in both). Queues of a
        group without master stop now (no pull, no consumption: the lock that orders them
        cannot be renewed, and a master back from a restart, or a promoted slave, does not
        have it); they stay held and go on once renew() locks them on the master again,
        which runs at once when one comes back."""
        if not self.needs_lock:
            return
        held = self.consumer.subscription_state.assignment
        stopped = []
        for mq, qs in held.items():
            if mq.broker_name in lost and qs.pq.locked:
                qs.pq.lose_lock()
                stopped.append(mq)
        if stopped:
            log.warning("%s: %s lost its master: orderly queues %s stop until locked on a master again", self.group,
                        ", ".join(sorted(lost)), [f"{m.broker_name}:{m.queue_id}" for m in sorted(stopped)])
        if back and any(mq.broker_name in back for mq in held):
            self._renew_now.set()

    async def unlock(self, mqs) -> None:
        """UNLOCK_BATCH_MQ (after the last commit of these queues); errors only logged: the
        broker's lock then expires by itself."""
        inst = self.consumer.instance
        for bn, group_mqs in self._by_broker(mqs).items():
            try:
                addr = await inst.master_addr_refreshing(bn, group_mqs[0].topic)
                await inst.api.unlock_batch(addr, self.group, inst.client_id, group_mqs)
            except MQClientError as e:
                log.warning("%s: unlocking %d queues on %s failed: %s", self.group, len(group_mqs), bn, e)

    async def renew(self) -> None:
        """Renew every held queue's lock; a queue the broker gave to another client is
        dropped (no commit: the other client owns its offset now). Queues of a broker that
        could not be asked are kept: stopped now when the route has no master for them
        (masters_changed), else left to their local lock's expiry."""
        held = dict(self.consumer.subscription_state.assignment)
        if not held:
            return
        ok, unasked = await self._lock(list(held))
        brokers = self.consumer.instance.brokers
        for mq, qs in held.items():
            if mq.broker_name in unasked and brokers.master(mq.broker_name) is None:
                qs.pq.lose_lock()
        refused = [mq for mq, qs in held.items()
                   if mq not in ok and mq.broker_name not in unasked and not qs.dropped]
        for mq in refused:
            held[mq].pq.lose_lock()
        if refused:
            log.warning("%s: locks of %s refused at renewal; giving them up", self.group,
                        [f"{m.broker_name}:{m.queue_id}" for m in refused])
            await self.consumer.give_up_queues(refused)

    async def _renew_loop(self) -> None:
        last = self.now_ms()
        while True:
            try:
                async with asyncio.timeout(max(0, next_lock_renewal_ms(last) - self.now_ms()) / 1000):
                    await self._renew_now.wait()
            except TimeoutError:
                pass
            self._renew_now.clear()
            last = self.now_ms()
            try:
                await self.renew()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: lock renewal failed unexpectedly", self.group)

    # -- consume tasks ------------------------------------------------------------------------
    def wake(self, qs: QueueState) -> None:
        """New messages for `qs`: start its consume task or wake it."""
        mq = qs.mq
        task = self.tasks.get(mq)
        if task is None or task.done():
            ev = self.wakeups[mq] = asyncio.Event()
            self.tasks[mq] = asyncio.create_task(
                self._run(qs, ev), name=f"{self.group}:orderly:{mq.topic}:{mq.broker_name}:{mq.queue_id}")
        ev = self.wakeups.get(mq)
        if ev is not None:
            ev.set()

    def busy(self, mq: MessageQueue) -> bool:
        """A consume task of `mq` still runs (a listener of a dropped queue not returned yet)."""
        task = self.tasks.get(mq)
        return task is not None and not task.done()

    async def stop_queue(self, qs: QueueState) -> None:
        """End the consume task of a dropped queue; one whose listener still runs ends by
        itself when the listener returns (and keeps `busy(mq)` true until then)."""
        task = self.tasks.get(qs.mq)
        if task is None or qs.pq.in_flight:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def _run(self, qs: QueueState, ev: asyncio.Event) -> None:
        self.consumer.enter_worker_context()
        pq = qs.pq
        try:
            while not pq.dropped:
                if not pq.msgs:
                    ev.clear()
                    await ev.wait()
                    continue
                async with self.slots:
                    delay_s = await self._consume(qs)
                if delay_s is None:
                    continue
                if delay_s < 0:           # no valid lock: relock (or wait) before going on
                    if not await self._relock(qs):
                        await asyncio.sleep(RELOCK_DELAY_S)
                    continue
                await asyncio.sleep(delay_s)
        finally:
            if self.tasks.get(qs.mq) is asyncio.current_task():
                del self.tasks[qs.mq]
                self.wakeups.pop(qs.mq, None)

    async def _relock(self, qs: QueueState) -> bool:
        if qs.dropped or self.consumer.state not in ("RUNNING", "DRAINING"):
            return False
        if self.consumer.instance.brokers.master(qs.mq.broker_name) is None:
            # No master in the route: nothing to ask (a request a second per queue would only
            # fail); renew() locks the queue again as soon as the master is back.
            return False
        return qs.mq in await self.lock([qs.mq])

    async def _consume(self, qs: QueueState) -> float | None:
        """Consume while the queue allows; the pause before the next round (None: none,
        negative: relock first)."""
        c = self.consumer
        pq = qs.pq
        now = self.now_ms
        began = now()
        needs_lock = self.needs_lock
        n = self.batch_size
        stats = c.stats
        call = c.call_orderly_listener
        done_in_turn = 0
        while True:
            t = now()
            step = orderly_step(pq, began, t, needs_lock)
            if step is not OrderlyStep.CONSUME:
                if step is OrderlyStep.NEED_LOCK:
                    return -1.0
                if step is OrderlyStep.YIELD:
                    return YIELD_DELAY_S
                return None           # IDLE or STOP
            if done_in_turn >= ITEMS_PER_TURN:
                done_in_turn = 0
                await asyncio.sleep(0)
                continue
            done_in_turn += 1
            msgs = pq.take_messages(n)
            pq.in_flight += 1
            try:
                ok = await call(msgs)
            finally:
                pq.in_flight -= 1
            if ok:
                stats["consumed"] += len(msgs)
                pq.remove_head(msgs, t)
                if pq.room is not None:     # (checked here: the per-batch path)
                    self.consumer.made_room(pq)
                continue
            stats["failed"] += len(msgs)
            if await self._failed(qs, msgs):
                return self.suspend_s

    async def _failed(self, qs: QueueState, msgs: list) -> bool:
        """A failed batch: exhausted messages to the DLQ (done), the others counted and kept.
        True if something is to be consumed again (after the suspend pause)."""
        pq = qs.pq
        dead, retry = split_exhausted(msgs, self.max_reconsume_times)
        done = []
        for m in dead:
            if await self._to_dlq(qs.mq, m):
                done.append(m)
            else:
                retry.append(m)
        if done:
            pq.remove_messages(done, self.now_ms())
            if pq.room is not None:
                self.consumer.made_room(pq)
        if retry:
            pq.replace_messages([dataclasses.replace(m, reconsume_times=m.reconsume_times + 1) for m in retry])
        return bool(retry)

    async def _to_dlq(self, mq: MessageQueue, m) -> bool:
        c = self.consumer
        try:
            addr = await c.instance.master_addr_refreshing(mq.broker_name, mq.topic)
            await c.instance.api.send_back(SendBackRequest(addr, self.group, m.commit_log_offset, -1, m.msg_id,
                                                           m.topic, self.max_reconsume_times))
        except MQClientError as e:
            log.warning("%s: sending %s to the dead-letter queue failed (retrying it): %s", self.group,
                        m.msg_id, e)
            c.fetcher.report_failure(mq, e)         # a demoted master refuses it: find the new one
            return False
        c.stats["sent_back"] += 1
        log.warning("%s: %s failed %d times; sent to the dead-letter queue", self.group, m.msg_id,
                    m.reconsume_times + 1)
        return True
