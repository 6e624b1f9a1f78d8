"""HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, CHECK_CLIENT_CONFIG,
consumer offsets, queue locks (reference 3.3, 3.4, 4.4-4.6)."""
from __future__ import annotations

import logging

from pocketmq.broker.core import sql92
from pocketmq.broker.core.clients import ClientChannelInfo
from pocketmq.common.constants import retry_topic
from pocketmq.protocol import bodies
from pocketmq.protocol.codes import PermName, RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import opt_str, req_int, req_str

log = logging.getLogger("pocketmq.broker")


def process_heartbeat(ctx, conn, cmd):
    hb = bodies.parse_heartbeat(cmd.body)
    now = ctx.now_ms()
    info = ClientChannelInfo(hb.client_id, cmd.language, cmd.version, conn.remote_addr, now)
    conn.attrs["client_id"] = hb.client_id
    conn.attrs["language"] = cmd.language
    for cd in hb.consumer_data_set:
        gcfg = ctx.groups.find(cd.group_name, now)
        if gcfg is None:
            continue
        if gcfg.retryQueueNums > 0:
            before = ctx.topics.get(retry_topic(cd.group_name))
            ctx.topics.create_retry_or_dlq(retry_topic(cd.group_name), gcfg.retryQueueNums,
                                           PermName.READ | PermName.WRITE, now)
            if before is None:
                ctx.on_topics_changed()
        _compile_filters(ctx, cd.group_name, cd.subscription_data_set)
        changed = ctx.consumers.register(cd.group_name, conn, info, cd.consume_type, cd.message_model,
                                         cd.consume_from_where, cd.subscription_data_set, now)
        if changed and gcfg.notifyConsumerIdsChangedEnable:
            notify_consumer_ids_changed(ctx.consumers, cd.group_name)
    for g in hb.producer_groups:
        ctx.producers.register(g, conn, info)
    return cmd.response(ResponseCode.SUCCESS)


def process_unregister_client(ctx, conn, cmd):
    req_str(cmd.ext_fields, "clientID")
    pg = opt_str(cmd.ext_fields, "producerGroup")
    cg = opt_str(cmd.ext_fields, "consumerGroup")
    if pg:
        ctx.producers.unregister(pg, conn)
    if cg:
        if ctx.consumers.unregister(cg, conn):
            gcfg = ctx.groups.find(cg)
            if gcfg is None or gcfg.notifyConsumerIdsChangedEnable:
                notify_consumer_ids_changed(ctx.consumers, cg)
    return cmd.response(ResponseCode.SUCCESS)


def process_get_consumer_list(ctx, conn, cmd):
    group = req_str(cmd.ext_fields, "consumerGroup")
    g = ctx.consumers.get(group)
    if g is None or not g.channels:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
    return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps({"consumerIdList": g.client_ids()}))


def process_check_client_config(ctx, conn, cmd):
    """CHECK_CLIENT_CONFIG (46), as Java's ClientManageProcessor.checkClientConfig: a
    TAG subscription (or none) is fine; a filter expression needs enablePropertyFilter
    and must compile (SUBSCRIPTION_PARSE_FAILED with the error's column otherwise)."""
    d = bodies.loads(cmd.body) if cmd.body else {}
    sub = d.get("subscriptionData") if isinstance(d, dict) else None
    if not isinstance(sub, dict):
        return cmd.response(ResponseCode.SUCCESS)
    et = sub.get("expressionType") or "TAG"
    if et == "TAG":
        return cmd.response(ResponseCode.SUCCESS)
    if not ctx.config.enablePropertyFilter:
        return cmd.response(ResponseCode.SYSTEM_ERROR,
                            f"The broker does not support consumer to filter message by {et}")
    if et != "SQL92":
        return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"unknown expressionType {et}")
    try:
        sql92.compiled(str(sub.get("subString") or ""))
    except sql92.ParseError as e:
        return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(e))
    return cmd.response(ResponseCode.SUCCESS)


def _compile_filters(ctx, group: str, subscriptions) -> None:
    """Compile a heartbeat's SQL92 subscriptions now (cached), so the first pull finds
    them ready; Java registers such filter data on every heartbeat. A heartbeat with a
    bad expression is still accepted, as in Java: the pulls answer the error."""
    if not ctx.config.enablePropertyFilter:
        return
    for sub in subscriptions:
        if sub.expression_type == "SQL92":
            try:
                sql92.compiled(sub.sub_string)
            except sql92.ParseError as e:
                log.warning("group %s topic %s: SQL92 subscription %r does not compile: %s",
                            group, sub.topic, sub.sub_string, e)


def process_query_consumer_offset(ctx, conn, cmd):
    e = cmd.ext_fields
    group, topic, qid = req_str(e, "consumerGroup"), req_str(e, "topic"), req_int(e, "queueId")
    offset = ctx.offsets.query(group, topic, qid)
    if offset >= 0:
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})
    # A new group on a young queue starts at 0 even with CONSUME_FROM_LAST_OFFSET
    # (reference 3.3): answer 0 while offset 0 still exists and is not "on disk".
    min_offset = ctx.store.get_min_offset_in_queue(topic, qid)
    if min_offset <= 0 and not ctx.store.check_in_disk_by_consume_offset(topic, qid, 0):
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": "0"})
    return cmd.response(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")


def process_update_consumer_offset(ctx, conn, cmd):
    e = cmd.ext_fields
    group, topic, qid, offset = (req_str(e, "consumerGroup"), req_str(e, "topic"), req_int(e, "queueId"),
                                 req_int(e, "commitOffset"))
    # The offset table is persisted: only real queues get entries, so a client cannot grow it
    # (and consumerOffset.json) with made-up names.
    tc = ctx.topics.get(topic)
    if tc is None:
        return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    if not 0 <= qid < max(tc.read_queue_nums, tc.write_queue_nums):
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"queueId[{qid}] is illegal for topic {topic}")
    ctx.offsets.commit(group, topic, qid, offset)
    return cmd.response(ResponseCode.SUCCESS)


def process_lock_batch(ctx, conn, cmd):
    group, client_id, mqs = bodies.decode_lock_body(cmd.body)
    # the connection's token goes with each lock it takes or renews: its close releases
    # those (connection_closed), not ones the client renewed over another connection since
    token = conn.attrs.get("lock_token")
    if token is None:
        token = conn.attrs["lock_token"] = object()
    ok = ctx.locks.try_lock_batch(group, mqs, client_id, ctx.now_ms(), token)
    if ok:
        conn.attrs.setdefault("lock_owners", set()).add((group, client_id))
    return cmd.response(ResponseCode.SUCCESS, body=bodies.encode_mq_set("lockOKMQSet", sorted(ok)))


def process_unlock_batch(ctx, conn, cmd):
    group, client_id, mqs = bodies.decode_lock_body(cmd.body)
    ctx.locks.unlock_batch(group, mqs, client_id)
    return cmd.response(ResponseCode.SUCCESS)


def notify_command(group: str) -> RemotingCommand:
    return RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields={"consumerGroup": group})


def notify_consumer_ids_changed(consumers, group: str) -> None:
    """Tell every member of a group that its membership changed (oneway); they rebalance."""
    g = consumers.get(group)
    if g is None:
        return
    for conn in list(g.channels):
        try:
            conn.oneway(notify_command(group))
        except Exception:
            log.debug("notify to %s failed", getattr(conn, "remote_addr", "?"))


def connection_closed(ctx, conn) -> None:
    """A client connection closed: forget its held pulls, registrations and queue locks;
    the consumer groups it left are told (unless a group opted out)."""
    ctx.held_pulls.drop_connection(conn)
    token = conn.attrs.get("lock_token")
    for group, client_id in conn.attrs.get("lock_owners", ()):
        released = ctx.locks.unlock_client(group, client_id, token)
        if released:
            log.info("released %d queue locks of %s in %s (connection closed)", len(released), client_id, group)
    for group in ctx.consumers.remove_channel(conn):
        gcfg = ctx.groups.find(group)
        if gcfg is None or gcfg.notifyConsumerIdsChangedEnable:
            notify_consumer_ids_changed(ctx.consumers, group)
    ctx.producers.remove_channel(conn)
