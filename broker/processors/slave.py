"""What a slave answers to requests only a master may serve.

A slave's log and metadata are its master's copies (the HA stream, the metadata sync): a
write taken here would be lost or overwritten. So, as Java 4.9: a send or a send-back is
refused with SERVICE_NOT_AVAILABLE (what Java's store answers a put on a slave), an
END_TRANSACTION with SLAVE_NOT_AVAILABLE ("Store is slave mode"). Beyond Java, which takes
them and lets the next metadata sync overwrite them silently: topic and group changes and
offset resets are refused with NO_PERMISSION, and queue locks too (an orderly consumer must
hold its lock where every other consumer of the group takes theirs: on the master).
Consumer offsets may still be committed here (UPDATE_CONSUMER_OFFSET): clients do so while
the master is down, and the master takes them back when it returns.
"""
from __future__ import annotations

from pocketmq.broker.processors.send import refuse_on_slave
from pocketmq.protocol.codes import RequestCode as R
from pocketmq.protocol.codes import ResponseCode


def _who(ctx) -> str:
    return f"the broker {ctx.config.brokerName} (brokerId {ctx.config.brokerId}) is a slave"


def refuse_write(ctx, conn, cmd):
    return cmd.response(ResponseCode.NO_PERMISSION,
                        f"{_who(ctx)}: topics, groups and offset resets are changed on its master "
                        f"and copied from there")


def refuse_lock(ctx, conn, cmd):
    return cmd.response(ResponseCode.NO_PERMISSION, f"{_who(ctx)}: queue locks are taken on the master")


def refuse_end_transaction(ctx, conn, cmd):
    return cmd.response(ResponseCode.SLAVE_NOT_AVAILABLE,
                        f"Store is slave mode, so end transaction is forbidden ({_who(ctx)})")


SLAVE_OVERRIDES = {
    R.SEND_MESSAGE: refuse_on_slave,
    R.SEND_MESSAGE_V2: refuse_on_slave,
    R.SEND_BATCH_MESSAGE: refuse_on_slave,
    R.CONSUMER_SEND_MSG_BACK: refuse_on_slave,
    R.END_TRANSACTION: refuse_end_transaction,
    R.LOCK_BATCH_MQ: refuse_lock,
    R.UPDATE_AND_CREATE_TOPIC: refuse_write,
    R.DELETE_TOPIC_IN_BROKER: refuse_write,
    R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: refuse_write,
    R.DELETE_SUBSCRIPTIONGROUP: refuse_write,
    R.INVOKE_BROKER_TO_RESET_OFFSET: refuse_write,
    R.CLONE_GROUP_OFFSET: refuse_write,
}
