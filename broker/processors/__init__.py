"""The broker's processor table: the ONLY place request codes are bound.

Every handler is called handler(ctx, conn, cmd) with the BrokerContext
(processors/context.py): the processors' whole view of the broker.

Names are checked where they enter: every code but the sends first checks the header
fields that carry a name (topic, consumerGroup, clientID... `names_checked`); the
body decoders check the names in bodies. The sends check their topic where it can be
created (a known topic was checked when it was), so the send hot path pays nothing.
A HeaderError/BodyError is answered SYSTEM_ERROR with its message (remoting.connection).
"""
from __future__ import annotations

from functools import partial

from pocketmq.broker.processors.context import BrokerContext
from pocketmq.protocol.codes import RequestCode as R
from pocketmq.protocol.headers.typed import names_checked

# Their topic is checked where a new one is created; known topics were checked then.
_SEND_CODES = frozenset({int(R.SEND_MESSAGE), int(R.SEND_MESSAGE_V2), int(R.SEND_BATCH_MESSAGE)})


def build_processor_table(ctx: BrokerContext) -> dict:
    from pocketmq.broker.processors import (acl_admin, admin, client_manage as cm, end_transaction, pop, pull,
                                            query, send, send_back, stats)
    table = {
        R.SEND_MESSAGE: send.process_send,
        R.SEND_MESSAGE_V2: send.process_send,
        R.SEND_BATCH_MESSAGE: send.process_send,
        R.PULL_MESSAGE: pull.process_pull,
        R.CONSUMER_SEND_MSG_BACK: send_back.process_send_back,
        R.END_TRANSACTION: end_transaction.process_end_transaction,
        R.HEART_BEAT: cm.process_heartbeat,
        R.UNREGISTER_CLIENT: cm.process_unregister_client,
        R.GET_CONSUMER_LIST_BY_GROUP: cm.process_get_consumer_list,
        R.CHECK_CLIENT_CONFIG: cm.process_check_client_config,
        R.QUERY_CONSUMER_OFFSET: cm.process_query_consumer_offset,
        R.UPDATE_CONSUMER_OFFSET: cm.process_update_consumer_offset,
        R.LOCK_BATCH_MQ: cm.process_lock_batch,
        R.UNLOCK_BATCH_MQ: cm.process_unlock_batch,
        R.GET_MAX_OFFSET: admin.process_get_max_offset,
        R.GET_MIN_OFFSET: admin.process_get_min_offset,
        R.GET_EARLIEST_MSG_STORETIME: admin.process_get_earliest_msg_storetime,
        R.SEARCH_OFFSET_BY_TIMESTAMP: admin.process_search_offset_by_timestamp,
        R.VIEW_MESSAGE_BY_ID: admin.process_view_message_by_id,
        R.QUERY_MESSAGE: query.process_query_message,
        R.UPDATE_AND_CREATE_TOPIC: admin.process_update_and_create_topic,
        R.DELETE_TOPIC_IN_BROKER: admin.process_delete_topic,
        R.GET_ALL_TOPIC_CONFIG: admin.process_get_all_topic_config,
        R.GET_TOPIC_STATS_INFO: admin.process_get_topic_stats,
        R.GET_CONSUME_STATS: admin.process_get_consume_stats,
        R.GET_CONSUMER_CONNECTION_LIST: admin.process_get_consumer_connection_list,
        R.GET_CONSUMER_RUNNING_INFO: admin.process_get_consumer_running_info,
        R.CONSUME_MESSAGE_DIRECTLY: admin.process_consume_message_directly,
        R.GET_BROKER_RUNTIME_INFO: stats.process_get_broker_runtime_info,
        R.VIEW_BROKER_STATS_DATA: stats.process_view_broker_stats_data,
        R.GET_BROKER_HA_STATUS: stats.process_get_broker_ha_status,
        R.QUERY_TOPIC_CONSUME_BY_WHO: admin.process_query_topic_consume_by_who,
        R.GET_ALL_CONSUMER_OFFSET: admin.process_get_all_consumer_offset,
        R.GET_ALL_DELAY_OFFSET: admin.process_get_all_delay_offset,
        R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: admin.process_get_all_subscription_group,
        R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: admin.process_update_and_create_subscription_group,
        R.DELETE_SUBSCRIPTIONGROUP: admin.process_delete_subscription_group,
        R.INVOKE_BROKER_TO_RESET_OFFSET: admin.process_invoke_broker_to_reset_offset,
        R.GET_PRODUCER_CONNECTION_LIST: admin.process_get_producer_connection_list,
        R.GET_BROKER_CONFIG: admin.process_get_broker_config,
        R.UPDATE_BROKER_CONFIG: admin.process_update_broker_config,
        R.CLEAN_EXPIRED_CONSUMEQUEUE: admin.process_clean_expired_consume_queue,
        R.CLONE_GROUP_OFFSET: admin.process_clone_group_offset,
        R.UPDATE_AND_CREATE_ACL_CONFIG: acl_admin.process_update_acl_config,
        R.DELETE_ACL_CONFIG: acl_admin.process_delete_acl_config,
        R.GET_BROKER_CLUSTER_ACL_INFO: acl_admin.process_get_acl_info,
        R.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: acl_admin.process_update_global_white_addrs,
        R.GET_BROKER_CLUSTER_ACL_CONFIG: acl_admin.process_get_acl_config,
        R.POP_MESSAGE: pop.process_pop,
        R.ACK_MESSAGE: pop.process_ack,
        R.CHANGE_MESSAGE_INVISIBLETIME: pop.process_change_invisible,
    }
    if ctx is not None and ctx.is_slave:   # (None: a caller that only wants the codes)
        from pocketmq.broker.processors.slave import SLAVE_OVERRIDES
        table.update(SLAVE_OVERRIDES)
    return {int(code): partial(fn, ctx) if int(code) in _SEND_CODES else names_checked(partial(fn, ctx))
            for code, fn in table.items()}
