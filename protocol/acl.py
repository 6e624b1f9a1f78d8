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

try:      # CPython's OpenSSL HMAC: its copy() is C (hmac.HMAC.copy is Python, one-shot
    from _hashlib import hmac_new as _openssl_hmac_new       # hmac.digest sets up the key
except ImportError:                                          # every call): 0.6 against 0.95
    _openssl_hmac_new = None                                 # and 1.3 us a request here

__all__ = ["SIGNATURE", "ACCESS_KEY", "SECURITY_TOKEN", "ONS_CHANNEL", "UNSIGNED_FIELDS",
           "field_text", "combine_request_content", "sign", "sign_request", "signature_matches"]

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
# same few from every client. Bounded: shapes of more than _SHAPE_KEYS_MAX keys are not
# kept, and the table is emptied when it reaches _SHAPES_MAX (hostile or fuzzed maps).
_SHAPES: dict = {}
_SHAPES_MAX = 512
_SHAPE_KEYS_MAX = 48


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
        if len(shape) <= _SHAPE_KEYS_MAX:
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
    values = _signed_order(ext)(ext)
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
    mac = _keyed(secret_key).copy()
    mac.update(content)
    return _b64(mac.digest())


def _b64(digest: bytes) -> str:
    return _b2a(digest, newline=False).decode("ascii")


_b2a = binascii.b2a_base64
_compare = hmac.compare_digest


def sign_request(ext_fields: dict, body, access_key: str, secret_key: str,
                 security_token: str | None = None, ons_channel: str | None = None) -> dict:
    """The ext fields a signing client sends: AccessKey (and the optional token and
    channel) added, then the Signature over all of them and the body. Returns a new dict."""
    out = dict(ext_fields)
    out[ACCESS_KEY] = access_key
    if security_token is not None:
        out[SECURITY_TOKEN] = security_token
    if ons_channel is not None:
        out[ONS_CHANNEL] = ons_channel
    out.pop(SIGNATURE, None)
    # (the body is fed to the HMAC as it is, not copied behind the fields' text)
    mac = _keyed(secret_key).copy()
    mac.update(_fields_text(out))
    if body:
        mac.update(body)
    out[SIGNATURE] = _b64(mac.digest())
    return out


@functools.lru_cache(maxsize=256)
def _keyed(secret_key: str):
    """An HMAC-SHA1 keyed with `secret_key`, to copy: the key's setup once per account, not
    once per request (the broker checks every request)."""
    key = secret_key.encode("utf-8")
    if _openssl_hmac_new is not None:
        return _openssl_hmac_new(key, digestmod="sha1")
    return hmac.new(key, digestmod=hashlib.sha1)


def signature_matches(ext_fields: dict, body, secret_key: str) -> bool:
    """The request's Signature is the one `secret_key` makes (constant-time comparison)."""
    if not ext_fields:
        return False
    got = ext_fields.get(SIGNATURE)
    if type(got) is not str:
        return False
    # (the body is fed to the HMAC as it is, not copied behind the fields' text)
    mac = _keyed(secret_key).copy()
    mac.update(_fields_text(ext_fields))
    if body:
        mac.update(body)
    return _compare(got.encode("ascii", "replace"), _b2a(mac.digest(), newline=False))
