"""Typed consumer options: frozen dataclasses, checked when built.

    cfg = PushConsumerConfig(consume_from_where="FIRST_OFFSET", consume_concurrency=4)
    consumer = PushConsumer("G", "127.0.0.1:9876", listener=fn, config=cfg)

The consumers still take every option as a keyword argument (built into the config),
so `PushConsumer("G", ns, listener=fn, pull_batch_size=32)` keeps working. Defaults
are the Java client's (DefaultMQPushConsumer / DefaultLitePullConsumer) where one
exists. A bad value raises InvalidArgumentError when the config is built.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pocketmq.client.credentials import Credentials, as_credentials
from pocketmq.client.errors import InvalidArgumentError
from pocketmq.client.process_queue import FlowLimits
from pocketmq.client.rebalance import AllocateAveragely, AllocateStrategy
from pocketmq.remoting.tls import resolve_client_tls

# consume_from_where option -> ConsumerData.consumeFromWhere sent in heartbeats.
CONSUME_FROM = {
    "LAST_OFFSET": "CONSUME_FROM_LAST_OFFSET",
    "FIRST_OFFSET": "CONSUME_FROM_FIRST_OFFSET",
    "TIMESTAMP": "CONSUME_FROM_TIMESTAMP",
}

# consume_timestamp_ms=None means this long before the consumer was created (Java's default).
DEFAULT_CONSUME_TIMESTAMP_AGO_MS = 30 * 60 * 1000


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """Options both consumers share.

    consume_from_where: where a group without a stored offset starts: LAST_OFFSET (the
        queue's max offset), FIRST_OFFSET (0) or TIMESTAMP (consume_timestamp_ms).
    consume_timestamp_ms: for TIMESTAMP; None = 30 minutes before the consumer was created.
    allocate_strategy: queue allocation among the group (None = AllocateAveragely).
    pull_batch_size: messages asked for per PULL_MESSAGE.
    suspend_timeout_ms: how long the broker holds a pull without new messages (long polling).
    pull_timeout_ms: the pull request timeout; must exceed suspend_timeout_ms.
    pull_error_delay_ms: backoff after a failed pull.
    instance_name: clientId suffix (ip@instance_name); None = the process id.
    serialize_type: header codec towards brokers; None = negotiate (msgpack with pocketmq).
    credentials: the ACL account every request is signed with: (access_key, secret_key),
        (access_key, secret_key, channel) or a Credentials (client/credentials.py); None:
        unsigned.
    tls: True (TLS, the server's certificate not verified, as RocketMQ's clients default),
        an ssl.SSLContext (remoting.tls.client_context(verify=True, ca_path=...)), or None.
    """
    consume_from_where: str = "LAST_OFFSET"
    consume_timestamp_ms: int | None = None
    allocate_strategy: AllocateStrategy | None = None
    pull_batch_size: int = 32
    suspend_timeout_ms: int = 20000
    pull_timeout_ms: int = 30000
    pull_error_delay_ms: int = 1000
    instance_name: str | None = None
    serialize_type: int | None = None
    credentials: Credentials | tuple | None = None
    tls: object = None

    def _check_common(self) -> None:
        object.__setattr__(self, "credentials", as_credentials(self.credentials))
        resolve_client_tls(self.tls)     # a bad value is refused here, not at start()
        if self.consume_from_where not in CONSUME_FROM:
            raise InvalidArgumentError(f"consume_from_where must be one of {', '.join(CONSUME_FROM)}")

    def _check_timeouts(self) -> None:
        if self.pull_timeout_ms <= self.suspend_timeout_ms:
            raise InvalidArgumentError("pull_timeout_ms must exceed suspend_timeout_ms")

    def __post_init__(self):
        self._check_common()
        self._check_timeouts()

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class PushConsumerConfig(ConsumerConfig):
    """PushConsumer options (besides those of ConsumerConfig).

    message_model: CLUSTERING (each message to one member of the group) or BROADCASTING.
    consume_concurrency: listener workers (consumeThreadMax), 1..1000.
    consume_batch_size: messages per batch_listener call, 1..1024 (1 for a listener).
    flow_limits: ProcessQueue thresholds that delay the next pull (None = Java's defaults).
    max_reconsume_times: redeliveries before a failing message goes to the DLQ; None (the
        default): the broker's subscription group decides (retryMaxTimes, 16 unless
        changed with `mqadmin updateSubGroup -r`); a number is sent with every send-back
        and overrides the group's, as a Java client's does. Orderly: local retries before
        the message is sent to %DLQ%<group> and its queue moves on (None: 16).
    orderly: consume each queue in queue order, one listener call at a time per queue,
        under the broker's queue lock in CLUSTERING (see docs/client.md).
    suspend_current_queue_time_ms: orderly: the pause before a failed (or
        SUSPEND_CURRENT_QUEUE_A_MOMENT) message is consumed again.
    persist_interval_s: how often consumed offsets are committed.
    handover_delay_ms: wait before reading the offsets of queues taken over from another
        member, so its last commit lands first.
    sync_listener_in_thread: run a plain (non-async) listener in a thread pool.
    broadcast_offset_dir: where BROADCASTING offsets are kept (None = ~/.pocketmq_offsets).
    close_timeout_s: how long close() waits for cached messages to be consumed.
    consume_timeout_min: concurrent mode: a listener call running longer than this many
        minutes (Java's consumeTimeout, 15) has its message sent back for retry
        (delay level 3) and removed from the queue; the call's late result is ignored.
    """
    pull_batch_size: int = 128
    suspend_timeout_ms: int = 15000
    message_model: str = "CLUSTERING"
    consume_concurrency: int = 20
    consume_batch_size: int = 1
    flow_limits: FlowLimits | None = None
    max_reconsume_times: int | None = None
    orderly: bool = False
    suspend_current_queue_time_ms: int = 1000
    persist_interval_s: float = 5.0
    handover_delay_ms: int = 1000
    sync_listener_in_thread: bool = True
    broadcast_offset_dir: str | None = None
    close_timeout_s: float = 30.0
    consume_timeout_min: float = 15.0

    def __post_init__(self):
        if not 0 < self.consume_timeout_min <= 7 * 24 * 60:
            raise InvalidArgumentError("consume_timeout_min must be in (0, 10080] minutes")
        if self.message_model not in ("CLUSTERING", "BROADCASTING"):
            raise InvalidArgumentError("message_model must be CLUSTERING or BROADCASTING")
        self._check_common()
        if not 1 <= self.consume_concurrency <= 1000:
            raise InvalidArgumentError("consume_concurrency must be in [1, 1000]")
        if not 1 <= self.pull_batch_size <= 1024:
            raise InvalidArgumentError("pull_batch_size must be in [1, 1024]")
        if not 1 <= self.consume_batch_size <= 1024:
            raise InvalidArgumentError("consume_batch_size must be in [1, 1024]")
        if not 0 <= self.suspend_current_queue_time_ms <= 3_600_000:
            raise InvalidArgumentError("suspend_current_queue_time_ms must be in [0, 3600000]")
        if self.max_reconsume_times is not None and not 0 <= self.max_reconsume_times <= 10_000:
            raise InvalidArgumentError("max_reconsume_times must be in [0, 10000] (or None)")
        self._check_timeouts()


@dataclass(frozen=True, slots=True)
class LitePullConsumerConfig(ConsumerConfig):
    """LitePullConsumer options (besides those of ConsumerConfig).

    auto_commit: commit consume offsets every auto_commit_interval_s and at close.
    max_poll_records: default poll() size, 1..10000.
    pull_threshold_for_queue: messages buffered per queue before its pulling pauses.
    pull_batch_size: 128 here (32 in ConsumerConfig): the background pulls run ahead of
        poll(), so a pull's round trip is spread over more messages; a full buffer resumes
        pulling as soon as poll() makes room (client.fetcher), so larger pulls no longer
        risk the 50 ms flow-control stall (docs/client.md, LitePullConsumer: "Prefetch and
        flow control").
    """
    pull_batch_size: int = 128
    auto_commit: bool = True
    auto_commit_interval_s: float = 5.0
    max_poll_records: int = 10
    pull_threshold_for_queue: int = 1000

    def __post_init__(self):
        self._check_common()
        if not 1 <= self.max_poll_records <= 10000:
            raise InvalidArgumentError("max_poll_records must be in [1, 10000]")
        self._check_timeouts()


def build_config(cls, config, options: dict):
    """`config` (or the class defaults) with the keyword options given explicitly applied."""
    if config is not None and not isinstance(config, cls):
        raise InvalidArgumentError(f"config must be a {cls.__name__}")
    if config is None:
        return cls(**options)
    return dataclasses.replace(config, **options) if options else config


def apply_config(consumer, cfg: ConsumerConfig, now_ms: int) -> None:
    """Every option of `cfg` becomes an attribute of `consumer` (what the consumers and
    their tests read), with the defaults that need a value now resolved: the
    consume-from timestamp (30 minutes before now_ms) and the allocation strategy."""
    consumer.config = cfg
    for f in dataclasses.fields(cfg):
        setattr(consumer, f.name, getattr(cfg, f.name))
    if cfg.consume_timestamp_ms is None:
        consumer.consume_timestamp_ms = now_ms - DEFAULT_CONSUME_TIMESTAMP_AGO_MS
    if cfg.allocate_strategy is None:
        consumer.allocate_strategy = AllocateAveragely()
