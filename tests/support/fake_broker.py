"""A small in-process RocketMQ cluster for client tests (real TCP on 127.0.0.1).

    async with FakeCluster(brokers=2) as cluster:
        async with Producer("PG", cluster.namesrv_addr) as p: ...

It speaks just enough of the protocol for the client: routes (with TBW102
auto-creation), heartbeats with NOTIFY_CONSUMER_IDS_CHANGED to the group,
sends (single and batch), pulls with long polling and tag filtering, offsets,
timestamp search, consumer lists and CONSUMER_SEND_MSG_BACK (re-delivered at
once to `%RETRY%<group>`, no delay levels). Messages live in memory as
encoded stored records. Fault hooks: `broker.fail_sends` (a response code to
answer sends with), `broker.refuse_batches` (the same for batch sends
only), `broker.stop()` / `broker.start()` to simulate a restart
on the same port (offsets and messages survive, client registrations do not).

Master/slave groups (`FakeCluster(slaves=1)`, or `await cluster.add_slave(i)`): a
slave is a FakeBroker with the master's brokerName, `broker_id` 1.., sharing the
master's topics and stored messages (replication without delay: a message stored by
the master is at once readable, and wakes long polls, on its slaves). Like a 4.x
slave it refuses sends and send-backs (SERVICE_NOT_AVAILABLE), serves pulls without
storing the commit offset a pull carries, and keeps offsets of its own
(UPDATE/QUERY_CONSUMER_OFFSET). The nameserver lists the running members of a group
of several (a stopped master leaves the route at once, its queues kept while a member
runs); a lone broker stays listed while stopped, as before. Hooks: `broker.suggest`
(the `suggestWhichBrokerId` of its pull answers: an int, or a function of the pull
header), `broker.store_status` (store sends but answer with that code, e.g. 11
SLAVE_NOT_AVAILABLE / 12 FLUSH_SLAVE_TIMEOUT as a SYNC_MASTER does), `broker.pulls`
(the headers of the last pulls). Queue locks (LOCK/UNLOCK_BATCH_MQ) are a plain table
that lives as long as the broker runs.

It is not the pocketmq broker: it exists so client logic can be tested
without the daemons.
"""
from __future__ import annotations

import asyncio
import itertools
import time

from pocketmq.protocol import message as msgcodec
from collections import deque

from pocketmq.protocol.bodies import (
    BrokerData,
    QueueData,
    TopicRouteData,
    build_subscription,
    decode_lock_body,
    dumps,
    encode_mq_set,
    parse_heartbeat,
)
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import decode_pull_header, decode_send_header
from pocketmq.remoting.server import RemotingServer
from tests.support.events import Waiters

_now = lambda: time.time_ns() // 1_000_000


class FakeNameServer:
    def __init__(self):
        self.brokers: list[FakeBroker] = []
        self.server = RemotingServer({RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route},
                                     host="127.0.0.1", name="fake-ns")
        self.route_requests = 0

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def _route(self, conn, cmd):
        self.route_requests += 1
        topic = cmd.ext_fields.get("topic", "")
        qds, bds = [], []
        groups: dict[str, list[FakeBroker]] = {}
        for b in self.brokers:
            groups.setdefault(b.name, []).append(b)
        for name, members in groups.items():
            nums = members[0].topics.get(topic)        # (the members share their topics)
            # the nameserver drops a member whose connection closed; a lone broker stays
            # listed while stopped (the fake's restart tests rely on it)
            listed = [m for m in members if m.running] if len(members) > 1 else members
            if nums is None or not listed:
                continue
            perm = next((m.perm for m in listed if m.broker_id == 0), listed[0].perm)
            qds.append(QueueData(name, nums, nums, perm))
            bds.append(BrokerData("FakeCluster", name, {m.broker_id: m.addr for m in listed}))
        if not qds:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST,
                                f"No topic route info in name server for the topic: {topic}")
        return cmd.response(ResponseCode.SUCCESS, body=dumps(TopicRouteData(qds, bds).to_json()))


class FakeBroker:
    def __init__(self, name: str, default_queue_nums: int = 8, version_desc: str = "pocketmq-fake",
                 broker_id: int = 0):
        self.name = name
        self.broker_id = broker_id          # 0 master, > 0 slave (replica_of)
        self.replicas: list[FakeBroker] = []     # a master's slaves: their long polls wake on its stores
        self.running = False
        self.suggest = None                 # suggestWhichBrokerId: None (0), an int, or fn(pull header)
        self.store_status: int | None = None     # store sends, answer this code (10, 11, 12)
        self.pulls: deque = deque(maxlen=1000)   # the headers of the last pulls
        self.locks: dict[tuple, str] = {}   # (group, topic, queueId) -> clientId
        self.producer_groups: set[str] = set()   # producer groups heartbeats named
        self.version_desc = version_desc    # "pocketmq..." makes our clients switch to msgpack headers
        self.default_queue_nums = default_queue_nums
        self.topics: dict[str, int] = {"TBW102": default_queue_nums}
        self.queues: dict[tuple[str, int], list[bytes]] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}   # (group, topic, qid) -> offset
        self.groups: dict[str, dict] = {}                     # group -> {client_id: conn}
        self.subs: dict[str, dict] = {}                       # group -> {topic: SubscriptionData}
        self.held: list = []                                  # [(key, deadline_ms, conn, cmd, header)]
        self.commit_log: dict[int, bytes] = {}                # physical offset -> record
        self._phys = itertools.count(1000, 1)
        self.perm = 6
        self.fail_sends: int | None = None
        self.refuse_batches: int | None = None   # a response code for SEND_BATCH_MESSAGE only
        self.sends = 0
        self.requests: list[int] = []
        self.batch_sizes: list[int] = []      # messages per SEND_BATCH_MESSAGE, in arrival order
        self.serialize_types: set[int] = set()
        self.port = 0
        self.server: RemotingServer | None = None
        self._tick: asyncio.Task | None = None
        self.changes = Waiters()      # until(): re-checked after every request handled

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def replica_of(cls, master: FakeBroker, broker_id: int) -> FakeBroker:
        """A slave of `master`: same brokerName, the master's topics and stored messages
        (shared), offsets of its own."""
        slave = cls(master.name, master.default_queue_nums, master.version_desc, broker_id)
        slave.topics = master.topics
        slave.queues = master.queues
        slave.commit_log = master.commit_log
        slave._phys = master._phys
        master.replicas.append(slave)
        return slave

    @property
    def is_slave(self) -> bool:
        return self.broker_id != 0

    async def start(self) -> None:
        procs = {
            RequestCode.HEART_BEAT: self._heartbeat,
            RequestCode.UNREGISTER_CLIENT: self._unregister,
            RequestCode.SEND_MESSAGE: self._send,
            RequestCode.SEND_MESSAGE_V2: self._send,
            RequestCode.SEND_BATCH_MESSAGE: self._send,
            RequestCode.PULL_MESSAGE: self._pull,
            RequestCode.QUERY_CONSUMER_OFFSET: self._query_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self._update_offset,
            RequestCode.GET_MAX_OFFSET: self._max_offset,
            RequestCode.GET_MIN_OFFSET: self._min_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self._search_offset,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self._consumer_list,
            RequestCode.CONSUMER_SEND_MSG_BACK: self._send_back,
            RequestCode.GET_BROKER_RUNTIME_INFO: self._runtime_info,
            RequestCode.LOCK_BATCH_MQ: self._lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: self._unlock_batch,
        }
        procs = {code: self._notifying(fn) for code, fn in procs.items()}
        self.server = RemotingServer(procs, host="127.0.0.1", port=self.port, name=f"fake-{self.name}",
                                     on_connection_close=self._conn_closed)
        self.port = await self.server.start()
        self._tick = asyncio.create_task(self._expire_held())
        self.running = True

    async def stop(self) -> None:
        self.running = False        # out of the route from now on (when it has a replica)
        self.locks.clear()
        if self._tick is not None:
            self._tick.cancel()
            await asyncio.gather(self._tick, return_exceptions=True)
        self.held.clear()
        self.groups.clear()
        self.subs.clear()
        if self.server is not None:
            await self.server.close()
            self.server = None

    def _notifying(self, fn):
        def handle(conn, cmd):
            try:
                return fn(conn, cmd)
            finally:
                self.changes.check()
        return handle

    async def until(self, pred) -> None:
        """Wait (bound it with asyncio.timeout) until pred() holds; checked after every request."""
        await self.changes.until(pred)

    def _runtime_info(self, conn, cmd):
        return cmd.response(ResponseCode.SUCCESS, body=dumps({"table": {"brokerVersionDesc": self.version_desc}}))

    # -- clients ---------------------------------------------------------------------------
    def _notify(self, group: str) -> None:
        for conn in list(self.groups.get(group, {}).values()):
            conn.send(RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, flag=2,
                                      ext_fields={"consumerGroup": group}))

    def _heartbeat(self, conn, cmd):
        self.requests.append(cmd.code)
        hb = parse_heartbeat(cmd.body)
        self.producer_groups.update(hb.producer_groups)
        for cd in hb.consumer_data_set:
            members = self.groups.setdefault(cd.group_name, {})
            is_new = members.get(hb.client_id) is not conn
            members[hb.client_id] = conn
            conn.attrs.setdefault("groups", set()).add((cd.group_name, hb.client_id))
            self.subs[cd.group_name] = {s.topic: s for s in cd.subscription_data_set}
            rt = "%RETRY%" + cd.group_name
            self.topics.setdefault(rt, 1)
            if is_new:
                self._notify(cd.group_name)
        return cmd.response(ResponseCode.SUCCESS)

    def _drop_member(self, group: str, client_id: str) -> None:
        members = self.groups.get(group)
        if members and members.pop(client_id, None) is not None:
            self._notify(group)

    def _unregister(self, conn, cmd):
        group = cmd.ext_fields.get("consumerGroup")
        if group:
            self._drop_member(group, cmd.ext_fields.get("clientID", ""))
        return cmd.response(ResponseCode.SUCCESS)

    def _conn_closed(self, conn):
        for group, cid in conn.attrs.get("groups", ()):
            if self.groups.get(group, {}).get(cid) is conn:
                self._drop_member(group, cid)

    def _consumer_list(self, conn, cmd):
        group = cmd.ext_fields["consumerGroup"]
        ids = sorted(self.groups.get(group, {}))
        if not ids:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.response(ResponseCode.SUCCESS, body=dumps({"consumerIdList": ids}))

    # -- store -----------------------------------------------------------------------------
    def _append(self, topic: str, qid: int, flag: int, body: bytes, props: str, sys_flag: int,
                born_ts: int, reconsume: int = 0) -> tuple[int, int]:
        q = self.queues.setdefault((topic, qid), [])
        phys = next(self._phys) * 1000
        rec = msgcodec.encode_record(topic, qid, flag, body, props, sys_flag, born_ts,
                                     (b"\x7f\x00\x00\x01", 40000), (b"\x7f\x00\x00\x01", self.port),
                                     reconsume, 0, len(q), phys, _now())
        q.append(rec)
        self.commit_log[phys] = rec
        for member in [self, *self.replicas]:
            if member.running:
                member._wake(topic, qid)
        return len(q) - 1, phys

    def store(self, topic: str, qid: int, body: bytes, tags: str | None = None) -> int:
        """Store a message as if it had been sent (on a slave: as if replicated before its
        master died); returns its queue offset."""
        props = msgcodec.encode_properties({"TAGS": tags} if tags else {})
        return self._append(topic, qid, 0, body, props, 0, _now())[0]

    def _send(self, conn, cmd):
        self.requests.append(cmd.code)
        self.serialize_types.add(cmd.serialize_type)
        self.sends += 1
        h = decode_send_header(cmd.code, cmd.ext_fields)
        ext = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        if self.is_slave:
            return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, "slave: no sends", ext_fields=ext)
        if self.fail_sends is not None:
            return cmd.response(self.fail_sends, "injected failure", ext_fields=ext)
        if self.refuse_batches is not None and cmd.code == RequestCode.SEND_BATCH_MESSAGE:
            return cmd.response(self.refuse_batches, "injected batch refusal", ext_fields=ext)
        if h.topic not in self.topics:
            if h.default_topic in self.topics or h.topic.startswith("%RETRY%"):
                self.topics[h.topic] = min(h.default_topic_queue_nums, self.default_queue_nums)
            else:
                return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{h.topic}] not exist")
        nums = self.topics[h.topic]
        qid = max(h.queue_id, 0)
        if qid >= nums:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"request queueId[{qid}] is illegal")
        props = h.properties or ""
        if h.batch:
            ids, first = [], None
            elements = msgcodec.decode_batch_body(cmd.body)
            self.batch_sizes.append(len(elements))
            for flag, body, eprops in elements:
                off, phys = self._append(h.topic, qid, flag, body, eprops, h.sys_flag, h.born_timestamp)
                first = off if first is None else first
                ids.append(msgcodec.offset_msg_id(b"\x7f\x00\x00\x01", self.port, phys))
            ext.update(msgId=",".join(ids), queueId=str(qid), queueOffset=str(first))
        else:
            off, phys = self._append(h.topic, qid, h.flag, cmd.body, props, h.sys_flag, h.born_timestamp,
                                     h.reconsume_times)
            ext.update(msgId=msgcodec.offset_msg_id(b"\x7f\x00\x00\x01", self.port, phys),
                       queueId=str(qid), queueOffset=str(off))
        return cmd.response(ResponseCode.SUCCESS if self.store_status is None else self.store_status,
                            ext_fields=ext)

    def _send_back(self, conn, cmd):
        if self.is_slave:
            return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, "slave: no sends")
        ext = cmd.ext_fields
        rec = self.commit_log.get(int(ext["offset"]))
        if rec is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {ext['offset']}")
        m = msgcodec.decode_record(rec, decompress=False)
        props = dict(m.properties)
        props.setdefault("RETRY_TOPIC", m.topic)
        props.setdefault("ORIGIN_MESSAGE_ID", ext.get("originMsgId", m.msg_id))
        group = ext["group"]
        target = "%RETRY%" + group
        if m.reconsume_times >= int(ext.get("maxReconsumeTimes", 16)):
            target = "%DLQ%" + group
        self.topics.setdefault(target, 1)
        self._append(target, 0, m.flag, m.body, msgcodec.encode_properties(props), m.sys_flag,
                     m.born_timestamp, m.reconsume_times + 1)
        return cmd.response(ResponseCode.SUCCESS)

    def _pull_once(self, h):
        q = self.queues.get((h.topic, h.queue_id), [])
        mx = len(q)
        s = self.suggest
        suggest = 0 if s is None else s(h) if callable(s) else s
        ext = {"suggestWhichBrokerId": str(suggest), "minOffset": "0", "maxOffset": str(mx)}
        off = h.queue_offset
        if off < 0 or off > mx:
            ext["nextBeginOffset"] = str(mx if off > mx else 0)
            return ResponseCode.PULL_OFFSET_MOVED, ext, b""
        if off == mx:
            ext["nextBeginOffset"] = str(off)
            return ResponseCode.PULL_NOT_FOUND, ext, b""
        sub = build_subscription(h.topic, h.subscription or "*", "TAG")
        out, scanned = [], 0
        for rec in q[off:off + 800]:
            scanned += 1
            if not sub.is_all:
                tags = msgcodec.decode_record(rec, decompress=False).properties.get("TAGS")
                if not tags or tags not in sub.tags_set:
                    continue
            out.append(rec)
            if len(out) >= h.max_msg_nums:
                break
        ext["nextBeginOffset"] = str(off + scanned)
        if not out:
            return ResponseCode.PULL_RETRY_IMMEDIATELY, ext, b""
        return ResponseCode.SUCCESS, ext, out

    def _pull(self, conn, cmd):
        self.requests.append(cmd.code)
        h = decode_pull_header(cmd.ext_fields)
        self.pulls.append(h)
        if h.topic not in self.topics:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{h.topic}] not exist")
        if h.sys_flag & 1 and not self.is_slave:     # a slave never stores a pull's commit offset
            self.offsets[(h.consumer_group, h.topic, h.queue_id)] = h.commit_offset
        code, ext, body = self._pull_once(h)
        if code == ResponseCode.PULL_NOT_FOUND and h.sys_flag & 2:
            self.held.append(((h.topic, h.queue_id), _now() + h.suspend_timeout_millis, conn, cmd, h))
            return None
        return cmd.response(code, code.name, ext_fields=ext, body=body)

    def _wake(self, topic: str, qid: int) -> None:
        keep = []
        for item in self.held:
            key, _deadline, conn, cmd, h = item
            if key == (topic, qid):
                code, ext, body = self._pull_once(h)
                conn.send(cmd.response(code, code.name, ext_fields=ext, body=body))
            else:
                keep.append(item)
        self.held = keep

    async def _expire_held(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            now = _now()
            keep = []
            for item in self.held:
                _key, deadline, conn, cmd, h = item
                if now >= deadline:
                    code, ext, body = self._pull_once(h)
                    conn.send(cmd.response(code, code.name, ext_fields=ext, body=body))
                else:
                    keep.append(item)
            self.held = keep

    # -- offsets ---------------------------------------------------------------------------
    def _query_offset(self, conn, cmd):
        e = cmd.ext_fields
        off = self.offsets.get((e["consumerGroup"], e["topic"], int(e["queueId"])))
        if off is None:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(off)})

    def _update_offset(self, conn, cmd):
        e = cmd.ext_fields
        self.offsets[(e["consumerGroup"], e["topic"], int(e["queueId"]))] = int(e["commitOffset"])
        return cmd.response(ResponseCode.SUCCESS)

    def _max_offset(self, conn, cmd):
        e = cmd.ext_fields
        return cmd.response(ResponseCode.SUCCESS, ext_fields={
            "offset": str(len(self.queues.get((e["topic"], int(e["queueId"])), [])))})

    def _min_offset(self, conn, cmd):
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": "0"})

    def _search_offset(self, conn, cmd):
        e = cmd.ext_fields
        ts = int(e["timestamp"])
        q = self.queues.get((e["topic"], int(e["queueId"])), [])
        for i, rec in enumerate(q):
            if msgcodec.decode_record(rec, decompress=False).store_timestamp >= ts:
                return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(i)})
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(len(q))})

    # -- queue locks (orderly consumers) ----------------------------------------------------
    def _lock_batch(self, conn, cmd):
        group, client_id, mqs = decode_lock_body(cmd.body)
        ok = []
        for mq in mqs:
            key = (group, mq.topic, mq.queue_id)
            if self.locks.get(key, client_id) == client_id:
                self.locks[key] = client_id
                ok.append(mq)
        return cmd.response(ResponseCode.SUCCESS, body=encode_mq_set("lockOKMQSet", ok))

    def _unlock_batch(self, conn, cmd):
        group, client_id, mqs = decode_lock_body(cmd.body)
        for mq in mqs:
            key = (group, mq.topic, mq.queue_id)
            if self.locks.get(key) == client_id:
                del self.locks[key]
        return cmd.response(ResponseCode.SUCCESS)

    # -- helpers for tests -------------------------------------------------------------------
    def committed(self, group: str, topic: str) -> dict[int, int]:
        return {qid: off for (g, t, qid), off in self.offsets.items() if g == group and t == topic}

    def caught_up(self, group: str, *topics: str) -> bool:
        """Every queue of `topics` has a long poll of `group` held at its end: everything
        stored was pulled (until() this instead of sleeping to see that nothing more comes)."""
        held = {(h.topic, h.queue_id) for (_k, _d, _c, _cmd, h) in self.held
                if h.consumer_group == group and h.queue_offset == len(self.queues.get((h.topic, h.queue_id), []))}
        return all((t, q) in held for t in topics for q in range(self.topics.get(t, 0)))

    def message_count(self, topic: str) -> int:
        return sum(len(v) for (t, _), v in self.queues.items() if t == topic)


class FakeCluster:
    """`brokers` masters (`cluster.brokers`), each with `slaves` slaves (`cluster.slaves`,
    grouped per master in `cluster.replicas[i]`)."""

    def __init__(self, brokers: int = 1, queues: int = 8, version_desc: str = "pocketmq-fake",
                 slaves: int = 0):
        self.namesrv = FakeNameServer()
        self.brokers = [FakeBroker(f"broker-{chr(ord('a') + i)}", queues, version_desc) for i in range(brokers)]
        self.replicas = [[FakeBroker.replica_of(m, i + 1) for i in range(slaves)] for m in self.brokers]
        self.namesrv.brokers = list(self.brokers)
        for group in self.replicas:
            self.namesrv.brokers.extend(group)

    @property
    def slaves(self) -> list[FakeBroker]:
        return [s for group in self.replicas for s in group]

    async def add_slave(self, i: int = 0) -> FakeBroker:
        """Start one more slave of master `i` and list it with the nameserver."""
        master = self.brokers[i]
        slave = FakeBroker.replica_of(master, len(self.replicas[i]) + 1)
        self.replicas[i].append(slave)
        await slave.start()
        self.namesrv.brokers.append(slave)
        return slave

    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.addr

    def create_topic(self, topic: str, queues: int = 8) -> None:
        for b in self.brokers:
            b.topics[topic] = queues

    async def start(self) -> FakeCluster:
        await self.namesrv.server.start()
        for b in self.namesrv.brokers:
            await b.start()
        return self

    async def close(self) -> None:
        for b in self.namesrv.brokers:
            await b.stop()
        await self.namesrv.server.close()

    async def __aenter__(self) -> FakeCluster:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()
