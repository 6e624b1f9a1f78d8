"""The NameServer's route table and KV config: pure state, no asyncio, no clock.

`RouteInfoManager` keeps RocketMQ's five tables (reference 4.7):

| table                | key          | value                                         |
|----------------------|--------------|-----------------------------------------------|
| topic_queue_table    | topic        | brokerName -> QueueData                       |
| broker_addr_table    | brokerName   | BrokerData (cluster, brokerId -> "ip:port")   |
| cluster_addr_table   | clusterName  | set of brokerNames                            |
| broker_live_table    | brokerAddr   | BrokerLiveInfo (last update, DataVersion, channel key, HA addr) |
| filter_server_table  | brokerAddr   | filter-server addresses (kept, never served)  |

Every operation that depends on time takes `now_ms` (any monotonic
millisecond clock: the table only compares it with earlier values). The
`channel_key` of a registration is whatever identifies the connection it came
over (the asyncio shell passes the Connection object); the table only
compares keys and hands them back when it drops a broker, so the shell can
close the connection the way Java's scan does.

Registration rules (Java RouteInfoManager.registerBroker):
* the brokerName joins its cluster; `brokerAddrs[brokerId] = brokerAddr`
  after removing the same address under any other id (slave promoted to
  master and back);
* for the master (id 0) only, and only when the broker's DataVersion differs
  from the stored one or this is the first registration of that id, each
  topic's QueueData for that brokerName is created or replaced. Topics the
  broker no longer lists are not removed (they go with DELETE_TOPIC_IN_NAMESRV
  or when the brokerName disappears), as in Java 4.9;
* the live info is replaced (timestamp, DataVersion, channel, HA address);
* a slave gets back the master's address and HA address when the master is live.

Removal (unregister, channel closed, expiry) deletes the address from its
BrokerData; only when a brokerName has no address left does it leave its
cluster and lose its QueueData in every topic (topics left without QueueData
disappear). So a master's queues stay routable while only its slave lives.

Bounds: `brokers_max` live broker addresses, `topics_max` topics,
`topics_per_registration_max` topics in one registration body. Going over
raises RouteTableFull (the processor answers SYSTEM_ERROR) and leaves the
table unchanged.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

from pocketmq.protocol.bodies import BrokerData, DataVersion, QueueData, TopicConfig, TopicRouteData, loads
from pocketmq.protocol.codes import PermName
from pocketmq.protocol.errors import BodyError

MASTER_ID = 0
BROKER_CHANNEL_EXPIRED_MS = 120_000
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


class RouteTableFull(Exception):
    """A registration would take the table over one of its bounds."""


class RegisterResult(NamedTuple):
    """What a registering broker learns: for slaves, its live master's addresses."""
    master_addr: str | None
    ha_server_addr: str | None


@dataclass(slots=True)
class BrokerLiveInfo:
    last_update_ms: int
    data_version: DataVersion
    channel_key: object
    ha_server_addr: str


@dataclass(frozen=True, slots=True)
class RemovedBroker:
    """One broker address dropped by expiry or by its connection closing."""
    broker_addr: str
    channel_key: object
    last_update_ms: int
    broker_names_removed: tuple  # brokerNames that lost their last address


class RouteInfoManager:
    def __init__(self, *, broker_channel_expired_ms: int = BROKER_CHANNEL_EXPIRED_MS,
                 brokers_max: int = 4096, topics_max: int = 1_000_000,
                 topics_per_registration_max: int = 500_000):
        assert broker_channel_expired_ms > 0
        self.broker_channel_expired_ms = broker_channel_expired_ms
        self.brokers_max = brokers_max
        self.topics_max = topics_max
        self.topics_per_registration_max = topics_per_registration_max
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}
        self.filter_server_table: dict[str, list[str]] = {}

    # -- registration ------------------------------------------------------------------
    def register_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int,
                        ha_server_addr: str, topics: dict[str, TopicConfig] | None,
                        data_version: DataVersion, channel_key: object, now_ms: int,
                        filter_server_list: list | None = None) -> RegisterResult:
        topics = topics or {}
        self._check_bounds(broker_addr, broker_id, topics)

        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)

        register_first = False
        broker_data = self.broker_addr_table.get(broker_name)
        if broker_data is None:
            register_first = True
            broker_data = BrokerData(cluster, broker_name, {})
            self.broker_addr_table[broker_name] = broker_data
        addrs = broker_data.broker_addrs
        # The same ip:port must appear under one id only (slave <-> master switch).
        for other_id in [i for i, a in addrs.items() if a == broker_addr and i != broker_id]:
            del addrs[other_id]
        old_addr = addrs.get(broker_id)
        addrs[broker_id] = broker_addr
        register_first = register_first or old_addr is None

        if broker_id == MASTER_ID:
            if register_first or self.is_broker_topic_config_changed(broker_addr, data_version):
                for topic_config in topics.values():
                    self._create_and_update_queue_data(broker_name, topic_config)

        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            now_ms, DataVersion(data_version.timestamp, data_version.counter), channel_key,
            ha_server_addr)
        if filter_server_list:
            self.filter_server_table[broker_addr] = list(filter_server_list)
        else:
            self.filter_server_table.pop(broker_addr, None)

        if broker_id != MASTER_ID:
            master_addr = addrs.get(MASTER_ID)
            if master_addr is not None:
                master_live = self.broker_live_table.get(master_addr)
                if master_live is not None:
                    return RegisterResult(master_addr, master_live.ha_server_addr)
        return RegisterResult(None, None)

    def _check_bounds(self, broker_addr: str, broker_id: int, topics: dict) -> None:
        if broker_addr not in self.broker_live_table and len(self.broker_live_table) >= self.brokers_max:
            raise RouteTableFull(f"{len(self.broker_live_table)} brokers registered, "
                                 f"limit brokers_max={self.brokers_max}")
        if len(topics) > self.topics_per_registration_max:
            raise RouteTableFull(f"registration lists {len(topics)} topics, "
                                 f"limit topics_per_registration_max={self.topics_per_registration_max}")
        if broker_id == MASTER_ID:
            new_topics = sum(1 for t in topics if t not in self.topic_queue_table)
            if len(self.topic_queue_table) + new_topics > self.topics_max:
                raise RouteTableFull(f"{len(self.topic_queue_table)} topics known, {new_topics} new, "
                                     f"limit topics_max={self.topics_max}")

    def _create_and_update_queue_data(self, broker_name: str, tc: TopicConfig) -> None:
        qd = QueueData(broker_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)
        self.topic_queue_table.setdefault(tc.topic_name, {})[broker_name] = qd

    def is_broker_topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        prev = self.query_broker_topic_config(broker_addr)
        return prev is None or prev != data_version

    def query_broker_topic_config(self, broker_addr: str) -> DataVersion | None:
        live = self.broker_live_table.get(broker_addr)
        return None if live is None else live.data_version

    def update_broker_info_update_timestamp(self, broker_addr: str, now_ms: int) -> None:
        live = self.broker_live_table.get(broker_addr)
        if live is not None:
            live.last_update_ms = now_ms

    def query_data_version(self, broker_addr: str, data_version: DataVersion,
                           now_ms: int) -> tuple[bool, DataVersion | None]:
        """QUERY_DATA_VERSION: (changed, the NS's stored version). Unchanged refreshes liveness."""
        changed = self.is_broker_topic_config_changed(broker_addr, data_version)
        if not changed:
            self.update_broker_info_update_timestamp(broker_addr, now_ms)
        return changed, self.query_broker_topic_config(broker_addr)

    # -- removal -----------------------------------------------------------------------
    def unregister_broker(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> bool:
        """UNREGISTER_BROKER. Returns True when the brokerName lost its last address."""
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)
        remove_broker_name = False
        broker_data = self.broker_addr_table.get(broker_name)
        if broker_data is not None:
            # only the entry this broker registered: after a failover another broker holds
            # brokerId 0 of this name, and a demoted master's unregister must not remove it
            if broker_data.broker_addrs.get(broker_id) == broker_addr:
                del broker_data.broker_addrs[broker_id]
            if not broker_data.broker_addrs:
                del self.broker_addr_table[broker_name]
                remove_broker_name = True
        if remove_broker_name:
            names = self.cluster_addr_table.get(cluster)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr_table[cluster]
            self._remove_topics_of_broker_name(broker_name)
        return remove_broker_name

    def remove_by_channel(self, channel_key: object) -> list[RemovedBroker]:
        """The connection `channel_key` closed: drop every broker registered over it."""
        addrs = [a for a, live in self.broker_live_table.items() if live.channel_key is channel_key]
        return [self._destroy(a) for a in addrs]

    def expire(self, now_ms: int) -> list[RemovedBroker]:
        """Drop brokers not heard from for more than broker_channel_expired_ms."""
        limit = self.broker_channel_expired_ms
        stale = [a for a, live in self.broker_live_table.items() if live.last_update_ms + limit < now_ms]
        return [self._destroy(a) for a in stale]

    def next_deadline_ms(self) -> int | None:
        """The earliest now_ms at which expire() would drop someone, or None."""
        if not self.broker_live_table:
            return None
        oldest = min(live.last_update_ms for live in self.broker_live_table.values())
        return oldest + self.broker_channel_expired_ms + 1

    def _destroy(self, broker_addr: str) -> RemovedBroker:
        """Java onChannelDestroy for a known broker address."""
        live = self.broker_live_table.pop(broker_addr)
        self.filter_server_table.pop(broker_addr, None)
        removed_names = []
        for name, broker_data in list(self.broker_addr_table.items()):
            addrs = broker_data.broker_addrs
            for bid in [i for i, a in addrs.items() if a == broker_addr]:
                del addrs[bid]
            if not addrs:
                del self.broker_addr_table[name]
                removed_names.append(name)
        for name in removed_names:
            for cluster in list(self.cluster_addr_table):
                names = self.cluster_addr_table[cluster]
                if name in names:
                    names.discard(name)
                    if not names:
                        del self.cluster_addr_table[cluster]
            self._remove_topics_of_broker_name(name)
        return RemovedBroker(broker_addr, live.channel_key, live.last_update_ms, tuple(removed_names))

    def _remove_topics_of_broker_name(self, broker_name: str) -> None:
        for topic in list(self.topic_queue_table):
            qmap = self.topic_queue_table[topic]
            if qmap.pop(broker_name, None) is not None and not qmap:
                del self.topic_queue_table[topic]

    # -- queries -----------------------------------------------------------------------
    def get_route(self, topic: str) -> TopicRouteData | None:
        """Route of `topic`, or None unless both queue data and a broker data exist.

        Returns copies sorted by brokerName; callers may mutate them.
        """
        qmap = self.topic_queue_table.get(topic)
        if not qmap:
            return None
        queue_datas = [QueueData(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm,
                                 q.topic_sys_flag) for _, q in sorted(qmap.items())]
        broker_datas = []
        for name in sorted(qmap):
            bd = self.broker_addr_table.get(name)
            if bd is not None:
                broker_datas.append(BrokerData(bd.cluster, bd.broker_name, dict(bd.broker_addrs)))
        if not broker_datas:
            return None
        return TopicRouteData(queue_datas, broker_datas)

    def cluster_info(self) -> tuple[dict[str, BrokerData], dict[str, list[str]]]:
        """(brokerName -> BrokerData copy, clusterName -> sorted brokerNames)."""
        brokers = {n: BrokerData(b.cluster, b.broker_name, dict(b.broker_addrs))
                   for n, b in sorted(self.broker_addr_table.items())}
        clusters = {c: sorted(names) for c, names in sorted(self.cluster_addr_table.items())}
        return brokers, clusters

    def all_topics(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def topics_by_cluster(self, cluster: str) -> list[str]:
        names = self.cluster_addr_table.get(cluster) or set()
        return sorted(t for t, qmap in self.topic_queue_table.items() if any(n in qmap for n in names))

    def system_topic_list(self) -> tuple[list[str], str | None]:
        """Cluster names and broker names (Java's "system topics"), plus one broker address."""
        topics: list[str] = []
        for cluster, names in sorted(self.cluster_addr_table.items()):
            topics.append(cluster)
            topics.extend(sorted(names))
        broker_addr = None
        for _, bd in sorted(self.broker_addr_table.items()):
            if bd.broker_addrs:
                broker_addr = bd.broker_addrs[min(bd.broker_addrs)]
                break
        return topics, broker_addr

    def broker_live(self, broker_addr: str) -> BrokerLiveInfo | None:
        return self.broker_live_table.get(broker_addr)

    # -- admin -------------------------------------------------------------------------
    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """DELETE_TOPIC_IN_NAMESRV: whole topic, or only the queues of one cluster's brokers."""
        if not cluster:
            return self.topic_queue_table.pop(topic, None) is not None
        names = self.cluster_addr_table.get(cluster)
        qmap = self.topic_queue_table.get(topic)
        if not names or qmap is None:
            return False
        removed = False
        for name in names:
            removed |= qmap.pop(name, None) is not None
        if not qmap:
            del self.topic_queue_table[topic]
        return removed

    def wipe_write_perm_of_broker(self, broker_name: str) -> int:
        """Clear the write bit of every queue data of `broker_name`; returns the topic count."""
        return self._change_perm_of_broker(broker_name, lambda perm: perm & ~PermName.WRITE)

    def add_write_perm_of_broker(self, broker_name: str) -> int:
        """Set every queue data of `broker_name` to read+write (Java 4.9.2+); returns the topic count."""
        return self._change_perm_of_broker(broker_name, lambda perm: PermName.READ | PermName.WRITE)

    def _change_perm_of_broker(self, broker_name: str, change) -> int:
        count = 0
        for qmap in self.topic_queue_table.values():
            qd = qmap.get(broker_name)
            if qd is not None:
                qd.perm = change(qd.perm)
                count += 1
        return count


class KVConfig:
    """namespace -> key -> value, as Java's KVConfigManager (kvConfig.json).

    Bounds: `namespaces_max`, `keys_per_namespace_max`, and `item_bytes_max`
    for one namespace/key/value; put() raises ValueError when over.
    `version` counts changes, so a shell can tell whether it must persist.
    File form (Java KVConfigSerializeWrapper): {"configTable":{ns:{k:v}}}.
    """

    def __init__(self, *, namespaces_max: int = 1024, keys_per_namespace_max: int = 65536,
                 item_bytes_max: int = 65536):
        self.namespaces_max = namespaces_max
        self.keys_per_namespace_max = keys_per_namespace_max
        self.item_bytes_max = item_bytes_max
        self.config_table: dict[str, dict[str, str]] = {}
        self.version = 0

    def put(self, namespace: str, key: str, value: str) -> None:
        for what, s in (("namespace", namespace), ("key", key), ("value", value)):
            if len(s.encode()) > self.item_bytes_max:
                raise ValueError(f"KV {what} longer than {self.item_bytes_max} bytes")
        table = self.config_table.get(namespace)
        if table is None:
            if len(self.config_table) >= self.namespaces_max:
                raise ValueError(f"too many KV namespaces (limit {self.namespaces_max})")
            table = self.config_table[namespace] = {}
        if key not in table and len(table) >= self.keys_per_namespace_max:
            raise ValueError(f"too many keys in KV namespace {namespace!r} (limit {self.keys_per_namespace_max})")
        table[key] = value
        self.version += 1

    def get(self, namespace: str, key: str) -> str | None:
        table = self.config_table.get(namespace)
        return None if table is None else table.get(key)

    def delete(self, namespace: str, key: str) -> bool:
        table = self.config_table.get(namespace)
        if table is None or key not in table:
            return False
        del table[key]  # an emptied namespace stays, as in Java (its list is then {})
        self.version += 1
        return True

    def list_namespace(self, namespace: str) -> dict[str, str] | None:
        table = self.config_table.get(namespace)
        return None if table is None else dict(table)

    def to_json_bytes(self) -> bytes:
        return json.dumps({"configTable": self.config_table}, ensure_ascii=False, sort_keys=True,
                          indent="\t").encode()

    @classmethod
    def from_json_bytes(cls, data: bytes, **bounds) -> "KVConfig":
        """Read kvConfig.json (ours or Java's). Raises BodyError on a malformed file."""
        kv = cls(**bounds)
        if not data.strip():
            return kv
        d = loads(data)
        if not isinstance(d, dict) or not isinstance(d.get("configTable", {}), dict):
            raise BodyError("kvConfig.json: expected {\"configTable\": {...}}")
        for namespace, table in (d.get("configTable") or {}).items():
            if not isinstance(table, dict):
                raise BodyError(f"kvConfig.json: namespace {namespace!r} is not an object")
            if len(kv.config_table) >= kv.namespaces_max:
                raise BodyError(f"kvConfig.json: more than {kv.namespaces_max} namespaces")
            kv.config_table.setdefault(str(namespace), {})
            for key, value in table.items():
                try:
                    kv.put(str(namespace), str(key), str(value))
                except ValueError as e:
                    raise BodyError(f"kvConfig.json: {e}") from None
        kv.version = 0
        return kv
