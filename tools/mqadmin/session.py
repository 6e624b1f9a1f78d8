"""AdminSession: what every mqadmin command talks through (RocketMQ's MQAdminExt).

A session is a client.ClientInstance that is never started (no timers, no heartbeat:
nothing is registered) and its ClientAPI (`session.api`), which builds every request.
This module only adds what a console needs on top:

- the nameservers of `-n` are asked in the order given; the next one is tried only when
  one cannot be reached (an error response is final), and when none answers the error
  names every one with its reason (the client's own rotation starts at the last one that
  worked and reports only the last failure, right for a long-lived client, not for this);
- client exceptions become AdminError lines (tools/mqadmin/errors.py);
- the lookups several commands share: routes, cluster info, master addresses.
"""
from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pocketmq.client.errors import BrokerError, RemotingFailure
from pocketmq.client.instance import ClientInstance, local_ip
from pocketmq.protocol.bodies import TopicRouteData, object_keyed_items
from pocketmq.protocol.codes import SerializeType
from pocketmq.protocol.errors import BodyError
from pocketmq.remoting.client import split_addr
from pocketmq.tools.mqadmin.errors import (
    AdminError,
    UsageError,
    failed,
    transport_reason,
)

# mqadmin waits 5 s for an answer (the client's requests default to 3 s), as it always has.
REQUEST_TIMEOUT_S = 5.0

T = TypeVar("T")

NO_NAMESRV = "no nameserver address: pass -n ip:port[;ip:port] or set NAMESRV_ADDR"


def parse_namesrv_addrs(namesrv: str | None) -> list[str]:
    """`-n ip:port[;ip:port]` -> the addresses, in order; UsageError when malformed."""
    if namesrv is None:
        return []
    addrs = [a.strip() for a in namesrv.split(";") if a.strip()]
    if not addrs:
        raise UsageError("empty nameserver address; expected ip:port[;ip:port]")
    for a in addrs:
        try:
            split_addr(a)
        except ValueError:
            raise UsageError(f"bad nameserver address {a!r}; expected ip:port") from None
    return addrs


class AdminSession:
    def __init__(self, namesrv: str | None, *, credentials=None, tls=None):
        self.namesrv_addrs = parse_namesrv_addrs(namesrv)
        # busy_poll_us=0: a console waits for one answer at a time, spinning saves nothing.
        # JSON headers, fixed: a codec negotiation would cost every broker one more request
        # (and, on a broker that does not answer, a second timeout before the real one).
        self.instance = ClientInstance(f"{local_ip()}@mqadmin-{os.getpid()}", ";".join(self.namesrv_addrs),
                                       busy_poll_us=0, serialize_type=SerializeType.JSON,
                                       credentials=credentials, tls=tls)
        self.api = self.instance.api
        self.api.timeout_s = REQUEST_TIMEOUT_S

    async def close(self) -> None:
        await self.instance.close()

    def reason(self, e: BaseException, addr: str) -> str:
        return transport_reason(e, REQUEST_TIMEOUT_S, addr, self.instance.remoting.connect_timeout_s)

    # -- one server ------------------------------------------------------------------------
    async def reach(self, addr: str, method: Callable[..., Awaitable[T]], *args, role: str = "broker") -> T:
        """`method(addr, *args)` (a ClientAPI broker method); a bad address or a transport
        failure becomes an AdminError, an error response stays a BrokerError."""
        try:
            split_addr(addr)
        except ValueError as e:
            raise AdminError(f"bad {role} address {addr!r}: {e}") from None
        try:
            return await method(addr, *args)
        except RemotingFailure as e:
            raise AdminError(f"cannot reach {role} {addr} ({self.reason(e, addr)})") from None

    async def call(self, addr: str, method: Callable[..., Awaitable[T]], *args, what: str, where: str) -> T:
        """reach(), and an error response becomes "<what> failed: ... (<CODE> from <where>)"."""
        try:
            return await self.reach(addr, method, *args)
        except BrokerError as e:
            raise failed(e, what, where) from None

    # -- nameservers -----------------------------------------------------------------------
    async def namesrv(self, method: Callable[..., Awaitable[T]], *args, what: str) -> T:
        """`method(*args, namesrv_addr=...)` on the first nameserver that can be reached."""
        if not self.namesrv_addrs:
            raise UsageError(NO_NAMESRV)
        unreachable = []
        for addr in self.namesrv_addrs:
            try:
                return await method(*args, namesrv_addr=addr)
            except RemotingFailure as e:
                unreachable.append(f"{addr} ({self.reason(e, addr)})")
            except BrokerError as e:
                raise failed(e, what, "nameserver") from None
        if len(unreachable) == 1:
            raise AdminError(f"cannot reach nameserver {unreachable[0]}")
        raise AdminError("cannot reach any nameserver: " + "; ".join(unreachable))

    async def every_namesrv(self, method: Callable[..., Awaitable[None]], *args, what: str) -> None:
        """`method(*args, namesrv_addr=...)` on each nameserver (writes every one must see)."""
        for addr in self.namesrv_addrs:
            await self.one_namesrv(addr, method, *args, what=what)

    async def one_namesrv(self, addr: str, method: Callable[..., Awaitable[T]], *args, what: str) -> T:
        """`method(*args, namesrv_addr=addr)`; failures become AdminError lines."""
        try:
            return await method(*args, namesrv_addr=addr)
        except RemotingFailure as e:
            raise AdminError(f"cannot reach nameserver {addr} ({self.reason(e, addr)})") from None
        except BrokerError as e:
            raise failed(e, what, f"nameserver {addr}") from None

    # -- shared lookups --------------------------------------------------------------------
    async def find_route(self, topic: str) -> TopicRouteData | None:
        """The topic's route, None when the nameserver does not know it."""
        try:
            return await self.namesrv(self.api.get_route, topic, what=f"route lookup of topic {topic}")
        except ValueError as e:         # BodyError, or a body that is not UTF-8
            raise AdminError(f"unreadable route of topic {topic} from nameserver: {e}") from None

    async def route(self, topic: str) -> TopicRouteData:
        route = await self.find_route(topic)
        if route is None:
            raise topic_not_exist(topic)
        return route

    async def route_json(self, topic: str) -> dict:
        """The route as the nameserver's JSON object (topicRoute prints it)."""
        d = await self.namesrv(self.api.get_route_json, topic, what=f"route lookup of topic {topic}")
        if d is None:
            raise topic_not_exist(topic)
        return d

    async def cluster_info(self) -> tuple[dict, dict]:
        """({brokerName: BrokerData}, {cluster: [brokerName]})."""
        return await self.namesrv(self.api.cluster_info, what="cluster info")

    async def topic_list(self) -> list[str]:
        return await self.namesrv(self.api.topic_list, what="topic list")

    async def cluster_masters(self, cluster: str) -> dict[str, str]:
        """brokerName -> master address of every broker of `cluster`."""
        brokers, clusters = await self.cluster_info()
        if cluster not in clusters:
            known = ", ".join(sorted(clusters)) or "none"
            raise AdminError(f"cluster {cluster} not found on the nameserver (known clusters: {known})")
        out = {}
        for name in sorted(clusters[cluster]):
            bd = brokers.get(name)
            if bd is not None and bd.master_addr():
                out[name] = bd.master_addr()
        if not out:
            raise AdminError(f"cluster {cluster} has no master broker online")
        return out

    async def broker_or_cluster(self, broker_addr: str | None, cluster: str | None, command: str) -> list[str]:
        """The broker addresses a `-b brokerAddr | -c clusterName` command works on: the one
        given, or every master of the cluster. UsageError when neither is given."""
        if broker_addr:
            return [broker_addr]
        if cluster:
            return list((await self.cluster_masters(cluster)).values())
        raise UsageError(f"{command} needs -b brokerAddr or -c clusterName")

    async def all_masters(self) -> dict[str, str]:
        brokers, _ = await self.cluster_info()
        return {n: bd.master_addr() for n, bd in sorted(brokers.items()) if bd.master_addr()}


def topic_not_exist(topic: str) -> AdminError:
    return AdminError(f"topic {topic} does not exist (TOPIC_NOT_EXIST from nameserver)")


def route_masters(route: TopicRouteData) -> dict[str, str]:
    return {bd.broker_name: bd.master_addr() for bd in sorted(route.broker_datas, key=lambda b: b.broker_name)
            if bd.master_addr()}


# -- reading broker answers (lenient: a missing number shows as 0, not as a crash) ------------

def object_keyed_table(d, what: str, where: str) -> dict:
    """{MessageQueue-object-key: value} (fastjson form) -> {MessageQueue: value}."""
    table = d.get("offsetTable") if isinstance(d, dict) else None
    try:
        out = dict(object_keyed_items(table or {}))
    except (BodyError, ValueError) as e:
        raise AdminError(f"unreadable {what} from {where}: {e}") from None
    for v in out.values():
        if not isinstance(v, dict):
            raise AdminError(f"unreadable {what} from {where}: entry {v!r} is not an object")
    return out


def to_int(v, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def to_float(v, default: float = 0.0) -> float:
    try:
        return float(str(v).split()[0])
    except (TypeError, ValueError, IndexError):
        return default
