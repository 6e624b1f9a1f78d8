"""The gRPC endpoint for RocketMQ 5.x clients (RocketMQ's proxy in local mode).

`mqbroker --enable-proxy` (or enableProxy=true) serves apache.rocketmq.v2's
MessagingService on grpcServerPort, in the broker's own process and event loop, calling
the broker's store and processors directly as RocketMQ's local proxy does. Needs the
`grpc` extra (grpcio, protobuf). `pb/` holds the generated modules, `protos/` the
.proto files written for pocketmq and their generator.
"""
