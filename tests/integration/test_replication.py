"""Master/slave replication between real brokers (in-process, real TCP on loopback): the HA
stream, SYNC_MASTER's answers, a diverged slave, what a slave refuses, the route.

Byte-identical means the slave's commit log files equal the master's over the replicated
range, and every queue's consume queue gives the same messages in both stores.
"""
from __future__ import annotations

import asyncio
import shutil

import pytest

from pocketmq.client import CONSUME_SUCCESS, LocalTransactionState, Message, Producer, PushConsumer
from pocketmq.client import RECONSUME_LATER, TransactionProducer
from pocketmq.protocol import bodies
from pocketmq.protocol.codes import RequestCode as R
from pocketmq.protocol.codes import ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import pull_cmd, send_cmd
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.replica_pair import LocalPair, commit_log_bytes

pytestmark = pytest.mark.asyncio


def same_queues(master_store, slave_store) -> int:
    """Every queue of the master gives the same messages from the slave; returns the count."""
    n = 0
    for topic in master_store.topics():
        for qid in master_store.queue_ids(topic):
            lo = master_store.get_min_offset_in_queue(topic, qid)
            hi = master_store.get_max_offset_in_queue(topic, qid)
            assert slave_store.get_max_offset_in_queue(topic, qid) == hi, (topic, qid)
            off = lo
            while off < hi:
                a = master_store.get_message(topic, qid, off, 1024)
                b = slave_store.get_message(topic, qid, off, 1024)
                assert (a.status, a.next_begin_offset, a.message_count) == \
                       (b.status, b.next_begin_offset, b.message_count), (topic, qid, off)
                assert b"".join(bytes(x) for x in a.buffers) == b"".join(bytes(x) for x in b.buffers)
                n += a.message_count
                assert a.next_begin_offset > off
                off = a.next_begin_offset
    return n


def assert_identical(pair: LocalPair) -> int:
    end = pair.master.store.commit_log_max_offset
    assert pair.slave.store.commit_log_max_offset == end
    start = pair.master.store.commit_log_min_offset
    assert commit_log_bytes(pair.store_root("s"), end, start) == commit_log_bytes(pair.store_root("m"), end, start)
    return same_queues(pair.master.store, pair.slave.store)


def _commit(msg):
    return LocalTransactionState.COMMIT


async def mixed_traffic(ns: str, topic: str, n: int, tag: str) -> int:
    """Single sends, batches, 64 in flight, delay levels and transactions; returns how many
    messages were acknowledged."""
    sent = 0
    async with Producer(f"PG_{tag}", ns) as p:
        for i in range(n):
            r = await p.send(Message(topic, b"single-%d-" % i + b"x" * (i % 300), tags="S", keys=(f"{tag}{i}",)))
            assert r.ok, r
            sent += 1
        results = await p.send_batch([Message(topic, b"batch-%d" % i * 20) for i in range(n)])
        sent += len(results)
        results = await asyncio.gather(*(p.send(Message(topic, b"inflight-%d" % i * 50)) for i in range(64)))
        assert all(r.ok for r in results)
        sent += 64
        for i in range(5):
            assert (await p.send(Message(topic, b"delayed-%d" % i, delay_level=1))).ok
            sent += 1
    async with TransactionProducer(f"TPG_{tag}", ns, checker=_commit) as tp:
        for i in range(6):
            state = LocalTransactionState.COMMIT if i % 2 else LocalTransactionState.ROLLBACK
            r = await tp.send_in_transaction(Message(topic, b"tx-%d" % i), lambda m, a, s=state: s)
            assert r.ok
            sent += 1
    return sent


async def test_byte_identical_after_mixed_traffic_and_restarts(tmp_path):
    async with LocalPair(tmp_path, role="ASYNC_MASTER", common_args=["--messageDelayLevel=1s 2s"],
                         segment=64 * 1024) as pair:
        ns = pair.namesrv_addr
        sent = await mixed_traffic(ns, "RepT", 40, "a")
        # retries: a consumer asks for redelivery once per message (send-back records)
        seen: dict[bytes, int] = {}
        done = asyncio.Event()

        def listener(m):
            seen[m.msg_id] = seen.get(m.msg_id, 0) + 1
            if len(seen) >= 10:
                done.set()
            return RECONSUME_LATER if seen[m.msg_id] == 1 else CONSUME_SUCCESS
        c = PushConsumer("RepCG", ns, listener=listener, consume_from_where="FIRST_OFFSET")
        c.subscribe("RepT", "S")
        async with c:
            async with asyncio.timeout(20):
                await done.wait()
        await pair.restart_master()
        sent += await mixed_traffic(ns, "RepT2", 30, "b")
        await pair.caught_up()
        await pair.restart_slave()
        sent += await mixed_traffic(ns, "RepT", 30, "c")
        # delayed messages come due on the master and are written again: replicated too
        await asyncio.sleep(2.5)
        await pair.caught_up()
        assert len(pair.master.store._commitlog.queue.files) >= 3      # several segments
        # every acknowledged message (and the broker's own records: half and op messages,
        # the schedule topic, retries) is in queues that read the same from both
        assert assert_identical(pair) > sent


async def test_sync_master_answers(tmp_path):
    async with FaultProxy("127.0.0.1", 1) as proxy:
        pair = LocalPair(tmp_path, role="SYNC_MASTER", master_args=["--slaveTimeout=500"], start_slave=False)
        async with pair:
            proxy.target_port = pair.ports["m"][1]
            pair.slave_args = [f"--haMasterAddress={proxy.addr}"]
            c = RemotingClient()
            try:
                # no slave: SLAVE_NOT_AVAILABLE at once, the message stored, its id and offset answered
                r = await c.invoke(pair.master.addr, send_cmd("SyncT", b"m0", queue_id=0))
                assert r.code == C.SLAVE_NOT_AVAILABLE, r.remark
                assert r.ext_fields["queueOffset"] == "0" and len(r.ext_fields["msgId"]) == 32
                assert pair.master.store.get_max_offset_in_queue("SyncT", 0) == 1
                await pair.start_slave()
                await pair.caught_up()
                for i in range(1, 20):
                    r = await c.invoke(pair.master.addr, send_cmd("SyncT", b"m%d" % i, queue_id=0))
                    assert r.code == C.SUCCESS, (r.code, r.remark)
                    # acknowledged means the slave has it
                    assert pair.slave.store.commit_log_max_offset >= pair.master.store.commit_log_max_offset
                # a slave that stops reading: FLUSH_SLAVE_TIMEOUT after slaveTimeout, the message stored
                proxy.set_fault(Fault.BLACKHOLE)
                r = await c.invoke(pair.master.addr, send_cmd("SyncT", b"late", queue_id=0), timeout_s=5)
                assert r.code == C.FLUSH_SLAVE_TIMEOUT, r.remark
                assert r.ext_fields["queueOffset"] == "20"
                assert pair.master.store.get_max_offset_in_queue("SyncT", 0) == 21
                # our Producer returns the status, it does not resend
                async with Producer("SyncPG", pair.namesrv_addr) as p:
                    res = await p.send(Message("SyncT", b"via-producer"))
                    assert res.status.name == "FLUSH_SLAVE_TIMEOUT" and res.queue_offset >= 0
                assert sum(pair.master.store.get_max_offset_in_queue("SyncT", q) for q in range(8)) == 22
                # the stream resumes: the slave catches up with every message
                proxy.set_fault(Fault.PASS)
                proxy.reset_all()
                await pair.caught_up()
                assert assert_identical(pair) == 22
                assert pair.master.ha_master.wait_latency.count >= 21
            finally:
                await c.close()


async def test_slave_refuses_writes_and_the_route_keeps_it(tmp_path):
    async with LocalPair(tmp_path) as pair:
        c = RemotingClient()
        try:
            s = pair.slave.addr
            r = await c.invoke(s, send_cmd("T1"))
            assert r.code == C.SERVICE_NOT_AVAILABLE and "slave" in r.remark
            r = await c.invoke(s, RemotingCommand(R.UPDATE_AND_CREATE_TOPIC, ext_fields={
                "topic": "NewT", "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4",
                "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"}))
            assert r.code == C.NO_PERMISSION and "master" in r.remark
            r = await c.invoke(s, RemotingCommand(R.END_TRANSACTION, ext_fields={
                "producerGroup": "g", "tranStateTableOffset": "0", "commitLogOffset": "0",
                "commitOrRollback": "8", "fromTransactionCheck": "false", "msgId": "x", "transactionId": "y"}))
            assert r.code == C.SLAVE_NOT_AVAILABLE
            body = bodies.encode_lock_body("g", "cid", [bodies.MessageQueue("T1", "broker-a", 0)])
            r = await c.invoke(s, RemotingCommand(R.LOCK_BATCH_MQ, body=body))
            assert r.code == C.NO_PERMISSION
            # the master's send auto-creates the topic; the route lists both members
            assert (await c.invoke(pair.master.addr, send_cmd("RouteT"))).code == C.SUCCESS
            route = await route_of(c, pair.namesrv_addr, "RouteT")
            assert route.broker_datas[0].broker_addrs == {0: pair.master.addr, 1: pair.slave.addr}
            await pair.stop_master()
            route = await route_of(c, pair.namesrv_addr, "RouteT")
            assert route.broker_datas[0].broker_addrs == {1: pair.slave.addr}
            assert route.queue_datas and route.queue_datas[0].broker_name == "broker-a"
        finally:
            await c.close()


async def route_of(c, ns, topic):
    r = await c.invoke(ns, RemotingCommand(R.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic}))
    assert r.code == C.SUCCESS, r.remark
    return bodies.TopicRouteData.from_body(r.body)


async def wait_for(pred, timeout_s=10.0):
    async with asyncio.timeout(timeout_s):
        while not pred():
            await asyncio.sleep(0.01)


async def test_a_diverged_slave_refuses_and_keeps_its_data(tmp_path, caplog):
    async with LocalPair(tmp_path) as pair:
        c = RemotingClient()
        try:
            for i in range(30):
                assert (await c.invoke(pair.master.addr, send_cmd("DivT", b"first-%d" % i))).code == C.SUCCESS
            end = await pair.caught_up()
            await pair.stop_slave()
            # the master loses its disk and takes other writes, fewer bytes than the slave has
            await pair.stop_master()
            shutil.rmtree(pair.store_root("m"))
            await pair.start_master()
            assert (await c.invoke(pair.master.addr, send_cmd("DivT", b"other"))).code == C.SUCCESS
            before = commit_log_bytes(pair.store_root("s"))
            await pair.start_slave()
            ha = pair.slave.ha_slave
            await wait_for(lambda: ha.error is not None)
            m_end = pair.master.store.commit_log_max_offset
            assert "diverged" in ha.error and str(m_end) in ha.error and str(end) in ha.error, ha.error
            assert pair.slave.store.commit_log_max_offset == end
            # more writes on the master than the slave has: the tail differs at an offset both name
            while pair.master.store.commit_log_max_offset <= end + 100:
                assert (await c.invoke(pair.master.addr, send_cmd("DivT", b"y" * 200))).code == C.SUCCESS
            await pair.restart_slave()
            ha = pair.slave.ha_slave
            await wait_for(lambda: ha.error is not None)
            assert "differs from the master's at offset" in ha.error and str(end) in ha.error, ha.error
            await pair.stop_slave()
            assert commit_log_bytes(pair.store_root("s")) == before
            assert any("HA replication stopped" in r.getMessage() for r in caplog.records)
        finally:
            await c.close()


async def test_held_pull_on_the_slave_wakes_on_replication(tmp_path):
    """A pull parked on the slave is answered when the replicated record is dispatched there,
    not by a periodic scan (Java's slave notices only on its 5 s rescan)."""
    async with LocalPair(tmp_path) as pair:
        c = RemotingClient()
        try:
            assert (await c.invoke(pair.master.addr, send_cmd("HoldT", b"first", queue_id=0))).code == C.SUCCESS
            await pair.caught_up()
            # the slave knows the topic once its metadata follows the master's
            await wait_for(lambda: pair.slave.topics.get("HoldT") is not None, 30)
            loop = asyncio.get_running_loop()
            pull = asyncio.ensure_future(c.invoke(pair.slave.addr, pull_cmd("HoldT", 0, 1, suspend_ms=15000),
                                                  timeout_s=20))
            await wait_for(lambda: pair.slave.held_pulls.count > 0)
            t0 = loop.time()
            assert (await c.invoke(pair.master.addr, send_cmd("HoldT", b"second", queue_id=0))).code == C.SUCCESS
            r = await pull
            waited = loop.time() - t0
            assert r.code == C.SUCCESS and r.ext_fields["nextBeginOffset"] == "2"
            assert waited < 1.0, waited
        finally:
            await c.close()


async def test_a_slaves_first_report_is_not_an_ack(tmp_path):
    """The first report is where a slave starts (ours: up to 4 KiB before its end, not yet
    checked against the master's bytes); a SYNC_MASTER must not acknowledge a send on it, nor
    on its repetitions, only on a later, larger report."""
    import socket
    import struct
    async with LocalPair(tmp_path, role="SYNC_MASTER", master_args=["--slaveTimeout=500"], start_slave=False) as pair:
        ha_port = pair.master.ha_port
        c = RemotingClient()
        stalled = socket.create_connection(("127.0.0.1", ha_port))      # a slave that reads nothing
        stalled.sendall(struct.pack(">q", 0))
        try:
            await wait_for(lambda: pair.master.ha_master.connections == 1)
            send = asyncio.ensure_future(c.invoke(pair.master.addr, send_cmd("AckT", b"x" * 100)))
            await wait_for(lambda: pair.master.store.commit_log_max_offset > 0)
            end = pair.master.store.commit_log_max_offset
            # another "slave" whose first report (and its repetition) names the master's end
            other = socket.create_connection(("127.0.0.1", ha_port))
            other.sendall(struct.pack(">q", end))
            other.sendall(struct.pack(">q", end))
            r = await send
            assert r.code == C.FLUSH_SLAVE_TIMEOUT, r.code
            assert pair.master.ha_master.acked_max == 0
            other.sendall(struct.pack(">q", end + 0))         # still the start: not counted
            await asyncio.sleep(0.1)
            assert pair.master.ha_master.acked_max == 0
            other.close()
        finally:
            stalled.close()
            await c.close()


async def test_a_topic_deleted_on_the_master_goes_on_the_slave_too(tmp_path):
    """DELETE_TOPIC_IN_BROKER on the master drops its queues; the slave's metadata sync
    drops them too, so the topic sent to again starts its queues afresh on both (else the
    slave would keep the deleted messages at the new offsets). A delete and a new send
    within one sync period is the gap Java 4.9's slave has as well (docs/replication.md)."""
    async with LocalPair(tmp_path, common_args=["--slaveSyncIntervalMillis=200"]) as pair:
        c = RemotingClient()
        try:
            for i in range(5):
                assert (await c.invoke(pair.master.addr, send_cmd("DelT", b"old-%d" % i, queue_id=0))).code == C.SUCCESS
            await pair.caught_up()
            await wait_for(lambda: pair.slave.store.get_max_offset_in_queue("DelT", 0) == 5
                           and pair.slave.topics.get("DelT") is not None)
            r = await c.invoke(pair.master.addr, RemotingCommand(R.DELETE_TOPIC_IN_BROKER, ext_fields={"topic": "DelT"}))
            assert r.code == C.SUCCESS
            await wait_for(lambda: pair.slave.topics.get("DelT") is None)
            assert pair.slave.store.get_max_offset_in_queue("DelT", 0) == 0
            for i in range(3):
                assert (await c.invoke(pair.master.addr, send_cmd("DelT", b"new-%d" % i, queue_id=0))).code == C.SUCCESS
            await pair.caught_up()
            m, s = pair.master.store, pair.slave.store
            assert s.get_max_offset_in_queue("DelT", 0) == m.get_max_offset_in_queue("DelT", 0) == 3
            a, b = m.get_message("DelT", 0, 0, 10), s.get_message("DelT", 0, 0, 10)
            assert b"".join(bytes(x) for x in a.buffers) == b"".join(bytes(x) for x in b.buffers)
            assert b"new-0" in b"".join(bytes(x) for x in b.buffers)
        finally:
            await c.close()
