"""`pocketmq`: the project's front door.

    pocketmq dev            a nameserver and a broker in one process (store in ./pocketmq-dev),
                            listening on 127.0.0.1 only (--bind 0.0.0.0: every interface)
    pocketmq dev --demo     the same, then send and consume a few messages and print them
    pocketmq dev --grpc-port 8081
                            the gRPC endpoint for RocketMQ 5.x clients (the default, when the
                            grpc extra is installed; --grpc-port 0 turns it off)
    pocketmq dev --accessKey AK --secretKey SK
                            with plain ACL on both daemons and the gRPC endpoint, AK an admin
                            account (also from $ROCKETMQ_ACCESS_KEY / $ROCKETMQ_SECRET_KEY)
    pocketmq dev --console-port 8080
                            the web console too (the default when the console extra is
                            installed; 0: not served)
    pocketmq console --namesrv ADDR [--bind 127.0.0.1] [--port 8080] [--read-only] [--users FILE]
                            the web console of a cluster (pip install 'pocketmq[console]')
    pocketmq console --hash-password
                            print a users-file hash of a password read from the terminal
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import os
import sys
import time

# What `pocketmq dev` listens on unless --bind says otherwise: a development cluster is not
# reachable from the network by default (mqnamesrv / mqbroker keep RocketMQ's 0.0.0.0).
DEV_BIND = "127.0.0.1"


class PortInUse(Exception):
    """A port `pocketmq dev` wants is taken; the message names the flag that moves it."""


def _ip(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an IP address: {text!r} (127.0.0.1, 0.0.0.0, ...)") from None


def _parser() -> argparse.ArgumentParser:
    from pocketmq import __version__
    p = argparse.ArgumentParser(prog="pocketmq", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"pocketmq {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    dev = sub.add_parser("dev", help="run a nameserver and a broker in one process")
    dev.add_argument("--dir", default="./pocketmq-dev", help="store directory (default ./pocketmq-dev)")
    dev.add_argument("--namesrv-port", type=int, default=9876, help="nameserver port (default 9876)")
    dev.add_argument("--broker-port", type=int, default=10911, help="broker port (default 10911)")
    dev.add_argument("--bind", type=_ip, default=DEV_BIND, metavar="ADDR",
                     help=f"address to listen on (default {DEV_BIND}; 0.0.0.0 = every interface, "
                          "the broker then advertises this host's first non-loopback address)")
    dev.add_argument("--demo", action="store_true", help="send and consume a few messages, print them, exit")
    dev.add_argument("--sync-flush", action="store_true", help="flushDiskType=SYNC_FLUSH")
    dev.add_argument("--grpc-port", type=int, default=8081, metavar="PORT",
                     help="the gRPC endpoint for RocketMQ 5.x clients (default 8081; 0: not served); needs "
                          "pip install 'pocketmq[grpc]'; with --accessKey it checks the same ACL")
    dev.add_argument("--accessKey", metavar="AK",
                     help="run plain ACL with this admin account (default: $ROCKETMQ_ACCESS_KEY); "
                          "the demo signs with it; keys longer than 6 characters")
    dev.add_argument("--secretKey", metavar="SK", help="its secret key (default: $ROCKETMQ_SECRET_KEY)")
    dev.add_argument("--console-port", type=int, default=8080, metavar="PORT",
                     help="the web console (default 8080; 0: not served); needs pip install 'pocketmq[console]'")
    con = sub.add_parser("console", help="serve the web console of a cluster")
    con.add_argument("--namesrv", "-n", default=os.environ.get("NAMESRV_ADDR"), metavar="ADDR",
                     help="nameserver ip:port[;ip:port] (default: $NAMESRV_ADDR)")
    con.add_argument("--bind", type=_ip, default=DEV_BIND, metavar="ADDR",
                     help=f"address to listen on (default {DEV_BIND}; 0.0.0.0 = every interface)")
    con.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    con.add_argument("--read-only", action="store_true", help="show everything, change nothing (every write refused)")
    con.add_argument("--users", metavar="FILE", help="log in with the accounts of FILE (name:role:hash lines, "
                                                     "role viewer or admin; see --hash-password)")
    con.add_argument("--access-key", "--accessKey", dest="access_key", metavar="AK",
                     help="sign requests for ACL brokers (default: $ROCKETMQ_ACCESS_KEY)")
    con.add_argument("--secret-key", "--secretKey", dest="secret_key", metavar="SK",
                     help="its secret key (default: $ROCKETMQ_SECRET_KEY)")
    con.add_argument("--lag-sample-s", type=float, default=10.0, metavar="S",
                     help="sample every group's lag every S seconds for the lag charts (default 10)")
    con.add_argument("--hash-password", action="store_true", help="read a password, print its users-file hash, exit")
    return p


def _acl_args(store_dir: str, creds) -> tuple[list[str], list[str]]:
    """With credentials, the dev cluster runs plain ACL: {dir}/plain_acl.yml (rewritten at
    each start) holds that one account as admin, both daemons check every request with it,
    and the broker signs its registration as it. Returns (nameserver args, broker args)."""
    if creds is None:
        return [], []
    import json
    path = os.path.join(store_dir, "plain_acl.yml")
    with open(path, "w") as f:
        # JSON strings are YAML scalars: any character of a key survives quoting
        f.write("# written by `pocketmq dev` from its --accessKey/--secretKey (or the environment)\n"
                f"accounts:\n  - accessKey: {json.dumps(creds.access_key)}\n"
                f"    secretKey: {json.dumps(creds.secret_key)}\n    admin: true\n")
    os.chmod(path, 0o600)
    common = ["--aclEnable=true", f"--aclFilePath={path}"]
    return common, common + [f"--accessKey={creds.access_key}", f"--secretKey={creds.secret_key}"]


def _grpc_args(port: int, bind: str) -> tuple[list[str], str]:
    """The broker's gRPC endpoint for `pocketmq dev`: on unless --grpc-port 0, the grpc extra
    is missing or the port is taken (an optional part of a development cluster: the 4.x
    ports still start, and the line printed says how to get it). With credentials it checks
    every call against the same plain ACL as the 4.x port. Returns (broker args, why it is
    off)."""
    off = "gRPC endpoint (RocketMQ 5.x clients) off: "
    if port == 0:
        return [], ""
    try:
        import grpc  # noqa: F401
    except ImportError:
        return [], off + "pip install 'pocketmq[grpc]' to serve it"
    import socket
    with socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET) as probe:
        try:
            probe.bind((bind, port))
        except OSError as e:
            return [], off + f"cannot listen on {bind}:{port} ({e.strerror}); pick another port with --grpc-port PORT"
    return ["--enableProxy=true", f"--grpcServerPort={port}"], ""


async def _demo(namesrv_addr: str, broker_addr: str, count: int = 5, credentials=None) -> list:
    """Produce and consume through the wire protocol, as any RocketMQ client would."""
    from pocketmq.client.lite_pull_consumer import LitePullConsumer
    from pocketmq.client.message import Message
    from pocketmq.client.producer import Producer
    topic = "DemoTopic"
    received = []
    async with Producer("demo_producer", namesrv_addr, credentials=credentials) as producer:
        for i in range(count):
            r = await producer.send(Message(topic, f"hello pocketmq #{i}", tags="demo", keys=f"k{i}"))
            print(f"sent     msgId={r.msg_id} queue={r.queue.queue_id} offset={r.queue_offset}")
    consumer = LitePullConsumer("demo_consumer", namesrv_addr, consume_from_where="FIRST_OFFSET",
                                credentials=credentials)
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
    from pocketmq.broker.proxy.server import GrpcPortInUse
    from pocketmq.nameserver.app import NameServer
    from pocketmq.nameserver.config import parse_args as ns_args
    from pocketmq.client.credentials import resolve_credentials
    creds = resolve_credentials(args.accessKey, args.secretKey)
    store_dir = os.path.abspath(args.dir)
    os.makedirs(store_dir, exist_ok=True)
    print(f"pocketmq dev: store in {store_dir}", flush=True)
    ns_acl, broker_acl = _acl_args(store_dir, creds)
    ns_cfg, _ = ns_args([f"--listenPort={args.namesrv_port}", f"--kvConfigPath={store_dir}/namesrv/kvConfig.json"]
                        + ns_acl)
    every_interface = ipaddress.ip_address(args.bind).is_unspecified
    # Where this process reaches its own nameserver, and the address the broker advertises:
    # the bound address itself, or (bound to every interface) loopback and the default brokerIP1.
    local_ip = "127.0.0.1" if every_interface else args.bind
    namesrv_addr = f"{local_ip}:{args.namesrv_port}"
    grpc_args, grpc_note = _grpc_args(args.grpc_port, args.bind)

    def broker_config(grpc_args):
        return broker_args(grpc_args + ["-n", namesrv_addr, f"--listenPort={args.broker_port}",
                                        f"--storePathRootDir={store_dir}/store",
                                        "--mappedFileSizeCommitLog=134217728"]
                           + ([] if every_interface else [f"--brokerIP1={args.bind}"])
                           + (["--flushDiskType=SYNC_FLUSH"] if args.sync_flush else []) + broker_acl)[0]
    b_cfg = broker_config(grpc_args)
    if creds is not None:
        print(f"pocketmq dev: plain ACL on, admin account {creds.access_key} ({store_dir}/plain_acl.yml)",
              flush=True)
    namesrv = NameServer(ns_cfg, host=args.bind)
    broker = Broker(b_cfg, host=args.bind)
    await _start(namesrv, args.bind, args.namesrv_port, "--namesrv-port")
    try:
        try:
            await _start(broker, args.bind, args.broker_port, "--broker-port")
        except GrpcPortInUse as e:
            # taken between _grpc_args' probe and the bind (another process starting): the
            # optional endpoint steps aside, as when the probe finds it taken
            await broker.close()
            grpc_note = f"gRPC endpoint (RocketMQ 5.x clients) off: {e}; pick another port with --grpc-port PORT"
            broker = Broker(broker_config([]), host=args.bind)
            try:
                await _start(broker, args.bind, args.broker_port, "--broker-port")
            except BaseException:
                await broker.close()
                raise
        except BaseException:
            await broker.close()
            raise
        try:
            where = "every interface" if every_interface else args.bind
            # before the ready line (the last line printed once serving)
            if broker.grpc_endpoint is not None:
                print(f"pocketmq dev: RocketMQ 5.x clients: endpoints {local_ip}:{broker.grpc_endpoint.port}",
                      flush=True)
            elif grpc_note:
                print(f"pocketmq dev: {grpc_note}", flush=True)
            console = None if args.demo else await _dev_console(args, namesrv_addr, creds)
            from pocketmq.remoting.daemon import run_until_signal, stop_on_signal
            # handled before the ready line: its reader may stop us as soon as it reads it
            stop = None if args.demo else stop_on_signal()
            print(f"pocketmq dev: nameserver {namesrv_addr}, broker {broker.addr}, listening on {where} "
                  f"(export NAMESRV_ADDR={namesrv_addr})", flush=True)
            if args.demo:
                got = await _demo(namesrv_addr, broker.addr, credentials=creds)
                print(f"pocketmq dev --demo: {len(got)} messages consumed", flush=True)
                return 0 if got else 1
            try:
                await run_until_signal(stop=stop)
            finally:
                if console is not None:
                    await console.close()
        finally:
            await broker.close()
    finally:
        await namesrv.close()
    return 0


async def _dev_console(args, namesrv_addr: str, creds):
    """`pocketmq dev`'s web console: on unless --console-port 0 or the console extra is missing
    (an optional part: the cluster still starts, and the line printed says how to get it)."""
    if args.console_port == 0:
        return None
    try:
        from pocketmq.console.server import start_console
    except ImportError:
        print("pocketmq dev: web console off: pip install 'pocketmq[console]' to serve it", flush=True)
        return None
    try:
        console = await start_console(namesrv_addr, bind=args.bind, port=args.console_port, credentials=creds)
    except OSError as e:
        print(f"pocketmq dev: web console off: cannot listen on {args.bind}:{args.console_port} ({e.strerror}); "
              "pick another port with --console-port PORT", flush=True)
        return None
    print(f"pocketmq dev: web console {console.url}", flush=True)
    return console


async def _console(args) -> int:
    from pocketmq.client.credentials import resolve_credentials
    from pocketmq.console.server import start_console
    from pocketmq.tools.mqadmin.session import parse_namesrv_addrs
    if not args.namesrv:
        print("pocketmq console: pass --namesrv ip:port[;ip:port] or set NAMESRV_ADDR", file=sys.stderr)
        return 2
    parse_namesrv_addrs(args.namesrv)
    creds = resolve_credentials(args.access_key, args.secret_key)
    console = await start_console(args.namesrv, bind=args.bind, port=args.port, read_only=args.read_only,
                                  users_file=args.users, credentials=creds,
                                  sample_interval_s=max(0.2, args.lag_sample_s))
    mode = " (read-only)" if args.read_only else ""
    from pocketmq.remoting.daemon import run_until_signal, stop_on_signal
    stop = stop_on_signal()  # before the ready line (see stop_on_signal)
    print(f"pocketmq console: {console.url} for nameserver {args.namesrv}{mode}", flush=True)
    try:
        await run_until_signal(stop=stop)
    finally:
        await console.close()
    return 0


def _hash_password() -> int:
    import getpass
    import secrets
    from pocketmq.console.auth import hash_password
    pw = getpass.getpass("password: ")
    if pw != getpass.getpass("again: "):
        print("pocketmq console: the passwords differ", file=sys.stderr)
        return 1
    print(hash_password(pw, secrets.token_bytes(16)))
    return 0


async def _start(daemon, host: str, port: int, flag: str) -> None:
    from pocketmq.broker.app import HAPortError
    try:
        await daemon.start()
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        role = "nameserver" if flag == "--namesrv-port" else "broker"
        # the broker's HA port follows its port (haListenPort = listenPort + 1): the same flag moves it
        where = f"its HA port {host}:{port + 1} ({flag} + 1)" if isinstance(e, HAPortError) else f"{host}:{port}"
        raise PortInUse(f"the {role} cannot listen on {where}: address already in use "
                        f"(another pocketmq dev, mqnamesrv or mqbroker?); pick another port with "
                        f"{flag} PORT") from None


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from pocketmq.remoting.daemon import install_uvloop, setup_logging
    setup_logging("WARNING" if getattr(args, "demo", False) else "INFO")
    install_uvloop()
    if args.command == "dev":
        from pocketmq.broker.app import MetadataError
        from pocketmq.broker.store.api import StoreError
        from pocketmq.client.errors import InvalidArgumentError
        from pocketmq.common.properties_file import ConfigError
        try:
            return asyncio.run(_dev(args))
        except (PortInUse, OSError, StoreError, MetadataError, InvalidArgumentError, ConfigError) as e:
            print(f"pocketmq dev: {e}", file=sys.stderr)
            return 1
    if args.command == "console":
        if args.hash_password:
            return _hash_password()
        try:
            from pocketmq.console.auth import UsersFileError
        except ImportError:
            print("pocketmq console: the console extra is missing: pip install 'pocketmq[console]'", file=sys.stderr)
            return 1
        from pocketmq.client.errors import InvalidArgumentError
        from pocketmq.tools.mqadmin.errors import UsageError
        try:
            return asyncio.run(_console(args))
        except (OSError, UsersFileError, InvalidArgumentError, UsageError) as e:
            print(f"pocketmq console: {e}", file=sys.stderr)
            return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
