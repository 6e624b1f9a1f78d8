"""MessagingService on the broker's event loop: RocketMQ's proxy in local mode.

Each RPC calls the broker directly: sends and transaction ends go through the broker's
own processor table (`build_processor_table`, the one registration point: the same checks,
auto-creation, half-message store, durability waits and slave refusal as a remoting
client gets), as a SEND_MESSAGE / END_TRANSACTION command built from the request, the way
Java's LocalMessageService does. The conversions are broker/proxy/convert.py's.

Served: QueryRoute, Heartbeat, Telemetry, NotifyClientTermination, SendMessage,
EndTransaction, QueryAssignment, and POP consumption over the broker's POP engine
(broker/services/pop.py, `ctx.pop`): ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue. Answered with a clear status and no effect: PullMessage,
UpdateOffset, GetOffset, QueryOffset (no official client calls them), SyncLiteSubscription
and RecallMessage (lite topics and recalls are not supported).

ReceiveMessage follows Java's ReceiveMessageActivity (the rules are convert.py's): the
long poll clamped to 5-20 s and the call's deadline, invisible_duration 10 s - 12 h, or
with auto_renew a 60 s lease the engine renews (owner = the client id) until the message
is acked or changed, or the client goes (NotifyClientTermination, its live Telemetry
stream ending, expiry: `_release`); at most 32 messages; the queue the client names is
not used (the engine pops every queue and the group's retry topic, as Java's proxy pops
with queue -1); the group's consumeMessageOrderly makes the pop FIFO, `attempt_id`
gets a retried FIFO receive its batch back. A message the stream could not deliver
(the client cancelled, or took no frame for RECEIVE_WRITE_TIMEOUT_S) is made visible
again after NACK_INVISIBLE_MS.

Clients are known by the `x-mq-client-id` header. Each is one `GrpcChannel`: the object
the broker's own producer/consumer registry (broker/core/clients.py) holds for it, as it
holds a connection for a remoting client; so mqadmin producerConnection/consumerConnection
list gRPC clients, the housekeeping expiry drops them, and the transaction check-back
service asks them (`GrpcChannel.oneway` turns CHECK_TRANSACTION_STATE into a
recover_orphaned_transaction_command on the client's Telemetry stream).

Bounds: clients known at once (MAX_CLIENTS: when full, clients silent for 120 s without a
Telemetry stream are forgotten first, then TOO_MANY_REQUESTS), messages per send
(MAX_MESSAGES_PER_SEND), commands queued for one Telemetry stream (TELEMETRY_OUTBOX: a
client that does not read loses check-backs, which the check service repeats; nothing
waits on it), pending transaction ids (MAX_PENDING_TRANSACTIONS, oldest dropped: its
EndTransaction then finds the half record through the message index, as after a restart), entries per
AckMessage (MAX_ACK_ENTRIES), the time a receive's frame may wait for a client that does
not read (RECEIVE_WRITE_TIMEOUT_S); the POP engine bounds messages in flight and waiting
receives (SYSTEM_BUSY / POLLING_FULL -> TOO_MANY_REQUESTS).
"""
from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from pocketmq.broker.core import transaction as tx
from pocketmq.broker.core.clients import CHANNEL_EXPIRED_MS, ClientChannelInfo
from pocketmq.broker.core.pop import GRPC_MIN_INVISIBLE_MS, MAX_INVISIBLE_MS, PopError, invisible_error
from pocketmq.broker.core.topics import validate_topic
from pocketmq.broker.processors.client_manage import notify_consumer_ids_changed
from pocketmq.broker.proxy import convert
from pocketmq.broker.proxy.convert import OK, Code, Refused, status
from pocketmq.broker.proxy.pb import definition_pb2 as pb
from pocketmq.broker.proxy.pb import service_pb2 as spb
from pocketmq.broker.proxy.pb import service_pb2_grpc
from pocketmq.common.constants import (AUTO_CREATE_TOPIC_KEY_TOPIC, NAME_GROUP, TRANS_HALF_TOPIC, name_error,
                                       retry_topic)
from pocketmq.protocol import bodies
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.codes import PermName, RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import (
    SendMessageRequestHeader,
    decode_check_transaction_state_header,
    encode_send_header,
)

log = logging.getLogger("pocketmq.broker.proxy")

MAX_CLIENTS = 10_000
MAX_MESSAGES_PER_SEND = 1024
TELEMETRY_OUTBOX = 64
MAX_PENDING_TRANSACTIONS = 100_000
CLIENT_ID_HEADER = "x-mq-client-id"
MAX_ACK_ENTRIES = 1024
RECEIVE_WRITE_TIMEOUT_S = 30.0    # a ReceiveMessage frame the client does not take within this ends the call
NACK_INVISIBLE_MS = 1000          # messages a receive could not deliver are visible again after this
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"
_CLOSE = object()     # put in an outbox: end the Telemetry stream


def _delivery_frame(now_ms: int) -> spb.ReceiveMessageResponse:
    """A receive's last frame: when the broker handed the messages over."""
    frame = spb.ReceiveMessageResponse()
    frame.delivery_timestamp.FromMilliseconds(now_ms)
    return frame


def _peer_addr(peer: str | None) -> str:
    """grpc's peer text ("ipv4:127.0.0.1:5555", "ipv6:[::1]:5555") as "host:port"."""
    if not peer:
        return "0.0.0.0:0"
    kind, _, rest = peer.partition(":")
    return rest if kind in ("ipv4", "ipv6") and rest else "0.0.0.0:0"


class GrpcChannel:
    """One gRPC client as the broker's registries see it (what a remoting connection is
    for a 4.x client): attrs, remote_addr, closed, oneway(), close()."""

    def __init__(self, client_id: str, remote_addr: str, service: "MessagingService"):
        self.client_id = client_id
        self.remote_addr = remote_addr
        self.attrs: dict = {}
        self.closed = False
        self.settings: pb.Settings | None = None
        self.client_type = pb.CLIENT_TYPE_UNSPECIFIED
        self.group: str | None = None           # consumers
        self.topics: tuple[str, ...] = ()       # producers: the topics they publish (groups = topics)
        self.info: ClientChannelInfo | None = None
        self.outbox: asyncio.Queue | None = None    # the live Telemetry stream's commands
        self.dropped_commands = 0
        self.last_seen_ms = 0                       # monotonic: the last RPC naming this client
        self._service = service

    def __repr__(self) -> str:
        return f"GrpcChannel({self.client_id!r}, {self.remote_addr})"

    def push(self, command: spb.TelemetryCommand) -> bool:
        """Queue a command for the client's Telemetry stream; False (dropped) when it has
        none or does not read (the outbox is full)."""
        q = self.outbox
        if q is None or self.closed:
            return False
        try:
            q.put_nowait(command)
        except asyncio.QueueFull:
            self.dropped_commands += 1
            return False
        return True

    def oneway(self, cmd: RemotingCommand) -> None:
        """What the broker sends a client over its connection, translated: a transaction
        check-back becomes recover_orphaned_transaction_command; consumer-list changes mean
        nothing to a 5.x client (it asks QueryAssignment every few seconds)."""
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            self._service.check_transaction(self, cmd)
        elif cmd.code != RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            log.debug("request code %d not relayed to gRPC client %s", cmd.code, self.client_id)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.outbox is not None:
            try:
                self.outbox.put_nowait(_CLOSE)
            except asyncio.QueueFull:
                pass     # the stream's loop sees `closed` at its next command
        self._service.forget(self)


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, ctx, processors: dict, *, grpc_port: int, advertised_host: str):
        self.ctx = ctx
        self.processors = processors        # request code -> handler(conn, cmd) (build_processor_table)
        self.grpc_port = grpc_port
        self.advertised_host = advertised_host
        self.clients: dict[str, GrpcChannel] = {}
        # (producer group, transaction id) -> (half message's commit-log offset, queue offset)
        self.pending_transactions: OrderedDict = OrderedDict()
        self.calls: dict[tuple[str, int], int] = {}      # (rpc, status code) -> count (metrics)
        self._background: set[asyncio.Task] = set()      # nacks of undelivered messages
        # aclEnable: auth.py's GrpcAclGuard (set by auth.guard_servicer, which checks every
        # other RPC before it gets here); None: no ACL
        self.acl_guard = None

    # -- helpers --------------------------------------------------------------------------
    def _count(self, rpc: str, st: pb.Status) -> pb.Status:
        key = (rpc, st.code)
        self.calls[key] = self.calls.get(key, 0) + 1
        return st

    def _broker(self) -> pb.Broker:
        return pb.Broker(name=self.ctx.config.brokerName, id=0,
                         endpoints=convert.endpoints(self.advertised_host, self.grpc_port))

    @staticmethod
    def _client_id(context) -> str | None:
        for key, value in context.invocation_metadata() or ():
            if key == CLIENT_ID_HEADER:
                return value or None
        return None

    def _channel(self, context, create: bool = True) -> GrpcChannel:
        client_id = self._client_id(context)
        if client_id is None:
            raise Refused(Code.CLIENT_ID_REQUIRED, f"the {CLIENT_ID_HEADER} header is missing")
        now = self.ctx.mono_ms()
        ch = self.clients.get(client_id)
        if ch is None or ch.closed:
            if not create:
                raise Refused(Code.UNRECOGNIZED_CLIENT_TYPE, f"client {client_id} is not known")
            if len(self.clients) >= MAX_CLIENTS:
                self._expire(now)
            if len(self.clients) >= MAX_CLIENTS:
                raise Refused(Code.TOO_MANY_REQUESTS, f"this broker serves at most {MAX_CLIENTS} gRPC clients")
            ch = self.clients[client_id] = GrpcChannel(client_id, _peer_addr(context.peer()), self)
        ch.last_seen_ms = now
        return ch

    def _expire(self, now_ms: int) -> None:
        """Forget clients silent for CHANNEL_EXPIRED_MS without a Telemetry stream (a client
        id used once, or a client gone without NotifyClientTermination): the table's bound
        must not be filled for good by ids nobody uses any more."""
        for ch in [c for c in self.clients.values()
                   if c.outbox is None and now_ms - c.last_seen_ms > CHANNEL_EXPIRED_MS]:
            ch.close()

    def forget(self, ch: GrpcChannel) -> None:
        """A channel closed (terminated, expired): out of every registry."""
        if self.clients.get(ch.client_id) is ch:
            del self.clients[ch.client_id]
        ctx = self.ctx
        for group in ctx.consumers.remove_channel(ch):
            gcfg = ctx.groups.find(group)
            if gcfg is None or gcfg.notifyConsumerIdsChangedEnable:
                notify_consumer_ids_changed(ctx.consumers, group)
        ctx.producers.remove_channel(ch)
        self._release(ch)

    def _release(self, ch: GrpcChannel) -> None:
        """The client's auto-renewed leases are renewed no more: they come back in 1 s
        (broker/services/pop.py release_owner), unless the client is back by then."""
        if self.ctx.pop is not None:
            self.ctx.pop.release_owner(ch.client_id)

    async def _topic(self, topic: str, create: bool):
        """The topic's config; auto-created from TBW102 (as a 4.x send would) when
        `create` and autoCreateTopicEnable, published (topics.json and the nameservers)
        before the answer. Raises Refused."""
        ctx = self.ctx
        bad = validate_topic(topic)
        if bad:
            raise Refused(Code.ILLEGAL_TOPIC, bad)
        tc = ctx.topics.get(topic)
        if tc is None and create and not ctx.topics.is_system_topic(topic):
            tc = ctx.topics.create_from_default(topic, AUTO_CREATE_TOPIC_KEY_TOPIC,
                                                ctx.config.defaultTopicQueueNums, ctx.now_ms())
            if tc is not None:
                try:
                    await ctx.publish_topics(topic)
                except OSError as e:
                    raise Refused(Code.INTERNAL_SERVER_ERROR, f"create topic {topic} failed: {e}") from None
        if tc is None:
            auto = ctx.config.autoCreateTopicEnable
            raise Refused(Code.TOPIC_NOT_FOUND,
                          f"topic {topic} does not exist on broker {ctx.config.brokerName}"
                          + ("" if auto else " and autoCreateTopicEnable=false: create it with "
                             f"mqadmin updateTopic -t {topic} -c {ctx.config.brokerClusterName}"))
        return tc

    def _info(self, ch: GrpcChannel) -> ClientChannelInfo:
        ua = ch.settings.user_agent if ch.settings is not None else pb.UA()
        lang, ordinal, lang_name, version = convert.channel_info_of(ua)
        return ClientChannelInfo(ch.client_id, lang, ordinal, ch.remote_addr, self.ctx.now_ms(),
                                 protocol="grpc", client_type=pb.ClientType.Name(ch.client_type),
                                 language_name=lang_name, version_text=version)

    def _register(self, ch: GrpcChannel) -> None:
        """Into the broker's registries: a producer under each topic it publishes (Java's
        proxy uses the topic as producer group), a consumer under its group with the
        subscriptions of its settings."""
        ctx = self.ctx
        info = ch.info = self._info(ch)
        if ch.client_type == pb.PRODUCER:
            for topic in ch.topics:
                ctx.producers.register(topic, ch, info)
        elif ch.group:
            now = ctx.now_ms()
            gcfg = ctx.groups.find(ch.group, now)
            if gcfg is None:
                return
            subs = []
            if ch.settings is not None and ch.settings.WhichOneof("pub_sub") == "subscription":
                for entry in ch.settings.subscription.subscriptions:
                    expr = entry.expression
                    try:
                        subs.append(bodies.build_subscription(
                            entry.topic.name, expr.expression or "*", "SQL92" if expr.type == pb.SQL else "TAG"))
                    except bodies.BodyError as e:
                        log.warning("gRPC client %s: subscription to %s refused: %s", ch.client_id,
                                    entry.topic.name, e)
            if gcfg.retryQueueNums > 0 and ctx.topics.get(retry_topic(ch.group)) is None:
                ctx.topics.create_retry_or_dlq(retry_topic(ch.group), gcfg.retryQueueNums,
                                               PermName.READ | PermName.WRITE, now)
                ctx.on_topics_changed()
            changed = ctx.consumers.register(ch.group, ch, info, "CONSUME_POP", "CLUSTERING",
                                             "CONSUME_FROM_LAST_OFFSET", subs, now)
            if changed and gcfg.notifyConsumerIdsChangedEnable:
                notify_consumer_ids_changed(ctx.consumers, ch.group)

    # -- routes, heartbeats, settings -------------------------------------------------------
    async def QueryRoute(self, request, context):
        try:
            tc = await self._topic(request.topic.name, create=True)
        except Refused as e:
            return spb.QueryRouteResponse(status=self._count("QueryRoute", e.status()))
        perm = tc.perm & self.ctx.config.brokerPermission
        if self.ctx.is_slave:
            perm &= ~PermName.WRITE
        queues = convert.route_queues(tc.topic_name, tc.read_queue_nums, tc.write_queue_nums, perm,
                                      self._broker())
        return spb.QueryRouteResponse(status=self._count("QueryRoute", status(OK)), message_queues=queues)

    async def Heartbeat(self, request, context):
        try:
            ch = self._channel(context)
        except Refused as e:
            return spb.HeartbeatResponse(status=self._count("Heartbeat", e.status()))
        if request.client_type:
            ch.client_type = request.client_type
        if request.HasField("group") and request.group.name:
            ch.group = request.group.name
        self._register(ch)
        return spb.HeartbeatResponse(status=self._count("Heartbeat", status(OK)))

    async def NotifyClientTermination(self, request, context):
        client_id = self._client_id(context)
        ch = self.clients.get(client_id) if client_id else None
        if ch is not None:
            ch.close()
        return spb.NotifyClientTerminationResponse(status=self._count("NotifyClientTermination", status(OK)))

    def _settings_reply(self, ch: GrpcChannel, settings: pb.Settings) -> pb.Settings:
        ctx = self.ctx
        if settings.WhichOneof("pub_sub") == "subscription":
            group = settings.subscription.group.name if settings.subscription.HasField("group") else ""
            gcfg = ctx.groups.find(group, ctx.now_ms()) if group else None
            retry_max = gcfg.retryMaxTimes if gcfg is not None else 16
            return convert.settings_reply(settings, max_body_size=ctx.config.maxMessageSize,
                                          fifo=gcfg is not None and gcfg.consumeMessageOrderly,
                                          max_attempts=retry_max + 1, backoff_ms=tuple(ctx.delay_levels))
        return convert.settings_reply(settings, max_body_size=ctx.config.maxMessageSize)

    def _take_settings(self, ch: GrpcChannel, settings: pb.Settings) -> spb.TelemetryCommand:
        ch.settings = settings
        if settings.HasField("client_type"):
            ch.client_type = settings.client_type
        kind = settings.WhichOneof("pub_sub")
        if kind == "publishing":
            ch.topics = tuple(dict.fromkeys(t.name for t in settings.publishing.topics if t.name))
        elif kind == "subscription" and settings.subscription.HasField("group"):
            ch.group = settings.subscription.group.name or None
        if kind == "subscription" and self.ctx.pop is not None:
            # a consumer whose stream broke and came back within 1 s keeps its auto-renewed
            # leases (a gone one's come back then: _release)
            self.ctx.pop.keep_owner(ch.client_id)
        self._register(ch)
        return spb.TelemetryCommand(status=status(OK), settings=self._settings_reply(ch, settings))

    async def Telemetry(self, request_iterator, context):
        try:
            ch = self._channel(context)
        except Refused as e:
            yield spb.TelemetryCommand(status=self._count("Telemetry", e.status()))
            return
        outbox = asyncio.Queue(TELEMETRY_OUTBOX)
        old, ch.outbox = ch.outbox, outbox     # a reconnecting client: the newest stream is the live one
        if old is not None:
            try:
                old.put_nowait(_CLOSE)
            except asyncio.QueueFull:
                pass

        async def read() -> None:
            async for command in request_iterator:
                if self.acl_guard is not None:
                    denied = self.acl_guard.deny("Telemetry", command, context)
                    if denied is not None:     # answered on the stream, which stays open (Java 5.3)
                        ch.push(spb.TelemetryCommand(status=self._count("Telemetry", denied)))
                        continue
                kind = command.WhichOneof("command")
                if kind == "settings":
                    reply = self._take_settings(ch, command.settings)
                    self._count("Telemetry", reply.status)
                    if not ch.push(reply) and ch.dropped_commands == 1:    # logged once per client
                        log.warning("gRPC client %s does not read its Telemetry stream: commands to it are dropped",
                                    ch.client_id)
                # thread_stack_trace / verify_message_result answer commands we never send

        reader = asyncio.ensure_future(read())
        try:
            while True:
                getter = asyncio.ensure_future(outbox.get())
                done, _ = await asyncio.wait((getter, reader), return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    if reader.exception() is not None and not isinstance(reader.exception(), asyncio.CancelledError):
                        log.info("Telemetry stream of %s ended: %s", ch.client_id, reader.exception())
                    return
                item = getter.result()
                if item is _CLOSE:     # closed, expired, or replaced by a newer stream
                    return
                yield item
        finally:
            reader.cancel()
            if ch.outbox is outbox:     # the live stream ended (not replaced by a newer one)
                ch.outbox = None
                self._release(ch)

    # -- sending ------------------------------------------------------------------------------
    async def _send_one(self, ch: GrpcChannel, m: pb.Message) -> spb.SendResultEntry:
        ctx = self.ctx
        cfg = ctx.config
        try:
            tc = await self._topic(m.topic.name, create=True)
            f = convert.message_to_send(m, max_body_size=cfg.maxMessageSize, queue_count=tc.write_queue_nums,
                                        max_delay_ms=cfg.timerMaxDelaySec * 1000,
                                        now_ms=ctx.now_ms())
        except Refused as e:
            return spb.SendResultEntry(status=e.status())
        header = SendMessageRequestHeader(f.producer_group, f.topic, AUTO_CREATE_TOPIC_KEY_TOPIC,
                                          cfg.defaultTopicQueueNums, f.queue_id, f.sys_flag, f.born_timestamp, 0,
                                          f.properties, 0, False, False, None)
        cmd = RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields=encode_send_header(header, v2=False),
                              body=f.body)
        resp = await self._call(ch, cmd)
        st = convert.from_remoting(resp.code, resp.remark)
        if st.code != OK:
            return spb.SendResultEntry(status=st)
        ext = resp.ext_fields or {}
        offset = int(ext.get("queueOffset") or 0)
        # as Java's proxy: the message id is the transaction id, of every send (the Node
        # client's own tests check it of a normal message too)
        transaction_id = f.message_id
        if f.transactional:
            _host, _port, commit_log_offset = msgcodec.decode_offset_msg_id(ext["msgId"])
            self._remember_transaction(f.producer_group, transaction_id, commit_log_offset, offset)
        return spb.SendResultEntry(status=st, message_id=f.message_id, transaction_id=transaction_id, offset=offset)

    async def _call(self, ch, cmd: RemotingCommand) -> RemotingCommand:
        handler = self.processors.get(int(cmd.code))
        try:
            resp = handler(ch, cmd)
            if resp is not None and not isinstance(resp, RemotingCommand):
                resp = await resp
        except (ValueError, KeyError) as e:     # HeaderError / BodyError: a bad name or field
            return cmd.response(ResponseCode.MESSAGE_ILLEGAL, str(e))
        if resp is None:
            return cmd.response(ResponseCode.SUCCESS)
        return resp

    async def SendMessage(self, request, context):
        try:
            ch = self._channel(context)
        except Refused as e:
            return spb.SendMessageResponse(status=self._count("SendMessage", e.status()))
        msgs = request.messages
        if not msgs:
            return spb.SendMessageResponse(status=self._count("SendMessage", status(
                Code.BAD_REQUEST, "SendMessage carries no message")))
        if len(msgs) > MAX_MESSAGES_PER_SEND:
            return spb.SendMessageResponse(status=self._count("SendMessage", status(
                Code.PAYLOAD_TOO_LARGE, f"{len(msgs)} messages in one send; at most {MAX_MESSAGES_PER_SEND}")))
        if len({m.topic.name for m in msgs}) > 1:
            return spb.SendMessageResponse(status=self._count("SendMessage", status(
                Code.BAD_REQUEST, "the messages of one SendMessage must share their topic")))
        entries = [await self._send_one(ch, m) for m in msgs]
        first_error = next((e.status for e in entries if e.status.code != OK), None)
        top = status(OK) if first_error is None else first_error
        return spb.SendMessageResponse(status=self._count("SendMessage", top), entries=entries)

    # -- transactions ---------------------------------------------------------------------------
    def _remember_transaction(self, group: str, transaction_id: str, commit_log_offset: int,
                              queue_offset: int) -> None:
        table = self.pending_transactions
        table[(group, transaction_id)] = (commit_log_offset, queue_offset)
        table.move_to_end((group, transaction_id))
        while len(table) > MAX_PENDING_TRANSACTIONS:
            table.popitem(last=False)

    def check_transaction(self, ch: GrpcChannel, cmd: RemotingCommand) -> None:
        """The check-back service asks this producer about a half message: remember where the
        re-stored half record is (EndTransaction quotes only the ids) and write a
        recover_orphaned_transaction_command on the client's Telemetry stream."""
        h = decode_check_transaction_state_header(cmd.ext_fields)
        try:
            rec = msgcodec.decode_record(cmd.body)
        except ValueError as e:
            log.warning("check-back for %s: the half record does not decode: %s", ch.client_id, e)
            return
        transaction_id = h.transaction_id or rec.properties.get(msgcodec.UNIQ_KEY) or rec.msg_id
        group = rec.properties.get(msgcodec.PGROUP) or rec.topic
        self._remember_transaction(group, transaction_id, h.commit_log_offset, h.tran_state_table_offset)
        command = spb.TelemetryCommand(status=status(OK))
        command.recover_orphaned_transaction_command.message.CopyFrom(convert.record_to_message(rec))
        command.recover_orphaned_transaction_command.transaction_id = transaction_id
        if not ch.push(command):
            log.log(logging.WARNING if ch.dropped_commands <= 1 else logging.DEBUG,
                    "transaction check of %s not delivered to gRPC client %s (no Telemetry stream, or it "
                    "does not read); the check service asks again", transaction_id, ch.client_id)

    def _find_half(self, topic: str, msg_id: str) -> tuple[int, int] | None:
        """(commit log offset, queue offset) of the newest half record of `topic` whose
        message id is `msg_id`, from the message index (None without one, or when none is
        there). The newest: a half record the check service re-stored carries the same id,
        and END_TRANSACTION resolves a re-stored one to its origin (broker/core/transaction.py)."""
        store = self.ctx.store
        if not msg_id or not self.ctx.config.messageIndexEnable:
            return None
        res = store.query_message(TRANS_HALF_TOPIC, msg_id, 32, 0, 2**63 - 1)
        for offset in res.offsets:                     # newest first
            raw = store.look_message_by_offset(offset)
            if raw is None:
                continue
            try:
                rec = msgcodec.decode_record(raw, decompress=False)
            except ValueError:
                continue
            props = rec.properties
            if props.get(msgcodec.UNIQ_KEY) == msg_id and props.get(msgcodec.REAL_TOPIC) == topic:
                return offset, rec.queue_offset
        return None

    async def EndTransaction(self, request, context):
        topic, transaction_id = request.topic.name, request.transaction_id
        if request.resolution not in (pb.COMMIT, pb.ROLLBACK):
            return spb.EndTransactionResponse(status=self._count("EndTransaction", status(
                Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")))
        where = self.pending_transactions.get((topic, transaction_id))
        if where is None:
            # not sent through this process (a restart since, or another endpoint): the half
            # record is found by its message id in the index, as QUERY_MESSAGE finds it
            where = self._find_half(topic, request.message_id or transaction_id)
        if where is None:
            return spb.EndTransactionResponse(status=self._count("EndTransaction", status(
                Code.INVALID_TRANSACTION_ID,
                f"no half message of transaction {transaction_id!r} on topic {topic} is waiting here (already "
                f"ended, never sent here, or not indexed: the broker's check-back will ask)")))
        commit_log_offset, queue_offset = where
        ext = {"producerGroup": topic, "tranStateTableOffset": str(queue_offset),
               "commitLogOffset": str(commit_log_offset),
               "commitOrRollback": str(tx.COMMIT if request.resolution == pb.COMMIT else tx.ROLLBACK),
               "fromTransactionCheck": "true" if request.source == pb.SOURCE_SERVER_CHECK else "false",
               "msgId": request.message_id or transaction_id, "transactionId": transaction_id}
        ch = self.clients.get(self._client_id(context) or "") or GrpcChannel("", _peer_addr(context.peer()), self)
        resp = await self._call(ch, RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=ext))
        st = convert.from_remoting(resp.code, resp.remark)
        if st.code == OK:
            self.pending_transactions.pop((topic, transaction_id), None)
        return spb.EndTransactionResponse(status=self._count("EndTransaction", st))

    # -- assignment -------------------------------------------------------------------------------
    async def QueryAssignment(self, request, context):
        ctx = self.ctx
        try:
            tc = await self._topic(request.topic.name, create=False)
        except Refused as e:
            return spb.QueryAssignmentResponse(status=self._count("QueryAssignment", e.status()))
        group = request.group.name
        gcfg = ctx.groups.find(group, ctx.now_ms()) if group else None
        if gcfg is None:
            return spb.QueryAssignmentResponse(status=self._count("QueryAssignment", status(
                Code.CONSUMER_GROUP_NOT_FOUND, f"consumer group {group!r} does not exist on broker "
                f"{ctx.config.brokerName} (autoCreateSubscriptionGroup=false)")))
        perm = tc.perm & ctx.config.brokerPermission
        queues = convert.assignment_queues(tc.topic_name, tc.read_queue_nums, perm, self._broker(),
                                           fifo=gcfg.consumeMessageOrderly)
        return spb.QueryAssignmentResponse(status=self._count("QueryAssignment", status(OK)),
                                           assignments=[pb.Assignment(message_queue=q) for q in queues])

    # -- POP consumption ----------------------------------------------------------------------------
    def _pop_target(self, context, group: str, topic: str) -> GrpcChannel:
        """The calling client, once the group and topic are names a consumer may use; the
        POP engine present (a broker started without it refuses). Raises Refused."""
        ch = self._channel(context)
        bad = validate_topic(topic)
        if bad:
            raise Refused(Code.ILLEGAL_TOPIC, bad)
        if self.ctx.topics.is_system_topic(topic):
            raise Refused(Code.ILLEGAL_TOPIC, f"cannot access system topic {topic}")
        bad = name_error(NAME_GROUP, "consumer group", group)
        if bad:
            raise Refused(Code.ILLEGAL_CONSUMER_GROUP, bad)
        if group.startswith(SYSTEM_GROUP_PREFIX):
            raise Refused(Code.ILLEGAL_CONSUMER_GROUP, f"cannot use system consumer group {group}")
        if self.ctx.pop is None:
            raise Refused(Code.NOT_IMPLEMENTED, "POP consumption is not available on this broker")
        return ch

    def _receive_args(self, ch: GrpcChannel, request, context) -> tuple[int, int, int]:
        """(long poll ms, lease ms, batch) of a ReceiveMessage, by Java's proxy's rules."""
        remaining = context.time_remaining()
        settings = ch.settings
        request_timeout_ms = settings.request_timeout.ToMilliseconds() if settings is not None else 0
        version = settings.user_agent.version if settings is not None else ""
        poll = convert.polling_ms(
            request.long_polling_timeout.ToMilliseconds() if request.HasField("long_polling_timeout") else None,
            None if remaining is None else int(remaining * 1000), request_timeout_ms, version)
        invisible = convert.receive_invisible_ms(
            request.invisible_duration.ToMilliseconds() if request.HasField("invisible_duration") else None,
            request.auto_renew, GRPC_MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        return poll, invisible, convert.receive_batch(request.batch_size)

    async def _write(self, context, frame: spb.ReceiveMessageResponse) -> None:
        # a client that does not read its stream stalls only this call, and only so long
        await asyncio.wait_for(context.write(frame), RECEIVE_WRITE_TIMEOUT_S)

    async def ReceiveMessage(self, request, context):
        """POP: the group's next messages of the topic from any of its queues (the queue
        the client names is not used: Java's proxy pops with queue -1 too), streamed as
        status, one frame per message, the delivery timestamp."""
        group, topic = request.group.name, request.message_queue.topic.name
        try:
            ch = self._pop_target(context, group, topic)
            poll, invisible, batch = self._receive_args(ch, request, context)
        except Refused as e:
            await context.write(spb.ReceiveMessageResponse(status=self._count("ReceiveMessage", e.status())))
            return
        fe = request.filter_expression
        attempt_id = request.attempt_id if request.HasField("attempt_id") and request.attempt_id else None
        try:
            r = await self.ctx.pop.pop(group, topic, -1, batch, invisible, attempt_id=attempt_id,
                                       expression=fe.expression or "*",
                                       expression_type="SQL92" if fe.type == pb.SQL else "TAG", poll_ms=poll,
                                       auto_renew=request.auto_renew, owner=ch.client_id)
        except PopError as e:
            await context.write(spb.ReceiveMessageResponse(status=self._count("ReceiveMessage",
                                                                               convert.from_pop_error(e))))
            return
        if not r.messages:
            await context.write(spb.ReceiveMessageResponse(status=self._count("ReceiveMessage", status(
                Code.MESSAGE_NOT_FOUND, "no new message"))))
            await context.write(_delivery_frame(self.ctx.now_ms()))
            return
        self._count("ReceiveMessage", status(OK))
        frames = [spb.ReceiveMessageResponse(message=convert.record_to_message(
            p.message, delivery_attempt=p.delivery_attempt, receipt_handle=p.receipt_handle,
            invisible_ms=r.invisible_ms)) for p in r.messages]
        sent = 0
        try:
            await self._write(context, spb.ReceiveMessageResponse(status=status(OK)))
            for frame in frames:
                await self._write(context, frame)
                sent += 1
            await self._write(context, _delivery_frame(self.ctx.now_ms()))
        except BaseException as e:
            # the client went away (cancelled, the transport failed) or does not read (the
            # write timed out): what it did not get is visible again soon (Java's proxy:
            # NACK_INVISIBLE_TIME), not at the end of a lease the broker would renew
            if sent < len(r.messages):
                log.info("ReceiveMessage of %s: %d of %d messages not delivered (%s), visible again in %d ms",
                         ch.client_id, len(r.messages) - sent, len(r.messages), type(e).__name__, NACK_INVISIBLE_MS)
                self._nack_later(group, topic, [p.receipt_handle for p in r.messages[sent:]])
            if not isinstance(e, Exception):
                raise       # cancelled: grpc ends the call
            # a write that failed or timed out: the call is over for this client

    def _nack_later(self, group: str, topic: str, handles: list[str]) -> None:
        async def nack() -> None:
            for handle in handles:
                try:
                    await self.ctx.pop.change_invisible(group, topic, handle, NACK_INVISIBLE_MS)
                except PopError as e:      # acked or changed meanwhile: nothing to give back
                    log.debug("nack of an undelivered message skipped: %s", e)
        task = asyncio.get_running_loop().create_task(nack())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _ack_one(self, group: str, topic: str, entry: spb.AckMessageEntry) -> spb.AckMessageResultEntry:
        try:
            await self.ctx.pop.ack(group, topic, entry.receipt_handle)
            st = status(OK)
        except PopError as e:
            st = convert.from_pop_error(e)
        return spb.AckMessageResultEntry(message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st)

    async def AckMessage(self, request, context):
        group, topic = request.group.name, request.topic.name
        try:
            self._pop_target(context, group, topic)
            if len(request.entries) > MAX_ACK_ENTRIES:
                raise Refused(Code.PAYLOAD_TOO_LARGE,
                              f"{len(request.entries)} entries in one AckMessage; at most {MAX_ACK_ENTRIES}")
        except Refused as e:
            return spb.AckMessageResponse(status=self._count("AckMessage", e.status()))
        # concurrently: each ack's record is written at once, then their flush waits overlap
        entries = await asyncio.gather(*(self._ack_one(group, topic, e) for e in request.entries))
        top = convert.ack_status([e.status.code for e in entries])
        return spb.AckMessageResponse(status=self._count("AckMessage", top), entries=entries)

    async def ChangeInvisibleDuration(self, request, context):
        """A new lease of the message, visible again after invisible_duration (0 .. 12 h:
        the PushConsumer's retry backoff starts at 1 s); the answer carries the new
        receipt handle, the old one is stale. Auto-renewal of the message ends."""
        group, topic = request.group.name, request.topic.name
        ms = request.invisible_duration.ToMilliseconds()
        if ms == 0:
            ms = 1      # Java takes 0 (visible at once); the engine's shortest lease is 1 ms
        try:
            self._pop_target(context, group, topic)
            err = invisible_error(ms)
            if err:
                raise Refused(Code.ILLEGAL_INVISIBLE_TIME, err)
            handle, _lease = await self.ctx.pop.change_invisible(group, topic, request.receipt_handle, ms)
        except Refused as e:
            return spb.ChangeInvisibleDurationResponse(status=self._count("ChangeInvisibleDuration", e.status()))
        except PopError as e:
            return spb.ChangeInvisibleDurationResponse(status=self._count("ChangeInvisibleDuration",
                                                                          convert.from_pop_error(e)))
        return spb.ChangeInvisibleDurationResponse(status=self._count("ChangeInvisibleDuration", status(OK)),
                                                   receipt_handle=handle)

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        """A FIFO PushConsumer out of local retries: the message goes to %DLQ%<group> now."""
        group, topic = request.group.name, request.topic.name
        try:
            self._pop_target(context, group, topic)
            await self.ctx.pop.forward_to_dlq(group, topic, request.receipt_handle)
            st = status(OK)
        except Refused as e:
            st = e.status()
        except PopError as e:
            st = convert.from_pop_error(e)
        return spb.ForwardMessageToDeadLetterQueueResponse(status=self._count("ForwardMessageToDeadLetterQueue", st))

    # -- not served ---------------------------------------------------------------------------------
    async def PullMessage(self, request, context):
        yield spb.PullMessageResponse(status=self._count("PullMessage", status(
            Code.NOT_IMPLEMENTED, "PullMessage is not served (no official client calls it); "
            "use ReceiveMessage or the 4.x pull protocol")))

    def _offset_rpc(self, name: str):
        return status(Code.NOT_IMPLEMENTED, f"{name} is not served (no official client calls it); "
                      f"consumer offsets are served over the 4.x remoting protocol")

    async def UpdateOffset(self, request, context):
        return spb.UpdateOffsetResponse(status=self._count("UpdateOffset", self._offset_rpc("UpdateOffset")))

    async def GetOffset(self, request, context):
        return spb.GetOffsetResponse(status=self._count("GetOffset", self._offset_rpc("GetOffset")))

    async def QueryOffset(self, request, context):
        return spb.QueryOffsetResponse(status=self._count("QueryOffset", self._offset_rpc("QueryOffset")))

    async def RecallMessage(self, request, context):
        return spb.RecallMessageResponse(status=self._count("RecallMessage", status(
            Code.UNSUPPORTED, "RecallMessage is not supported by pocketmq (timer messages cannot be recalled)")))

    async def SyncLiteSubscription(self, request, context):
        return spb.SyncLiteSubscriptionResponse(status=self._count("SyncLiteSubscription", status(
            Code.UNSUPPORTED, "lite topics (SyncLiteSubscription, LitePushConsumer, LiteSimpleConsumer) are not "
            "supported by pocketmq")))
