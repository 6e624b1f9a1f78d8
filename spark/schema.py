"""The row schema of the pocketmq source (issue 9), in Spark DDL and as Arrow, and the
column subsets a reader may be asked for (`projection`): one owner."""
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

# Spark's simpleString of each column's type (DDL "long" reads back as "bigint")
_SIMPLE = {name: {"long": "bigint"}.get(kind, kind) for name, kind in COLUMNS}


class SchemaError(ValueError):
    pass


def projection(schema) -> tuple[str, ...] | None:
    """The columns a reader is asked for, from the schema Spark hands `reader(schema)` (a
    StructType): None for the full row schema (the default, `DataSource.schema()`), else
    the names of a user-given schema (`spark.read.format("pocketmq").schema("queue_offset
    long, body binary")`): any subset of COLUMNS, in any order, each with its own type and
    nullable. A Python data source cannot be told which columns a query uses (pyspark's
    scan has no column pruning), so the schema is the way to ask for fewer: Spark then
    converts only these columns per row, and the reader builds only these."""
    fields = [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields]
    if [(name, kind) for name, kind, _ in fields] == list(_SIMPLE.items()) and all(n for *_, n in fields):
        return None
    seen: set[str] = set()
    for name, kind, nullable in fields:
        if name not in _SIMPLE:
            raise SchemaError(f"pocketmq: the schema names column {name!r}, which the source does not have; "
                              f"its columns: {DDL}")
        if kind != _SIMPLE[name]:
            raise SchemaError(f"pocketmq: column {name} is {_SIMPLE[name]}, the schema says {kind}")
        if not nullable:
            raise SchemaError(f"pocketmq: column {name} must be declared nullable (the schema says NOT NULL)")
        if name in seen:
            raise SchemaError(f"pocketmq: the schema names column {name} twice")
        seen.add(name)
    if not fields:
        raise SchemaError("pocketmq: the schema names no column")
    return tuple(name for name, _, _ in fields)


def arrow_schema(columns: tuple[str, ...] | None) -> pa.Schema:
    """ARROW_SCHEMA, or its fields `columns` in that order."""
    if columns is None:
        return ARROW_SCHEMA
    return pa.schema([ARROW_SCHEMA.field(name) for name in columns])
