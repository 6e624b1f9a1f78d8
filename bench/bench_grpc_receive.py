"""POP over the gRPC endpoint against pull over remoting, the same broker, one run (issue 33's
target: the official 5.x SimpleConsumer's receive(32) + ack throughput >= 0.5x our
LitePullConsumer's poll(32) + commit).

A topic is filled with `--count` messages of `--size` bytes by our remoting Producer; then,
each with a group of its own reading the same messages from the first offset:

* the official RocketMQ 5.x Python client (rocketmq-python-client 5.1.2, its own venv:
  tests/support/rmq5.py): `SimpleConsumer.receive(32, 30 s)`, then `ack(message)` for each
  (the client acks one message per AckMessage call), until `--count` messages;
* pocketmq's `LitePullConsumer` (remoting): `poll(max_records=32)`, then `commit()`, until
  `--count` messages.

* with `--stub`, also our generated stubs as a plain sync grpc client: ReceiveMessage(32),
  then one AckMessage carrying the 32 receipt handles (what the server can do when a
  client batches its acks; the official Python client does not).

    python3 bench/bench_grpc_receive.py                  # 20000 messages of 100 bytes, 2 rounds
    python3 bench/bench_grpc_receive.py --count 5000 --rounds 1 --stub
"""
from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_broker import print_calibration, temp_cluster  # noqa: E402
from pocketmq.client import Message, Producer  # noqa: E402
from pocketmq.client.lite_pull_consumer import LitePullConsumer  # noqa: E402
from tests.support.rmq5 import ensure_venv, proxy_cluster, run_driver  # noqa: E402


async def fill(namesrv: str, topic: str, count: int, size: int) -> None:
    async with Producer("bench_grpc_fill", namesrv) as p:
        m = Message(topic, b"x" * size)
        for _ in range(0, count, 64):
            await asyncio.gather(*(p.send(m) for _ in range(64)))


async def lite_pull_rate(namesrv: str, topic: str, group: str, count: int) -> float:
    c = LitePullConsumer(group, namesrv, consume_from_where="FIRST_OFFSET", auto_commit=False)
    c.subscribe(topic, "*")
    async with c:
        # timed from the first poll, as the 5.x side from its first receive: the consumer's
        # start (routes, the first rebalance) is left out, its background pulls are not
        t0 = time.perf_counter()
        got = 0
        while got < count:
            got += len(await c.poll(timeout_s=10, max_records=32))
            await c.commit()
        return got / (time.perf_counter() - t0)


def stub_rate(endpoint: str, topic: str, group: str, count: int) -> float:
    import grpc

    from pocketmq.broker.proxy.pb import definition_pb2 as pb
    from pocketmq.broker.proxy.pb import service_pb2 as spb
    from pocketmq.broker.proxy.pb import service_pb2_grpc
    s = service_pb2_grpc.MessagingServiceStub(grpc.insecure_channel(endpoint))
    md = [("x-mq-client-id", f"bench-stub-{os.getpid()}")]
    req = spb.ReceiveMessageRequest(group=pb.Resource(name=group), batch_size=32,
                                    message_queue=pb.MessageQueue(topic=pb.Resource(name=topic)))
    req.invisible_duration.FromSeconds(30)
    req.long_polling_timeout.FromSeconds(5)
    got, t0 = 0, time.perf_counter()
    while got < count:
        handles = [f.message.system_properties.receipt_handle for f in s.ReceiveMessage(req, metadata=md, timeout=30)
                   if f.WhichOneof("content") == "message"]
        ack = s.AckMessage(spb.AckMessageRequest(group=req.group, topic=pb.Resource(name=topic), entries=[
            spb.AckMessageEntry(receipt_handle=h) for h in handles]), metadata=md)
        assert ack.status.code == pb.OK, ack.status
        got += len(handles)
    return got / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stub", action="store_true", help="also our stubs: receive(32) + one ack of 32")
    a = ap.parse_args()
    python = ensure_venv()
    with temp_cluster("bench-grpc-recv", proxy_cluster) as c:
        print_calibration("before")
        for r in range(a.rounds):
            topic = f"BenchGrpcRecv{os.getpid()}x{r}"
            asyncio.run(fill(c.namesrv_addr, topic, a.count, a.size))
            [ev] = run_driver(python, c.grpc_endpoint, "bench_receive", timeout_s=900, topic=topic,
                              group=f"GBenchPop{r}", count=a.count, batch=32)
            ours = asyncio.run(lite_pull_rate(c.namesrv_addr, topic, f"GBenchPull{r}", a.count))
            print(f"round {r}: 5.x SimpleConsumer receive(32)+ack over gRPC {ev['per_s']:.0f} msgs/s, "
                  f"pocketmq LitePullConsumer poll(32)+commit over remoting {ours:.0f} msgs/s, "
                  f"ratio {ev['per_s'] / ours:.3f}", flush=True)
            if a.stub:
                rate = stub_rate(c.grpc_endpoint, topic, f"GBenchStub{r}", a.count)
                print(f"round {r}: our stubs, receive(32) + one AckMessage of 32 over gRPC {rate:.0f} msgs/s, "
                      f"ratio {rate / ours:.3f}", flush=True)
        print_calibration("after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
