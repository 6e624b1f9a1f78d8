"""pocketmq's PySpark connector: `spark.read.format("pocketmq")` / `df.write.format("pocketmq")`
(batch and streaming; pyspark.sql.datasource). Needs the `spark` extra (pyspark, pyarrow).

Found by Spark without a register call through the top-level shim `pyspark_pocketmq`
(Spark imports every `pyspark_*` module and registers its `DefaultSource`);
`spark.dataSource.register(PocketMQDataSource)` works too.
"""
from pocketmq.spark.source import PocketMQDataSource

__all__ = ["PocketMQDataSource"]
