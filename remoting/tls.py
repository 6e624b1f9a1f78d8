"""TLS on the remoting port (RocketMQ's `tls.server.mode`) and for the clients that dial it.

The one owner of: the three server modes and what each accepts, how the first byte of a
connection tells TLS from RocketMQ's plaintext frames, and the SSL contexts both sides use.

| mode        | a TLS connection | a plaintext connection                        |
|-------------|------------------|-----------------------------------------------|
| disabled    | not understood   | served (no TLS at all: the default)           |
| permissive  | served           | served, on the same port                      |
| enforcing   | served           | closed at its first byte (logged, throttled)  |

How the two are told apart (RocketMQ's TlsModeHandler does the same): a TLS connection
starts with a handshake record, whose first byte is 0x16 (content type 22); a RocketMQ
frame starts with its 4-byte big-endian length, whose first byte is 0 for any frame under
16 MiB and never 0x16 for a frame the server accepts (maxFrameSize < 0x16000000 bytes is
enforced by the frame decoder anyway; a larger length is refused there).

Why not `create_server(ssl=...)`: that serves TLS only, so permissive mode (one port, both)
needs the first byte read before choosing. `_Sniffer` reads it, then either hands the
transport to the plain protocol, or puts asyncio's SSL protocol (`asyncio.sslproto`, the
one `loop.start_tls` builds; pure Python, so it runs over uvloop's transports too) between
the transport and the plain protocol and feeds it the bytes already read. Enforcing mode
goes through the same path, so a refused plaintext client gets a clear log line rather
than a handshake error.

Keys (camelCase, the daemons' config style; RocketMQ reads system properties):
`tlsServerMode` (`tls.server.mode`), `tlsServerCertPath` (`tls.server.certPath`),
`tlsServerKeyPath` (`tls.server.keyPath`), `tlsServerKeyPassword`
(`tls.server.keyPassword`); clients: `tlsEnable` (`tls.enable`), verification off unless
asked (RocketMQ's clients default to `tls.test.mode.enable=true`: no verification).
"""
from __future__ import annotations

import asyncio
import asyncio.sslproto
import logging
import ssl
import time
from enum import StrEnum

log = logging.getLogger("pocketmq.remoting")



class TlsServerMode(StrEnum):
    """The daemons' tlsServerMode (RocketMQ's tls.server.mode values, lower case as there)."""
    disabled = "disabled"
    permissive = "permissive"
    enforcing = "enforcing"


TLS_MODES = tuple(m.value for m in TlsServerMode)
TLS_HANDSHAKE_BYTE = 0x16
REFUSED_LOG_INTERVAL_S = 10.0
HANDSHAKE_TIMEOUT_S = 10.0


def check_server_settings(mode: str, cert_path: str | None, key_path: str | None) -> str | None:
    """What is wrong with a daemon's TLS keys (None: nothing), naming the key to fix."""
    if mode not in TLS_MODES:
        return f"tlsServerMode must be one of {', '.join(TLS_MODES)}, not {mode!r}"
    if mode != "disabled" and not (cert_path and key_path):
        missing = "tlsServerCertPath" if not cert_path else "tlsServerKeyPath"
        return f"tlsServerMode={mode} needs {missing} (the server's PEM certificate chain and private key)"
    return None


def server_config_error(mode: str, cert_path: str | None, key_path: str | None,
                        password: str | None = None) -> tuple[str, str] | None:
    """A daemon's TLS keys checked at load, the files read too: (key to blame, why), or None.
    Both daemons' config validators call this, so a bad certificate stops the start with
    the key named instead of failing at the first TLS client."""
    err = check_server_settings(mode, cert_path, key_path)
    if err:
        return ("tlsServerMode" if mode not in TLS_MODES else
                "tlsServerCertPath" if not cert_path else "tlsServerKeyPath"), err
    if mode != "disabled":
        try:
            server_context(cert_path, key_path, password)
        except ValueError as e:
            return "tlsServerCertPath", str(e)
    return None


def server_gate(mode: str, cert_path: str | None, key_path: str | None, password: str | None = None,
                name: str = "server") -> TlsGate | None:
    """A daemon's TlsGate from its keys (None when disabled): what its RemotingServer takes."""
    if mode == "disabled":
        return None
    return TlsGate(mode, server_context(cert_path, key_path, password), name)


def server_context(cert_path: str, key_path: str, password: str | None = None) -> ssl.SSLContext:
    """The server's context: TLS 1.2+, the certificate chain and key (PEM). Raises
    ValueError naming the file when it cannot be loaded."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_path, key_path, password or None)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load TLS certificate {cert_path} / key {key_path}: {e}") from None
    return ctx


def client_context(verify: bool = False, ca_path: str | None = None) -> ssl.SSLContext:
    """A client's context. verify=False (RocketMQ's clients' default, tls.test.mode.enable):
    encrypted, but any certificate is accepted; verify=True checks the chain against
    `ca_path` (or the system's CAs) and the host name."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if verify:
        if ca_path:
            ctx.load_verify_locations(ca_path)
        else:
            ctx.load_default_certs()
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def resolve_client_tls(tls) -> ssl.SSLContext | None:
    """A client's `tls` option as a context: None/False (plaintext), True (TLS without
    verification, as RocketMQ's clients default), or an ssl.SSLContext used as given."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return client_context()
    if isinstance(tls, ssl.SSLContext):
        return tls
    raise TypeError(f"tls must be True, False or an ssl.SSLContext, not {type(tls).__name__}")


def is_tls_start(first_byte: int) -> bool:
    return first_byte == TLS_HANDSHAKE_BYTE


class TlsGate:
    """One server's mode and context, and the count of plaintext connections it refused."""

    def __init__(self, mode: str, context: ssl.SSLContext | None, name: str = "server"):
        err = check_server_settings(mode, "-" if context else None, "-" if context else None)
        if err:
            raise ValueError(err)
        self.mode = mode
        self.context = context
        self.name = name
        self.refused_plaintext = 0
        self._unlogged = 0
        self._logged_s = -1e9

    @property
    def active(self) -> bool:
        return self.mode != "disabled"

    def wrap(self, protocol: asyncio.Protocol) -> asyncio.Protocol:
        """The protocol to give the event loop for a new connection served by `protocol`."""
        return _Sniffer(self, protocol) if self.active else protocol

    def refused(self, peer) -> None:
        self.refused_plaintext += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_s >= REFUSED_LOG_INTERVAL_S:
            log.warning("%s: %d plaintext connection(s) refused (tlsServerMode=enforcing), the last from %s",
                        self.name, self._unlogged, peer)
            self._logged_s = now
            self._unlogged = 0


class _Sniffer(asyncio.Protocol):
    """Holds a new connection until its first bytes arrive, then gives it to its protocol,
    over TLS or not (module docstring)."""

    def __init__(self, gate: TlsGate, app: asyncio.Protocol):
        self.gate = gate
        self.app = app
        self.transport = None
        self.handed_over = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        # Until the first byte the protocol holds the raw transport, so the server's idle
        # and frame-timeout closing (which call its close()) reach a silent connection too.
        if getattr(self.app, "transport", False) is None:
            self.app.transport = transport

    def data_received(self, data) -> None:
        transport = self.transport
        if is_tls_start(data[0]):
            self.handed_over = True
            loop = asyncio.get_running_loop()
            proto = _ServerSSLProtocol(loop, self.app, self.gate.context, None, server_side=True,
                                                 ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
            transport.set_protocol(proto)
            proto.connection_made(transport)
            view = memoryview(data)
            while view:
                buf = proto.get_buffer(len(view))
                n = min(len(buf), len(view))
                buf[:n] = view[:n]
                proto.buffer_updated(n)
                view = view[n:]
            return
        if self.gate.mode == "enforcing":
            self.gate.refused(transport.get_extra_info("peername"))
            transport.abort()       # connection_lost (below) tells the protocol
            return
        self.handed_over = True
        transport.set_protocol(self.app)
        self.app.connection_made(transport)
        self.app.data_received(data)

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        # closed before its first byte: the protocol still hears of it (the server forgets it)
        if not self.handed_over:
            self.handed_over = True
            self.app.connection_lost(exc)


class _ServerSSLProtocol(asyncio.sslproto.SSLProtocol):
    """asyncio's SSL protocol, except that a connection lost before its handshake completed
    is reported to the plain protocol too (asyncio tells it only once it was connected; the
    server would keep a Connection it never hears of again)."""

    def connection_lost(self, exc) -> None:
        connected = self._app_state != asyncio.sslproto.AppProtocolState.STATE_INIT
        app = self._app_protocol          # (asyncio drops its reference in connection_lost)
        super().connection_lost(exc)
        if not connected and app is not None:
            app.connection_lost(exc)
