"""NamesrvConfig: every key a RocketMQ 4.9 ``namesrv.conf`` may hold, typed and checked.

RocketMQ's ``NamesrvStartup`` copies one properties file onto ``NamesrvConfig``
and ``NettyServerConfig``; here they are one pydantic model whose field names
are RocketMQ's camelCase keys exactly. Defaults are 4.9.8's.

A key pocketmq does not act on is still accepted and typed;
``LoadReport.unused_line()`` names those that were set. Unknown keys and bad
values are errors (RocketMQ ignores both silently).

pocketmq's own keys (RocketMQ 4.9 hard-codes these):

* ``scanNotActiveBrokerInterval`` (ms, default 10 000): how often brokers whose
  channel went silent are evicted. 4.9 runs that scan every 10 s (after 5 s);
  RocketMQ 5 made it this key, with default 5 000.
* ``brokerChannelExpiredTime`` (ms, default 120 000): a broker silent this long
  is evicted (``RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME``).
* ``maxFrameSize`` (bytes, default 16 MiB): the largest frame accepted
  (RocketMQ: system property ``com.rocketmq.remoting.frameMaxLength``).

As in RocketMQ, ``-c FILE`` also sets ``configStorePath`` to FILE (a
``--configStorePath`` flag still wins). ``~`` is expanded in the paths.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, TextIO

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pocketmq.protocol.properties_file import (
    LAYER_COMMAND_LINE,
    LAYER_FILE,
    CliOption,
    ConfigError,
    LoadReport,
    Setting,
    decode_properties,
    error_from_validation,
    format_properties,
    parse_command_line,
    parse_properties,
    resolve_settings,
    usage,
)

__all__ = [
    "IMPLEMENTED_KEYS",
    "ConfigError",
    "LoadReport",
    "NamesrvConfig",
    "format_config",
    "load_config",
    "parse_args",
]

_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1

JavaInt = Annotated[int, Field(ge=-(2**31), le=_INT_MAX)]
Port = Annotated[int, Field(ge=0, le=65535)]
NonNegativeInt = Annotated[int, Field(ge=0, le=_INT_MAX)]
PositiveLong = Annotated[int, Field(ge=1, le=_LONG_MAX)]
Name = Annotated[str, Field(min_length=1)]


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


class NamesrvConfig(BaseModel):
    """RocketMQ 4.9 name server configuration (NamesrvConfig + NettyServerConfig)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)

    # --- NamesrvConfig.java ------------------------------------------------
    rocketmqHome: str | None = Field(default_factory=lambda: _env("ROCKETMQ_HOME"))
    kvConfigPath: Name = Field(default_factory=lambda: os.path.expanduser("~/namesrv/kvConfig.json"))
    configStorePath: Name = Field(
        default_factory=lambda: os.path.expanduser("~/namesrv/namesrv.properties")
    )
    productEnvName: str = "center"
    clusterTest: bool = False
    orderMessageEnable: bool = False
    configBlackList: str = "configBlackList;configStorePath;kvConfigPath"

    # --- NettyServerConfig.java (NamesrvStartup sets listenPort 9876) -------
    listenPort: Port = 9876
    serverWorkerThreads: JavaInt = 8
    serverCallbackExecutorThreads: JavaInt = 0
    serverSelectorThreads: JavaInt = 3
    serverOnewaySemaphoreValue: JavaInt = 256
    serverAsyncSemaphoreValue: JavaInt = 64
    serverChannelMaxIdleTimeSeconds: NonNegativeInt = 120
    serverSocketSndBufSize: JavaInt = 0
    serverSocketRcvBufSize: JavaInt = 0
    writeBufferHighWaterMark: JavaInt = 0
    writeBufferLowWaterMark: JavaInt = 0
    serverSocketBacklog: JavaInt = 1024
    serverPooledByteBufAllocatorEnable: bool = True
    useEpollNativeSelector: bool = False

    # --- pocketmq's own ----------------------------------------------------
    scanNotActiveBrokerInterval: PositiveLong = 10_000
    brokerChannelExpiredTime: PositiveLong = 120_000
    maxFrameSize: Annotated[int, Field(ge=1024, le=_INT_MAX)] = 16 * 1024 * 1024

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

    @field_validator("kvConfigPath", "configStorePath")
    @classmethod
    def _expand_home(cls, value: str) -> str:
        return os.path.expanduser(value)

    @model_validator(mode="after")
    def _check_together(self) -> NamesrvConfig:
        if self.brokerChannelExpiredTime < self.scanNotActiveBrokerInterval:
            raise PydanticCustomError(
                "config",
                "{detail}",
                {
                    "key": "brokerChannelExpiredTime",
                    "related": ("scanNotActiveBrokerInterval",),
                    "detail": "must not be shorter than scanNotActiveBrokerInterval "
                    f"({self.scanNotActiveBrokerInterval} ms)",
                },
            )
        return self

    def config_items(self) -> list[tuple[str, object]]:
        """(key, value) pairs in RocketMQ's class order."""
        return [(key, getattr(self, key)) for key in type(self).model_fields]


_MISSING = object()

FIELD_TYPES: dict[str, object] = {
    name: info.annotation for name, info in NamesrvConfig.model_fields.items()
}

IMPLEMENTED_KEYS: frozenset[str] = frozenset({
    "listenPort", "kvConfigPath", "orderMessageEnable", "serverChannelMaxIdleTimeSeconds",
    "scanNotActiveBrokerInterval", "brokerChannelExpiredTime", "maxFrameSize",
})  # fmt: skip
"""Keys pocketmq acts on. Extend it when a component starts honouring a key."""

assert IMPLEMENTED_KEYS.issubset(FIELD_TYPES)

_OPTIONS = (
    CliOption("c", "configFile", True, "Name server config properties file"),
    CliOption("p", "printConfigItem", False, "Print all config items"),
    CliOption("h", "help", False, "Print help"),
)


def format_config(config: NamesrvConfig) -> str:
    """The ``-p`` listing: ``key=value`` lines."""
    return format_properties(config.config_items())


def load_config(
    config_file: str | None = None,
    overrides: Iterable[Setting] | Mapping[str, str] = (),
) -> tuple[NamesrvConfig, LoadReport]:
    """Defaults < ``config_file`` < ``overrides``; ``configStorePath`` follows the file.

    Raises ConfigError naming the key and its source for an unreadable file,
    an unknown key, or a bad value.
    """
    settings: list[Setting] = []
    if config_file is not None:
        settings.extend(_read_file(config_file))
        # NamesrvStartup: namesrvConfig.setConfigStorePath(file) after loading it.
        settings.append(Setting("configStorePath", config_file, "command line -c", LAYER_COMMAND_LINE))
    if isinstance(overrides, Mapping):
        settings.extend(
            Setting(key, value, f"override {key}", LAYER_COMMAND_LINE) for key, value in overrides.items()
        )
    else:
        settings.extend(overrides)
    resolved = resolve_settings(settings, FIELD_TYPES)
    try:
        config = NamesrvConfig.model_validate(resolved.values)
    except ValidationError as exc:
        raise error_from_validation(exc.errors(), resolved.sources) from None
    explicit = [key for key, source in resolved.sources.items() if source != "command line -c"]
    report = LoadReport(
        config_file=config_file,
        sources=dict(resolved.sources),
        unused_keys=tuple(key for key in explicit if key not in IMPLEMENTED_KEYS),
        notes=resolved.notes,
    )
    return config, report


def parse_args(
    argv: Sequence[str] | None = None, *, out: TextIO | None = None
) -> tuple[NamesrvConfig, LoadReport]:
    """``mqnamesrv`` arguments: ``-c FILE``, ``-p``, ``-h``, ``--key=value``.

    ``-h`` and ``-p`` write to ``out`` (stdout) and raise SystemExit(0).
    Raises ConfigError for anything it cannot use.
    """
    arguments = sys.argv[1:] if argv is None else list(argv)
    command_line = parse_command_line(arguments, _OPTIONS, is_key=FIELD_TYPES.__contains__)
    stream = sys.stdout if out is None else out
    if command_line.options.get("help"):
        stream.write(usage("mqnamesrv", _OPTIONS))
        raise SystemExit(0)
    config_file = command_line.options.get("configFile")
    assert config_file is None or isinstance(config_file, str)
    config, report = load_config(config_file, command_line.overrides)
    if command_line.options.get("printConfigItem"):
        stream.write(format_config(config))
        raise SystemExit(0)
    return config, report


def _read_file(path: str) -> list[Setting]:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ConfigError(None, path, f"cannot read config file: {exc.strerror or exc}") from None
    return [
        Setting(entry.key, entry.value, f"{path}:{entry.line}", LAYER_FILE)
        for entry in parse_properties(decode_properties(data), source=path)
    ]
