"""RocketMQ 5's gRPC messages and MessagingService (proto package apache.rocketmq.v2),
generated from broker/proxy/protos/*.proto by broker/proxy/protos/generate.py.

POOL is pocketmq's own descriptor pool. The generated modules register their
descriptors here instead of protobuf's default pool, because the official 5.x
client (rocketmq-python-client) registers the very same `apache.rocketmq.v2` symbols
in the default pool: with both in one pool, whichever is imported second fails with
"duplicate symbol". The well-known types our files import (Duration, Timestamp) are
added first. One consequence: our messages' Duration/Timestamp fields are classes of
this pool, so set them with their methods (FromMilliseconds, seconds = ...), never
CopyFrom a `google.protobuf.duration_pb2.Duration`.
"""
from google.protobuf import descriptor_pool, duration_pb2, timestamp_pb2

POOL = descriptor_pool.DescriptorPool()
for _wkt in (duration_pb2, timestamp_pb2):
    POOL.AddSerializedFile(_wkt.DESCRIPTOR.serialized_pb)
