"""The client's ACL credentials: what every request carries when the cluster runs plain ACL.

RocketMQ 4.x's clients sign every request, to brokers and to nameservers alike, with an
RPC hook (Java's AclClientRPCHook, the C++ client's ClientRPCHook): AccessKey (and
OnsChannel / SecurityToken when set) added to the ext fields, then a Signature over all of
them and the body (protocol/acl.py `request_signer`, the one signer). Ours signs in one
place: ClientConnection.send (client/connection.py), which every request of a
ClientInstance goes through, the producer's pre-built SEND_MESSAGE_V2 fields included.

`credentials=` on every client takes a `Credentials`, or a tuple
`(access_key, secret_key)` / `(access_key, secret_key, channel)` (the C++ wheel's
`set_session_credentials(ak, sk, channel)` order) / `(ak, sk, channel, security_token)`.
The tools read `ROCKETMQ_ACCESS_KEY` / `ROCKETMQ_SECRET_KEY` (`credentials_from_env`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from pocketmq.client.errors import InvalidArgumentError
from pocketmq.protocol.acl import request_signer
from pocketmq.protocol.codes import FLAG_RESPONSE

ENV_ACCESS_KEY = "ROCKETMQ_ACCESS_KEY"
ENV_SECRET_KEY = "ROCKETMQ_SECRET_KEY"


@dataclass(frozen=True)
class Credentials:
    """An ACL account. The secret (and the token) never appear in repr or logs."""

    access_key: str
    secret_key: str = field(repr=False)
    channel: str | None = None           # sent as OnsChannel (the C++ client always sends one)
    security_token: str | None = field(default=None, repr=False)   # SecurityToken (STS)

    def __post_init__(self) -> None:
        for name in ("access_key", "secret_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(f"credentials: {name} must be a non-empty string")
        for name in ("channel", "security_token"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidArgumentError(f"credentials: {name} must be a string or None")
        # the account's signer, made once (protocol/acl.py request_signer): every request
        # this client sends passes through sign()
        try:
            signer = request_signer(self.access_key, self.secret_key, self.security_token, self.channel)
        except UnicodeError:
            raise InvalidArgumentError("credentials: secret_key is not text UTF-8 can hold") from None
        object.__setattr__(self, "_signed", signer)

    def __getstate__(self) -> dict:
        # pickled (the Spark source ships its options to executors) without the signer, a closure
        return {k: v for k, v in self.__dict__.items() if k != "_signed"}

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)
        self.__post_init__()

    def sign(self, cmd) -> None:
        """Sign an outgoing request in place (responses are never signed, as in Java)."""
        if cmd.flag & FLAG_RESPONSE:
            return
        body = cmd.body
        if type(body) is not bytes:
            body = cmd.body_bytes()
        cmd.ext_fields = self._signed(cmd.ext_fields, body)


def as_credentials(value) -> Credentials | None:
    """A client's `credentials=` option as Credentials (None: requests go unsigned)."""
    if value is None or isinstance(value, Credentials):
        return value
    if isinstance(value, (tuple, list)) and 2 <= len(value) <= 4:
        return Credentials(*value)
    raise InvalidArgumentError("credentials must be (access_key, secret_key), (access_key, secret_key, channel) "
                               f"or a Credentials, not {type(value).__name__}")


def credentials_from_env(environ=None) -> Credentials | None:
    """ROCKETMQ_ACCESS_KEY / ROCKETMQ_SECRET_KEY (both or neither: one alone is an error)."""
    env = os.environ if environ is None else environ
    ak, sk = env.get(ENV_ACCESS_KEY) or None, env.get(ENV_SECRET_KEY) or None
    if ak is None and sk is None:
        return None
    if ak is None or sk is None:
        missing = ENV_ACCESS_KEY if ak is None else ENV_SECRET_KEY
        raise InvalidArgumentError(f"{missing} is not set: the access key and the secret key go together")
    return Credentials(ak, sk)


def resolve_credentials(access_key: str | None, secret_key: str | None, environ=None) -> Credentials | None:
    """A tool's --accessKey/--secretKey (or accessKey/secretKey options), else the environment."""
    if access_key or secret_key:
        if not (access_key and secret_key):
            raise InvalidArgumentError("accessKey and secretKey go together: "
                                       f"{'secretKey' if access_key else 'accessKey'} is missing")
        return Credentials(access_key, secret_key)
    return credentials_from_env(environ)
