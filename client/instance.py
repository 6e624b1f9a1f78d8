"""ClientInstance: what producers and consumers with one clientId share (asyncio).

One instance per (event loop, clientId `ip@instanceName`): the connections
(RemotingClient, rotating through a `;`-separated nameserver list), the route
table refreshed every 30 s, the heartbeat to every broker every 30 s, the
rebalance timer (20 s, or at once on NOTIFY_CONSUMER_IDS_CHANGED), and `api`,
the ClientAPI (client/api.py) every request goes through.

Reconnection needs no user action: RemotingClient dials again on the next
request after a connection dropped, and the first request on a new broker
connection is preceded by a heartbeat so the broker knows our consumers again.

Master/slave groups (client/replica.py has the rules) and failover (client/failover.py):
a broker connection that closes or cannot be dialled, and a request that failed with a
failover signal (`request_route_refresh`, from the producer and the consumers), make the
instance refresh at once the routes of every topic through that broker group (per topic
at most one refresh in flight and one start every ROUTE_REFRESH_AFTER_FAILURE_MIN_INTERVAL_S),
so a dead master leaves the member table, and a promoted slave takes its place, within
moments: sends go to the new master, pulls and offset requests to it or a slave. An
address a route shows for the first time gets a heartbeat at once, in the background;
consumers hear when a group's master leaves, comes back or moves (orderly consumers stop
and relock on it); producers forget the send faults of a group whose master is back or
moved.

Background tasks are created in `start()` and cancelled in `close()`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import weakref

from pocketmq.client.api import ClientAPI, PullResult, pull_sys_flag
from pocketmq.client.connection import ClientRemoting
from pocketmq.client.credentials import as_credentials
from pocketmq.client.errors import (
    BrokerError,
    ClientStateError,
    InvalidArgumentError,
    MQClientError,
    NoRouteError,
    RemotingFailure,
    wrap_remoting,
)
from pocketmq.client.failover import RefreshLimiter
from pocketmq.client.message import _local_ipv4_bytes
from pocketmq.client.route import (
    BrokerAddrTable,
    TopicPublishInfo,
    publish_info,
    subscribe_queues,
)
from pocketmq.common.constants import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    DEFAULT_TOPIC_QUEUE_NUMS,
)
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import (
    ConsumerData,
    HeartbeatData,
    MessageQueue,
    TopicRouteData,
    PROP_CLIENT_VERSION,
    PROP_CONSUME_TYPE,
    PROP_NAMESERVER_ADDR,
    decode_reset_offset_body,
    dumps,
    encode_consumer_running_info,
)
from pocketmq.protocol.codes import (
    CLIENT_VERSION_DESC,
    LanguageCode,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.errors import BodyError, HeaderError
from pocketmq.protocol.headers.typed import (
    decode_check_transaction_state_header,
    decode_consume_message_directly_header,
)
from pocketmq.remoting.client import split_addr_list
from pocketmq.remoting.clock import monotonic_ms as mono_ms
from pocketmq.remoting.clock import wall_ms as now_ms
from pocketmq.remoting.connection import RemotingError
from pocketmq.remoting.tls import resolve_client_tls

log = logging.getLogger("pocketmq.client")

DEFAULT_TOPIC = AUTO_CREATE_TOPIC_KEY_TOPIC
ROUTE_REFRESH_INTERVAL_S = 30.0
HEARTBEAT_INTERVAL_S = 30.0
REBALANCE_INTERVAL_S = 20.0
# A failure (a broker connection lost, a failover signal: client/failover.py) refreshes the
# routes through the broker at once, then each topic at most this often while failures go
# on: a dead master failing every pull of every queue and every send must not turn into a
# nameserver request per failure, and a failover in progress (the nameserver not showing
# the new master yet) is seen within this much of the route changing.
ROUTE_REFRESH_AFTER_FAILURE_MIN_INTERVAL_S = 0.3


def local_ip() -> str:
    return ".".join(str(b) for b in _local_ipv4_bytes())


# (loop -> {client_id: ClientInstance}); a loop that goes away takes its instances along.
_REGISTRY: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict] = weakref.WeakKeyDictionary()


def default_instance_name() -> str:
    return str(os.getpid())


async def acquire_instance(namesrv_addr: str, instance_name: str | None = None, *,
                           serialize_type: int | None = None, credentials=None, tls=None) -> ClientInstance:
    """The shared instance for `ip@instanceName` on this loop, started; release() when done.

    Clients share an instance only with the same credentials and TLS setting (its
    connections sign and encrypt for all of them; Java's MQClientInstance silently keeps
    the first client's RPC hook): another account gets its own instance name,
    `<pid>#<access key>`, unless an instance name was given, which is then an error."""
    loop = asyncio.get_running_loop()
    table = _REGISTRY.setdefault(loop, {})
    credentials = as_credentials(credentials)
    client_id = f"{local_ip()}@{instance_name or default_instance_name()}"
    inst = table.get(client_id)
    if inst is not None and not inst.closed and (inst.credentials != credentials or inst.tls is not tls):
        if instance_name is not None:
            raise InvalidArgumentError(
                f"client instance {instance_name!r} already runs with other credentials or TLS settings; "
                "give this client another instance_name")
        who = credentials.access_key if credentials is not None else "anonymous"
        client_id = f"{local_ip()}@{default_instance_name()}#{who}{'#tls' if tls else ''}"
        inst = table.get(client_id)
    if inst is None or inst.closed:
        inst = ClientInstance(client_id, namesrv_addr, serialize_type=serialize_type,
                              credentials=credentials, tls=tls)
        table[client_id] = inst
    else:
        inst.add_namesrv_addr(namesrv_addr)
    inst.refs += 1
    try:
        await inst.start()
    except BaseException:
        await inst.release()
        raise
    return inst


# After sending a lone request the client keeps its event loop polling instead of
# sleeping, for a window that follows the measured gap between such requests and at most
# this long, so the reply is handled without the idle-CPU wake-up (~40 µs per hop on the
# VMs measured; remoting/busy_poll.py, docs/benchmarks.md). Set to 0 (before creating
# clients) to save the CPU.
DEFAULT_BUSY_POLL_US = 500


async def acquire_consumer_instance(consumer) -> "ClientInstance":
    """The shared instance for a consumer, with the consumer registered in it.

    A group member is a clientId: when another consumer of the same group already lives in
    this process (and no instance name was given), this one gets its own instance name and
    so its own clientId. Sets consumer.instance_name in that case."""
    inst = await acquire_instance(consumer.namesrv_addr, consumer.instance_name,
                                  serialize_type=consumer.serialize_type, credentials=consumer.credentials,
                                  tls=consumer.tls)
    if consumer.group in inst.consumers and consumer.instance_name is None:
        await inst.release()
        consumer.instance_name = f"{os.getpid()}#{id(consumer):x}"
        inst = await acquire_instance(consumer.namesrv_addr, consumer.instance_name,
                                      serialize_type=consumer.serialize_type, credentials=consumer.credentials,
                                      tls=consumer.tls)
    try:
        inst.register_consumer(consumer.group, consumer)
    except BaseException:
        await inst.release()
        raise
    return inst


class ClientInstance:
    def __init__(self, client_id: str, namesrv_addr: str, *, serialize_type: int | None = None,
                 route_refresh_interval_s: float = ROUTE_REFRESH_INTERVAL_S,
                 heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
                 rebalance_interval_s: float = REBALANCE_INTERVAL_S,
                 busy_poll_us: int | None = None, credentials=None, tls=None):
        self.client_id = client_id
        # Header codec towards brokers: None = negotiate per connection (msgpack with pocketmq
        # brokers, JSON with anything else); nameserver requests always use JSON.
        self.serialize_type = serialize_type
        # ACL account every request is signed with (client/credentials.py), or None; and TLS
        # (True, an ssl.SSLContext, or None/False) for every connection, brokers and nameservers
        self.credentials = as_credentials(credentials)
        self.tls = tls
        self.remoting = ClientRemoting(handler=self._on_request, language=LanguageCode.PYTHON,
                                       serialize_type=SerializeType.JSON,
                                       busy_poll_us=DEFAULT_BUSY_POLL_US if busy_poll_us is None else busy_poll_us,
                                       credentials=self.credentials, ssl_context=resolve_client_tls(tls))
        self.remoting.set_namesrv_addr(namesrv_addr)
        self.remoting.on_connection_lost = self._connection_lost
        self.route_refresh_interval_s = route_refresh_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.rebalance_interval_s = rebalance_interval_s
        self.routes: dict[str, TopicRouteData] = {}
        self.publish: dict[str, TopicPublishInfo] = {}
        self.brokers = BrokerAddrTable()
        self.producers: dict[str, object] = {}   # group -> producer impl
        self.consumers: dict[str, object] = {}   # group -> consumer impl (rebalance(), consumer_data())
        self.refs = 0
        self.started = False
        self.closed = False
        self._tasks: list[asyncio.Task] = []
        self._reset_tasks: set[asyncio.Task] = set()     # broker-initiated offset resets
        self._rebalance_wakeup = asyncio.Event()
        self._start_lock = asyncio.Lock()
        self._route_locks: dict[str, asyncio.Lock] = {}
        self._hb_lock = asyncio.Lock()
        # Background work started by route updates and failures: one task each, at most;
        # what arrives while it runs joins it (addresses to heartbeat: a subset of the member
        # table; topics to refresh: pending marks in the limiter, one per topic).
        self._hb_pending: set[str] = set()
        self._hb_task: asyncio.Task | None = None
        self._refresh_limiter = RefreshLimiter(int(ROUTE_REFRESH_AFTER_FAILURE_MIN_INTERVAL_S * 1000))
        self._refresh_task: asyncio.Task | None = None
        # topic -> resolved when the topic's current (or next) failure refresh ends: what a
        # producer about to retry on the failed broker waits for; one per topic at most
        self._refreshed: dict[str, asyncio.Future] = {}
        # topic -> {id: stats} of the clients that asked for its current (or next) failure
        # refresh: each counts it once, however many of its failures asked
        self._refresh_watchers: dict[str, dict[int, dict]] = {}
        # route_refreshes_on_failure: refreshes of one topic's route made at once because of
        # a failure (each is one nameserver request)
        self.stats = {"route_refreshes_on_failure": 0}
        # Every request the client makes to a broker or nameserver goes through this object.
        self.api = ClientAPI(self)

    # -- lifecycle ----------------------------------------------------------------------
    def add_namesrv_addr(self, addrs: str) -> None:
        known = list(self.remoting.namesrv_addrs)
        for a in split_addr_list(addrs):
            if a not in known:
                known.append(a)
        self.remoting.set_namesrv_addr(known)

    async def start(self) -> None:
        async with self._start_lock:
            if self.started:
                return
            if self.closed:
                raise ClientStateError("client instance closed")
            self.started = True
            self._tasks = [
                asyncio.create_task(self._every(self.route_refresh_interval_s, self.refresh_routes),
                                    name=f"{self.client_id}:routes"),
                asyncio.create_task(self._every(self.heartbeat_interval_s, self.heartbeat_all),
                                    name=f"{self.client_id}:heartbeat"),
                asyncio.create_task(self._rebalance_loop(), name=f"{self.client_id}:rebalance"),
            ]

    async def release(self) -> None:
        self.refs -= 1
        if self.refs <= 0 and not self.producers and not self.consumers:
            await self.close()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        background = [t for t in (self._hb_task, self._refresh_task) if t is not None]
        for t in self._tasks + list(self._reset_tasks) + background:
            t.cancel()
        for t in self._tasks + list(self._reset_tasks) + background:
            try:
                await t
            except BaseException:
                pass
        self._tasks = []
        for fut in self._refreshed.values():
            fut.cancel()            # a producer waiting for a refresh goes on (bounded anyway)
        self._refreshed.clear()
        self._refresh_watchers.clear()
        await self.remoting.close()
        table = _REGISTRY.get(asyncio.get_running_loop())
        if table is not None and table.get(self.client_id) is self:
            del table[self.client_id]

    async def _every(self, interval_s: float, fn) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("%s: periodic %s failed: %s", self.client_id, fn.__name__, e)

    # -- registration -------------------------------------------------------------------
    def register_producer(self, group: str, producer) -> None:
        if group in self.producers and self.producers[group] is not producer:
            raise ClientStateError(f"producer group {group!r} already registered on {self.client_id}; "
                                   "use another instance_name")
        self.producers[group] = producer

    def register_consumer(self, group: str, consumer) -> None:
        if group in self.consumers and self.consumers[group] is not consumer:
            raise ClientStateError(f"consumer group {group!r} already registered on {self.client_id}; "
                                   "use another instance_name")
        self.consumers[group] = consumer

    def unregister_producer(self, group: str) -> None:
        self.producers.pop(group, None)

    def unregister_consumer(self, group: str) -> None:
        self.consumers.pop(group, None)

    async def unregister_client(self, producer_group: str | None = None,
                                consumer_group: str | None = None) -> None:
        """UNREGISTER_CLIENT to every known broker (best effort, bounded)."""
        addrs = self.all_broker_addrs()

        async def one(addr):
            try:
                await self.api.unregister_client(addr, self.client_id, producer_group=producer_group,
                                                 consumer_group=consumer_group)
            except MQClientError as e:
                log.debug("unregister at %s failed: %s", addr, e)
        if addrs:
            await asyncio.gather(*(one(a) for a in addrs))

    # -- broker-initiated requests --------------------------------------------------------
    def _on_request(self, conn, cmd: RemotingCommand):
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            group = cmd.ext_fields.get("consumerGroup")
            log.info("%s: consumer ids of %s changed, rebalancing", self.client_id, group)
            self.rebalance_now()
            return None
        if cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            return self._on_reset_offset(cmd)
        if cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            group = cmd.ext_fields.get("consumerGroup", "")
            consumer = self.consumers.get(group)
            if consumer is None:
                return cmd.response(ResponseCode.SYSTEM_ERROR,
                                    f"The Consumer Group <{group}> not exist in this consumer")
            return cmd.response(ResponseCode.SUCCESS, body=self.consumer_running_info(consumer))
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            return self._on_check_transaction_state(conn, cmd)
        if cmd.code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            return self._on_consume_message_directly(conn, cmd)
        return cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                            f" request type {cmd.code} not supported")

    def consumer_running_info(self, consumer) -> bytes:
        """Java's ConsumerRunningInfo of `consumer` (MQClientInstance.consumerRunningInfo):
        the consumer's own part (running_info(); a consumer without one, the lite pull
        consumer, reports its type and subscriptions only) plus this instance's
        nameserver, consume type and client version. No jstack: Python has none."""
        info = consumer.running_info() if hasattr(consumer, "running_info") else {}
        push = hasattr(consumer, "running_info")
        props = dict(info.get("properties") or {"consumerGroup": getattr(consumer, "group", "")})
        props[PROP_NAMESERVER_ADDR] = ";".join(self.remoting.namesrv_addrs)
        props[PROP_CONSUME_TYPE] = "CONSUME_PASSIVELY" if push else "CONSUME_ACTIVELY"
        props[PROP_CLIENT_VERSION] = CLIENT_VERSION_DESC
        subs = info.get("subscriptions")
        if subs is None:
            subs = list(getattr(consumer, "subscriptions", {}).values()) if isinstance(
                getattr(consumer, "subscriptions", None), dict) else []
        return encode_consumer_running_info(props, subs, info.get("mq_table") or {},
                                            info.get("status_table") or {})

    def _on_consume_message_directly(self, conn, cmd: RemotingCommand):
        """CONSUME_MESSAGE_DIRECTLY (an admin's "resend to this client", relayed by the broker
        with the stored record as the body): the group's push consumer runs its listener once
        on the message, commits nothing, sends nothing back, and the answer carries its
        ConsumeMessageDirectlyResult (Java's ClientRemotingProcessor.consumeMessageDirectly).
        Answered from a task: the connection keeps reading while the listener runs."""
        if cmd.is_oneway:
            return None
        try:
            header = decode_consume_message_directly_header(cmd.ext_fields)
            rec = msgcodec.decode_record(cmd.body or b"")
        except (HeaderError, ValueError) as e:
            log.warning("%s: unreadable CONSUME_MESSAGE_DIRECTLY from %s: %s", self.client_id, conn.remote_addr, e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"unreadable CONSUME_MESSAGE_DIRECTLY: {e}")
        group = header.consumer_group
        consumer = self.consumers.get(group)
        if consumer is None or not hasattr(consumer, "consume_message_directly"):
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"The Consumer Group <{group}> not exist in this consumer"
                                if consumer is None else
                                f"The Consumer Group <{group}> is not a push consumer in this client")
        if consumer.direct_consumes_busy():
            return cmd.response(ResponseCode.SYSTEM_BUSY,
                                f"[OVERLOAD] {consumer.direct_consumes} messages of group {group} are being "
                                "consumed directly already: retry later")
        msg = msgcodec.MessageExt.from_record(rec, header.broker_name or "")

        async def run():
            result = await consumer.consume_message_directly(msg)
            return cmd.response(ResponseCode.SUCCESS, body=result.encode())
        return run()

    def _on_check_transaction_state(self, conn, cmd: RemotingCommand):
        """CHECK_TRANSACTION_STATE (oneway from the broker): handed to the transaction
        producer of the message's PGROUP, which answers with END_TRANSACTION."""
        try:
            header = decode_check_transaction_state_header(cmd.ext_fields)
            msg = msgcodec.decode_record(cmd.body or b"")
        except (HeaderError, ValueError) as e:
            log.warning("%s: unreadable CHECK_TRANSACTION_STATE from %s: %s", self.client_id, conn.remote_addr, e)
            return None if cmd.is_oneway else cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        group = msg.properties.get(msgcodec.PGROUP, "")
        producer = self.producers.get(group)
        if producer is None or not hasattr(producer, "on_check_transaction_state"):
            log.warning("%s: CHECK_TRANSACTION_STATE for group %s, which has no transaction producer here",
                        self.client_id, group)
            return None if cmd.is_oneway else cmd.response(
                ResponseCode.SYSTEM_ERROR, f"no transaction producer of group {group} in this client")
        producer.on_check_transaction_state(conn.remote_addr, header, msg)
        return None if cmd.is_oneway else cmd.response(ResponseCode.SUCCESS)

    def _on_reset_offset(self, cmd: RemotingCommand):
        """RESET_CONSUMER_CLIENT_OFFSET (mqadmin resetOffsetByTime through the broker): the
        group's consumer restarts the listed queues it owns at the given offsets. Java
        brokers send it oneway; a request expecting an answer gets one."""
        group = cmd.ext_fields.get("group") or ""
        topic = cmd.ext_fields.get("topic") or ""
        consumer = self.consumers.get(group)
        try:
            table = decode_reset_offset_body(cmd.body) if cmd.body else {}
        except BodyError as e:
            log.warning("%s: unreadable offset reset for %s: %s", self.client_id, group, e)
            return None if cmd.is_oneway else cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        if consumer is None:
            return None if cmd.is_oneway else cmd.response(
                ResponseCode.SYSTEM_ERROR, f"The Consumer Group <{group}> not exist in this consumer")
        table = {mq: off for mq, off in table.items() if mq.topic == topic} if topic else table
        log.info("%s: %s offsets reset by the broker: %s", self.client_id, group,
                 {f"{mq.broker_name}:{mq.queue_id}": off for mq, off in sorted(table.items())})
        task = asyncio.get_running_loop().create_task(consumer.reset_offsets(table),
                                                      name=f"{group}:reset-offsets")
        self._reset_tasks.add(task)
        task.add_done_callback(self._reset_done)
        return None if cmd.is_oneway else cmd.response(ResponseCode.SUCCESS)

    def _reset_done(self, task: asyncio.Task) -> None:
        self._reset_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s: offset reset failed: %r", self.client_id, task.exception())

    # -- rebalance timer ------------------------------------------------------------------
    def rebalance_now(self) -> None:
        self._rebalance_wakeup.set()

    async def _rebalance_loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.rebalance_interval_s):
                    await self._rebalance_wakeup.wait()
            except TimeoutError:
                pass
            self._rebalance_wakeup.clear()
            for group, consumer in list(self.consumers.items()):
                try:
                    await consumer.rebalance()
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    log.warning("%s: rebalance of %s failed: %s", self.client_id, group, e)

    # -- routes ---------------------------------------------------------------------------
    def _topics_in_use(self) -> set[str]:
        topics = set(self.publish)
        for c in self.consumers.values():
            topics.update(c.topics())
        return topics

    async def refresh_routes(self) -> None:
        for topic in sorted(self._topics_in_use()):
            try:
                await self.update_route(topic)
            except (NoRouteError, BrokerError, RemotingFailure) as e:
                log.debug("%s: route refresh for %s failed: %s", self.client_id, topic, e)

    async def fetch_route(self, topic: str) -> TopicRouteData | None:
        """GET_ROUTEINFO_BY_TOPIC; None when the nameserver does not know the topic."""
        return await self.api.get_route(topic)

    async def update_route(self, topic: str, *, for_publish: bool | None = None) -> TopicRouteData | None:
        lock = self._route_locks.setdefault(topic, asyncio.Lock())
        async with lock:
            route = await self.fetch_route(topic)
            if route is None or not route.queue_datas:
                return None
            self.routes[topic] = route
            self._update_brokers(route)
            info = publish_info(topic, route)
            old = self.publish.get(topic)
            if old is not None:
                info.send_which_queue = old.send_which_queue
            if for_publish or old is not None:
                self.publish[topic] = info
            return route

    async def publish_info(self, topic: str) -> TopicPublishInfo:
        info = self.publish.get(topic)
        if info is not None and info.ok:
            return info
        route = await self.update_route(topic, for_publish=True)
        info = self.publish.get(topic)
        if route is not None and info is not None and info.ok:
            return info
        # Unknown topic: publish through the auto-create key topic (Java: TBW102, <= 4 queues).
        default = await self.fetch_route(DEFAULT_TOPIC)
        if default is None:
            raise NoRouteError(f"No route info of this topic: {topic}")
        self._update_brokers(default)
        for qd in default.queue_datas:
            n = min(DEFAULT_TOPIC_QUEUE_NUMS, qd.read_queue_nums)
            qd.read_queue_nums = n
            qd.write_queue_nums = n
        info = publish_info(topic, default)
        if not info.ok:
            raise NoRouteError(f"No route info of this topic: {topic}")
        self.publish[topic] = info
        return info

    async def subscribe_queues(self, topic: str, refresh: bool = False) -> list[MessageQueue]:
        route = self.routes.get(topic)
        if route is None or refresh:
            route = await self.update_route(topic)
        if route is None:
            return []
        return subscribe_queues(topic, route)

    async def check_filters_in_brokers(self, group: str, subscriptions) -> None:
        """Java's checkClientInBroker, before a push consumer starts: every non-TAG
        subscription is checked (CHECK_CLIENT_CONFIG) by a master of its topic, so a broker
        without enablePropertyFilter, or an expression it cannot parse, fails start()
        with the broker's answer (a BrokerError) instead of failing every pull. A topic
        without a route yet, or a broker that cannot be reached now, is skipped with a log
        line: the pulls will meet the same answer later."""
        for sub in subscriptions:
            if sub.expression_type == "TAG":
                continue
            try:
                route = self.routes.get(sub.topic) or await self.update_route(sub.topic)
            except MQClientError as e:
                log.info("%s: no route yet for %s: %s", group, sub.topic, e)
                continue
            addrs = sorted(a for a in (bd.master_addr() for bd in route.broker_datas) if a) if route else []
            if not addrs:
                continue
            try:
                await self.api.check_client_config(addrs[0], group, self.client_id, sub)
            except BrokerError:
                raise
            except MQClientError as e:
                log.warning("%s: could not check the %s subscription of %s with %s: %s",
                            group, sub.expression_type, sub.topic, addrs[0], e)

    # -- master/slave groups ----------------------------------------------------------------
    def _update_brokers(self, route: TopicRouteData) -> None:
        """Take a route's members; act on what changed (never waiting: the route update
        must not block on a heartbeat or a consumer)."""
        changes = self.brokers.update(route)
        if not changes:
            return
        if changes.new_addrs:
            self._heartbeat_soon(changes.new_addrs)
        if changes.masters_lost:
            log.warning("%s: no master in the route of %s; reading from slaves", self.client_id,
                        ", ".join(sorted(changes.masters_lost)))
        if changes.masters_back:
            log.info("%s: the master of %s is back", self.client_id, ", ".join(sorted(changes.masters_back)))
        moved = changes.masters_moved
        if moved:
            log.warning("%s: the master of %s moved (failover): %s", self.client_id, ", ".join(sorted(moved)),
                        ", ".join(f"{n} -> {self.brokers.master(n)}" for n in sorted(moved)))
        # To a consumer a moved master is one that left and came back: orderly queues drop
        # the lock they held on the old master and lock again on the new one.
        lost, back = changes.masters_lost | moved, changes.masters_back | moved
        if lost or back:
            for consumer in list(self.consumers.values()):
                consumer.masters_changed(lost, back)
        if back:
            # The send faults a producer recorded for these groups were the old master's.
            for producer in list(self.producers.values()):
                forget = getattr(producer, "masters_back", None)
                if forget is not None:
                    forget(back)

    def _heartbeat_soon(self, addrs) -> None:
        """Heartbeat addresses a route showed for the first time now, in the background
        (Java waits for the 30 s timer: until then a new master cannot check our
        transactions and a new slave does not know our consumers). One task at most;
        addresses arriving while it runs are sent by it too."""
        if not self.started or self.closed or not (self.producers or self.consumers):
            return
        self._hb_pending.update(addrs)
        if self._hb_task is None or self._hb_task.done():
            self._hb_task = asyncio.get_running_loop().create_task(self._heartbeat_pending(),
                                                                   name=f"{self.client_id}:heartbeat-new")

    async def _heartbeat_pending(self) -> None:
        while self._hb_pending:
            addrs = self._hb_pending
            self._hb_pending = set()
            data = self.heartbeat_data()
            if not data.producer_groups and not data.consumer_data_set:
                return
            if not data.consumer_data_set:
                # producers only: masters only, like heartbeat_all (a slave takes no sends)
                masters = set(self.brokers.all_masters().values())
                addrs = addrs & masters
            body = dumps(data.to_json())
            await asyncio.gather(*(self._heartbeat(a, body) for a in sorted(addrs)))

    def _connection_lost(self, addr: str) -> None:
        """ClientRemoting: a connection to `addr` closed or could not be made. For a broker,
        refresh the routes through its group now: the nameserver drops a dead master at once
        (and lists a promoted slave as master once it registers), and the 30 s timer would
        leave requests failing against it meanwhile."""
        if not self.started or self.closed or addr in self.remoting.namesrv_addrs:
            return
        names = {name for name, addrs in self.brokers.table.items() if addr in addrs.values()}
        if names:
            self.request_route_refresh(names)

    def _topics_through(self, broker_names) -> set[str]:
        """The topics in use whose route names one of `broker_names` (a consumer's
        subscriptions, its %RETRY% topic included, and the producers' topics)."""
        routes = self.routes
        return {t for t in self._topics_in_use()
                if (r := routes.get(t)) is not None and any(bd.broker_name in broker_names for bd in r.broker_datas)}

    def request_route_refresh(self, broker_names, *, topic: str | None = None,
                              stats: dict | None = None) -> asyncio.Future | None:
        """A request to a broker of `broker_names` failed with a failover signal
        (client.failover.is_failover_signal): refresh now, in the background, the route of
        every topic in use through those groups, and of `topic`. Rate-limited per topic
        (client.failover.RefreshLimiter): what arrives while a topic's refresh waits joins it.

        `stats["route_refreshes_on_failure"]` (the caller's counters) counts, once each, the
        topic refreshes that serve this request (the one in flight, or else the next).
        Returns, for `topic`, a future resolved when that refresh ends, never with an error;
        None when nothing was asked (instance not started or closed, no topic)."""
        if not self.started or self.closed:
            return None
        topics = self._topics_through(set(broker_names))
        if topic is not None:
            topics.add(topic)
        if not topics:
            return None
        self._refresh_limiter.request(topics)
        if stats is not None:
            stats.setdefault("route_refreshes_on_failure", 0)
            for t in topics:
                self._refresh_watchers.setdefault(t, {})[id(stats)] = stats
        loop = asyncio.get_running_loop()
        fut = None
        if topic is not None:
            fut = self._refreshed.get(topic)
            if fut is None:
                fut = self._refreshed[topic] = loop.create_future()
        if self._refresh_task is None or self._refresh_task.done():
            self._refresh_task = loop.create_task(self._refresh_after_failures(), name=f"{self.client_id}:routes-now")
        return fut

    async def _refresh_after_failures(self) -> None:
        """Refresh the pending topics as the limiter lets them go (one task at most; a
        topic's refreshes start ROUTE_REFRESH_AFTER_FAILURE_MIN_INTERVAL_S apart)."""
        limiter = self._refresh_limiter
        while limiter.pending:
            due, wait_ms = limiter.take_due(mono_ms())
            if not due:
                if wait_ms is None:         # (nothing in flight here: cannot happen)
                    return
                await asyncio.sleep(wait_ms / 1000)
                continue
            try:
                await asyncio.gather(*(self._refresh_one(t) for t in due))
            finally:
                limiter.finished(due)

    async def _refresh_one(self, topic: str) -> None:
        try:
            await self.update_route(topic)
        except (NoRouteError, BrokerError, RemotingFailure) as e:
            log.debug("%s: route refresh for %s after a failure failed: %s", self.client_id, topic, e)
        except Exception as e:
            # a bug: logged, and later failures still get their refresh
            log.warning("%s: route refresh for %s after a broker failure failed: %r", self.client_id, topic, e)
        finally:
            self.stats["route_refreshes_on_failure"] += 1
            for stats in self._refresh_watchers.pop(topic, {}).values():
                stats["route_refreshes_on_failure"] += 1
            fut = self._refreshed.pop(topic, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    async def subscribe_addr_refreshing(self, broker_name: str, topic: str, broker_id: int) -> tuple[str, int]:
        """(address, broker id) to pull `broker_name`'s queue from: member `broker_id`, else
        the master, else a slave (client.replica); the route is fetched again when the
        group is not known."""
        found = self.brokers.find_broker_address_in_subscribe(broker_name, broker_id)
        if found is not None:       # (every pull: no coroutine layer more than before)
            return found
        return await self._find_after_refresh(self.brokers.find_broker_address_in_subscribe, topic,
                                              broker_name, broker_id)

    async def admin_addr_refreshing(self, broker_name: str, topic: str) -> tuple[str, int]:
        """(address, broker id) for offsets and queue bounds (commit, query, min/max, search):
        the master, else a slave (Java's findBrokerAddressInAdmin)."""
        found = self.brokers.find_broker_address_in_admin(broker_name)
        if found is not None:
            return found
        return await self._find_after_refresh(self.brokers.find_broker_address_in_admin, topic, broker_name)

    async def _find_after_refresh(self, find, topic: str, broker_name: str, *args) -> tuple[str, int]:
        await self.update_route(topic)
        found = find(broker_name, *args)
        if found is None:
            raise NoRouteError(f"broker {broker_name} not found in the route of {topic}")
        return found

    def all_broker_addrs(self) -> list[str]:
        out = []
        for addrs in self.brokers.table.values():
            out.extend(addrs.values())
        return sorted(set(out))

    def master_addr(self, broker_name: str) -> str:
        addr = self.brokers.master(broker_name)
        if addr is None:
            raise NoRouteError(f"broker {broker_name} has no master address")
        return addr

    async def master_addr_refreshing(self, broker_name: str, topic: str) -> str:
        addr = self.brokers.master(broker_name)
        if addr is None:
            await self.update_route(topic)
            addr = self.brokers.master(broker_name)
        if addr is None:
            raise NoRouteError(f"broker {broker_name} not found in the route of {topic}")
        return addr

    # -- heartbeat ------------------------------------------------------------------------
    def heartbeat_data(self) -> HeartbeatData:
        consumers = []
        for c in self.consumers.values():
            cd = c.consumer_data()
            if cd is not None:
                consumers.append(cd)
        return HeartbeatData(self.client_id, sorted(self.producers), consumers)

    async def heartbeat_all(self) -> None:
        data = self.heartbeat_data()
        if not data.producer_groups and not data.consumer_data_set:
            return
        body = dumps(data.to_json())
        if data.consumer_data_set:
            addrs = self.all_broker_addrs()
        else:
            addrs = sorted(set(self.brokers.all_masters().values()))
        if not addrs:
            return
        await asyncio.gather(*(self._heartbeat(a, body) for a in addrs))

    async def _heartbeat(self, addr: str, body: bytes | None = None) -> bool:
        if body is None:
            data = self.heartbeat_data()
            if not data.producer_groups and not data.consumer_data_set:
                return True
            body = dumps(data.to_json())
        try:
            await self.api.heartbeat(addr, body)
        except BrokerError as e:
            log.warning("%s: heartbeat to %s answered %s %s", self.client_id, addr, e.code, e.remark)
            return False
        except MQClientError as e:
            log.debug("%s: heartbeat to %s failed: %s", self.client_id, addr, e)
            return False
        return True

    # -- requests -------------------------------------------------------------------------
    async def _broker_connection(self, addr: str):
        """The connection to a broker, prepared on first use: header codec chosen and, when we
        have producers or consumers, a heartbeat sent (the broker may have restarted)."""
        conn = await self.remoting.connection(addr)
        if "serialize_type" not in conn.attrs:
            lock = conn.attrs.setdefault("prepare_lock", asyncio.Lock())
            async with lock:
                if "serialize_type" not in conn.attrs:
                    st = self.serialize_type
                    if st is None:
                        st = await self._negotiate(addr)
                    conn.attrs["serialize_type"] = st
        if not conn.attrs.get("heartbeat_sent") and (self.consumers or self.producers):
            conn.attrs["heartbeat_sent"] = True
            await self._heartbeat(addr)
        if conn.attrs.get("heartbeat_sent") and not conn.closed:
            conn.attrs["ready"] = True     # invoke() may skip this preparation from now on
        return conn

    async def _negotiate(self, addr: str) -> int:
        """msgpack headers if the broker is pocketmq's (GET_BROKER_RUNTIME_INFO's
        brokerVersionDesc says so), JSON otherwise (Java and other brokers)."""
        try:
            d = await self.api.broker_runtime_info(addr, unprepared=True)
            table = d.get("table") if isinstance(d, dict) else None
            desc = str((table or {}).get("brokerVersionDesc", "")) if isinstance(table, dict) else ""
            if desc.startswith("pocketmq"):
                return SerializeType.MSGPACK
        except MQClientError as e:
            log.debug("header negotiation with %s failed: %s", addr, e)
        return SerializeType.JSON

    async def invoke(self, addr: str, cmd: RemotingCommand, timeout_s: float = 3.0) -> RemotingCommand:
        """Request/response to a broker."""
        try:
            conn = self.remoting.connections.get(addr)
            if conn is None or conn.closed or "ready" not in conn.attrs:
                conn = await self._broker_connection(addr)
            cmd.language = LanguageCode.PYTHON
            cmd.serialize_type = conn.attrs["serialize_type"]
            return await conn.request(cmd, timeout_s)
        except RemotingError as e:
            raise wrap_remoting(e, addr) from None

    async def invoke_unprepared(self, addr: str, cmd: RemotingCommand, timeout_s: float = 3.0) -> RemotingCommand:
        """Request/response over the bare connection (the heartbeat that prepares it): the
        header codec is the negotiated one when known, JSON before."""
        try:
            conn = await self.remoting.connection(addr)
            if cmd.code == RequestCode.HEART_BEAT:
                conn.attrs["heartbeat_sent"] = True
            cmd.language = LanguageCode.PYTHON
            cmd.serialize_type = conn.attrs.get("serialize_type", SerializeType.JSON)
            return await conn.request(cmd, timeout_s)
        except RemotingError as e:
            raise wrap_remoting(e, addr) from None

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand) -> None:
        try:
            conn = await self._broker_connection(addr)
            cmd.language = LanguageCode.PYTHON
            cmd.serialize_type = conn.attrs["serialize_type"]
            conn.oneway(cmd)
            # Oneway sends wait for no reply, so nothing else paces them: wait while the
            # socket buffer is over its high-water mark (the transport paused writing).
            await conn.drain()
        except RemotingError as e:
            raise wrap_remoting(e, addr) from None

    async def consumer_id_list(self, group: str, topic: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP from a broker serving `topic` (masters first, by name)."""
        route = self.routes.get(topic)
        names = sorted(b.broker_name for b in route.broker_datas) if route else []
        last: Exception | None = None
        for name in names:
            addr = self.brokers.any_addr(name)
            if addr is None:
                continue
            try:
                return await self.api.consumer_id_list(addr, group)
            except (RemotingFailure, BrokerError) as e:
                last = e
        if last is not None:
            raise last
        raise NoRouteError(f"no broker for topic {topic}")


__all__ = [
    "DEFAULT_TOPIC",
    "ClientAPI",
    "ClientInstance",
    "ConsumerData",
    "PullResult",
    "acquire_instance",
    "mono_ms",
    "now_ms",
    "pull_sys_flag",
]
