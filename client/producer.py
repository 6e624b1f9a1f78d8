"""Producer (asyncio): send, send_oneway, send_batch, explicit queue, orderly sends.

    async with Producer("PG", "127.0.0.1:9876") as p:
        r = await p.send(Message("T", b"hello", tags="TagA", keys="order-1"))

Sends go out as SEND_MESSAGE_V2 (310) / SEND_BATCH_MESSAGE (320) like the Java
client. A normal send tries up to 1 + retry_times_when_send_failed queues,
preferring brokers the latency table says are healthy and another broker than
the one that just failed; sends to a chosen queue (explicit, selector or
sharding key) are tried once, since moving them would break ordering.
Bodies of 4 KiB or more are zlib-compressed (not in batches). A body over
max_message_size_bytes is refused before anything is sent.

Failover (client/failover.py): a send that fails with a failover signal (connection
refused, reset or timed out; SERVICE_NOT_AVAILABLE; SYSTEM_ERROR "in-sync replicas not
enough"), or is stored with SLAVE_NOT_AVAILABLE, makes the instance refresh at once the
routes through that broker group. Until that refresh ends, a send (the retry of the
failed one, or the next) that would go to the same group while the member table still
names the failed address as its master waits for it (within the send's timeout), so it
goes to the new master once the nameserver shows one; sends to other groups go at once.

Send coalescing (``coalesce_sends``, on by default): a ``send()`` made while another
send of this producer is waiting for its response does not get a request of its own.
It joins the topic's open group, and the group leaves as one SEND_BATCH_MESSAGE when
the event loop finishes its current iteration or the group is full
(``coalesce_max_messages``, or max_message_size_bytes of stored messages). Each send still
gets its own SendResult: the broker stores a batch in one queue at consecutive queue
offsets and answers with the comma-joined offsetMsgIds (RocketMQ 4.x batch semantics),
so message i of the group has queue_offset first + i and the i-th offsetMsgId. A send
with nothing else in flight (one send at a time) goes out at once as SEND_MESSAGE_V2,
so coalescing never delays a lone send; only sends the broker would accept in a batch
join (no explicit queue, selector or sharding key, no delay level, not compressed, not
to a %RETRY% topic). A group fails or is retried as a whole, like one send, except
that a batch refused as such (MESSAGE_ILLEGAL, REQUEST_CODE_NOT_SUPPORTED) is re-sent
one message per request.
Why: with many sends in flight both the client and the broker spend most of their
time on per-request work (frame, header, response, future); see docs/client.md.
"""
from __future__ import annotations

import asyncio
import os
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from pocketmq.common.constants import RETRY_GROUP_TOPIC_PREFIX, TOPIC_MAX_LENGTH, VALID_NAME_RE
from pocketmq.client.query import QueryMixin
from pocketmq.client.credentials import as_credentials
from pocketmq.client.errors import (
    ClientStateError,
    InvalidArgumentError,
    MessageIllegalError,
    MessageTooLargeError,
    MQClientError,
    NoRouteError,
    RemotingFailure,
    RequestCodeNotSupportedError,
)
from pocketmq.client.failover import is_failover_signal
from pocketmq.client.fault import LatencyFaultTolerance
from pocketmq.client.instance import (
    DEFAULT_TOPIC,
    DEFAULT_TOPIC_QUEUE_NUMS,
    acquire_instance,
    mono_ms,
)
from pocketmq.client.message import Message, SendResult, SendStatus, UniqIdGenerator, send_results
from pocketmq.protocol import message as msgcodec
from pocketmq.protocol.bodies import MessageQueue
from pocketmq.protocol.codes import ResponseCode
from pocketmq.remoting.tls import resolve_client_tls

log = logging.getLogger("pocketmq.client.producer")

TOPIC_LENGTH_MAX = TOPIC_MAX_LENGTH
GROUP_LENGTH_MAX = 255
MAX_MESSAGE_SIZE_BYTES = 4 * 1024 * 1024
COMPRESS_OVER_BYTES = 4096
# A coalesced group leaves when it holds this many sends: several groups in flight keep
# the broker busy with one while the client builds the next (bench/bench_client.py).
# 32, not 16: with spare cores the two are alike; with client and broker sharing one
# core, where nothing overlaps and every request's fixed work is paid on the same CPU, 32
# carries 64 in flight ~7-14% faster (more with SYNC_FLUSH). 64 is one group per round
# trip with 64 in flight: client and broker take turns with spare cores. Figures:
# docs/benchmarks.md, "Groups of 32 coalesced sends; a spin that lost the CPU".
COALESCE_MAX_MESSAGES = 32

SEND_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}

_uniq = UniqIdGenerator()
if hasattr(os, "register_at_fork"):
    # a child forked after this import must not share the parent's id prefix and counter
    os.register_at_fork(after_in_child=_uniq.reseed)
# send_batch's fast path: what must be equal across a batch's messages to share one template
_UNIQ_KEY_LENGTH = len(_uniq.next_id())
_WAIT_TRUE = "WAIT\x01true"         # a batch's own properties
_WAIT_FALSE = "WAIT\x01false"
# a plain Message's properties up to its UNIQ_KEY's value (Message.wire_properties_text(""))
_PLAIN_PREFIX_TRUE = b"WAIT\x01true\x02UNIQ_KEY\x01"
_PLAIN_PREFIX_FALSE = b"WAIT\x01false\x02UNIQ_KEY\x01"


def _body_bytes(body, i: int) -> bytes:
    """Body `i` of a send_batch of bodies as bytes (a str as UTF-8, as Message does)."""
    if type(body) is bytes:
        return body
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise InvalidArgumentError(f"body {i} of the batch is a {type(body).__name__}: expected bytes or str"
                               + (" (a batch of Messages takes no topic=)" if isinstance(body, Message) else ""))


def check_topic(topic: str) -> None:
    if not topic or not topic.strip():
        raise InvalidArgumentError("The specified topic is blank.")
    if len(topic) > TOPIC_LENGTH_MAX:
        raise InvalidArgumentError(f"The specified topic is longer than topic max length {TOPIC_LENGTH_MAX}.")
    if not VALID_NAME_RE.fullmatch(topic):
        raise InvalidArgumentError(f"The specified topic[{topic}] contains illegal characters, "
                                   "allowing only ^[%|a-zA-Z0-9_-]+$")


def check_group(group: str) -> None:
    if not group or not group.strip():
        raise InvalidArgumentError("the specified group is blank")
    if len(group) > GROUP_LENGTH_MAX:
        raise InvalidArgumentError(f"the specified group is longer than group max length {GROUP_LENGTH_MAX}.")
    if not VALID_NAME_RE.fullmatch(group):
        raise InvalidArgumentError(f"the specified group[{group}] contains illegal characters, "
                                   "allowing only ^[%|a-zA-Z0-9_-]+$")


def hash_selector(queues: Sequence[MessageQueue], key) -> MessageQueue:
    """Java SelectMessageQueueByHash: abs(key.hashCode() % n), String.hashCode for str keys."""
    h = msgcodec.java_string_hash(key) if isinstance(key, str) else hash(key)
    # Java's % truncates toward zero
    r = abs(h) % len(queues)
    return queues[r]


_DEFAULT_TOPIC_QUEUE_NUMS_S = str(DEFAULT_TOPIC_QUEUE_NUMS)


def send_ext_fields(group: str, topic: str, queue_id: int, sys_flag: int, flag: int, properties: str,
                    batch: bool, born_timestamp_ms: int) -> dict:
    """The SEND_MESSAGE_V2 extFields of a producer send, built directly: equal (same keys,
    values and order) to encode_send_header(SendMessageRequestHeader(group, topic, TBW102,
    4, queue_id, sys_flag, born, flag, properties, 0, False, batch, None), v2=True)."""
    return {"a": group, "b": topic, "c": DEFAULT_TOPIC, "d": _DEFAULT_TOPIC_QUEUE_NUMS_S,
            "e": str(queue_id), "f": str(sys_flag), "g": str(born_timestamp_ms), "h": str(flag),
            "j": "0", "k": "false", "m": "true" if batch else "false", "i": properties}


def split_batch(msgs: Sequence[Message], props: list, size_limit: int) -> list[list[int]]:
    """Indices of `msgs` grouped into sub-batches whose batch-body size stays within
    `size_limit` (element size = 22 + body + properties + topic + 20 of log overhead,
    like the Java documentation's ListSplitter). `props[i]`: the wire properties of
    message i, as a dict or already encoded bytes."""
    groups: list[list[int]] = []
    cur: list[int] = []
    cur_size = 0
    for i, m in enumerate(msgs):
        pb = props[i]
        if type(pb) is not bytes:
            pb = msgcodec.encode_properties(pb).encode()
        size = msgcodec.BATCH_ELEMENT_OVERHEAD + len(m.body) + len(m.topic) + 20 + len(pb)
        if size > size_limit:
            raise MessageTooLargeError(f"message {i} of the batch is {size} bytes, over {size_limit}")
        if cur and cur_size + size > size_limit:
            groups.append(cur)
            cur, cur_size = [], 0
        cur.append(i)
        cur_size += size
    if cur:
        groups.append(cur)
    return groups


# What one element of a coalesced group counts against max_message_size_bytes: its stored
# record (91 bytes of fixed fields with IPv4 hosts, 24 more with IPv6; topic, body and
# properties, to which the broker appends the batch's own properties: 128 allowed). A
# Java 4.9 broker refuses a batch whose stored total exceeds its maxMessageSize (a
# SYSTEM_ERROR for the whole group); the batch body (22 + body + properties per element,
# which our broker bounds) is always smaller.
_STORED_ELEMENT_OVERHEAD = 91 + 24 + 128


class _SendGroup:
    """Coalesced sends waiting to leave together: (flag, body, properties bytes up to the
    UNIQ_KEY's value, future of the SendResult) per send (the ids are given when the group
    leaves), and the bytes they count against max_message_size_bytes
    (_STORED_ELEMENT_OVERHEAD). `loop` is the running loop the group lives in (one
    iteration of it): asked once per group, not once per send (asyncio.get_running_loop()
    is a getpid() system call on Python 3.11, ~0.3 µs)."""
    __slots__ = ("items", "size", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.items: list = []
        self.size = 0
        self.loop = loop


def split_batch_result(r: SendResult, uniqs: Sequence[str]) -> list[SendResult]:
    """One SendResult per message of a batch send, from the batch's: the broker stored the
    batch at consecutive offsets of one queue and answered with the comma-joined
    offsetMsgIds (a broker that answers otherwise leaves offset_msg_id empty)."""
    n = len(uniqs)
    ids = r.offset_msg_id.split(",") if r.offset_msg_id else []
    if len(ids) != n:
        ids = [""] * n
    first = r.queue_offset
    return send_results(r.status, uniqs, ids, r.queue, range(first, first + n) if first >= 0 else [-1] * n,
                        r.transaction_id, r.region_id, r.trace_on)


class Producer(QueryMixin):
    def __init__(self, group: str, namesrv_addr: str, *, instance_name: str | None = None,
                 send_timeout_ms: int = 3000, retry_times_when_send_failed: int = 2,
                 max_message_size_bytes: int = MAX_MESSAGE_SIZE_BYTES,
                 compress_over_bytes: int = COMPRESS_OVER_BYTES, compress_level: int = 5,
                 latency_fault_enable: bool = True, serialize_type: int | None = None,
                 coalesce_sends: bool = True, coalesce_max_messages: int = COALESCE_MAX_MESSAGES,
                 credentials=None, tls=None):
        check_group(group)
        if not 0 <= retry_times_when_send_failed <= 16:
            raise InvalidArgumentError("retry_times_when_send_failed must be in [0, 16]")
        if not 0 < max_message_size_bytes <= MAX_MESSAGE_SIZE_BYTES:
            raise InvalidArgumentError(f"max_message_size_bytes must be in (0, {MAX_MESSAGE_SIZE_BYTES}]")
        if not 1 <= coalesce_max_messages <= 1024:
            raise InvalidArgumentError("coalesce_max_messages must be in [1, 1024]")
        self.group = group
        self.namesrv_addr = namesrv_addr
        self.instance_name = instance_name
        self.send_timeout_ms = send_timeout_ms
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.max_message_size_bytes = max_message_size_bytes
        self.compress_over_bytes = compress_over_bytes
        self.compress_level = compress_level
        self.serialize_type = serialize_type
        # ACL account (client/credentials.py) and TLS (remoting/tls.py) of every request
        self.credentials = as_credentials(credentials)
        self.tls = tls
        resolve_client_tls(tls)
        self.fault = LatencyFaultTolerance(enabled=latency_fault_enable)
        self.instance = None
        self._topics_checked: set[str] = set()    # topics that passed check_topic
        self._closed = False
        self.coalesce_sends = coalesce_sends
        self.coalesce_max_messages = coalesce_max_messages
        self._sends_in_flight = 0          # send requests of this producer awaiting a response
        # (topic, wait_store_msg_ok, timeout_s) -> the open group of coalesced sends
        self._groups: dict[tuple, _SendGroup] = {}
        self._groups_flush_scheduled = False
        self._group_tasks: set[asyncio.Task] = set()
        # route_refreshes_on_failure: topic route refreshes made at once for this producer's
        # failed sends (the instance merges and rate-limits them: client/failover.py)
        self.stats = {"route_refreshes_on_failure": 0}
        # broker name -> (the address that failed with a failover signal, the future of the
        # route refresh that asked for): one entry per group at most, dropped once done
        self._failed_over: dict[str, tuple] = {}

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> Producer:
        if self.instance is not None:
            return self
        if self._closed:
            raise ClientStateError("producer closed")
        inst = await acquire_instance(self.namesrv_addr, self.instance_name,
                                      serialize_type=self.serialize_type, credentials=self.credentials,
                                      tls=self.tls)
        try:
            inst.register_producer(self.group, self)
        except BaseException:
            await inst.release()
            raise
        self.instance = inst
        return self

    async def close(self) -> None:
        """Stop taking sends, wait (up to the send timeout) for the sends in flight,
        coalesced or not, then unregister and release the client instance."""
        if self._closed:
            return
        self._closed = True
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.send_timeout_ms / 1000 + 1
            while self._groups or self._group_tasks or self._sends_in_flight:
                self._launch_groups()
                if loop.time() >= deadline:
                    log.warning("%s: closing with %d sends still in flight", self.group, self._sends_in_flight)
                    break
                await asyncio.sleep(0.005)
        finally:
            # also when the wait above is cancelled: a closed producer never keeps its instance
            inst, self.instance = self.instance, None
            if inst is not None:
                inst.unregister_producer(self.group)
                try:
                    await asyncio.wait_for(inst.unregister_client(producer_group=self.group), 5)
                except (TimeoutError, MQClientError):
                    pass
                finally:
                    await inst.release()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def masters_back(self, broker_names) -> None:
        """ClientInstance: the route shows these groups with a master again, or with a new
        one (a failover). The latency faults recorded for them were the old master's: sends
        may pick the groups again at once instead of avoiding them for up to 10 minutes."""
        for name in broker_names:
            self.fault.remove(name)

    def _inst(self):
        if self.instance is None or self._closed:
            raise ClientStateError("producer not started" if not self._closed else "producer closed")
        return self.instance

    # -- checks ---------------------------------------------------------------------------
    def _check_message(self, msg: Message) -> None:
        if type(msg) is not Message and not isinstance(msg, Message):
            raise InvalidArgumentError(f"expected Message, got {type(msg).__name__}")
        topic = msg.topic
        if type(topic) is not str or topic not in self._topics_checked:
            check_topic(topic)
            if len(self._topics_checked) >= 1024:
                self._topics_checked.clear()
            self._topics_checked.add(topic)
        if not msg.body:
            raise InvalidArgumentError("the message body length is zero")
        if len(msg.body) > self.max_message_size_bytes:
            raise MessageTooLargeError(f"the message body size over max value, MAX: {self.max_message_size_bytes}")
        if msg.delay_level < 0:
            raise InvalidArgumentError("delay_level must be >= 0")
        if msg.deliver_at_ms is not None:
            if type(msg.deliver_at_ms) is not int or msg.deliver_at_ms < 0:
                raise InvalidArgumentError(f"deliver_at_ms must be an int >= 0 (ms since the epoch), "
                                           f"got {msg.deliver_at_ms!r}")
            if msg.delay_level:
                raise InvalidArgumentError("a message has either a delay_level or a deliver_at_ms, not both")
        if msg.properties:
            for k in msg.properties:
                if k in ("TAGS", "KEYS", "DELAY", "WAIT", "UNIQ_KEY", "TIMER_DELIVER_MS"):
                    raise InvalidArgumentError(f"property {k} is set by the client; use the Message field")

    # -- send -----------------------------------------------------------------------------
    async def send(self, msg: Message, *, queue: MessageQueue | None = None,
                   selector: Callable[[Sequence[MessageQueue], object], MessageQueue] | None = None,
                   arg=None, sharding_key: str | None = None, timeout_ms: int | None = None) -> SendResult:
        """Send and wait for the broker's SendResult.

        `queue` sends to that queue; `selector(queues, arg)` or `sharding_key`
        (Java's hash selector) pick a queue for orderly sends; otherwise the
        producer picks and retries on another broker.
        """
        if (queue is None and selector is None and sharding_key is None and self._sends_in_flight
                and type(msg) is Message):
            # the common send, joining a group (see _join_plain); any other goes below
            fut = self._join_plain(msg, timeout_ms)
            if fut is not None:
                return await fut
        self._check_message(msg)
        inst = self._inst()
        timeout_s = (timeout_ms or self.send_timeout_ms) / 1000
        body, sys_flag = msg.body, 0
        if len(body) >= self.compress_over_bytes:
            body, sys_flag = msgcodec.maybe_compress(body, self.compress_over_bytes, self.compress_level)
        if (queue is None and selector is None and sharding_key is None and self._sends_in_flight
                and self.coalesce_sends and not sys_flag and not msg.delay_level):
            # its properties without the UNIQ_KEY's value: the group gives its sends their
            # ids in one run when it leaves (_send_group)
            prefix = msg.wire_properties_text("")
            if "TIMER_DEL" not in prefix:       # the broker parks timers sent alone only
                fut = self._coalesce(msg, prefix, body, timeout_s)
                if fut is not None:
                    return await fut
        uniq = _uniq.next_id()
        props = msg.wire_properties_text(uniq)
        if queue is None and (selector is not None or sharding_key is not None):
            info = await inst.publish_info(msg.topic)
            if sharding_key is not None:
                queue = hash_selector(info.queues, sharding_key)
            else:
                queue = selector(list(info.queues), arg)
            if not isinstance(queue, MessageQueue):
                raise InvalidArgumentError("selector must return a MessageQueue")
        self._sends_in_flight += 1
        try:
            return await self._send_with_retry(inst, msg.topic, props, body, sys_flag, msg.flag, uniq,
                                               queue, batch=False, timeout_s=timeout_s)
        finally:
            self._sends_in_flight -= 1

    # -- send coalescing (see the module docstring) -----------------------------------------
    def _coalesce(self, msg: Message, prefix: str, body: bytes, timeout_s: float):
        """Put a send into its topic's open group; returns the future of its SendResult, or
        None when the message cannot travel in a batch (it is then sent on its own).
        `prefix`: its wire properties text up to the UNIQ_KEY's value (wire_properties_text
        puts UNIQ_KEY last: msg.wire_properties_text(""))."""
        topic = msg.topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return None
        pb = prefix.encode()
        # The broker's size bound covers the whole group: an element that would not fit
        # one on its own, or properties a batch element cannot carry, go alone.
        pl = len(pb) + _UNIQ_KEY_LENGTH
        size = _STORED_ELEMENT_OVERHEAD + len(topic) + len(body) + pl
        limit = self.max_message_size_bytes
        if pl > msgcodec.PROPERTIES_LENGTH_BYTES_MAX or size > limit:
            return None
        return self._join((topic, msg.wait_store_msg_ok, timeout_s), (msg.flag, body, pb), size)

    def _join_plain(self, msg: Message, timeout_ms: int | None):
        """_check_message + _coalesce for the send most programs make, a Message with a body
        and none of properties, tags, keys, delay_level, deliver_at_ms, to a topic already
        checked: the same group and element as the general path gives it, from fewer steps
        (the whole of its synchronous part cost ~1.35 µs a send, ~a quarter of the client's
        work with 64 sends in flight: docs/benchmarks.md, "The common send's way into its
        group"). None for anything else, or anything the general path must decide (an
        error, compression, a send that goes alone): it then runs whole, so every check and
        error stays the general path's. Pinned to it by tests/unit/test_producer_message_paths.py."""
        # (nothing compared before its type is known: a value the general path refuses,
        # e.g. delay_level=None, must reach it)
        if (msg.properties or msg.tags or msg.keys or type(msg.delay_level) is not int or msg.delay_level
                or msg.deliver_at_ms is not None or self._closed or self.instance is None
                or not self.coalesce_sends):
            return None
        topic = msg.topic
        if type(topic) is not str or topic not in self._topics_checked or topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return None
        body = msg.body
        n = len(body)
        if not n or n >= self.compress_over_bytes:
            return None
        wait = msg.wait_store_msg_ok
        pb = _PLAIN_PREFIX_TRUE if wait else _PLAIN_PREFIX_FALSE
        size = _STORED_ELEMENT_OVERHEAD + _UNIQ_KEY_LENGTH + len(topic) + n + len(pb)   # _coalesce's size
        if size > self.max_message_size_bytes:
            return None
        return self._join((topic, wait, (timeout_ms or self.send_timeout_ms) / 1000), (msg.flag, body, pb), size)

    def _join(self, key: tuple, element: tuple, size: int):
        """Put (flag, body, properties bytes up to the UNIQ_KEY's value) into the open group
        of key (topic, wait_store_msg_ok, timeout_s), counting size against the group's
        bound; the future of its SendResult."""
        group = self._groups.get(key)
        if group is not None and group.size + size > self.max_message_size_bytes:
            self._launch(key)
            group = None
        if group is None:
            loop = asyncio.get_running_loop()
            group = self._groups[key] = _SendGroup(loop)
            if not self._groups_flush_scheduled:
                self._groups_flush_scheduled = True
                loop.call_soon(self._launch_groups)
        fut = group.loop.create_future()
        group.items.append((*element, fut))
        group.size += size
        if len(group.items) >= self.coalesce_max_messages:
            self._launch(key)
        return fut

    def _launch_groups(self) -> None:
        self._groups_flush_scheduled = False
        for key in list(self._groups):
            self._launch(key)

    def _launch(self, key: tuple) -> None:
        group = self._groups.pop(key)
        items = group.items
        task = group.loop.create_task(self._send_group(self.instance, key, items))
        self._group_tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._group_tasks.discard(t)
            # a task cancelled before its first step never ran its own clean-up
            for it in items:
                if not it[3].done():
                    it[3].cancel()
        task.add_done_callback(done)

    async def _send_group(self, inst, key: tuple, items: list) -> None:
        topic, wait, timeout_s = key
        deadline = asyncio.get_running_loop().time() + timeout_s
        self._sends_in_flight += 1
        try:
            # the group's UNIQ_KEYs: one run of the generator (next_id_counters), the ids
            # comma-joined as the batch's msg_id and split for the results
            n = len(items)
            head, counters = _uniq.next_id_counters(n)
            ids = head + counters.hex(",", 2).upper().replace(",", "," + head)
            uniqs = ids.split(",")
            if n == 1:
                await self._send_each(inst, topic, timeout_s, items, uniqs)
                return
            shapes = [(it[0], it[2]) for it in items]
            if shapes.count(shapes[0]) == n:    # one flag and properties template: no loop per element
                flag, prefix = shapes[0]
                body = msgcodec.encode_batch_run(flag, [it[1] for it in items], prefix + head.encode(),
                                                 counters.hex().upper().encode(), _UNIQ_KEY_LENGTH - len(head))
            else:
                body = msgcodec.encode_batch_elements([(it[0], it[1], it[2] + u.encode())
                                                       for it, u in zip(items, uniqs)])
            try:
                r = await self._send_with_retry(
                    inst, topic, "WAIT\x01true" if wait else "WAIT\x01false", body, 0, 0,
                    ids, None, batch=True, timeout_s=timeout_s)
            except (MessageIllegalError, RequestCodeNotSupportedError) as e:
                # The batch refused as such (a size or format rule of that broker, or no
                # SEND_BATCH_MESSAGE at all) says nothing about each message: they go one
                # per request and each gets its own answer. A broker without batches is
                # not asked again.
                if isinstance(e, RequestCodeNotSupportedError):
                    log.warning("%s: the broker does not take batches (%s); sends are no longer coalesced",
                                self.group, e)
                    self.coalesce_sends = False
                # within what is left of the group's time, not a fresh timeout each
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    raise
                await self._send_each(inst, topic, remaining, items, uniqs)
                return
        except Exception as e:
            for it in items:
                if not it[3].done():
                    it[3].set_exception(e)
            return
        except BaseException:          # cancelled (the loop is going away): so are the sends
            for it in items:
                it[3].cancel()
            raise
        finally:
            self._sends_in_flight -= 1
        for it, r1 in zip(items, split_batch_result(r, uniqs)):
            fut = it[3]
            if not fut.done():
                fut.set_result(r1)

    async def _send_each(self, inst, topic: str, timeout_s: float, items: list, uniqs: list[str]) -> None:
        """Grouped sends as one SEND_MESSAGE_V2 each, concurrently (item i with UNIQ_KEY
        uniqs[i]); every future gets its own result or error."""
        async def one(flag, body, prefix, fut, uniq):
            try:
                r = await self._send_with_retry(inst, topic, prefix.decode() + uniq, body, 0, flag, uniq, None,
                                                batch=False, timeout_s=timeout_s)
            except Exception as e:
                if not fut.done():
                    fut.set_exception(e)
                return
            if not fut.done():
                fut.set_result(r)
        await asyncio.gather(*(one(*it, u) for it, u in zip(items, uniqs)))

    async def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None,
                          sharding_key: str | None = None) -> None:
        """Fire and forget: one attempt, no response awaited."""
        self._check_message(msg)
        inst = self._inst()
        uniq = _uniq.next_id()
        props = msg.wire_properties_text(uniq)
        body, sys_flag = msg.body, 0
        if len(body) >= self.compress_over_bytes:
            body, sys_flag = msgcodec.maybe_compress(body, self.compress_over_bytes, self.compress_level)
        info = await inst.publish_info(msg.topic)
        if queue is None:
            queue = (hash_selector(info.queues, sharding_key) if sharding_key is not None
                     else self.fault.select(info, None, mono_ms()))
        addr = await inst.master_addr_refreshing(queue.broker_name, msg.topic)
        ext = send_ext_fields(self.group, msg.topic, queue.queue_id, sys_flag, msg.flag, props, False,
                              time.time_ns() // 1_000_000)
        await inst.api.send_message(addr, ext, body, batch=False, timeout_s=0, oneway=True)

    async def send_batch(self, msgs: Iterable[Message] | Iterable[bytes], *, topic: str | None = None,
                         tags: str | None = None, keys: str | Iterable[str] = (),
                         properties: Mapping[str, str] | None = None, flag: int = 0,
                         wait_store_msg_ok: bool = True, queue: MessageQueue | None = None,
                         timeout_ms: int | None = None) -> list[SendResult]:
        """Send messages of one topic as SEND_BATCH_MESSAGE, split into sub-batches that
        fit max_message_size_bytes; one SendResult per sub-batch (msg_id lists the
        UNIQ_KEYs of its messages, comma-separated, in order).

        `msgs` are Messages; or, with `topic=`, the messages' bodies (bytes, or str as
        UTF-8) and `tags`, `keys`, `properties`, `flag`, `wait_store_msg_ok` the fields they
        share: send_batch(bodies, topic="T", tags="A") sends what
        send_batch([Message("T", b, tags="A") for b in bodies]) sends, without a Message
        per body (the cheapest way to send many messages)."""
        if topic is not None:
            return await self._send_bodies(msgs, topic, tags, keys, properties, flag, wait_store_msg_ok,
                                           queue, timeout_ms)
        if tags is not None or keys or properties or flag or wait_store_msg_ok is not True:
            raise InvalidArgumentError("tags, keys, properties, flag and wait_store_msg_ok are for a batch of "
                                       "bodies (pass topic= too); a Message carries its own")
        msgs = list(msgs)
        if not msgs:
            raise InvalidArgumentError("empty batch")
        run = self._batch_run(msgs)
        if run is not None:
            results = await self._send_run(msgs[0], *run, queue, timeout_ms)
            if results is not None:
                return results
        topic = msgs[0].topic
        wait = msgs[0].wait_store_msg_ok
        for m in msgs:
            self._check_message(m)
            if m.topic != topic:
                raise InvalidArgumentError("The topic of the messages in one batch should be the same")
            if m.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                raise InvalidArgumentError("Retry Group is not supported for batching")
            if m.delay_level > 0:
                raise InvalidArgumentError("TimeDelayLevel is not supported for batching")
            if m.deliver_at_ms is not None:
                raise InvalidArgumentError("deliver_at_ms (a timer message) is not supported for batching")
            if m.wait_store_msg_ok != wait:
                raise InvalidArgumentError("The waitStoreMsgOK of the messages in one batch should the same")
        inst = self._inst()
        timeout_s = (timeout_ms or self.send_timeout_ms) / 1000
        uniqs = _uniq.next_ids(len(msgs))
        props = [m.wire_properties_text(u).encode() for m, u in zip(msgs, uniqs)]
        for pb in props:
            if len(pb) > msgcodec.PROPERTIES_LENGTH_BYTES_MAX:
                raise ValueError("batch element properties longer than 32767 bytes")
        results = []
        for idx in split_batch(msgs, props, self.max_message_size_bytes):
            body = msgcodec.encode_batch_elements([(msgs[i].flag, msgs[i].body, props[i]) for i in idx])
            batch_props = _WAIT_TRUE if wait else _WAIT_FALSE
            results.append(await self._send_with_retry(
                inst, topic, batch_props, body, 0, 0, ",".join(uniqs[i] for i in idx), queue,
                batch=True, timeout_s=timeout_s))
        return results

    async def _send_bodies(self, bodies: Iterable, topic: str, tags, keys, properties, flag: int,
                           wait_store_msg_ok: bool, queue: MessageQueue | None,
                           timeout_ms: int | None) -> list[SendResult]:
        """send_batch of bodies sharing one Message's other fields (see send_batch)."""
        if isinstance(bodies, (str, bytes, bytearray, memoryview)):
            # list() would split it into one message per character or byte
            raise InvalidArgumentError(f"send_batch(topic=...) takes a list of bodies, not one "
                                       f"{type(bodies).__name__}")
        bodies = list(bodies)
        if not bodies:
            raise InvalidArgumentError("empty batch")
        lens = [len(b) for b in bodies if type(b) is bytes]     # the type check and the lengths in one pass
        if len(lens) != len(bodies):
            bodies = [_body_bytes(b, i) for i, b in enumerate(bodies)]
            lens = [len(b) for b in bodies]
        m0 = Message(topic, bodies[0], tags, keys, properties, 0, flag, wait_store_msg_ok)
        self._check_message(m0)
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise InvalidArgumentError("Retry Group is not supported for batching")
        results = await self._send_run(m0, bodies, lens, self._bodies_total(lens), queue, timeout_ms)
        if results is None:         # over max_message_size_bytes: sub-batches, like any batch
            results = await self.send_batch([Message(topic, b, m0.tags, m0.keys, m0.properties, 0, flag,
                                                     wait_store_msg_ok) for b in bodies],
                                            queue=queue, timeout_ms=timeout_ms)
        return results

    def _bodies_total(self, lens: list[int]) -> int:
        """The total of a batch's body lengths; raises for an empty body or one over
        max_message_size_bytes, naming it."""
        n, bl = len(lens), lens[0]
        if lens.count(bl) == n:                 # one length: the common case, no min/max pass
            lo = hi = bl
            total = n * bl
        else:
            lo, hi, total = min(lens), max(lens), sum(lens)
        if not lo:
            raise InvalidArgumentError(f"the message body length is zero (message {lens.index(0)} of the batch)")
        if hi > self.max_message_size_bytes:
            raise MessageTooLargeError(f"the message body size over max value, MAX: {self.max_message_size_bytes} "
                                       f"(message {lens.index(hi)} of the batch)")
        return total

    def _batch_run(self, msgs: list) -> tuple[list[bytes], list[int], int] | None:
        """send_batch's fast path test: (the bodies, their lengths, the total) when `msgs` are
        Messages of one shape (topic, tags, keys, properties, flag, wait_store_msg_ok; no
        delay) that pass every check of a batch, else None (the general path then checks
        each message and raises what it raises). One comprehension of field tuples and a
        list.count (C) instead of a check per message."""
        m0 = msgs[0]
        if (type(m0) is not Message or m0.delay_level or m0.deliver_at_ms is not None
                or m0.topic.startswith(RETRY_GROUP_TOPIC_PREFIX)):
            return None
        try:
            self._check_message(m0)
        except MQClientError:
            return None
        if len(msgs) > 1:
            try:
                shapes = [(type(m), m.topic, m.tags, m.keys, m.delay_level, m.flag, m.wait_store_msg_ok,
                           m.properties, m.deliver_at_ms) for m in msgs]
            except Exception:       # not Messages: the general path names the problem
                return None
            if shapes.count(shapes[0]) != len(msgs):
                return None
            p0 = m0.properties
            if p0:
                # equal properties in another order would be written in m0's order: not the
                # bytes the general path writes (each message's own order)
                order = list(p0)
                for m in msgs:
                    p = m.properties
                    if p is not p0 and list(p) != order:
                        return None
        bodies = [m.body for m in msgs]
        lens = [len(b) for b in bodies]
        try:
            return bodies, lens, self._bodies_total(lens)
        except MQClientError:
            return None

    async def _send_run(self, m0: Message, bodies: list[bytes], lens: list[int], total: int,
                        queue: MessageQueue | None, timeout_ms: int | None) -> list[SendResult] | None:
        """One SEND_BATCH_MESSAGE of messages that are `m0` but for their bodies (checked
        already): the properties of every element are one template, m0's text up to its
        UNIQ_KEY's value (wire_properties_text puts UNIQ_KEY last; the checks keep it out of
        the user properties) plus the id's head, then the id's 4-digit counter
        (protocol.message.encode_batch_run). None when the batch must be split (over
        max_message_size_bytes): the caller takes the general path."""
        inst = self._inst()
        text = m0.wire_properties_text("").encode()
        if not text.endswith(b"UNIQ_KEY\x01"):
            raise AssertionError("wire_properties_text no longer ends with UNIQ_KEY")
        pl = len(text) + _UNIQ_KEY_LENGTH
        if pl > msgcodec.PROPERTIES_LENGTH_BYTES_MAX:
            raise ValueError("batch element properties longer than 32767 bytes")
        n = len(bodies)
        if total + n * (msgcodec.BATCH_ELEMENT_OVERHEAD + len(m0.topic) + 20 + pl) > self.max_message_size_bytes:
            return None
        head, counters = _uniq.next_id_counters(n)
        body = msgcodec.encode_batch_run(m0.flag, bodies, text + head.encode(), counters.hex().upper().encode(),
                                         _UNIQ_KEY_LENGTH - len(head), lens)
        return [await self._send_with_retry(
            inst, m0.topic, _WAIT_TRUE if m0.wait_store_msg_ok else _WAIT_FALSE, body, 0, 0,
            head + counters.hex(",", 2).upper().replace(",", "," + head), queue, batch=True,
            timeout_s=(timeout_ms or self.send_timeout_ms) / 1000)]

    async def _send_with_retry(self, inst, topic: str, props: str, body: bytes, sys_flag: int, flag: int,
                               uniq: str, queue: MessageQueue | None, *, batch: bool,
                               timeout_s: float) -> SendResult:
        """`props` is the encoded properties text (Message.wire_properties_text)."""
        attempts = 1 if queue is not None else 1 + self.retry_times_when_send_failed
        now = mono_ms()
        deadline = now + int(timeout_s * 1000)
        last_broker: str | None = None
        last_error: Exception | None = None
        fault = self.fault
        for attempt in range(attempts):
            if attempt:
                now = mono_ms()
            remaining_s = (deadline - now) / 1000
            if remaining_s <= 0:
                break
            if queue is not None:
                mq = queue
            else:
                info = inst.publish.get(topic)
                if info is None or not info.queues:
                    info = await inst.publish_info(topic)
                mq = fault.select(info, last_broker, now)
            broker_name = last_broker = mq.broker_name
            if self._failed_over:
                now = await self._await_failover(inst, broker_name, deadline, now)
                remaining_s = (deadline - now) / 1000
                if remaining_s <= 0:
                    break
            ext = send_ext_fields(self.group, topic, mq.queue_id, sys_flag, flag, props, batch,
                                  time.time_ns() // 1_000_000)
            start = now
            addr = None
            try:
                addr = inst.brokers.master(broker_name)
                if addr is None:
                    addr = await inst.master_addr_refreshing(broker_name, topic)
                resp = await inst.api.send_message(addr, ext, body, batch=batch,
                                                   timeout_s=remaining_s)
            except MQClientError as e:
                end = mono_ms()
                # Avoid the broker when it could not be reached or answered with a broker-side
                # failure (retriable codes); an error caused by the message itself (e.g.
                # MESSAGE_ILLEGAL) says nothing about the broker's health.
                fault.update(broker_name, end - start, end,
                             isolation=isinstance(e, (RemotingFailure, NoRouteError)) or e.retriable)
                last_error = e
                if is_failover_signal(e):
                    # asked before a raise too: the next send must find the new master
                    refreshed = inst.request_route_refresh((broker_name,), topic=topic, stats=self.stats)
                    if refreshed is not None:
                        self._failed_over[broker_name] = (addr, refreshed)
                if not e.retriable or attempt + 1 >= attempts:
                    raise
                log.info("send to %s failed (%s), retrying on another broker", broker_name, e)
                if isinstance(e, NoRouteError):
                    await inst.update_route(topic, for_publish=True)
                continue
            end = mono_ms()
            fault.update(broker_name, end - start, end)
            if resp.code and is_failover_signal(resp.code, resp.remark):
                # stored (SLAVE_NOT_AVAILABLE), so not sent again, but the group is changing
                inst.request_route_refresh((broker_name,), topic=topic, stats=self.stats)
            ext = resp.ext_fields
            try:
                queue_id = int(ext.get("queueId", mq.queue_id))
                queue_offset = int(ext.get("queueOffset", -1))
            except ValueError:
                queue_id, queue_offset = mq.queue_id, -1
            rq = mq if queue_id == mq.queue_id and mq.topic == topic else MessageQueue(topic, broker_name, queue_id)
            return SendResult(SEND_STATUS[resp.code], uniq, ext.get("msgId", ""), rq, queue_offset,
                              ext.get("transactionId"), ext.get("MSG_REGION", "DefaultRegion"),
                              ext.get("TRACE_ON", "true") != "false")
        if last_error is not None:
            raise last_error
        from pocketmq.client.errors import RequestTimeoutError
        raise RequestTimeoutError(f"send to {topic} timed out after {timeout_s}s")

    async def _await_failover(self, inst, broker_name: str, deadline: int, now: int) -> int:
        """Before a send to `broker_name` after one to it failed with a failover signal:
        while the member table still names the address that failed as the group's master
        (or none), wait (until `deadline`) for the route refresh that failure asked for, so
        the send goes to the new master rather than to the old one again. Returns now."""
        entry = self._failed_over.get(broker_name)
        if entry is None:
            return now
        failed_addr, refreshed = entry
        if not refreshed.done() and inst.brokers.master(broker_name) in (failed_addr, None):
            await asyncio.wait((refreshed,), timeout=(deadline - now) / 1000)
            now = mono_ms()
        if refreshed.done() and self._failed_over.get(broker_name) is entry:
            del self._failed_over[broker_name]
        return now
