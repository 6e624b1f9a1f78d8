"""Request timeouts: one sweep timer per connection expires requests at their deadlines."""
import asyncio
import time

import pytest

from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.connection import Connection, RequestTimeout

pytestmark = pytest.mark.asyncio


async def test_requests_time_out_at_their_own_deadlines_and_answers_still_arrive():
    answered = []

    def handler(conn, cmd):
        if cmd.code == 1:               # code 1: never answered
            return None
        answered.append(cmd.code)
        return cmd.response(0)

    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(handler), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, conn = await loop.create_connection(Connection, "127.0.0.1", port)
    try:
        t0 = time.monotonic()
        slow = asyncio.ensure_future(conn.request(RemotingCommand(1), 1.0))
        await asyncio.sleep(0.01)
        fast = asyncio.ensure_future(conn.request(RemotingCommand(1), 0.1))   # earlier deadline re-arms
        with pytest.raises(RequestTimeout):
            await fast
        t_fast = time.monotonic() - t0
        assert 0.1 <= t_fast < 0.5 and not slow.done()
        assert (await conn.request(RemotingCommand(2), 1.0)).code == 0      # meanwhile answered
        with pytest.raises(RequestTimeout):
            await slow
        assert 1.0 <= time.monotonic() - t0 < 1.5
        assert conn.pending == {} and conn._deadlines == {}
        # many in flight: each answered, nothing left behind
        rs = await asyncio.gather(*(conn.request(RemotingCommand(3), 2.0) for _ in range(200)))
        assert all(r.code == 0 for r in rs) and conn.pending == {} and conn._deadlines == {}
    finally:
        conn.close()
        server.close()
        await server.wait_closed()
