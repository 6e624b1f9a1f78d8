"""Client failover without sockets (client/failover.py and its callers): which failures are
failover signals, the per-topic rate limit on the route refreshes they cause, the
instance refreshing every topic through the failed broker group, the producer's retry
going to the new master, and the pull loop moving to it. The nameserver and brokers are
fakes answering at once (ClientInstance.api); tests await events, never sleep."""
import asyncio
import contextlib
import time
from types import SimpleNamespace

import pytest

from pocketmq.client import instance as instance_mod
from pocketmq.client.errors import (
    BrokerSystemError,
    MessageIllegalError,
    NoPermissionError,
    NoRouteError,
    RemotingFailure,
    RequestTimeoutError,
    ServiceNotAvailableError,
    SystemBusyError,
    error_for,
)
from pocketmq.client.failover import IN_SYNC_REPLICAS_NOT_ENOUGH, RefreshLimiter, is_failover_signal
from pocketmq.client.fetcher import Fetcher
from pocketmq.client.instance import ClientInstance
from pocketmq.client.message import Message, SendStatus
from pocketmq.client.producer import Producer
from pocketmq.client.replica import BrokerChanges
from pocketmq.client.route import BrokerAddrTable
from pocketmq.client.subscription_state import SubscriptionState
from pocketmq.protocol.bodies import BrokerData, MessageQueue, QueueData, TopicRouteData
from pocketmq.protocol.codes import ResponseCode
from tests.support.events import Waiters

OLD, NEW, OTHER = "10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"
ISR = "in-sync replicas not enough"


# -- the signal --------------------------------------------------------------------------------------

@pytest.mark.parametrize("error", [
    RemotingFailure("cannot connect to 10.0.0.1:10911: connection refused"),
    RemotingFailure("connection reset (10.0.0.1:10911)"),
    RequestTimeoutError("no response in 3.0 s"),
    error_for(ResponseCode.SERVICE_NOT_AVAILABLE, "slave: no sends"),
    error_for(ResponseCode.SLAVE_NOT_AVAILABLE, "slave not available"),
    error_for(ResponseCode.SYSTEM_ERROR, ISR),
    error_for(ResponseCode.SYSTEM_ERROR, "In-Sync Replicas Not Enough"),
], ids=repr)
def test_failed_connections_and_not_a_writable_master_answers_are_failover_signals(error):
    assert is_failover_signal(error)


@pytest.mark.parametrize("error", [
    NoRouteError("No route info of this topic: T"),
    error_for(ResponseCode.SYSTEM_ERROR, "request queueId[9] is illegal"),
    error_for(ResponseCode.SYSTEM_ERROR, None),
    error_for(ResponseCode.MESSAGE_ILLEGAL, "body too long"),
    error_for(ResponseCode.SYSTEM_BUSY, "broker busy"),
    error_for(ResponseCode.NO_PERMISSION, "sending message is forbidden"),
    error_for(ResponseCode.TOPIC_NOT_EXIST, "topic[T] not exist"),
    error_for(ResponseCode.FLUSH_DISK_TIMEOUT, ""),
    ValueError("a bug"),
], ids=repr)
def test_errors_of_the_message_or_the_topic_are_not(error):
    assert not is_failover_signal(error)


def test_send_status_codes_are_read_with_their_remark():
    assert is_failover_signal(ResponseCode.SLAVE_NOT_AVAILABLE)          # stored: a status, no exception
    assert is_failover_signal(ResponseCode.SERVICE_NOT_AVAILABLE, "x")
    assert is_failover_signal(ResponseCode.SYSTEM_ERROR, f"put failed: {IN_SYNC_REPLICAS_NOT_ENOUGH}")
    for code in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.FLUSH_SLAVE_TIMEOUT):
        assert not is_failover_signal(code)
    assert not is_failover_signal(ResponseCode.SYSTEM_ERROR) and not is_failover_signal(ResponseCode.SYSTEM_ERROR, None)
    # the exception classes those codes map to are not what decides
    assert isinstance(error_for(ResponseCode.SYSTEM_ERROR, "x"), BrokerSystemError)
    assert {type(e) for e in (error_for(14), error_for(13), error_for(16), error_for(2))} == {
        ServiceNotAvailableError, MessageIllegalError, NoPermissionError, SystemBusyError}


# -- the rate limit (pure) -------------------------------------------------------------------------------

def test_a_topic_is_refreshed_once_at_a_time_and_at_most_once_per_interval():
    lim = RefreshLimiter(300)
    assert lim.request(["T", "U"]) == 2 and lim.request(["T"]) == 0       # joined, not queued
    assert lim.take_due(1000) == (["T", "U"], None)
    assert lim.request(["T"]) == 1                                         # while in flight: one follow-up
    assert lim.request(["T"] * 50) == 0
    assert lim.take_due(1050) == ([], None)                                # in flight: not again
    lim.finished(["T", "U"])
    assert lim.take_due(1100) == ([], 200)                                 # 300 ms after the last start
    assert lim.take_due(1300) == (["T"], None)
    lim.finished(["T"])
    assert not lim.pending and not lim.in_flight


def test_the_limiter_forgets_start_times_older_than_the_interval():
    lim = RefreshLimiter(300)
    for i in range(1000):
        lim.request([f"T{i}"])
        due, _ = lim.take_due(i * 1000)
        lim.finished(due)
    assert len(lim.last_start) == 1 and not lim.pending


# -- the member table: a master that moved ----------------------------------------------------------------

def route(groups: dict, queues: int = 2) -> TopicRouteData:
    """{brokerName: {brokerId: addr}} -> a route with `queues` read/write queues per group."""
    return TopicRouteData([QueueData(name, queues, queues, 6) for name in groups],
                          [BrokerData("c", name, dict(addrs)) for name, addrs in groups.items()])


def test_a_promoted_slave_is_a_moved_master():
    table = BrokerAddrTable()
    table.update(route({"broker-a": {0: OLD, 1: NEW}}))
    moved = table.update(route({"broker-a": {0: NEW, 1: OLD}}))
    assert moved == BrokerChanges(masters_moved=frozenset({"broker-a"})) and moved
    assert table.master("broker-a") == NEW
    # through a route without master: lost, then back (not moved)
    assert table.update(route({"broker-a": {1: OLD}})).masters_lost == {"broker-a"}
    back = table.update(route({"broker-a": {0: OTHER}}))
    assert back.masters_back == {"broker-a"} and not back.masters_moved


# -- the instance and the producer ----------------------------------------------------------------------

class Cluster:
    """ClientInstance.api: a nameserver answering `routes[topic]` ({brokerName: {brokerId:
    addr}}) and brokers answering sends by address: `answers[addr]` is a response code
    (with `remark`) or an exception; none means SUCCESS. Route requests wait for `gate`
    when it is set."""

    def __init__(self, routes: dict):
        self.routes = routes
        self.route_requests: list[tuple[str, float]] = []
        self.answers: dict = {}
        self.remark = ""
        self.sends: list[str] = []
        self.pulls: list[str] = []
        self.pulled_new = asyncio.Event()
        self.gate: asyncio.Future | None = None
        self.changes = Waiters()

    def topics_routed(self) -> list[str]:
        return [t for t, _ in self.route_requests]

    async def get_route(self, topic):
        self.route_requests.append((topic, time.monotonic()))
        self.changes.check()
        if self.gate is not None:
            await self.gate
        groups = self.routes.get(topic)
        return None if groups is None else route(groups)

    async def heartbeat(self, addr, body, timeout_s=None):
        pass

    async def send_message(self, addr, ext, body, *, batch, timeout_s, oneway=False):
        self.sends.append(addr)
        self.changes.check()
        answer = self.answers.get(addr, ResponseCode.SUCCESS)
        if isinstance(answer, BaseException):
            raise answer
        if answer not in (ResponseCode.SUCCESS, ResponseCode.SLAVE_NOT_AVAILABLE):
            raise error_for(answer, self.remark, addr)
        return SimpleNamespace(code=answer, remark=None,
                               ext_fields={"msgId": "ID", "queueId": ext["e"], "queueOffset": str(len(self.sends))})

    async def pull_message(self, req):
        self.pulls.append(req.addr)
        self.changes.check()
        answer = self.answers.get(req.addr)
        if isinstance(answer, BaseException):
            raise answer
        if req.addr == NEW:
            self.pulled_new.set()
        await asyncio.Future()          # a held long poll


class Consumer:
    """A consumer as the instance sees it: its topics, master changes heard."""

    def __init__(self, topics):
        self._topics = set(topics)
        self.changes = []

    def topics(self):
        return self._topics

    def consumer_data(self):
        return None

    def masters_changed(self, lost, back):
        self.changes.append((set(lost), set(back)))


def _instance(api, consumer=None) -> ClientInstance:
    inst = ClientInstance("127.0.0.1@failover-test", "127.0.0.1:9876")
    inst.api = api
    inst.started = True             # as after start(), without its timers
    if consumer is not None:
        inst.consumers["CG"] = consumer
    return inst


def _producer(inst, **kw) -> Producer:
    p = Producer("PG", "127.0.0.1:9876", **kw)
    p.instance = inst
    inst.producers["PG"] = p
    return p


def _failover(api, topic="T"):
    """broker-a's slave NEW is promoted; OLD, demoted, refuses sends as a slave does."""
    api.routes[topic]["broker-a"] = {0: NEW, 1: OLD}
    api.answers[OLD] = ResponseCode.SERVICE_NOT_AVAILABLE


@contextlib.asynccontextmanager
async def sending(routes: dict | None = None, **producer_options):
    """(api, instance, producer) once the producer sent one message (to OLD, broker-a's
    master; NEW is its slave unless `routes` says otherwise); bounded by 5 s."""
    api = Cluster(routes or {"T": {"broker-a": {0: OLD, 1: NEW}}})
    inst = _instance(api)
    p = _producer(inst, **producer_options)
    try:
        async with asyncio.timeout(5):
            await p.send(Message("T", b"before"))
            yield api, inst, p
    finally:
        await inst.close()


async def test_a_send_answered_service_not_available_refreshes_at_once_and_the_retry_goes_to_the_new_master():
    async with sending() as (api, inst, p):
        _failover(api)
        before = len(api.route_requests)
        t0 = time.monotonic()
        r = await p.send(Message("T", b"after"))
        assert time.monotonic() - t0 < 1.0               # not the 30 s route timer
        assert api.sends == [OLD, OLD, NEW]              # refused by the old master, retried on the new
        assert r.status is SendStatus.SEND_OK and r.queue.broker_name == "broker-a"
        assert api.topics_routed()[before:] == ["T"]     # one refresh, before the retry
        assert p.stats["route_refreshes_on_failure"] == 1 and inst.stats["route_refreshes_on_failure"] == 1
        assert inst.brokers.master("broker-a") == NEW
        await p.send(Message("T", b"next"))
        assert api.sends[-1] == NEW and not p._failed_over


async def test_without_retries_the_send_fails_and_the_next_send_goes_to_the_new_master():
    async with sending(retry_times_when_send_failed=0) as (api, inst, p):
        _failover(api)
        api.gate = asyncio.get_running_loop().create_future()     # the nameserver is slow
        with pytest.raises(ServiceNotAvailableError):
            await p.send(Message("T", b"refused"))
        # the next send waits for the refresh the failure asked for instead of going to OLD again
        nxt = asyncio.create_task(p.send(Message("T", b"next")))
        await api.changes.until(lambda: len(api.route_requests) == 2)
        assert not nxt.done() and api.sends == [OLD, OLD]
        api.gate.set_result(None)
        r = await nxt
        assert api.sends == [OLD, OLD, NEW] and r.status is SendStatus.SEND_OK


async def test_a_group_whose_master_moved_takes_sends_again_at_once():
    """The failed send is retried on the other group (as before); once the route shows
    broker-a's new master, the fault recorded against its old one (10 minutes of
    avoidance) is forgotten and sends spread over both groups again."""
    async with sending({"T": {"broker-a": {0: OLD, 1: NEW}, "broker-b": {0: OTHER}}}) as (api, inst, p):
        for i in range(3):
            await p.send(Message("T", b"before"))
        assert set(api.sends) == {OLD, OTHER}
        _failover(api)
        sent = len(api.sends)
        while OLD not in api.sends[sent:]:          # round robin: the next send to broker-a
            await p.send(Message("T", b"x"))
        assert api.sends[-1] == OTHER               # its retry went to the other group
        await inst._refresh_task                    # the refresh the failure asked for
        assert inst.brokers.master("broker-a") == NEW
        sent = len(api.sends)
        for i in range(4):
            await p.send(Message("T", b"after"))
        assert set(api.sends[sent:]) == {NEW, OTHER}


@pytest.mark.parametrize("failure", [RemotingFailure("cannot connect to 10.0.0.1:10911: connection refused"),
                                     RequestTimeoutError("send to 10.0.0.1:10911: no response in 3 s"),
                                     error_for(ResponseCode.SYSTEM_ERROR, ISR)], ids=repr)
async def test_a_connection_failure_a_timeout_or_too_few_replicas_make_the_retry_find_the_new_master(failure):
    async with sending() as (api, inst, p):
        api.routes["T"] = {"broker-a": {0: NEW}}
        api.answers[OLD] = failure
        r = await p.send(Message("T", b"after"))
        assert api.sends == [OLD, OLD, NEW] and r.status is SendStatus.SEND_OK
        assert p.stats["route_refreshes_on_failure"] == 1


async def test_a_lost_broker_connection_refreshes_at_once():
    async with sending() as (api, inst, p):
        api.routes["T"] = {"broker-a": {0: NEW}}
        inst.remoting._closed(SimpleNamespace(attrs={"addr": OLD}))   # what ClientRemoting hears
        await inst._refresh_task
        assert inst.brokers.master("broker-a") == NEW and inst.stats["route_refreshes_on_failure"] == 1
        assert p.stats["route_refreshes_on_failure"] == 0                 # no failure of this producer


async def test_a_send_stored_without_replica_is_not_resent_but_refreshes_the_route():
    async with sending({"T": {"broker-a": {0: OLD}}}) as (api, inst, p):
        api.answers[OLD] = ResponseCode.SLAVE_NOT_AVAILABLE
        r = await p.send(Message("T", b"stored"))
        assert r.status is SendStatus.SLAVE_NOT_AVAILABLE and api.sends == [OLD, OLD]
        await api.changes.until(lambda: len(api.route_requests) == 2)
        await inst._refresh_task
        assert p.stats["route_refreshes_on_failure"] == 1


async def test_a_failure_refreshes_every_topic_through_that_broker_group_only():
    api = Cluster({"T": {"broker-a": {0: OLD}, "broker-b": {0: OTHER}},
                   "%RETRY%CG": {"broker-a": {0: OLD}},
                   "U": {"broker-b": {0: OTHER}}})
    consumer = Consumer({"T", "%RETRY%CG", "U"})
    inst = _instance(api, consumer)
    try:
        async with asyncio.timeout(5):
            for t in ("T", "%RETRY%CG", "U"):
                await inst.update_route(t)
            before = len(api.route_requests)
            for t in ("%RETRY%CG", "T"):
                api.routes[t]["broker-a"] = {0: NEW}
            stats = {}
            fut = inst.request_route_refresh(("broker-a",), topic="T", stats=stats)
            inst.request_route_refresh(("broker-a",), stats=stats)     # joins: counted once
            await fut
            await inst._refresh_task
        assert sorted(api.topics_routed()[before:]) == ["%RETRY%CG", "T"]      # not U
        assert stats == {"route_refreshes_on_failure": 2}
        assert inst.brokers.master("broker-a") == NEW
        # a moved master is one that left and came back, for consumers (orderly ones relock)
        assert consumer.changes == [({"broker-a"}, {"broker-a"})]
    finally:
        await inst.close()


async def test_many_failures_of_a_dead_broker_make_few_route_requests():
    """A dead master under a consumer of 8 queues: every pull fails at once and is retried
    at once (pull_error_delay_ms=0), thousands of failures a second; the nameserver sees
    one refresh per topic at a time and at most one start per interval."""
    interval_s = instance_mod.ROUTE_REFRESH_AFTER_FAILURE_MIN_INTERVAL_S
    assert 0.2 <= interval_s <= 0.5
    api = Cluster({"T": {"broker-a": {0: OLD}}, "%RETRY%CG": {"broker-a": {0: OLD}}})
    api.answers[OLD] = RemotingFailure("cannot connect to 10.0.0.1:10911: connection refused")
    inst = _instance(api, Consumer({"T", "%RETRY%CG"}))
    fetcher, state = _fetcher(inst, pull_error_delay_ms=0)
    try:
        for t in ("T", "%RETRY%CG"):
            await inst.update_route(t)
        before = len(api.route_requests)
        t0 = time.monotonic()
        for q in range(8):
            fetcher.start(state.add(MessageQueue("T", "broker-a", q), pull_offset=0))
        async with asyncio.timeout(10):
            await api.changes.until(lambda: len(api.route_requests) - before >= 8)
        elapsed = time.monotonic() - t0
    finally:
        await fetcher.stop_all()
        await inst.close()
    failures = len(api.pulls)
    requests = api.route_requests[before:]
    assert failures >= 50 * len(requests), (failures, len(requests))
    # each topic: one at a time (the fake answers at once), starts at least the interval apart
    for topic in ("T", "%RETRY%CG"):
        starts = [at for t, at in requests if t == topic]
        assert len(starts) >= 3 and starts[0] - t0 < interval_s      # the first at once
        assert all(b - a >= interval_s * 0.95 for a, b in zip(starts, starts[1:])), starts
    assert elapsed >= 3 * interval_s * 0.95
    # the consumer counts each refresh made for its failures once, not each failure
    assert len(requests) - 2 <= fetcher.stats["route_refreshes_on_failure"] <= len(requests)


def _fetcher(inst, pull_error_delay_ms=1000) -> tuple[Fetcher, SubscriptionState]:
    """A Fetcher wired to `inst` as a consumer's start() wires it."""
    class Handler:
        def may_fetch(self, qs):
            return True

        def pull_commit_offset(self, qs):
            return -1

    state = SubscriptionState()
    state.subscribe("T", "*", 1)
    f = Fetcher("CG", state, Handler(), pull_batch_size=32, suspend_timeout_ms=15000, pull_timeout_ms=30000,
                pull_error_delay_ms=pull_error_delay_ms)
    f.instance = inst
    f.find_addr = inst.subscribe_addr_refreshing
    f.request_route_refresh = inst.request_route_refresh
    return f, state


async def test_a_pull_from_a_dead_master_refreshes_and_the_next_pull_goes_to_the_new_master():
    api = Cluster({"T": {"broker-a": {0: OLD, 1: NEW}}})
    inst = _instance(api, Consumer({"T"}))
    fetcher, state = _fetcher(inst)              # the default 1 s pull error delay
    try:
        await inst.update_route("T")
        api.routes["T"] = {"broker-a": {0: NEW}}
        api.answers[OLD] = RemotingFailure("connection reset (10.0.0.1:10911)")
        t0 = time.monotonic()
        fetcher.start(state.add(MessageQueue("T", "broker-a", 0), pull_offset=0))
        async with asyncio.timeout(5):
            await api.pulled_new.wait()
        assert time.monotonic() - t0 < 3.0           # the error delay, not the 30 s timer
        assert api.pulls == [OLD, NEW] and api.topics_routed()[1:] == ["T"]
        assert fetcher.stats["route_refreshes_on_failure"] == 1
    finally:
        await fetcher.stop_all()
        await inst.close()


async def test_a_pull_loop_stopped_while_its_connect_fails_stops():
    """On 3.11 a cancelled connect that is refused at the same moment raises the refusal
    instead of CancelledError (asyncio.wait_for): the stopped pull loop must still end, or
    stop_all (a consumer's close) waits for its next long poll (a broker restarting
    around a close: found by test_a_dead_broker_failing_every_pull_makes_few_route_requests)."""
    class SwallowingConnect(Cluster):
        async def pull_message(self, req):
            self.pulls.append(req.addr)
            self.changes.check()
            try:
                await asyncio.Future()
            except asyncio.CancelledError:
                if len(self.pulls) > 1:
                    raise
                raise RemotingFailure(f"cannot connect to {req.addr}: connection refused") from None

    api = SwallowingConnect({"T": {"broker-a": {0: OLD}}})
    inst = _instance(api, Consumer({"T"}))
    fetcher, state = _fetcher(inst, pull_error_delay_ms=0)
    try:
        await inst.update_route("T")
        fetcher.start(state.add(MessageQueue("T", "broker-a", 0), pull_offset=0))
        async with asyncio.timeout(5):
            await api.changes.until(lambda: len(api.pulls) == 1)
            await fetcher.stop_all()
        assert api.pulls == [OLD]
    finally:
        await inst.close()


def test_the_blocking_producer_shows_its_counters_as_a_copy():
    from pocketmq.client import sync
    p = sync.Producer("PG", "127.0.0.1:9876")
    stats = p.stats
    assert stats == {"route_refreshes_on_failure": 0}
    stats["route_refreshes_on_failure"] = 5
    assert p.impl.stats["route_refreshes_on_failure"] == 0
