"""What request processors may use: the broker's collaborators, listed and typed.

Built once by the composition root (broker/app.py) when the store is open and
handed to `build_processor_table(ctx)`; processors see this and nothing else
of the broker. The context is frozen (the set of collaborators never changes
while serving); the objects it names are the live, mutable tables. Broker
state that changes (closing) and clocks are callables, read at each call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable, Protocol

from pocketmq.broker.core.clients import ConsumerManager, ProducerManager
from pocketmq.broker.core.delay import ScheduleCursors
from pocketmq.broker.core.held_pulls import HeldPullTable
from pocketmq.broker.core.locks import RebalanceLockManager
from pocketmq.broker.core.offsets import ConsumerOffsetManager
from pocketmq.broker.core.stats import BrokerStats
from pocketmq.broker.core.subscription_groups import SubscriptionGroupManager
from pocketmq.broker.core.topics import TopicConfigManager
from pocketmq.broker.core.transaction import DecidedTransactions
from pocketmq.broker.store.api import Store
from pocketmq.protocol.bodies import DataVersion

if TYPE_CHECKING:
    from pocketmq.broker.config import BrokerConfig


class FlushWaiter(Protocol):
    """What a SYNC_FLUSH send needs of the flush service (services/flush.py)."""

    async def wait_flushed(self, end_offset: int, timeout_s: float) -> bool | None:
        """True when flushed, False on timeout, None when the store failed."""


class ReplicaWaiter(Protocol):
    """What a SYNC_MASTER send needs of the HA service (services/ha.py HAMaster)."""

    def slave_ok(self, put_end: int) -> bool:
        """A slave is connected and less than haSlaveFallbehindMax behind `put_end`."""

    def waiter(self, end_offset: int, timeout_s: float):
        """A future: True once a slave acked `end_offset`, False after `timeout_s`."""


@dataclass(frozen=True, slots=True)
class BrokerContext:
    config: BrokerConfig
    store: Store
    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    groups: SubscriptionGroupManager
    consumers: ConsumerManager
    producers: ProducerManager
    locks: RebalanceLockManager
    held_pulls: HeldPullTable
    stats: BrokerStats                     # counters and windows (broker/core/stats.py)
    # SYNC_FLUSH: a send waits for flush_service.wait_flushed
    flush_service: FlushWaiter | None
    sync_flush: bool
    delay_levels: tuple[int, ...]          # ms of delay level 1..n
    cluster_property: str                  # "CLUSTER\x01<name>", appended to every stored message
    send_ext_region_trace: tuple[str, str]  # (MSG_REGION, TRACE_ON) of every send response
    pull_max_msg_nums: int                 # our own bound on one pull
    now_ms: Callable[[], int]              # wall clock: store timestamps, data versions, locks
    mono_ms: Callable[[], int]             # monotonic: held-pull deadlines
    is_closing: Callable[[], bool]         # shutting down: pulls are answered, never parked
    wake_hold: Callable[[], None]          # a pull was parked: the hold service re-reads deadlines
    on_topics_changed: Callable[[], None]  # persist topics.json and re-register (debounced)
    # Auto-created topics: written to topics.json and registered with every nameserver
    # now, before the send that created them is answered (bounded by
    # registerBrokerTimeoutMills); `unpublished_topics` holds those still on the way.
    publish_topics: Callable[[str], Awaitable[None]]
    unpublished_topics: set[str]
    # subscriptionGroup.json written now (admin changes are acknowledged once durable)
    persist_groups: Callable[[], Awaitable[None]]
    # transactions decided so far (END_TRANSACTION, discards): rebuilt from the op queue at start
    transactions: DecidedTransactions = field(default_factory=DecidedTransactions)
    store_host: tuple[bytes, int] = (b"\x7f\x00\x00\x01", 0)   # born host of the broker's own records
    # the -c file UPDATE_BROKER_CONFIG persists to (None: started without one)
    config_path: str | None = None
    # GET_BROKER_CONFIG's dataVersion: bumped by each UPDATE_BROKER_CONFIG
    config_version: list[DataVersion] = field(default_factory=lambda: [DataVersion()])
    # replication: a slave serves pulls and refuses writes; a SYNC_MASTER send waits for a
    # slave's ack through `replication` (the HA master, None on a slave)
    is_slave: bool = False
    sync_master: bool = False
    replication: ReplicaWaiter | None = None
    # controller mode (services/failover.py): None, or (code, remark) refusing a send: the
    # master's lease is not sure any more, or the SyncStateSet is below minInSyncReplicas
    fence: Callable[[], tuple[int, str] | None] | None = None
    # the replication view for GET_BROKER_RUNTIME_INFO, haStatus and metrics (a callable
    # returning a dict, None when there is none)
    ha_status: Callable[[], dict] | None = None
    # the server's BusyPoll (remoting/busy_poll.py), shown in the runtime info; None: off
    busy_poll: object | None = None
    # the delay levels' cursors (delayOffset.json), served by GET_ALL_DELAY_OFFSET
    schedule_cursors: ScheduleCursors | None = None
    # the plain ACL (remoting/acl.py AclService) the ACL admin codes edit; None: aclEnable=false
    acl: object | None = None
    # POP consumption (services/pop.py PopService), called by processors/pop.py and the gRPC
    # endpoint; None until the broker built it
    pop: object | None = None
