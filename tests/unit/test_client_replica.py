"""Master/slave broker groups on the client side, without sockets: the member rules
(client/replica.py), the member table's changes (client/route.py), the pull loop
following each queue's suggestion, offsets while a group has no master, the instance's
reactions to route changes and lost connections, and orderly queues without master.
Fakes answer at once; the tests await events, never sleep."""
import asyncio

import pytest

from pocketmq.client import instance as instance_mod
from pocketmq.client.api import PullResult
from pocketmq.client.consume_orderly import OrderlyService
from pocketmq.client.errors import NoRouteError
from pocketmq.client.fetcher import Fetcher
from pocketmq.client.instance import ClientInstance
from pocketmq.client.offset_store import RemoteOffsetStore
from pocketmq.client.process_queue import ProcessQueue
from pocketmq.client.replica import (
    BrokerChanges,
    PullFromWhichNode,
    find_broker_address_in_admin,
    find_broker_address_in_subscribe,
    member_pull_sys_flag,
)
from pocketmq.client.route import BrokerAddrTable, publish_info, subscribe_queues
from pocketmq.client.subscription_state import SubscriptionState
from pocketmq.protocol.bodies import BrokerData, MessageQueue, QueueData, TopicRouteData
from pocketmq.protocol.codes import PullSysFlag

M, S, S2 = "10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"


def route(groups: dict, queues: int = 4) -> TopicRouteData:
    """A route of topic T: {brokerName: {brokerId: addr}}, `queues` read/write queues each."""
    return TopicRouteData([QueueData(name, queues, queues, 6) for name in groups],
                          [BrokerData("c", name, dict(addrs)) for name, addrs in groups.items()])


# -- the rules ----------------------------------------------------------------------------------

def test_subscribe_takes_the_suggested_member_else_the_master_else_the_lowest_id():
    group = {0: M, 1: S, 2: S2}
    assert find_broker_address_in_subscribe(group, 1) == (S, 1)
    assert find_broker_address_in_subscribe(group, 0) == (M, 0)
    assert find_broker_address_in_subscribe(group, 7) == (M, 0)          # no such member: the master
    assert find_broker_address_in_subscribe({2: S2, 1: S}, 0) == (S, 1)  # dead master: the lowest slave
    assert find_broker_address_in_subscribe({}, 0) is None


def test_admin_takes_the_master_else_the_lowest_id():
    assert find_broker_address_in_admin({1: S, 0: M}) == (M, 0)
    assert find_broker_address_in_admin({2: S2, 1: S}) == (S, 1)
    assert find_broker_address_in_admin({}) is None


def test_a_pull_to_a_slave_carries_no_commit_offset():
    flag = PullSysFlag.COMMIT_OFFSET | PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION
    assert member_pull_sys_flag(flag, 0) == flag
    assert member_pull_sys_flag(flag, 1) == PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION
    assert member_pull_sys_flag(PullSysFlag.SUSPEND, 2) == PullSysFlag.SUSPEND


def test_pull_from_which_node_is_per_queue_and_forgets_a_queue():
    q0, q1 = MessageQueue("T", "broker-a", 0), MessageQueue("T", "broker-a", 1)
    nodes = PullFromWhichNode()
    assert nodes.recalculate(q0) == 0                 # the master until told otherwise
    nodes.update(q0, 1)
    assert (nodes.recalculate(q0), nodes.recalculate(q1)) == (1, 0)
    nodes.update(q0, 0)
    assert nodes.recalculate(q0) == 0
    nodes.update(q1, 1)
    nodes.forget(q1)
    nodes.forget(q1)
    assert nodes.recalculate(q1) == 0 and list(nodes.table) == [q0]


def test_member_table_reports_new_addresses_and_masters_lost_and_back():
    table = BrokerAddrTable()
    first = table.update(route({"broker-a": {0: M, 1: S}, "broker-b": {0: "b:1"}}))
    # a group seen for the first time neither lost nor regained a master
    assert first == BrokerChanges(frozenset({M, S, "b:1"}), frozenset(), frozenset())
    assert not table.update(route({"broker-a": {0: M, 1: S}}))           # nothing changed: falsy
    dead = table.update(route({"broker-a": {1: S}}))
    assert dead == BrokerChanges(frozenset(), frozenset({"broker-a"}), frozenset())
    assert table.master("broker-a") is None and table.any_addr("broker-a") == S
    assert table.master("broker-b") == "b:1"                              # groups not named: kept
    back = table.update(route({"broker-a": {0: M, 1: S, 2: S2}}))
    assert back == BrokerChanges(frozenset({M, S2}), frozenset(), frozenset({"broker-a"}))
    assert table.find_broker_address_in_subscribe("broker-a", 2) == (S2, 2)
    assert table.find_broker_address_in_admin("broker-a") == (M, 0)
    assert table.find_broker_address_in_admin("nope") is None


def test_a_group_without_master_takes_no_sends_but_stays_readable():
    r = route({"broker-a": {1: S}, "broker-b": {0: "b:1", 1: "b:2"}}, queues=2)
    assert [(q.broker_name, q.queue_id) for q in publish_info("T", r).queues] == [("broker-b", 0), ("broker-b", 1)]
    assert [(q.broker_name, q.queue_id) for q in subscribe_queues("T", r)] == [
        ("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)]


# -- the pull loop (client/fetcher.py) ---------------------------------------------------------------

class Members:
    """The member table and lookup a consumer's instance gives its Fetcher."""

    def __init__(self, addrs: dict):
        self.table = BrokerAddrTable()
        self.table.update(route({"broker-a": addrs}))

    async def find(self, broker_name, topic, broker_id):
        found = self.table.find_broker_address_in_subscribe(broker_name, broker_id)
        if found is None:
            raise NoRouteError(broker_name)
        return found


class PullAPI:
    """Answers each queue's pulls NO_NEW_MSG with the next suggestion of its script; a
    queue whose script ended waits (a held long poll)."""

    def __init__(self, scripts: dict):
        self.scripts = {q: list(s) for q, s in scripts.items()}
        self.pulls: dict[int, list] = {q: [] for q in scripts}
        self.waiting: set[int] = set()
        self.all_waiting = asyncio.Event()
        self.api = self

    async def pull_message(self, req):
        qid = req.mq.queue_id
        self.pulls[qid].append((req.addr, req.sys_flag, req.commit_offset))
        script = self.scripts[qid]
        if not script:
            self.waiting.add(qid)
            if self.waiting == set(self.scripts):
                self.all_waiting.set()
            await asyncio.Future()
        return PullResult(PullResult.NO_NEW_MSG, req.offset, 0, req.offset, [], script.pop(0))


class CommitHandler:
    def may_fetch(self, qs):
        return True

    def pull_commit_offset(self, qs):
        return 7

    def on_no_new(self, qs, next_begin_offset):
        pass


def _fetcher(api, members) -> tuple[Fetcher, SubscriptionState]:
    state = SubscriptionState()
    state.subscribe("T", "*", 1)
    f = Fetcher("G", state, CommitHandler(), pull_batch_size=32, suspend_timeout_ms=1000, pull_timeout_ms=2000,
                pull_error_delay_ms=0)
    f.instance = api
    f.find_addr = members.find
    return f, state


WITH_COMMIT = PullSysFlag.COMMIT_OFFSET | PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION
WITHOUT_COMMIT = PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION


async def test_fetcher_follows_each_queues_suggestion_and_never_commits_through_a_slave():
    api = PullAPI({0: [1, 1, 0], 1: [0, 0]})
    f, state = _fetcher(api, Members({0: M, 1: S}))
    for q in (0, 1):
        f.start(state.add(MessageQueue("T", "broker-a", q), pull_offset=0))
    async with asyncio.timeout(5):
        await api.all_waiting.wait()
    # queue 0: told to read from the slave twice, then back to the master; queue 1 stays
    assert api.pulls[0] == [(M, WITH_COMMIT, 7), (S, WITHOUT_COMMIT, 7), (S, WITHOUT_COMMIT, 7),
                            (M, WITH_COMMIT, 7)]
    assert api.pulls[1] == [(M, WITH_COMMIT, 7)] * 3
    assert f.stats["pulls_by_broker_id"] == {0: 3, 1: 2} and f.stats["pulls"] == 5
    await f.stop_all()
    assert f.pull_nodes.table == {}                  # stopped queues leave the table


async def test_fetcher_pulls_from_a_slave_while_the_group_has_no_master():
    api = PullAPI({0: [0, 0]})
    members = Members({1: S, 2: S2})                  # the master left the route
    f, state = _fetcher(api, members)
    f.start(state.add(MessageQueue("T", "broker-a", 0), pull_offset=0))
    async with asyncio.timeout(5):
        await api.all_waiting.wait()
    assert api.pulls[0] == [(S, WITHOUT_COMMIT, 7)] * 3
    assert f.stats["pulls_by_broker_id"] == {1: 2}
    await f.stop_all()


# -- offsets (client/offset_store.py) ----------------------------------------------------------------

class OffsetBrokers:
    """An instance whose admin lookup follows a member table; offsets are recorded per address."""

    def __init__(self, addrs: dict):
        self.brokers = BrokerAddrTable()
        self.brokers.update(route({"broker-a": addrs}))
        self.api = self
        self.commits: list[tuple[str, int]] = []
        self.stored = {M: 3, S: 5}

    async def admin_addr_refreshing(self, broker_name, topic):
        return self.brokers.find_broker_address_in_admin(broker_name)

    async def update_consumer_offset(self, addr, group, mq, offset, oneway=False):
        self.commits.append((addr, offset))

    async def query_consumer_offset(self, addr, group, mq):
        return self.stored[addr]


async def test_offsets_go_to_a_slave_without_master_and_again_to_the_master_once_it_is_back():
    inst = OffsetBrokers({1: S})
    store = RemoteOffsetStore(inst, "G", find_addr=inst.admin_addr_refreshing)
    mq = MessageQueue("T", "broker-a", 0)
    assert await store.read_store(mq) == 5            # the slave answers the query
    store.update(mq, 10)
    assert await store.persist() == 1
    assert await store.persist([mq]) == 1             # on a slave only: sent again
    assert inst.commits == [(S, 10), (S, 10)]
    inst.brokers.update(route({"broker-a": {0: M, 1: S}}))
    assert await store.persist() == 1                 # the master is back: it gets the offset
    assert await store.persist() == 0 and await store.persist([mq]) == 0
    assert inst.commits == [(S, 10), (S, 10), (M, 10)]
    assert await store.read_store(mq) == 3
    store.remove(mq)
    assert not store.table.dirty


# -- the instance (client/instance.py): route changes and lost connections ------------------------

class NamesrvAndBrokers:
    """ClientInstance.api for a nameserver whose routes the test sets and brokers whose
    heartbeats wait until the test releases them."""

    def __init__(self, groups: dict):
        self.groups = groups
        self.route_requests = 0
        self.routed = asyncio.Event()
        self.heartbeats: list[str] = []
        self.heartbeat_arrived = asyncio.Event()
        self.release = asyncio.get_running_loop().create_future()
        self.gate: asyncio.Future | None = None      # when set, route requests wait for it

    async def get_route(self, topic):
        self.route_requests += 1
        self.routed.set()
        if self.gate is not None:
            await self.gate
        return route(self.groups)

    async def heartbeat(self, addr, body, timeout_s=None):
        self.heartbeats.append(addr)
        self.heartbeat_arrived.set()
        await self.release


class Registered:
    """A consumer as the instance sees it."""

    def __init__(self):
        self.changes = []

    def topics(self):
        return {"T"}

    def consumer_data(self):
        return None

    def masters_changed(self, lost, back):
        self.changes.append((set(lost), set(back)))


def _consumer_instance(groups: dict) -> tuple[ClientInstance, NamesrvAndBrokers, Registered]:
    """An instance with one consumer whose brokers answer heartbeats at once."""
    consumer = Registered()
    api = NamesrvAndBrokers(groups)
    api.release.set_result(None)
    return _instance(api, consumer=consumer), api, consumer


def _instance(api, *, producer: bool = True, consumer=None) -> ClientInstance:
    inst = ClientInstance("127.0.0.1@test", "127.0.0.1:9876")
    inst.api = api
    inst.started = True          # as after start(), without its timers
    if producer:
        inst.producers["PG"] = object()
    if consumer is not None:
        inst.consumers["CG"] = consumer
    return inst


async def test_a_new_address_gets_a_heartbeat_at_once_in_the_background_one_task_at_most():
    api = NamesrvAndBrokers({"broker-a": {0: M}})
    inst = _instance(api)
    try:
        async with asyncio.timeout(5):
            await inst.update_route("T")              # returns while the heartbeat still waits
            await api.heartbeat_arrived.wait()
            assert api.heartbeats == [M]
            task = inst._hb_task
            api.groups = {"broker-a": {0: M, 1: S}, "broker-b": {0: "b:1"}}
            await inst.update_route("T")
            await inst.update_route("T")
            assert inst._hb_task is task and inst._hb_pending == {S, "b:1"}   # joined, not piled up
            api.heartbeat_arrived.clear()
            api.release.set_result(None)
            await task
        # a producer heartbeats masters only; every address was sent once
        assert api.heartbeats == [M, "b:1"] and not inst._hb_pending
    finally:
        await inst.close()


async def test_no_heartbeat_at_once_without_clients_or_before_start():
    api = NamesrvAndBrokers({"broker-a": {0: M}})
    inst = _instance(api, producer=False)             # an admin tool's instance
    try:
        await inst.update_route("T")
        assert inst._hb_task is None and api.heartbeats == []
    finally:
        await inst.close()


async def test_consumers_hear_when_a_master_leaves_and_comes_back():
    inst, api, consumer = _consumer_instance({"broker-a": {0: M, 1: S}})
    try:
        await inst.update_route("T")
        api.groups = {"broker-a": {1: S}}
        await inst.update_route("T")
        assert (await inst.admin_addr_refreshing("broker-a", "T")) == (S, 1)
        assert (await inst.subscribe_addr_refreshing("broker-a", "T", 0)) == (S, 1)
        api.groups = {"broker-a": {0: M, 1: S}}
        await inst.update_route("T")
        assert consumer.changes == [({"broker-a"}, set()), (set(), {"broker-a"})]
        with pytest.raises(NoRouteError):
            await inst.admin_addr_refreshing("broker-z", "T")
    finally:
        await inst.close()


class _Conn:
    def __init__(self, addr):
        self.attrs = {"addr": addr}


async def test_a_lost_broker_connection_refreshes_the_routes_at_once_and_failures_do_not_pile_up(monkeypatch):
    monkeypatch.setattr(instance_mod, "ROUTE_REFRESH_AFTER_FAILURE_MIN_INTERVAL_S", 0)
    inst, api, consumer = _consumer_instance({"broker-a": {0: M, 1: S}})
    try:
        await inst.update_route("T")
        api.routed.clear()
        before = api.route_requests
        inst.remoting._closed(_Conn("127.0.0.1:9876"))      # the nameserver's: no refresh
        inst.remoting._closed(_Conn("10.9.9.9:1"))          # not a broker we know
        assert inst._refresh_task is None
        api.groups = {"broker-a": {1: S}}                    # the nameserver dropped the dead master
        api.gate = asyncio.get_running_loop().create_future()
        inst.remoting._closed(_Conn(M))
        task = inst._refresh_task
        async with asyncio.timeout(5):
            await api.routed.wait()                          # the refresh began at once
            for _ in range(5):                               # every pull of every queue failing meanwhile
                inst.remoting._closed(_Conn(M))
            assert inst._refresh_task is task
            api.gate.set_result(None)
            await task
        # one refresh at once, one more for the failures that came while it ran
        assert api.route_requests - before == 2
        assert inst.brokers.master("broker-a") is None and consumer.changes == [({"broker-a"}, set())]
    finally:
        await inst.close()


# -- orderly queues without master (client/consume_orderly.py) ----------------------------------------

class LockBroker:
    """The instance an orderly consumer locks through: the member table, LOCK_BATCH_MQ answers."""

    client_id = "127.0.0.1@c1"

    def __init__(self, addrs: dict):
        self.brokers = BrokerAddrTable()
        self.brokers.update(route({"broker-a": addrs, "broker-b": {0: "b:1"}}))
        self.api = self
        self.lock_requests: list[str] = []

    async def master_addr_refreshing(self, broker_name, topic):
        addr = self.brokers.master(broker_name)
        if addr is None:
            raise NoRouteError(f"broker {broker_name} has no master")
        return addr

    async def lock_batch(self, addr, group, client_id, mqs):
        self.lock_requests.append(addr)
        return list(mqs)


class OrderlyConsumer:
    group = "G"
    message_model = "CLUSTERING"
    max_reconsume_times = None
    suspend_current_queue_time_ms = 0
    consume_batch_size = 1
    consume_concurrency = 1
    state = "RUNNING"

    def __init__(self, instance):
        self.instance = instance
        self.subscription_state = SubscriptionState()
        self.given_up = []

    async def give_up_queues(self, mqs):
        self.given_up.extend(mqs)


async def test_orderly_queues_stop_without_master_stay_held_and_relock_when_it_is_back():
    inst = LockBroker({0: M, 1: S})
    c = OrderlyConsumer(inst)
    svc = OrderlyService(c)
    now = [1_000]
    svc.now_ms = lambda: now[0]
    qa = c.subscription_state.add(MessageQueue("T", "broker-a", 0), 0, ProcessQueue(0))
    qb = c.subscription_state.add(MessageQueue("T", "broker-b", 0), 0, ProcessQueue(0))
    for qs in (qa, qb):
        qs.pq.set_locked(now[0])
    inst.brokers.update(route({"broker-a": {1: S}}))
    svc.masters_changed({"broker-a"}, set())
    assert not qa.pq.holds_lock(now[0]) and qb.pq.holds_lock(now[0])   # only the masterless group stops
    assert not await svc._relock(qa) and inst.lock_requests == []     # nothing asked while no master
    await svc.renew()
    assert inst.lock_requests == ["b:1"] and c.given_up == []          # kept: not refused, only unreachable
    assert not qa.pq.locked and not svc._renew_now.is_set()
    inst.brokers.update(route({"broker-a": {0: M, 1: S}}))
    svc.masters_changed(set(), {"broker-a"})
    assert svc._renew_now.is_set()                                     # the renewal runs now, not in 20 s
    await svc.renew()
    assert qa.pq.holds_lock(now[0]) and c.given_up == []


async def test_orderly_renewal_that_cannot_reach_a_master_leaves_the_lock_to_expire():
    inst = LockBroker({0: M, 1: S})
    c = OrderlyConsumer(inst)
    svc = OrderlyService(c)
    svc.now_ms = lambda: 1_000
    qa = c.subscription_state.add(MessageQueue("T", "broker-a", 0), 0, ProcessQueue(0))
    qa.pq.set_locked(1_000)

    async def down(addr, group, client_id, mqs):
        from pocketmq.client.errors import RemotingFailure
        raise RemotingFailure(f"cannot connect to {addr}")
    inst.lock_batch = down
    await svc.renew()
    # the route still has the master (a hiccup, or not refreshed yet): Java's rule, the local
    # lock runs out by itself; nothing given up
    assert qa.pq.holds_lock(1_000) and c.given_up == []


def test_the_blocking_consumers_show_their_counters_as_a_copy():
    from pocketmq.client.sync import LitePullConsumer as BlockingLite
    from pocketmq.client.sync import PushConsumer as BlockingPush
    c = BlockingPush("G", "127.0.0.1:9876", listener=print)
    snap = c.stats
    assert snap["pulls"] == 0 and snap["pulls_by_broker_id"] == {}
    c.impl.stats["pulls_by_broker_id"][1] = 3
    assert c.stats["pulls_by_broker_id"] == {1: 3}
    snap["pulls_by_broker_id"][0] = 9                 # the caller's copy, not the consumer's table
    assert c.impl.stats["pulls_by_broker_id"] == {1: 3}
    assert BlockingLite("L", "127.0.0.1:9876").stats["pulls_by_broker_id"] == {}
