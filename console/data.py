"""What the console's pages show, fetched from the cluster: the shell over mqadmin's
AdminSession (tools/mqadmin/session.py: the client's ClientAPI, nameservers in order,
failures as AdminError lines). Requests of a page run concurrently (`gather`, at most
`concurrency` in flight), answers are cached a few seconds (logic.TtlCache), and every read
of messages is bounded (logic.scan_plan, MAX_LIST).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import NamedTuple

from pocketmq.client.api import PullRequest, PullResult, ResetOffsetRequest, pull_sys_flag
from pocketmq.client.errors import BrokerError, MessageNotFoundError, RemotingFailure
from pocketmq.client.query import query_route, view_route
from pocketmq.common.constants import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX
from pocketmq.protocol.bodies import MessageQueue, TopicConfig
from pocketmq.protocol.codes import PermName
from pocketmq.protocol.message import ORIGIN_MESSAGE_ID, RETRY_TOPIC, UNIQ_KEY, MessageExt
from pocketmq.tools.mqadmin.consumer import version_desc
from pocketmq.tools.mqadmin.errors import AdminError
from pocketmq.tools.mqadmin.session import (
    AdminSession,
    object_keyed_table,
    route_masters,
    to_float,
    to_int,
)
from pocketmq.console import logic

log = logging.getLogger("pocketmq.console")

# The group the console's reads name in PULL_MESSAGE: it never commits (no COMMIT_OFFSET flag,
# commit offset 0), so nothing is stored under it (Java's tools use TOOLS_CONSUMER too).
READ_GROUP = "TOOLS_CONSUMER"
PULL_BATCH = 32
ROUTE_WAIT_S = 5.0        # how long a topic's creation waits for the nameserver to know it
MAX_LIST = 200            # most messages a lookup page lists
RESENT_FROM = "CONSOLE_RESENT_FROM"   # user property of a copy the console sent again: the first copy's id
MAX_TRACE_GROUPS = 20     # a message's trace looks at the retry/DLQ topics of at most this many groups


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class GroupSnapshot(NamedTuple):
    group: str
    lag: int | None
    clients: int
    consume_type: str
    model: str
    tps: float
    error: str = ""
    orderly: str = ""       # logic.orderly_text: the clients' and the group config's


class Cluster:
    """One console's view of one cluster (its nameservers, its credentials)."""

    def __init__(self, namesrv: str, *, credentials=None, concurrency: int = 32, cache_ttl_ms: int = 3000,
                 clock=wall_ms):
        self.session = AdminSession(namesrv, credentials=credentials)
        self.api = self.session.api
        self.credentials = credentials
        self.clock = clock
        self.cache = logic.TtlCache(cache_ttl_ms)
        self._sem = asyncio.Semaphore(concurrency)
        self._inflight: dict = {}
        self._producer = None
        self._producer_lock = asyncio.Lock()
        # {group: {clientId: orderly?}}: a client's PROP_CONSUMEORDERLY does not change while it
        # is connected, so the sampler asks a client's running info once, not every round; each
        # snapshot keeps only the group's online clients (the bound: the clients online now)
        self._orderly_seen: dict[str, dict[str, bool]] = {}

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()
        await self.session.close()

    # -- plumbing ----------------------------------------------------------------------------
    async def cached(self, key, fn):
        """fn()'s answer, from the cache when fresh; concurrent callers share one fetch."""
        hit = self.cache.get(key, self.clock())
        if hit is not None:
            return hit
        fut = self._inflight.get(key)
        if fut is None:
            fut = self._inflight[key] = asyncio.ensure_future(fn())
            fut.add_done_callback(lambda f, k=key: self._inflight.pop(k, None))
        value = await asyncio.shield(fut)
        self.cache.put(key, value, self.clock())
        return value

    async def one(self, coro):
        async with self._sem:
            return await coro

    async def gather(self, coros) -> list:
        """Every coroutine, at most `concurrency` at a time; an AdminError/BrokerError comes back
        as the exception object (one unreachable broker must not blank a whole page)."""
        async def run(c):
            try:
                return await self.one(c)
            except (AdminError, BrokerError, RemotingFailure) as e:
                return e
        return await asyncio.gather(*(run(c) for c in coros))

    def invalidate(self) -> None:
        self.cache.clear()

    # -- cluster -----------------------------------------------------------------------------
    async def cluster_info(self):
        return await self.cached("cluster_info", self.session.cluster_info)

    async def masters(self) -> dict[str, str]:
        brokers, _ = await self.cluster_info()
        return {n: bd.master_addr() for n, bd in sorted(brokers.items()) if bd.master_addr()}

    async def cluster_page(self) -> dict:
        brokers, clusters = await self.cluster_info()
        members = [(bd.cluster or c, name, bid, addr)
                   for c, names in sorted(clusters.items()) for name in sorted(names)
                   if (bd := brokers.get(name)) is not None for bid, addr in sorted(bd.broker_addrs.items())]
        infos = await self.gather(self.session.reach(addr, self.api.broker_runtime_info) for *_, addr in members)
        now = self.clock()
        rows = []
        for (cluster, name, bid, addr), info in zip(members, infos):
            row = {"cluster": cluster, "broker": name, "id": bid, "addr": addr,
                   "role": "MASTER" if bid == 0 else "SLAVE"}
            if isinstance(info, Exception):
                row["error"] = str(info)
                rows.append(row)
                continue
            t = (info or {}).get("table") or {}
            row["role"] = t.get("brokerRole") or row["role"]
            row["version"] = t.get("brokerVersionDesc", "")
            boot = to_int(t.get("bootTimestamp"))
            row["uptime"] = logic.uptime_text(now - boot) if boot else "-"
            row["disk"] = f"{to_float(t.get('commitLogDiskRatio')) * 100:.1f}%"
            row["put_tps"] = f"{to_float(t.get('putTps')):.1f}"
            row["get_tps"] = f"{to_float(t.get('getTransferedTps')):.1f}"
            row["msgs"] = logic.human_bytes(to_int(t.get("commitLogMaxOffset")) - to_int(t.get("commitLogMinOffset")))
            row["replication"] = replication_text(t)
            rows.append(row)
        return {"namesrvs": self.session.namesrv_addrs, "rows": rows, "clusters": sorted(clusters)}

    # -- topics ------------------------------------------------------------------------------
    async def topic_names(self) -> list[str]:
        return await self.cached("topic_list", self.session.topic_list)

    async def route(self, topic: str):
        return await self.cached(("route", topic), lambda: self.session.route(topic))

    async def topic_rows(self, names: list[str]) -> list[dict]:
        """Queue counts and put TPS of one page of topics (their routes fetched concurrently)."""
        routes = await self.gather(self.route(t) for t in names)
        rows = []
        for t, r in zip(names, routes):
            if isinstance(r, Exception):
                rows.append({"topic": t, "error": str(r)})
                continue
            rows.append({"topic": t, "brokers": len(r.broker_datas),
                         "read": sum(q.read_queue_nums for q in r.queue_datas),
                         "write": sum(q.write_queue_nums for q in r.queue_datas),
                         "perm": ",".join(sorted({perm_text(q.perm) for q in r.queue_datas})),
                         "kind": topic_kind(t)})
        tps = await self.gather(self._topic_tps(t, r) for t, r in zip(names, routes) if not isinstance(r, Exception))
        for row, v in zip((r for r in rows if "error" not in r), tps):
            row["tps"] = "-" if isinstance(v, Exception) else f"{v:.1f}"
        return rows

    async def _topic_tps(self, topic: str, route) -> float:
        total = 0.0
        for addr in route_masters(route).values():
            try:
                d = await self.api.view_broker_stats_data(addr, "TOPIC_PUT_NUMS", topic)
            except BrokerError:
                continue          # the broker has no such stats item yet: nothing put
            total += to_float((d.get("statsMinute") or {}).get("tps"))
        return total

    async def topic_detail(self, topic: str) -> dict:
        route = await self.session.route(topic)
        masters = route_masters(route)
        stats = await self.gather(self.session.reach(a, self.api.topic_stats, topic) for a in masters.values())
        queues, errors = [], []
        for (name, addr), st in zip(masters.items(), stats):
            if isinstance(st, Exception):
                errors.append(f"{name}: {st}")
                continue
            for mq, v in sorted(object_keyed_table(st, "topic stats", f"broker {addr}").items()):
                queues.append({"broker": mq.broker_name, "queue": mq.queue_id, "min": to_int(v.get("minOffset")),
                               "max": to_int(v.get("maxOffset")),
                               "last": logic.format_ms(to_int(v.get("lastUpdateTimestamp")))})
        groups = set()
        for g in await self.gather(self.session.reach(a, self.api.query_topic_consume_by_who, topic)
                                   for a in masters.values()):
            if not isinstance(g, Exception):
                groups.update(g)
        return {"topic": topic, "route": route, "masters": masters, "queues": queues,
                "total": sum(q["max"] - q["min"] for q in queues), "groups": sorted(groups), "errors": errors,
                "queue_datas": sorted(route.queue_datas, key=lambda q: q.broker_name)}

    async def upsert_topic(self, topic: str, read: int, write: int, perm: int, order: bool) -> list[str]:
        """UPDATE_AND_CREATE_TOPIC on every master of the cluster(s); returns the brokers."""
        masters = await self.masters()
        if not masters:
            raise AdminError("no master broker is registered on the nameserver")
        cfg = TopicConfig(topic, read_queue_nums=read, write_queue_nums=write, perm=perm, order=order)
        for name, addr in masters.items():
            await self.session.call(addr, self.api.create_topic, cfg, "TBW102",
                                    what=f"create topic {topic}", where=f"broker {name} {addr}")
        self.invalidate()
        # the brokers register the change with the nameservers right after answering: the
        # topic's page (shown next) reads the route there, so wait for it (bounded)
        deadline = time.monotonic() + ROUTE_WAIT_S
        while time.monotonic() < deadline:
            route = await self.session.find_route(topic)
            if route is not None and len(route.queue_datas) >= len(masters):
                break
            await asyncio.sleep(0.1)
        return list(masters)

    async def delete_topic(self, topic: str) -> None:
        masters = await self.masters()
        for name, addr in masters.items():
            await self.session.call(addr, self.api.delete_topic_in_broker, topic,
                                    what=f"delete topic {topic}", where=f"broker {name} {addr}")
        await self.session.every_namesrv(self.api.delete_topic_in_namesrv, topic, what=f"delete topic {topic}")
        self.invalidate()

    async def producer(self):
        """The console's one producer (test messages, resends), started on first use."""
        async with self._producer_lock:
            if self._producer is None:
                from pocketmq.client.producer import Producer
                p = Producer("pocketmq_console", ";".join(self.session.namesrv_addrs), credentials=self.credentials)
                await p.start()
                self._producer = p
            return self._producer

    async def send(self, topic: str, body: bytes, tags: str | None, keys: str | None, props: dict | None = None):
        from pocketmq.client.message import Message
        msg = Message(topic, body, tags=tags or None, keys=keys.split() if keys else (), properties=props or None)
        p = await self.producer()
        return await p.send(msg)

    # -- groups ------------------------------------------------------------------------------
    async def subscription_groups(self) -> dict[str, bool]:
        """{group: its config asks for orderly consumption} over every master's subscription
        groups (orderly when any master's config says so)."""
        async def fetch():
            out: dict[str, bool] = {}
            masters = await self.masters()
            for got in await self.gather(self.session.reach(a, self.api.all_subscription_groups)
                                         for a in masters.values()):
                if not isinstance(got, Exception):
                    for name, cfg in got[0].items():
                        out[name] = out.get(name, False) or bool(cfg.consumeMessageOrderly)
            return out
        return await self.cached("subscription_groups", fetch)

    async def group_names(self) -> list[str]:
        async def fetch():
            names = {t[len(RETRY_GROUP_TOPIC_PREFIX):] for t in await self.topic_names()
                     if t.startswith(RETRY_GROUP_TOPIC_PREFIX)}
            names.update(await self.subscription_groups())
            return sorted(n for n in names if not is_system_group(n))
        return await self.cached("group_names", fetch)

    async def clients_orderly(self, group: str, where: dict[str, str], known: dict | None = None) -> dict:
        """{clientId: True/False/None} for the online clients `where` ({clientId: a broker
        that lists it}): from `known` (running infos just read), the cache, else each client's
        running info (3 s at most each; a client that does not answer is None and asked again
        next time)."""
        seen = self._orderly_seen.get(group, {})
        flags = {cid: (known or {}).get(cid, seen.get(cid)) for cid in where}
        ask = [cid for cid, f in flags.items() if f is None and cid not in (known or {})]
        infos = await self.gather(asyncio.wait_for(self.api.consumer_running_info(where[cid], group, cid), 3.0)
                                  for cid in ask)
        for cid, info in zip(ask, infos):
            if isinstance(info, dict):
                flags[cid] = logic.client_orderly(info.get("properties") or {})
        self._orderly_seen[group] = {cid: f for cid, f in flags.items() if f is not None}
        return flags

    async def group_snapshot(self, group: str, masters: dict[str, str]) -> GroupSnapshot:
        """One group's total lag, online clients and TPS over `masters` (the sampler's unit)."""
        stats = await self.gather(self.session.reach(a, self.api.consume_stats, group) for a in masters.values())
        conns = await self.gather(self.session.reach(a, self.api.consumer_connection_list, group)
                                  for a in masters.values())
        lags, tps, errors, ask = [], 0.0, [], []
        for addr, st in zip(masters.values(), stats):
            if isinstance(st, Exception):
                if not _no_group(st):
                    errors.append(str(st))
                continue
            tps += to_float(st.get("consumeTps"))
            for mq, v in object_keyed_table(st, "consume stats", f"broker {addr}").items():
                bo, co = to_int(v.get("brokerOffset")), to_int(v.get("consumerOffset"))
                if co == 0 and bo > 0:
                    ask.append((addr, mq, bo))      # 0 is "no offset" or offset 0: ask exactly
                else:
                    lags.append(logic.queue_lag(bo, co))
        exact = await self.gather(self.session.reach(a, self.api.query_consumer_offset, group, mq) for a, mq, _ in ask)
        for (_a, _mq, bo), co in zip(ask, exact):
            lags.append(logic.queue_lag(bo, co) if isinstance(co, int) else None)
        clients: dict[str, str] = {}
        ctype, model = "", ""
        for addr, cc in zip(masters.values(), conns):
            if isinstance(cc, dict):
                for c in cc.get("connectionSet") or []:
                    clients.setdefault(str(c.get("clientId")), addr)
                ctype = "PULL" if cc.get("consumeType") == "CONSUME_ACTIVELY" else "PUSH"
                model = str(cc.get("messageModel") or "")
        flags = await self.clients_orderly(group, clients)
        config = (await self.subscription_groups()).get(group, False)
        return GroupSnapshot(group, logic.total_lag(lags), len(clients), ctype if clients else "",
                             model if clients else "", tps, "; ".join(errors),
                             logic.orderly_text(config, flags.values()))

    async def group_detail(self, group: str) -> dict:
        masters = await self.masters()
        stats = await self.gather(self.session.reach(a, self.api.consume_stats, group) for a in masters.values())
        queues, errors = [], []
        for (name, addr), st in zip(masters.items(), stats):
            if isinstance(st, Exception):
                if not _no_group(st):
                    errors.append(f"{name}: {st}")
                continue
            for mq, v in object_keyed_table(st, "consume stats", f"broker {addr}").items():
                queues.append((mq, addr, to_int(v.get("brokerOffset")), to_int(v.get("consumerOffset")),
                               to_int(v.get("lastTimestamp"))))
        # consume stats answer 0 for a queue without an offset: ask those queues exactly
        exact = await self.gather(self.session.reach(addr, self.api.query_consumer_offset, group, mq)
                                  for mq, addr, _b, co, _t in queues if co == 0)
        exact_it = iter(exact)
        holders, where, infos = await self._queue_holders(group, masters)
        # (a client whose running info did not come is not asked again for the page)
        flags = await self.clients_orderly(group, where, {
            cid: logic.client_orderly(infos[cid].get("properties") or {}) if cid in infos else None for cid in where})
        config = (await self.subscription_groups()).get(group, False)
        rows = []
        for mq, addr, bo, co, last in sorted(queues):
            if co == 0:
                e = next(exact_it)
                co = e if isinstance(e, int) else 0
            lag = logic.queue_lag(bo, co if co >= 0 else None)
            rows.append({"topic": mq.topic, "broker": mq.broker_name, "queue": mq.queue_id, "broker_offset": bo,
                         "consumer_offset": co if co >= 0 else None, "lag": lag, "lag_text": logic.lag_text(lag),
                         "last": logic.format_ms(last), "client": holders.get(mq, "")})
        clients = await self._clients(group, masters)
        for c in clients:
            c["orderly"] = flags.get(c["id"])
        return {"group": group, "rows": rows, "errors": errors, "clients": clients,
                "orderly": logic.orderly_text(config, flags.values()), "config_orderly": config,
                "topics": sorted({r["topic"] for r in rows if not r["topic"].startswith(RETRY_GROUP_TOPIC_PREFIX)}),
                "total": logic.total_lag(r["lag"] for r in rows)}

    async def _clients(self, group: str, masters: dict[str, str]) -> list[dict]:
        conns = await self.gather(self.session.reach(a, self.api.consumer_connection_list, group)
                                  for a in masters.values())
        seen: dict[str, dict] = {}
        for cc in conns:
            if not isinstance(cc, dict):
                continue
            subs = ", ".join(f"{t}: {sd.get('subString', '')}" for t, sd in sorted((cc.get("subscriptionTable")
                                                                                  or {}).items())
                             if isinstance(sd, dict) and not t.startswith(RETRY_GROUP_TOPIC_PREFIX))
            for c in cc.get("connectionSet") or []:
                cid = str(c.get("clientId", ""))
                seen.setdefault(cid, {"id": cid, "addr": c.get("clientAddr", ""), "language": c.get("language", ""),
                                      "version": version_desc(c.get("version")), "model": cc.get("messageModel", ""),
                                      "type": cc.get("consumeType", ""), "subs": subs})
        return [seen[k] for k in sorted(seen)]

    async def groups_clients(self, groups) -> list[dict]:
        """[{"group", "clients": the _clients rows, "error"}] of at most MAX_TRACE_GROUPS groups
        (a message page's "resend to a group" choices), fetched concurrently."""
        groups = sorted(groups)[:MAX_TRACE_GROUPS]
        masters = await self.masters()
        got = await self.gather(self._clients(g, masters) for g in groups)
        return [{"group": g, "clients": [] if isinstance(c, Exception) else c,
                 "error": str(c) if isinstance(c, Exception) else ""} for g, c in zip(groups, got)]

    async def consume_directly(self, addr: str, msg, group: str, client_id: str):
        """CONSUME_MESSAGE_DIRECTLY through the broker at `addr` (the one storing `msg`): the
        client `client_id` of `group` runs its listener on the message and commits nothing;
        returns its ConsumeMessageDirectlyResult."""
        r = await self.session.call(addr, self.api.consume_message_directly, group, client_id, msg.offset_msg_id,
                                    what=f"resend of {msg.msg_id} to {client_id} of group {group}",
                                    where=f"broker {addr}")
        log.info("console: message %s consumed directly by %s of group %s: %s", msg.msg_id, client_id, group,
                 r.consume_result)
        return r

    async def _queue_holders(self, group: str, masters: dict[str, str]) -> tuple[dict, dict, dict]:
        """({MessageQueue: clientId} from each online client's running info (which queues it
        holds), {clientId: a broker listing it}, {clientId: its running info}); clients that
        cannot say (or time out) are left out of the first and the last."""
        out = {}
        ids = await self.gather(self.session.reach(a, self.api.consumer_id_list, group) for a in masters.values())
        where = {}
        for addr, got in zip(masters.values(), ids):
            if isinstance(got, list):
                for cid in got:
                    where.setdefault(cid, addr)
        infos = await self.gather(asyncio.wait_for(self.api.consumer_running_info(addr, group, cid), 3.0)
                                  for cid, addr in where.items())
        for cid, info in zip(where, infos):
            if isinstance(info, dict):
                for mq in info.get("mqTable") or {}:
                    out[mq] = cid
        return out, where, {cid: info for cid, info in zip(where, infos) if isinstance(info, dict)}

    async def readable_queues(self, topic: str) -> tuple[list, dict[str, str]]:
        """([(MessageQueue, master address)] of every readable queue of the topic, its masters)."""
        route = await self.session.route(topic)
        masters = route_masters(route)
        return [(MessageQueue(topic, qd.broker_name, q), masters[qd.broker_name])
                for qd in sorted(route.queue_datas, key=lambda q: q.broker_name) if qd.broker_name in masters
                for q in range(qd.read_queue_nums)], masters

    async def queue_bounds(self, addr: str, mq: MessageQueue) -> tuple[int, int]:
        """(min offset, max offset) of a queue: both asked at once."""
        lo, hi = await asyncio.gather(self.session.reach(addr, self.api.min_offset, mq),
                                      self.session.reach(addr, self.api.max_offset, mq))
        return lo, hi

    async def reset_preview(self, group: str, topic: str, mode: str, time_ms: int | None) -> list:
        """Per queue of `topic`: current offset -> where INVOKE_BROKER_TO_RESET_OFFSET with that
        timestamp will put it (the broker's own time search), read-only."""
        ts = logic.reset_timestamp_ms(mode, time_ms)
        mqs, masters = await self.readable_queues(topic)

        async def one(mq, addr):
            lo, hi = await self.queue_bounds(addr, mq)
            cur = await self.session.reach(addr, self.api.query_consumer_offset, group, mq)
            found = await self.session.reach(addr, self.api.search_offset, mq, ts) if mode == "time" else None
            return logic.preview_row(mq.broker_name, mq.queue_id, lo, hi, cur if cur >= 0 else None,
                                     logic.reset_target(mode, lo, hi, found))
        got = await self.gather(one(mq, addr) for mq, addr in mqs)
        bad = [g for g in got if isinstance(g, Exception)]
        if bad:
            raise AdminError(f"preview failed: {bad[0]}")
        return got

    async def reset_apply(self, group: str, topic: str, mode: str, time_ms: int | None) -> dict:
        ts = logic.reset_timestamp_ms(mode, time_ms)
        masters = route_masters(await self.session.route(topic))
        out = {}
        for name, addr in masters.items():
            table = await self.session.call(addr, self.api.reset_offset, ResetOffsetRequest(topic, group, ts, True),
                                            what=f"reset offsets of {group} on {topic}", where=f"broker {name} {addr}")
            out.update(table)
        self.invalidate()
        log.info("console: reset offsets of group %s on topic %s (%s)", group, topic, mode)
        return out

    # -- messages ----------------------------------------------------------------------------
    async def by_id(self, msg_id: str, topic: str | None):
        route = await self.session.route(topic) if topic else None
        try:
            return await view_route(self.api, msg_id, topic, route)
        except RemotingFailure as e:
            raise AdminError(f"lookup of {msg_id} failed: cannot reach a broker ({e})") from None
        except BrokerError as e:
            raise AdminError(f"lookup of {msg_id} failed: {e}") from None

    async def by_key(self, topic: str, key: str, begin_ms: int, end_ms: int | None) -> list:
        route = await self.session.route(topic)
        try:
            return await query_route(self.api, route, topic, key, MAX_LIST, begin_ms, end_ms)
        except (RemotingFailure, BrokerError) as e:
            raise AdminError(f"query of key {key} failed: {e}") from None

    async def queue_ranges(self, topic: str, begin_ms: int | None, end_ms: int | None) -> list:
        """(ScanRange, addr) per readable queue of the topic: [offset at begin, offset at end)."""
        mqs, masters = await self.readable_queues(topic)

        async def one(mq, addr):
            lo, hi = await self.queue_bounds(addr, mq)
            # the broker's time search answers the offset whose store time is *nearest*: the
            # first message at or after `begin` is that one or the next, the last one at or
            # before `end` that one or the one before; one more each side, the readers then
            # keep only the messages stored inside [begin, end] (logic.in_time_range)
            if begin_ms is not None:
                lo = max(lo, await self.session.reach(addr, self.api.search_offset, mq, begin_ms) - 1)
            if end_ms is not None:
                hi = min(hi, await self.session.reach(addr, self.api.search_offset, mq, end_ms) + 2)
            return logic.ScanRange(mq.broker_name, mq.queue_id, lo, max(lo, hi))
        got = await self.gather(one(mq, addr) for mq, addr in mqs)
        for g in got:
            if isinstance(g, Exception):
                raise AdminError(f"offset lookup of topic {topic} failed: {g}")
        return [(g, masters[g.broker_name]) for g in got]

    async def pull(self, addr: str, topic: str, r: logic.ScanRange, offset: int, n: int,
                   expression: str = "*", expression_type: str = "TAG", suspend_ms: int = 0,
                   timeout_s: float | None = None) -> PullResult:
        """One PULL_MESSAGE that commits nothing (READ_GROUP, no commit flag)."""
        mq = MessageQueue(topic, r.broker_name, r.queue_id)
        t = timeout_s or self.api.timeout_s
        req = PullRequest(addr, READ_GROUP, mq, offset, n, pull_sys_flag(False, suspend_ms > 0, True), 0,
                          suspend_ms, expression, 0, t, expression_type)
        try:
            res = await self.api.pull_message(req)
        except RemotingFailure as e:
            raise AdminError(f"cannot reach broker {addr} ({self.session.reason(e, addr)})") from None
        # records as a consumer sees them: with their broker's name (the resume points of a
        # live tail and the pages' queue columns name it)
        res.records = [MessageExt.from_record(m, r.broker_name) for m in res.records]
        return res

    async def read_ranges(self, topic: str, plan: list, addrs: dict, limit: int, begin_ms: int | None = None,
                          end_ms: int | None = None) -> list:
        """The messages of bounded ranges stored in [begin, end] (at most `limit`), newest first."""
        async def one(r):
            out, off = [], r.first
            while off < r.stop:
                res = await self.pull(addrs[r.broker_name], topic, r, off, min(PULL_BATCH, r.stop - off))
                if res.status != PullResult.FOUND:
                    if res.status == PullResult.OFFSET_ILLEGAL or res.next_begin_offset <= off:
                        break
                    off = res.next_begin_offset
                    continue
                out += [m for m in res.records
                        if m.queue_offset < r.stop and logic.in_time_range(m.store_timestamp, begin_ms, end_ms)]
                off = res.next_begin_offset
            return out
        got = await self.gather(one(r) for r in plan)
        msgs = [m for g in got if not isinstance(g, Exception) for m in g]
        msgs.sort(key=lambda m: (m.store_timestamp, m.commit_log_offset), reverse=True)
        return msgs[:limit]

    async def by_time(self, topic: str, begin_ms: int | None, end_ms: int | None, limit: int = 100) -> tuple:
        """The newest `limit` messages stored in [begin, end] (limit shared over the queues)."""
        ranges = await self.queue_ranges(topic, begin_ms, end_ms)
        addrs = {r.broker_name: a for r, a in ranges}
        plan, cut = logic.scan_plan([r for r, _ in ranges], min(limit, MAX_LIST))
        return await self.read_ranges(topic, plan, addrs, limit, begin_ms, end_ms), cut

    async def view(self, addr: str, commit_log_offset: int):
        """The record at a broker's commit log offset, named with the broker's name (a record
        read back from %RETRY% shows its original topic, `real_topic` where it is stored)."""
        try:
            m = await self.session.reach(addr, self.api.view_message, commit_log_offset)
        except BrokerError as e:
            raise MessageNotFoundError(f"no message at commit log offset {commit_log_offset} on {addr}: "
                                       f"{e.remark or e}") from None
        brokers, _ = await self.cluster_info()
        name = next((n for n, bd in brokers.items() if addr in bd.broker_addrs.values()), "")
        return MessageExt.from_record(m, name)

    async def trace(self, msg) -> list:
        """The message's copies in the %RETRY% and %DLQ% topics of the groups consuming its topic
        (found by its UNIQ_KEY, which a send-back keeps; ORIGIN_MESSAGE_ID names the first)."""
        uniq = msg.properties.get(UNIQ_KEY)
        origin_topic = msg.properties.get(RETRY_TOPIC) or msg.topic
        if not uniq:
            return []
        groups = set()
        masters = await self.masters()
        for g in await self.gather(self.session.reach(a, self.api.query_topic_consume_by_who, origin_topic)
                                   for a in masters.values()):
            if not isinstance(g, Exception):
                groups.update(g)
        topics = [p + g for g in sorted(groups)[:MAX_TRACE_GROUPS]
                  for p in (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)]
        names = set(await self.session.topic_list())      # fresh: a DLQ topic appears with its first letter

        async def one(t):
            route = await self.session.find_route(t)
            if route is None:
                return []
            return await query_route(self.api, route, t, uniq, 32, 0, None, unique_key=True)
        found = await self.gather(one(t) for t in topics if t in names)
        out = []
        for t, got in zip([t for t in topics if t in names], found):
            if isinstance(got, Exception):
                continue
            for m in got:
                if m.commit_log_offset != msg.commit_log_offset:
                    out.append((t, m))
        out.sort(key=lambda tm: tm[1].store_timestamp)
        return out

    # -- ACL ---------------------------------------------------------------------------------
    async def every_broker(self) -> list[tuple[str, str]]:
        """(brokerName/id, address) of every master and slave: ACL writes go to all, as
        mqadmin -c does (each broker keeps its own plain_acl.yml)."""
        brokers, _ = await self.cluster_info()
        return [(f"{n}/{bid}", a) for n, bd in sorted(brokers.items()) for bid, a in sorted(bd.broker_addrs.items())]

    async def acl(self) -> dict:
        """The first master's ACL: the global white list and the accounts without secrets."""
        masters = await self.masters()
        if not masters:
            raise AdminError("no master broker is registered on the nameserver")
        name, addr = next(iter(masters.items()))
        try:
            d = await self.session.call(addr, self.api.acl_config, what="ACL config", where=f"broker {name} {addr}")
        except AdminError as e:
            if "does not enable acl" in str(e):      # Java's and pocketmq's answer with aclEnable=false
                return {"broker": name, "off": True, "white": [], "accounts": []}
            raise
        accounts = [logic.public_account(a) for a in (d.get("plainAccessConfigs") or []) if isinstance(a, dict)]
        return {"broker": name, "white": d.get("globalWhiteAddrs") or [],
                "accounts": sorted(accounts, key=lambda a: str(a.get("accessKey")))}

    async def acl_write(self, what: str, method, *args) -> list[str]:
        done = []
        for name, addr in await self.every_broker():
            await self.session.call(addr, method, *args, what=what, where=f"broker {name} {addr}")
            done.append(name)
        return done

    # -- DLQ ---------------------------------------------------------------------------------
    async def dlq(self, group: str, limit: int) -> tuple[list, int]:
        """The newest `limit` dead letters of the group and how many it holds."""
        topic = DLQ_GROUP_TOPIC_PREFIX + group
        if await self.session.find_route(topic) is None:
            return [], 0
        ranges = await self.queue_ranges(topic, None, None)
        addrs = {r.broker_name: a for r, a in ranges}
        total = sum(r.stop - r.first for r, _ in ranges)
        plan, _ = logic.scan_plan([r for r, _ in ranges], limit)
        return await self.read_ranges(topic, plan, addrs, limit), total

    async def resend_original(self, msg) -> object:
        """A dead letter (or retry copy) sent again to its original topic, body, tags, keys and
        user properties kept, RESENT_FROM naming the first copy."""
        props = msg.properties
        topic = props.get(RETRY_TOPIC) or msg.topic
        # ORIGIN_MESSAGE_ID is a system property a producer may not set: the first copy's id
        # goes in a user property
        user = dict(msg.user_properties)
        user.setdefault(RESENT_FROM, props.get(ORIGIN_MESSAGE_ID) or msg.msg_id)
        return await self.send(topic, msg.body, msg.tags or None, " ".join(msg.keys) or None, user)


def _no_group(e: Exception) -> bool:
    """A broker that never saw the group answers consume stats / connections with an error
    that only means "nothing here"."""
    return isinstance(e, (BrokerError, AdminError)) and ("not exist" in str(e) or "not online" in str(e)
                                                          or "CONSUMER_NOT_ONLINE" in str(e))


SYSTEM_GROUPS = {"TOOLS_CONSUMER", "FILTERSRV_CONSUMER", "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY",
                 "CID_ONSAPI_PERMISSION", "CID_ONSAPI_OWNER", "CID_ONSAPI_PULL", "CID_RMQ_SYS_TRANS",
                 "SCHEDULE_CONSUMER"}


def is_system_group(g: str) -> bool:
    return g in SYSTEM_GROUPS


def topic_kind(t: str) -> str:
    if t.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return "retry"
    if t.startswith(DLQ_GROUP_TOPIC_PREFIX):
        return "dlq"
    if t in ("TBW102", "SCHEDULE_TOPIC_XXXX", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "BenchmarkTest",
             "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
             "rmq_sys_wheel_timer") or t.startswith("rmq_sys_") or t.startswith("RMQ_SYS_"):
        return "system"
    return "normal"


def perm_text(perm: int) -> str:
    return ("R" if PermName.readable(perm) else "-") + ("W" if PermName.writeable(perm) else "-")


def replication_text(t: dict) -> str:
    """Replication lag from a broker's runtime info: a master's per-slave bytes behind, a
    slave's bytes and ms behind its master; '' without replicas."""
    if "haLagBytes" in t:
        lag_bytes, lag_ms, master = to_int(t.get("haLagBytes")), to_int(t.get("haLagMillis")), t.get("haMasterAddr", "")
        if lag_bytes < 0 or lag_ms < 0:      # -1: the slave has not heard its master yet (never shown as -1)
            return f"lag not known yet (no frame from {master or 'its master'} so far)"
        return f"{lag_bytes} B / {lag_ms} ms behind {master}"
    lags = [(k[len("haSlaveLagBytes_"):], to_int(v)) for k, v in sorted(t.items()) if k.startswith("haSlaveLagBytes_")]
    if lags:
        return "; ".join(f"slave {a}: {b} B behind" if b >= 0 else f"slave {a}: lag not known yet" for a, b in lags)
    return ""
