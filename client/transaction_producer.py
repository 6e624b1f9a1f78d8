"""TransactionProducer (asyncio): transactional messages (Java's TransactionMQProducer).

    def execute(msg, arg):            # the local transaction, run after the half message is stored
        db.insert(arg)
        return LocalTransactionState.COMMIT

    def check(msg):                   # asked by the broker about a transaction left UNKNOWN
        return LocalTransactionState.COMMIT if db.has(msg.keys) else LocalTransactionState.ROLLBACK

    async with TransactionProducer("PG", "127.0.0.1:9876", checker=check) as p:
        r = await p.send_in_transaction(Message("T", b"..."), execute, arg=order)

`send_in_transaction` sends the message as a half message (sysFlag
TRANSACTION_PREPARED, properties TRAN_MSG=true and PGROUP=<group>): the broker keeps
it where no consumer sees it. Then `local_executor(msg, arg)` runs (a plain or an
async function); its answer goes to the broker with END_TRANSACTION: COMMIT makes the
message visible, ROLLBACK drops it, UNKNOWN (also what an exception in the executor
means) leaves it to the broker's check-back: after transactionTimeOut it sends
CHECK_TRANSACTION_STATE to a producer of the group, whose `checker(msg)` answers
(END_TRANSACTION fromTransactionCheck=true), every transactionCheckInterval up to
transactionCheckMax times. A half message the broker refused is never executed: the
send raises, as a plain send does. END_TRANSACTION is oneway, as in Java: if it is lost
the check-back decides. Ordinary sends work as on a Producer.
"""
from __future__ import annotations

import asyncio
import enum
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Union

from pocketmq.client.errors import InvalidArgumentError, MQClientError
from pocketmq.client.message import Message, MessageExt, SendResult, SendStatus
from pocketmq.client.producer import Producer, _uniq
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.headers.typed import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
)

log = logging.getLogger("pocketmq.client.transaction")


class LocalTransactionState(enum.Enum):
    """A local transaction's outcome; the values are END_TRANSACTION's commitOrRollback."""
    COMMIT = msgcodec.MessageSysFlag.TRANSACTION_COMMIT_TYPE
    ROLLBACK = msgcodec.MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
    UNKNOWN = msgcodec.MessageSysFlag.TRANSACTION_NOT_TYPE


@dataclass(frozen=True, slots=True)
class TransactionSendResult(SendResult):
    """A SendResult (of the half message) and what the local transaction answered."""
    local_state: LocalTransactionState = LocalTransactionState.UNKNOWN


LocalExecutor = Callable[[Message, Any], Union[LocalTransactionState, Awaitable[LocalTransactionState]]]
Checker = Callable[[MessageExt], Union[LocalTransactionState, Awaitable[LocalTransactionState]]]

_RESERVED = (msgcodec.TRAN_MSG, msgcodec.PGROUP)


async def _ask(fn, *args) -> LocalTransactionState:
    """The state `fn` answers; UNKNOWN (logged) when it raises or answers something else."""
    try:
        state = fn(*args)
        if inspect.isawaitable(state):
            state = await state
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s raised; the transaction stays UNKNOWN (the broker's check-back decides)",
                      getattr(fn, "__name__", fn))
        return LocalTransactionState.UNKNOWN
    if not isinstance(state, LocalTransactionState):
        log.error("%s returned %r, not a LocalTransactionState; the transaction stays UNKNOWN",
                  getattr(fn, "__name__", fn), state)
        return LocalTransactionState.UNKNOWN
    return state


class TransactionProducer(Producer):
    def __init__(self, group: str, namesrv_addr: str, *, checker: Checker, **kwargs):
        if not callable(checker):
            raise InvalidArgumentError("checker must be a function of the message returning a LocalTransactionState")
        super().__init__(group, namesrv_addr, **kwargs)
        self.checker = checker
        self._check_tasks: set[asyncio.Task] = set()

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            for t in list(self._check_tasks):
                t.cancel()
            for t in list(self._check_tasks):
                try:
                    await t
                except BaseException:
                    pass

    async def send_in_transaction(self, msg: Message, local_executor: LocalExecutor, arg=None, *,
                                  timeout_ms: int | None = None) -> TransactionSendResult:
        """Send `msg` as a half message, run `local_executor(msg, arg)`, send its decision.
        Raises (like send) when the half message could not be stored; the executor then
        does not run."""
        if not callable(local_executor):
            raise InvalidArgumentError("local_executor must be a function (msg, arg) -> LocalTransactionState")
        self._check_message(msg)
        if msg.delay_level:
            raise InvalidArgumentError("a transactional message cannot have a delay level")
        for k in _RESERVED:
            if k in msg.properties:
                raise InvalidArgumentError(f"property {k} is set by the transaction producer")
        inst = self._inst()
        timeout_s = (timeout_ms or self.send_timeout_ms) / 1000
        uniq = _uniq.next_id()
        props = msg.wire_properties_text(uniq)
        if props and not props.endswith("\x02"):
            props += "\x02"
        props += f"{msgcodec.TRAN_MSG}\x01true\x02{msgcodec.PGROUP}\x01{self.group}\x02"
        body, sys_flag = msg.body, 0
        if len(body) >= self.compress_over_bytes:
            body, sys_flag = msgcodec.maybe_compress(body, self.compress_over_bytes, self.compress_level)
        sys_flag |= msgcodec.MessageSysFlag.TRANSACTION_PREPARED_TYPE
        self._sends_in_flight += 1
        try:
            r = await self._send_with_retry(inst, msg.topic, props, body, sys_flag, msg.flag, uniq, None,
                                            batch=False, timeout_s=timeout_s)
        finally:
            self._sends_in_flight -= 1
        if r.status is SendStatus.SEND_OK:
            state = await _ask(local_executor, msg, arg)
        else:
            # stored but not as asked (flush/slave timeout): Java rolls such a half message back
            state = LocalTransactionState.ROLLBACK
        transaction_id = r.transaction_id or uniq
        if state is not LocalTransactionState.UNKNOWN:
            try:
                _, _, commit_log_offset = msgcodec.decode_offset_msg_id(r.offset_msg_id)
                addr = inst.brokers.master(r.queue.broker_name) or \
                    await inst.master_addr_refreshing(r.queue.broker_name, msg.topic)
                await inst.api.end_transaction(addr, EndTransactionRequestHeader(
                    self.group, r.queue_offset, commit_log_offset, state.value, False, uniq, transaction_id))
            except (MQClientError, ValueError) as e:
                log.warning("%s: END_TRANSACTION %s for %s failed (%s); the broker's check-back decides",
                            self.group, state.name, uniq, e)
        return TransactionSendResult(r.status, r.msg_id, r.offset_msg_id, r.queue, r.queue_offset, transaction_id,
                                     r.region_id, r.trace_on, state)

    # -- check-back -----------------------------------------------------------------------
    def on_check_transaction_state(self, addr: str, header: CheckTransactionStateRequestHeader,
                                   msg: MessageExt) -> None:
        """CHECK_TRANSACTION_STATE from the broker at `addr` (ClientInstance dispatches it by
        the message's PGROUP): the checker runs in a task, its answer goes back with
        END_TRANSACTION fromTransactionCheck=true."""
        if self._closed or self.instance is None:
            return
        task = asyncio.get_running_loop().create_task(self._answer_check(addr, header, msg),
                                                      name=f"{self.group}:check-transaction")
        self._check_tasks.add(task)
        task.add_done_callback(self._check_tasks.discard)

    async def _answer_check(self, addr: str, header: CheckTransactionStateRequestHeader, msg: MessageExt) -> None:
        state = await _ask(self.checker, msg)
        if state is LocalTransactionState.UNKNOWN or self.instance is None:
            return       # asked again at the next check
        uniq = header.msg_id or msg.msg_id
        try:
            await self.instance.api.end_transaction(addr, EndTransactionRequestHeader(
                self.group, header.tran_state_table_offset, header.commit_log_offset, state.value, True, uniq,
                header.transaction_id or uniq))
        except MQClientError as e:
            log.warning("%s: answering the check of %s (%s) failed: %s", self.group, uniq, state.name, e)

