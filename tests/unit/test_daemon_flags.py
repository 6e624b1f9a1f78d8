"""`mqbroker` / `mqnamesrv` flags without a value: a known key is refused with an example
of its type (not `=true` for a port), a name that is no key is an unknown key."""
from __future__ import annotations

import enum
from typing import Annotated

import pytest
from pydantic import Field

from pocketmq.broker import config as broker_config
from pocketmq.common.properties_file import (
    CliOption,
    ConfigError,
    example_value,
    parse_command_line,
)
from pocketmq.nameserver import config as namesrv_config


@pytest.mark.parametrize(("argv", "message"), [
    (["--listenPort"], "command line --listenPort: listenPort: needs a value (--listenPort=<integer>)"),
    (["--listenPort", "--brokerId=0"], "listenPort: needs a value (--listenPort=<integer>)"),
    (["--autoCreateTopicEnable"], "needs a value (--autoCreateTopicEnable=true)"),
    (["--flushDiskType"], "needs a value (--flushDiskType=SYNC_FLUSH|ASYNC_FLUSH)"),
    (["--brokerName"], "needs a value (--brokerName=<text>)"),
    (["--mapedFileSizeCommitLog"], "needs a value (--mapedFileSizeCommitLog=<integer>)"),   # old spelling
    (["--bogus"], "command line --bogus: bogus: unknown key"),
    (["--bogus", "--listenPort=1"], "bogus: unknown key"),
    (["--listenPrt"], "listenPrt: unknown key; did you mean listenPort?"),
    (["--bogus", "5"], "bogus: unknown key"),
])
def test_broker_flags(argv, message):
    with pytest.raises(ConfigError) as caught:
        broker_config.parse_args(argv)
    assert message in str(caught.value)
    assert "=true" not in str(caught.value) or "Enable" in argv[0]


def test_ignored_key_still_needs_a_value():
    with pytest.raises(ConfigError, match=r"storePathIndex: needs a value \(--storePathIndex=<value>\)"):
        broker_config.parse_args(["--storePathIndex"])


def test_nameserver_flags():
    with pytest.raises(ConfigError, match=r"needs a value \(--listenPort=<integer>\)"):
        namesrv_config.parse_args(["--listenPort"])
    with pytest.raises(ConfigError, match="bogus: unknown key"):
        namesrv_config.parse_args(["--bogus"])


def test_parse_command_line_passes_an_unknown_name_on():
    line = parse_command_line(["--bogus", "--x=1"], [CliOption("h", "help", False, "help")],
                              value_hint=lambda name: None)
    assert [(s.key, s.value) for s in line.overrides] == [("bogus", ""), ("x", "1")]


class Mode(enum.Enum):
    A = 1
    B = 2


@pytest.mark.parametrize(("annotation", "example"), [
    (bool, "true"), (int, "<integer>"), (Annotated[int, Field(ge=0)], "<integer>"), (float, "<number>"),
    (str, "<text>"), (str | None, "<text>"), (Mode, "A|B"), (Mode | None, "A|B"), (list, "<value>"),
])
def test_example_value(annotation, example):
    assert example_value(annotation) == example
