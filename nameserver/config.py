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
* ``maxConnections`` and ``reservedFileDescriptors`` (default 0 = derived): at most
  min(maxConnections, RLIMIT_NOFILE - reserved) connections; more are accepted and
  closed (remoting/server.py ``connection_limit``; docs/reliability.md).
* ``maxBufferedRequestBytes`` (bytes, default 128 MiB): what all connections
  may hold of request frames not yet complete; beyond it, connections with a
  large partial frame stop being read until it frees.
* ``frameReadTimeoutMillis`` (ms, default 30 000): a request frame must arrive
  within this time, or its connection is closed (docs/reliability.md).
* ``aclEnable`` (default false; the broker's key) and ``aclFilePath`` (default
  ``plain_acl.yml`` beside ``configStorePath``): with ACL on, REGISTER_BROKER,
  UNREGISTER_BROKER and the KV/config/permission writes must be signed by an admin account
  of the file (RocketMQ 4.x has no ACL on its nameserver); route reads stay open
  (docs/acl.md).

As in RocketMQ, ``-c FILE`` also sets ``configStorePath`` to FILE (a
``--configStorePath`` flag still wins). ``~`` is expanded in the paths.

Loading, the command line and ``-p`` are common.daemon_config's
(DaemonConfigLoader); the NettyServerConfig keys are declared there too.
"""
from __future__ import annotations

import os
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from pocketmq.common.daemon_config import (
    DaemonConfig,
    DaemonConfigLoader,
    FrameSize,
    Name,
    NettyServerConfig,
    NonNegativeInt,
    Port,
    PositiveLong,
    cross_field_error,
    env,
)
from pocketmq.common.properties_file import (
    LAYER_COMMAND_LINE,
    CliOption,
    ConfigError,
    LoadReport,
    Setting,
    format_properties,
)
from pocketmq.protocol.command import FRAME_SIZE_BYTES_MAX_DEFAULT
from pocketmq.remoting.read_budget import FRAME_READ_TIMEOUT_MS_DEFAULT, READ_BUFFER_BYTES_MAX_DEFAULT
from pocketmq.remoting.tls import TlsServerMode, server_config_error

__all__ = [
    "IMPLEMENTED_KEYS",
    "ConfigError",
    "LoadReport",
    "NamesrvConfig",
    "format_config",
    "load_config",
    "parse_args",
]


class _NamesrvSection(DaemonConfig):
    # --- NamesrvConfig.java ------------------------------------------------
    rocketmqHome: str | None = Field(default_factory=lambda: env("ROCKETMQ_HOME"))
    kvConfigPath: Name = Field(default_factory=lambda: os.path.expanduser("~/namesrv/kvConfig.json"))
    configStorePath: Name = Field(
        default_factory=lambda: os.path.expanduser("~/namesrv/namesrv.properties")
    )
    productEnvName: str = "center"
    clusterTest: bool = False
    orderMessageEnable: bool = False
    configBlackList: str = "configBlackList;configStorePath;kvConfigPath"


class NamesrvConfig(NettyServerConfig, _NamesrvSection):
    """RocketMQ 4.9 name server configuration (NamesrvConfig + NettyServerConfig).

    Keys in RocketMQ's order: NamesrvConfig.java's (_NamesrvSection), then
    NettyServerConfig.java's (common.daemon_config), then pocketmq's own.
    """

    # --- NettyServerConfig.java: NamesrvStartup sets listenPort 9876 --------
    listenPort: Port = 9876

    # --- pocketmq's own ----------------------------------------------------
    scanNotActiveBrokerInterval: PositiveLong = 10_000
    brokerChannelExpiredTime: PositiveLong = 120_000
    # the port of the Prometheus /metrics endpoint (docs/operations.md), on the listen
    # address; 0 (the default) serves no metrics.
    metricsPort: Port = 0
    maxBufferedRequestBytes: Annotated[int, Field(ge=1 << 20, le=2**63 - 1)] = READ_BUFFER_BYTES_MAX_DEFAULT
    frameReadTimeoutMillis: PositiveLong = FRAME_READ_TIMEOUT_MS_DEFAULT
    maxFrameSize: FrameSize = FRAME_SIZE_BYTES_MAX_DEFAULT
    maxConnections: NonNegativeInt = 0
    reservedFileDescriptors: NonNegativeInt = 0
    aclEnable: bool = False
    aclFilePath: str | None = None
    # --- TLS on the listen port (remoting/tls.py): RocketMQ's system properties
    # tls.server.mode / tls.server.certPath / tls.server.keyPath / tls.server.keyPassword
    # as keys; permissive serves TLS and plaintext on the same port, enforcing TLS only
    tlsServerMode: TlsServerMode = TlsServerMode.disabled
    tlsServerCertPath: str | None = None
    tlsServerKeyPath: str | None = None
    tlsServerKeyPassword: str | None = None

    @field_validator("kvConfigPath", "configStorePath")
    @classmethod
    def _expand_home(cls, value: str) -> str:
        return os.path.expanduser(value)

    @model_validator(mode="after")
    def _check_together(self) -> NamesrvConfig:
        if self.brokerChannelExpiredTime < self.scanNotActiveBrokerInterval:
            raise cross_field_error(
                "brokerChannelExpiredTime",
                "must not be shorter than scanNotActiveBrokerInterval "
                f"({self.scanNotActiveBrokerInterval} ms)",
                "scanNotActiveBrokerInterval",
            )
        tls_error = server_config_error(self.tlsServerMode, self.tlsServerCertPath, self.tlsServerKeyPath,
                                        self.tlsServerKeyPassword)
        if tls_error:
            raise cross_field_error(tls_error[0], tls_error[1], "tlsServerMode")
        return self


IMPLEMENTED_KEYS: frozenset[str] = frozenset({
    "listenPort", "kvConfigPath", "orderMessageEnable", "serverChannelMaxIdleTimeSeconds",
    "scanNotActiveBrokerInterval", "brokerChannelExpiredTime", "maxFrameSize",
    "maxConnections", "reservedFileDescriptors",
    "metricsPort",
    "maxBufferedRequestBytes", "frameReadTimeoutMillis",
    "aclEnable", "aclFilePath",
    "tlsServerMode", "tlsServerCertPath", "tlsServerKeyPath", "tlsServerKeyPassword",
})  # fmt: skip
"""Keys pocketmq acts on. Extend it when a component starts honouring a key."""

_OPTIONS = (
    CliOption("c", "configFile", True, "Name server config properties file"),
    CliOption("p", "printConfigItem", False, "Print all config items"),
    CliOption("h", "help", False, "Print help"),
)


def format_config(config: NamesrvConfig) -> str:
    """The ``-p`` listing: ``key=value`` lines, the TLS key's password masked."""
    return format_properties(config.config_items(), secret=("tlsServerKeyPassword",))


def _config_store_path_follows_the_file(config_file: str) -> list[Setting]:
    # NamesrvStartup: namesrvConfig.setConfigStorePath(file) after loading it.
    return [Setting("configStorePath", config_file, "command line -c", LAYER_COMMAND_LINE)]


_LOADER: DaemonConfigLoader[NamesrvConfig] = DaemonConfigLoader(
    NamesrvConfig,
    prog="mqnamesrv",
    options=_OPTIONS,
    implemented_keys=IMPLEMENTED_KEYS,
    listings={"printConfigItem": format_config},
    file_implies=_config_store_path_follows_the_file,
)

# ``mqnamesrv``'s entry points; see DaemonConfigLoader.load and .parse_args.
load_config = _LOADER.load
parse_args = _LOADER.parse_args
