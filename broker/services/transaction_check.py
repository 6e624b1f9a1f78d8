"""The transaction check-back service (shell over broker.core.transaction).

Every transactionCheckInterval ms it walks RMQ_SYS_TRANS_HALF_TOPIC queue 0 from its
progress (the consumer offset of group CID_RMQ_SYS_TRANS on that queue, as in Java,
persisted with the other consumer offsets) and lets `plan_checks` decide each half
record: skip it (decided), discard it (checked transactionCheckMax times), or check it.
A check re-stores the half record at the end of the half queue with
TRANSACTION_CHECK_TIMES + 1 (so the count survives a restart) and sends
CHECK_TRANSACTION_STATE, oneway, to one connection of the message's producer group
(PGROUP; the connections come from heartbeats), quoting the new record; the producer
answers with END_TRANSACTION fromTransactionCheck=true. With no producer of the group
online the check still counts (Java's rule), so an abandoned transaction is discarded
after transactionCheckMax intervals instead of being kept forever.

At start (`recover`, before the broker serves) the decided transactions are rebuilt
from every op record the store still has. Work per step is bounded so sends keep being
served.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from pocketmq.broker.core import transaction as tx
from pocketmq.broker.store.api import PutMessageStatus
from pocketmq.common.constants import TRANS_CHECK_GROUP, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.codes import RequestCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import (
    CheckTransactionStateRequestHeader,
    encode_check_transaction_state_header,
)
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.broker.transaction")

READ_BATCH = 32          # records per store read
STEP_RECORDS_MAX = 256   # records decided before letting requests through


class TransactionCheckService:
    def __init__(self, ctx, *, interval_ms: int, timeout_ms: int, check_max: int,
                 discard: Callable[[msgcodec.MessageExt, int], None]):
        self.ctx = ctx
        # discard(record, origin): keeps the record aside and decides it (the composition root
        # injects processors/end_transaction.discard, which owns the op-record writes)
        self.discard = discard
        self.interval_ms = max(1, interval_ms)
        self.timeout_ms = max(0, timeout_ms)
        self.check_max = max(0, check_max)
        self._task: asyncio.Task | None = None
        self._rotation = 0
        self.checks_sent = 0      # CHECK_TRANSACTION_STATE requests sent (tests, logs)
        self.checks_unanswerable = 0   # checks counted with no producer of the group online

    # -- lifecycle ------------------------------------------------------------------------
    def recover(self) -> int:
        """Rebuild the decided transactions from the op queue; returns the op records read."""
        store, decided = self.ctx.store, self.ctx.transactions
        offset = store.get_min_offset_in_queue(TRANS_OP_HALF_TOPIC, tx.OP_QUEUE_ID)
        end = store.get_max_offset_in_queue(TRANS_OP_HALF_TOPIC, tx.OP_QUEUE_ID)
        n = 0
        for rec in self._read(TRANS_OP_HALF_TOPIC, tx.OP_QUEUE_ID, offset, end):
            origin = tx.parse_op(rec.body, rec.properties)
            if origin is None:
                log.warning("op record %d of %s is not a transaction decision; skipped", rec.queue_offset,
                            TRANS_OP_HALF_TOPIC)
                continue
            decided.add(origin)
            n += 1
        if n:
            log.info("transactions: %d decisions recovered from %s", n, TRANS_OP_HALF_TOPIC)
        return n

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="transaction-check")

    async def close(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("transaction check pass failed")

    # -- one pass -------------------------------------------------------------------------
    def _read(self, topic: str, queue_id: int, offset: int, end: int):
        store = self.ctx.store
        while offset < end:
            r = store.get_message(topic, queue_id, offset, READ_BATCH)
            if r.message_count == 0:
                if r.next_begin_offset <= offset:
                    return
                offset = r.next_begin_offset
                continue
            for rec in msgcodec.decode_records(b"".join(r.buffers), decompress=False):
                if rec.queue_offset >= offset:
                    yield rec
                    offset = rec.queue_offset + 1

    async def check_once(self) -> int:
        """One pass over the half queue; returns the checks made (counted against
        transactionCheckMax, whether or not a producer was online to ask)."""
        ctx, store = self.ctx, self.ctx.store
        pass_start = ctx.now_ms()
        progress = ctx.offsets.query(TRANS_CHECK_GROUP, TRANS_HALF_TOPIC, tx.HALF_QUEUE_ID)
        offset = max(progress, store.get_min_offset_in_queue(TRANS_HALF_TOPIC, tx.HALF_QUEUE_ID))
        end = store.get_max_offset_in_queue(TRANS_HALF_TOPIC, tx.HALF_QUEUE_ID)
        sent = 0
        while offset < end:
            recs = []
            for rec in self._read(TRANS_HALF_TOPIC, tx.HALF_QUEUE_ID, offset, end):
                recs.append(rec)
                if len(recs) >= STEP_RECORDS_MAX:
                    break
            if not recs:
                break
            by_offset = {r.queue_offset: r for r in recs}
            plan = tx.plan_checks((tx.half_view(r.queue_offset, r.store_timestamp, r.properties) for r in recs),
                                  offset, ctx.transactions, now_ms=ctx.now_ms(), pass_start_ms=pass_start,
                                  timeout_ms=self.timeout_ms, check_max=self.check_max)
            next_offset = plan.next_offset
            for action, h in plan.actions:
                rec = by_offset[h.queue_offset]
                if action is tx.CheckAction.DISCARD:
                    self.discard(rec, h.origin)
                elif action is tx.CheckAction.CHECK:
                    if not self._check(rec, h):
                        next_offset = h.queue_offset      # the store refuses writes: next pass
                        break
                    sent += 1
            if next_offset != offset:
                ctx.offsets.commit(TRANS_CHECK_GROUP, TRANS_HALF_TOPIC, tx.HALF_QUEUE_ID, next_offset)
            if next_offset <= recs[-1].queue_offset:
                break          # stopped early: too young, stored during this pass, or refused
            offset = next_offset
            await asyncio.sleep(0)
        return sent

    def _check(self, rec: msgcodec.MessageExt, h: tx.HalfView) -> bool:
        """Re-store the half record with one more check and ask its producer group."""
        ctx = self.ctx
        props = dict(rec.properties)
        renewed = tx.renewed_properties(props, h.origin, h.check_times + 1)
        now = ctx.now_ms()
        born_host = msgcodec.parse_host(rec.born_host)
        result = ctx.store.put(TRANS_HALF_TOPIC, tx.HALF_QUEUE_ID, rec.flag, rec.body, renewed.encode(),
                               rec.sys_flag, rec.born_timestamp, born_host, now, rec.reconsume_times)
        if result.status is not PutMessageStatus.PUT_OK:
            log.error("re-storing half message %d for its check failed: %s", rec.queue_offset, result.status.name)
            return False
        group = props.get(msgcodec.PGROUP) or ""
        conn = self._producer_connection(group)
        if conn is None:
            self.checks_unanswerable += 1
            log.warning("no producer of group %s online to check half message %s (check %d of %d)", group,
                        props.get(msgcodec.UNIQ_KEY), h.check_times + 1, self.check_max)
            return True
        real = tx.real_message(props)
        topic, qid = (real.topic, real.queue_id) if real is not None else (rec.topic, rec.queue_id)
        body = msgcodec.encode_record(topic, qid, rec.flag, rec.body, renewed, rec.sys_flag, rec.born_timestamp,
                                      born_host, ctx.store_host, rec.reconsume_times, 0, result.queue_offset,
                                      result.wrote_offset, now)
        uniq = props.get(msgcodec.UNIQ_KEY)
        header = CheckTransactionStateRequestHeader(result.queue_offset, result.wrote_offset, uniq, uniq,
                                                    result.msg_id)
        try:
            conn.oneway(RemotingCommand(RequestCode.CHECK_TRANSACTION_STATE,
                                        ext_fields=encode_check_transaction_state_header(header), body=body))
        except Exception as e:
            log.warning("sending CHECK_TRANSACTION_STATE to %s failed: %s", getattr(conn, "remote_addr", "?"), e)
            return True
        self.checks_sent += 1
        return True

    def _producer_connection(self, group: str):
        """One open connection of the group, taken in turn (Java's getAvailableChannel)."""
        chans = [c for c in self.ctx.producers.groups.get(group, {}) if not getattr(c, "closed", False)]
        if not chans:
            return None
        self._rotation += 1
        return chans[self._rotation % len(chans)]
