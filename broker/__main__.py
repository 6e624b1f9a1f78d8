"""`mqbroker` / `python -m pocketmq.broker`: run one broker.

    mqbroker -c broker.conf -n 127.0.0.1:9876 --listenPort=10911
    mqbroker --enable-proxy ...     also serve RocketMQ 5.x clients over gRPC on grpcServerPort
                                    (RocketMQ's flag; the same as --enableProxy=true)
"""
from __future__ import annotations

import asyncio
import logging
import sys


def main(argv=None) -> int:
    from pocketmq.broker.config import ConfigError, parse_args
    from pocketmq.remoting.daemon import install_uvloop, run_until_signal, setup_logging
    argv = sys.argv[1:] if argv is None else argv
    # RocketMQ 5's start-script flag, as the config key it stands for
    argv = ["--enableProxy=true" if a == "--enable-proxy" else a for a in argv]
    try:
        parsed = parse_args(argv)  # -h/-p/-m print and raise SystemExit(0)
    except ConfigError as e:
        print(f"mqbroker: {e}", file=sys.stderr)
        return 2
    config, report = parsed
    setup_logging()
    log = logging.getLogger("pocketmq.broker")
    if report.config_file:
        log.info("load config file %s", report.config_file)
    for line in (report.unused_line(), *report.notes):
        if line:
            log.info("%s", line)
    from pocketmq.broker.app import Broker
    install_uvloop()
    from pocketmq.broker.app import MetadataError
    from pocketmq.broker.store.api import StoreError
    if config.enableControllerMode:
        # automatic failover: the agent runs the broker in the role the group's election gives
        from pocketmq.broker.services.failover import FailoverAgent
        service = FailoverAgent(config, broker_factory=Broker, config_path=report.config_file)
    else:
        service = Broker(config, config_path=report.config_file)
    try:
        asyncio.run(run_until_signal(service))
    except (OSError, StoreError, MetadataError) as e:
        log.error("broker failed to start: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
