"""NameServer request processors. `build_processor_table()` is the ONLY place
request codes are bound to handlers (reference 3.8).

Handlers are plain functions `(conn, cmd) -> RemotingCommand`: every NameServer
operation is a quick change of in-memory tables, so none of them awaits.
Expected outcomes are response codes; a HeaderError/BodyError becomes
SYSTEM_ERROR with its message (Connection does that); unknown codes are answered
REQUEST_CODE_NOT_SUPPORTED by the RemotingServer (the Java NameServer stays
silent, which only makes clients time out).

Every response extFields value is a string; fields whose value is null in Java
are left out, as Java's header encoder does.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from pocketmq.common.properties_file import format_properties
from pocketmq.nameserver.route import (
    NAMESPACE_ORDER_TOPIC_CONFIG,
    KVConfig,
    RouteInfoManager,
    RouteTableFull,
)
from pocketmq.protocol.bodies import (
    DataVersion,
    decode_register_broker_body,
    dumps,
    encode_cluster_info,
    loads,
)
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import (
    names_checked,
    opt_int,
    opt_str,
    parse_bool,
    req_int,
    req_str,
)
from pocketmq.protocol.message import body_crc

log = logging.getLogger("pocketmq.namesrv")

# FAQUrl.suggestTodo(FAQUrl.APPLY_TOPIC_URL) of the Java NameServer.
_APPLY_TOPIC_HINT = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


def config_value(config, name: str, default=None):
    """Read a camelCase config key from a NamesrvConfig (camelCase or snake_case attributes)."""
    if config is None:
        return default
    v = getattr(config, name, None)
    if v is None:
        snake = "".join("_" + c.lower() if c.isupper() else c for c in name)
        v = getattr(config, snake, None)
    return default if v is None else v


def config_properties(config) -> dict:
    """The config as camelCase key -> value (for GET_NAMESRV_CONFIG)."""
    if config is None:
        return {}
    if hasattr(config, "model_dump"):
        try:
            return dict(config.model_dump(by_alias=True))
        except TypeError:
            return dict(config.model_dump())
    return {k: v for k, v in vars(config).items() if not k.startswith("_")}


@dataclass(slots=True)
class NamesrvState:
    """What the processors work on. `now_ms` is the shell's monotonic clock;
    `on_kv_changed` lets the shell persist kvConfig.json after a change."""
    routes: RouteInfoManager
    kv: KVConfig
    config: object = None
    now_ms: Callable[[], int] = lambda: 0
    on_kv_changed: Callable[[], None] = field(default=lambda: None)


def _ok(cmd: RemotingCommand, ext: dict | None = None, body: bytes = b"") -> RemotingCommand:
    return cmd.response(ResponseCode.SUCCESS, None, ext, body)


def _kv_table_body(table: dict | None) -> bytes:
    return b"" if table is None else dumps({"table": table})


def build_processor_table(state: NamesrvState) -> dict:
    routes = state.routes
    kv = state.kv

    # -- broker <-> NS ------------------------------------------------------------------
    def register_broker(conn, cmd):
        ext = cmd.ext_fields
        broker_name = req_str(ext, "brokerName")
        broker_addr = req_str(ext, "brokerAddr")
        cluster = req_str(ext, "clusterName")
        ha_server_addr = req_str(ext, "haServerAddr")
        broker_id = req_int(ext, "brokerId")
        compressed = parse_bool(ext.get("compressed"))
        body_crc32 = opt_int(ext, "bodyCrc32", 0)
        body = cmd.body_bytes()
        if body_crc32 != 0:
            crc = body_crc(body)
            if crc != body_crc32:
                log.warning("register broker %s %s: body crc32 %d != header %d", broker_name,
                            broker_addr, crc, body_crc32)
                return cmd.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        if body:
            # Brokers >= V3_0_11 send RegisterBrokerBody, older ones the bare wrapper;
            # the decoder accepts both.
            topics, version = decode_register_broker_body(body, compressed)
        else:
            topics, version = {}, DataVersion(0, 0)
        is_new = routes.broker_live(broker_addr) is None
        try:
            result = routes.register_broker(cluster, broker_addr, broker_name, broker_id, ha_server_addr,
                                            topics, version, conn, state.now_ms())
        except RouteTableFull as e:
            log.warning("register broker %s %s refused: %s", broker_name, broker_addr, e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        if is_new:
            log.info("new broker registered, %s (%s, cluster %s, id %d) HAServer: %s, %d topics",
                     broker_addr, broker_name, cluster, broker_id, ha_server_addr, len(topics))
        resp_ext = {}
        if result.ha_server_addr is not None:
            resp_ext["haServerAddr"] = result.ha_server_addr
        if result.master_addr is not None:
            resp_ext["masterAddr"] = result.master_addr
        return _ok(cmd, resp_ext, _kv_table_body(kv.list_namespace(NAMESPACE_ORDER_TOPIC_CONFIG)))

    def unregister_broker(conn, cmd):
        ext = cmd.ext_fields
        broker_name = req_str(ext, "brokerName")
        broker_addr = req_str(ext, "brokerAddr")
        cluster = req_str(ext, "clusterName")
        broker_id = req_int(ext, "brokerId")
        gone = routes.unregister_broker(cluster, broker_addr, broker_name, broker_id)
        log.info("unregister broker %s (%s, cluster %s, id %d)%s", broker_addr, broker_name, cluster,
                 broker_id, "; broker name removed" if gone else "")
        return _ok(cmd)

    def query_data_version(conn, cmd):
        ext = cmd.ext_fields
        req_str(ext, "brokerName")
        broker_addr = req_str(ext, "brokerAddr")
        req_str(ext, "clusterName")
        req_int(ext, "brokerId")
        body = cmd.body_bytes()
        version = DataVersion.from_json(loads(body)) if body else DataVersion()
        changed, stored = routes.query_data_version(broker_addr, version, state.now_ms())
        return _ok(cmd, {"changed": "true" if changed else "false"},
                   dumps(stored.to_json()) if stored is not None else b"")

    # -- clients and admin -----------------------------------------------------------------
    def get_route_info_by_topic(conn, cmd):
        topic = req_str(cmd.ext_fields, "topic")
        route = routes.get_route(topic)
        if route is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST,
                                f"No topic route info in name server for the topic: {topic}{_APPLY_TOPIC_HINT}")
        if config_value(state.config, "orderMessageEnable", False):
            route.order_topic_conf = kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, topic)
        # Standard compact JSON with quoted numeric keys: every 4.x client reads it (reference 4.2).
        return _ok(cmd, None, dumps(route.to_json()))

    def get_broker_cluster_info(conn, cmd):
        brokers, clusters = routes.cluster_info()
        return _ok(cmd, None, encode_cluster_info(brokers, clusters))

    def get_all_topic_list(conn, cmd):
        return _ok(cmd, None, dumps({"topicList": routes.all_topics()}))

    def get_topics_by_cluster(conn, cmd):
        cluster = req_str(cmd.ext_fields, "cluster")
        return _ok(cmd, None, dumps({"topicList": routes.topics_by_cluster(cluster)}))

    def get_system_topic_list(conn, cmd):
        topics, broker_addr = routes.system_topic_list()
        d = {"topicList": topics}
        if broker_addr is not None:
            d["brokerAddr"] = broker_addr
        return _ok(cmd, None, dumps(d))

    def delete_topic_in_namesrv(conn, cmd):
        topic = req_str(cmd.ext_fields, "topic")
        cluster = opt_str(cmd.ext_fields, "clusterName")
        routes.delete_topic(topic, cluster)
        log.info("delete topic %s%s", topic, f" in cluster {cluster}" if cluster else "")
        return _ok(cmd)

    def wipe_write_perm_of_broker(conn, cmd):
        broker_name = req_str(cmd.ext_fields, "brokerName")
        count = routes.wipe_write_perm_of_broker(broker_name)
        log.info("wipe write perm of broker %s, %d topics", broker_name, count)
        return _ok(cmd, {"wipeTopicCount": str(count)})

    def add_write_perm_of_broker(conn, cmd):
        broker_name = req_str(cmd.ext_fields, "brokerName")
        count = routes.add_write_perm_of_broker(broker_name)
        log.info("add write perm of broker %s, %d topics", broker_name, count)
        return _ok(cmd, {"addTopicCount": str(count)})

    # -- KV config -------------------------------------------------------------------------
    def put_kv_config(conn, cmd):
        ext = cmd.ext_fields
        namespace = req_str(ext, "namespace")
        key = req_str(ext, "key")
        value = req_str(ext, "value")
        try:
            kv.put(namespace, key, value)
        except ValueError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(e))
        state.on_kv_changed()
        return _ok(cmd)

    def get_kv_config(conn, cmd):
        namespace = req_str(cmd.ext_fields, "namespace")
        key = req_str(cmd.ext_fields, "key")
        value = kv.get(namespace, key)
        if value is None:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND,
                                f"No config item, Namespace: {namespace} Key: {key}")
        return _ok(cmd, {"value": value})

    def delete_kv_config(conn, cmd):
        namespace = req_str(cmd.ext_fields, "namespace")
        key = req_str(cmd.ext_fields, "key")
        if kv.delete(namespace, key):
            state.on_kv_changed()
        return _ok(cmd)

    def get_kv_list_by_namespace(conn, cmd):
        namespace = req_str(cmd.ext_fields, "namespace")
        table = kv.list_namespace(namespace)
        if table is None:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return _ok(cmd, None, _kv_table_body(table))

    def get_namesrv_config(conn, cmd):
        props = config_properties(state.config)
        text = format_properties((k, v) for k, v in sorted(props.items()) if v is not None)
        return _ok(cmd, None, text.encode())

    table = {
        RequestCode.PUT_KV_CONFIG: put_kv_config,
        RequestCode.GET_KV_CONFIG: get_kv_config,
        RequestCode.DELETE_KV_CONFIG: delete_kv_config,
        RequestCode.GET_KVLIST_BY_NAMESPACE: get_kv_list_by_namespace,
        RequestCode.REGISTER_BROKER: register_broker,
        RequestCode.UNREGISTER_BROKER: unregister_broker,
        RequestCode.QUERY_DATA_VERSION: query_data_version,
        RequestCode.GET_ROUTEINFO_BY_TOPIC: get_route_info_by_topic,
        RequestCode.GET_BROKER_CLUSTER_INFO: get_broker_cluster_info,
        RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: get_all_topic_list,
        RequestCode.GET_TOPICS_BY_CLUSTER: get_topics_by_cluster,
        RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: get_system_topic_list,
        RequestCode.DELETE_TOPIC_IN_NAMESRV: delete_topic_in_namesrv,
        RequestCode.WIPE_WRITE_PERM_OF_BROKER: wipe_write_perm_of_broker,
        RequestCode.ADD_WRITE_PERM_OF_BROKER: add_write_perm_of_broker,
        RequestCode.GET_NAMESRV_CONFIG: get_namesrv_config,
    }
    # Names are checked where they enter: the header fields carrying one (topic, brokerName,
    # clusterName, cluster) here, the topics of a REGISTER_BROKER body by its decoder, so a
    # name that is stored can always be written back (GET_BROKER_CLUSTER_INFO, topic lists).
    return {code: names_checked(fn) for code, fn in table.items()}
