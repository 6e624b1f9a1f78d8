"""`mqadmin`: RocketMQ's admin console, same command names and flag letters.

    mqadmin <command> [-n ip:port[;ip:port]] [flags]
    mqadmin help [<command>]

    mqadmin --version

Commands: `mqadmin help` lists them (RocketMQ's names), one family module each.

`-n` defaults to the NAMESRV_ADDR environment variable. Exit codes: 0 success,
1 the operation failed (unreachable server, error response, not found),
2 bad command line. Every failure is one `mqadmin: ...` line on stderr;
set MQADMIN_DEBUG=1 to get tracebacks and remoting logs as well.

This module is the argparse shell: the commands live in their families (topic.py,
cluster.py, controller.py, stats.py, consumer.py, subgroup.py, offset.py, message.py, broker.py, namesrv.py,
consume.py, acl.py) and talk through session.AdminSession.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from pocketmq.tools.mqadmin import (
    acl,
    broker,
    cluster,
    consume,
    consumer,
    controller,
    message,
    namesrv,
    offset,
    stats,
    subgroup,
    tables,
    topic,
)
from pocketmq.client.credentials import resolve_credentials
from pocketmq.client.errors import InvalidArgumentError
from pocketmq.tools.mqadmin.command import Command, Opt, Out
from pocketmq.tools.mqadmin.errors import (
    EXIT_FAILED,
    EXIT_OK,
    PROG,
    AdminError,
    UsageError,
    one_line,
)
from pocketmq.tools.mqadmin.session import NO_NAMESRV, AdminSession

_N = Opt("n", "namesrvAddr", "Name server address list, eg: '192.168.0.1:9876;192.168.0.2:9876' "
                             "(default: $NAMESRV_ADDR)", metavar="ip:port")

# Every command's session credentials and TLS (issue 32). RocketMQ's mqadmin has no such
# flags (it reads conf/tools.yml); the environment variables work for every tool. A command
# whose own flags are named accessKey/secretKey (updateAclConfig: the account it writes)
# takes the session's from the environment only.
_SESSION_FLAGS = (
    ("accessKey", "ACL access key every request is signed with (default: $ROCKETMQ_ACCESS_KEY)"),
    ("secretKey", "ACL secret key (default: $ROCKETMQ_SECRET_KEY)"),
)

# in the order `mqadmin help` lists them
COMMANDS: dict[str, Command] = {c.name: c for family in (topic, cluster, controller, stats, broker, namesrv, consumer,
                                                         subgroup, offset, message, consume, acl)
                                for c in family.COMMANDS}


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        name = self.prog.split()[-1]
        raise UsageError(f"{name}: {message} (see 'mqadmin help {name}')")

    def exit(self, status=0, message=None):
        if message:
            print(message, file=sys.stderr, end="")
        raise SystemExit(status)


def build_parser(c: Command) -> argparse.ArgumentParser:
    p = _Parser(prog=f"{PROG} {c.name}", description=c.desc, add_help=True,
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=c.epilog)
    for o in [_N] + c.opts:
        kw = {"help": o.help, "required": o.required, "dest": o.dest or o.long}
        if o.takes_value:
            kw["metavar"] = o.metavar or o.long
            if o.type is not None:
                kw["type"] = o.type
            kw["default"] = o.default
        else:
            kw["action"] = "store_true"
        p.add_argument(f"-{o.short}", f"--{o.long}", **kw)
    return p


def session_parser(c: Command) -> argparse.ArgumentParser:
    """The session flags every command takes (besides its own, which keep RocketMQ's flag
    set exactly): read from the command line first, the rest goes to the command's parser.
    A flag the command itself defines stays the command's."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    taken = {o.long for o in c.opts}
    for long, text in _SESSION_FLAGS:
        if long not in taken:
            p.add_argument(f"--{long}", dest=f"session_{long}", metavar=long, help=text)
    if "tls" not in taken:
        p.add_argument("--tls", dest="session_tls", action="store_true",
                       help="connect over TLS (daemons with tlsServerMode permissive or enforcing)")
    return p


def command_list() -> str:
    return tables.format_command_list((c.name, c.desc) for c in COMMANDS.values())


def _get_command(name: str) -> Command:
    c = COMMANDS.get(name)
    if c is None:
        raise UsageError(f"unknown command '{name}' (run 'mqadmin help' for the list)")
    return c


async def _run(c: Command, args: argparse.Namespace, out: Out) -> None:
    namesrv = args.namesrvAddr or os.environ.get("NAMESRV_ADDR") or None
    if c.needs_namesrv and not namesrv:
        raise UsageError(NO_NAMESRV)
    try:
        credentials = resolve_credentials(getattr(args, "session_accessKey", None),
                                          getattr(args, "session_secretKey", None))
    except InvalidArgumentError as e:
        raise UsageError(str(e)) from None
    session = AdminSession(namesrv, credentials=credentials, tls=getattr(args, "session_tls", False) or None)
    try:
        await c.run(session, args, out)
    finally:
        await session.close()


def _out(line: str) -> None:
    print(line)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(os.environ.get("MQADMIN_DEBUG"))
    pocket_log = logging.getLogger("pocketmq")
    saved = pocket_log.propagate
    quiet = logging.NullHandler()
    if debug:
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
    else:
        # Remoting warnings would add noise to the one-line error contract; restore
        # the logger afterwards so an in-process caller (tests, embedders) is unaffected.
        # (Not propagating is not enough: a record that finds no handler at all goes to
        # logging.lastResort, which prints warnings to stderr; the NullHandler takes it.)
        pocket_log.propagate = False
        pocket_log.addHandler(quiet)
    try:
        return _main(argv)
    finally:
        pocket_log.propagate = saved
        pocket_log.removeHandler(quiet)


def _main(argv: list[str]) -> int:
    try:
        if not argv or argv[0] in ("-h", "--help"):
            print(command_list())
            return EXIT_OK
        if argv[0] == "--version":
            print(f"{PROG} (pocketmq) {pocketmq_version()}")
            return EXIT_OK
        if argv[0] == "help":
            if len(argv) == 1:
                print(command_list())
            else:
                c = _get_command(argv[1])
                print(build_parser(c).format_help(), end="")
                text = session_parser(c).format_help()
                print("\nsession options (every command):\n" + text[text.index("\n  -"):].strip("\n"))
            return EXIT_OK
        c = _get_command(argv[0])
        try:
            session_args, rest = session_parser(c).parse_known_args(argv[1:])
            args = build_parser(c).parse_args(rest, namespace=session_args)
        except SystemExit as e:         # -h/--help inside a command
            return int(e.code or 0)
        asyncio.run(_run(c, args, _out))
        sys.stdout.flush()
        return EXIT_OK
    except AdminError as e:
        _flush_quietly()
        print(f"{PROG}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): not an error worth a message
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
    except Exception as e:  # noqa: BLE001 - last resort: one line, never a traceback
        if os.environ.get("MQADMIN_DEBUG"):
            import traceback
            traceback.print_exc()
        print(f"{PROG}: internal error: {type(e).__name__}: {one_line(str(e))}", file=sys.stderr)
        return EXIT_FAILED


def pocketmq_version() -> str:
    """The installed distribution's version (written once, in pocketmq/__init__.py: the
    tools may not import the root package, the metadata carries it)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("pocketmq")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _flush_quietly() -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
