"""A message the client cannot decode is skipped with an error log; its queue keeps going."""
import asyncio

import pytest

from pocketmq.client import CONSUME_SUCCESS, Message, Producer, PushConsumer
from pocketmq.protocol.codes import ResponseCode as C
from pocketmq.remoting.client import RemotingClient
from tests.integration.test_broker import send_cmd
from tests.support.events import Sink
from tests.support.local import local_cluster

pytestmark = pytest.mark.asyncio


async def test_undecodable_message_is_skipped_not_stalling_the_queue(tmp_path):
    async with local_cluster(str(tmp_path)) as (ns, broker):
        async with Producer("PG", ns) as p:
            await p.send(Message("Poison", b"before"), queue=None)
        raw = RemotingClient()
        try:
            cmd = send_cmd("Poison", b"this is not zlib", queue_id=0)
            cmd.ext_fields["f"] = "1"          # sysFlag COMPRESSED with a body that does not inflate
            assert (await raw.invoke(broker.addr, cmd)).code == C.SUCCESS
            for i in range(4):
                assert (await raw.invoke(broker.addr, send_cmd("Poison", b"after%d" % i, queue_id=0))).code == 0
        finally:
            await raw.close()
        got = Sink()

        async def listener(msg):
            got.append(msg.body)
            return CONSUME_SUCCESS
        c = PushConsumer("PoisonG", ns, listener=listener, consume_from_where="FIRST_OFFSET")
        c.subscribe("Poison")
        async with c:
            async with asyncio.timeout(10):
                await got.until(lambda s: len([b for b in s if b.startswith(b"after")]) == 4)
        assert sorted(b for b in got if b.startswith(b"after")) == [b"after%d" % i for i in range(4)]
        assert b"this is not zlib" not in got
