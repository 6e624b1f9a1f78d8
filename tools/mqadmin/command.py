"""What a command is (RocketMQ's SubCommand): a name, a description, its flags and an
async `run(session, args, out)`. The families (topic.py, cluster.py, consumer.py,
offset.py, message.py) each export COMMANDS; cli.py turns them into argparse parsers.

Flag value types live here too: they are shared by the families and their errors are
usage errors (exit code 2).
"""
from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pocketmq.tools.mqadmin.session import AdminSession

Out = Callable[[str], None]


@dataclass
class Opt:
    short: str
    long: str
    help: str
    required: bool = False
    takes_value: bool = True
    type: Callable | None = None
    default: object = None
    metavar: str | None = None
    dest: str | None = None


@dataclass
class Command:
    name: str
    desc: str
    opts: list[Opt]
    run: Callable[[AdminSession, argparse.Namespace, Out], Awaitable[None]]
    needs_namesrv: bool = True
    epilog: str | None = None
    parser: argparse.ArgumentParser | None = field(default=None, repr=False)


# -- flag value types ---------------------------------------------------------------------

def _integer(s: str, hint: str = "") -> int:
    try:
        return int(s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer{hint}") from None


def positive_int(s: str) -> int:
    v = _integer(s)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{s!r} must be positive")
    return v


def non_negative_int(s: str) -> int:
    v = _integer(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{s!r} must not be negative")
    return v


def perm(s: str) -> int:
    v = _integer(s, " (2=W, 4=R, 6=RW)")
    if not 0 <= v <= 15:
        raise argparse.ArgumentTypeError(f"{s!r} is not a permission (2=W, 4=R, 6=RW)")
    return v


def rw_perm(s: str) -> int:
    """A topic permission as updateTopicPerm takes it: 2 (W), 4 (R) or 6 (RW)."""
    v = _integer(s, " (2=W, 4=R, 6=RW)")
    if v not in (2, 4, 6):
        raise argparse.ArgumentTypeError(f"{s!r} is not a topic permission (2=W, 4=R, 6=RW)")
    return v


def java_bool(s: str) -> bool:
    """Boolean.parseBoolean: true only for "true" (any case)."""
    return s.strip().lower() == "true"


def stripped(s: str) -> str:
    v = s.strip()
    if not v:
        raise argparse.ArgumentTypeError("must not be empty")
    return v
