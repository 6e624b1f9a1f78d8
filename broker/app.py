"""Broker composition root: store + rules + processors + timers.

This module only wires and runs things: it builds the collaborators, hands the
processors their BrokerContext (processors/context.py) and the services what
each needs, and owns the loops (nameserver registration, metadata persistence,
housekeeping). Request logic lives in broker/processors, rules in broker/core.

Start order: bind the listening socket (its port is the store host written
into every record), open the store (recovery), load metadata, then serve,
register with every nameserver, and log one readiness line. Close order:
stop accepting (and stop parking pulls), stop the schedule, timer and transaction
check services, answer held pulls, stop the timers, unregister from the nameservers, close the
connections, stop the flush thread, close the store (final flush,
checkpoint), persist metadata (unless the start failed before loading it).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
from functools import partial

from pocketmq.broker.core.clients import ConsumerManager, ProducerManager
from pocketmq.broker.core.delay import ScheduleCursors
from pocketmq.broker.core.held_pulls import HeldPullTable
from pocketmq.broker.core.locks import RebalanceLockManager
from pocketmq.broker.core.offsets import ConsumerOffsetManager
from pocketmq.broker.core.subscription_groups import SubscriptionGroupManager
from pocketmq.broker.core.topics import TopicConfigManager
from pocketmq.broker.core.transaction import DecidedTransactions
from pocketmq.broker.processors import build_processor_table
from pocketmq.broker.processors.client_manage import (
    connection_closed,
    notify_consumer_ids_changed,
)
from pocketmq.broker.processors import end_transaction
from pocketmq.broker.processors.context import BrokerContext, BrokerStats
from pocketmq.broker.processors.ha_status import ha_runtime_info
from pocketmq.broker.processors.pull import replay
from pocketmq.broker.processors.send_back import store_back
from pocketmq.broker.config import BrokerRole
from pocketmq.broker.services.flush import FlushService
from pocketmq.broker.services.warm import PageWarmer, warm_ahead_bytes
from pocketmq.broker.services.ha import HAMaster, HASlave
from pocketmq.broker.services.hold import HoldService
from pocketmq.broker.services.pop import PopService, load_secret, replay_held
from pocketmq.broker.services.index_pump import IndexPump
from pocketmq.broker.services.schedule import ScheduleService
from pocketmq.broker.services.timer import TimerService
from pocketmq.broker.services.slave_sync import SlaveSyncService, take_back_offsets
from pocketmq.broker.services.stats import run_stats_ticks
from pocketmq.broker.services.transaction_check import TransactionCheckService
from pocketmq.common.constants import SCHEDULE_TOPIC, TIMER_TOPIC
from pocketmq.common.files import write_file_atomic
from pocketmq.protocol import bodies
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.codes import PermName, RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.message import body_crc
from pocketmq.protocol.acl import sign_request
from pocketmq.remoting.acl import AclService, default_acl_path
from pocketmq.common.acl import AclConfigError
from pocketmq.remoting.client import RemotingClient
from pocketmq.remoting.tls import client_context, server_gate
from pocketmq.remoting.clock import monotonic_ms
from pocketmq.remoting.metrics import LatencyHistogram, RequestLatency, bound_port, serve_metrics, timed_table
from pocketmq.remoting.server import RemotingServer

log = logging.getLogger("pocketmq.broker")


class HAPortError(OSError):
    """The HA port (haListenPort) could not be bound; errno says why (in use, not allowed,
    not an address of this host). `pocketmq dev` names the port and the flag that moves it."""


class MetadataError(Exception):
    """A metadata file (topics.json, consumerOffset.json, ...) cannot be read."""


_write_atomic = write_file_atomic


def _nothing() -> None:
    pass


async def resolve_store_host(host: str, port: int) -> tuple[bytes, int]:
    """STOREHOST (address bytes, port) of ``brokerIP1:listenPort``.

    An IP literal is taken as is. A host name (a compose service name such as
    ``broker-a``) is resolved once at start to its IPv4 address, as Java's
    ``new InetSocketAddress(brokerIP1, port)`` does; the registered address
    stays the name, so clients resolve it themselves. Raises OSError naming
    brokerIP1 when the name does not resolve.
    """
    try:
        return msgcodec.parse_host(f"{host}:{port}")
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, family=socket.AF_INET,
                                                              type=socket.SOCK_STREAM)
    except OSError as e:
        raise OSError(f"brokerIP1 {host!r} does not resolve to an IPv4 address: {e}") from None
    return msgcodec.parse_host(f"{infos[0][4][0]}:{port}")


class Broker:
    def __init__(self, config, *, clock=time.time, host: str = "0.0.0.0", config_path: str | None = None,
                 link=None):
        self.config = config
        # controller mode: this broker's tie to its failover agent (services/failover.py
        # ControllerLink: epoch, SyncStateSet, lease fence), which starts and stops it; None: 4.x
        self.link = link
        # False when the failover agent restarts this broker in another role at once: the
        # new registration replaces it (an unregister would drop the name's topics from the
        # route in between, and clients refreshing then would find none)
        self.unregister_on_close = True
        # The listening address: every interface, as RocketMQ's broker; `pocketmq dev` passes
        # 127.0.0.1 (its --bind flag widens it).
        self.host = host
        # the -c file: UPDATE_BROKER_CONFIG writes changed keys back into it, as Java does
        self.config_path = config_path
        self._clock = clock
        self.topics = TopicConfigManager(
            cluster_name=config.brokerClusterName, broker_name=config.brokerName,
            auto_create_topic_enable=config.autoCreateTopicEnable,
            default_topic_queue_nums=config.defaultTopicQueueNums,
            cluster_topic_enable=config.clusterTopicEnable, broker_topic_enable=config.brokerTopicEnable,
            trace_topic_enable=config.traceTopicEnable)
        self.offsets = ConsumerOffsetManager()
        self.groups = SubscriptionGroupManager(config.autoCreateSubscriptionGroup)
        self.consumers = ConsumerManager()
        self.producers = ProducerManager()
        self.locks = RebalanceLockManager()
        self.held_pulls = HeldPullTable(config.maxHeldPulls, config.maxHeldPullsPerConnection)
        self.delay_levels = config.delay_levels_ms()
        self.schedule_cursors = ScheduleCursors()
        self.schedule_service: ScheduleService | None = None
        self.timer_service: TimerService | None = None     # RocketMQ 5's timer messages
        self.transactions = DecidedTransactions()
        self.transaction_service: TransactionCheckService | None = None
        self.sync_flush = config.flushDiskType == "SYNC_FLUSH"
        self.server: RemotingServer | None = None
        self.store = None
        self.flush_service: FlushService | None = None
        self.page_warmer: PageWarmer | None = None
        self.hold_service: HoldService | None = None
        # enableProxy: the gRPC endpoint for RocketMQ 5.x clients (broker/proxy/server.py)
        self.grpc_endpoint = None
        self.pop_service: PopService | None = None
        self.index_pump: IndexPump | None = None
        # replication: a master serves its slaves the HA stream; a slave follows its master
        self.is_slave = config.brokerRole is BrokerRole.SLAVE
        self.ha_master: HAMaster | None = None
        self.ha_slave: HASlave | None = None
        self.ha_port = config.haListenPort
        # the master's remoting and HA addresses, from the nameservers' REGISTER_BROKER answers
        self.master_addr: str | None = None
        # a slave's copy of its master's topics, groups and offsets (services/slave_sync.py)
        self.slave_sync: SlaveSyncService | None = None
        # useTLS: the broker's own connections (nameservers, a slave's metadata sync) over TLS
        self.ns_client = RemotingClient(ssl_context=client_context() if config.useTLS else None)
        self.stats = BrokerStats()
        # Prometheus (metricsPort): request latency per code, flush latency, the endpoint
        self.request_latency = RequestLatency()
        self.flush_latency = LatencyHistogram()
        self.metrics_server: asyncio.AbstractServer | None = None
        self.metrics_port: int | None = None
        # The processors' view of the broker; built by start() once the store is open.
        self.ctx: BrokerContext | None = None
        # aclEnable: the plain ACL checking every request (remoting/acl.py); None when off
        self.acl: AclService | None = None
        self._processors: dict = {}
        self._tasks: list[asyncio.Task] = []
        self._register_now = asyncio.Event()
        self.addr = ""
        self.store_host = (b"\x7f\x00\x00\x01", 0)
        self.recovery_report = None
        self.closing = False
        self._metadata_loaded = False
        self._topics_dirty = False
        self._persist_lock = asyncio.Lock()
        # Publication of auto-created topics (publish_topics): requests are numbered, one
        # publication at a time covers every request made before it started.
        self.unpublished_topics: set[str] = set()
        self._publish_lock = asyncio.Lock()
        self._publish_requested = 0
        self._published = 0

    # -- clock -----------------------------------------------------------------------
    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    # For deadlines (held pulls): immune to wall-clock steps.
    mono_ms = staticmethod(monotonic_ms)

    # -- paths ----------------------------------------------------------------------
    @property
    def root(self) -> str:
        return os.path.expanduser(self.config.storePathRootDir)

    def _config_path(self, name: str) -> str:
        return os.path.join(self.root, "config", name)

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        if cfg.aclEnable:
            # before anything listens: a broken ACL file refuses the start, as Java's does
            fallback = os.path.join(cfg.rocketmqHome, "conf") if cfg.rocketmqHome else os.getcwd()
            self.acl = AclService(default_acl_path(self.config_path, cfg.aclFilePath, fallback))
            try:
                self.acl.load()
            except (AclConfigError, OSError) as e:
                raise MetadataError(f"cannot load the ACL: {e}") from None
        # The table is filled (below) before serving starts: its handlers need the opened store,
        # which needs our port (the store host of every record) first.
        self.server = RemotingServer(self._processors, host=self.host, port=cfg.listenPort,
                                     frame_size_bytes_max=cfg.maxFrameSize, name="broker",
                                     on_connection_close=self._on_connection_close,
                                     busy_poll_us=cfg.busyPollMicros, max_connections=cfg.maxConnections,
                                     reserved_fds=cfg.reservedFileDescriptors,
                                     read_buffer_bytes_max=cfg.maxBufferedRequestBytes,
                                     frame_read_timeout_ms=cfg.frameReadTimeoutMillis,
                                     tls=server_gate(cfg.tlsServerMode, cfg.tlsServerCertPath, cfg.tlsServerKeyPath,
                                                     cfg.tlsServerKeyPassword, "broker"))
        port = await self.server.start(start_serving=False)
        self.addr = f"{cfg.brokerIP1}:{port}"
        self.store_host = await resolve_store_host(cfg.brokerIP1, port)
        self._open_store()
        self._load_metadata()
        self._metadata_loaded = True
        self.flush_service = FlushService(self.store, sync=self.sync_flush,
                                          # SYNC: woken by each waiting send (group commit); the
                                          # interval is only a fallback.
                                          interval_ms=50 if self.sync_flush else cfg.flushIntervalCommitLog,
                                          latency=self.flush_latency)
        self.flush_service.start()
        self.page_warmer = PageWarmer(self.store, warm_ahead_bytes(cfg))
        self.page_warmer.start()
        await self._start_replication()
        self.ctx = ctx = self._context()
        # POP consumption (services/pop.py): the processors and the gRPC endpoint reach it as ctx.pop
        self.pop_service = PopService(ctx, secret=load_secret(self._config_path("popSecret")),
                                      store_back=partial(store_back, ctx))
        self.ctx = ctx = dataclasses.replace(ctx, pop=self.pop_service)
        table = grpc_table = build_processor_table(ctx)
        if self.acl is not None:
            table = self.acl.guard(table)     # the check before every processor
        # timed only when metrics are served: no cost on the request path otherwise
        self._processors.update(timed_table(table, self.request_latency) if cfg.metricsPort else table)
        # (replay_held: a parked pop is woken to pop again, a pull replayed)
        self.hold_service = HoldService(self.held_pulls, partial(replay_held, partial(replay, ctx)),
                                        mono_ms=self.mono_ms,
                                        max_offset_of=self.store.get_max_offset_in_queue,
                                        rescan_interval_ms=5000 if cfg.longPollingEnable
                                        else cfg.shortPollingTimeMills)
        self.hold_service.start()
        self.schedule_service = ScheduleService(self.store, self.schedule_cursors, self.delay_levels,
                                                now_ms=self.now_ms)
        held_dispatch = self.pop_service.hold_dispatch = self.hold_service.on_dispatch
        pop_dispatch = self.pop_service.on_dispatch

        def hold_dispatch(topic, queue_id, max_offset, tags_code, store_ts):
            held_dispatch(topic, queue_id, max_offset, tags_code, store_ts)
            pop_dispatch(topic, queue_id, max_offset, tags_code, store_ts)   # pops waiting on the topic
        # a slave delivers no delayed messages and checks no transactions: its master does,
        # and the records it writes for them arrive here through the HA stream
        schedule_wake = self.schedule_service.wake if not self.is_slave else _nothing
        if cfg.timerWheelEnable and not self.is_slave:
            self.timer_service = TimerService(self.store, capacity=cfg.timerMaxInMemory, born_host=self.store_host,
                                              now_ms=self.now_ms, checkpoint_interval_ms=cfg.timerFlushIntervalMs)
        timer_wake = self.timer_service.wake if self.timer_service is not None else _nothing
        ha_notify = self.ha_master.notify if self.ha_master is not None else _nothing
        if cfg.messageIndexEnable:
            # a slave behind its master copies first, indexes once caught up
            hold = (lambda: self.ha_slave.behind) if self.ha_slave is not None else None
            self.index_pump = pump = IndexPump(self.store, self.server.busy_poll, hold)
            if self.ha_slave is not None:
                self.ha_slave.on_caught_up = pump.kick
            index_kick = pump.kick

            def on_dispatch(topic, queue_id, max_offset, tags_code, store_ts):
                if topic == SCHEDULE_TOPIC:
                    schedule_wake()
                elif topic == TIMER_TOPIC:
                    timer_wake()
                hold_dispatch(topic, queue_id, max_offset, tags_code, store_ts)
                index_kick()
                ha_notify()
        else:
            def on_dispatch(topic, queue_id, max_offset, tags_code, store_ts):
                if topic == SCHEDULE_TOPIC:
                    schedule_wake()
                elif topic == TIMER_TOPIC:
                    timer_wake()
                hold_dispatch(topic, queue_id, max_offset, tags_code, store_ts)
                ha_notify()
        self.store.on_dispatch = on_dispatch
        if not self.is_slave:
            self.schedule_service.start()
            if self.timer_service is not None:
                self.timer_service.start()
            # Decisions are rebuilt from the op queue before END_TRANSACTION can be served.
            self.transaction_service = TransactionCheckService(
                ctx, interval_ms=cfg.transactionCheckInterval, timeout_ms=cfg.transactionTimeOut,
                check_max=cfg.transactionCheckMax, discard=partial(end_transaction.discard, ctx))
            self.transaction_service.recover()
            self.transaction_service.start()
            # popped-but-unacked messages rebuilt from the revive log before serving
            self.pop_service.recover()
            self.pop_service.start()
        if not self.is_slave and cfg.namesrvAddr:
            # before serving: offsets consumers committed to a slave while this master was away
            if await take_back_offsets(cfg.namesrvAddr, cfg.brokerName, self.addr, self.offsets,
                                       credentials=self._own_credentials(),
                                       **({"client": self.ns_client} if cfg.useTLS else {})):
                await self._persist_async()
        self.stats.boot_timestamp = self.now_ms()
        await self.server.start_serving()
        if cfg.enableProxy:
            # the unguarded table: the endpoint checks each gRPC call itself (broker/proxy/auth.py)
            await self._start_grpc(grpc_table)
        if self.acl is not None:
            self.acl.start()
        if cfg.metricsPort:
            await self._serve_metrics()
        if cfg.namesrvAddr:
            self.ns_client.set_namesrv_addr(cfg.namesrvAddr)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._register_loop(), name="register-namesrv"),
                       loop.create_task(self._persist_loop(), name="persist"),
                       loop.create_task(self._housekeeping_loop(), name="housekeeping"),
                       loop.create_task(run_stats_ticks(self.stats, self.now_ms), name="stats"),
                       loop.create_task(self._dispatch_catch_up_loop(), name="dispatch-catch-up")]
        if cfg.namesrvAddr:
            await self.register_all()
        if self.ha_slave is not None:
            self.ha_slave.start()
            self.slave_sync = SlaveSyncService(
                master_addr=lambda: self.master_addr, own_addr=self.addr, topics=self.topics, groups=self.groups,
                offsets=self.offsets, cursors=self.schedule_cursors, persist=self._persist_async,
                period_ms=cfg.slaveSyncIntervalMillis, first_delay_ms=min(3000, cfg.slaveSyncIntervalMillis),
                delete_queues=self.store.delete_topics, credentials=self._own_credentials(),
                **({"client": self.ns_client} if cfg.useTLS else {}))
            self.slave_sync.start()
        log.info("The broker[%s, %s] boot success. serializeType=JSON and name server is %s",
                 cfg.brokerName, self.addr, cfg.namesrvAddr)
        if self.ha_master is not None:
            log.info("%s (brokerId %d) serves its slaves on HA port %d", cfg.brokerRole.value, cfg.brokerId,
                     self.ha_port)
        else:
            log.info("SLAVE (brokerId %d) of %s follows its master at %s", cfg.brokerId, cfg.brokerName,
                     self.ha_slave.master_ha_addr or "the address the nameservers give")

    async def _start_grpc(self, processors: dict) -> None:
        """The gRPC endpoint (RocketMQ's proxy in local mode) on this loop, calling the
        processor table (unguarded: with aclEnable the endpoint checks every call against
        the same accounts before it reaches a processor, broker/proxy/auth.py)."""
        try:
            from pocketmq.broker.proxy.server import GrpcEndpoint
            import grpc  # noqa: F401
        except ImportError as e:
            raise OSError(f"enableProxy needs the grpc extra (pip install 'pocketmq[grpc]'): {e}") from None
        cfg = self.config
        self.grpc_endpoint = GrpcEndpoint(self.ctx, processors, host=self.host, port=cfg.grpcServerPort,
                                          advertised_host=cfg.brokerIP1, max_message_bytes=cfg.maxFrameSize,
                                          acl=self.acl)
        port = await self.grpc_endpoint.start()
        log.info("gRPC endpoint for RocketMQ 5.x clients listening on %s:%d (advertised %s:%d)", self.host, port,
                 cfg.brokerIP1, port)

    def _own_credentials(self) -> tuple[str, str] | None:
        """The broker's own account (accessKey/secretKey), signing what it asks other brokers
        (a slave's metadata sync, a returning master's take-back) as it signs REGISTER_BROKER."""
        cfg = self.config
        return (cfg.accessKey, cfg.secretKey) if cfg.accessKey and cfg.secretKey else None

    async def _start_replication(self) -> None:
        cfg = self.config
        if self.is_slave:
            self.ha_slave = HASlave(self.store, master_ha_addr=cfg.haMasterAddress or None,
                                    report_ms=cfg.haSendHeartbeatInterval, housekeeping_ms=cfg.haHousekeepingInterval,
                                    segment_size=cfg.mappedFileSizeCommitLog, busy_poll=self.server.busy_poll,
                                    link=self.link)
            if self.link is not None:
                # nothing is known confirmed until the master says (a failover may cut our tail)
                self.store.set_confirm_offset(0)
            return
        self.ha_master = HAMaster(self.store, host=self.host, port=cfg.haListenPort,
                                  batch_bytes=cfg.haTransferBatchSize, heartbeat_ms=cfg.haSendHeartbeatInterval,
                                  housekeeping_ms=cfg.haHousekeepingInterval, gap_max=cfg.haSlaveFallbehindMax,
                                  link=self.link)
        if self.link is not None:
            self.ha_master.sync_changed()      # the confirm offset as the SyncStateSet says
        try:
            self.ha_port = await self.ha_master.start()
        except OSError as e:
            self.ha_master = None
            raise HAPortError(e.errno, f"cannot listen on haListenPort {cfg.haListenPort} (the HA port slaves "
                                       f"replicate from; listenPort + 1 unless set): {e.strerror}") from None

    def _context(self) -> BrokerContext:
        cfg = self.config
        return BrokerContext(
            config=cfg, store=self.store, topics=self.topics, offsets=self.offsets, groups=self.groups,
            consumers=self.consumers, producers=self.producers, locks=self.locks, held_pulls=self.held_pulls,
            stats=self.stats, flush_service=self.flush_service, sync_flush=self.sync_flush,
            delay_levels=self.delay_levels, cluster_property=f"CLUSTER\x01{cfg.brokerClusterName}",
            # Java clients read both on every send response.
            send_ext_region_trace=(cfg.regionId, "true" if cfg.traceOn else "false"),
            # Our own pull bound: RocketMQ clients ask for 32; pocketmq's bulk readers may ask more.
            pull_max_msg_nums=4096,
            now_ms=self.now_ms, mono_ms=self.mono_ms, is_closing=self.is_closing, wake_hold=self._wake_hold,
            on_topics_changed=self.on_topics_changed, publish_topics=self.publish_topics,
            unpublished_topics=self.unpublished_topics, persist_groups=self.persist_groups,
            transactions=self.transactions, store_host=self.store_host, config_path=self.config_path,
            is_slave=self.is_slave, sync_master=cfg.brokerRole is BrokerRole.SYNC_MASTER,
            replication=self.ha_master, schedule_cursors=self.schedule_cursors,
            fence=self.link.fence if self.link is not None and not self.is_slave else None, acl=self.acl,
            ha_status=partial(ha_runtime_info, self.store, cfg, self.ha_master, self.ha_slave, self.now_ms),
            busy_poll=self.server.busy_poll)

    async def _serve_metrics(self) -> None:
        from prometheus_client import CollectorRegistry

        from pocketmq.broker.processors.stats import commit_log_dir, disk_used_ratio
        from pocketmq.broker.services.metrics import BrokerCollector
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BrokerCollector(self, self.request_latency, self.flush_latency,
                                          partial(disk_used_ratio, commit_log_dir(self.config))))
        if self.grpc_endpoint is not None:
            from pocketmq.broker.proxy.server import GrpcCollector
            registry.register(GrpcCollector(self.grpc_endpoint, ["cluster", "broker"],
                                            [self.config.brokerClusterName, self.config.brokerName]))
        self.metrics_server = await serve_metrics(self.server.host, self.config.metricsPort, registry)
        self.metrics_port = bound_port(self.metrics_server)
        log.info("metrics served at http://%s:%d/metrics", self.server.host, self.metrics_port)

    def is_closing(self) -> bool:
        return self.closing

    def _wake_hold(self) -> None:
        # Looked up at each call: the hold service is built after the context (it replays
        # held pulls through the processors, which take the context).
        self.hold_service.wake()

    def _open_store(self) -> None:
        from pocketmq.broker.store.store import MessageStore
        from pocketmq.broker.store.store_config import StoreConfig
        cfg = self.config
        kwargs = cfg.store_config_kwargs()
        kwargs["store_host"] = self.store_host
        # maxMessageSize bounds the body (checked by the send processor); the store's
        # bound is on the whole record, which adds properties (<= 32 KiB), topic and header.
        kwargs["max_message_size"] = cfg.maxMessageSize + 33 * 1024
        store = MessageStore(StoreConfig(**kwargs))
        t0 = monotonic_ms()
        self.recovery_report = store.open()
        self.store = store   # only an opened store is closed by close()
        report = self.recovery_report
        if report is not None:
            # once, one line: a WARNING after a crash (what recovery had to do), INFO otherwise
            level = logging.WARNING if report.abnormal or report.truncated_from >= 0 else logging.INFO
            log.log(level, "%s", report.summary(monotonic_ms() - t0))

    def _load_metadata(self) -> None:
        for name, mgr in (("topics.json", self.topics), ("consumerOffset.json", self.offsets),
                          ("subscriptionGroup.json", self.groups), ("delayOffset.json", self.schedule_cursors)):
            path = self._config_path(name)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            try:
                if data.strip():
                    mgr.load(data)
            except Exception as e:
                # Starting empty would overwrite the file at the next persist: refuse, as Java does.
                raise MetadataError(f"cannot load {path}: {type(e).__name__}: {e}; repair the file or move "
                                    f"it aside to start without it") from None

    def _metadata_snapshot(self, force: bool, topics: bool) -> list[tuple[str, bytes]]:
        """Encode on the loop thread (the tables change there); files are written elsewhere."""
        out = []
        if topics:
            self._topics_dirty = False
            out.append((self._config_path("topics.json"), self.topics.encode()))
        for name, mgr in (("consumerOffset.json", self.offsets), ("subscriptionGroup.json", self.groups),
                          ("delayOffset.json", self.schedule_cursors)):
            if force or mgr.dirty:
                mgr.dirty = False
                out.append((self._config_path(name), mgr.encode()))
        return out

    def _write_files(self, files: list[tuple[str, bytes]]) -> None:
        os.makedirs(os.path.join(self.root, "config"), exist_ok=True)
        for path, data in files:
            _write_atomic(path, data)

    async def _persist_async(self, force: bool = False, topics: bool = False) -> None:
        """Snapshot now, write in a thread; writes never overlap (a later snapshot never
        loses to an earlier one)."""
        async with self._persist_lock:
            files = self._metadata_snapshot(force, topics)
            if files:
                await asyncio.get_running_loop().run_in_executor(None, self._write_files, files)

    async def close(self) -> None:
        self.closing = True   # from now on pulls are answered at once, never parked
        if self.server is not None:
            await self.server.stop_accepting()
        if self.grpc_endpoint is not None:
            await self.grpc_endpoint.stop()
        if self.schedule_service is not None:
            await self.schedule_service.close()
        if self.timer_service is not None:
            await self.timer_service.close()
        if self.transaction_service is not None:
            await self.transaction_service.close()
        if self.pop_service is not None:
            await self.pop_service.close()
        if self.hold_service is not None:
            await self.hold_service.close()
        if self.index_pump is not None:
            self.index_pump.close()
        if self.ha_slave is not None:
            await self.ha_slave.close()
        if self.slave_sync is not None:
            await self.slave_sync.close()
        if self.ha_master is not None:
            await self.ha_master.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        if self.metrics_server is not None:
            self.metrics_server.close()
            await self.metrics_server.wait_closed()
            self.metrics_server = None
        if self.acl is not None:
            await self.acl.close()
        if self.config.namesrvAddr and self.unregister_on_close:
            await self.unregister_all()
        if self.server is not None:
            await self.server.close()
        if self.flush_service is not None:
            self.flush_service.stop()
        if self.page_warmer is not None:
            self.page_warmer.stop()
        if self.store is not None:
            self.store.close()
        if self._metadata_loaded:   # a start that failed to load must not overwrite the files
            await self._persist_async(force=True, topics=True)
        await self.ns_client.close()
        log.info("The broker[%s, %s] shutdown complete", self.config.brokerName, self.addr)

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc):
        await self.close()

    # -- callbacks ------------------------------------------------------------------------
    def on_topics_changed(self) -> None:
        # topics.json is written (in a thread) and the nameservers told by the register
        # loop, debounced: a heartbeat creating many retry topics costs one write.
        self._topics_dirty = True
        self._register_now.set()

    async def publish_topics(self, topic: str) -> None:
        """Make an auto-created `topic` durable and routable before its send is answered, as
        Java 4.9 does (createTopicInSendMessageMethod registers with every nameserver at once):
        topics.json is written (atomically), then the broker registers with every nameserver,
        each bounded by registerBrokerTimeoutMills (a nameserver that does not answer is
        logged, never waited for longer). Concurrent calls share one publication: each waits
        for the first one that started after its request. Raises OSError when topics.json
        cannot be written (the send is then refused)."""
        self.unpublished_topics.add(topic)
        self._publish_requested += 1
        ticket = self._publish_requested
        try:
            async with self._publish_lock:
                if self._published >= ticket:
                    return
                covered = self._publish_requested
                try:
                    await self._persist_async(topics=True)
                except OSError:
                    self._topics_dirty = True   # the register loop tries again
                    log.exception("cannot persist topics.json for the new topic %s", topic)
                    raise
                if self.ns_client.namesrv_addrs:
                    await self.register_all()
                self._published = covered
        finally:
            if self._published >= ticket:
                self.unpublished_topics.discard(topic)

    async def persist_groups(self) -> None:
        """subscriptionGroup.json, written now (atomically)."""
        self.groups.dirty = True
        try:
            await self._persist_async()
        except OSError:
            self.groups.dirty = True   # the persist loop tries again
            raise

    def _on_connection_close(self, conn) -> None:
        if self.ctx is not None:   # connections exist only once serving, after the context
            connection_closed(self.ctx, conn)

    # -- nameserver registration -------------------------------------------------------
    def _register_command(self) -> RemotingCommand:
        cfg = self.config
        topics = self.topics.topics
        rw = PermName.READ | PermName.WRITE
        if cfg.brokerPermission & rw != rw:
            # Java's registerBrokerAll: a broker without read or write permission registers
            # its topics with those bits cleared, so clients route around it (topics.json
            # keeps the topics' own perms)
            topics = {name: dataclasses.replace(tc, perm=tc.perm & cfg.brokerPermission)
                      for name, tc in topics.items()}
        body = bodies.encode_register_broker_body(topics, self.topics.data_version)
        ext = {"brokerName": cfg.brokerName, "brokerAddr": self.addr, "clusterName": cfg.brokerClusterName,
               "haServerAddr": f"{cfg.brokerIP2 or cfg.brokerIP1}:{self.ha_port}",
               "brokerId": str(cfg.brokerId), "compressed": "false",
               "bodyCrc32": str(body_crc(body))}
        return RemotingCommand(RequestCode.REGISTER_BROKER, ext_fields=self._signed(ext, body), body=body)

    def _signed(self, ext: dict, body) -> dict:
        """`ext` signed with the broker's accessKey/secretKey (for nameservers running ACL)."""
        cfg = self.config
        return sign_request(ext, body, cfg.accessKey, cfg.secretKey) if cfg.accessKey else ext

    async def register_all(self) -> None:
        if self.link is not None and not self.is_slave and not self.link.may_register():
            # a master whose lease lapsed must not (re)claim brokerId 0 at the nameservers:
            # a new master may hold it (a zombie resumed by SIGCONT would flip the route back)
            log.warning("not registering as master: its lease in the consensus store lapsed")
            return
        timeout_s = max(0.001, self.config.registerBrokerTimeoutMills / 1000)

        async def one(addr):
            try:
                # bounded as a whole: connecting to an unreachable nameserver included
                async with asyncio.timeout(timeout_s):
                    resp = await self.ns_client.invoke(addr, self._register_command(), timeout_s)
                if resp.code != ResponseCode.SUCCESS:
                    log.warning("register to nameserver %s failed: %d %s", addr, resp.code, resp.remark)
                elif self.is_slave:
                    self._learn_master(resp.ext_fields or {})
            except Exception as e:
                log.warning("register to nameserver %s failed: %s: %s", addr, type(e).__name__, e)
        await asyncio.gather(*(one(a) for a in self.ns_client.namesrv_addrs))

    def _learn_master(self, ext: dict) -> None:
        """A slave's REGISTER_BROKER answer names its live master (Java's RouteInfoManager
        returns masterAddr and haServerAddr to a broker with brokerId > 0): the HA stream
        follows it unless haMasterAddress is set, and the metadata sync reads from it."""
        master, ha = ext.get("masterAddr"), ext.get("haServerAddr")
        if master:
            self.master_addr = master
        # (controller mode: the agent says whom to follow, from the group's state in etcd)
        if ha and not self.config.haMasterAddress and self.ha_slave is not None and self.link is None:
            self.ha_slave.set_master(ha)

    async def unregister_all(self) -> None:
        cfg = self.config
        for addr in self.ns_client.namesrv_addrs:
            cmd = RemotingCommand(RequestCode.UNREGISTER_BROKER, ext_fields=self._signed({
                "brokerName": cfg.brokerName, "brokerAddr": self.addr, "clusterName": cfg.brokerClusterName,
                "brokerId": str(cfg.brokerId)}, None))
            try:
                await self.ns_client.invoke(addr, cmd, 3.0)
            except Exception as e:
                log.warning("unregister from nameserver %s failed: %s", addr, e)

    async def _register_loop(self) -> None:
        period = max(1.0, self.config.registerNameServerPeriod / 1000)
        while True:
            try:
                async with asyncio.timeout(period):
                    await self._register_now.wait()
                # Debounce a burst of topic changes into one registration.
                await asyncio.sleep(0.05)
            except asyncio.TimeoutError:
                pass
            self._register_now.clear()
            if self._topics_dirty:
                try:
                    await self._persist_async(topics=True)
                except Exception:
                    log.exception("cannot persist topics.json")
            if self.ns_client.namesrv_addrs:
                await self.register_all()

    async def _persist_loop(self) -> None:
        period = max(0.1, self.config.flushConsumerOffsetInterval / 1000)
        while True:
            await asyncio.sleep(period)
            try:
                await self._persist_async()
            except Exception:
                log.exception("persisting offsets failed")

    async def _dispatch_catch_up_loop(self) -> None:
        # After a consume-queue file could not be created (descriptors or disk exhausted for
        # a moment), records already stored wait for dispatch; retry each second so they
        # reach the queues (and held pulls) without waiting for the next send.
        while True:
            await asyncio.sleep(1)
            try:
                self.store.catch_up_dispatch()
            except Exception:
                log.exception("dispatch catch-up failed")

    async def _housekeeping_loop(self) -> None:
        while True:
            await asyncio.sleep(10)
            now = self.now_ms()
            for group, conn in self.consumers.expire(now):
                log.info("consumer channel %s of group %s expired", getattr(conn, "remote_addr", "?"), group)
                notify_consumer_ids_changed(self.consumers, group)
                conn.close()
            for group, conn in self.producers.expire(now):
                conn.close()
            idle_s = self.config.serverChannelMaxIdleTimeSeconds
            if idle_s > 0 and self.server is not None:
                self.server.close_idle(idle_s)
            try:
                if self._delete_hour_now():
                    self.store.clean_expired_files(now)
            except Exception:
                log.exception("cleaning expired files failed")

    def _delete_hour_now(self) -> bool:
        hours = {h.strip() for h in str(self.config.deleteWhen).split(";") if h.strip()}
        return time.strftime("%H") in hours
