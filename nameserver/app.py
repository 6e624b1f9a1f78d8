"""NameServer composition root (asyncio shell over nameserver.route).

    async with NameServer(config) as ns:
        print(ns.port)

`start()` loads kvConfig.json, binds the RemotingServer on `listenPort`
(0 = any free port; `.port` holds the real one), starts the expiry scan task
and logs one readiness line:

    The Name Server boot success. serializeType=JSON, address 0.0.0.0:9876

`close()` cancels the scan, closes the server and its connections, and writes
kvConfig.json safely (common.files.write_file_atomic: tmp file, fsync, os.replace, fsync of the directory).
KV changes are also persisted in the background soon after they happen, as
the Java NameServer does after every PUT/DELETE_KV_CONFIG.

Timers (one task, owned by the object): the scan runs first after at most
5 s and then every `scanNotActiveBrokerInterval` (10 s), the Java schedule; a
broker silent for more than `brokerChannelExpiredTime` (120 s) is dropped and
its connection closed. A connection that closes drops the brokers registered
over it at once. A connection that sends nothing for
`serverChannelMaxIdleTimeSeconds` (120 s; 0 = never) is closed, as Netty's
IdleStateHandler does on the Java NameServer (RemotingServer.close_idle, on
this object's clock); that check runs on the same tick, so it fires up to one
tick late.

Config keys used: listenPort, kvConfigPath, orderMessageEnable,
scanNotActiveBrokerInterval, brokerChannelExpiredTime, maxFrameSize,
serverChannelMaxIdleTimeSeconds (missing keys take RocketMQ's defaults, so a
plain object with some of these attributes works too).
"""
from __future__ import annotations

import asyncio
import logging
import os

from pocketmq.common.files import read_file, write_file_atomic
from pocketmq.nameserver.processors import (
    NamesrvState,
    build_processor_table,
    config_value,
)
from pocketmq.nameserver.route import (
    BROKER_CHANNEL_EXPIRED_MS,
    KVConfig,
    RemovedBroker,
    RouteInfoManager,
)
from pocketmq.protocol.command import FRAME_SIZE_BYTES_MAX_DEFAULT
from pocketmq.protocol.errors import BodyError
from pocketmq.common.acl import NAMESRV_PROTECTED_CODES, AclConfigError
from pocketmq.remoting.acl import AclService, default_acl_path
from pocketmq.remoting.clock import monotonic_ms
from pocketmq.remoting.metrics import RequestLatency, bound_port, serve_metrics, timed_table
from pocketmq.remoting.read_budget import FRAME_READ_TIMEOUT_MS_DEFAULT, READ_BUFFER_BYTES_MAX_DEFAULT
from pocketmq.remoting.server import RemotingServer
from pocketmq.remoting.tls import server_gate
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.namesrv")

DEFAULT_LISTEN_PORT = 9876


class KVConfigFileError(Exception):
    """kvConfig.json exists but cannot be read; the NameServer refuses to start."""


def load_kv_config(path: str | None) -> KVConfig:
    if not path:
        return KVConfig()
    try:
        data = read_file(path)
        return KVConfig() if data is None else KVConfig.from_json_bytes(data)
    except (OSError, UnicodeDecodeError, BodyError) as e:
        raise KVConfigFileError(f"cannot load KV config {path}: {e}") from None


class NameServer:
    def __init__(self, config, *, host: str | None = None, scan_interval_s: float | None = None,
                 first_scan_delay_s: float = 5.0, clock=monotonic_ms):
        self.config = config
        self.host = host or config_value(config, "listenAddress", None) or "0.0.0.0"
        if scan_interval_s is None:
            scan_interval_s = int(config_value(config, "scanNotActiveBrokerInterval", 10_000)) / 1000
        assert scan_interval_s > 0
        self.scan_interval_s = scan_interval_s
        self.first_scan_delay_s = min(first_scan_delay_s, scan_interval_s)
        self.clock = clock
        self.idle_ms = 1000 * int(config_value(config, "serverChannelMaxIdleTimeSeconds", 120))
        self.frame_size_bytes_max = int(config_value(config, "maxFrameSize", FRAME_SIZE_BYTES_MAX_DEFAULT))
        self.routes = RouteInfoManager(broker_channel_expired_ms=int(
            config_value(config, "brokerChannelExpiredTime", BROKER_CHANNEL_EXPIRED_MS)))
        self.kv = KVConfig()
        self.kv_config_path = self._kv_path()
        self.port: int | None = None
        self._server: RemotingServer | None = None
        self._scan_task: asyncio.Task | None = None
        self._kv_flush_task: asyncio.Task | None = None
        self._kv_persisted_version = 0
        self._closed = False
        # Prometheus (metricsPort): request latency per code, the endpoint
        self.request_latency = RequestLatency()
        self.metrics_server: asyncio.AbstractServer | None = None
        self.metrics_port: int | None = None
        # aclEnable: the route and KV writes need an admin account's signature (remoting/acl.py)
        self.acl: AclService | None = None

    def _kv_path(self) -> str | None:
        path = config_value(self.config, "kvConfigPath", None)
        return os.path.expanduser(str(path)) if path else None

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> "NameServer":
        assert self._server is None, "NameServer already started"
        self.kv = await asyncio.to_thread(load_kv_config, self.kv_config_path)
        self._kv_persisted_version = self.kv.version
        state = NamesrvState(self.routes, self.kv, self.config, self.clock, self._on_kv_changed)
        metrics_port = int(config_value(self.config, "metricsPort", 0))
        table = build_processor_table(state)
        if config_value(self.config, "aclEnable", False):
            store_path = config_value(self.config, "configStorePath", None)
            self.acl = AclService(default_acl_path(store_path, config_value(self.config, "aclFilePath", None),
                                                   os.getcwd()),
                                  admin_codes=NAMESRV_PROTECTED_CODES, protected_codes=NAMESRV_PROTECTED_CODES,
                                  name="namesrv")
            try:
                self.acl.load()
            except AclConfigError as e:     # refused like a broken kvConfig.json: the start fails
                raise AclConfigError(f"cannot load the ACL: {e}") from None
            table = self.acl.guard(table)
        if metrics_port:   # timed only when metrics are served: no cost on the request path otherwise
            table = timed_table(table, self.request_latency)
        server = RemotingServer(table, host=self.host,
                                port=int(config_value(self.config, "listenPort", DEFAULT_LISTEN_PORT)),
                                name="namesrv", on_connection_close=self._on_connection_close,
                                frame_size_bytes_max=self.frame_size_bytes_max,
                                max_connections=int(config_value(self.config, "maxConnections", 0)),
                                reserved_fds=int(config_value(self.config, "reservedFileDescriptors", 0)),
                                read_buffer_bytes_max=int(config_value(
                                    self.config, "maxBufferedRequestBytes", READ_BUFFER_BYTES_MAX_DEFAULT)),
                                frame_read_timeout_ms=int(config_value(
                                    self.config, "frameReadTimeoutMillis", FRAME_READ_TIMEOUT_MS_DEFAULT)),
                                tls=server_gate(*(config_value(self.config, k, d) for k, d in (
                                    ("tlsServerMode", "disabled"), ("tlsServerCertPath", None),
                                    ("tlsServerKeyPath", None), ("tlsServerKeyPassword", None))), name="namesrv"))
        self.port = await server.start()
        self._server = server
        self._scan_task = asyncio.create_task(self._scan_loop(), name="namesrv-scan-not-active-broker")
        if self.acl is not None:
            self.acl.start()
        if metrics_port:
            from prometheus_client import CollectorRegistry

            from pocketmq.nameserver.metrics import NamesrvCollector
            registry = CollectorRegistry(auto_describe=False)
            registry.register(NamesrvCollector(self, self.request_latency))
            self.metrics_server = await serve_metrics(self.host, metrics_port, registry)
            self.metrics_port = bound_port(self.metrics_server)
            log.info("metrics served at http://%s:%d/metrics", self.host, self.metrics_port)
        log.info("The Name Server boot success. serializeType=JSON, address %s:%d", self.host, self.port)
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait(self._scan_task)
        self._scan_task = None
        if self.acl is not None:
            await self.acl.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
            await self.metrics_server.wait_closed()
            self.metrics_server = None
        if self._server is not None:
            await self._server.close()
        # A flush in a worker thread cannot be cancelled: let it finish, then write the last state.
        if self._kv_flush_task is not None:
            await asyncio.gather(self._kv_flush_task, return_exceptions=True)
            self._kv_flush_task = None
        await self._persist_kv()
        log.info("The Name Server shut down")

    async def __aenter__(self) -> "NameServer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- broker liveness -------------------------------------------------------------------
    def connection_count(self) -> int:
        return len(self._server.connections) if self._server is not None else 0

    def _on_connection_close(self, conn) -> None:
        for removed in self.routes.remove_by_channel(conn):
            log.info("broker %s removed: its connection closed%s", removed.broker_addr,
                     _names_note(removed))

    async def _scan_loop(self) -> None:
        await asyncio.sleep(self.first_scan_delay_s)
        while True:
            self.scan_not_active_broker()
            self.close_idle_connections()
            await asyncio.sleep(self.scan_interval_s)

    def close_idle_connections(self) -> int:
        """Close connections that sent nothing for serverChannelMaxIdleTimeSeconds (on self.clock)."""
        if self.idle_ms <= 0 or self._server is None:
            return 0
        return self._server.close_idle(self.idle_ms // 1000, self.clock())

    def scan_not_active_broker(self) -> list[RemovedBroker]:
        removed = self.routes.expire(self.clock())
        for r in removed:
            log.warning("broker %s removed: no registration for %d ms%s", r.broker_addr,
                        self.routes.broker_channel_expired_ms, _names_note(r))
            close = getattr(r.channel_key, "close", None)
            if close is not None:
                close()
        return removed

    # -- KV persistence ----------------------------------------------------------------------
    def _on_kv_changed(self) -> None:
        if self.kv_config_path is None or self._closed:
            return
        if self._kv_flush_task is None or self._kv_flush_task.done():
            self._kv_flush_task = asyncio.create_task(self._persist_kv(), name="namesrv-kv-persist")

    async def _persist_kv(self) -> None:
        # Loop until the file holds the latest version (changes may land during a write).
        while self.kv_config_path is not None and self.kv.version != self._kv_persisted_version:
            version = self.kv.version
            data = self.kv.to_json_bytes()
            try:
                await asyncio.to_thread(write_file_atomic, self.kv_config_path, data)
            except OSError as e:
                log.error("persist KV config to %s failed: %s", self.kv_config_path, e)
                return
            self._kv_persisted_version = version


def _names_note(r: RemovedBroker) -> str:
    return f"; broker names gone: {', '.join(r.broker_names_removed)}" if r.broker_names_removed else ""
