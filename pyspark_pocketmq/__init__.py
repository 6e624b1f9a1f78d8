"""Discovery shim: Spark registers the `DefaultSource` of every top-level `pyspark_*`
module, so `spark.read.format("pocketmq")` works without spark.dataSource.register."""
from pocketmq.spark import PocketMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
