"""TCP server dispatching requests through a processor table (code -> handler).

`build_processor_table()` of each role is the only place request codes are
bound to handlers. Unknown codes get REQUEST_CODE_NOT_SUPPORTED; a handler
that raises gets SYSTEM_ERROR with a remark (see Connection).

Connection limit (docs/reliability.md "Descriptor limits"): every connection
holds a descriptor, and so does every file the broker's store creates. Past
`connection_limit(...)` connections a new one is accepted and closed at once
(one log line per interval with the count), so idle or hostile clients cannot
take the descriptors the store needs for its next segment or checkpoint.
"""
from __future__ import annotations

import asyncio
import logging
import resource
import time

from pocketmq.protocol.command import FRAME_SIZE_BYTES_MAX_DEFAULT
from pocketmq.remoting.clock import monotonic_ms
from pocketmq.remoting.connection import Connection
from pocketmq.remoting.read_budget import (
    FRAME_READ_TIMEOUT_MS_DEFAULT,
    READ_BUFFER_BYTES_MAX_DEFAULT,
    ReadBudget,
)

log = logging.getLogger("pocketmq.remoting")

REFUSED_LOG_INTERVAL_S = 10.0


def reserved_descriptors_default(nofile: int) -> int:
    """Descriptors kept free for everything but connections when the config does not say:
    half the limit, at least 64 and at most 1024 (store segments, consume-queue files,
    metadata and checkpoint temp files, logs, the nameserver clients)."""
    return min(1024, max(64, nofile // 2))


def connection_limit(nofile: int, max_connections: int = 0, reserved_fds: int = 0) -> int:
    """How many connections a server accepts at once: `max_connections` (0: no own bound)
    but never more than the descriptor limit `nofile` minus the reserved descriptors
    (`reserved_fds`, 0: reserved_descriptors_default). At least 1."""
    reserved = reserved_fds if reserved_fds > 0 else reserved_descriptors_default(nofile)
    limit = nofile - reserved
    if max_connections > 0:
        limit = min(limit, max_connections)
    return max(1, limit)


def nofile_limit() -> int:
    """The process's soft RLIMIT_NOFILE (a large number when unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY and soft > 0 else 1 << 20


class _Refused(asyncio.Protocol):
    """A connection past the limit: closed as soon as it is accepted (its descriptor freed)."""

    def connection_made(self, transport) -> None:
        transport.abort()


class RemotingServer:
    def __init__(self, processors: dict, *, host: str = "0.0.0.0", port: int = 0,
                 frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT, name: str = "server",
                 on_connection_close=None, handlers_in_flight_max: int = 4096, busy_poll_us: int = 0,
                 max_connections: int = 0, reserved_fds: int = 0,
                 read_buffer_bytes_max: int = READ_BUFFER_BYTES_MAX_DEFAULT,
                 frame_read_timeout_ms: int = FRAME_READ_TIMEOUT_MS_DEFAULT, tls=None):
        self.processors = processors
        # remoting.tls.TlsGate (tlsServerMode permissive/enforcing), or None: plaintext only
        self.tls = tls if tls is not None and tls.active else None
        self.host = host
        self.port = port
        self.frame_size_bytes_max = frame_size_bytes_max
        self.name = name
        self.on_connection_close = on_connection_close
        self.handlers_in_flight_max = handlers_in_flight_max
        from pocketmq.remoting.busy_poll import BusyPoll
        self.busy_poll = BusyPoll(busy_poll_us) if busy_poll_us > 0 else None
        self.connections: set[Connection] = set()
        # Partial request frames of all connections: bytes and time (remoting/read_budget.py).
        self.read_budget = ReadBudget(read_buffer_bytes_max, frame_read_timeout_ms, name)
        self._server: asyncio.base_events.Server | None = None
        self.max_connections = max_connections
        self.reserved_fds = reserved_fds
        self.connections_max = connection_limit(nofile_limit(), max_connections, reserved_fds)
        self.refused_total = 0
        self._refused_unlogged = 0
        self._refused_logged_s = -1e9

    def _closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if self.on_connection_close is not None:
            self.on_connection_close(conn)

    def _factory(self):
        if len(self.connections) >= self.connections_max:
            return self._refuse()
        conn = Connection(processors=self.processors,
                          frame_size_bytes_max=self.frame_size_bytes_max,
                          on_close=self._closed, name=self.name,
                          handlers_in_flight_max=self.handlers_in_flight_max,
                          pause_reading_on_backpressure=True, busy_poll=self.busy_poll,
                          read_budget=self.read_budget)
        self.connections.add(conn)
        return conn if self.tls is None else self.tls.wrap(conn)

    def _refuse(self) -> _Refused:
        self.refused_total += 1
        self._refused_unlogged += 1
        now = time.monotonic()
        if now - self._refused_logged_s >= REFUSED_LOG_INTERVAL_S:
            log.warning("%s: %d connection(s) refused since the last report: %d open, the limit is %d "
                        "(maxConnections, reservedFileDescriptors; RLIMIT_NOFILE %d)", self.name,
                        self._refused_unlogged, len(self.connections), self.connections_max, nofile_limit())
            self._refused_logged_s = now
            self._refused_unlogged = 0
        return _Refused()

    async def start(self, start_serving: bool = True) -> int:
        """Bind (and by default serve). Binding first lets a role learn its port
        before it opens what the handlers need."""
        loop = asyncio.get_running_loop()
        # the limit follows RLIMIT_NOFILE as it is when serving starts
        self.connections_max = connection_limit(nofile_limit(), self.max_connections, self.reserved_fds)
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
