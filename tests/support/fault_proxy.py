"""A TCP proxy on 127.0.0.1 that injects network faults, switchable at run time.

    async with FaultProxy("127.0.0.1", broker_port) as p:
        client.invoke(p.addr, ...)                 # pass-through
        p.set_fault(Fault.FRAGMENT)                # every byte written on its own
        p.set_fault(Fault.DELAY, delay_s=0.2)      # each chunk held 0.2 s, order kept
        p.set_fault(Fault.BLACKHOLE)               # accepted, read and swallowed
        p.set_fault(Fault.RESET)                   # open links and new ones closed with RST
        p.set_fault(Fault.PASS)
        await p.stop_accepting(); await p.start_accepting()   # refuse, then listen again
        await p.wait_until(lambda: p.bytes_to_server >= 100)

Faults act per chunk as it arrives (a chunk already being forwarded finishes under the
fault it started with); DELAY, BLACKHOLE and FRAGMENT take `direction` ("both",
"to_server" or "to_client"). A link accepted during BLACKHOLE has no upstream
connection and stays a sink after the fault is cleared; RESET aborts every open link at
once (SO_LINGER 0, so both peers see a reset, not a FIN) and every link accepted while
it is on. Counters: bytes received from and forwarded to each side, links accepted and
open. `wait_until(predicate)` wakes on every counter change, so tests need no sleeps.

`RoutingNameServer` puts a proxy in a real cluster's path: it answers route queries by
asking the real nameserver and replacing broker addresses, so a client that resolves
brokers through it dials the proxy.
"""
from __future__ import annotations

import asyncio
import enum
import socket
import struct
from collections.abc import Callable

from pocketmq.protocol.bodies import TopicRouteData, dumps
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from pocketmq.remoting.server import RemotingServer

CHUNK_BYTES = 65536
DIRECTIONS = ("both", "to_server", "to_client")


class Fault(enum.Enum):
    PASS = "pass"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    FRAGMENT = "fragment"
    RESET = "reset"


def _setsockopt(writer: asyncio.StreamWriter, level: int, option: int, value) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(level, option, value)
        except OSError:         # already closed: nothing left to tune
            pass


def _nodelay(writer: asyncio.StreamWriter) -> None:
    _setsockopt(writer, socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _abort_with_rst(writer: asyncio.StreamWriter | None) -> None:
    # SO_LINGER on with a 0 s timeout: close() discards unsent data and sends RST, not FIN
    if writer is not None:
        _setsockopt(writer, socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()


class _Link:
    def __init__(self, client_w: asyncio.StreamWriter):
        self.client_w = client_w
        self.server_w: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task] = []

    def abort(self) -> None:
        _abort_with_rst(self.client_w)
        _abort_with_rst(self.server_w)


class FaultProxy:
    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1", port: int = 0,
                 connect_timeout_s: float = 3.0):
        self.target_host = target_host
        self.target_port = target_port
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self.fault = Fault.PASS
        self.direction = "both"
        self.delay_s = 0.0
        self.bytes_from_client = 0
        self.bytes_to_server = 0
        self.bytes_from_server = 0
        self.bytes_to_client = 0
        self.links_accepted = 0
        self.links: set[_Link] = set()
        self._server: asyncio.base_events.Server | None = None
        self._changed = asyncio.Event()

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> FaultProxy:
        await self.start_accepting()
        return self

    async def start_accepting(self) -> None:
        """Listen (again, on the same port once one was chosen)."""
        if self._server is None:
            self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
            self.port = self._server.sockets[0].getsockname()[1]

    async def stop_accepting(self) -> None:
        """Close the listening socket: new connects are refused, open links stay."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = [t for link in self.links for t in link.tasks]
        for link in list(self.links):
            link.abort()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.links.clear()
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- faults -------------------------------------------------------------------------------
    def set_fault(self, fault: Fault | str, *, delay_s: float = 0.0, direction: str = "both") -> None:
        fault = Fault(fault)
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}")
        if fault is Fault.DELAY and delay_s <= 0:
            raise ValueError("DELAY needs delay_s > 0")
        self.fault, self.delay_s, self.direction = fault, delay_s, direction
        if fault is Fault.RESET:
            self.reset_all()
        self._notify()

    def clear_fault(self) -> None:
        self.set_fault(Fault.PASS)

    def reset_all(self) -> int:
        """Abort every open link with RST now; returns how many."""
        n = len(self.links)
        for link in list(self.links):
            link.abort()
        return n

    def _applies(self, direction: str) -> bool:
        return self.direction == "both" or self.direction == direction

    # -- waiting ------------------------------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Until predicate() holds, re-checked on every counter or link change."""
        async def loop():
            while not predicate():
                await self._changed.wait()
        await asyncio.wait_for(loop(), timeout_s)

    # -- forwarding ---------------------------------------------------------------------------
    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.links_accepted += 1
        link = _Link(client_w)
        self.links.add(link)
        self._notify()
        try:
            if self.fault is Fault.RESET:
                link.abort()
                return
            _nodelay(client_w)
            if self.fault is Fault.BLACKHOLE:
                await self._sink(client_r)
                return
            try:
                server_r, server_w = await asyncio.wait_for(
                    asyncio.open_connection(self.target_host, self.target_port), self.connect_timeout_s)
            except (OSError, asyncio.TimeoutError):
                link.abort()           # the target is down: the client sees a reset, like a refused hop
                return
            link.server_w = server_w
            _nodelay(server_w)
            if self.fault is Fault.RESET:     # switched on while we were connecting
                link.abort()
                return
            up = asyncio.ensure_future(self._pump(client_r, server_w, "to_server", link))
            down = asyncio.ensure_future(self._pump(server_r, client_w, "to_client", link))
            link.tasks = [up, down]
            await asyncio.gather(up, down, return_exceptions=True)
        finally:
            self.links.discard(link)
            if not client_w.transport.is_closing():
                client_w.close()
            if link.server_w is not None and not link.server_w.transport.is_closing():
                link.server_w.close()
            self._notify()

    async def _sink(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                chunk = await reader.read(CHUNK_BYTES)
            except OSError:
                return
            if not chunk:
                return
            self.bytes_from_client += len(chunk)
            self._notify()

    def _count_in(self, direction: str, n: int) -> None:
        if direction == "to_server":
            self.bytes_from_client += n
        else:
            self.bytes_from_server += n

    def _count_out(self, direction: str, n: int) -> None:
        if direction == "to_server":
            self.bytes_to_server += n
        else:
            self.bytes_to_client += n
        self._notify()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str,
                    link: _Link) -> None:
        try:
            while True:
                chunk = await reader.read(CHUNK_BYTES)
                if not chunk:
                    # half-close: pass the FIN on, the other direction may still be talking
                    if writer.can_write_eof() and not writer.transport.is_closing():
                        writer.write_eof()
                    return
                self._count_in(direction, len(chunk))
                fault = self.fault if self._applies(direction) else Fault.PASS
                if fault is Fault.RESET:
                    link.abort()
                    return
                if fault is Fault.BLACKHOLE:
                    self._notify()
                    continue
                if fault is Fault.DELAY:
                    await asyncio.sleep(self.delay_s)
                if fault is Fault.FRAGMENT:
                    for i in range(len(chunk)):
                        writer.write(chunk[i:i + 1])
                        await writer.drain()
                        await asyncio.sleep(0)      # let each byte leave as its own segment
                        self._count_out(direction, 1)
                else:
                    writer.write(chunk)
                    await writer.drain()
                    self._count_out(direction, len(chunk))
        except (ConnectionError, OSError):
            # one side reset or vanished: mirror it to the other side
            link.abort()


class RoutingNameServer:
    """A nameserver front that answers GET_ROUTEINFO_BY_TOPIC from the real nameserver
    with broker addresses rewritten by `addr_map` (real "ip:port" -> proxy "ip:port")."""

    def __init__(self, namesrv_addr: str, addr_map: dict[str, str], timeout_s: float = 3.0):
        self.namesrv_addr = namesrv_addr
        self.addr_map = addr_map
        self.timeout_s = timeout_s
        self.client = RemotingClient()
        self.server = RemotingServer({RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route},
                                     host="127.0.0.1", name="routing-ns")

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    async def _route(self, conn, cmd: RemotingCommand) -> RemotingCommand:
        fwd = RemotingCommand(cmd.code, ext_fields=dict(cmd.ext_fields), body=cmd.body)
        resp = await self.client.invoke(self.namesrv_addr, fwd, self.timeout_s)
        if resp.code != ResponseCode.SUCCESS or not resp.body:
            return cmd.response(resp.code, resp.remark, dict(resp.ext_fields or {}), resp.body)
        route = TopicRouteData.from_body(resp.body_bytes())
        for bd in route.broker_datas:
            bd.broker_addrs = {bid: self.addr_map.get(a, a) for bid, a in bd.broker_addrs.items()}
        return cmd.response(resp.code, resp.remark, dict(resp.ext_fields or {}), dumps(route.to_json()))

    async def start(self) -> RoutingNameServer:
        await self.server.start()
        return self

    async def close(self) -> None:
        await self.server.close()
        await self.client.close()

    async def __aenter__(self) -> RoutingNameServer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()
