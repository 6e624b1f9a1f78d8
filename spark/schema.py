"""The row schema of the pocketmq source (issue 9), in Spark DDL and as Arrow: one owner."""
from __future__ import annotations

import pyarrow as pa

COLUMNS = (
    ("topic", "string"), ("broker_name", "string"), ("queue_id", "int"), ("queue_offset", "long"),
    ("msg_id", "string"), ("tags", "string"), ("keys", "string"), ("body", "binary"),
    ("properties", "map<string,string>"), ("born_timestamp", "timestamp"),
    ("store_timestamp", "timestamp"), ("born_host", "string"), ("reconsume_times", "int"),
)
DDL = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)

_TS = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("broker_name", pa.string()), ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()), ("msg_id", pa.string()), ("tags", pa.string()), ("keys", pa.string()),
    ("body", pa.binary()), ("properties", pa.map_(pa.string(), pa.string())), ("born_timestamp", _TS),
    ("store_timestamp", _TS), ("born_host", pa.string()), ("reconsume_times", pa.int32()),
])
