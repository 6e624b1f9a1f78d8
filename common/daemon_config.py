"""What the two daemons' configurations share: the loading shell, the Java types, Netty's keys.

``common.properties_file`` parses (pure functions of text and argv). This
module is the part that touches the outside world and pydantic: it reads the
``-c`` file and the environment, layers defaults < file < command line onto a
daemon's model, prints the ``-h``/``-p``/``-m`` texts, and turns whatever is
wrong into one ConfigError naming the key and where it came from.

``broker.config`` and ``nameserver.config`` hold only their own keys,
defaults and validators, plus one DaemonConfigLoader each; their
``load_config``/``parse_args`` call it. RocketMQ's ``NettyServerConfig`` is
one Java class both startups fill, so its keys are declared once here
(NettyServerConfig); a daemon's model inherits it *after* its own section so
that ``-p`` lists the keys in RocketMQ's order (pydantic orders inherited
fields by reversed MRO; a re-declared field such as ``listenPort`` keeps its
place and takes the daemon's default).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, TextIO, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from pocketmq.common.properties_file import (
    LAYER_COMMAND_LINE,
    LAYER_FILE,
    CliOption,
    ConfigError,
    LoadReport,
    Setting,
    decode_properties,
    error_from_validation,
    example_value,
    parse_command_line,
    parse_properties,
    resolve_settings,
    usage,
)

__all__ = [
    "INT_MAX",
    "LONG_MAX",
    "DaemonConfig",
    "DaemonConfigLoader",
    "FrameSize",
    "JavaInt",
    "JavaLong",
    "Name",
    "NettyServerConfig",
    "NonNegativeInt",
    "NonNegativeLong",
    "Port",
    "PositiveInt",
    "PositiveLong",
    "cross_field_error",
    "env",
    "override_settings",
    "read_settings_file",
]

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1

# Java's int/long ranges: a value Integer.parseInt would refuse is refused here too.
JavaInt = Annotated[int, Field(ge=-(2**31), le=INT_MAX)]
JavaLong = Annotated[int, Field(ge=-(2**63), le=LONG_MAX)]
Port = Annotated[int, Field(ge=0, le=65535)]
PositiveInt = Annotated[int, Field(ge=1, le=INT_MAX)]
NonNegativeInt = Annotated[int, Field(ge=0, le=INT_MAX)]
NonNegativeLong = Annotated[int, Field(ge=0, le=LONG_MAX)]
PositiveLong = Annotated[int, Field(ge=1, le=LONG_MAX)]
Name = Annotated[str, Field(min_length=1)]
# pocketmq's maxFrameSize (RocketMQ: system property com.rocketmq.remoting.frameMaxLength).
FrameSize = Annotated[int, Field(ge=1024, le=INT_MAX)]


def env(name: str) -> str | None:
    """An environment variable's value; unset and empty are both None (as RocketMQ's getenv checks)."""
    return os.environ.get(name) or None


def cross_field_error(key: str, detail: str, *related: str) -> PydanticCustomError:
    """A model validator's error about several keys.

    ``error_from_validation`` blames it on the first of ``key, *related`` the
    operator set explicitly (else on "default").
    """
    return PydanticCustomError("config", "{detail}", {"key": key, "related": related, "detail": detail})


_MISSING = object()


class DaemonConfig(BaseModel):
    """Base of a daemon's model: RocketMQ's camelCase keys as fields, strictly typed."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)

    def __setattr__(self, name: str, value: Any) -> None:
        # pydantic keeps an assigned value even when a model validator then
        # rejects it; put the old one back so a failed assignment changes nothing.
        previous = self.__dict__.get(name, _MISSING)
        try:
            super().__setattr__(name, value)
        except ValidationError:
            if previous is not _MISSING:
                self.__dict__[name] = previous
            raise

    def config_items(self) -> list[tuple[str, object]]:
        """(key, value) pairs in RocketMQ's class order."""
        return [(key, getattr(self, key)) for key in type(self).model_fields]


class NettyServerConfig(DaemonConfig):
    """NettyServerConfig.java (4.9.8): the keys of the remoting server both daemons run.

    Each daemon re-declares ``listenPort`` with the port its startup sets
    (NamesrvStartup 9876, BrokerStartup 10911).
    """

    listenPort: Port = 8888
    serverWorkerThreads: JavaInt = 8
    serverCallbackExecutorThreads: JavaInt = 0
    serverSelectorThreads: JavaInt = 3
    serverOnewaySemaphoreValue: JavaInt = 256
    serverAsyncSemaphoreValue: JavaInt = 64
    serverChannelMaxIdleTimeSeconds: NonNegativeInt = 120
    serverSocketSndBufSize: JavaInt = 0
    serverSocketRcvBufSize: JavaInt = 0
    writeBufferHighWaterMark: JavaInt = 0  # also NettyClientConfig's
    writeBufferLowWaterMark: JavaInt = 0  # also NettyClientConfig's
    serverSocketBacklog: JavaInt = 1024
    serverPooledByteBufAllocatorEnable: bool = True
    useEpollNativeSelector: bool = False


def read_settings_file(path: str) -> list[Setting]:
    """The entries of a ``-c`` file as settings sourced ``path:line``.

    Raises ConfigError (source ``path``) when it cannot be read.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ConfigError(None, path, f"cannot read config file: {exc.strerror or exc}") from None
    return [
        Setting(entry.key, entry.value, f"{path}:{entry.line}", LAYER_FILE)
        for entry in parse_properties(decode_properties(data), source=path)
    ]


def override_settings(overrides: Iterable[Setting] | Mapping[str, str]) -> list[Setting]:
    """Settings from the command line, or from a ``{key: raw value}`` mapping (sourced ``override KEY``)."""
    if isinstance(overrides, Mapping):
        return [
            Setting(key, value, f"override {key}", LAYER_COMMAND_LINE) for key, value in overrides.items()
        ]
    return list(overrides)


ConfigT = TypeVar("ConfigT", bound=DaemonConfig)


@dataclass(frozen=True)
class DaemonConfigLoader(Generic[ConfigT]):
    """How one daemon (``mqbroker``, ``mqnamesrv``) loads its configuration.

    ``listings``: option long name -> the text that option prints before
    exiting 0 (``-p``, ``-m``), checked in order after a successful load.
    ``environment``: key -> the environment variable its default comes from,
    so an error in it names ``environment NAME``. ``file_implies``: settings
    a ``-c FILE`` implies (sourced as the command line); keys set only that
    way are not reported as unused.
    """

    model: type[ConfigT]
    prog: str
    options: tuple[CliOption, ...]
    implemented_keys: frozenset[str]
    listings: Mapping[str, Callable[[ConfigT], str]]
    aliases: Mapping[str, str] = field(default_factory=dict)
    ignored_keys: Mapping[str, str] = field(default_factory=dict)
    environment: Mapping[str, str] = field(default_factory=dict)
    file_implies: Callable[[str], Iterable[Setting]] | None = None
    field_types: Mapping[str, object] = field(init=False)

    def __post_init__(self) -> None:
        field_types = {name: info.annotation for name, info in self.model.model_fields.items()}
        object.__setattr__(self, "field_types", field_types)
        assert self.implemented_keys.issubset(field_types)

    def load(
        self,
        config_file: str | None = None,
        overrides: Iterable[Setting] | Mapping[str, str] = (),
    ) -> tuple[ConfigT, LoadReport]:
        """Defaults < ``config_file`` < ``overrides`` (raw strings, typed like file values).

        Raises ConfigError naming the key and its source for an unreadable
        file, an unknown key, or a bad value.
        """
        settings: list[Setting] = []
        implied: list[Setting] = []
        if config_file is not None:
            settings.extend(read_settings_file(config_file))
            if self.file_implies is not None:
                implied = list(self.file_implies(config_file))
                settings.extend(implied)
        settings.extend(override_settings(overrides))
        resolved = resolve_settings(
            settings, self.field_types, aliases=self.aliases, ignored_keys=self.ignored_keys
        )
        sources = dict(resolved.sources)
        for key, variable in self.environment.items():
            if key not in sources and env(variable):
                sources[key] = f"environment {variable}"
        try:
            config = self.model.model_validate(resolved.values)
        except ValidationError as exc:
            raise error_from_validation(exc.errors(), sources) from None
        implied_sources = {setting.source for setting in implied}
        unused = tuple(
            key
            for key, source in resolved.sources.items()
            if source not in implied_sources and key not in self.implemented_keys
        )
        report = LoadReport(
            config_file=config_file,
            sources=sources,
            unused_keys=unused + resolved.ignored,
            notes=resolved.notes,
        )
        return config, report

    def value_hint(self, name: str) -> str | None:
        """An example value of config key ``name`` (an old spelling included), None if it is no key."""
        canonical = self.aliases.get(name, name)
        if canonical in self.field_types:
            return example_value(self.field_types[canonical])
        return "<value>" if name in self.ignored_keys else None

    def parse_args(
        self, argv: Sequence[str] | None = None, *, out: TextIO | None = None
    ) -> tuple[ConfigT, LoadReport]:
        """The daemon's arguments: ``-c FILE``, its other options, ``--key=value``.

        ``-h`` and the listing options write to ``out`` (stdout) and raise
        SystemExit(0); a listing is printed only for a configuration that
        loads. Raises ConfigError for anything it cannot use.
        """
        arguments = sys.argv[1:] if argv is None else list(argv)
        command_line = parse_command_line(arguments, self.options, value_hint=self.value_hint)
        stream = sys.stdout if out is None else out
        if command_line.options.get("help"):
            stream.write(usage(self.prog, self.options))
            raise SystemExit(0)
        config_file = command_line.options.get("configFile")
        assert config_file is None or isinstance(config_file, str)
        config, report = self.load(config_file, command_line.overrides)
        for option, listing in self.listings.items():
            if command_line.options.get(option):
                stream.write(listing(config))
                raise SystemExit(0)
        return config, report
