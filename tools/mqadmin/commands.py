"""`mqadmin`: RocketMQ's admin console, same command names and flag letters.

    mqadmin <command> [-n ip:port[;ip:port]] [flags]
    mqadmin help [<command>]

Commands: updateTopic, deleteTopic, topicList, topicRoute, topicStatus,
clusterList, consumerProgress, resetOffsetByTime, sendMessage, queryMsgById.

`-n` defaults to the NAMESRV_ADDR environment variable. Exit codes: 0 success,
1 the operation failed (unreachable server, error response, not found),
2 bad command line. Every failure is one `mqadmin: ...` line on stderr;
set MQADMIN_DEBUG=1 to get tracebacks and remoting logs as well.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pocketmq.common.constants import AUTO_CREATE_TOPIC_KEY_TOPIC, RETRY_GROUP_TOPIC_PREFIX
from pocketmq.tools.mqadmin import tables
from pocketmq.protocol.bodies import (MessageQueue, TopicRouteData, decode_cluster_info, decode_reset_offset_body, loads,
                             object_keyed_items)
from pocketmq.protocol.codes import PermName, RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.errors import BodyError
from pocketmq.protocol.headers.typed import SendMessageRequestHeader, encode_send_header
from pocketmq.protocol.message import (
    decode_offset_msg_id,
    decode_record,
    encode_properties,
    maybe_compress,
    offset_msg_id,
    parse_host,
)
from pocketmq.remoting.client import RemotingClient, split_addr
from pocketmq.remoting.connection import RemotingError, RequestTimeout

PROG = "mqadmin"
CONNECT_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 5.0
DEFAULT_TOPIC = AUTO_CREATE_TOPIC_KEY_TOPIC
ORDER_TOPIC_CONFIG_NAMESPACE = "ORDER_TOPIC_CONFIG"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class AdminError(Exception):
    """An operation failed; the message is what the user sees."""
    exit_code = EXIT_FAILED


class UsageError(AdminError):
    exit_code = EXIT_USAGE


# --------------------------------------------------------------------------- UNIQ_KEY

def _uniq_id_source() -> Callable[[], str]:
    try:
        from pocketmq.client.message import UniqIdGenerator
        return UniqIdGenerator().next_id
    except Exception:  # noqa: BLE001 - any failure there must not break mqadmin
        return _FallbackUniqId().next_id


class _FallbackUniqId:
    """32 upper-case hex chars: ip(4) + pid(2) + random(4) + ms(4) + counter(2)."""

    def __init__(self):
        import socket
        try:
            ip = socket.inet_aton(socket.gethostbyname(socket.gethostname()))
        except OSError:
            ip = b"\x7f\x00\x00\x01"
        self._prefix = (ip + (os.getpid() & 0xFFFF).to_bytes(2, "big")
                        + random.getrandbits(32).to_bytes(4, "big")).hex().upper()
        self._counter = random.getrandbits(15)

    def next_id(self) -> str:
        self._counter = (self._counter + 1) & 0xFFFF
        return f"{self._prefix}{int(time.time() * 1000) & 0xFFFFFFFF:08X}{self._counter:04X}"


# --------------------------------------------------------------------------- errors

def code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"code {code}"


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def transport_reason(e: BaseException, timeout_s: float = REQUEST_TIMEOUT_S) -> str:
    """Short human reason for a remoting failure."""
    if isinstance(e, RequestTimeout):
        return f"no response within {timeout_s:g}s"
    text = str(e)
    low = text.lower()
    if "errno 111" in low or "refused" in low or "errno 61]" in low:
        return "connection refused"
    if low.endswith(": timeout"):
        return f"connect timed out after {CONNECT_TIMEOUT_S:g}s"
    if "errno 113" in low or "no route to host" in low:
        return "no route to host"
    if "errno 101" in low or "network is unreachable" in low:
        return "network unreachable"
    if "name or service not known" in low or "nodename nor servname" in low or "errno -2" in low \
            or "errno -3" in low or "errno -5" in low:
        return "unknown host"
    if "closed" in low:
        return "connection closed by the server"
    if text.startswith("cannot connect to ") and ": " in text:
        return text.split(": ", 1)[1]
    return _one_line(text) or type(e).__name__


# --------------------------------------------------------------------------- the admin client

class Admin:
    """Request helpers over one RemotingClient; every failure becomes an AdminError."""

    def __init__(self, namesrv: str | None, timeout_s: float = REQUEST_TIMEOUT_S):
        self.timeout_s = timeout_s
        self.client = RemotingClient(connect_timeout_s=CONNECT_TIMEOUT_S)
        self.namesrv_addrs: list[str] = []
        if namesrv is not None:
            addrs = [a.strip() for a in namesrv.split(";") if a.strip()]
            if not addrs:
                raise UsageError("empty nameserver address; expected ip:port[;ip:port]")
            for a in addrs:
                try:
                    split_addr(a)
                except ValueError:
                    raise UsageError(f"bad nameserver address {a!r}; expected ip:port") from None
            self.namesrv_addrs = addrs
            self.client.set_namesrv_addr(addrs)

    async def close(self) -> None:
        await self.client.close()

    # -- raw calls ---------------------------------------------------------------------
    async def call(self, addr: str, code: int, ext: dict | None = None, body: bytes = b"",
                   role: str = "broker") -> RemotingCommand:
        cmd = RemotingCommand(int(code), ext_fields={k: str(v) for k, v in (ext or {}).items()}, body=body)
        try:
            return await self.client.invoke(addr, cmd, self.timeout_s)
        except RemotingError as e:
            raise AdminError(f"cannot reach {role} {addr} ({transport_reason(e, self.timeout_s)})") from None
        except ValueError as e:
            raise AdminError(f"bad {role} address {addr!r}: {e}") from None

    async def ns(self, code: int, ext: dict | None = None, body: bytes = b"") -> RemotingCommand:
        """First nameserver that answers (in the order given)."""
        if not self.namesrv_addrs:
            raise UsageError("no nameserver address: pass -n ip:port[;ip:port] or set NAMESRV_ADDR")
        failures = []
        for addr in self.namesrv_addrs:
            try:
                return await self.call(addr, code, ext, body, role="nameserver")
            except AdminError as e:
                failures.append((addr, str(e)))
        if len(failures) == 1:
            raise AdminError(failures[0][1])
        raise AdminError("cannot reach any nameserver: " + "; ".join(
            m.removeprefix("cannot reach nameserver ") for _, m in failures))

    @staticmethod
    def check(resp: RemotingCommand, what: str, where: str) -> RemotingCommand:
        if resp.code != ResponseCode.SUCCESS:
            remark = _one_line(resp.remark) or "no details"
            raise AdminError(f"{what} failed: {remark} ({code_name(resp.code)} from {where})")
        return resp

    @staticmethod
    def parse(resp: RemotingCommand, what: str, where: str):
        try:
            return loads(resp.body_bytes() or b"{}")
        except (BodyError, ValueError) as e:
            raise AdminError(f"unreadable {what} from {where}: {e}") from None

    # -- nameserver queries ---------------------------------------------------------------
    async def route(self, topic: str) -> TopicRouteData:
        resp = await self.ns(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            raise AdminError(f"topic {topic} does not exist (TOPIC_NOT_EXIST from nameserver)")
        self.check(resp, f"route lookup of topic {topic}", "nameserver")
        if not resp.body:
            raise AdminError(f"topic {topic} has no route (empty answer from nameserver)")
        try:
            return TopicRouteData.from_body(resp.body_bytes())
        except (BodyError, ValueError) as e:
            raise AdminError(f"unreadable route of topic {topic} from nameserver: {e}") from None

    async def route_raw(self, topic: str):
        resp = await self.ns(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            raise AdminError(f"topic {topic} does not exist (TOPIC_NOT_EXIST from nameserver)")
        self.check(resp, f"route lookup of topic {topic}", "nameserver")
        return self.parse(resp, f"route of topic {topic}", "nameserver")

    async def cluster_info(self) -> tuple[dict, dict]:
        resp = self.check(await self.ns(RequestCode.GET_BROKER_CLUSTER_INFO),
                          "cluster info", "nameserver")
        try:
            return decode_cluster_info(resp.body_bytes() or b"{}")
        except (BodyError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise AdminError(f"unreadable cluster info from nameserver: {e}") from None

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

    async def all_masters(self) -> dict[str, str]:
        brokers, _ = await self.cluster_info()
        return {n: bd.master_addr() for n, bd in sorted(brokers.items()) if bd.master_addr()}


def route_masters(route: TopicRouteData) -> dict[str, str]:
    return {bd.broker_name: bd.master_addr() for bd in sorted(route.broker_datas, key=lambda b: b.broker_name)
            if bd.master_addr()}


def _object_keyed_table(d, what: str, where: str) -> dict:
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


def _int(v, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _float(v, default: float = 0.0) -> float:
    try:
        return float(str(v).split()[0])
    except (TypeError, ValueError, IndexError):
        return default


# --------------------------------------------------------------------------- commands

Out = Callable[[str], None]


@dataclass
class Opt:
    short: str
    long: str
    help: str
    required: bool = False
    takes_value: bool = True
    type: Callable | None = None
    default: object = None
    metavar: str | None = None
    dest: str | None = None


@dataclass
class Command:
    name: str
    desc: str
    opts: list[Opt]
    run: Callable[[Admin, argparse.Namespace, Out], Awaitable[None]]
    needs_namesrv: bool = True
    epilog: str | None = None
    parser: argparse.ArgumentParser | None = field(default=None, repr=False)


def _positive_int(s: str) -> int:
    try:
        v = int(s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{s!r} must be positive")
    return v


def _non_negative_int(s: str) -> int:
    try:
        v = int(s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{s!r} must not be negative")
    return v


def _perm(s: str) -> int:
    try:
        v = int(s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer (2=W, 4=R, 6=RW)") from None
    if not 0 <= v <= 15:
        raise argparse.ArgumentTypeError(f"{s!r} is not a permission (2=W, 4=R, 6=RW)")
    return v


def _java_bool(s: str) -> bool:
    """Boolean.parseBoolean: true only for "true" (any case)."""
    return s.strip().lower() == "true"


def _stripped(s: str) -> str:
    v = s.strip()
    if not v:
        raise argparse.ArgumentTypeError("must not be empty")
    return v


# -- topics ----------------------------------------------------------------------------------

async def cmd_update_topic(admin: Admin, a, out: Out) -> None:
    if not a.brokerAddr and not a.clusterName:
        raise UsageError("updateTopic needs -c clusterName or -b brokerAddr")
    sys_flag = (1 if a.unit else 0) | (2 if a.hasUnitSub else 0)
    ext = {"topic": a.topic, "defaultTopic": DEFAULT_TOPIC, "readQueueNums": a.readQueueNums,
           "writeQueueNums": a.writeQueueNums, "perm": a.perm, "topicFilterType": "SINGLE_TAG",
           "topicSysFlag": sys_flag, "order": "true" if a.order else "false"}
    if a.brokerAddr:
        targets = {None: a.brokerAddr}
    else:
        targets = await admin.cluster_masters(a.clusterName)
    for addr in targets.values():
        resp = await admin.call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
        admin.check(resp, f"create topic {a.topic}", f"broker {addr}")
        out(f"create topic to {addr} success.")
    if a.order:
        if a.brokerAddr:
            brokers, _ = await admin.cluster_info()
            names = [n for n, bd in brokers.items() if a.brokerAddr in bd.broker_addrs.values()]
            if not names:
                raise AdminError(f"broker {a.brokerAddr} is not registered on the nameserver; "
                                 f"cannot set the order config of {a.topic}")
            conf = f"{names[0]}:{a.writeQueueNums}"
        else:
            conf = ";".join(f"{n}:{a.writeQueueNums}" for n in sorted(targets))
        for ns_addr in admin.namesrv_addrs:
            resp = await admin.call(ns_addr, RequestCode.PUT_KV_CONFIG,
                                    {"namespace": ORDER_TOPIC_CONFIG_NAMESPACE, "key": a.topic, "value": conf},
                                    role="nameserver")
            admin.check(resp, f"set order config of {a.topic}", f"nameserver {ns_addr}")
        out(f"set {'broker' if a.brokerAddr else 'cluster'} orderConf. isOrder=true, orderConf=[{conf}]")
    out(tables.topic_config_line(a.topic, a.readQueueNums, a.writeQueueNums, a.perm, "SINGLE_TAG",
                                 sys_flag, a.order))


async def cmd_delete_topic(admin: Admin, a, out: Out) -> None:
    masters = await admin.cluster_masters(a.clusterName)
    for name, addr in masters.items():
        resp = await admin.call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": a.topic})
        admin.check(resp, f"delete topic {a.topic}", f"broker {name} {addr}")
    out(f"delete topic [{a.topic}] from cluster [{a.clusterName}] success.")
    for ns_addr in admin.namesrv_addrs:
        resp = await admin.call(ns_addr, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": a.topic},
                                role="nameserver")
        admin.check(resp, f"delete topic {a.topic}", f"nameserver {ns_addr}")
    out(f"delete topic [{a.topic}] from NameServer success.")


async def cmd_topic_list(admin: Admin, a, out: Out) -> None:
    resp = admin.check(await admin.ns(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), "topic list", "nameserver")
    d = admin.parse(resp, "topic list", "nameserver")
    topics = d.get("topicList") if isinstance(d, dict) else None
    for t in sorted(str(t) for t in (topics or [])):
        out(t)


async def cmd_topic_route(admin: Admin, a, out: Out) -> None:
    out(tables.format_json(await admin.route_raw(a.topic)))


async def cmd_topic_status(admin: Admin, a, out: Out) -> None:
    route = await admin.route(a.topic)
    masters = route_masters(route)
    if not masters:
        raise AdminError(f"topic {a.topic} has no master broker in its route")
    merged = {}
    for name, addr in masters.items():
        resp = await admin.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": a.topic})
        if resp.code == ResponseCode.TOPIC_NOT_EXIST:
            raise AdminError(f"topic {a.topic} does not exist on broker {name} {addr} (TOPIC_NOT_EXIST)")
        admin.check(resp, f"topic stats of {a.topic}", f"broker {name} {addr}")
        merged.update(_object_keyed_table(admin.parse(resp, "topic stats", f"broker {addr}"),
                                          "topic stats", f"broker {addr}"))
    rows = [(mq.broker_name, mq.queue_id, _int(v.get("minOffset")), _int(v.get("maxOffset")),
             tables.human_ms(_int(v.get("lastUpdateTimestamp"))))
            for mq, v in sorted(merged.items())]
    out(tables.format_table(["#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"], rows))


# -- cluster ---------------------------------------------------------------------------------

def _runtime_numbers(t: dict) -> tuple[str, float | None, float | None, int | None, int | None]:
    version = str(t.get("brokerVersionDesc", "")) or "?"
    in_tps = _float(t["putTps"]) if "putTps" in t else None
    out_tps = _float(t["getTransferedTps"]) if "getTransferedTps" in t else None

    def today(prefix):
        now = t.get(f"{prefix}TodayNow")
        if now is None:
            return None
        return _int(now) - _int(t.get(f"{prefix}TodayMorning"), 0)

    return version, in_tps, out_tps, today("msgPutTotal"), today("msgGetTotal")


async def cmd_cluster_list(admin: Admin, a, out: Out) -> None:
    brokers, clusters = await admin.cluster_info()
    rows = []
    warnings = []
    for cluster in sorted(clusters):
        for name in sorted(clusters[cluster]):
            bd = brokers.get(name)
            if bd is None:
                continue
            for bid, addr in sorted(bd.broker_addrs.items()):
                version, in_tps, out_tps, in_total, out_total = "-", None, None, None, None
                try:
                    resp = await admin.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
                    admin.check(resp, "runtime info", f"broker {name} {addr}")
                    d = admin.parse(resp, "runtime info", f"broker {addr}")
                    table = d.get("table") if isinstance(d, dict) else None
                    version, in_tps, out_tps, in_total, out_total = _runtime_numbers(table or {})
                except AdminError as e:
                    warnings.append(str(e))
                rows.append((cluster, name, bid, addr, version,
                             "-" if in_tps is None else f"{in_tps:.2f}",
                             "-" if out_tps is None else f"{out_tps:.2f}",
                             "-" if in_total is None else in_total,
                             "-" if out_total is None else out_total))
    out(tables.format_table(["#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTPS",
                             "#OutTPS", "#InTotalToday", "#OutTotalToday"], rows))
    for w in warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)


# -- consumers -------------------------------------------------------------------------------

async def _consume_stats(admin: Admin, group: str, topic: str | None,
                         masters: dict[str, str]) -> tuple[dict, float]:
    merged, tps = {}, 0.0
    ext = {"consumerGroup": group}
    if topic:
        ext["topic"] = topic
    for name, addr in masters.items():
        resp = await admin.call(addr, RequestCode.GET_CONSUME_STATS, ext)
        admin.check(resp, f"consume stats of group {group}", f"broker {name} {addr}")
        d = admin.parse(resp, "consume stats", f"broker {addr}")
        merged.update(_object_keyed_table(d, "consume stats", f"broker {addr}"))
        tps += _float(d.get("consumeTps", 0) if isinstance(d, dict) else 0)
    return merged, tps


async def cmd_consumer_progress(admin: Admin, a, out: Out) -> None:
    if not a.groupName:
        await _list_groups(admin, out)
        return
    group = a.groupName
    masters = route_masters(await admin.route(a.topic)) if a.topic else await admin.all_masters()
    if not masters:
        raise AdminError("no master broker is registered on the nameserver")
    merged, tps = await _consume_stats(admin, group, a.topic, masters)
    if not merged:
        on = f" on topic {a.topic}" if a.topic else ""
        raise AdminError(f"no consume progress for group {group}{on}: "
                         "the group has no committed offset (it may never have consumed)")
    rows, diff_total = [], 0
    for mq, v in sorted(merged.items()):
        broker_off, consumer_off = _int(v.get("brokerOffset")), _int(v.get("consumerOffset"))
        diff = broker_off - consumer_off
        diff_total += diff
        rows.append((mq.topic, mq.broker_name, mq.queue_id, broker_off, consumer_off, diff,
                     tables.human_ms(_int(v.get("lastTimestamp")))))
    out(tables.format_table(["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset",
                             "#Diff", "#LastTime"], rows))
    out("")
    out(f"Consume TPS: {tps:.2f}")
    out(f"Diff Total: {diff_total}")


async def _list_groups(admin: Admin, out: Out) -> None:
    resp = admin.check(await admin.ns(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), "topic list", "nameserver")
    d = admin.parse(resp, "topic list", "nameserver")
    groups = sorted(str(t)[len(RETRY_GROUP_TOPIC_PREFIX):] for t in (d.get("topicList") or [])
                    if str(t).startswith(RETRY_GROUP_TOPIC_PREFIX))
    masters = await admin.all_masters() if groups else {}
    rows = []
    for g in groups:
        count, ctype, model = 0, "", ""
        for addr in masters.values():
            try:
                r = await admin.call(addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": g})
            except AdminError:
                continue
            if r.code == ResponseCode.SUCCESS:
                cc = admin.parse(r, "consumer connections", f"broker {addr}")
                count += len(cc.get("connectionSet") or [])
                ctype = "PULL" if cc.get("consumeType") == "CONSUME_ACTIVELY" else "PUSH"
                model = str(cc.get("messageModel") or "")
        try:
            stats, tps = await _consume_stats(admin, g, None, masters)
            diff = sum(_int(v.get("brokerOffset")) - _int(v.get("consumerOffset")) for v in stats.values())
            diff_s, tps_s = str(diff), f"{tps:.2f}"
        except AdminError:
            diff_s, tps_s = "-", "-"
        rows.append((g, count, ctype if count else "", model if count else "", tps_s, diff_s))
    out(tables.format_table(["#Group", "#Count", "#Type", "#Model", "#TPS", "#Diff Total"], rows))


# -- messages --------------------------------------------------------------------------------

SEND_STATUS = {ResponseCode.SUCCESS: "SEND_OK", ResponseCode.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT",
               ResponseCode.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT",
               ResponseCode.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE"}


async def _send_route(admin: Admin, topic: str) -> tuple[TopicRouteData, bool]:
    """The topic's route; like RocketMQ's producer, fall back to TBW102 (auto-create) if unknown."""
    try:
        return await admin.route(topic), False
    except AdminError as e:
        if "TOPIC_NOT_EXIST" not in str(e):
            raise
        try:
            return await admin.route(DEFAULT_TOPIC), True
        except AdminError:
            raise e from None


async def cmd_send_message(admin: Admin, a, out: Out) -> None:
    if a.qid is not None and not a.broker:
        raise UsageError("sendMessage: broker name (-b) must be set if the queue (-i) is chosen")
    route, auto_create = await _send_route(admin, a.topic)
    masters = route_masters(route)
    queues = []
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if not PermName.writeable(qd.perm) or qd.broker_name not in masters:
            continue
        n = min(4, qd.write_queue_nums) if auto_create else qd.write_queue_nums
        queues += [MessageQueue(a.topic, qd.broker_name, q) for q in range(n)]
    if a.broker:
        if a.broker not in masters:
            known = ", ".join(sorted(masters)) or "none"
            raise AdminError(f"broker {a.broker} has no master in the route of topic {a.topic} (brokers: {known})")
        queues = [q for q in queues if q.broker_name == a.broker]
        if a.qid is not None:
            if a.qid not in {q.queue_id for q in queues}:
                raise AdminError(f"queue {a.qid} is not a writable queue of topic {a.topic} on broker {a.broker} "
                                 f"(it has {len(queues)} writable queues)")
            queues = [q for q in queues if q.queue_id == a.qid]
    if not queues:
        raise AdminError(f"topic {a.topic} has no writable queue")
    mq = random.choice(queues)
    addr = masters[mq.broker_name]

    uniq = _uniq_id_source()()
    props = {}
    if a.key:
        props["KEYS"] = a.key
    if a.tags:
        props["TAGS"] = a.tags
    props["WAIT"] = "true"
    props["UNIQ_KEY"] = uniq
    body, sys_flag = maybe_compress(a.body.encode("utf-8"))
    header = SendMessageRequestHeader(
        producer_group=f"mqadmin-{int(time.time() * 1000)}", topic=a.topic, default_topic=DEFAULT_TOPIC,
        default_topic_queue_nums=4, queue_id=mq.queue_id, sys_flag=sys_flag,
        born_timestamp=int(time.time() * 1000), flag=0, properties=encode_properties(props),
        reconsume_times=0, unit_mode=False, batch=False, max_reconsume_times=None)
    resp = await admin.call(addr, RequestCode.SEND_MESSAGE_V2, encode_send_header(header, v2=True), body)
    status = SEND_STATUS.get(resp.code)
    if status is None:
        admin.check(resp, f"send to topic {a.topic}", f"broker {mq.broker_name} {addr}")
    ext = resp.ext_fields
    qid = _int(ext.get("queueId"), mq.queue_id)
    out(tables.format_table(["#Broker Name", "#QID", "#Send Result", "#MsgId", "#OffsetMsgId", "#Queue Offset"],
                            [(mq.broker_name, qid, status, uniq, ext.get("msgId", ""), ext.get("queueOffset", ""))]))


async def cmd_query_msg_by_id(admin: Admin, a, out: Out) -> None:
    ids = [i.strip() for i in a.msgId.split(",") if i.strip()]
    if not ids:
        raise UsageError("queryMsgById: -i needs at least one message id")
    views = []
    for msg_id in ids:
        try:
            ip, port, offset = decode_offset_msg_id(msg_id.upper())
        except ValueError as e:
            raise AdminError(f"bad message id {msg_id!r}: {e} (queryMsgById takes the offsetMsgId "
                             "that the broker returned, not the client UNIQ_KEY)") from None
        addr = f"{ip}:{port}"
        resp = await admin.call(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
        if resp.code != ResponseCode.SUCCESS:
            raise AdminError(f"message {msg_id} not found on broker {addr}: "
                             f"{_one_line(resp.remark) or 'no details'} ({code_name(resp.code)})")
        try:
            msg = decode_record(resp.body_bytes())
        except ValueError as e:
            raise AdminError(f"message {msg_id} from broker {addr} cannot be decoded: {e}") from None
        try:
            host, hport = parse_host(msg.store_host)
            oid = offset_msg_id(host, hport, msg.commit_log_offset)
        except ValueError:
            oid = msg_id.upper()
        views.append(tables.format_message(msg, oid, a.bodyFormat))
    out("\n\n".join(views))


# -- offsets ---------------------------------------------------------------------------------

def _reset_timestamp(s: str) -> int:
    """Java's resetOffsetByTime -s: now | milliseconds | yyyy-MM-dd#HH:mm:ss:SSS (local
    time); -1 means the end of each queue."""
    v = s.strip()
    if v == "now":
        return int(time.time() * 1000)
    try:
        n = int(v)
    except ValueError:
        pass
    else:
        if n < -1:
            raise argparse.ArgumentTypeError(f"bad timestamp {s!r}: milliseconds must be >= -1")
        return n
    try:
        day, _, clock = v.partition("#")
        hms, _, millis = clock.rpartition(":")
        t = time.mktime(time.strptime(f"{day} {hms}", "%Y-%m-%d %H:%M:%S"))
        return int(t) * 1000 + int(millis)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"bad timestamp {s!r}: use now, milliseconds or yyyy-MM-dd#HH:mm:ss:SSS") from None


async def cmd_reset_offset_by_time(admin: Admin, a, out: Out) -> None:
    route = await admin.route(a.topic)
    masters = route_masters(route)
    if not masters:
        raise AdminError(f"topic {a.topic} has no master broker in its route")
    ext = {"topic": a.topic, "group": a.group, "timestamp": a.timestamp, "isForce": "true" if a.force else "false"}
    rows = []
    for name, addr in masters.items():
        resp = await admin.call(addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext)
        admin.check(resp, f"reset offsets of {a.group} on {a.topic}", f"broker {name} {addr}")
        try:
            table = decode_reset_offset_body(resp.body_bytes())
        except BodyError as e:
            raise AdminError(f"unreadable reset result from broker {name} {addr}: {e}") from None
        rows.extend((mq.broker_name, mq.queue_id, off) for mq, off in sorted(table.items()))
    out(f"rollback consumer offset by specified group[{a.group}], topic[{a.topic}], "
        f"force[{'true' if a.force else 'false'}], timestamp(long)[{a.timestamp}]")
    out(tables.format_table(["#brokerName", "#queueId", "#offset"], rows))


# --------------------------------------------------------------------------- command table

_N = Opt("n", "namesrvAddr", "Name server address list, eg: '192.168.0.1:9876;192.168.0.2:9876' "
                             "(default: $NAMESRV_ADDR)", metavar="ip:port")

COMMANDS: dict[str, Command] = {c.name: c for c in [
    Command("updateTopic", "Update or create topic", [
        Opt("b", "brokerAddr", "create topic to which broker", metavar="ip:port"),
        Opt("c", "clusterName", "create topic to which cluster"),
        Opt("t", "topic", "topic name", required=True, type=_stripped),
        Opt("r", "readQueueNums", "set read queue nums (default 8)", type=_positive_int, default=8),
        Opt("w", "writeQueueNums", "set write queue nums (default 8)", type=_positive_int, default=8),
        Opt("p", "perm", "set topic's permission(2|4|6), intro[2:W 4:R; 6:RW] (default 6)", type=_perm, default=6),
        Opt("o", "order", "set topic's order(true|false)", type=_java_bool, default=False),
        Opt("u", "unit", "is unit topic (true|false)", type=_java_bool, default=False),
        Opt("s", "hasUnitSub", "has unit sub (true|false)", type=_java_bool, default=False),
    ], cmd_update_topic),
    Command("deleteTopic", "Delete topic from broker and NameServer.", [
        Opt("t", "topic", "topic name", required=True, type=_stripped),
        Opt("c", "clusterName", "delete topic from which cluster", required=True, type=_stripped),
    ], cmd_delete_topic),
    Command("topicList", "Fetch all topic list from name server", [], cmd_topic_list),
    Command("topicRoute", "Examine topic route info", [
        Opt("t", "topic", "topic name", required=True, type=_stripped),
    ], cmd_topic_route),
    Command("topicStatus", "Examine topic Status info", [
        Opt("t", "topic", "topic name", required=True, type=_stripped),
    ], cmd_topic_status),
    Command("clusterList", "List all of clusters", [], cmd_cluster_list),
    Command("consumerProgress", "Query consumers's progress, speed", [
        Opt("g", "groupName", "consumer group name (without it: list the groups)", type=_stripped),
        Opt("t", "topicName", "only this topic", type=_stripped, dest="topic"),
    ], cmd_consumer_progress),
    Command("resetOffsetByTime", "Reset consumer offset by timestamp(without client restart).", [
        Opt("g", "group", "set the consumer group", required=True, type=_stripped),
        Opt("t", "topic", "set the topic", required=True, type=_stripped),
        Opt("s", "timestamp", "set the timestamp[now|currentTimeMillis|yyyy-MM-dd#HH:mm:ss:SSS]; -1: the end",
            required=True, type=_reset_timestamp),
        Opt("f", "force", "set the force rollback by timestamp switch[true|false] (default true; false only "
                          "moves offsets back)", type=_java_bool, default=True),
    ], cmd_reset_offset_by_time),
    Command("sendMessage", "Send a message", [
        Opt("t", "topic", "Topic name", required=True, type=_stripped),
        Opt("p", "body", "UTF-8 string format of the message body", required=True),
        Opt("k", "key", "Message keys"),
        Opt("c", "tags", "Message tags"),
        Opt("b", "broker", "Send message to target broker (broker name)"),
        Opt("i", "qid", "Send message to target queue (needs -b)", type=_non_negative_int),
    ], cmd_send_message),
    Command("queryMsgById", "Query Message by Id", [
        Opt("i", "msgId", "Message Id (offsetMsgId; several separated by ',')", required=True),
        Opt("f", "bodyFormat", "print message body by the specified charset (default utf-8)", default="utf-8"),
    ], cmd_query_msg_by_id, needs_namesrv=False),
]}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        name = self.prog.split()[-1]
        raise UsageError(f"{name}: {message} (see 'mqadmin help {name}')")

    def exit(self, status=0, message=None):
        if message:
            print(message, file=sys.stderr, end="")
        raise SystemExit(status)


def build_parser(c: Command) -> argparse.ArgumentParser:
    p = _Parser(prog=f"{PROG} {c.name}", description=c.desc, add_help=True,
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=c.epilog)
    for o in [_N] + c.opts:
        kw = {"help": o.help, "required": o.required, "dest": o.dest or o.long}
        if o.takes_value:
            kw["metavar"] = o.metavar or o.long
            if o.type is not None:
                kw["type"] = o.type
            kw["default"] = o.default
        else:
            kw["action"] = "store_true"
        p.add_argument(f"-{o.short}", f"--{o.long}", **kw)
    return p


def command_list() -> str:
    return tables.format_command_list((c.name, c.desc) for c in COMMANDS.values())


def _get_command(name: str) -> Command:
    c = COMMANDS.get(name)
    if c is None:
        raise UsageError(f"unknown command '{name}' (run 'mqadmin help' for the list)")
    return c


async def _run(c: Command, args: argparse.Namespace, out: Out) -> None:
    namesrv = args.namesrvAddr or os.environ.get("NAMESRV_ADDR") or None
    if c.needs_namesrv and not namesrv:
        raise UsageError("no nameserver address: pass -n ip:port[;ip:port] or set NAMESRV_ADDR")
    admin = Admin(namesrv)
    try:
        await c.run(admin, args, out)
    finally:
        await admin.close()


def _out(line: str) -> None:
    print(line)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(os.environ.get("MQADMIN_DEBUG"))
    pocket_log = logging.getLogger("pocketmq")
    saved = pocket_log.propagate
    if debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    else:
        # Remoting warnings would add noise to the one-line error contract; restore
        # the logger afterwards so an in-process caller (tests, embedders) is unaffected.
        pocket_log.propagate = False
    try:
        return _main(argv)
    finally:
        pocket_log.propagate = saved


def _main(argv: list[str]) -> int:
    try:
        if not argv or argv[0] in ("-h", "--help"):
            print(command_list())
            return EXIT_OK
        if argv[0] == "help":
            if len(argv) == 1:
                print(command_list())
            else:
                print(build_parser(_get_command(argv[1])).format_help(), end="")
            return EXIT_OK
        c = _get_command(argv[0])
        try:
            args = build_parser(c).parse_args(argv[1:])
        except SystemExit as e:         # -h/--help inside a command
            return int(e.code or 0)
        asyncio.run(_run(c, args, _out))
        sys.stdout.flush()
        return EXIT_OK
    except AdminError as e:
        _flush_quietly()
        print(f"{PROG}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): not an error worth a message
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - last resort: one line, never a traceback
        if os.environ.get("MQADMIN_DEBUG"):
            import traceback
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(e).__name__}: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_FAILED


def _flush_quietly() -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass

