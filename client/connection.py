"""The client's broker/nameserver connections: remoting's Connection with write coalescing.

remoting.connection.Connection writes every frame with its own writelines
(one send syscall) unless it is answering inside data_received. A producer
with many sends in flight issues its requests from many tasks woken in the
same event-loop iteration; here they are collected and written with one
writelines when the iteration's ready callbacks have run (loop.call_soon),
which saves the client one syscall per request and gives the broker fewer,
larger reads (it then answers them with one write too).

Frames are encoded by protocol.command.encode_parts, whose msgpack fast path
covers every request the client builds.

Signing (plain ACL): with credentials, every request is signed here, in send(), the one
place all of them pass (client/credentials.py): instance.invoke, the hot paths that call a
prepared connection's request() directly (sends, pulls, offset commits), oneways and
nameserver requests alike.

A request sent while no other request is waiting for its response is written
at once (nothing to coalesce with, and the broker is idle: the sync send
case); at most `coalesce_frames_max` frames wait, so the broker works on one
group while the client produces the next.
"""
from __future__ import annotations

import asyncio
import functools

from pocketmq.protocol.command import RemotingCommand, encode_parts
from pocketmq.remoting.client import RemotingClient
from pocketmq.remoting.connection import Connection, ConnectionClosed


class ClientConnection(Connection):
    """Outgoing frames produced during one loop iteration leave with one writelines."""

    # Up to this many frames wait for the end of the iteration; a full group is written at
    # once so the broker can work on it while we produce the next (with 64 sends in flight,
    # groups of 16 measured ~47k sends/s, one group of 64 ~23k/s: client and broker took turns).
    coalesce_frames_max = 16
    # A request sent while nothing else is in flight (sync sends) is written at once.
    lone_write = True

    def __init__(self, *args, signer=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._wq: list | None = None
        self._wq_frames = 0
        # client.credentials.Credentials (signs requests in place), or None
        self.signer = signer

    def send(self, cmd: RemotingCommand) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        if self.signer is not None:
            self.signer.sign(cmd)
        parts = encode_parts(cmd)
        out = self._out
        if out is not None:           # inside data_received: written when the read is done
            out.extend(parts)
            return
        q = self._wq
        if q is None:
            if len(self.pending) <= 1 and self.lone_write:
                # a lone request (sync send): the broker is idle, nothing to wait for
                self.transport.writelines(parts)
                return
            self._wq = parts
            self._wq_frames = 1
            (self._loop or asyncio.get_running_loop()).call_soon(self._flush)
        else:
            q.extend(parts)
            self._wq_frames += 1
            if self._wq_frames >= self.coalesce_frames_max:
                self._wq = []
                self._wq_frames = 0
                self.transport.writelines(q)

    def _flush(self) -> None:
        q, self._wq = self._wq, None
        if q and not self.closed and self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(q)

    def close(self) -> None:
        if self._wq:
            self._flush()
        super().close()


class ClientRemoting(RemotingClient):
    """RemotingClient whose connections are ClientConnections.

    `on_connection_lost(addr)` (set by the ClientInstance) hears of every connection that
    closed and every dial that failed while the client is open: a broker that went away
    (a dead master) makes the instance refresh its routes at once, instead of at the 30 s
    timer, so pulls move to a slave within seconds (client/replica.py)."""

    connection_class = ClientConnection
    on_connection_lost = None

    def __init__(self, *args, credentials=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.credentials = credentials
        if credentials is not None:
            # every connection this client dials signs its requests
            self.connection_class = functools.partial(ClientConnection, signer=credentials)

    def _lost(self, addr: str | None) -> None:
        hook = self.on_connection_lost
        if hook is not None and addr and not self.closed:
            hook(addr)

    def _closed(self, conn: Connection) -> None:
        super()._closed(conn)
        self._lost(conn.attrs.get("addr"))

    async def connection(self, addr: str) -> Connection:
        try:
            return await super().connection(addr)
        except ConnectionClosed:
            self._lost(addr)
            raise
