"""The gRPC server's shell: a `grpc.aio` server created on the broker's running event loop,
its bounds, and its Prometheus collector.

Bounds (grpc channel arguments): one message at most maxFrameSize bytes (received and
sent); MAX_CONCURRENT_STREAMS streams per HTTP/2 connection; MAX_CONCURRENT_RPCS RPCs in
flight for the whole server (beyond: RESOURCE_EXHAUSTED, at once); keepalive pings drop
peers that vanished. A stream whose client does not read stalls only its own handler
(HTTP/2 flow control per stream); the Telemetry outbox is bounded (service.py).

Why this set-up (bench/bench_grpc_floor.py, docs/benchmarks.md "Where a 5.x send's time
goes"): a no-op unary call costs ~250-300 us of server CPU in grpcio here, on uvloop or the
default loop alike; a sync grpc.server handing each call to the loop costs more; no
channel option or poll strategy changed it measurably. What the handlers may not do is
block: they run on the broker's loop.
"""
from __future__ import annotations

import logging

log = logging.getLogger("pocketmq.broker.proxy")

MAX_CONCURRENT_STREAMS = 1000
MAX_CONCURRENT_RPCS = 20_000
KEEPALIVE_MS = 60_000


class _GenericOnly:
    """A grpc server seen through the generated `add_..._to_server`, which registers every
    RPC twice: as a generic handler (a dict lookup per call) and as a "registered method".
    grpc.aio (1.85) asks the core for the next call of each registered method with a
    future of its own and, for every call accepted, `asyncio.wait`s on all of them: 17
    RPCs + 1 generic = 18 futures, 18 done callbacks added and 17 removed per call, the
    largest Python cost of a no-op call in the server (bench/bench_grpc_floor.py,
    docs/benchmarks.md). With the generic handler alone it waits on one future."""

    def __init__(self, server):
        self._server = server

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service_name: str, handlers: dict) -> None:
        pass     # deliberately not: see the class's docstring


def add_servicer(servicer, server) -> None:
    """MessagingService's RPCs on a grpc (aio or sync) server, as generic handlers only."""
    from pocketmq.broker.proxy.pb import service_pb2_grpc
    service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, _GenericOnly(server))


class GrpcPortInUse(OSError):
    """The gRPC endpoint's port could not be bound (`pocketmq dev` then starts without it)."""


class GrpcEndpoint:
    """Start with `await start()` (inside the running loop), stop with `await stop()`."""

    def __init__(self, ctx, processors: dict, *, host: str, port: int, advertised_host: str,
                 max_message_bytes: int, acl=None):
        self.ctx = ctx
        self.acl = acl           # aclEnable: the broker's AclService (every call checked: auth.py)
        self.processors = processors
        self.host = host
        self.port = port
        self.advertised_host = advertised_host
        self.max_message_bytes = max_message_bytes
        self.server = None
        self.service = None

    async def start(self) -> int:
        import grpc

        from pocketmq.broker.proxy.service import MessagingService
        options = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
            ("grpc.keepalive_time_ms", KEEPALIVE_MS),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.so_reuseport", 0),
        ]
        self.server = grpc.aio.server(options=options, maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            port = self.server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError:        # grpcio >= 1.5x raises where older ones returned 0
            port = 0
        if port == 0:
            raise GrpcPortInUse(f"cannot listen on grpcServerPort {self.port} ({self.host}): the port is in use "
                                f"(or not allowed); pick another with grpcServerPort")
        self.port = port
        self.service = MessagingService(self.ctx, self.processors, grpc_port=port,
                                        advertised_host=self.advertised_host)
        servicer = self.service
        if self.acl is not None:
            from pocketmq.broker.proxy.auth import GrpcAclGuard, guard_servicer
            servicer = guard_servicer(self.service, GrpcAclGuard(self.acl))
        add_servicer(servicer, self.server)
        await self.server.start()
        return port

    async def stop(self, grace_s: float = 1.0) -> None:
        if self.server is not None:
            if self.service is not None:
                for ch in list(self.service.clients.values()):
                    ch.close()     # ends their Telemetry streams before the grace period
            await self.server.stop(grace_s)
            self.server = None


class GrpcCollector:
    """/metrics: gRPC clients by type, language and version; calls by RPC and status code."""

    def __init__(self, endpoint: GrpcEndpoint, labels: list[str], values: list[str]):
        self.endpoint = endpoint
        self.labels = labels
        self.values = values

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        svc = self.endpoint.service
        clients = GaugeMetricFamily("pocketmq_grpc_clients", "RocketMQ 5.x clients known to the gRPC endpoint",
                                    labels=self.labels + ["client_type", "language", "version"])
        calls = CounterMetricFamily("pocketmq_grpc_calls", "gRPC calls answered, by RPC and v2 status code",
                                    labels=self.labels + ["rpc", "code"])
        if svc is not None:
            counts: dict = {}
            for ch in list(svc.clients.values()):
                info = ch.info
                key = (info.client_type, info.language_name, info.version_text) if info is not None \
                    else ("CLIENT_TYPE_UNSPECIFIED", "", "")
                counts[key] = counts.get(key, 0) + 1
            for key, n in sorted(counts.items()):
                clients.add_metric(self.values + list(key), n)
            for (rpc, code), n in sorted(svc.calls.items()):
                calls.add_metric(self.values + [rpc, str(code)], n)
        yield clients
        yield calls
