"""TCP server dispatching requests through a processor table (code -> handler).

`build_processor_table()` of each role is the only place request codes are
bound to handlers. Unknown codes get REQUEST_CODE_NOT_SUPPORTED; a handler
that raises gets SYSTEM_ERROR with a remark (see Connection).
"""
from __future__ import annotations

import asyncio
import logging

from pocketmq.protocol.command import FRAME_SIZE_BYTES_MAX_DEFAULT
from pocketmq.remoting.clock import monotonic_ms
from pocketmq.remoting.connection import Connection
from pocketmq.remoting.read_budget import (
    FRAME_READ_TIMEOUT_MS_DEFAULT,
    READ_BUFFER_BYTES_MAX_DEFAULT,
    ReadBudget,
)

log = logging.getLogger("pocketmq.remoting")


class RemotingServer:
    def __init__(self, processors: dict, *, host: str = "0.0.0.0", port: int = 0,
                 frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT, name: str = "server",
                 on_connection_close=None, handlers_in_flight_max: int = 4096, busy_poll_us: int = 0,
                 read_buffer_bytes_max: int = READ_BUFFER_BYTES_MAX_DEFAULT,
                 frame_read_timeout_ms: int = FRAME_READ_TIMEOUT_MS_DEFAULT):
        self.processors = processors
        self.host = host
        self.port = port
        self.frame_size_bytes_max = frame_size_bytes_max
        self.name = name
        self.on_connection_close = on_connection_close
        self.handlers_in_flight_max = handlers_in_flight_max
        from pocketmq.remoting.busy_poll import BusyPoll
        self.busy_poll = BusyPoll(busy_poll_us, adaptive=True) if busy_poll_us > 0 else None
        self.connections: set[Connection] = set()
        # Partial request frames of all connections: bytes and time (remoting/read_budget.py).
        self.read_budget = ReadBudget(read_buffer_bytes_max, frame_read_timeout_ms, name)
        self._server: asyncio.base_events.Server | None = None

    def _closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if self.on_connection_close is not None:
            self.on_connection_close(conn)

    def _factory(self) -> Connection:
        conn = Connection(processors=self.processors,
                          frame_size_bytes_max=self.frame_size_bytes_max,
                          on_close=self._closed, name=self.name,
                          handlers_in_flight_max=self.handlers_in_flight_max,
                          pause_reading_on_backpressure=True, busy_poll=self.busy_poll,
                          read_budget=self.read_budget)
        self.connections.add(conn)
        return conn

    async def start(self, start_serving: bool = True) -> int:
        """Bind (and by default serve). Binding first lets a role learn its port
        before it opens what the handlers need."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._factory, self.host, self.port,
                                                reuse_address=True, backlog=1024,
                                                start_serving=start_serving)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def start_serving(self) -> None:
        await self._server.start_serving()

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    def close_idle(self, idle_s: float, now_ms: int | None = None) -> int:
        """Close connections that sent nothing for idle_s seconds (Java: Netty's IdleStateHandler,
        serverChannelMaxIdleTimeSeconds, 120 s). Returns how many it closed.

        Meant to be called on a periodic tick. `now_ms` is the caller's clock (default: monotonic
        ms); a read is not compared with it but noticed by the next call (the read stamp
        changed), which counts the connection active at that call's `now_ms`. So any clock works
        (a test's integer clock too), and a connection is closed by the first call at least
        idle_s after the call that last saw it read: with ticks every P seconds and idle_s a
        multiple of P, the same tick as comparing read times would pick.
        """
        if now_ms is None:
            now_ms = monotonic_ms()
        idle_ms = idle_s * 1000
        closed = 0
        for conn in list(self.connections):
            stamp = conn.last_read_s
            if stamp != conn.idle_seen_read_s:
                conn.idle_seen_read_s = stamp
                conn.idle_active_ms = now_ms
            elif now_ms - conn.idle_active_ms >= idle_ms:
                log.info("%s: closing %s, idle for %.0f s", self.name, conn.remote_addr,
                         (now_ms - conn.idle_active_ms) / 1000)
                conn.close()
                closed += 1
        return closed

    async def close(self) -> None:
        self.read_budget.close()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2)
            except (asyncio.TimeoutError, Exception):
                pass
            self._server = None
