"""Plain ACL on the gRPC endpoint: RocketMQ 5's `authorization` header, checked against the
broker's plain_acl.yml accounts (remoting/acl.py's AclService: the same table, hot-reloaded,
the same deny log and metrics) with the same rules (common/acl.py `check_grpc`).

The header (Java 5.1's AuthorizationHeader, the clients' Signature/signature.py):

| header | value |
|---|---|
| `authorization` | `MQv2-HMAC-SHA1 Credential=<accessKey>[/...], SignedHeaders=x-mq-date-time, Signature=<hex>` |
| `x-mq-date-time` | the signed content: the client's clock as `yyyyMMdd'T'HHmmss'Z'` |

Signature = HMAC-SHA1(key = secretKey UTF-8, data = the x-mq-date-time value UTF-8), in hex
(the Python client 5.1.2 sends lowercase; Java decodes either case, so do we). The method
word and SignedHeaders are not checked (Java does not either): the content is always the
date-time. The date-time's age is not checked (Java 5.1 does not; the Python client writes
its local time with a `Z`, so a skew check would refuse every client east or west of UTC).

Answers (v2 Status): a missing or malformed header, a missing date-time, an unknown key or a
bad signature UNAUTHORIZED (40100); a permission missing, or a request whose resources Java
cannot read (a consumer heartbeat without group), FORBIDDEN (40300). Java 5.3's proxy
answers 40100 for both; the v2 protocol defines 40300 for "authenticated, not permitted",
and the clients raise UnauthorizedException / ForbiddenException from them, which tells an
operator whether to fix the credentials or plain_acl.yml.

Where it runs: `guard_servicer` wraps every RPC before the service sees it (a denied request
reaches no handler: nothing is stored, popped or registered); Telemetry is checked when the
stream opens (the signature) and per command by the service (its read loop calls
`GrpcAclGuard.deny`), a denied command answered on the stream, which stays open (Java 5.3).
"""
from __future__ import annotations

import hashlib
import hmac
import inspect

from pocketmq.broker.proxy.convert import Code, status
from pocketmq.broker.proxy.pb import definition_pb2 as pb
from pocketmq.broker.proxy.pb import service_pb2 as spb
from pocketmq.broker.proxy.service import _peer_addr
from pocketmq.common import acl as rules

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
MAX_HEADER_CHARS = 4096       # a longer authorization header is refused unparsed

# the RPCs by kind (the generated servicer's names); Telemetry is stream-stream
UNARY_RPCS = ("QueryRoute", "Heartbeat", "SendMessage", "QueryAssignment", "AckMessage",
              "ForwardMessageToDeadLetterQueue", "EndTransaction", "NotifyClientTermination",
              "ChangeInvisibleDuration", "UpdateOffset", "GetOffset", "QueryOffset", "RecallMessage",
              "SyncLiteSubscription")
STREAM_RPCS = ("ReceiveMessage", "PullMessage")       # unary request, streamed answer

# authentication failures (the key, the signature, the header) vs permission failures
_UNAUTHORIZED_REASONS = frozenset({"no_access_key", "unknown_key", "signature", "header"})


class AuthorizationError(ValueError):
    """The authorization header is missing or does not parse; the message says how."""


def parse_authorization(value: str | None) -> tuple[str | None, bytes | None]:
    """(accessKey, signature bytes) of an authorization header, as Java's
    AuthorizationHeader reads it: the method word, then comma-separated `key=value` items
    (trimmed); Credential's first `/` part is the accessKey, Signature hex (either case).
    A missing item is None. Raises AuthorizationError."""
    if not value:
        raise AuthorizationError("the authorization header is missing (ACL is on: sign requests with an "
                                 "accessKey and secretKey)")
    if len(value) > MAX_HEADER_CHARS:
        raise AuthorizationError(f"the authorization header is longer than {MAX_HEADER_CHARS} characters")
    method, sep, rest = value.partition(" ")
    if not sep or not method:
        raise AuthorizationError("authorization header is incorrect (expected 'MQv2-HMAC-SHA1 Credential=..., "
                                 "SignedHeaders=x-mq-date-time, Signature=...')")
    access_key = signature = None
    for item in rest.split(","):
        key, eq, val = item.strip().partition("=")
        if not eq:
            raise AuthorizationError(f"authorization header item {item.strip()!r} is not key=value")
        if key == "Credential":
            access_key = val.split("/")[0] or None
        elif key == "Signature":
            try:
                signature = bytes.fromhex(val)
            except ValueError:
                raise AuthorizationError("authorization header's Signature is not hex") from None
    return access_key, signature


def _digest(secret_key: str, date_time: str) -> bytes:
    return hmac.new(secret_key.encode("utf-8"), date_time.encode("utf-8"), hashlib.sha1).digest()


def sign(secret_key: str, date_time: str) -> str:
    """The clients' signature: HMAC-SHA1 of the date-time keyed by the secret key, lowercase hex."""
    return _digest(secret_key, date_time).hex()


def signature_matches(secret_key: str, date_time: str, signature: bytes | None) -> bool:
    """Constant-time comparison of the header's signature with the one the account's key makes."""
    if signature is None:
        return False
    try:
        expected = _digest(secret_key, date_time)
    except UnicodeError:      # a lone surrogate: no client signed that
        return False
    return hmac.compare_digest(expected, signature)


def denial_status(denial: rules.Denial) -> pb.Status:
    code = Code.UNAUTHORIZED if denial.reason in _UNAUTHORIZED_REASONS else Code.FORBIDDEN
    return status(code, f"ACL: {denial.message}")


def _metadata(context) -> tuple[str | None, str | None]:
    auth = date_time = None
    for key, value in context.invocation_metadata() or ():
        if key == AUTHORIZATION:
            auth = value
        elif key == DATE_TIME:
            date_time = value
    return auth, date_time


def _peer(context) -> tuple[str, str]:
    """(ip, "ip:port") of the call's peer."""
    addr = _peer_addr(context.peer())
    return addr.rpartition(":")[0].strip("[]"), addr


class GrpcAclGuard:
    """The check of one gRPC request against the AclService's accounts in force."""

    def __init__(self, acl):
        self.acl = acl        # remoting/acl.py AclService (its `table` is swapped on reload)

    def deny(self, rpc: str, request, context) -> pb.Status | None:
        """None to serve the request, else the status to answer (the deny counted and logged)."""
        auth, date_time = _metadata(context)
        ip, addr = _peer(context)
        access_key = signature = None
        header_error = None
        try:
            access_key, signature = parse_authorization(auth)
            if not date_time:
                raise AuthorizationError(f"the {DATE_TIME} header (the signed content) is missing")
        except AuthorizationError as e:
            header_error = str(e)
        denial = rules.check_grpc(self.acl.table, rpc, request, access_key,
                                  lambda secret: signature_matches(secret, date_time, signature), ip,
                                  header_error=header_error)
        if denial is None:
            return None
        self.acl.record(denial, rpc, addr)
        return denial_status(denial)


def _response_type(rpc: str):
    return getattr(spb, f"{rpc}Response")


def _unary(rpc: str, inner, guard: GrpcAclGuard, count):
    response = _response_type(rpc)

    async def handler(request, context):
        st = guard.deny(rpc, request, context)
        if st is not None:
            return response(status=count(rpc, st))
        return await inner(request, context)
    return handler


def _streamed(rpc: str, inner, guard: GrpcAclGuard, count):
    response = _response_type(rpc)
    if inspect.isasyncgenfunction(inner):
        async def handler(request, context):
            st = guard.deny(rpc, request, context)
            if st is not None:
                yield response(status=count(rpc, st))
                return
            async for frame in inner(request, context):
                yield frame
    else:         # the handler writes its frames with context.write
        async def handler(request, context):
            st = guard.deny(rpc, request, context)
            if st is not None:
                await context.write(response(status=count(rpc, st)))
                return
            await inner(request, context)
    return handler


def _telemetry(inner, guard: GrpcAclGuard, count):
    async def handler(request_iterator, context):
        # the stream's start: the signature and the account (its commands: service.py)
        st = guard.deny("Telemetry", None, context)
        if st is not None:
            yield spb.TelemetryCommand(status=count("Telemetry", st))
            return
        async for command in inner(request_iterator, context):
            yield command
    return handler


class _Guarded:
    """A servicer whose every RPC is checked first (what add_servicer registers)."""


def guard_servicer(service, guard: GrpcAclGuard):
    """`service` (MessagingService) behind the ACL check; the service itself checks each
    Telemetry command (`service.acl_guard`)."""
    guarded = _Guarded()
    count = service._count        # denied calls are in the calls metric too, by their status
    for rpc in UNARY_RPCS:
        setattr(guarded, rpc, _unary(rpc, getattr(service, rpc), guard, count))
    for rpc in STREAM_RPCS:
        setattr(guarded, rpc, _streamed(rpc, getattr(service, rpc), guard, count))
    guarded.Telemetry = _telemetry(service.Telemetry, guard, count)
    service.acl_guard = guard
    return guarded
