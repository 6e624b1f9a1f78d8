"""Transactional messages without sockets: the pure rules (broker/core/transaction.py),
then the send / END_TRANSACTION processors and the check service over an in-memory
store with an integer clock (tests/unit/test_broker_processors.py's Env)."""
import asyncio
import functools

import pytest

from pocketmq.broker.core import transaction as tx
from pocketmq.broker.core.transaction import DecidedTransactions, HalfView, plan_checks
from pocketmq.broker.processors import end_transaction
from pocketmq.broker.services.transaction_check import TransactionCheckService
from pocketmq.common.constants import (
    TRANS_CHECK_GROUP,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import (
    EndTransactionRequestHeader,
    SendMessageRequestHeader,
    decode_check_transaction_state_header,
    decode_end_transaction_header,
    encode_end_transaction_header,
    encode_send_header,
)
from pocketmq.protocol.message import MessageSysFlag, decode_offset_msg_id, decode_record, encode_properties
from tests.unit.test_broker_processors import Conn, Env, send_cmd

PREPARED = MessageSysFlag.TRANSACTION_PREPARED_TYPE


# -- the check decision (pure) -------------------------------------------------------------------

def h(offset, store_ts, times=0, origin=None, immunity_ms=None):
    return HalfView(offset, offset if origin is None else origin, store_ts, times, immunity_ms)


NOW = 100_000


def plan(halves, start=0, decided=(), *, now=NOW, pass_start=NOW, timeout=6000, check_max=3):
    d = DecidedTransactions()
    for o in decided:
        d.add(o)
    p = plan_checks(halves, start, d, now_ms=now, pass_start_ms=pass_start, timeout_ms=timeout,
                    check_max=check_max)
    return [(a.value, v.queue_offset) for a, v in p.actions], p.next_offset


@pytest.mark.parametrize("halves, decided, expected", [
    # nothing to do
    ([], (), ([], 0)),
    # old enough: checked; too young: stops the walk (later ones are younger still)
    ([h(0, NOW - 7000), h(1, NOW - 1000), h(2, NOW - 8000)], (), ([("check", 0)], 1)),
    # exactly the timeout old is due
    ([h(0, NOW - 6000)], (), ([("check", 0)], 1)),
    # decided (by its own offset or its origin's) is skipped, also when young
    ([h(0, NOW - 7000), h(1, NOW - 10), h(2, NOW - 10, times=1, origin=0)], (0, 1), ([("skip", 0), ("skip", 1),
                                                                                      ("skip", 2)], 3)),
    # a copy (checked before) is due at the next pass whatever its age
    ([h(5, NOW - 1, times=1, origin=0)], (), ([("check", 5)], 6)),
    # checked check_max times: discarded, never checked again
    ([h(0, NOW - 7000, times=3, origin=0), h(1, NOW - 7000, times=2)], (), ([("discard", 0), ("check", 1)], 2)),
    # a clock that went back checks now rather than never
    ([h(0, NOW + 5000)], (), ([("check", 0)], 1)),
])
def test_plan_checks(halves, decided, expected):
    assert plan(halves, 0, decided, pass_start=NOW + 10_000) == expected


def test_plan_stops_at_records_stored_during_the_pass_and_starts_at_progress():
    halves = [h(3, NOW - 9000), h(4, NOW - 9000), h(5, NOW, times=1, origin=3)]
    assert plan(halves, start=4, pass_start=NOW) == ([("check", 4)], 5)
    # a per-message CHECK_IMMUNITY_TIME_IN_SECONDS replaces transactionTimeOut for the first check
    assert plan([h(0, NOW - 7000, immunity_ms=60_000)], pass_start=NOW + 1) == ([], 0)
    assert plan([h(0, NOW - 2000, immunity_ms=1000)], pass_start=NOW + 1) == ([("check", 0)], 1)


def test_half_and_real_properties_round_trip():
    props = encode_properties({"TAGS": "A", "KEYS": "k", "TRAN_MSG": "true", "PGROUP": "pg", "u": "v"})
    half = tx.half_properties(props, "T", 3, "other")
    d = decode_record_props(half)
    assert d["REAL_TOPIC"] == "T" and d["REAL_QID"] == "3" and d["PGROUP"] == "pg"   # the message's own
    assert decode_record_props(tx.half_properties("TRAN_MSG\x01true\x02", "T", 0, "hdr"))["PGROUP"] == "hdr"
    renewed = decode_record_props(tx.renewed_properties(d, 7, 2))
    assert tx.origin_of(renewed, 9) == 7 and tx.check_times_of(renewed) == 2
    assert tx.origin_of(d, 9) == 9 and tx.check_times_of(d) == 0
    real = tx.real_message(renewed)
    assert (real.topic, real.queue_id) == ("T", 3)
    assert decode_record_props(real.properties) == {"TAGS": "A", "KEYS": "k", "PGROUP": "pg", "u": "v",
                                                    "TRANSACTION_CHECK_TIMES": "2"}
    assert tx.real_message({"REAL_TOPIC": "T", "REAL_QID": "x"}) is None
    body, op_props = tx.op_record(12, 7)
    assert body == b"12" and tx.parse_op(body, decode_record_props(op_props)) == 7
    assert tx.parse_op(b"12", {"TAGS": "d"}) == 12            # Java's op record: no origin property
    assert tx.parse_op(b"x", {"TAGS": "d"}) is None and tx.parse_op(b"1", {"TAGS": "x"}) is None


def decode_record_props(text):
    from pocketmq.protocol.message import decode_properties
    return decode_properties(text)


def test_end_transaction_header_round_trip_and_required_fields():
    hd = EndTransactionRequestHeader("pg", 3, 4096, 8, True, "UNIQ", None)
    ext = encode_end_transaction_header(hd)
    assert ext["fromTransactionCheck"] == "true" and "transactionId" not in ext
    assert decode_end_transaction_header(ext) == hd
    assert decode_end_transaction_header({**ext, "fromTransactionCheck": "1"}).from_transaction_check  # C++
    with pytest.raises(ValueError, match="producerGroup"):
        decode_end_transaction_header({k: v for k, v in ext.items() if k != "producerGroup"})


# -- processors and the check service over a MemoryStore --------------------------------------

def prepared_cmd(topic, body=b"x", queue_id=0, props=None, group="pg", sys_flag=PREPARED, tran_msg=True):
    p = {"TAGS": "A", "UNIQ_KEY": "U" + body.decode(), **(props or {})}
    if tran_msg:
        p.update({"TRAN_MSG": "true", "PGROUP": group})
    hd = SendMessageRequestHeader(group, topic, "TBW102", 4, queue_id, sys_flag, 1_700_000_000_000, 0,
                                  encode_properties(p), 0, False, False, None)
    return RemotingCommand(R.SEND_MESSAGE_V2, opaque=7, ext_fields=encode_send_header(hd, v2=True), body=body)


def end_cmd(resp, state, group="pg", from_check=False, uniq="Ux"):
    _, _, clo = decode_offset_msg_id(resp.ext_fields["msgId"])
    return end_cmd_at(clo, int(resp.ext_fields["queueOffset"]), state, group, from_check, uniq)


def end_cmd_at(commit_log_offset, queue_offset, state, group="pg", from_check=False, uniq="Ux"):
    return RemotingCommand(R.END_TRANSACTION, ext_fields=encode_end_transaction_header(
        EndTransactionRequestHeader(group, queue_offset, commit_log_offset, state, from_check, uniq, uniq)))


def visible(env, topic="T", qid=0):
    return env.store.get_max_offset_in_queue(topic, qid)


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    e.call(send_cmd("T", b"create"))      # the topic exists (auto-created)
    return e


def test_half_message_is_invisible_until_commit(env):
    before = visible(env)
    r = env.call(prepared_cmd("T", b"a"))
    assert r.code == C.SUCCESS and r.ext_fields["queueId"] == "0" and r.ext_fields["queueOffset"] == "0"
    assert visible(env) == before and visible(env, TRANS_HALF_TOPIC) == 1
    half = decode_record(env.store.look_message_by_offset(decode_offset_msg_id(r.ext_fields["msgId"])[2]))
    assert half.topic == TRANS_HALF_TOPIC and half.sys_flag & 0xC == 0
    assert half.properties["REAL_TOPIC"] == "T" and half.properties["REAL_QID"] == "0"
    assert env.ctx.topics.get(TRANS_HALF_TOPIC) is not None
    r2 = env.call(end_cmd(r, tx.COMMIT))
    assert r2.code == C.SUCCESS, r2.remark
    assert visible(env) == before + 1
    m = read_one(env, "T", before)
    assert m.body == b"a" and m.sys_flag & 0xC == tx.COMMIT
    assert m.prepared_transaction_offset == half.commit_log_offset
    assert "TRAN_MSG" not in m.properties and "REAL_TOPIC" not in m.properties and m.properties["PGROUP"] == "pg"
    assert visible(env, TRANS_OP_HALF_TOPIC) == 1
    # the same decision again (a late producer, a second check answer) applies nothing
    r3 = env.call(end_cmd(r, tx.COMMIT))
    assert r3.code == C.SUCCESS and "already decided" in r3.remark
    r4 = env.call(end_cmd(r, tx.ROLLBACK))
    assert r4.code == C.SUCCESS and "already decided" in r4.remark
    assert visible(env) == before + 1 and visible(env, TRANS_OP_HALF_TOPIC) == 1


def read_one(env, topic, offset):
    from pocketmq.protocol.message import decode_records
    r = env.store.get_message(topic, 0, offset, 1)
    (m,) = decode_records(b"".join(r.buffers))
    return m


def test_rollback_and_unknown(env):
    before = visible(env)
    r = env.call(prepared_cmd("T", b"a"))
    assert env.call(end_cmd(r, tx.NOT_TYPE)) is None          # unknown: Java answers nothing
    assert visible(env, TRANS_OP_HALF_TOPIC) == 0
    assert env.call(end_cmd(r, tx.ROLLBACK)).code == C.SUCCESS
    assert visible(env) == before and visible(env, TRANS_OP_HALF_TOPIC) == 1
    assert env.call(end_cmd(r, tx.COMMIT)).remark.startswith("the transaction was already decided")
    assert visible(env) == before


def test_end_transaction_bad_input(env):
    r = env.call(prepared_cmd("T", b"a"))
    _, _, clo = decode_offset_msg_id(r.ext_fields["msgId"])
    plain = env.call(send_cmd("T", b"plain"))
    _, _, plain_clo = decode_offset_msg_id(plain.ext_fields["msgId"])
    cases = [
        (end_cmd_at(10 ** 9, 0, tx.COMMIT), "Find prepared transaction message failed"),
        (end_cmd_at(clo + 1, 0, tx.COMMIT), "Find prepared transaction message failed"),
        (end_cmd_at(plain_clo, int(plain.ext_fields["queueOffset"]), tx.COMMIT), "not a half message"),
        (end_cmd_at(clo, 0, tx.COMMIT, group="other"), "The producer group wrong"),
        (end_cmd_at(clo, 5, tx.COMMIT), "The transaction state table offset wrong"),
        (end_cmd_at(clo, 0, 5), "commitOrRollback 5 is not 8 (commit) or 12 (rollback)"),
    ]
    for cmd, remark in cases:
        resp = env.call(cmd)
        assert resp.code == C.SYSTEM_ERROR and remark in resp.remark, (remark, resp.remark)
    missing = RemotingCommand(R.END_TRANSACTION, ext_fields={"producerGroup": "pg"})
    with pytest.raises(ValueError, match="tranStateTableOffset"):   # the connection answers SYSTEM_ERROR
        env.call(missing)
    assert visible(env, TRANS_OP_HALF_TOPIC) == 0 and 0 not in env.ctx.transactions


def test_prepared_send_rules(tmp_path):
    env = Env(tmp_path)
    env.call(send_cmd("T", b"create"))
    r = env.call(prepared_cmd("T", b"a", tran_msg=False))
    assert r.code == C.MESSAGE_ILLEGAL and "TRAN_MSG" in r.remark
    r = env.call(send_cmd(TRANS_HALF_TOPIC, b"x"))
    assert r.code == C.NO_PERMISSION
    env2 = Env(tmp_path / "b", rejectTransactionMessage=True)
    env2.call(send_cmd("T", b"create"))
    r = env2.call(prepared_cmd("T", b"a"))
    assert r.code == C.NO_PERMISSION and "transaction message is forbidden" in r.remark
    # PGROUP missing: taken from the send header (the group asked at check time)
    r = env.call(RemotingCommand(R.SEND_MESSAGE_V2, ext_fields=encode_send_header(SendMessageRequestHeader(
        "hdr-group", "T", "TBW102", 4, 0, PREPARED, 1, 0, encode_properties({"TRAN_MSG": "true"}), 0, False, False,
        None), v2=True), body=b"c"))
    half = decode_record(env.store.look_message_by_offset(decode_offset_msg_id(r.ext_fields["msgId"])[2]))
    assert half.properties["PGROUP"] == "hdr-group"


class Producers:
    """A producer connection registered as a heartbeat would."""

    def __init__(self, env, group="pg"):
        from pocketmq.broker.core.clients import ClientChannelInfo
        self.conn = Conn("10.0.0.8:6000")
        env.ctx.producers.register(group, self.conn, ClientChannelInfo("cid", 0, 1, "10.0.0.8:6000", env.now))


def service(env, interval=1000, timeout=6000, check_max=3):
    return TransactionCheckService(env.ctx, interval_ms=interval, timeout_ms=timeout, check_max=check_max,
                                   discard=functools.partial(end_transaction.discard, env.ctx))


def run_pass(env, svc):
    return asyncio.run(svc.check_once())


def test_check_service_asks_then_discards(env):
    prod = Producers(env)
    svc = service(env)
    r = env.call(prepared_cmd("T", b"a"))
    assert run_pass(env, svc) == 0                    # younger than transactionTimeOut
    env.now += 6000
    assert run_pass(env, svc) == 1
    (check,) = prod.conn.sent
    assert check.code == R.CHECK_TRANSACTION_STATE
    hd = decode_check_transaction_state_header(check.ext_fields)
    msg = decode_record(check.body)
    assert msg.topic == "T" and msg.body == b"a" and msg.properties["TRANSACTION_CHECK_TIMES"] == "1"
    assert hd.msg_id == hd.transaction_id == "Ua" and hd.tran_state_table_offset == 1   # the re-stored copy
    assert decode_offset_msg_id(hd.offset_msg_id)[2] == hd.commit_log_offset
    assert env.ctx.offsets.query(TRANS_CHECK_GROUP, TRANS_HALF_TOPIC, 0) == 1
    assert run_pass(env, svc) == 0          # the copy was stored during that pass: next interval
    for n in (2, 3):
        env.now += 1000
        assert run_pass(env, svc) == 1
        assert decode_record(prod.conn.sent[-1].body).properties["TRANSACTION_CHECK_TIMES"] == str(n)
    env.now += 1000
    assert run_pass(env, svc) == 0                  # checked 3 times: discarded
    assert visible(env, TRANS_CHECK_MAX_TIME_TOPIC) == 1 and visible(env, TRANS_OP_HALF_TOPIC) == 1
    env.now += 1000
    assert run_pass(env, svc) == 0 and len(prod.conn.sent) == 3
    # a decision arriving after the discard applies nothing
    before = visible(env)
    assert "already decided" in env.call(end_cmd(r, tx.COMMIT)).remark
    assert visible(env) == before


def test_check_answer_commits_once_and_no_producer_still_counts(env):
    svc = service(env, check_max=2)
    before = visible(env)
    env.call(prepared_cmd("T", b"a"))
    env.now += 6000
    assert run_pass(env, svc) == 1 and svc.checks_unanswerable == 1   # nobody to ask: counted anyway
    assert svc.checks_sent == 0
    prod = Producers(env)
    env.now += 1000
    assert run_pass(env, svc) == 1
    hd = decode_check_transaction_state_header(prod.conn.sent[0].ext_fields)
    answer = end_cmd_at(hd.commit_log_offset, hd.tran_state_table_offset, tx.COMMIT, from_check=True)
    assert env.call(answer).code == C.SUCCESS
    assert env.call(answer).remark.startswith("the transaction was already decided")
    assert visible(env) == before + 1
    env.now += 1000
    assert run_pass(env, svc) == 0 and len(prod.conn.sent) == 1      # decided: skipped, never discarded
    assert visible(env, TRANS_CHECK_MAX_TIME_TOPIC) == 0
    assert env.ctx.offsets.query(TRANS_CHECK_GROUP, TRANS_HALF_TOPIC, 0) == 3


def test_recover_rebuilds_decisions_from_the_op_queue(env, tmp_path):
    a = env.call(prepared_cmd("T", b"a"))
    env.call(prepared_cmd("T", b"b"))
    env.call(end_cmd(a, tx.ROLLBACK))
    env.ctx.transactions.origins.clear()     # a restart: the same store, nothing in memory
    svc = service(env)
    assert svc.recover() == 1 and 0 in env.ctx.transactions and 1 not in env.ctx.transactions
    assert "already decided" in env.call(end_cmd(a, tx.COMMIT)).remark
    prod = Producers(env)
    env.now += 6000
    assert run_pass(env, svc) == 1                 # only b is asked about
    assert decode_record(prod.conn.sent[0].body).body == b"b"
