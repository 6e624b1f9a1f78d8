"""BrokerConfig: every key a RocketMQ 4.9 ``broker.conf`` may hold, typed and checked.

RocketMQ's ``BrokerStartup`` copies one properties file onto four objects
(``BrokerConfig``, ``NettyServerConfig``, ``NettyClientConfig``,
``MessageStoreConfig``); here they are one pydantic model whose field names
are RocketMQ's camelCase keys exactly (keys are the Java setter names). Defaults
are 4.9.8's, except ``brokerName`` ("broker-a" instead of the host name).

A key pocketmq does not act on is still accepted and typed, so a real
broker.conf loads; ``LoadReport.unused_line()`` names those that were set.
Unknown keys and bad values are errors (RocketMQ ignores both silently).

Where we differ from RocketMQ, on purpose:

* ``haListenPort`` follows ``listenPort + 1`` unless it is set explicitly
  (RocketMQ always forces ``listenPort + 1`` and ignores the setting); ``listenPort=0``
  (any free port) gives ``haListenPort=0`` too.
* ``brokerIP2`` (the HA address registered for slaves) follows ``brokerIP1`` when only
  that is set (RocketMQ takes this host's first address for it either way).
* ``haSlaveFallbehindMax`` also loads under its 5.x name ``haMaxGapNotInSync``.
* ``totalPhysicalMemoryBytes`` (pocketmq's own, 0 = this machine's RAM) is what
  ``accessMessageInMemoryMaxRatio`` is a percentage of.
* ``slaveSyncIntervalMillis`` (pocketmq's own, 10 000) is how often a slave copies its
  master's metadata (RocketMQ's fixed 10 s; broker/services/slave_sync.py).
* A master (ASYNC_MASTER/SYNC_MASTER) with ``brokerId != 0`` is refused
  (RocketMQ silently resets it to 0, hiding a forgotten ``brokerRole=SLAVE``).
* ``enableDLegerCommitLog=true`` is refused: pocketmq has no DLedger, and running
  without it would silently weaken the deployment.
* ``aclEnable=true`` reads ``aclFilePath`` (pocketmq's key for RocketMQ's system property
  ``-Drocketmq.acl.plain.file``; default ``plain_acl.yml`` beside the ``-c`` file) and
  every ``*.yml`` under ``acl/`` beside it; ``accessKey``/``secretKey`` (pocketmq's own)
  sign the broker's requests to nameservers that run ACL (docs/acl.md).
* ``registerNameServerPeriod`` is used as given (RocketMQ clamps it to
  10 000..60 000 ms).
* ``~`` is expanded in ``storePathRootDir`` and ``storePathCommitLog``.
* ``busyPollMicros`` (pocketmq's own) keeps the loop polling briefly after a request.
* ``commitLogWarmAheadBytes`` (pocketmq's own, 16 MiB; 0 = off, else at least 1 MiB) is how
  far past the write position a thread keeps the commit log's pages in the page cache
  (broker/services/warm.py; not on a slave, whose replicated writes do not fault).
* ``maxHeldPulls`` and ``maxFrameSize`` are pocketmq's own bounds (RocketMQ's
  frame limit is the system property ``com.rocketmq.remoting.frameMaxLength``), as are
  ``maxHeldPullsPerConnection``, ``maxBufferedRequestBytes`` and
  ``frameReadTimeoutMillis`` (docs/reliability.md).
* ``maxConnections`` and ``reservedFileDescriptors`` (pocketmq's own, 0 = derived):
  connections past min(maxConnections, RLIMIT_NOFILE - reserved) are accepted and
  closed, so the store always finds descriptors for its files (remoting/server.py
  ``connection_limit``; docs/reliability.md "Descriptor limits").
* Pre-4.5 spellings ``mapedFileSizeCommitLog``/``mapedFileSizeConsumeQueue`` are
  aliases (4.9 ignores them); a few keys that circulate in copied broker.conf
  templates but never existed in RocketMQ (``storePathConsumeQueue``...) are
  accepted and ignored with a note, as RocketMQ ignores them.
"""
from __future__ import annotations

import functools
import os
import socket
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AliasChoices, ConfigDict, Field, field_validator, model_validator

from pocketmq.common.constants import CQ_UNIT_SIZE, NAME_BROKER, name_error, parse_delay_levels
from pocketmq.common.daemon_config import (
    DaemonConfig,
    DaemonConfigLoader,
    FrameSize,
    JavaInt,
    JavaLong,
    Name,
    NettyServerConfig,
    NonNegativeInt,
    NonNegativeLong,
    Port,
    PositiveInt,
    PositiveLong,
    cross_field_error,
    env,
)
from pocketmq.common.files import read_file, write_file_atomic
from pocketmq.common.properties_file import (
    CliOption,
    ConfigError,
    LoadReport,
    coerce_value,
    decode_properties,
    format_properties,
    java_str,
    set_properties,
)
from pocketmq.protocol.command import FRAME_SIZE_BYTES_MAX_DEFAULT
from pocketmq.remoting.read_budget import FRAME_READ_TIMEOUT_MS_DEFAULT, READ_BUFFER_BYTES_MAX_DEFAULT
from pocketmq.remoting.tls import TlsServerMode, server_config_error

__all__ = [
    "ALIASES",
    "IMPLEMENTED_KEYS",
    "IMPORTANT_KEYS",
    "LEGACY_IGNORED_KEYS",
    "RUNTIME_UPDATABLE_KEYS",
    "BrokerConfig",
    "BrokerRole",
    "ConfigError",
    "ControllerStore",
    "FlushDiskType",
    "LoadReport",
    "format_config",
    "load_config",
    "parse_args",
    "parse_runtime_update",
    "persist_config_update",
]

_CPUS = os.cpu_count() or 1


class BrokerRole(StrEnum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


class ControllerStore(StrEnum):
    # lower case: config enums are read by member name, and the value is the store's name
    etcd = "etcd"               # the shipped choice
    pysyncobj = "pysyncobj"     # the measurement backend (docs/replication.md)


class FlushDiskType(StrEnum):
    SYNC_FLUSH = "SYNC_FLUSH"
    ASYNC_FLUSH = "ASYNC_FLUSH"


@functools.lru_cache(maxsize=1)
def primary_ipv4() -> str:
    """The source address of the default route, or 127.0.0.1.

    A UDP ``connect`` only selects a route; no packet leaves the machine.
    192.0.2.1 is TEST-NET-1 (documentation only), so it is never a real peer.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))
            address = probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    return address if address and address != "0.0.0.0" else "127.0.0.1"


class _BrokerSection(DaemonConfig):
    # --- BrokerConfig.java -------------------------------------------------
    rocketmqHome: str | None = Field(default_factory=lambda: env("ROCKETMQ_HOME"))
    namesrvAddr: str | None = Field(default_factory=lambda: env("NAMESRV_ADDR"), validate_default=True)
    brokerIP1: Name = Field(default_factory=primary_ipv4)
    brokerIP2: Name = Field(default_factory=primary_ipv4)
    brokerName: Name = "broker-a"
    brokerClusterName: Name = "DefaultCluster"
    brokerId: NonNegativeLong = 0
    brokerPermission: Annotated[int, Field(ge=0, le=15)] = 6
    defaultTopicQueueNums: PositiveInt = 8
    autoCreateTopicEnable: bool = True
    clusterTopicEnable: bool = True
    brokerTopicEnable: bool = True
    autoCreateSubscriptionGroup: bool = True
    messageStorePlugIn: str = ""
    msgTraceTopicName: Name = "RMQ_SYS_TRACE_TOPIC"
    traceTopicEnable: bool = False
    sendMessageThreadPoolNums: JavaInt = min(_CPUS, 4)
    putMessageFutureThreadPoolNums: JavaInt = min(_CPUS, 4)
    pullMessageThreadPoolNums: JavaInt = 16 + _CPUS * 2
    processReplyMessageThreadPoolNums: JavaInt = 16 + _CPUS * 2
    queryMessageThreadPoolNums: JavaInt = 8 + _CPUS
    adminBrokerThreadPoolNums: JavaInt = 16
    clientManageThreadPoolNums: JavaInt = 32
    consumerManageThreadPoolNums: JavaInt = 32
    heartbeatThreadPoolNums: JavaInt = min(32, _CPUS)
    endTransactionThreadPoolNums: JavaInt = max(8 + _CPUS * 2, min(_CPUS, 4) * 4)
    flushConsumerOffsetInterval: PositiveInt = 5000
    flushConsumerOffsetHistoryInterval: JavaInt = 60_000
    rejectTransactionMessage: bool = False
    fetchNamesrvAddrByAddressServer: bool = False
    sendThreadPoolQueueCapacity: JavaInt = 10_000
    putThreadPoolQueueCapacity: JavaInt = 10_000
    pullThreadPoolQueueCapacity: JavaInt = 100_000
    replyThreadPoolQueueCapacity: JavaInt = 10_000
    queryThreadPoolQueueCapacity: JavaInt = 20_000
    clientManagerThreadPoolQueueCapacity: JavaInt = 1_000_000
    consumerManagerThreadPoolQueueCapacity: JavaInt = 1_000_000
    heartbeatThreadPoolQueueCapacity: JavaInt = 50_000
    endTransactionPoolQueueCapacity: JavaInt = 100_000
    filterServerNums: JavaInt = 0
    longPollingEnable: bool = True
    shortPollingTimeMills: NonNegativeLong = 1000
    notifyConsumerIdsChangedEnable: bool = True
    highSpeedMode: bool = False
    commercialEnable: bool = True
    commercialTimerCount: JavaInt = 1
    commercialTransCount: JavaInt = 1
    commercialBigCount: JavaInt = 1
    commercialBaseCount: JavaInt = 1
    transferMsgByHeap: bool = True
    maxDelayTime: JavaInt = 40
    regionId: Name = "DefaultRegion"
    registerBrokerTimeoutMills: JavaInt = 6000
    slaveReadEnable: bool = False
    disableConsumeIfConsumerReadSlowly: bool = False
    consumerFallbehindThreshold: JavaLong = 1024 * 1024 * 1024 * 16
    brokerFastFailureEnable: bool = True
    waitTimeMillsInSendQueue: JavaLong = 200
    waitTimeMillsInPullQueue: JavaLong = 5000
    waitTimeMillsInHeartbeatQueue: JavaLong = 31_000
    waitTimeMillsInTransactionQueue: JavaLong = 3000
    startAcceptSendRequestTimeStamp: JavaLong = 0
    traceOn: bool = True
    enableCalcFilterBitMap: bool = False
    expectConsumerNumUseFilter: JavaInt = 32
    maxErrorRateOfBloomFilter: JavaInt = 20
    filterDataCleanTimeSpan: JavaLong = 24 * 3600 * 1000
    filterSupportRetry: bool = False
    enablePropertyFilter: bool = False
    compressedRegister: bool = False
    forceRegister: bool = True
    registerNameServerPeriod: PositiveInt = 30_000
    transactionTimeOut: JavaLong = 6000
    transactionCheckMax: JavaInt = 15
    transactionCheckInterval: JavaLong = 60_000
    aclEnable: bool = False
    storeReplyMessageEnable: bool = True
    enableDetailStat: bool = True
    autoDeleteUnusedStats: bool = False
    isolateLogEnable: bool = False
    configBlackList: str = "configBlackList;brokerConfigPath"


class BrokerConfig(NettyServerConfig, _BrokerSection):
    """RocketMQ 4.9 broker configuration (BrokerConfig + Netty server/client + MessageStoreConfig).

    Keys in RocketMQ's order: BrokerConfig.java's (_BrokerSection), then
    NettyServerConfig.java's (common.daemon_config), then the ones below.
    """

    model_config = ConfigDict(populate_by_name=True)

    # --- NettyServerConfig.java: BrokerStartup sets listenPort 10911 --------
    listenPort: Port = 10911

    # --- NettyClientConfig.java --------------------------------------------
    clientWorkerThreads: JavaInt = 4
    clientCallbackExecutorThreads: JavaInt = _CPUS
    clientOnewaySemaphoreValue: JavaInt = 65535
    clientAsyncSemaphoreValue: JavaInt = 65535
    connectTimeoutMillis: JavaInt = 3000
    channelNotActiveInterval: JavaLong = 60_000
    clientChannelMaxIdleTimeSeconds: JavaInt = 120
    clientSocketSndBufSize: JavaInt = 0
    clientSocketRcvBufSize: JavaInt = 0
    clientPooledByteBufAllocatorEnable: bool = False
    clientCloseSocketIfTimeout: bool = True
    useTLS: bool = False

    # --- MessageStoreConfig.java -------------------------------------------
    storePathRootDir: Name = Field(default_factory=lambda: os.path.expanduser("~/store"))
    storePathCommitLog: str | None = None  # None: {storePathRootDir}/commitlog
    storePathDLedgerCommitLog: str | None = None
    readOnlyCommitLogStorePaths: str | None = None
    mappedFileSizeCommitLog: PositiveInt = Field(
        1024 * 1024 * 1024,
        validation_alias=AliasChoices("mappedFileSizeCommitLog", "mapedFileSizeCommitLog"),
    )
    mappedFileSizeConsumeQueue: PositiveInt = Field(
        300_000 * CQ_UNIT_SIZE,
        validation_alias=AliasChoices("mappedFileSizeConsumeQueue", "mapedFileSizeConsumeQueue"),
    )
    enableConsumeQueueExt: bool = False
    mappedFileSizeConsumeQueueExt: JavaInt = 48 * 1024 * 1024
    bitMapLengthConsumeQueueExt: JavaInt = 64
    flushIntervalCommitLog: PositiveInt = 500
    commitIntervalCommitLog: JavaInt = 200
    useReentrantLockWhenPutMessage: bool = True
    flushCommitLogTimed: bool = True
    flushIntervalConsumeQueue: JavaInt = 1000
    cleanResourceInterval: JavaInt = 10_000
    deleteCommitLogFilesInterval: JavaInt = 100
    deleteConsumeQueueFilesInterval: JavaInt = 100
    destroyMapedFileIntervalForcibly: JavaInt = 120_000
    redeleteHangedFileInterval: JavaInt = 120_000
    deleteWhen: Name = "04"
    diskMaxUsedSpaceRatio: JavaInt = 75
    fileReservedTime: NonNegativeInt = 72
    putMsgIndexHightWater: JavaInt = 600_000
    maxMessageSize: PositiveInt = 1024 * 1024 * 4
    checkCRCOnRecover: bool = True
    flushCommitLogLeastPages: JavaInt = 4
    commitCommitLogLeastPages: JavaInt = 4
    flushLeastPagesWhenWarmMapedFile: JavaInt = 1024 // 4 * 16
    flushConsumeQueueLeastPages: JavaInt = 2
    flushCommitLogThoroughInterval: JavaInt = 10_000
    commitCommitLogThoroughInterval: JavaInt = 200
    flushConsumeQueueThoroughInterval: JavaInt = 60_000
    maxTransferBytesOnMessageInMemory: PositiveInt = 1024 * 256
    # RocketMQ's default is 32. Java and C++ consumers ask for 32 per pull anyway, so a
    # higher cap changes nothing for them; it lets bulk readers (pocketmq's consumers,
    # Spark) take up to 1024 per request, still bounded by the 256 KiB byte cap.
    maxTransferCountOnMessageInMemory: PositiveInt = 1024
    maxTransferBytesOnMessageInDisk: JavaInt = 1024 * 64
    maxTransferCountOnMessageInDisk: JavaInt = 8
    accessMessageInMemoryMaxRatio: JavaInt = 40
    messageIndexEnable: bool = True
    maxHashSlotNum: JavaInt = 5_000_000
    maxIndexNum: JavaInt = 5_000_000 * 4
    maxMsgsNumBatch: JavaInt = 64
    messageIndexSafe: bool = False
    haListenPort: Port = 10912  # follows listenPort + 1 unless set
    haSendHeartbeatInterval: JavaInt = 5000
    haHousekeepingInterval: JavaInt = 20_000
    haTransferBatchSize: JavaInt = 1024 * 32
    haMasterAddress: str | None = None
    # 5.x renamed it haMaxGapNotInSync; both spellings load (ALIASES)
    haSlaveFallbehindMax: JavaInt = Field(
        1024 * 1024 * 256, validation_alias=AliasChoices("haSlaveFallbehindMax", "haMaxGapNotInSync"))
    brokerRole: Annotated[BrokerRole, Field(strict=False)] = BrokerRole.ASYNC_MASTER
    flushDiskType: Annotated[FlushDiskType, Field(strict=False)] = FlushDiskType.ASYNC_FLUSH
    syncFlushTimeout: PositiveInt = 5000
    slaveTimeout: JavaInt = 3000
    messageDelayLevel: Name = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    flushDelayOffsetInterval: JavaLong = 10_000
    cleanFileForciblyEnable: bool = True
    warmMapedFileEnable: bool = False
    offsetCheckInSlave: bool = False
    debugLockEnable: bool = False
    duplicationEnable: bool = False
    diskFallRecorded: bool = True
    osPageCacheBusyTimeOutMills: JavaLong = 1000
    defaultQueryMaxNum: JavaInt = 32
    transientStorePoolEnable: bool = False
    transientStorePoolSize: JavaInt = 5
    fastFailIfNoBufferInStorePool: bool = False
    enableDLegerCommitLog: bool = False
    dLegerGroup: str | None = None
    dLegerPeers: str | None = None
    dLegerSelfId: str | None = None
    preferredLeaderId: str | None = None
    enableBatchPush: bool = False
    enableScheduleMessageStats: bool = True
    enableLmq: bool = False
    enableMultiDispatch: bool = False
    maxLmqConsumeQueueNum: JavaInt = 20_000
    enableScheduleAsyncDeliver: bool = False
    scheduleAsyncDeliverMaxPendingLimit: JavaInt = 2000
    scheduleAsyncDeliverMaxResendNum2Blocked: JavaInt = 3
    # RocketMQ 5's timer messages (docs/broker.md "Timer messages"): off refuses them
    # (SYSTEM_ERROR); a delivery time further than timerMaxDelaySec is refused (MESSAGE_ILLEGAL);
    # the timer's checkpoint is appended at most every timerFlushIntervalMs (what a crash
    # may deliver twice)
    timerWheelEnable: bool = True
    timerMaxDelaySec: PositiveInt = 3 * 24 * 3600
    timerFlushIntervalMs: PositiveInt = 1000
    # pocketmq's own: timer messages kept in memory; the later ones wait in the queue and
    # are read again as the earlier ones are delivered
    timerMaxInMemory: Annotated[int, Field(ge=4)] = 200_000

    # --- pocketmq's own bounds ---------------------------------------------
    # pocketmq's own: the memory accessMessageInMemoryMaxRatio is a percentage of (0: this
    # machine's RAM). A consumer further behind the log's end than that reads from disk:
    # smaller pulls, and with slaveReadEnable the master suggests it pull from a slave.
    totalPhysicalMemoryBytes: NonNegativeLong = 0
    # pocketmq's own: how often a slave copies its master's topics, groups and offsets
    # (Java's fixed 10 s); the first copy is made min(3 s, this) after start.
    slaveSyncIntervalMillis: PositiveInt = 10_000
    maxHeldPulls: PositiveInt = 100_000
    # --- POP consumption (broker/services/pop.py, docs/broker.md "POP consumption") ---
    # RocketMQ 5's: the percentage of pops that read the group's retry topic first
    popFromRetryProbability: Annotated[int, Field(ge=0, le=100)] = 20
    # pocketmq's own: popped-but-unacked messages kept in memory, in the broker and per
    # group; a pop past either is answered SYSTEM_BUSY until acks or revivals free room
    maxPopInflightMessages: PositiveInt = 200_000
    maxPopInflightMessagesPerGroup: PositiveInt = 50_000
    # --- automatic failover (controller mode, docs/replication.md "Automatic failover") --
    # RocketMQ 5's names: a group's master is elected among its in-sync replicas; brokerId
    # is then this replica's id (>= 1) and brokerRole the mode it runs in as master.
    enableControllerMode: bool = False
    allAckInSyncStateSet: bool = False
    minInSyncReplicas: PositiveInt = 1
    haMaxTimeSlaveNotCatchup: PositiveInt = 15_000
    enableElectUncleanMaster: bool = False
    # pocketmq's own: the consensus store (etcd endpoints host:port, ';' or ',' between)
    # and the master's lease there: a master not heard from for this long is replaced
    etcdEndpoints: str | None = None
    # pocketmq's own: the store the agent uses: etcd (shipped) or pysyncobj, the measurement
    # backend of docs/replication.md "Choosing the consensus store" (tests/support/pso_store.py
    # members, their client ports in pysyncobjEndpoints)
    controllerStore: ControllerStore = ControllerStore.etcd
    pysyncobjEndpoints: str | None = None
    controllerLeaseSeconds: Annotated[int, Field(ge=2, le=60)] = 2
    # pocketmq's own: the HA address other replicas are told to connect to (default
    # brokerIP2:haListenPort), for a NAT or a proxy in front of this broker
    haAdvertisedAddress: str | None = None
    # pocketmq's own: the message index is built behind the dispatcher, at most this many
    # records per consume-queue flush (each second) or query, so it never takes more
    # than a bounded share of the broker's one interpreter; 0: no bound. See docs/store.md.
    indexBuildBatchNums: Annotated[int, Field(ge=0)] = 20_000
    # A RocketMQ client holds one pull per queue it consumes, all on one connection per
    # broker: 10,000 is far above any real assignment, far below a flood.
    maxHeldPullsPerConnection: PositiveInt = 10_000
    # pocketmq's own: after answering, keep the event loop polling (not sleeping) for a
    # window that follows the measured gap between requests, at most this long, so the next
    # request does not pay the idle-CPU wake-up (~40 µs per hop on the VMs measured). The
    # cap is above the sync round trips seen on slow hosts (120-300 µs) so the window, not
    # the cap, decides (remoting/busy_poll.py). CPU for latency; 0 turns it off. See
    # docs/benchmarks.md.
    busyPollMicros: Annotated[int, Field(ge=0, le=100_000)] = 500
    # pocketmq's own: a thread reads the commit log's pages this far past the write position
    # into the page cache, so the event loop's writes do not fault each fresh page of the
    # preallocated segment in (broker/services/warm.py); 0 turns it off.
    commitLogWarmAheadBytes: Annotated[int, Field(ge=0, le=1 << 30)] = 16 << 20
    # pocketmq's own: the connection limit (0: RLIMIT_NOFILE minus the reserve) and the
    # descriptors it leaves to the store (0: half the limit, 64..1024)
    maxConnections: NonNegativeInt = 0
    reservedFileDescriptors: NonNegativeInt = 0
    # pocketmq's own: the port of the Prometheus /metrics endpoint (docs/operations.md),
    # on the listen address; 0 (the default) serves no metrics.
    metricsPort: Port = 0
    # --- the gRPC endpoint for RocketMQ 5.x clients (broker/proxy; needs the grpc extra) ---
    # pocketmq's own: serve it (RocketMQ: `mqbroker --enable-proxy`, which `mqbroker` also takes);
    # grpcServerPort is RocketMQ proxy's key (0: any free port, logged at start)
    enableProxy: bool = False
    grpcServerPort: Port = 8081
    # --- plain ACL (docs/acl.md) ---------------------------------------------
    # pocketmq's own: the main ACL file (RocketMQ: the system property
    # -Drocketmq.acl.plain.file); unset: plain_acl.yml beside the -c file (or in
    # rocketmqHome/conf, else the working directory); a relative path is taken from there
    aclFilePath: str | None = None
    # pocketmq's own: what this broker signs its REGISTER/UNREGISTER_BROKER with, for
    # nameservers that run ACL (RocketMQ 4.9's broker has none and registers unsigned;
    # 5.x names it innerClientAuthenticationCredentials)
    accessKey: str | None = None
    secretKey: str | None = None
    # --- TLS on the listen port (remoting/tls.py): RocketMQ's system properties
    # tls.server.mode / tls.server.certPath / tls.server.keyPath / tls.server.keyPassword
    # as keys; permissive serves TLS and plaintext on the same port, enforcing TLS only.
    # The broker's own connections (to nameservers, a slave's metadata sync) use TLS when
    # useTLS (NettyClientConfig's key) is true; the HA stream stays plaintext, as RocketMQ's.
    tlsServerMode: TlsServerMode = TlsServerMode.disabled
    tlsServerCertPath: str | None = None
    tlsServerKeyPath: str | None = None
    tlsServerKeyPassword: str | None = None
    # Bytes all connections may hold of request frames not yet complete (beyond: those
    # connections stop being read until it frees), and how long one frame may take to
    # arrive (then its connection is closed). remoting/read_budget.py.
    maxBufferedRequestBytes: Annotated[int, Field(ge=1 << 20, le=2**63 - 1)] = READ_BUFFER_BYTES_MAX_DEFAULT
    frameReadTimeoutMillis: PositiveLong = FRAME_READ_TIMEOUT_MS_DEFAULT
    maxFrameSize: FrameSize = FRAME_SIZE_BYTES_MAX_DEFAULT

    # --- validation --------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _ha_port_follows_listen_port(cls, data: Any) -> Any:
        # On construction only: an assignment passes every field, haListenPort included.
        if isinstance(data, dict) and "haListenPort" not in data:
            listen_port = data.get("listenPort")
            if type(listen_port) is int and 0 < listen_port < 65535:
                data = {**data, "haListenPort": listen_port + 1}
            elif listen_port == 0:
                data = {**data, "haListenPort": 0}     # an ephemeral listen port: an ephemeral HA port
        if isinstance(data, dict) and "brokerIP2" not in data and "brokerIP1" in data:
            # the HA address slaves dial: where clients reach this broker unless told otherwise
            data = {**data, "brokerIP2": data["brokerIP1"]}
        return data

    @field_validator("storePathRootDir", "storePathCommitLog")
    @classmethod
    def _expand_home(cls, value: str | None) -> str | None:
        return os.path.expanduser(value) if value else value

    @field_validator("brokerName", "brokerClusterName")
    @classmethod
    def _check_broker_names(cls, value: str, info) -> str:
        # the nameserver refuses a REGISTER_BROKER whose names break the rule (they end up
        # in every client's route and cluster answers): fail at start-up, not at registration
        err = name_error(NAME_BROKER, info.field_name, value)
        if err:
            raise ValueError(err)
        return value

    @field_validator("mappedFileSizeConsumeQueue")
    @classmethod
    def _whole_consume_queue_units(cls, value: int) -> int:
        # MessageStoreConfig.getMappedFileSizeConsumeQueue rounds up to 20-byte units.
        return -(-value // CQ_UNIT_SIZE) * CQ_UNIT_SIZE

    @field_validator("commitLogWarmAheadBytes")
    @classmethod
    def _warm_ahead_off_or_a_mebibyte(cls, value: int) -> int:
        # the writer wakes the warmer at half this distance: a few KiB would wake it on
        # nearly every append
        if 0 < value < 1 << 20:
            raise ValueError(f"commitLogWarmAheadBytes must be 0 (off) or at least 1048576, got {value}")
        return value

    @field_validator("namesrvAddr")
    @classmethod
    def _check_namesrv_addr(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if not value:
            return None
        for address in _split_addresses(value):
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) <= 65535 or " " in host:
                raise ValueError(
                    f"bad name server address {address!r}; expected host:port;host:port, "
                    "e.g. 127.0.0.1:9876;192.168.0.1:9876"
                )
        return value

    @field_validator("haMasterAddress", "haAdvertisedAddress")
    @classmethod
    def _check_ha_master_address(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        host, _, port = value.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) <= 65535 or " " in host:
            raise ValueError(f"bad HA master address {value!r}; expected host:port, e.g. 192.168.0.1:10912")
        return value.strip()

    @field_validator("brokerIP1", "brokerIP2")
    @classmethod
    def _check_ip(cls, value: str) -> str:
        if any(char.isspace() for char in value):
            raise ValueError("must not contain blanks")
        return value

    @field_validator("deleteWhen")
    @classmethod
    def _check_delete_when(cls, value: str) -> str:
        for hour in value.split(";"):
            if not hour.strip().isdigit() or not 0 <= int(hour) <= 23:
                raise ValueError(f"expected hours of the day 00..23 separated by ';', got {value!r}")
        return value

    @field_validator("messageDelayLevel")
    @classmethod
    def _check_delay_levels(cls, value: str) -> str:
        parse_delay_levels(value)
        return value

    @field_validator("enableDLegerCommitLog")
    @classmethod
    def _refuse_dledger(cls, value: bool) -> bool:
        if value:
            raise ValueError("pocketmq has no DLedger commit log; refusing to start as a plain broker")
        return value

    @model_validator(mode="after")
    def _check_together(self) -> BrokerConfig:
        if self.enableControllerMode:
            if self.brokerId <= 0:
                raise cross_field_error("brokerId", "in controller mode brokerId is this replica's id and must "
                                        "be >= 1 (the master registers as 0 whoever it is)", "enableControllerMode")
            key = "pysyncobjEndpoints" if self.controllerStore is ControllerStore.pysyncobj else "etcdEndpoints"
            if not getattr(self, key):
                raise cross_field_error(key, "controller mode needs the consensus store's endpoints "
                                        f"({key}=host:port;host:port)", "enableControllerMode")
        elif self.brokerRole is BrokerRole.SLAVE:
            if self.brokerId <= 0:
                raise cross_field_error("brokerId", "a SLAVE's brokerId must be > 0", "brokerRole")
        elif self.brokerId != 0:
            raise cross_field_error(
                "brokerId",
                f"a master's brokerId must be 0 (brokerRole={self.brokerRole.value}); "
                "set brokerRole=SLAVE for a slave",
                "brokerRole",
            )
        if bool(self.accessKey) != bool(self.secretKey):
            raise cross_field_error("secretKey" if self.accessKey else "accessKey",
                                    "accessKey and secretKey are set together (the broker's own credentials)",
                                    "accessKey" if self.accessKey else "secretKey")
        if self.accessKey and (len(self.accessKey) <= 6 or len(self.secretKey) <= 6):
            raise cross_field_error("accessKey", "accessKey and secretKey must be longer than 6 characters",
                                    "secretKey")
        if self.haListenPort != 0 and self.haListenPort == self.listenPort:
            raise cross_field_error("haListenPort", "must differ from listenPort", "listenPort")
        if self.enableProxy and self.grpcServerPort != 0 and self.grpcServerPort in (self.listenPort,
                                                                                      self.haListenPort):
            raise cross_field_error("grpcServerPort", "must differ from listenPort and haListenPort", "enableProxy")
        if self.maxMessageSize >= self.maxFrameSize:
            raise cross_field_error(
                "maxMessageSize",
                f"must be smaller than maxFrameSize ({self.maxFrameSize}), "
                "or no such message could arrive",
                "maxFrameSize",
            )
        tls_error = server_config_error(self.tlsServerMode, self.tlsServerCertPath, self.tlsServerKeyPath,
                                        self.tlsServerKeyPassword)
        if tls_error:
            raise cross_field_error(tls_error[0], tls_error[1], "tlsServerMode")
        return self

    # --- derived values ----------------------------------------------------

    def store_path_commit_log(self) -> str:
        """``storePathCommitLog``, defaulting to ``{storePathRootDir}/commitlog``."""
        return self.storePathCommitLog or os.path.join(self.storePathRootDir, "commitlog")

    def broker_addr(self) -> str:
        """The address brokers register and clients dial: ``brokerIP1:listenPort``."""
        return f"{self.brokerIP1}:{self.listenPort}"

    def ha_server_addr(self) -> str:
        """``brokerIP2:haListenPort``, sent as haServerAddr on registration."""
        return f"{self.brokerIP2}:{self.haListenPort}"

    def namesrv_addr_list(self) -> tuple[str, ...]:
        """The ``;``-separated name server addresses, in order."""
        return _split_addresses(self.namesrvAddr) if self.namesrvAddr else ()

    def delay_levels_ms(self) -> tuple[int, ...]:
        """``messageDelayLevel`` in milliseconds; level N is element N-1."""
        return parse_delay_levels(self.messageDelayLevel)

    def delete_when_hours(self) -> tuple[int, ...]:
        """The hours of the day (0..23) at which expired files are deleted."""
        return tuple(int(hour) for hour in self.deleteWhen.split(";"))

    def is_master(self) -> bool:
        return self.brokerRole is not BrokerRole.SLAVE

    def store_config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the message store (which knows nothing of this class)."""
        return {
            "store_path_root_dir": self.storePathRootDir,
            "store_path_commit_log": self.store_path_commit_log(),
            "mapped_file_size_commit_log": self.mappedFileSizeCommitLog,
            "mapped_file_size_consume_queue": self.mappedFileSizeConsumeQueue,
            "flush_disk_type": self.flushDiskType.value,
            "max_message_size": self.maxMessageSize,
            "file_reserved_time_hours": self.fileReservedTime,
            "message_delay_level": self.messageDelayLevel,
            "max_transfer_bytes_on_message_in_memory": self.maxTransferBytesOnMessageInMemory,
            "max_transfer_count_on_message_in_memory": self.maxTransferCountOnMessageInMemory,
            "max_transfer_bytes_on_message_in_disk": self.maxTransferBytesOnMessageInDisk,
            "max_transfer_count_on_message_in_disk": self.maxTransferCountOnMessageInDisk,
            "access_message_in_memory_max_ratio": self.accessMessageInMemoryMaxRatio,
            "total_physical_memory_bytes": self.totalPhysicalMemoryBytes,
            "message_index_enable": self.messageIndexEnable,
            "max_hash_slot_num": self.maxHashSlotNum,
            "max_index_num": self.maxIndexNum,
            "max_msgs_num_batch": self.maxMsgsNumBatch,
            "index_build_batch": self.indexBuildBatchNums,
        }

    def config_items(self, *, important_only: bool = False) -> list[tuple[str, object]]:
        """(key, value) pairs in RocketMQ's class order; effective storePathCommitLog."""
        items: list[tuple[str, object]] = []
        for key, value in super().config_items():
            if important_only and key not in IMPORTANT_KEYS:
                continue
            items.append((key, self.store_path_commit_log() if key == "storePathCommitLog" else value))
        return items


def _split_addresses(value: str) -> tuple[str, ...]:
    parts = [part.strip() for part in value.split(";")]
    while parts and not parts[-1]:
        parts.pop()  # Java's split drops trailing empty strings
    if any(not part for part in parts):
        raise ValueError(f"empty address in {value!r}")
    return tuple(parts)


ALIASES: dict[str, str] = {
    "mapedFileSizeCommitLog": "mappedFileSizeCommitLog",
    "mapedFileSizeConsumeQueue": "mappedFileSizeConsumeQueue",
    "haMaxGapNotInSync": "haSlaveFallbehindMax",
}

LEGACY_IGNORED_KEYS: dict[str, str] = {
    "storePathConsumeQueue": "not a RocketMQ setting either; consume queues live in {storePathRootDir}/consumequeue",
    "storePathIndex": "not a RocketMQ setting either; index files live in {storePathRootDir}/index",
    "storeCheckpoint": "not a RocketMQ setting either; the checkpoint is {storePathRootDir}/checkpoint",
    "abortFile": "not a RocketMQ setting either; the abort marker is {storePathRootDir}/abort",
    "checkTransactionMessageEnable": "not a RocketMQ 4.x setting; transaction check-back is always on",
}

IMPLEMENTED_KEYS: frozenset[str] = frozenset({
    "brokerClusterName", "brokerName", "brokerId", "brokerIP1", "brokerIP2", "listenPort",
    "haListenPort", "namesrvAddr", "storePathRootDir", "storePathCommitLog",
    "mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue", "flushDiskType", "brokerRole",
    "flushIntervalCommitLog", "flushCommitLogTimed", "syncFlushTimeout", "autoCreateTopicEnable",
    "autoCreateSubscriptionGroup", "defaultTopicQueueNums", "longPollingEnable",
    "shortPollingTimeMills", "maxMessageSize", "fileReservedTime", "deleteWhen",
    "brokerPermission", "registerNameServerPeriod", "flushConsumerOffsetInterval",
    "messageDelayLevel", "maxTransferBytesOnMessageInMemory", "maxTransferCountOnMessageInMemory",
    "maxTransferBytesOnMessageInDisk", "maxTransferCountOnMessageInDisk",
    "accessMessageInMemoryMaxRatio", "clusterTopicEnable", "brokerTopicEnable", "traceTopicEnable", "msgTraceTopicName",
    "regionId", "traceOn", "notifyConsumerIdsChangedEnable", "aclEnable",
    "rejectTransactionMessage", "serverChannelMaxIdleTimeSeconds", "maxHeldPulls", "maxFrameSize", "busyPollMicros",
    "commitLogWarmAheadBytes",
    "popFromRetryProbability", "maxPopInflightMessages", "maxPopInflightMessagesPerGroup",
    "maxConnections", "reservedFileDescriptors",
    "metricsPort", "enableProxy", "grpcServerPort",
    "maxHeldPullsPerConnection", "maxBufferedRequestBytes", "frameReadTimeoutMillis",
    "enablePropertyFilter", "transactionTimeOut", "transactionCheckMax", "transactionCheckInterval",
    "messageIndexEnable", "maxHashSlotNum", "maxIndexNum", "maxMsgsNumBatch", "defaultQueryMaxNum",
    "indexBuildBatchNums",
    "haMasterAddress", "haSendHeartbeatInterval", "haHousekeepingInterval", "haTransferBatchSize",
    "haSlaveFallbehindMax", "slaveTimeout", "slaveReadEnable", "totalPhysicalMemoryBytes", "offsetCheckInSlave",
    "slaveSyncIntervalMillis",
    "enableControllerMode", "allAckInSyncStateSet", "minInSyncReplicas", "haMaxTimeSlaveNotCatchup",
    "enableElectUncleanMaster", "etcdEndpoints", "controllerStore", "pysyncobjEndpoints",
    "controllerLeaseSeconds", "haAdvertisedAddress",
    "aclFilePath", "accessKey", "secretKey",
    "tlsServerMode", "tlsServerCertPath", "tlsServerKeyPath", "tlsServerKeyPassword", "useTLS",
    "timerWheelEnable", "timerMaxDelaySec", "timerFlushIntervalMs", "timerMaxInMemory",
})  # fmt: skip
"""Keys pocketmq acts on. Extend it when a component starts honouring a key."""

IMPORTANT_KEYS: frozenset[str] = frozenset({
    # @ImportantField in RocketMQ 4.9.8, plus listenPort
    "namesrvAddr", "brokerIP1", "brokerName", "brokerClusterName", "brokerId",
    "autoCreateTopicEnable", "autoCreateSubscriptionGroup", "msgTraceTopicName", "traceTopicEnable",
    "rejectTransactionMessage", "fetchNamesrvAddrByAddressServer", "transactionTimeOut",
    "transactionCheckMax", "transactionCheckInterval", "aclEnable", "listenPort",
    "storePathRootDir", "storePathCommitLog", "storePathDLedgerCommitLog", "flushIntervalCommitLog",
    "commitIntervalCommitLog", "flushCommitLogTimed", "deleteWhen", "fileReservedTime",
    "maxTransferBytesOnMessageInMemory", "maxTransferCountOnMessageInMemory",
    "maxTransferBytesOnMessageInDisk", "maxTransferCountOnMessageInDisk",
    "accessMessageInMemoryMaxRatio", "messageIndexEnable", "messageIndexSafe", "haMasterAddress",
    "brokerRole", "flushDiskType", "cleanFileForciblyEnable", "transientStorePoolEnable",
})  # fmt: skip

assert IMPORTANT_KEYS.issubset(BrokerConfig.model_fields)

_OPTIONS = (
    CliOption("c", "configFile", True, "Broker config properties file"),
    CliOption(
        "n", "namesrvAddr", True,
        "Name server address list, eg: '192.168.0.1:9876;192.168.0.2:9876'",
        setting_key="namesrvAddr",
    ),
    CliOption("p", "printConfigItem", False, "Print all config item"),
    CliOption("m", "printImportantConfig", False, "Print important config item"),
    CliOption("h", "help", False, "Print help"),
)  # fmt: skip


def format_config(config: BrokerConfig, *, important_only: bool = False) -> str:
    """The ``-p`` / ``-m`` listing: ``key=value`` lines, the secrets masked."""
    return format_properties(config.config_items(important_only=important_only), secret=SECRET_KEYS)


# Keys whose values the listings never print in clear text.
SECRET_KEYS = frozenset({"secretKey", "tlsServerKeyPassword"})


_LOADER: DaemonConfigLoader[BrokerConfig] = DaemonConfigLoader(
    BrokerConfig,
    prog="mqbroker",
    options=_OPTIONS,
    implemented_keys=IMPLEMENTED_KEYS,
    listings={
        "printConfigItem": format_config,
        "printImportantConfig": functools.partial(format_config, important_only=True),
    },
    aliases=ALIASES,
    ignored_keys=LEGACY_IGNORED_KEYS,
    environment={"namesrvAddr": "NAMESRV_ADDR"},
)

# ``mqbroker``'s entry points; see DaemonConfigLoader.load and .parse_args.
load_config = _LOADER.load
parse_args = _LOADER.parse_args


# --- run-time updates (UPDATE_BROKER_CONFIG) ----------------------------------

RUNTIME_UPDATABLE_KEYS: dict[str, str] = {
    # key: where the running broker reads it (why a change takes effect without a restart)
    "brokerPermission": "each send, pull and send-back checks it",
    "autoCreateTopicEnable": "each send to an unknown topic checks it",
    "autoCreateSubscriptionGroup": "each lookup of an unknown group checks it",
    "longPollingEnable": "each pull that finds nothing reads it",
    "shortPollingTimeMills": "each pull that finds nothing reads it",
    "rejectTransactionMessage": "each transactional send checks it",
    "deleteWhen": "the hourly clean-up reads it",
    "serverChannelMaxIdleTimeSeconds": "the idle-connection sweep reads it",
}
"""Keys UPDATE_BROKER_CONFIG may change: those the running broker reads at each use.
Every other key is read once at start (store geometry, ports, thread pools...) and is
refused with that reason, so an operator never believes a change took effect when it
did not (RocketMQ accepts any key and silently ignores most until a restart)."""


def parse_runtime_update(config: BrokerConfig, updates: dict[str, str]) -> dict[str, Any]:
    """The typed values of an UPDATE_BROKER_CONFIG's ``key=value`` pairs, checked against
    a copy of ``config`` (cross-key rules included). Raises ConfigError naming the first
    key refused: unknown, not changeable at run time, or a bad value."""
    if not updates:
        raise ConfigError(None, "request", "no key to update")
    typed: dict[str, Any] = {}
    for key, raw in updates.items():
        field = BrokerConfig.model_fields.get(key)
        if field is None:
            raise ConfigError(key, "request", f"unknown broker config key {key!r}")
        if key not in RUNTIME_UPDATABLE_KEYS:
            changeable = ", ".join(sorted(RUNTIME_UPDATABLE_KEYS))
            raise ConfigError(key, "request", f"{key} is read once at start and cannot be changed at run "
                                              f"time (a restart with the new value in the config file "
                                              f"applies it); changeable keys: {changeable}")
        try:
            typed[key] = coerce_value(raw, field.annotation)
        except (ValueError, TypeError) as e:
            raise ConfigError(key, "request", f"bad value for {key}: {e}") from None
    trial = config.model_copy()
    for key, value in typed.items():
        try:
            setattr(trial, key, value)
        except ValueError as e:     # pydantic's ValidationError is a ValueError
            detail = e.errors()[0]["msg"] if hasattr(e, "errors") else str(e)
            raise ConfigError(key, "request", f"bad value for {key}: {detail}") from None
    return typed


def persist_config_update(path: str, updates: dict[str, Any]) -> None:
    """Set ``updates`` in the broker's ``-c`` file (comments and other lines kept), written
    atomically; what RocketMQ does to ``brokerConfigPath`` on UPDATE_BROKER_CONFIG. Raises
    OSError."""
    data = read_file(path)
    text = decode_properties(data) if data is not None else ""
    text = set_properties(text, {k: java_str(v) for k, v in updates.items()})
    write_file_atomic(path, text.encode("utf-8"))
