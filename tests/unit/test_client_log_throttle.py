"""A broker down for 55 s under a consumer of 4 queues: a handful of log lines, not one
per queue per retry (FailureLog, client/log_throttle.py, and the Fetcher's use of it).
Integer clocks; no sockets, no sleeps."""
from __future__ import annotations

import asyncio
import logging

import pytest

from pocketmq.client.api import PullResult
from pocketmq.client.errors import RemotingFailure
from pocketmq.client.fetcher import Fetcher
from pocketmq.client.log_throttle import FailureLog
from pocketmq.client.subscription_state import SubscriptionState
from pocketmq.protocol.bodies import MessageQueue

INFO, WARNING = logging.INFO, logging.WARNING


def run_outage(log: FailureLog, *, queues: int, down_ms: int, retry_ms: int = 1000) -> list[tuple[int, str]]:
    """Every queue retries each `retry_ms` while the broker is down, then succeeds."""
    lines = []
    now = 0
    while now < down_ms:
        for q in range(queues):
            line = log.failed("broker-a", f"T:{q}", "connection refused", "RemotingFailure", now + q)
            if line:
                lines.append(line)
        now += retry_ms
    for q in range(queues):
        line = log.succeeded("broker-a", f"T:{q}", now + q)
        if line:
            lines.append(line)
    return lines


def test_55_seconds_down_with_4_queues_is_a_handful_of_lines():
    lines = run_outage(FailureLog("pull"), queues=4, down_ms=55_000)
    assert [level for level, _ in lines] == [INFO, WARNING, WARNING]
    first, summary, recovery = (text for _, text in lines)
    assert first.startswith("pull from broker-a failed (T:0): connection refused")
    assert summary == ("pull from broker-a still failing after 30 s: 121 failures, 4 queue(s); "
                       "last: connection refused")
    assert recovery == "pull from broker-a works again after 55 s (220 failures)"


def test_a_short_failure_logs_its_start_and_end_at_info():
    log = FailureLog("pull")
    assert run_outage(log, queues=2, down_ms=2000) == [
        (INFO, "pull from broker-a failed (T:0): connection refused; while it keeps failing, "
               "a summary every 30 s"),
        (INFO, "pull from broker-a works again after 2.0 s (4 failures)")]
    # over: the next failure starts a new episode
    assert log.failed("broker-a", "T:0", "timeout", "RequestTimeoutError", 5000)[0] == INFO


def test_recovery_waits_for_every_failing_queue_and_is_logged_once():
    log = FailureLog("pull", summary_interval_ms=10_000)
    log.failed("b", "T:0", "down", "E", 0)
    log.failed("b", "T:1", "down", "E", 1)
    assert log.succeeded("b", "T:0", 2) is None          # T:1 still failing
    assert log.succeeded("b", "T:2", 3) is None          # never failed
    assert log.succeeded("b", "T:1", 4)[1] == "pull from b works again after 0.0 s (2 failures)"
    assert log.succeeded("b", "T:1", 5) is None          # once
    assert not log.failing("b")


def test_another_kind_of_error_is_a_state_change():
    log = FailureLog("pull")
    log.failed("b", "T:0", "connection refused", "RemotingFailure", 0)
    assert log.failed("b", "T:0", "connection refused", "RemotingFailure", 1000) is None
    level, text = log.failed("b", "T:0", "no permission", "NoPermissionError", 2000)
    assert level == INFO and text == "pull from b now fails with another error (T:0): no permission"


def test_brokers_are_separate_and_a_dropped_queue_ends_an_episode():
    log = FailureLog("pull")
    assert log.failed("a", "T:0", "x", "E", 0) is not None
    assert log.failed("b", "T:0", "x", "E", 0) is not None
    assert log.failing_item("a", "T:0") and not log.failing_item("a", "T:1")
    assert log.forget("a", "T:1", 10) is None
    assert log.forget("a", "T:0", 10) == (INFO, "pull from a: no failing queue is left "
                                                "(1 failures in 0.0 s)")
    assert not log.failing("a") and log.failing("b")
    with pytest.raises(ValueError):
        FailureLog("pull", summary_interval_ms=0)


# ---------------------------------------------------------------------------
# the Fetcher's wiring: four pull loops against a broker that is down for 55 s


class Clock:
    def __init__(self):
        self.ms = 0

    def __call__(self) -> int:
        return self.ms


class DownBroker:
    """The instance the Fetcher pulls through. Each pull takes 250 ms of the fake clock, so
    4 queues retry about once a second; after `down_ms`, pulls answer NO_NEW_MSG and are
    then held (like a long poll) so the loops stop."""

    def __init__(self, clock: Clock, down_ms: int, queues: int):
        self.clock = clock
        self.down_ms = down_ms
        self.api = self
        self.recovered: set[int] = set()
        self.all_recovered = asyncio.Event()
        self.queues = queues
        self.attempts = 0

    async def master_addr_refreshing(self, broker_name: str, topic: str) -> str:
        return "10.0.0.1:10911"

    async def pull_message(self, req):
        self.clock.ms += 250
        self.attempts += 1
        if self.clock.ms <= self.down_ms:
            raise RemotingFailure("cannot connect to 10.0.0.1:10911: connection refused")
        if req.mq.queue_id in self.recovered:
            await asyncio.Event().wait()       # a held pull, until the task is cancelled
        self.recovered.add(req.mq.queue_id)
        if len(self.recovered) == self.queues:
            self.all_recovered.set()
        return PullResult(PullResult.NO_NEW_MSG, req.offset, 0, req.offset, [])


class Handler:
    def may_fetch(self, qs):
        return True

    def pull_commit_offset(self, qs):
        return -1

    def on_no_new(self, qs, next_begin_offset):
        pass


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[tuple[int, str]] = []

    def emit(self, record):
        self.lines.append((record.levelno, record.getMessage()))


async def test_fetcher_logs_an_outage_of_4_queues_in_3_lines():
    clock = Clock()
    logger = logging.getLogger("test.fetcher.outage")
    captured = Lines()
    logger.addHandler(captured)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    state = SubscriptionState()
    state.subscribe("T", "*", 0)
    fetcher = Fetcher("G", state, Handler(), pull_batch_size=32, suspend_timeout_ms=15000, pull_timeout_ms=30000,
                      pull_error_delay_ms=0, logger=logger, clock=clock)
    fetcher.instance = broker = DownBroker(clock, down_ms=55_000, queues=4)
    try:
        for q in range(4):
            fetcher.start(state.add(MessageQueue("T", "broker-a", q), pull_offset=0))
        async with asyncio.timeout(30):
            await broker.all_recovered.wait()
        await fetcher.stop_all()
    finally:
        logger.removeHandler(captured)
    assert broker.attempts >= 220                        # every queue retried about once a second
    assert [level for level, _ in captured.lines] == [INFO, WARNING, WARNING], captured.lines
    first, summary, recovery = (text for _, text in captured.lines)
    assert first.startswith("G: pull from broker-a failed (T:0): at offset 0: cannot connect")
    assert summary.startswith("G: pull from broker-a still failing after 30 s:") and "4 queue(s)" in summary
    assert recovery.startswith("G: pull from broker-a works again after 5")    # 55-56 s of fake time


# -- the offset store's commits and the rebalancer's rounds log through FailureLog too -----

class _DownBroker:
    """An instance whose broker answers every offset commit with a failure while `down`."""

    def __init__(self):
        self.down = True
        self.api = self

    async def master_addr_refreshing(self, broker_name, topic):
        return "127.0.0.1:1"

    async def update_consumer_offset(self, addr, group, mq, offset, oneway=False):
        if self.down:
            raise RemotingFailure("connect to 127.0.0.1:1 refused")


async def test_offset_commits_to_a_down_broker_log_a_few_lines(caplog):
    from pocketmq.client.offset_store import RemoteOffsetStore
    inst, now = _DownBroker(), [0]
    store = RemoteOffsetStore(inst, "G", clock=lambda: now[0])
    mqs = [MessageQueue("T", "broker-a", q) for q in range(4)]
    caplog.set_level(logging.INFO, logger="pocketmq.client.offset")
    for second in range(55):                        # a commit round every second, 55 s down
        now[0] = second * 1000
        for i, mq in enumerate(mqs):
            store.update(mq, second + i + 1)
        assert await store.persist() == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines                   # the first failure, one 30 s summary
    assert "offset commit to broker-a failed" in lines[0] and "121 failures, 4 queue(s)" in lines[1]
    inst.down = False
    now[0] = 56_000
    assert await store.persist() == 4               # the dirty offsets went on the first success
    assert [r.getMessage() for r in caplog.records][2:] == [
        "G: offset commit to broker-a works again after 56 s (220 failures)"]


class _NoRouteInstance:
    """A client instance that cannot reach the nameserver (every route lookup fails)."""

    client_id = "cid-a"
    routes: dict = {}

    async def subscribe_queues(self, topic, refresh=False):
        raise RemotingFailure("connect to 127.0.0.1:9876 refused")

    def rebalance_now(self):
        pass


async def test_rebalance_failures_log_a_few_lines_and_forget_unsubscribed_topics(caplog):
    from pocketmq.client.rebalance import AllocateAveragely
    from pocketmq.client.rebalancer import Rebalancer

    async def nothing(mqs):
        pass
    state = SubscriptionState()
    state.subscribe("T", "*", 0)
    reb = Rebalancer("G", state, message_model="CLUSTERING", allocate_strategy=AllocateAveragely(),
                     handover_delay_ms=0, running=lambda: True, add_queues=nothing, remove_queues=nothing)
    reb.instance = _NoRouteInstance()
    now = [0]
    reb.clock = lambda: now[0]
    caplog.set_level(logging.INFO, logger="pocketmq.client.consumer")
    try:
        for second in range(40):                    # a round a second, the nameserver down 40 s
            now[0] = second * 1000
            await reb.rebalance()
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2, lines               # the first failure, one 30 s summary
        assert lines[0].startswith("rebalance of G failed (T): connect to 127.0.0.1:9876 refused")
        assert "31 failures, 1 topic(s)" in lines[1]
        state.unsubscribe("T")
        await reb.rebalance()
        assert caplog.records[-1].getMessage() == "rebalance of G: no failing topic is left (40 failures in 39 s)"
        assert not reb.failures.failing("G")
    finally:
        reb.cancel()
