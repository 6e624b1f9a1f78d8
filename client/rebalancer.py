"""Rebalancer: the group rebalance both consumers share (asyncio shell over client.rebalance).

One round (every 20 s from the ClientInstance timer, and at once when the broker says
the group changed), per subscribed topic: the readable queues from the route, the
group's client ids from a broker (clustering), the pure plan (client.rebalance.plan),
then the consumer mode's hooks carry it out:

    async remove_queues(mqs)   # stop, commit, forget (push waits for its listeners)
    async add_queues(mqs)      # start offset and a pull task; a true result means some
                               # could not be taken yet (orderly: locked by another member)

A topic without a route yet, or a group list without us (the broker has not seen our
heartbeat), keeps what is held and is retried after 1, 2, 4, 8, 16 s (RouteRetry)
instead of waiting for the timer. Queues taken over while other members exist are
added after `handover_delay_ms`, so the previous owner's commit lands first. Queues
of topics no longer subscribed are removed at the end of the round.

The assignment itself lives in SubscriptionState. The orderly push consumer locks
queues in its add_queues hook and unlocks them in remove_queues; queues it could not
lock yet (the previous owner has not released them) are retried like a missing route.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pocketmq.client.errors import MQClientError
from pocketmq.client.log_throttle import FailureLog
from pocketmq.client.rebalance import AllocateStrategy, plan_broadcasting, plan_clustering
from pocketmq.client.subscription_state import SubscriptionState
from pocketmq.common.constants import is_retry_topic
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.remoting.clock import monotonic_ms

log = logging.getLogger("pocketmq.client.consumer")


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


async def compute_pull_from_where(instance, offset_store, mq: MessageQueue,
                                  consume_from_where: str, consume_timestamp_ms: int) -> int:
    """Java RebalancePushImpl.computePullFromWhere: the broker's offset if the group has
    one, else LAST (max offset; 0 for retry topics) / FIRST (0) / TIMESTAMP (search). The
    queue bounds are read from the master, else a slave (they replicate the same queue)."""
    last = await offset_store.read_store(mq)
    if last >= 0:
        return last
    if is_retry_topic(mq.topic):
        return 0
    if consume_from_where == "FIRST_OFFSET":
        return 0
    addr, _ = await instance.admin_addr_refreshing(mq.broker_name, mq.topic)
    if consume_from_where == "TIMESTAMP":
        return await instance.api.search_offset(addr, mq, consume_timestamp_ms)
    return await instance.api.max_offset(addr, mq)


class Rebalancer:
    def __init__(self, group: str, state: SubscriptionState, *, message_model: str,
                 allocate_strategy: AllocateStrategy, handover_delay_ms: int,
                 running: Callable[[], bool],
                 add_queues: Callable[[list], Awaitable[None]],
                 remove_queues: Callable[[list], Awaitable[None]]):
        self.group = group
        self.state = state
        self.message_model = message_model
        self.allocate_strategy = allocate_strategy
        self.handover_delay_ms = handover_delay_ms
        self.running = running
        self.add_queues = add_queues
        self.remove_queues = remove_queues
        self.instance = None          # set by the consumer's start()
        self.lock = asyncio.Lock()    # one round at a time; also held by drain/reset
        self.route_retry = RouteRetry()
        # a round is retried soon after a failure: while it keeps failing (a broker or the
        # nameserver down) log the first failure, a summary now and then, the recovery
        self.clock = monotonic_ms
        self.failures = FailureLog("rebalance", via="of", unit="topic")

    async def rebalance(self) -> None:
        if not self.running():
            return
        async with self.lock:
            if not self.running():
                return
            missing = False
            for topic in self.failures.failing_items(self.group) - self.state.subscriptions.keys():
                self._log(self.failures.forget(self.group, topic, self.clock()))    # unsubscribed
            for topic in list(self.state.subscriptions):
                try:
                    missing |= await self._rebalance_topic(topic)
                    self._log(self.failures.succeeded(self.group, topic, self.clock()))
                except MQClientError as e:
                    self._log(self.failures.failed(self.group, topic, f"{e} (retrying soon)",
                                                   type(e).__name__, self.clock()))
                    missing = True
                if not self.running():
                    return
            stale = self.state.stale()
            if stale:
                await self.remove_queues(stale)
            self.route_retry.schedule(missing, self.instance.rebalance_now)

    def _log(self, line) -> None:
        if line is not None:
            log.log(line[0], "%s", line[1])

    async def _rebalance_topic(self, topic: str) -> bool:
        """One topic's round; True when it should be retried soon (no route / not listed yet)."""
        inst = self.instance
        mq_all = await inst.subscribe_queues(topic, refresh=topic not in inst.routes)
        if not mq_all:
            return True
        held = self.state.assignment
        if self.message_model == "CLUSTERING":
            cids = await inst.consumer_id_list(self.group, topic)
            if inst.client_id not in cids:
                # The broker has not seen our heartbeat yet: keep what we have.
                log.info("%s: %s not yet in the consumer list %s", self.group, inst.client_id, cids)
                await inst.heartbeat_all()
                return True
            plan = plan_clustering(topic, self.group, inst.client_id, mq_all, cids, held,
                                   self.allocate_strategy)
            alone = len(cids) == 1
        else:
            plan = plan_broadcasting(topic, mq_all, held)
            alone = True
        if plan.changed:
            log.info("%s: rebalance %s: -%s +%s", self.group, topic,
                     [m.queue_id for m in plan.to_remove], [m.queue_id for m in plan.to_add])
        if plan.to_remove:
            await self.remove_queues(list(plan.to_remove))
        if plan.to_add and not alone and self.handover_delay_ms > 0:
            # Let the previous owners commit what they consumed before we read the offsets.
            await asyncio.sleep(self.handover_delay_ms / 1000)
            if not self.running():
                return False
        if plan.to_add and self.running():
            return bool(await self.add_queues(list(plan.to_add)))
        return False

    def cancel(self) -> None:
        self.route_retry.cancel()
