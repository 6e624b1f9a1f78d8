"""Fetcher: the background pull both consumers share (asyncio shell).

One task per assigned queue (QueueState in client.subscription_state) pulls with
long polling and hands what arrives to the consumer mode (the handler). The loop
owns everything about pulling itself:

* the start offset, when the queue was added without one (asked of the handler,
  retried after pull_error_delay_ms);
* flow control: the handler's `may_fetch(qs)` is asked before every pull (push: the
  ProcessQueue thresholds; lite: paused or buffer full; orderly: also a valid queue
  lock); False waits until the consumer makes room or FLOW_CONTROL_DELAY_MS has
  passed, whichever comes first. Lite: poll() took messages or resume() unpaused the
  queue (`wake_fetcher(qs)`); push: a finished listener call left the process queue under
  its limits (the waiter is also the ProcessQueue's `room`, `wake_room`). Java only
  waits the 50 ms: a consumer that drains its buffer in less (lite poll() at 100k+
  msgs/s empties 1,000 messages in ~8 ms) then sat with nothing to consume (measured:
  25k instead of 195k msgs/s, poll cycles of 48 ms at the 99th percentile, pulls of 128,
  docs/client.md);
* which member of the queue's broker group to pull from (client/replica.py): the one
  the last pull of that queue suggested (`suggestWhichBrokerId`, kept per queue in
  `pull_nodes`), looked up again in the member table on every pull (`find_addr`: the
  consumers give their instance's subscribe_addr_refreshing), so a dead master's
  queues go on from a slave once the route drops it; a pull to a slave carries no
  commit offset. Pulls answered are counted per broker id
  (`stats["pulls_by_broker_id"]`);
* route and broker errors: a failed pull is retried after pull_error_delay_ms, and a
  subscription error re-sends the heartbeat first. A failure that is a failover signal
  (client/failover.py: the connection failed or timed out, the broker is no writable
  master) first asks the instance to refresh the routes through the queue's broker group
  at once (`request_route_refresh`, rate-limited there), so the retry finds the group's
  new master (or its slave) instead of waiting for the 30 s route timer. Failures are
  logged per broker through a FailureLog (client/log_throttle.py): the first one, a
  summary every 30 s while they go on, the recovery once; not one line per queue per
  retry. A loop stopped while its request failed stops (`_cancelling`);
* offset moved (PULL_OFFSET_MOVED): jump to the broker's next offset, the handler
  decides what to commit;
* seek: results of pulls sent before a seek (QueueState.seq changed) are dropped;
* anything unexpected (a bug in decoding or in a handler) is logged with its
  traceback and retried after the same backoff: the loop ends only when the queue
  is dropped or its task cancelled, never silently.

Handler (push and lite consumers implement it):

    may_fetch(qs) -> bool
    pull_commit_offset(qs) -> int          # offset to commit with the pull, -1 none
    async start_offset(qs) -> int
    on_found(qs, msgs, next_begin_offset)  # msgs: MessageExt list, tag-filtered
    on_no_new(qs, next_begin_offset)
    async on_offset_moved(qs, result, old_offset)
"""
from __future__ import annotations

import asyncio
import logging

from pocketmq.client.api import PULL_BODY, PullRequest, PullResult, decode_pull_body, pull_sys_flag
from pocketmq.client.errors import MQClientError, SubscriptionError
from pocketmq.client.failover import is_failover_signal
from pocketmq.client.log_throttle import FailureLog
from pocketmq.client.message import MessageExt
from pocketmq.client.process_queue import FLOW_CONTROL_DELAY_MS
from pocketmq.client.replica import MASTER_ID, PullFromWhichNode, member_pull_sys_flag
from pocketmq.client.subscription_state import QueueState, SubscriptionState
from pocketmq.protocol.message import decode_messages
from pocketmq.remoting.clock import monotonic_ms

log = logging.getLogger("pocketmq.client.consumer")

_FOUND = PullResult.FOUND
_EMPTY = (PullResult.NO_NEW_MSG, PullResult.NO_MATCHED_MSG)


def wake_room(room: asyncio.Future | None) -> None:
    """End a flow-control wait (the future _wait_for_room left in QueueState.room and, for
    push consumers, ProcessQueue.room): the pull task asks may_fetch again now."""
    if room is not None and not room.done():
        room.set_result(True)


def wake_fetcher(qs: QueueState) -> None:
    """Room in `qs`'s buffer: its pull task, if waiting on flow control, goes on now.
    Cheap when nothing waits (one attribute read)."""
    wake_room(qs.room)


def _timed_out(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(False)


async def _wait_for_room(qs: QueueState, delay_s: float) -> bool:
    """Until wake_fetcher(qs) (True) or delay_s (False), whichever comes first (no
    wait_for: one future and one timer handle)."""
    loop = asyncio.get_running_loop()
    room = qs.room = loop.create_future()
    pq = qs.pq
    if pq is not None:              # push: the workers remove messages from the process queue
        pq.room = room
    timer = loop.call_later(delay_s, _timed_out, room)
    try:
        return await room
    finally:
        timer.cancel()
        if qs.room is room:
            qs.room = None
        if pq is not None and pq.room is room:
            pq.room = None


def decode_found(body, mq, addr: str) -> list[MessageExt]:
    """A FOUND pull body -> the consumer's MessageExt list in one pass (protocol.message.
    decode_messages: no intermediate tuple per record, properties parsed on first read).
    A body with an undecodable record goes through client.api.decode_pull_body, which
    salvages the good records (logging the bad) or raises SYSTEM_ERROR for broken framing:
    what the pull itself did with such a body before."""
    bn = mq.broker_name
    try:
        return decode_messages(body, bn)
    except ValueError:
        from_raw = MessageExt.from_raw
        return [from_raw(r, bn) for r in decode_pull_body(body, mq, addr, True)]


class Fetcher:
    def __init__(self, group: str, state: SubscriptionState, handler, *, pull_batch_size: int,
                 suspend_timeout_ms: int, pull_timeout_ms: int, pull_error_delay_ms: int,
                 stats: dict | None = None, task_prefix: str = "pull", logger: logging.Logger | None = None,
                 clock=monotonic_ms):
        self.group = group
        # The consumer's own logger (pocketmq.client.consumer / pocketmq.client.lite), so the
        # pull loop's lines keep the name users filter on.
        self.log = logger or log
        self.state = state
        self.handler = handler
        self.pull_batch_size = pull_batch_size
        self.suspend_timeout_ms = suspend_timeout_ms
        self.pull_timeout_ms = pull_timeout_ms
        self.pull_error_delay_ms = pull_error_delay_ms
        self.stats = stats if stats is not None else {}
        self.stats.setdefault("pulls", 0)
        # flow-control waits begun, and those that ran the whole FLOW_CONTROL_DELAY_MS (no room made)
        self.stats.setdefault("flow_control_waits", 0)
        self.stats.setdefault("flow_control_timeouts", 0)
        # pulls answered, by the broker id of the group member that answered (0: master)
        self.stats.setdefault("pulls_by_broker_id", {})
        # topic route refreshes made at once for this consumer's failed requests (client/failover.py)
        self.stats.setdefault("route_refreshes_on_failure", 0)
        self.task_prefix = task_prefix
        self.instance = None        # set by the consumer's start()
        # (broker_name, topic, broker_id) -> (addr, broker_id) of the member to pull from; set
        # by the consumer's start() (its instance's subscribe_addr_refreshing). None: the
        # master only (instance.master_addr_refreshing), for a bare Fetcher.
        self.find_addr = None
        # (broker_names, topic=, stats=) -> refresh those routes now: set by the consumer's
        # start() (its instance's request_route_refresh). None: no refresh, for a bare Fetcher.
        self.request_route_refresh = None
        self.pull_nodes = PullFromWhichNode()    # the broker id each queue's last pull suggested
        # Per broker: the first failure, periodic summaries, the recovery (not a line per retry).
        self.clock = clock          # ms, for the failure log only
        self.pull_failures = FailureLog("pull")
        self.start_offset_failures = FailureLog("start offset lookup")

    # -- failure logging (the decisions are FailureLog's) ----------------------------------
    def _log_failure(self, line, exc_info: bool = False) -> None:
        if line is not None:
            self.log.log(line[0], "%s: %s", self.group, line[1], exc_info=exc_info)

    def _failed(self, failures: FailureLog, mq, error: BaseException, detail: str = "") -> None:
        """One failure of `mq`'s loop; an error that is no MQClientError is a bug: its traceback goes along."""
        reason = f"{detail}{error}" if str(error) else f"{detail}{type(error).__name__}"
        line = failures.failed(mq.broker_name, _item(mq), reason, type(error).__name__, self.clock())
        self._log_failure(line, exc_info=not isinstance(error, MQClientError))

    def report_failure(self, mq, error: BaseException) -> None:
        """A request for `mq` failed (a pull, a start offset lookup; the push consumer's
        send-backs too): when that says its broker may no longer be the group's master (or
        is gone), have the routes through the group refreshed now."""
        refresh = self.request_route_refresh
        if refresh is not None and is_failover_signal(error):
            refresh((mq.broker_name,), topic=mq.topic, stats=self.stats)

    def _recovered(self, failures: FailureLog, mq) -> None:
        self._log_failure(failures.succeeded(mq.broker_name, _item(mq), self.clock()))

    def _forget(self, qs: QueueState) -> None:
        """`qs` is no longer pulled: an episode of failures it was part of may end, and its
        pull suggestion goes (the table holds the queues being pulled only)."""
        mq, now = qs.mq, self.clock()
        self.pull_nodes.forget(mq)
        for failures in (self.pull_failures, self.start_offset_failures):
            self._log_failure(failures.forget(mq.broker_name, _item(mq), now))

    # -- tasks ----------------------------------------------------------------------------
    def start(self, qs: QueueState) -> None:
        """(Re)start the pull task of `qs` (a seek restarts it: a held pull is abandoned; a failure
        episode it is part of goes on with the new task)."""
        if qs.task is not None:
            qs.task.cancel()
        mq = qs.mq
        qs.task = asyncio.create_task(self._run(qs),
                                      name=f"{self.group}:{self.task_prefix}:{mq.topic}:{mq.broker_name}:{mq.queue_id}")

    def cancel(self, qs: QueueState) -> None:
        if qs.task is not None:
            qs.task.cancel()
        self._forget(qs)

    async def stop(self, qs: QueueState) -> None:
        self._forget(qs)
        task, qs.task = qs.task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def stop_all(self) -> None:
        tasks = []
        for qs in self.state.assignment.values():
            self._forget(qs)
            if qs.task is not None:
                qs.task.cancel()
                tasks.append(qs.task)
                qs.task = None
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _master_addr(self, broker_name: str, topic: str, broker_id: int) -> tuple[str, int]:
        return await self.instance.master_addr_refreshing(broker_name, topic), MASTER_ID

    # -- the loop -------------------------------------------------------------------------
    async def _start_offset(self, qs: QueueState) -> None:
        delay_s = self.pull_error_delay_ms / 1000
        failing = self.start_offset_failures
        failed = failing.failing_item(qs.mq.broker_name, _item(qs.mq))
        while qs.pull_offset < 0 and not qs.dropped:
            try:
                off = await self.handler.start_offset(qs)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if _cancelling():
                    raise asyncio.CancelledError from e
                failed = True
                self._failed(failing, qs.mq, e)
                self.report_failure(qs.mq, e)
                await asyncio.sleep(delay_s)
                continue
            if failed:
                failed = False
                self._recovered(failing, qs.mq)
            if qs.pull_offset < 0:          # a seek may have happened meanwhile
                qs.pull_offset = off
                qs.consume_offset = off

    async def _run(self, qs: QueueState) -> None:
        if qs.pull_offset < 0:
            await self._start_offset(qs)
        inst = self.instance
        pull = inst.api.pull_message
        handler = self.handler
        may_fetch = handler.may_fetch
        mq = qs.mq
        group = self.group
        bn = mq.broker_name
        sub = self.state.subscriptions.get(mq.topic)
        if sub is None:
            # unsubscribed meanwhile (lite): the next rebalance drops the queue
            self.log.info("%s: %s no longer subscribed; not pulling it", group, mq)
            return
        accept = self.state.filters.get(mq.topic)
        batch = self.pull_batch_size
        suspend_ms = self.suspend_timeout_ms
        timeout_s = self.pull_timeout_ms / 1000
        delay_s = self.pull_error_delay_ms / 1000
        flow_delay_s = FLOW_CONTROL_DELAY_MS / 1000
        stats = self.stats
        by_broker_id = stats["pulls_by_broker_id"]
        nodes = self.pull_nodes
        find_addr = self.find_addr or self._master_addr
        topic = mq.topic
        # A restarted task (seek) carries on a failure episode of its queue.
        failures = int(self.pull_failures.failing_item(bn, _item(mq)))
        while not qs.dropped:
            if not may_fetch(qs):
                stats["flow_control_waits"] += 1
                if not await _wait_for_room(qs, flow_delay_s):
                    stats["flow_control_timeouts"] += 1
                continue
            commit = handler.pull_commit_offset(qs)
            seq = qs.seq
            offset = qs.pull_offset
            try:
                addr, broker_id = await find_addr(bn, topic, nodes.recalculate(mq))
                res = await pull(PullRequest(addr, group, mq, offset, batch,
                                             member_pull_sys_flag(pull_sys_flag(commit > 0, True, True), broker_id),
                                             max(commit, 0), suspend_ms, sub.sub_string, sub.sub_version,
                                             timeout_s, sub.expression_type, PULL_BODY))
                msgs = decode_found(res.body, mq, addr) if res.status == _FOUND else None
            except MQClientError as e:
                if qs.dropped or _cancelling():
                    break
                failures += 1
                self._failed(self.pull_failures, mq, e, f"at offset {offset}: ")
                self.report_failure(mq, e)
                if isinstance(e, SubscriptionError):
                    await inst.heartbeat_all()
                await asyncio.sleep(delay_s)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as e:
                # A bug must not silently end this queue's pulling (rebalance would not restart it).
                if qs.dropped:
                    break
                failures += 1
                self._failed(self.pull_failures, mq, e, f"at offset {offset}, unexpectedly: ")
                await asyncio.sleep(delay_s)
                continue
            if failures:
                failures = 0
                self._recovered(self.pull_failures, mq)
            stats["pulls"] += 1
            by_broker_id[broker_id] = by_broker_id.get(broker_id, 0) + 1
            if qs.dropped:
                break               # (and its suggestion is forgotten: not recorded now)
            nodes.update(mq, res.suggest_which_broker_id)
            if seq != qs.seq:
                continue                    # seek() moved the queue while we were pulling
            try:
                status = res.status
                nbo = res.next_begin_offset
                if status == _FOUND:
                    handler.on_found(qs, msgs if accept is None else [m for m in msgs if accept(m)], nbo)
                elif status in _EMPTY:
                    handler.on_no_new(qs, nbo)
                else:  # OFFSET_ILLEGAL
                    self.log.warning("%s: offset %d of %s illegal (min %d, max %d); moving to %d", group,
                                offset, mq, res.min_offset, res.max_offset, nbo)
                    await handler.on_offset_moved(qs, res, offset)
                if seq == qs.seq:
                    qs.pull_offset = nbo
            except asyncio.CancelledError:
                raise
            except Exception:
                # The position stays: the same messages are pulled again (at least once).
                self.log.exception("%s: handling the pull result of %s@%d failed unexpectedly", group, mq, offset)
                await asyncio.sleep(delay_s)


def _cancelling() -> bool:
    """Whether this task was asked to stop while its request failed. On 3.11
    asyncio.wait_for (the connect in remoting.client) can swallow a cancellation that races
    a refused connect and raise the connect's error instead: a loop that caught that error
    must stop, not retry (a stopped queue's loop went on pulling, and Fetcher.stop_all,
    so a consumer's close(), waited for its next long poll, or forever)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _item(mq) -> str:
    """A queue as FailureLog names it within its broker."""
    return f"{mq.topic}:{mq.queue_id}"
