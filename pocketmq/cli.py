"""`pocketmq`: the project's front door.

    pocketmq dev            a nameserver and a broker in one process (store in ./pocketmq-dev)
    pocketmq dev --demo     the same, then send and consume a few messages and print them
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time


def _parser() -> argparse.ArgumentParser:
    from pocketmq import __version__
    p = argparse.ArgumentParser(prog="pocketmq", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"pocketmq {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    dev = sub.add_parser("dev", help="run a nameserver and a broker in one process")
    dev.add_argument("--dir", default="./pocketmq-dev", help="store directory (default ./pocketmq-dev)")
    dev.add_argument("--namesrv-port", type=int, default=9876)
    dev.add_argument("--broker-port", type=int, default=10911)
    dev.add_argument("--demo", action="store_true", help="send and consume a few messages, print them, exit")
    dev.add_argument("--sync-flush", action="store_true", help="flushDiskType=SYNC_FLUSH")
    return p


async def _demo(namesrv_addr: str, broker_addr: str, count: int = 5) -> list:
    """Produce and consume through the wire protocol, as any RocketMQ client would."""
    from pocketmq.client.lite_pull_consumer import LitePullConsumer
    from pocketmq.client.message import Message
    from pocketmq.client.producer import Producer
    topic = "DemoTopic"
    received = []
    async with Producer("demo_producer", namesrv_addr) as producer:
        for i in range(count):
            r = await producer.send(Message(topic, f"hello pocketmq #{i}", tags="demo", keys=f"k{i}"))
            print(f"sent     msgId={r.msg_id} queue={r.queue.queue_id} offset={r.queue_offset}")
    consumer = LitePullConsumer("demo_consumer", namesrv_addr, consume_from_where="FIRST_OFFSET")
    consumer.subscribe(topic, "demo")
    async with consumer:
        deadline = time.monotonic() + 20
        while len(received) < count and time.monotonic() < deadline:
            for m in await consumer.poll(timeout_s=1.0):
                received.append(m)
                print(f"received msgId={m.msg_id} queue={m.queue_id} offset={m.queue_offset} "
                      f"tags={m.tags} keys={' '.join(m.keys)} "
                      f"body={m.body.decode()!r}")
        await consumer.commit()
    return received


async def _dev(args) -> int:
    from pocketmq.broker.app import Broker
    from pocketmq.broker.config import parse_args as broker_args
    from pocketmq.nameserver.app import NameServer
    from pocketmq.nameserver.config import parse_args as ns_args
    store_dir = os.path.abspath(args.dir)
    os.makedirs(store_dir, exist_ok=True)
    print(f"pocketmq dev: store in {store_dir}", flush=True)
    ns_cfg, _ = ns_args([f"--listenPort={args.namesrv_port}", f"--kvConfigPath={store_dir}/namesrv/kvConfig.json"])
    namesrv_addr = f"127.0.0.1:{args.namesrv_port}"
    b_cfg, _ = broker_args(["-n", namesrv_addr, f"--listenPort={args.broker_port}", "--brokerIP1=127.0.0.1",
                            f"--storePathRootDir={store_dir}/store",
                            "--mappedFileSizeCommitLog=134217728"]
                           + (["--flushDiskType=SYNC_FLUSH"] if args.sync_flush else []))
    namesrv = NameServer(ns_cfg)
    broker = Broker(b_cfg)
    await namesrv.start()
    try:
        try:
            await broker.start()
        except BaseException:
            await broker.close()
            raise
        try:
            print(f"pocketmq dev: nameserver {namesrv_addr}, broker {broker.addr} "
                  f"(export NAMESRV_ADDR={namesrv_addr})", flush=True)
            if args.demo:
                got = await _demo(namesrv_addr, broker.addr)
                print(f"pocketmq dev --demo: {len(got)} messages consumed", flush=True)
                return 0 if got else 1
            from pocketmq.remoting.daemon import run_until_signal
            await run_until_signal()
        finally:
            await broker.close()
    finally:
        await namesrv.close()
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from pocketmq.remoting.daemon import install_uvloop, setup_logging
    setup_logging("WARNING" if getattr(args, "demo", False) else "INFO")
    install_uvloop()
    if args.command == "dev":
        from pocketmq.broker.app import MetadataError
        from pocketmq.broker.store.api import StoreError
        try:
            return asyncio.run(_dev(args))
        except (OSError, StoreError, MetadataError) as e:
            print(f"pocketmq dev: {e}", file=sys.stderr)
            return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
