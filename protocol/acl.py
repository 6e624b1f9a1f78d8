"""RocketMQ 4.x plain ACL's request signature (Java's AclUtils.combineRequestContent and
AclSigner; research notes: ../shared/reference/acl-and-console.md section A).

PURE module: stdlib only, no I/O.

| step | what                                                                              |
|------|-----------------------------------------------------------------------------------|
| 1    | every ext field except `Signature` and `_UNIQUE_KEY_QUERY`, sorted by key (Java's |
|      | TreeMap: by UTF-16 code unit, which equals Python's code-point order except for   |
|      | characters beyond the BMP; keys are ASCII in practice)                            |
| 2    | their VALUES only, concatenated, UTF-8 encoded (the keys are not part of it)      |
| 3    | then the raw body bytes (none: nothing appended)                                  |
| 4    | HMAC-SHA1 keyed by the secret key (UTF-8), standard Base64: the `Signature` field  |

`AccessKey`, `OnsChannel` and `SecurityToken` are ordinary ext fields and so are signed.
Values are taken as they arrived: ali-ons sends JSON booleans and numbers in extFields and
signs their JavaScript text, so a non-string value is rendered as JavaScript/Java would
(`true`/`false`, decimal integers), never as Python's `True`.
"""
from __future__ import annotations

import binascii
import functools
import hashlib
import hmac
import operator

__all__ = ["SIGNATURE", "ACCESS_KEY", "SECURITY_TOKEN", "ONS_CHANNEL", "UNSIGNED_FIELDS",
           "field_text", "combine_request_content", "sign", "sign_request", "request_signer",
           "signature_matches"]

SIGNATURE = "Signature"
ACCESS_KEY = "AccessKey"
SECURITY_TOKEN = "SecurityToken"
ONS_CHANNEL = "OnsChannel"
UNSIGNED_FIELDS = frozenset({SIGNATURE, "_UNIQUE_KEY_QUERY"})


def field_text(value) -> str:
    """An ext field's value as the signer saw it (JSON scalars as JavaScript prints them)."""
    if isinstance(value, str):
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


# The signed keys' order per shape of ext fields (their keys in arrival order), as an
# itemgetter: a client sends a few shapes (one per request type), and the broker sees the
# same few from every client. Bounded: shapes of more than _SHAPE_KEYS_MAX keys or
# _SHAPE_CHARS_MAX characters of names are not kept, and the table is emptied when it
# reaches _SHAPES_MAX (hostile or fuzzed maps).
_SHAPES: dict = {}
_SHAPES_MAX = 512
_SHAPE_KEYS_MAX = 48
_SHAPE_CHARS_MAX = 1024      # (and their names' length: long hostile keys are not kept)


def _signed_order(ext: dict):
    """An itemgetter returning the signed values in signing order (always a tuple)."""
    shape = tuple(ext)
    getter = _SHAPES.get(shape)
    if getter is None:
        # the sorted keys less the unsigned ones (removed when present)
        keys = sorted(shape)
        if SIGNATURE in ext:
            keys.remove(SIGNATURE)
        if "_UNIQUE_KEY_QUERY" in ext:
            keys.remove("_UNIQUE_KEY_QUERY")
        if len(keys) == 1:
            key = keys[0]
            getter = lambda d: (d[key],)        # noqa: E731  (itemgetter of one key is no tuple)
        elif keys:
            getter = operator.itemgetter(*keys)
        else:
            getter = lambda d: ()               # noqa: E731
        if len(shape) <= _SHAPE_KEYS_MAX and sum(map(len, shape)) <= _SHAPE_CHARS_MAX:
            if len(_SHAPES) >= _SHAPES_MAX:
                _SHAPES.clear()
            _SHAPES[shape] = getter
    return getter


def _fields_text(ext: dict) -> bytes:
    # Every request of a signing client passes here twice (client and broker): the values
    # in signing order by the shape's itemgetter (sort and join 0.81 -> 0.41 µs for a
    # SEND_MESSAGE_V2), joined without a call per field when they are all str (the
    # decoders' case); other values (a client's own dict, ali-ons' JSON scalars) take
    # field_text. Pinned to the plain rule by tests/unit/test_acl_signature.py.
    getter = _SHAPES.get(tuple(ext)) or _signed_order(ext)
    values = getter(ext)
    try:
        text = "".join(values)
    except TypeError:
        text = "".join([field_text(v) for v in values])
    return text.encode("utf-8")


def combine_request_content(ext_fields: dict | None, body: bytes | bytearray | memoryview | None) -> bytes:
    content = _fields_text(ext_fields or {})
    if body:
        content += bytes(body)
    return content


def sign(content: bytes, secret_key: str) -> str:
    return _b64(_mac(_keyed(secret_key), content, None))


def _b64(digest: bytes) -> str:
    return _b2a(digest, newline=False).decode("ascii")


_b2a = binascii.b2a_base64
_compare = hmac.compare_digest


def sign_request(ext_fields: dict, body, access_key: str, secret_key: str,
                 security_token: str | None = None, ons_channel: str | None = None) -> dict:
    """The ext fields a signing client sends: AccessKey (and the optional token and
    channel) added, then the Signature over all of them and the body. Returns a new dict."""
    return request_signer(access_key, secret_key, security_token, ons_channel)(ext_fields, body)


def request_signer(access_key: str, secret_key: str, security_token: str | None = None,
                   ons_channel: str | None = None):
    """`sign_request` for one account, as a function (ext_fields, body) -> new ext fields:
    what a client keeps to sign every request (the key's HMAC states looked up once, the
    account's fields bound)."""
    keyed = _keyed(secret_key)
    added = {ACCESS_KEY: access_key}
    if security_token is not None:
        added[SECURITY_TOKEN] = security_token
    if ons_channel is not None:
        added[ONS_CHANNEL] = ons_channel

    def signed(ext_fields: dict, body) -> dict:
        out = dict(ext_fields)
        out.update(added)
        if SIGNATURE in out:
            del out[SIGNATURE]
        out[SIGNATURE] = _b2a(_mac(keyed, _fields_text(out), body), newline=False).decode("ascii")
        return out
    return signed


_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


@functools.lru_cache(maxsize=256)
def _keyed(secret_key: str) -> tuple:
    """HMAC-SHA1 keyed with `secret_key` as its two SHA-1 states after the padded key
    (RFC 2104: inner over key^ipad, outer over key^opad), to copy: the key's setup once per
    account, not once per request (the broker checks every request). Two SHA-1 copies are
    cheaper than a copy of OpenSSL's HMAC context (0.53 against 0.63 us a request here).
    (`hashlib.sha1` is OpenSSL's where CPython has it.)"""
    key = secret_key.encode("utf-8")
    if len(key) > 64:                 # SHA-1's block: a longer key is hashed first
        key = hashlib.sha1(key).digest()
    key = key.ljust(64, b"\0")
    return hashlib.sha1(key.translate(_IPAD)), hashlib.sha1(key.translate(_OPAD))


def _mac(keyed: tuple, text: bytes, body) -> bytes:
    # (the body is fed to the HMAC as it is, not copied behind the fields' text)
    inner = keyed[0].copy()
    inner.update(text)
    if body:
        inner.update(body)
    outer = keyed[1].copy()
    outer.update(inner.digest())
    return outer.digest()


def signature_matches(ext_fields: dict, body, secret_key: str) -> bool:
    """The request's Signature is the one `secret_key` makes (constant-time comparison).
    Never raises: what cannot have been signed is False."""
    if not ext_fields:
        return False
    got = ext_fields.get(SIGNATURE)
    if type(got) is not str:
        return False
    try:
        text = _fields_text(ext_fields)
        keyed = _keyed(secret_key)
    except (TypeError, UnicodeError):
        # keys that do not sort together (a msgpack header's bytes key beside str ones), a
        # value or a secret UTF-8 cannot hold (a lone surrogate): no client signed that
        return False
    digest = _mac(keyed, text, body)
    return _compare(got.encode("ascii", "replace"), _b2a(digest, newline=False))
