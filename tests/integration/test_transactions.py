"""Transactional messages against real `mqnamesrv` / `mqbroker` processes: our
TransactionProducer, a PushConsumer counting what it sees, broker restarts (SIGKILL)
between the half message and the decision; and END_TRANSACTION's bad input on the wire.

Checks come within seconds: the brokers run with transactionCheckInterval=500 and
transactionTimeOut=1000. Counts are exact: each test's topic has one queue, and a marker
message sent after every decision is applied (END_TRANSACTION and the marker travel on
the producer's one connection, in order; check answers are awaited on the op queue)
arrives after everything committed before it, so when the marker is seen, what was
seen is everything there is.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib

import pytest

from pocketmq.client import (
    CONSUME_SUCCESS,
    LocalTransactionState,
    Message,
    PushConsumer,
    TransactionProducer,
)
from pocketmq.client import sync
from pocketmq.client.instance import ClientInstance
from pocketmq.common.constants import TRANS_CHECK_MAX_TIME_TOPIC, TRANS_OP_HALF_TOPIC
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import EndTransactionRequestHeader, encode_end_transaction_header
from pocketmq.protocol.message import decode_offset_msg_id
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_client_cluster import create_topic, uniq
from tests.integration.test_sql92 import send_cmd
from tests.support.daemons import Cluster
from tests.support.events import Sink
from tests.support.local import local_cluster

pytestmark = pytest.mark.slow

COMMIT, ROLLBACK, UNKNOWN = LocalTransactionState.COMMIT, LocalTransactionState.ROLLBACK, LocalTransactionState.UNKNOWN
FAST_CHECKS = ["--transactionCheckInterval=500", "--transactionTimeOut=1000"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("trans-it")), FAST_CHECKS + ["--transactionCheckMax=60"])
    c.start()
    yield c
    c.stop()


class Checker:
    """The producer's checker: answers from `answers` (UNKNOWN for keys not there yet) and
    counts the checks per key."""

    def __init__(self, answers=None):
        self.answers = dict(answers or {})
        self.calls = collections.Counter()
        self.topics = set()

    def __call__(self, msg):
        key = msg.keys[0]
        self.calls[key] += 1
        self.topics.add(msg.topic)
        return self.answers.get(key, UNKNOWN)


class Setup:
    def __init__(self, cluster, name):
        self.cluster = cluster
        self.topic = uniq(f"TX{name}")
        self.group = uniq(f"PG{name}")
        self.seen = Sink()
        self.admin = ClientInstance(f"127.0.0.1@tx-admin-{name}", cluster.namesrv_addr)

    async def start(self):
        await create_topic(self.cluster, self.topic, 1)
        self.base_ops = await self.max_offset(TRANS_OP_HALF_TOPIC)   # decisions of earlier tests
        return self

    def consumer(self):
        async def listener(msg):
            self.seen.append(msg.body.decode())
            return CONSUME_SUCCESS
        c = PushConsumer(uniq("CG"), self.cluster.namesrv_addr, listener=listener,
                         instance_name=uniq("tx-consumer"), consume_from_where="FIRST_OFFSET")
        c.subscribe(self.topic)
        return c

    async def max_offset(self, topic=None):
        return await self.admin.api.max_offset(self.cluster.broker_addr, MessageQueue(topic or self.topic,
                                                                                      "broker-a", 0))

    async def wait_ops(self, n, timeout_s=20):
        """The broker applied n decisions (op records) since start(), whatever their order."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while await self.max_offset(TRANS_OP_HALF_TOPIC) < self.base_ops + n:
            assert loop.time() < end, f"fewer than {n} transaction decisions applied"
            await asyncio.sleep(0.05)

    async def marker_then_exact(self, producer, expected):
        """Send a marker, wait for it: then exactly `expected` (and the marker) were seen."""
        await producer.send(Message(self.topic, b"marker"))
        await self.seen.until(lambda s: "marker" in s)
        assert sorted(b for b in self.seen if b != "marker") == sorted(expected)

    async def close(self):
        await self.admin.close()


@contextlib.asynccontextmanager
async def scenario(cluster, name, timeout_s=60):
    async with asyncio.timeout(timeout_s):
        s = await Setup(cluster, name).start()
        try:
            yield s
        finally:
            await s.close()


def producer(cluster, group, checker):
    return TransactionProducer(group, cluster.namesrv_addr, checker=checker, instance_name=uniq("tx-producer"))


async def test_commit_rollback_and_failing_executor(cluster):
    async with scenario(cluster, "crf", 60) as s:
        checker = Checker({"boom0": ROLLBACK, "boom1": COMMIT})
        invisible = []

        async def executor(msg, plan):
            # the half message is stored: no consumer can see it yet
            invisible.append(await s.max_offset())
            if plan == "raise":
                raise RuntimeError("local transaction failed")
            return plan
        async with s.consumer(), producer(cluster, s.group, checker) as p:
            results = []
            for i, (key, plan) in enumerate([("c0", COMMIT), ("r0", ROLLBACK), ("boom0", "raise"),
                                             ("c1", COMMIT), ("r1", ROLLBACK), ("boom1", "raise")]):
                r = await p.send_in_transaction(Message(s.topic, key.encode(), keys=key), executor, plan)
                results.append(r.local_state)
                assert r.ok and r.transaction_id == r.msg_id
            assert results == [COMMIT, ROLLBACK, UNKNOWN, COMMIT, ROLLBACK, UNKNOWN]
            # committed messages precede each later half message: the offset grows by commits only
            assert invisible == [0, 1, 1, 1, 2, 2]
            await s.wait_ops(6)      # 4 explicit decisions + 2 answered checks
            await s.marker_then_exact(p, ["c0", "c1", "boom1"])
            assert set(checker.calls) == {"boom0", "boom1"} and checker.topics == {s.topic}


async def test_unknown_then_checked_commit_and_rollback(cluster):
    async with scenario(cluster, "chk", 60) as s:
        checker = Checker()
        async with s.consumer(), producer(cluster, s.group, checker) as p:
            for key in ("yes", "no"):
                r = await p.send_in_transaction(Message(s.topic, key.encode(), keys=key), lambda m, a: UNKNOWN)
                assert r.local_state is UNKNOWN
            # asked while undecided: the broker asks again every interval
            loop = asyncio.get_running_loop()
            end = loop.time() + 20
            while min(checker.calls["yes"], checker.calls["no"]) < 2:
                assert loop.time() < end, checker.calls
                await asyncio.sleep(0.05)
            assert await s.max_offset() == 0
            checker.answers.update({"yes": COMMIT, "no": ROLLBACK})
            await s.seen.until(lambda seen: "yes" in seen)
            await s.wait_ops(2)
            await s.marker_then_exact(p, ["yes"])


async def test_restart_between_half_message_and_explicit_decision(cluster):
    async with scenario(cluster, "rse", 90) as s:
        checker = Checker()          # answers UNKNOWN: only the producer's own decision counts

        async def restart_then(msg, state):
            await asyncio.to_thread(cluster.restart_broker, True)    # SIGKILL: no clean shutdown
            return state
        async with producer(cluster, s.group, checker) as p:
            for key, state in (("kept", COMMIT), ("dropped", ROLLBACK)):
                r = await p.send_in_transaction(Message(s.topic, key.encode(), keys=key), restart_then, state)
                assert r.local_state is state
            await s.wait_ops(2)
            async with s.consumer():
                await s.marker_then_exact(p, ["kept"])


async def test_restart_then_check_back_decides(cluster):
    async with scenario(cluster, "rsc", 90) as s:
        checker = Checker()
        async with producer(cluster, s.group, checker) as p:
            for key in ("later-yes", "later-no"):
                await p.send_in_transaction(Message(s.topic, key.encode(), keys=key), lambda m, a: UNKNOWN)
            await asyncio.to_thread(cluster.restart_broker, True)
            # decided from now on; only a broker that recovered its half messages can ask
            checker.answers.update({"later-yes": COMMIT, "later-no": ROLLBACK})
            asked_before = dict(checker.calls)
            # the producer's next request reconnects and heartbeats (as the 30 s heartbeat would)
            await p.send(Message(uniq("TXother"), b"hello"))
            await s.wait_ops(2, timeout_s=30)
            assert checker.calls["later-yes"] > asked_before.get("later-yes", 0)
            async with s.consumer():
                await s.marker_then_exact(p, ["later-yes"])


async def test_checks_stop_after_transaction_check_max(tmp_path):
    c = Cluster(str(tmp_path), ["--transactionCheckInterval=300", "--transactionTimeOut=300",
                                "--transactionCheckMax=2"])
    await asyncio.to_thread(c.start)
    try:
        async with scenario(c, "max") as s:
            checker = Checker()
            async with producer(c, s.group, checker) as p:
                r = await p.send_in_transaction(Message(s.topic, b"never", keys="never"), lambda m, a: UNKNOWN)
                loop = asyncio.get_running_loop()
                end = loop.time() + 20
                while await s.max_offset(TRANS_CHECK_MAX_TIME_TOPIC) < 1:     # discarded
                    assert loop.time() < end, checker.calls
                    await asyncio.sleep(0.05)
                assert checker.calls["never"] == 2
                await asyncio.sleep(1.5)         # five more intervals: no check comes any more
                assert checker.calls["never"] == 2
                # a decision after the discard applies nothing
                _, _, clo = decode_offset_msg_id(r.offset_msg_id)
                await p.instance.api.end_transaction(c.broker_addr, EndTransactionRequestHeader(
                    s.group, r.queue_offset, clo, COMMIT.value, False, r.msg_id, r.msg_id), oneway=False)
                assert await s.max_offset() == 0
    finally:
        await asyncio.to_thread(c.stop)


async def test_sync_transaction_producer(cluster):
    async with scenario(cluster, "sync", 60) as s:
        ran_in = []

        def executor(msg, arg):
            import threading
            ran_in.append(threading.current_thread().name)
            return arg

        def send_both():
            with sync.TransactionProducer(s.group, cluster.namesrv_addr, checker=lambda m: UNKNOWN,
                                          instance_name=uniq("tx-sync")) as p:
                return [p.send_in_transaction(Message(s.topic, k.encode(), keys=k), executor, state).local_state
                        for k, state in (("s-yes", COMMIT), ("s-no", ROLLBACK))]
        assert await asyncio.to_thread(send_both) == [COMMIT, ROLLBACK]
        assert all(name != "pocketmq-client-loop" for name in ran_in)   # not on the private loop
        async with s.consumer(), producer(cluster, uniq("PGm"), Checker()) as p:
            await s.marker_then_exact(p, ["s-yes"])


# -- END_TRANSACTION on the wire ----------------------------------------------------------------

def end_cmd(group, queue_offset, commit_log_offset, state, **drop):
    ext = encode_end_transaction_header(EndTransactionRequestHeader(group, queue_offset, commit_log_offset, state,
                                                                    False, "U1", None))
    for k in drop:
        ext.pop(k)
    return RemotingCommand(R.END_TRANSACTION, ext_fields=ext)


@pytest.mark.asyncio
async def test_end_transaction_bad_input_on_the_wire(tmp_path):
    async with local_cluster(str(tmp_path), "--defaultTopicQueueNums=1") as (ns, broker):
        c = RemotingClient()
        try:
            plain = await c.invoke(broker.addr, send_cmd("TW", b"plain", {"TAGS": "A"}))
            assert plain.code == C.SUCCESS
            half = await c.invoke(broker.addr, RemotingCommand(R.SEND_MESSAGE_V2, ext_fields={
                **send_cmd("TW", b"half", {"TRAN_MSG": "true", "PGROUP": "pg"}).ext_fields, "f": "4"}, body=b"half"))
            assert half.code == C.SUCCESS, half.remark
            half_clo = decode_offset_msg_id(half.ext_fields["msgId"])[2]
            plain_clo = decode_offset_msg_id(plain.ext_fields["msgId"])[2]
            for cmd, remark in [
                (end_cmd("pg", 0, 987654321, 8), "Find prepared transaction message failed"),
                (end_cmd("pg", 0, half_clo + 7, 8), "Find prepared transaction message failed"),
                (end_cmd("pg", 0, plain_clo, 8), "not a half message"),
                (end_cmd("other", 0, half_clo, 8), "The producer group wrong"),
                (end_cmd("pg", 3, half_clo, 12), "The transaction state table offset wrong"),
                (end_cmd("pg", 0, half_clo, 4), "commitOrRollback 4 is not 8"),
                (end_cmd("pg", 0, half_clo, 8, commitLogOffset=None), "the custom field <commitLogOffset> is null"),
            ]:
                r = await c.invoke(broker.addr, cmd)
                assert r.code == C.SYSTEM_ERROR and remark in (r.remark or ""), (remark, r.remark)
            assert broker.store.get_max_offset_in_queue("TW", 0) == 1
            r = await c.invoke(broker.addr, end_cmd("pg", 0, half_clo, 8))
            assert r.code == C.SUCCESS and broker.store.get_max_offset_in_queue("TW", 0) == 2
            r = await c.invoke(broker.addr, end_cmd("pg", 0, half_clo, 8))
            assert r.code == C.SUCCESS and "already decided" in r.remark
            assert broker.store.get_max_offset_in_queue("TW", 0) == 2
            # sending to the half topic directly is refused
            r = await c.invoke(broker.addr, send_cmd("RMQ_SYS_TRANS_HALF_TOPIC", b"x", {}))
            assert r.code == C.NO_PERMISSION
        finally:
            await c.close()
