"""HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, CHECK_CLIENT_CONFIG,
consumer offsets, queue locks (reference 3.3, 3.4, 4.4-4.6)."""
from __future__ import annotations

from pocketmq.broker.core.clients import ClientChannelInfo
from pocketmq.common.constants import retry_topic
from pocketmq.protocol import bodies
from pocketmq.protocol.codes import PermName, RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.protocol.headers.typed import opt_str, req_int, req_str


def process_heartbeat(broker, conn, cmd):
    hb = bodies.parse_heartbeat(cmd.body)
    now = broker.now_ms()
    info = ClientChannelInfo(hb.client_id, cmd.language, cmd.version, conn.remote_addr, now)
    conn.attrs["client_id"] = hb.client_id
    conn.attrs["language"] = cmd.language
    for cd in hb.consumer_data_set:
        gcfg = broker.groups.find(cd.group_name, now)
        if gcfg is None:
            continue
        if gcfg.retryQueueNums > 0:
            before = broker.topics.get(retry_topic(cd.group_name))
            broker.topics.create_retry_or_dlq(retry_topic(cd.group_name), gcfg.retryQueueNums,
                                              PermName.READ | PermName.WRITE, now)
            if before is None:
                broker.on_topics_changed()
        changed = broker.consumers.register(cd.group_name, conn, info, cd.consume_type, cd.message_model,
                                            cd.consume_from_where, cd.subscription_data_set, now)
        if changed and gcfg.notifyConsumerIdsChangedEnable:
            broker.notify_consumer_ids_changed(cd.group_name)
    for g in hb.producer_groups:
        broker.producers.register(g, conn, info)
    return cmd.response(ResponseCode.SUCCESS)


def process_unregister_client(broker, conn, cmd):
    req_str(cmd.ext_fields, "clientID")
    pg = opt_str(cmd.ext_fields, "producerGroup")
    cg = opt_str(cmd.ext_fields, "consumerGroup")
    if pg:
        broker.producers.unregister(pg, conn)
    if cg:
        if broker.consumers.unregister(cg, conn):
            gcfg = broker.groups.find(cg)
            if gcfg is None or gcfg.notifyConsumerIdsChangedEnable:
                broker.notify_consumer_ids_changed(cg)
    return cmd.response(ResponseCode.SUCCESS)


def process_get_consumer_list(broker, conn, cmd):
    group = req_str(cmd.ext_fields, "consumerGroup")
    g = broker.consumers.get(group)
    if g is None or not g.channels:
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
    return cmd.response(ResponseCode.SUCCESS, body=bodies.dumps({"consumerIdList": g.client_ids()}))


def process_check_client_config(broker, conn, cmd):
    d = bodies.loads(cmd.body) if cmd.body else {}
    sub = d.get("subscriptionData") or {}
    if (sub.get("expressionType") or "TAG") != "TAG":
        return cmd.response(ResponseCode.SYSTEM_ERROR,
                            "The broker does not support consumer to filter message by SQL92")
    return cmd.response(ResponseCode.SUCCESS)


def process_query_consumer_offset(broker, conn, cmd):
    e = cmd.ext_fields
    group, topic, qid = req_str(e, "consumerGroup"), req_str(e, "topic"), req_int(e, "queueId")
    offset = broker.offsets.query(group, topic, qid)
    if offset >= 0:
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)})
    # A new group on a young queue starts at 0 even with CONSUME_FROM_LAST_OFFSET
    # (reference 3.3): answer 0 while offset 0 still exists and is not "on disk".
    min_offset = broker.store.get_min_offset_in_queue(topic, qid)
    if min_offset <= 0 and not broker.store.check_in_disk_by_consume_offset(topic, qid, 0):
        return cmd.response(ResponseCode.SUCCESS, ext_fields={"offset": "0"})
    return cmd.response(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first")


def process_update_consumer_offset(broker, conn, cmd):
    e = cmd.ext_fields
    group, topic, qid, offset = (req_str(e, "consumerGroup"), req_str(e, "topic"), req_int(e, "queueId"),
                                 req_int(e, "commitOffset"))
    # The offset table is persisted: only real queues get entries, so a client cannot grow it
    # (and consumerOffset.json) with made-up names.
    tc = broker.topics.get(topic)
    if tc is None:
        return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
    if not 0 <= qid < max(tc.read_queue_nums, tc.write_queue_nums):
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"queueId[{qid}] is illegal for topic {topic}")
    broker.offsets.commit(group, topic, qid, offset)
    return cmd.response(ResponseCode.SUCCESS)


def process_lock_batch(broker, conn, cmd):
    group, client_id, mqs = bodies.decode_lock_body(cmd.body)
    ok = broker.locks.try_lock_batch(group, mqs, client_id, broker.now_ms())
    return cmd.response(ResponseCode.SUCCESS, body=bodies.encode_mq_set("lockOKMQSet", sorted(ok)))


def process_unlock_batch(broker, conn, cmd):
    group, client_id, mqs = bodies.decode_lock_body(cmd.body)
    broker.locks.unlock_batch(group, mqs, client_id)
    return cmd.response(ResponseCode.SUCCESS)


def notify_command(group: str) -> RemotingCommand:
    return RemotingCommand(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields={"consumerGroup": group})
