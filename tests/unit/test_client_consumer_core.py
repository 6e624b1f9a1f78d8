"""The consumer core without sockets: Fetcher (the shared pull loop), Rebalancer,
SubscriptionState and the typed consumer configs. Fake instances answer at once;
the tests await events, never sleep."""
import asyncio

import pytest

from pocketmq.client import errors
from pocketmq.client.api import PULL_BODY, PullResult
from pocketmq.client.consumer_config import LitePullConsumerConfig, PushConsumerConfig
from pocketmq.client.fetcher import Fetcher
from pocketmq.client.lite_pull_consumer import LitePullConsumer
from pocketmq.client.push_consumer import PushConsumer
from pocketmq.client.rebalance import AllocateAveragely
from pocketmq.client.rebalancer import Rebalancer
from pocketmq.client.subscription_state import SubscriptionState
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import MessageQueue

MQ = MessageQueue("T", "broker-a", 0)


def _body(*offsets, tags="A"):
    host = (bytes([127, 0, 0, 1]), 1)
    return b"".join(msgcodec.encode_record("T", 0, 0, b"m%d" % o, msgcodec.encode_properties({"TAGS": tags}),
                                           0, 1, host, host, 0, 0, o, 100 + o, 2) for o in offsets)


def _found_result(nbo, mn, mx, body):
    """A FOUND PullResult as the real api gives it in either mode (records decoded, or the
    body undecoded for raw=PULL_BODY: FakeAPI picks what the request asked for)."""
    return PullResult(PullResult.FOUND, nbo, mn, mx, msgcodec.decode_records_raw(body), 0, body)


class FakeAPI:
    """pull_message answers from a script: a PullResult, an exception to raise, or a Future
    to wait on; when the script ends the pull waits forever (a held long poll)."""

    def __init__(self, script):
        self.script = list(script)
        self.offsets = []
        self.exhausted = asyncio.Event()

    async def pull_message(self, req):
        self.offsets.append(req.offset)
        if not self.script:
            self.exhausted.set()
            await asyncio.Future()
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, asyncio.Future):
            item = await item
        if item.status == PullResult.FOUND and req.raw == PULL_BODY:
            return PullResult(item.status, item.next_begin_offset, item.min_offset, item.max_offset, [],
                              item.suggest_which_broker_id, item.body)
        return item


class FakeInstance:
    client_id = "cid-a"

    def __init__(self, script=(), queues=(), cids=()):
        self.api = FakeAPI(script)
        self.routes = {"T": object()}
        self.queues = list(queues)
        self.cids = list(cids)
        self.heartbeats = 0
        self.rebalance_requests = 0

    async def master_addr_refreshing(self, broker_name, topic):
        return "b:1"

    async def heartbeat_all(self):
        self.heartbeats += 1

    async def subscribe_queues(self, topic, refresh=False):
        return [q for q in self.queues if q.topic == topic]

    async def consumer_id_list(self, group, topic):
        return list(self.cids)

    def rebalance_now(self):
        self.rebalance_requests += 1


class Handler:
    def __init__(self, fail_found_once=False):
        self.found = []
        self.moved = []
        self.fail_found_once = fail_found_once
        self.allowed = True

    def may_fetch(self, qs):
        return self.allowed

    def pull_commit_offset(self, qs):
        return -1

    async def start_offset(self, qs):
        return 0

    def on_found(self, qs, msgs, nbo):
        if self.fail_found_once:
            self.fail_found_once = False
            raise RuntimeError("bug in the handler")
        self.found.extend(m.queue_offset for m in msgs)

    def on_no_new(self, qs, nbo):
        pass

    async def on_offset_moved(self, qs, res, old):
        self.moved.append((old, res.next_begin_offset))


def _fetcher(state, handler, inst):
    f = Fetcher("G", state, handler, pull_batch_size=32, suspend_timeout_ms=1000, pull_timeout_ms=2000,
                pull_error_delay_ms=0)
    f.instance = inst
    return f


def _state(expression="*"):
    state = SubscriptionState()
    state.subscribe("T", expression, 1)
    return state


def _found(nbo, *offsets):
    return _found_result(nbo, 0, nbo, _body(*offsets))


async def test_fetcher_survives_bugs_in_pulling_and_in_handling_and_keeps_the_position():
    inst = FakeInstance([RuntimeError("bug in pull"), _found(2, 0, 1), _found(2, 0, 1),
                         PullResult(PullResult.NO_NEW_MSG, 2, 0, 2, [])])
    state, handler = _state(), Handler(fail_found_once=True)
    f = _fetcher(state, handler, inst)
    qs = state.add(MQ)
    f.start(qs)
    async with asyncio.timeout(5):
        await inst.api.exhausted.wait()
    # 0: raised; 0: found but the handler raised, so pulled again; 0: found; 2: nothing new; 2: held
    assert inst.api.offsets == [0, 0, 0, 2, 2]
    assert handler.found == [0, 1] and qs.pull_offset == 2
    assert not qs.task.done()
    assert f.stats["pulls"] == 3
    await f.stop_all()
    assert qs.task is None


async def test_fetcher_drops_a_result_pulled_before_a_seek():
    held = asyncio.get_running_loop().create_future()
    inst = FakeInstance([held, _found(12, 10, 11)])
    state, handler = _state(), Handler()
    f = _fetcher(state, handler, inst)
    qs = state.add(MQ, pull_offset=0)
    f.start(qs)
    while not inst.api.offsets:
        await asyncio.sleep(0)
    qs.seek(10)
    held.set_result(_found(5, 0, 1, 2, 3, 4))
    async with asyncio.timeout(5):
        await inst.api.exhausted.wait()
    assert inst.api.offsets == [0, 10, 12]
    assert handler.found == [10, 11]
    await f.stop_all()


async def test_fetcher_offset_moved_tag_filter_subscription_error_and_drop():
    moved = PullResult(PullResult.OFFSET_ILLEGAL, 50, 50, 60, [])
    mixed = _found_result(53, 50, 60, _body(50, tags="A") + _body(51, tags="B") + _body(52, tags="C"))
    inst = FakeInstance([moved, errors.error_for(24, "no sub"), mixed])
    state, handler = _state("A || C"), Handler()
    f = _fetcher(state, handler, inst)
    qs = state.add(MQ, pull_offset=7)
    f.start(qs)
    async with asyncio.timeout(5):
        await inst.api.exhausted.wait()
    assert handler.moved == [(7, 50)]
    assert inst.heartbeats == 1                       # a subscription error re-sends the heartbeat
    assert handler.found == [50, 52]                  # B filtered out on the client
    assert inst.api.offsets == [7, 50, 50, 53]
    task = qs.task
    state.remove(MQ)
    assert qs.dropped
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_rebalancer_allocates_keeps_on_unknown_membership_and_removes_stale_topics():
    queues = [MessageQueue("T", "broker-a", i) for i in range(4)]
    inst = FakeInstance(queues=queues, cids=["cid-a", "cid-b"])
    state = _state()
    added, removed = [], []

    async def add(mqs):
        added.append(sorted(q.queue_id for q in mqs))
        for mq in mqs:
            state.add(mq)

    async def remove(mqs):
        removed.append(sorted(q.queue_id for q in mqs))
        for mq in mqs:
            state.remove(mq)
    r = Rebalancer("G", state, message_model="CLUSTERING", allocate_strategy=AllocateAveragely(),
                   handover_delay_ms=0, running=lambda: True, add_queues=add, remove_queues=remove)
    r.instance = inst
    await r.rebalance()
    assert added == [[0, 1]] and removed == []
    inst.cids = ["cid-a"]
    await r.rebalance()
    assert added == [[0, 1], [2, 3]]
    inst.cids = ["cid-b"]                             # the broker has not seen our heartbeat
    await r.rebalance()
    assert len(state.assignment) == 4 and inst.heartbeats == 1 and removed == []
    r.cancel()
    inst.cids = ["cid-a", "cid-b", "cid-c"]
    await r.rebalance()
    assert removed == [[2, 3]]
    state.unsubscribe("T")
    await r.rebalance()
    assert removed == [[2, 3], [0, 1]] and not state.assignment
    r.cancel()


def test_queue_state_seek_and_drop():
    state = _state()
    qs = state.add(MQ, pull_offset=5)
    qs.buffer.extend([1, 2])
    qs.seek(9)
    assert (qs.pull_offset, qs.consume_offset, qs.seq, list(qs.buffer)) == (9, 9, 1, [])
    other = state.add(MessageQueue("T", "broker-a", 1))
    assert state.remove(MQ, other) is None and MQ in state.assignment   # only if still that state
    assert state.remove(MQ, qs) is qs and qs.dropped
    state.subscribe_default("%RETRY%G", 1)
    assert state.filters["%RETRY%G"] is None and state.topics() == {"T", "%RETRY%G"}


def test_push_consumer_options_as_keywords_or_config():
    c = PushConsumer("G", "ns:1", listener=print, pull_batch_size=64, consume_from_where="FIRST_OFFSET")
    assert c.config == PushConsumerConfig(pull_batch_size=64, consume_from_where="FIRST_OFFSET")
    assert (c.pull_batch_size, c.consume_from_where, c.suspend_timeout_ms) == (64, "FIRST_OFFSET", 15000)
    cfg = PushConsumerConfig(message_model="BROADCASTING", consume_concurrency=3)
    c = PushConsumer("G", "ns:1", listener=print, config=cfg, consume_concurrency=4)
    assert (c.message_model, c.consume_concurrency) == ("BROADCASTING", 4)    # keywords win
    assert c.config.message_model == "BROADCASTING"
    for bad in ({"consume_concurrency": 0}, {"pull_batch_size": 2000}, {"message_model": "X"},
                {"consume_from_where": "NOW"}, {"pull_timeout_ms": 100, "suspend_timeout_ms": 100},
                {"consume_timeout_min": 0}, {"consume_timeout_min": -1}):
        with pytest.raises(errors.InvalidArgumentError):
            PushConsumer("G", "ns:1", listener=print, **bad)
    with pytest.raises(TypeError):
        PushConsumer("G", "ns:1", listener=print, no_such_option=1)
    # consume timeout: Java's 15 min; checked every min(timeout, 60 s)
    c = PushConsumer("G", "ns:1", listener=print)
    assert (c.consume_timeout_ms, c.expire_check_interval_s()) == (900_000, 60.0)
    c = PushConsumer("G", "ns:1", listener=print, consume_timeout_min=0.01)
    assert (c.consume_timeout_ms, c.expire_check_interval_s()) == (600, 0.6)
    with pytest.raises(errors.InvalidArgumentError):
        PushConsumer("G", "ns:1", listener=print, config=LitePullConsumerConfig())


def test_lite_consumer_options_as_keywords_or_config():
    c = LitePullConsumer("G", "ns:1", max_poll_records=3)
    assert (c.max_poll_records, c.pull_batch_size, c.suspend_timeout_ms, c.auto_commit) == (3, 128, 20000, True)
    c = LitePullConsumer("G", "ns:1", config=LitePullConsumerConfig(auto_commit=False, pull_batch_size=5000))
    assert (c.auto_commit, c.pull_batch_size) == (False, 5000)
    with pytest.raises(errors.InvalidArgumentError):
        LitePullConsumer("G", "ns:1", max_poll_records=0)
