"""The `pocketmq` data source for PySpark's Python Data Source API (batch and streaming,
read and write).

    spark.read.format("pocketmq").option("namesrvAddr", "127.0.0.1:9876")
         .option("subscribe", "T1,T2").load()
    df.write.format("pocketmq").option("namesrvAddr", ...).option("topic", "T").mode("append").save()
    spark.readStream.format("pocketmq")...load()     # stream.PocketMQStreamReader
    df.writeStream.format("pocketmq")...start()      # stream.PocketMQStreamWriter

Planning (queues, offset ranges) runs in the driver's Python process; each partition is a
QueueRange (a small NamedTuple) and `read()` pulls it from the broker on the executor.

A reader builds the columns of the schema it is given (schema.projection): the full row
schema by default, or a subset the user names with `.schema(...)`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)

from pocketmq.spark.options import parse_reader_options, parse_writer_options
from pocketmq.spark.schema import DDL, projection


class QueuePartition(InputPartition):
    """One queue range; `value` is a plan.QueueRange."""


class PocketMQDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "pocketmq"

    def schema(self):
        return DDL

    def reader(self, schema):
        return PocketMQReader(self.options, projection(schema))

    def writer(self, schema, overwrite: bool):
        return PocketMQWriter(self.options, overwrite)

    def streamReader(self, schema):
        return _stream_module().PocketMQStreamReader(self.options, projection(schema))

    def streamWriter(self, schema, overwrite: bool):
        return _stream_module().PocketMQStreamWriter(self.options)


def _stream_module():
    # loaded on use: batch reads and writes work with pyspark 4.0, streams need 4.2's
    # admission control (pyspark.sql.streaming.datasource)
    try:
        from pocketmq.spark import stream
    except ImportError as e:
        import pyspark

        raise RuntimeError(f"pocketmq streaming needs pyspark >= 4.2 (admission control, availableNow); "
                           f"this is pyspark {pyspark.__version__}: {e}") from e
    return stream


class PocketMQReader(DataSourceReader):
    def __init__(self, options, columns: tuple[str, ...] | None = None):
        # on the driver: the credentials' environment fallback is the driver's
        self.opts = parse_reader_options(dict(options), environ=os.environ)
        self.columns = columns      # schema.projection: None = every column

    def partitions(self):
        from pocketmq.spark.plan import plan_read

        ranges = plan_read(self.opts)
        # Spark wants at least one partition; an empty range reads nothing
        return [QueuePartition(r) for r in ranges] or [QueuePartition(None)]

    def read(self, partition):
        from pocketmq.spark.read import read_range

        r = partition.value
        if r is None:
            return iter(())
        return read_range(self.opts.namesrv_addr, r, self.opts.sub_expression, self.opts.fail_on_data_loss,
                          self.columns, credentials=self.opts.credentials,
                          tls=self.opts.tls)


@dataclass
class WriteResult(WriterCommitMessage):
    messages: int
    batches: int


class PocketMQWriter(DataSourceWriter):
    def __init__(self, options, overwrite: bool):
        self.opts = parse_writer_options(dict(options), environ=os.environ)
        self.overwrite = overwrite
        self.committed: list[WriteResult] | None = None

    def write(self, iterator):
        from pocketmq.spark.write import write_rows

        messages, batches = write_rows(self.opts, iterator)
        return WriteResult(messages, batches)

    def commit(self, messages):
        # sends are durable once acknowledged: there is nothing to publish at commit
        self.committed = [m for m in messages if m is not None]

    def abort(self, messages):
        # messages already acknowledged by the broker cannot be taken back (at-least-once
        # like the Kafka sink); the failed task's reason is Spark's error
        self.committed = None
