"""tests/support/fault_proxy.py: each fault against a small echo server, then the real
broker (in-process) through our remoting client and through a Producer whose routes
name the proxy (RoutingNameServer)."""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from pocketmq.client import Message, Producer, RemotingFailure, RequestTimeoutError
from pocketmq.protocol.codes import RequestCode as R, ResponseCode as C
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient
from pocketmq.remoting.connection import ConnectionClosed, RequestTimeout
from tests.integration.test_broker import send_cmd
from tests.support.fault_proxy import Fault, FaultProxy, RoutingNameServer
from tests.support.local import local_cluster

pytestmark = pytest.mark.asyncio

# Only to prove that nothing arrives (an absence cannot be awaited); never on a success path.
SILENCE_S = 0.3


class EchoServer:
    def __init__(self):
        self.reads: list[bytes] = []        # every chunk the server read, in order
        self.server = None
        self.port = 0

    async def _handle(self, r, w):
        try:
            while chunk := await r.read(65536):
                self.reads.append(chunk)
                w.write(chunk)
                await w.drain()
        except ConnectionError:
            pass
        finally:
            w.close()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    @property
    def received(self) -> bytes:
        return b"".join(self.reads)


@contextlib.asynccontextmanager
async def echo_and_proxy():
    async with EchoServer() as echo, FaultProxy("127.0.0.1", echo.port) as proxy:
        yield echo, proxy


async def dial(proxy: FaultProxy):
    host, port = proxy.addr.split(":")
    return await asyncio.open_connection(host, int(port))


async def roundtrip(r, w, data: bytes) -> bytes:
    w.write(data)
    await w.drain()
    return await asyncio.wait_for(r.readexactly(len(data)), 5)


async def assert_silent(r):
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(r.read(1), SILENCE_S)


# --------------------------------------------------------------------------- echo server

async def test_pass_through_counts_bytes_each_way():
    async with echo_and_proxy() as (echo, proxy):
        r, w = await dial(proxy)
        assert await roundtrip(r, w, b"hello proxy") == b"hello proxy"
        await proxy.wait_until(lambda: proxy.bytes_to_client == 11)
        assert (proxy.bytes_from_client, proxy.bytes_to_server, proxy.bytes_from_server) == (11, 11, 11)
        assert proxy.links_accepted == 1 and len(proxy.links) == 1
        w.close()
        await proxy.wait_until(lambda: not proxy.links)


async def test_half_close_passes_the_fin_and_keeps_the_reply():
    async with echo_and_proxy() as (echo, proxy):
        r, w = await dial(proxy)
        w.write(b"last words")
        w.write_eof()
        assert await asyncio.wait_for(r.read(), 5) == b"last words"    # read() to EOF


async def test_fragment_writes_one_byte_at_a_time():
    async with echo_and_proxy() as (echo, proxy):
        r, w = await dial(proxy)
        proxy.set_fault(Fault.FRAGMENT, direction="to_server")
        data = bytes(range(64))
        assert await roundtrip(r, w, data) == data
        assert echo.received == data
        # 64 separate writes; the receiver's reads may still merge a few of them
        assert len(echo.reads) > 8, [len(c) for c in echo.reads]
        assert proxy.bytes_to_server == 64


async def test_delay_holds_each_chunk():
    async with echo_and_proxy() as (echo, proxy):
        r, w = await dial(proxy)
        proxy.set_fault(Fault.DELAY, delay_s=0.25, direction="to_client")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await roundtrip(r, w, b"slow") == b"slow"
        assert loop.time() - t0 >= 0.25
        assert echo.received == b"slow"
        proxy.clear_fault()
        assert await roundtrip(r, w, b"fast") == b"fast"


async def test_blackhole_swallows_on_open_and_new_links():
    async with echo_and_proxy() as (echo, proxy):
        r, w = await dial(proxy)
        assert await roundtrip(r, w, b"a") == b"a"
        proxy.set_fault(Fault.BLACKHOLE)
        w.write(b"lost")
        await proxy.wait_until(lambda: proxy.bytes_from_client == 5)
        r2, w2 = await dial(proxy)                  # accepted, never connected upstream
        w2.write(b"also lost")
        await proxy.wait_until(lambda: proxy.bytes_from_client == 14)
        await assert_silent(r)
        await assert_silent(r2)
        assert echo.received == b"a" and proxy.bytes_to_server == 1
        proxy.clear_fault()
        assert await roundtrip(r, w, b"back") == b"back"
        assert echo.received == b"aback"


async def test_blackhole_one_direction_loses_only_replies():
    async with echo_and_proxy() as (echo, proxy):
        r, w = await dial(proxy)
        proxy.set_fault(Fault.BLACKHOLE, direction="to_client")
        w.write(b"request")
        await proxy.wait_until(lambda: proxy.bytes_from_server == 7)
        assert echo.received == b"request"
        await assert_silent(r)


async def test_reset_aborts_open_links_and_new_ones_until_cleared():
    async with echo_and_proxy() as (echo, proxy):
        r, w = await dial(proxy)
        assert await roundtrip(r, w, b"x") == b"x"
        proxy.set_fault(Fault.RESET)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(r.read(1), 5)
        r2, w2 = await dial(proxy)                  # the handshake completes, then RST
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(r2.read(1), 5)
        await proxy.wait_until(lambda: not proxy.links)
        proxy.clear_fault()
        r3, w3 = await dial(proxy)
        assert await roundtrip(r3, w3, b"again") == b"again"


async def test_stop_accepting_refuses_new_links_and_keeps_open_ones():
    async with echo_and_proxy() as (echo, proxy):
        r, w = await dial(proxy)
        port = proxy.port
        await proxy.stop_accepting()
        with pytest.raises(ConnectionRefusedError):
            await dial(proxy)
        assert await roundtrip(r, w, b"still here") == b"still here"
        await proxy.start_accepting()
        assert proxy.port == port
        r2, w2 = await dial(proxy)
        assert await roundtrip(r2, w2, b"new") == b"new"


async def test_target_down_resets_the_client():
    async with EchoServer() as echo:
        port = echo.port
    async with FaultProxy("127.0.0.1", port) as proxy:
        r, w = await dial(proxy)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(r.read(1), 5)


async def test_bad_fault_arguments():
    async with echo_and_proxy() as (echo, proxy):
        with pytest.raises(ValueError):
            proxy.set_fault(Fault.DELAY)
        with pytest.raises(ValueError):
            proxy.set_fault("sideways")
        with pytest.raises(ValueError):
            proxy.set_fault(Fault.BLACKHOLE, direction="up")
        assert proxy.fault is Fault.PASS


# --------------------------------------------------------------------------- the real broker

def runtime_info() -> RemotingCommand:
    return RemotingCommand(R.GET_BROKER_RUNTIME_INFO)


async def test_remoting_client_through_the_proxy_to_the_broker(tmp_path):
    async with local_cluster(str(tmp_path), with_namesrv=False) as (_, broker):
        host, port = broker.addr.split(":")
        async with FaultProxy(host, int(port)) as proxy:
            client = RemotingClient(connect_timeout_s=2)
            try:
                resp = await client.invoke(proxy.addr, send_cmd("ProxyT", b"whole"), 5)
                assert resp.code == C.SUCCESS, resp.remark
                proxy.set_fault(Fault.FRAGMENT)
                resp = await client.invoke(proxy.addr, send_cmd("ProxyT", b"in pieces"), 10)
                assert resp.code == C.SUCCESS, resp.remark
                assert resp.ext_fields["queueOffset"] == "1"

                proxy.set_fault(Fault.BLACKHOLE)
                with pytest.raises(RequestTimeout):
                    await client.invoke(proxy.addr, runtime_info(), 0.5)

                proxy.set_fault(Fault.RESET)
                with pytest.raises(ConnectionClosed):
                    await client.invoke(proxy.addr, runtime_info(), 5)
                proxy.clear_fault()
                accepted = proxy.links_accepted
                resp = await client.invoke(proxy.addr, runtime_info(), 5)     # a new connection
                assert resp.code == C.SUCCESS
                assert proxy.links_accepted == accepted + 1
            finally:
                await client.close()


async def test_producer_through_the_proxy(tmp_path):
    async with local_cluster(str(tmp_path)) as (ns, broker):
        host, port = broker.addr.split(":")
        async with FaultProxy(host, int(port)) as proxy, \
                RoutingNameServer(ns, {broker.addr: proxy.addr}) as routing:
            async with Producer("ProxyPG", routing.addr, instance_name="fault-proxy",
                                send_timeout_ms=2000, latency_fault_enable=False) as p:
                r = await p.send(Message("ProxyTopic", b"through the proxy"))
                assert r.status.name == "SEND_OK"
                assert proxy.bytes_to_server > 0 and proxy.links_accepted >= 1

                proxy.set_fault(Fault.FRAGMENT)
                r = await p.send(Message("ProxyTopic", b"one byte at a time"))
                assert r.status.name == "SEND_OK"

                proxy.set_fault(Fault.BLACKHOLE)
                with pytest.raises(RequestTimeoutError):
                    await p.send(Message("ProxyTopic", b"into the void"), timeout_ms=500)

                proxy.set_fault(Fault.RESET)
                with pytest.raises(RemotingFailure) as e:
                    await p.send(Message("ProxyTopic", b"reset"))
                assert not isinstance(e.value, RequestTimeoutError), e.value
                await proxy.wait_until(lambda: not proxy.links)

                proxy.clear_fault()
                accepted = proxy.links_accepted
                r = await p.send(Message("ProxyTopic", b"reconnected"))
                assert r.status.name == "SEND_OK"
                assert proxy.links_accepted > accepted
