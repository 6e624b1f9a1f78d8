"""Client side: one connection per "ip:port", reconnect on demand, nameserver rotation."""
from __future__ import annotations

import asyncio
import logging

from pocketmq.protocol.codes import LanguageCode, ResponseCode, SerializeType
from pocketmq.protocol.command import FRAME_SIZE_BYTES_MAX_DEFAULT, RemotingCommand
from pocketmq.remoting.connection import Connection, ConnectionClosed, RemotingError

log = logging.getLogger("pocketmq.remoting")


def split_addr_list(addrs: str) -> list[str]:
    """"ip:port;ip:port" (NAMESRV_ADDR, -n) as a list; blanks around and empty items dropped."""
    return [a.strip() for a in addrs.split(";") if a.strip()]


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad address {addr!r}, expected ip:port")
    return host.strip("[]"), int(port)


class RemotingClient:
    # Roles may use a Connection subclass (the Python client coalesces writes).
    connection_class = Connection

    def __init__(self, *, handler=None, connect_timeout_s: float = 3.0,
                 language: int = LanguageCode.PYTHON, serialize_type: int = SerializeType.JSON,
                 frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT, busy_poll_us: int = 0,
                 ssl_context=None):
        self.handler = handler
        # every connection over TLS with this context (remoting/tls.py), or None: plaintext
        self.ssl_context = ssl_context
        self.connect_timeout_s = connect_timeout_s
        self.language = language
        self.serialize_type = serialize_type
        self.frame_size_bytes_max = frame_size_bytes_max
        from pocketmq.remoting.busy_poll import BusyPoll
        self.busy_poll = BusyPoll(busy_poll_us) if busy_poll_us > 0 else None
        self.connections: dict[str, Connection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.namesrv_addrs: list[str] = []
        self._ns_index = 0
        self.closed = False

    def set_namesrv_addr(self, addrs: str | list[str]) -> None:
        if isinstance(addrs, str):
            addrs = split_addr_list(addrs)
        for a in addrs:
            split_addr(a)
        self.namesrv_addrs = list(addrs)

    async def connection(self, addr: str) -> Connection:
        conn = self.connections.get(addr)
        if conn is not None and not conn.closed:
            return conn
        if self.closed:
            raise ConnectionClosed("client closed")
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self.connections.get(addr)
            if conn is not None and not conn.closed:
                return conn
            host, port = split_addr(addr)
            loop = asyncio.get_running_loop()

            def factory():
                return self.connection_class(self.handler, frame_size_bytes_max=self.frame_size_bytes_max,
                                             on_close=self._closed, name=f"client->{addr}",
                                             busy_poll=self.busy_poll)
            ctx = self.ssl_context
            tls = {} if ctx is None else {"ssl": ctx, "server_hostname": host if ctx.check_hostname else ""}
            try:
                _, conn = await asyncio.wait_for(loop.create_connection(factory, host, port, **tls),
                                                 self.connect_timeout_s)
            except (OSError, asyncio.TimeoutError) as e:
                raise ConnectionClosed(f"cannot connect to {addr}: {e or 'timeout'}") from None
            if self.closed:           # close() ran while we were connecting
                conn.close()
                raise ConnectionClosed("client closed")
            conn.attrs["addr"] = addr
            self.connections[addr] = conn
            return conn

    def _closed(self, conn: Connection) -> None:
        addr = conn.attrs.get("addr")
        if addr and self.connections.get(addr) is conn:
            del self.connections[addr]

    def _stamp(self, cmd: RemotingCommand) -> RemotingCommand:
        cmd.language = self.language
        if cmd.serialize_type == SerializeType.JSON:
            cmd.serialize_type = self.serialize_type
        return cmd

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_s: float = 3.0) -> RemotingCommand:
        conn = await self.connection(addr)
        return await conn.request(self._stamp(cmd), timeout_s)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        conn = await self.connection(addr)
        conn.oneway(self._stamp(cmd))

    async def invoke_namesrv(self, cmd: RemotingCommand, timeout_s: float = 3.0) -> RemotingCommand:
        """Try the nameservers in rotation, starting with the last one that worked."""
        if not self.namesrv_addrs:
            raise RemotingError("no nameserver address configured")
        last_error: Exception | None = None
        n = len(self.namesrv_addrs)
        for i in range(n):
            idx = (self._ns_index + i) % n
            addr = self.namesrv_addrs[idx]
            try:
                fresh = RemotingCommand(cmd.code, ext_fields=dict(cmd.ext_fields), body=cmd.body,
                                        serialize_type=cmd.serialize_type)
                resp = await self.invoke(addr, fresh, timeout_s)
                self._ns_index = idx
                return resp
            except RemotingError as e:
                last_error = e
                log.debug("nameserver %s failed: %s", addr, e)
        raise RemotingError(f"no nameserver answered ({'; '.join(self.namesrv_addrs)}): {last_error}")

    async def close(self) -> None:
        self.closed = True
        for conn in list(self.connections.values()):
            conn.close()
        self.connections.clear()


def check_success(resp: RemotingCommand, *ok_codes: int) -> RemotingCommand:
    codes = ok_codes or (ResponseCode.SUCCESS,)
    if resp.code not in codes:
        raise RemotingError(f"code {resp.code}: {resp.remark}")
    return resp
