"""The metadata sync's shell (broker/services/slave_sync.py) over a fake remoting client: a
round applies what the master answered and persists it; a master that is down or answers
garbage changes nothing and is logged once, not every round; a returning master takes its
slaves' newer offsets back (its time bound is shown in
tests/integration/test_replication_metadata.py). No sockets, no sleeps."""
from __future__ import annotations

import asyncio
import logging

import pytest

from pocketmq.broker.core.delay import ScheduleCursors
from pocketmq.broker.core.offsets import ConsumerOffsetManager
from pocketmq.broker.core.subscription_groups import SubscriptionGroupManager
from pocketmq.broker.services.slave_sync import SlaveSyncService, take_back_offsets
from pocketmq.protocol import bodies
from pocketmq.protocol.bodies import BrokerData
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.connection import ConnectionClosed
from tests.unit.test_slave_sync_core import master_tables, topic_manager

LOGGER = "pocketmq.broker.slave_sync"


class FakeClient:
    """answers[(addr, code)]: bytes (SUCCESS), an int (that code), an exception (raised) or a
    Future (awaited: a peer that answers late or never)."""

    def __init__(self, answers: dict):
        self.answers = answers
        self.asked: list[tuple[str, int]] = []
        self.closed = False

    async def invoke(self, addr, cmd, timeout_s):
        self.asked.append((addr, cmd.code))
        a = self.answers.get((addr, cmd.code), ConnectionClosed(f"cannot connect to {addr}: refused"))
        if isinstance(a, asyncio.Future):
            a = await a
        if isinstance(a, Exception):
            raise a
        resp = RemotingCommand(cmd.code)
        resp.code = ResponseCode.SUCCESS if isinstance(a, bytes) else a
        resp.body = a if isinstance(a, bytes) else b""
        resp.remark = None if isinstance(a, bytes) else "refused here"
        return resp

    async def close(self):
        self.closed = True


class Slave:
    def __init__(self, answers: dict, master: str | None = "m:1", own: str = "s:1"):
        self.topics, self.groups = topic_manager(), SubscriptionGroupManager()
        self.offsets, self.cursors = ConsumerOffsetManager(), ScheduleCursors()
        self.master = master
        self.persisted: list[bool] = []
        self.persist_error: Exception | None = None
        self.client = FakeClient(answers)
        self.clock = 0
        self.service = SlaveSyncService(master_addr=lambda: self.master, own_addr=own, topics=self.topics,
                                        groups=self.groups, offsets=self.offsets, cursors=self.cursors,
                                        persist=self.persist, client=self.client, mono_ms=lambda: self.clock)

    async def persist(self, topics=False):
        if self.persist_error is not None:
            raise self.persist_error
        self.persisted.append(topics)


def master_answers(addr="m:1") -> dict:
    _, body = master_tables()
    return {(addr, code): b for code, b in body.items()}


async def test_a_round_copies_the_masters_four_tables_and_persists_once():
    master, _ = master_tables()
    s = Slave(master_answers())
    assert await s.service.sync_once() == {}
    assert sorted(code for _, code in s.client.asked) == sorted([
        RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
        RequestCode.GET_ALL_CONSUMER_OFFSET, RequestCode.GET_ALL_DELAY_OFFSET])
    assert s.topics.topics == master.topics.topics and s.groups.table == master.groups.table
    assert s.offsets.table == master.offsets.table and s.cursors.offsets == master.schedule_cursors.offsets
    assert s.persisted == [True] and s.service.rounds == 1
    # nothing new: nothing written
    assert await s.service.sync_once() == {}
    assert s.persisted == [True]


@pytest.mark.parametrize("master,own", [(None, "s:1"), ("s:1", "s:1")])
async def test_no_master_known_or_itself_asks_nothing(master, own):
    s = Slave(master_answers(), master=master, own=own)
    assert await s.service.sync_once() == {}
    assert s.client.asked == [] and s.persisted == []


async def test_a_master_down_keeps_the_tables_and_is_logged_once(caplog):
    s = Slave({})
    s.offsets.commit("G", "T", 0, 9)      # e.g. committed here while the master is away
    s.cursors.advance(1, 4)
    before = (dict(s.topics.topics), dict(s.offsets.table), dict(s.cursors.offsets))
    caplog.set_level(logging.DEBUG, LOGGER)
    for i in range(30):                   # five minutes of rounds
        s.clock = i * 10_000
        failures = await s.service.sync_once()
        assert set(failures) == {"topics", "groups", "consumer offsets", "delay offsets"}
    assert (dict(s.topics.topics), dict(s.offsets.table), dict(s.cursors.offsets)) == before
    assert s.persisted == []
    lines = [r for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING and "cannot connect to m:1" in lines[0].message
    # the master is back: one line says so, and its tables are taken
    s.client.answers = master_answers()
    s.clock = 300_000
    assert await s.service.sync_once() == {}
    assert any("works again" in r.message for r in caplog.records if r.name == LOGGER)
    assert s.offsets.query("GM", "TM", 0) == 42 and s.offsets.query("G", "T", 0) == 9


async def test_a_bad_body_or_refusal_fails_that_table_only():
    answers = master_answers()
    answers[("m:1", RequestCode.GET_ALL_TOPIC_CONFIG)] = b'{"topicConfigTable":{"x y":{}}}'
    answers[("m:1", RequestCode.GET_ALL_DELAY_OFFSET)] = ResponseCode.SYSTEM_ERROR
    s = Slave(answers)
    own_topics = dict(s.topics.topics)
    failures = await s.service.sync_once()
    assert set(failures) == {"topics", "delay offsets"}
    assert failures["topics"].startswith("BodyError") and failures["delay offsets"].startswith("Refused: code 1")
    assert s.topics.topics == own_topics and s.cursors.offsets == {}
    assert s.offsets.query("GM", "TM", 1) == 7 and "GM" in s.groups.table
    assert s.persisted == [False]


async def test_a_failed_persist_is_a_failure_of_the_round():
    s = Slave(master_answers())
    s.persist_error = OSError("disk full")
    failures = await s.service.sync_once()
    assert failures == {"persist": "OSError: disk full"}


async def test_synced_waits_for_a_round_started_after_it():
    s = Slave(master_answers())
    gate = asyncio.get_running_loop().create_future()
    s.client.answers[("m:1", RequestCode.GET_ALL_TOPIC_CONFIG)] = gate
    first = asyncio.ensure_future(s.service.sync_once())
    await asyncio.sleep(0)                 # the first round is under way
    waiter = asyncio.ensure_future(s.service.synced())
    gate.set_result(master_answers()[("m:1", RequestCode.GET_ALL_TOPIC_CONFIG)])
    await first
    await asyncio.sleep(0)
    assert not waiter.done()               # that round began before the call
    del s.client.answers[("m:1", RequestCode.GET_ALL_TOPIC_CONFIG)]
    s.client.answers[("m:1", RequestCode.GET_ALL_TOPIC_CONFIG)] = master_answers()[
        ("m:1", RequestCode.GET_ALL_TOPIC_CONFIG)]
    await s.service.sync_once()
    await waiter


async def test_close_closes_only_a_client_it_made():
    s = Slave(master_answers())
    await s.service.close()
    assert not s.client.closed


# -- a returning master -----------------------------------------------------------------------------

def cluster_info(*addrs: tuple[int, str]) -> bytes:
    return bodies.encode_cluster_info({"b": BrokerData("C", "b", dict(addrs))}, {"C": ["b"]})


def offsets_body(table: dict) -> bytes:
    m = ConsumerOffsetManager()
    for key, queues in table.items():
        topic, _, group = key.partition("@")
        for q, o in queues.items():
            m.commit(group, topic, q, o)
    return m.encode()


async def test_take_back_merges_every_answering_slave(caplog):
    master = ConsumerOffsetManager()
    master.commit("G", "T", 0, 100)
    master.commit("G", "T", 1, 10)
    client = FakeClient({
        ("ns1:1", RequestCode.GET_BROKER_CLUSTER_INFO): cluster_info((0, "old-me:1"), (1, "s1:1")),
        ("ns2:1", RequestCode.GET_BROKER_CLUSTER_INFO): cluster_info((1, "s1:1"), (2, "s2:1"), (3, "s3:1")),
        ("s1:1", RequestCode.GET_ALL_CONSUMER_OFFSET): offsets_body({"T@G": {0: 50, 1: 20}}),
        ("s2:1", RequestCode.GET_ALL_CONSUMER_OFFSET): offsets_body({"T@G": {1: 30, 2: 5}}),
        ("s3:1", RequestCode.GET_ALL_CONSUMER_OFFSET): b"garbage",
    })
    caplog.set_level(logging.INFO, LOGGER)
    moved = await take_back_offsets("ns1:1;ns2:1;ns3:1", "b", "me:1", master, client=client)
    assert moved == 2                                     # T@G q1 and q2; q0 stays 100
    assert master.table == {"T@G": {0: 100, 1: 30, 2: 5}}
    # slaves only, each asked once; the client is the caller's
    assert sorted(a for a, c in client.asked if c == RequestCode.GET_ALL_CONSUMER_OFFSET) == ["s1:1", "s2:1", "s3:1"]
    assert not client.closed
    lines = [r.message for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and "2 queue offset(s) of 1 topic@group" in lines[0] and "s3:1: BodyError" in lines[0]


async def test_take_back_without_slaves_or_nameservers_changes_nothing():
    master = ConsumerOffsetManager()
    master.commit("G", "T", 0, 100)
    master.dirty = False
    client = FakeClient({("ns:1", RequestCode.GET_BROKER_CLUSTER_INFO): cluster_info((0, "me:1"))})
    assert await take_back_offsets("ns:1", "b", "me:1", master, client=client) == 0
    assert await take_back_offsets("down:1", "b", "me:1", master, client=client) == 0
    assert master.table == {"T@G": {0: 100}} and not master.dirty

