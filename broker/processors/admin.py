"""Offsets and time queries, topic administration, message view, stats
(reference 3.3, 3.7, 3.9, 4.9)."""
from __future__ import annotations

import logging

from pocketmq.broker.config import SECRET_KEYS, ConfigError, parse_runtime_update, persist_config_update
from pocketmq.broker.core.offsets import reset_table
from pocketmq.broker.core.subscription_groups import validate_group_config
from pocketmq.broker.core.topics import validate_topic
from pocketmq.common.constants import AUTO_CREATE_TOPIC_KEY_TOPIC, NAME_GROUP, name_error, retry_topic
from pocketmq.common.properties_file import decode_properties, format_properties, parse_properties
from pocketmq.protocol import bodies
from pocketmq.protocol.bodies import MessageQueue, SubscriptionGroupConfig, TopicConfig, dumps_object_keyed
from pocketmq.protocol.errors import BodyError
from pocketmq.protocol.codes import LanguageCode, PermName, RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import (
    decode_consume_message_directly_header,
    encode_consume_message_directly_header,
    opt_int,
    opt_str,
    parse_bool,
    req_int,
    req_str,
)
from pocketmq.protocol.message import decode_offset_msg_id
from pocketmq.remoting.connection import RemotingError, RequestTimeout


log = logging.getLogger("pocketmq.broker.admin")

VERSION_DESC = "pocketmq-0.1.0 (RocketMQ V4_9_4 protocol)"

# Clients older than this (Java's MQVersion V3_0_7_SNAPSHOT) do not understand the push.
RESET_OFFSET_MIN_CLIENT_VERSION = 28


def _topic_queue(cmd):
    return req_str(cmd.ext_fields, "topic"), req_int(cmd.ext_fields, "queueId")


def process_get_max_offset(ctx, conn, cmd):
    t, q = _topic_queue(cmd)
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(ctx.store.get_max_offset_in_queue(t, q))})


def process_get_min_offset(ctx, conn, cmd):
    t, q = _topic_queue(cmd)
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(ctx.store.get_min_offset_in_queue(t, q))})


def process_get_earliest_msg_storetime(ctx, conn, cmd):
    t, q = _topic_queue(cmd)
    return cmd.response(ResponseCode.SUCCESS,
                        ext_fields={"timestamp": str(ctx.store.get_earliest_message_time(t, q))})


def process_search_offset_by_timestamp(ctx, conn, cmd):
    t, q = _topic_queue(cmd)
    ts = req_int(cmd.ext_fields, "timestamp")
    return cmd.response(ResponseCode.SUCCESS,
                        ext_fields={"offset": str(ctx.store.get_offset_in_queue_by_time(t, q, ts))})


def process_view_message_by_id(ctx, conn, cmd):
    offset = req_int(cmd.ext_fields, "offset")
    data = ctx.store.look_message_by_offset(offset)
    if data is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
    return cmd.response(ResponseCode.SUCCESS, body=bytes(data))


def process_update_and_create_topic(ctx, conn, cmd):
    e = cmd.ext_fields
    topic = req_str(e, "topic")
    bad = validate_topic(topic)
    if bad:
        return cmd.response(ResponseCode.SYSTEM_ERROR, bad)
    if ctx.topics.is_system_topic(topic) or topic == ctx.config.brokerClusterName:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic.")
    read_q, write_q = req_int(e, "readQueueNums"), req_int(e, "writeQueueNums")
    perm = opt_int(e, "perm", 6)
    if not (0 < read_q <= 1024 and 0 < write_q <= 1024):
        return cmd.response(ResponseCode.SYSTEM_ERROR, "readQueueNums and writeQueueNums must be in 1..1024")
    if perm not in range(0, 16):
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad perm {perm}")
    filter_type = opt_str(e, "topicFilterType", "SINGLE_TAG")
    if filter_type not in ("SINGLE_TAG", "MULTI_TAG"):
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad topicFilterType {filter_type}")
    tc = TopicConfig(topic, read_q, write_q, perm, filter_type, opt_int(e, "topicSysFlag", 0),
                     parse_bool(e.get("order")))
    ctx.topics.update(tc, ctx.now_ms())
    ctx.on_topics_changed()
    return cmd.response(ResponseCode.SUCCESS)


def process_delete_topic(ctx, conn, cmd):
    topic = req_str(cmd.ext_fields, "topic")
    if ctx.topics.is_system_topic(topic):
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is a system topic and cannot be deleted.")
    ctx.topics.delete(topic, ctx.now_ms())
    ctx.store.delete_topics({topic})
    ctx.offsets.remove_topic(topic)
    ctx.on_topics_changed()
    return cmd.response(ResponseCode.SUCCESS)


def process_get_all_topic_config(ctx, conn, cmd):
    return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps(
        bodies.encode_topic_config_wrapper(ctx.topics.topics, ctx.topics.data_version)))


def process_get_topic_stats(ctx, conn, cmd):
    topic = req_str(cmd.ext_fields, "topic")
    tc = ctx.topics.get(topic)
    if tc is None:
        return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    table = {}
    st = ctx.store
    for q in range(tc.write_queue_nums):
        mx = st.get_max_offset_in_queue(topic, q)
        last = st.get_message_store_timestamp(topic, q, mx - 1) if mx > 0 else 0
        table[MessageQueue(topic, ctx.config.brokerName, q)] = {
            "lastUpdateTimestamp": max(0, last), "maxOffset": max(0, mx),
            "minOffset": max(0, st.get_min_offset_in_queue(topic, q))}
    return cmd.response(ResponseCode.SUCCESS, body=('{"offsetTable":' + dumps_object_keyed(table) + "}").encode())


def process_get_consume_stats(ctx, conn, cmd):
    group = req_str(cmd.ext_fields, "consumerGroup")
    topic = opt_str(cmd.ext_fields, "topic")
    topics = [topic] if topic else sorted(ctx.offsets.topics_of_group(group))
    table = {}
    st = ctx.store
    for t in topics:
        tc = ctx.topics.get(t)
        if tc is None:
            continue
        for q in range(tc.read_queue_nums):
            mx = st.get_max_offset_in_queue(t, q)
            co = ctx.offsets.query(group, t, q)
            last = st.get_message_store_timestamp(t, q, co - 1) if co > 0 else 0
            table[MessageQueue(t, ctx.config.brokerName, q)] = {
                "brokerOffset": mx, "consumerOffset": max(0, co), "lastTimestamp": max(0, last)}
    body = '{"consumeTps":%s,"offsetTable":%s}' % (0.0, dumps_object_keyed(table))
    return cmd.response(ResponseCode.SUCCESS, body=body.encode())


def process_get_consumer_connection_list(ctx, conn, cmd):
    group = req_str(cmd.ext_fields, "consumerGroup")
    g = ctx.consumers.get(group)
    if g is None or not g.channels:
        return cmd.response(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
    conns = [_connection_json(c) for c in g.channels.values()]
    body = {"connectionSet": conns, "consumeFromWhere": g.consume_from_where, "consumeType": g.consume_type,
            "messageModel": g.message_model,
            "subscriptionTable": {t: s.to_json() for t, s in g.subscriptions.items()}}
    return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps(body))


def _connection_json(c) -> dict:
    """Java's Connection: one client channel as GET_*_CONNECTION_LIST answers it."""
    return {"clientAddr": c.remote_addr, "clientId": c.client_id,
            "language": LanguageCode(c.language).name if c.language in LanguageCode._value2member_map_ else "OTHER",
            "version": c.version}


def process_get_producer_connection_list(ctx, conn, cmd):
    """GET_PRODUCER_CONNECTION_LIST (204): the producers of a group that heartbeat to this
    broker (Java's ProducerConnection body)."""
    group = req_str(cmd.ext_fields, "producerGroup")
    channels = ctx.producers.groups.get(group)
    if not channels:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
    conns = sorted((_connection_json(c) for c in channels.values()), key=lambda c: c["clientId"])
    return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps({"connectionSet": conns}))


# Java's Broker2Client.callClient timeout for requests relayed to a client.
CALL_CLIENT_TIMEOUT_S = 10.0


def process_get_consumer_running_info(ctx, conn, cmd):
    """GET_CONSUMER_RUNNING_INFO (307) from an admin: relayed to the named client's connection
    (sync, 10 s) and its answer (code, remark, body) relayed back, like Java's
    AdminBrokerProcessor.callConsumer. A client that cannot answer replies
    REQUEST_CODE_NOT_SUPPORTED itself, so no client-version gate is applied here."""
    e = cmd.ext_fields
    group, client_id = req_str(e, "consumerGroup"), req_str(e, "clientId")
    channel = _client_channel(ctx, group, client_id)
    if channel is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"The Consumer <{client_id}> <{group}> not online")
    fields = {"consumerGroup": group, "clientId": client_id}
    if "jstackEnable" in e:
        fields["jstackEnable"] = e["jstackEnable"]
    return _call_client(channel, cmd, RemotingCommand(RequestCode.GET_CONSUMER_RUNNING_INFO, ext_fields=fields),
                        client_id, group)


def process_consume_message_directly(ctx, conn, cmd):
    """CONSUME_MESSAGE_DIRECTLY (309) from an admin: the message `msgId` (an offsetMsgId: the
    commit log offset is read from it, its host is not checked, like Java's) is forwarded with
    this broker's name and the stored record as the body to the named client's connection,
    which runs its listener on it and answers a ConsumeMessageDirectlyResult; that answer is
    relayed back (Java's AdminBrokerProcessor.consumeMessageDirectly + callConsumer). Bounded
    by the same 10 s wait as GET_CONSUMER_RUNNING_INFO; a client that is gone is an error at
    once, one whose connection dies meanwhile an error when it does."""
    h = decode_consume_message_directly_header(cmd.ext_fields)
    if not h.client_id:
        return cmd.response(ResponseCode.SYSTEM_ERROR, "the custom field <clientId> is null: name the client")
    if not h.msg_id:
        return cmd.response(ResponseCode.SYSTEM_ERROR, "the custom field <msgId> is null: name the message")
    channel = _client_channel(ctx, h.consumer_group, h.client_id)
    if channel is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"The Consumer <{h.client_id}> <{h.consumer_group}> not online")
    try:
        _, _, offset = decode_offset_msg_id(h.msg_id.upper())
    except ValueError as ex:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad message id {h.msg_id[:64]!r}: {ex}")
    data = ctx.store.look_message_by_offset(offset)
    if data is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
    h.broker_name = ctx.config.brokerName
    return _call_client(channel, cmd, RemotingCommand(RequestCode.CONSUME_MESSAGE_DIRECTLY,
                                                      ext_fields=encode_consume_message_directly_header(h),
                                                      body=bytes(data)),
                        h.client_id, h.consumer_group)


def _client_channel(ctx, group: str, client_id: str):
    """The connection of the online consumer `client_id` of `group`, or None."""
    g = ctx.consumers.get(group)
    if g is None:
        return None
    return next((ch for ch, info in g.channels.items() if info.client_id == client_id), None)


async def _call_client(channel, cmd, request, client_id: str, group: str):
    try:
        resp = await channel.request(request, CALL_CLIENT_TIMEOUT_S)
    except RequestTimeout as ex:
        return cmd.response(ResponseCode.CONSUME_MSG_TIMEOUT, f"consumer <{client_id}> <{group}> Timeout: {ex}")
    except (RemotingError, OSError) as ex:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"invoke consumer <{client_id}> <{group}> Exception: {ex}")
    return cmd.response(resp.code, resp.remark, body=resp.body)


def process_query_topic_consume_by_who(ctx, conn, cmd):
    topic = req_str(cmd.ext_fields, "topic")
    groups = ctx.consumers.groups_subscribing(topic) | ctx.offsets.groups_of_topic(topic)
    return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps({"groupList": sorted(groups)}))


def process_get_all_consumer_offset(ctx, conn, cmd):
    return cmd.response(ResponseCode.SUCCESS, body=ctx.offsets.encode())


def process_get_all_delay_offset(ctx, conn, cmd):
    """GET_ALL_DELAY_OFFSET (45): the delay-level cursors as delayOffset.json holds them (Java's
    DelayOffsetSerializeWrapper {offsetTable: {level: offset}}), read by a slave's metadata
    sync (Java's AdminBrokerProcessor.getAllDelayOffset)."""
    if ctx.schedule_cursors is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR, "No delay offset in this broker")
    return cmd.response(ResponseCode.SUCCESS, body=ctx.schedule_cursors.encode())


def process_get_all_subscription_group(ctx, conn, cmd):
    """GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201): Java's SubscriptionGroupWrapper
    {subscriptionGroupTable: {group: SubscriptionGroupConfig}, dataVersion}."""
    return cmd.response(ResponseCode.SUCCESS, body=ctx.groups.encode())


def _slave_refusal(ctx, cmd):
    if not ctx.config.is_master():
        return cmd.response(ResponseCode.SYSTEM_ERROR, "Can't modify topic or subscription group from slave broker.")
    return None


def process_update_and_create_subscription_group(ctx, conn, cmd):
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200): the body (Java's SubscriptionGroupConfig
    JSON) replaces the group's config; answered once subscriptionGroup.json is written.
    A retry topic that exists already is resized to retryQueueNums, so send-backs spread
    over exactly those queues."""
    refused = _slave_refusal(ctx, cmd)
    if refused is not None:
        return refused
    if not cmd.body:
        return cmd.response(ResponseCode.SYSTEM_ERROR, "the request carries no SubscriptionGroupConfig body")
    try:
        cfg = SubscriptionGroupConfig.from_json(bodies.loads(cmd.body))
    except (BodyError, ValueError) as e:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad SubscriptionGroupConfig body: {e}")
    bad = validate_group_config(cfg)
    if bad:
        return cmd.response(ResponseCode.SYSTEM_ERROR, bad)
    now = ctx.now_ms()
    ctx.groups.update(cfg, now)
    rtopic = retry_topic(cfg.groupName)
    rtc = ctx.topics.get(rtopic)
    if rtc is not None and cfg.retryQueueNums > 0 and cfg.retryQueueNums != rtc.write_queue_nums:
        ctx.topics.update(TopicConfig(rtopic, cfg.retryQueueNums, cfg.retryQueueNums, rtc.perm,
                                      rtc.topic_filter_type, rtc.topic_sys_flag, rtc.order), now)
        ctx.on_topics_changed()
    log.info("subscription group %s updated by %s: %s", cfg.groupName, conn.remote_addr, cfg.to_json())
    return _answer_when_persisted(ctx, cmd)


def process_delete_subscription_group(ctx, conn, cmd):
    """DELETE_SUBSCRIPTIONGROUP (207): header groupName, removeOffset (also drop the
    group's committed offsets). Deleting an unknown group succeeds, as in Java."""
    refused = _slave_refusal(ctx, cmd)
    if refused is not None:
        return refused
    group = req_str(cmd.ext_fields, "groupName")
    ctx.groups.delete(group, ctx.now_ms())
    if parse_bool(cmd.ext_fields.get("removeOffset"), False):
        ctx.offsets.remove_group(group)
    log.info("subscription group %s deleted by %s", group, conn.remote_addr)
    return _answer_when_persisted(ctx, cmd)


async def _answer_when_persisted(ctx, cmd):
    try:
        await ctx.persist_groups()
    except OSError as e:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"cannot persist subscriptionGroup.json: {e}")
    return cmd.response(ResponseCode.SUCCESS)


def process_invoke_broker_to_reset_offset(ctx, conn, cmd):
    """INVOKE_BROKER_TO_RESET_OFFSET (mqadmin resetOffsetByTime): move a group's offsets on
    this broker's queues of a topic to a point in time (-1: the end), and push the new
    offsets to the group's online consumers (RESET_CONSUMER_CLIENT_OFFSET, oneway), which
    restart those queues there. Unlike Java's broker, the offsets are also committed here,
    so the reset holds for members that are offline or join later (Java answers
    CONSUMER_NOT_ONLINE then and its mqadmin falls back to committing them itself)."""
    e = cmd.ext_fields
    topic, group = req_str(e, "topic"), req_str(e, "group")
    ts = req_int(e, "timestamp")
    force = parse_bool(e.get("isForce"), True)
    tc = ctx.topics.get(topic)
    if tc is None:
        return cmd.response(ResponseCode.SYSTEM_ERROR,
                            f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}")
    g = ctx.consumers.get(group)
    online = list(g.channels.items()) if g is not None else []
    if not online and group not in ctx.offsets.groups_of_topic(topic):
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"THe consumer group <{group}> not exist")
    st = ctx.store
    qids = range(tc.read_queue_nums)
    by_time = {q: (st.get_max_offset_in_queue(topic, q) if ts == -1 else st.get_offset_in_queue_by_time(topic, q, ts))
               for q in qids}
    committed = {q: ctx.offsets.query(group, topic, q) for q in qids}
    committed = {q: o for q, o in committed.items() if o >= 0}
    moved = reset_table(committed, by_time, force)
    for q, off in moved.items():
        ctx.offsets.commit(group, topic, q, off)
    name = ctx.config.brokerName
    table = {MessageQueue(topic, name, q): off for q, off in moved.items()}
    header = {"topic": topic, "group": group, "timestamp": str(ts), "isForce": "true" if force else "false"}
    body_java = body_c = None
    for channel, info in online:
        if info.version < RESET_OFFSET_MIN_CLIENT_VERSION:
            log.info("reset of %s: client %s (version %d) cannot take the push", group, info.client_id,
                     info.version)
            continue
        if info.language == LanguageCode.CPP:
            body = body_c = body_c or bodies.encode_reset_offset_body_for_c(table)
        else:
            body = body_java = body_java or bodies.encode_reset_offset_body(table)
        try:
            channel.oneway(RemotingCommand(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, ext_fields=dict(header),
                                           body=body))
        except Exception as ex:       # a closing connection: that member re-reads the committed offsets
            log.info("reset push to %s failed: %s", info.client_id, ex)
    log.info("reset offsets of %s on %s to %s (force=%s): %s", group, topic, ts, force,
             {q: o for q, o in sorted(moved.items())})
    return cmd.response(ResponseCode.SUCCESS, body=bodies.encode_reset_offset_body(table))


# -- broker config (GET_BROKER_CONFIG 26, UPDATE_BROKER_CONFIG 25) -------------------------

def process_get_broker_config(ctx, conn, cmd):
    """GET_BROKER_CONFIG: every key as `key=value` lines (Java's properties2String) and
    the config's dataVersion JSON in the `version` header field."""
    # the broker's own secretKey and TLS key password never leave it (mqbroker -p masks them too)
    text = format_properties(ctx.config.config_items(), secret=SECRET_KEYS)
    version = bodies.dumps(ctx.config_version[0].to_json()).decode()
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"version": version}, body=text.encode())


def process_update_broker_config(ctx, conn, cmd):
    """UPDATE_BROKER_CONFIG: the body's `key=value` lines, for keys the running broker
    re-reads (broker.config.RUNTIME_UPDATABLE_KEYS); any other key, or a bad value, refuses
    the whole request with the reason. Accepted values are written into the -c file first
    (atomically; without one the change lasts until the broker stops, and the remark says
    so), then applied. A slave takes it too (its brokerPermission, polling...), as in Java."""
    try:
        updates = {e.key: e.value for e in parse_properties(decode_properties(cmd.body_bytes() or b""),
                                                            source="request body")}
        typed = parse_runtime_update(ctx.config, updates)
    except ConfigError as e:
        return cmd.response(ResponseCode.SYSTEM_ERROR, e.detail)
    remark = None
    if ctx.config_path:
        try:
            persist_config_update(ctx.config_path, typed)
        except OSError as e:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"cannot write {ctx.config_path}: {e}")
    else:
        remark = "applied; not persisted: the broker was started without a config file (-c)"
    _apply_config(ctx, typed)
    log.info("broker config updated by %s: %s%s", conn.remote_addr, typed,
             f" (written to {ctx.config_path})" if ctx.config_path else " (not persisted: no -c file)")
    return cmd.response(ResponseCode.SUCCESS, remark)


def _apply_config(ctx, typed: dict) -> None:
    """Set the keys on the live config, and on the tables that keep their own copy."""
    cfg = ctx.config
    for key, value in typed.items():
        setattr(cfg, key, value)
    now = ctx.now_ms()
    ctx.config_version[0] = ctx.config_version[0].next_version(now)
    if "autoCreateTopicEnable" in typed:
        ctx.topics.auto_create_topic_enable = cfg.autoCreateTopicEnable
        if cfg.autoCreateTopicEnable and ctx.topics.get(AUTO_CREATE_TOPIC_KEY_TOPIC) is None:
            # the template is made at start only when enabled then; without it nothing inherits
            n = cfg.defaultTopicQueueNums
            ctx.topics.system_topics.add(AUTO_CREATE_TOPIC_KEY_TOPIC)
            ctx.topics.update(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, n, n, PermName.READ | PermName.WRITE
                                          | PermName.INHERIT), now)
            ctx.on_topics_changed()
    if "autoCreateSubscriptionGroup" in typed:
        ctx.groups.auto_create = cfg.autoCreateSubscriptionGroup
    if "brokerPermission" in typed:
        # registration masks the topics' perms with it: a new data version makes the
        # nameservers take the changed queue datas (Java's updateBrokerConfig does the same)
        ctx.topics.bump(now)
        ctx.on_topics_changed()


# -- consume queues and offsets ---------------------------------------------------------------

def process_clean_expired_consume_queue(ctx, conn, cmd):
    """CLEAN_EXPIRED_CONSUMEQUEUE (306): drop consume-queue files wholly below the commit
    log's min offset now (mqadmin cleanExpiredCQ); the remark says how many."""
    removed = ctx.store.clean_expired_consume_queues()
    log.info("clean expired consume queues asked by %s: %d file(s) deleted", conn.remote_addr, removed)
    return cmd.response(ResponseCode.SUCCESS, f"{removed} consume queue file(s) deleted")


def process_clone_group_offset(ctx, conn, cmd):
    """CLONE_GROUP_OFFSET (314): copy srcGroup's committed offsets to destGroup, on `topic`
    or on every topic srcGroup committed on. Unless `offline`, a topic an online srcGroup
    does not subscribe to any more is skipped (Java AdminBrokerProcessor.cloneGroupOffset)."""
    e = cmd.ext_fields
    src, dest = req_str(e, "srcGroup"), req_str(e, "destGroup")
    for field, value in (("srcGroup", src), ("destGroup", dest)):
        # not among the header fields checked for every request: dest becomes a stored name
        bad = name_error(NAME_GROUP, field, value)
        if bad:
            return cmd.response(ResponseCode.SYSTEM_ERROR, bad)
    topic = opt_str(e, "topic")
    offline = parse_bool(e.get("offline"), False)
    topics = [topic] if topic else sorted(ctx.offsets.topics_of_group(src))
    cloned = []
    for t in topics:
        if ctx.topics.get(t) is None:
            continue
        if not offline:
            g = ctx.consumers.get(src)
            if g is not None and g.subscriptions and t not in g.subscriptions:
                continue
        if ctx.offsets.clone_group(src, dest, t):
            cloned.append(t)
    log.info("offsets of %s cloned to %s by %s on %s", src, dest, conn.remote_addr, cloned)
    # pocketmq's addition (Java answers nothing): how many topics had offsets to clone
    return cmd.response(ResponseCode.SUCCESS, ext_fields={"clonedTopicCount": str(len(cloned))})
