"""QUERY_MESSAGE (12): records by key or unique key through the store's message index
(Java's QueryMessageProcessor). VIEW_MESSAGE_BY_ID (33) lives with the admin reads
(processors/admin.py)."""
from __future__ import annotations

from pocketmq.protocol.codes import ResponseCode
from pocketmq.protocol.headers.typed import (QueryMessageResponseHeader, decode_query_message_header,
                                             encode_query_message_response_header)

NOT_FOUND_REMARK = "can not find message, maybe time range not correct"


def process_query_message(ctx, conn, cmd):
    h = decode_query_message_header(cmd.ext_fields)
    max_num = h.max_num
    if h.unique_key:
        # a unique key names one message (more copies only when a send was retried)
        max_num = ctx.config.defaultQueryMaxNum
    res = ctx.store.query_message(h.topic, h.key, max_num, h.begin_timestamp, h.end_timestamp)
    ext = encode_query_message_response_header(QueryMessageResponseHeader(
        res.index_last_update_timestamp, res.index_last_update_phyoffset))
    records = []
    for offset in res.offsets:
        data = ctx.store.look_message_by_offset(offset)
        if data is not None:         # its segment may have expired since the lookup
            records.append(data)
    if not records:
        return cmd.response(ResponseCode.QUERY_NOT_FOUND, NOT_FOUND_REMARK, ext_fields=ext)
    return cmd.response(ResponseCode.SUCCESS, ext_fields=ext, body=b"".join(records))
