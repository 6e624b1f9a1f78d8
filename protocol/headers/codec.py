"""Header codecs: JSON (type 0), ROCKETMQ binary (type 1) and msgpack (type 2, ours).

A codec turns the header bytes of a frame into the seven header values
(code, language, version, opaque, flag, remark, ext_fields) and back.

ROCKETMQ binary header layout (all big-endian):

| size | field                                              |
|------|----------------------------------------------------|
| 2    | code (short)                                       |
| 1    | language code (byte)                               |
| 2    | version (short)                                    |
| 4    | opaque (int)                                       |
| 4    | flag (int)                                         |
| 4    | remark length n (0 => null)                        |
| n    | remark UTF-8                                       |
| 4    | extFields block length m (0 => none)               |
| m    | entries: key len (2) + key + value len (4) + value |

msgpack header: a 7-element array [code, language, version, opaque, flag,
remark or nil, {str: str} or nil].

Decoding rules (protocol reference 1.3): language may be a name or a number;
extFields values may be strings, numbers or booleans and are all turned into
strings (int -> decimal, bool -> "true"/"false"); a missing extFields is {}.
Encoding always writes every extFields value as a string, because the C++
client ignores non-string values and the Go client fails on them.

Encoders are total: any str that got into a command (a lone UTF-16 surrogate
decoded from a JSON `\\ud800` escape included) can be written, so an answer is
always sent. JSON writes such a frame's strings with `\\uXXXX` escapes (valid
JSON, valid UTF-8, the value survives a round trip); ROCKETMQ binary and msgpack
have no escape for them and write U+FFFD instead (`utf8`, `sanitize`).
"""
from __future__ import annotations

import json
import re
import struct

import msgpack

from pocketmq.protocol.codes import LanguageCode, SerializeType
from pocketmq.protocol.errors import ProtocolError

_LANG_BY_NAME = {m.name: int(m) for m in LanguageCode}
_LANG_NAME = {int(m): m.name for m in LanguageCode}
_FIXED = struct.Struct(">hbhii")


def _to_str(value) -> str | None:
    if isinstance(value, str):
        return value
    if value is None:
        return None
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _language_from(value) -> int:
    if isinstance(value, str):
        return _LANG_BY_NAME.get(value, int(LanguageCode.OTHER))
    if isinstance(value, int):
        return value
    return int(LanguageCode.OTHER)


def _normalise_ext(raw) -> dict[str, str]:
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise ProtocolError("extFields is not an object")
    # Fast path: Java, Go and pocketmq peers send only strings.
    for v in raw.values():
        if type(v) is not str:
            break
    else:
        return raw
    out = {}
    for k, v in raw.items():
        s = _to_str(v)
        if s is not None:
            out[str(k)] = s
    return out


def _safe_ext(raw) -> dict[str, str]:
    """_normalise_ext, with anything a crafted value can raise (nesting, bytes keys inside
    nested maps) reported as a protocol error: one error family for bad frames."""
    try:
        return _normalise_ext(raw)
    except ProtocolError:
        raise
    except Exception as e:
        raise ProtocolError(f"bad extFields: {type(e).__name__}") from None


def _as_int(obj: dict, key: str, default: int = 0) -> int:
    value = obj.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ProtocolError(f"header field {key!r} is not an integer")
    try:
        return int(value)
    except ValueError:
        raise ProtocolError(f"header field {key!r} is not an integer") from None


# --- JSON -------------------------------------------------------------------

_json_loads = json.JSONDecoder().decode


def decode_json(data) -> tuple:
    try:
        obj = _json_loads(str(data, "utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ProtocolError(f"bad JSON header: {type(e).__name__}: {e}") from None
    if type(obj) is not dict:
        raise ProtocolError("JSON header is not an object")
    remark = obj.get("remark")
    if remark is not None and type(remark) is not str:
        remark = _to_str(remark)
    code, version, opaque, flag = obj.get("code"), obj.get("version"), obj.get("opaque"), obj.get("flag")
    if not (type(code) is int and type(version) is int and type(opaque) is int and type(flag) is int):
        code, version = _as_int(obj, "code"), _as_int(obj, "version")
        opaque, flag = _as_int(obj, "opaque"), _as_int(obj, "flag")
    language = obj.get("language", "JAVA")
    language = _LANG_BY_NAME.get(language, 7) if type(language) is str else _language_from(language)
    return code, language, version, opaque, flag, remark, _safe_ext(obj.get("extFields"))


_esc = json.encoder.encode_basestring  # C-accelerated string quoting
_esc_ascii = json.encoder.encode_basestring_ascii


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def utf8(text: str) -> bytes:
    """`text` as UTF-8; a lone surrogate (which UTF-8 cannot hold) becomes U+FFFD."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return _SURROGATE_RE.sub("\ufffd", text).encode()


def sanitize(value):
    """`value` (a str, or a dict/list of them) with lone surrogates replaced by U+FFFD."""
    if type(value) is str:
        return utf8(value).decode()
    if isinstance(value, dict):
        return {sanitize(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    return value


def encode_json(code, language, version, opaque, flag, remark, ext_fields) -> bytes:
    # Key order and compactness follow fastjson (sorted, no spaces, nulls
    # omitted) so our frames look like a Java peer's. Built by hand: this runs
    # once per response and json.dumps of a dict costs several times more.
    try:
        return _encode_json(code, language, version, opaque, flag, remark, ext_fields, _esc).encode()
    except UnicodeEncodeError:
        # a lone surrogate: the whole header as ASCII with \uXXXX escapes (rare, so not fast)
        return _encode_json(code, language, version, opaque, flag, remark, ext_fields, _esc_ascii).encode()


def _encode_json(code, language, version, opaque, flag, remark, ext_fields, _esc) -> str:
    if ext_fields:
        items = []
        for k, v in ext_fields.items():
            if v is None:
                continue
            if type(v) is not str:
                v = _to_str(v)
            items.append(_esc(k) + ":" + _esc(v))
        ext = '"extFields":{' + ",".join(items) + "},"
    else:
        ext = ""
    rem = '"remark":' + _esc(remark) + "," if remark is not None else ""
    return ('{"code":%d,%s"flag":%d,"language":"%s","opaque":%d,%s"serializeTypeCurrentRPC":"JSON","version":%d}'
            % (code, ext, flag, _LANG_NAME.get(language, "OTHER"), opaque, rem, version))


def _encode_json_reference(code, language, version, opaque, flag, remark, ext_fields) -> bytes:
    """The straightforward encoder; tests check encode_json against it."""
    obj = {"code": code}
    if ext_fields:
        obj["extFields"] = {k: _to_str(v) for k, v in ext_fields.items() if v is not None}
    obj["flag"] = flag
    obj["language"] = _LANG_NAME.get(language, "OTHER")
    obj["opaque"] = opaque
    if remark is not None:
        obj["remark"] = remark
    obj["serializeTypeCurrentRPC"] = "JSON"
    obj["version"] = version
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


# --- ROCKETMQ binary ----------------------------------------------------------

def decode_rocketmq(data) -> tuple:
    mv = memoryview(data)
    n = len(mv)
    try:
        code, language, version, opaque, flag = _FIXED.unpack_from(mv, 0)
        pos = _FIXED.size
        (rlen,) = struct.unpack_from(">i", mv, pos)
        pos += 4
        if rlen < 0 or pos + rlen > n:
            raise ProtocolError("ROCKETMQ header: bad remark length")
        remark = bytes(mv[pos:pos + rlen]).decode() if rlen else None
        pos += rlen
        (elen,) = struct.unpack_from(">i", mv, pos)
        pos += 4
        if elen < 0 or pos + elen > n:
            raise ProtocolError("ROCKETMQ header: bad extFields length")
        end = pos + elen
        ext = {}
        while pos < end:
            (klen,) = struct.unpack_from(">h", mv, pos)
            pos += 2
            if klen < 0 or pos + klen > end:
                raise ProtocolError("ROCKETMQ header: bad key length")
            key = bytes(mv[pos:pos + klen]).decode()
            pos += klen
            (vlen,) = struct.unpack_from(">i", mv, pos)
            pos += 4
            if vlen < 0 or pos + vlen > end:
                raise ProtocolError("ROCKETMQ header: bad value length")
            ext[key] = bytes(mv[pos:pos + vlen]).decode()
            pos += vlen
    except struct.error:
        raise ProtocolError("ROCKETMQ header truncated") from None
    except UnicodeDecodeError:
        raise ProtocolError("ROCKETMQ header: invalid UTF-8") from None
    return code, language, version, opaque, flag, remark, ext


def encode_rocketmq(code, language, version, opaque, flag, remark, ext_fields) -> bytes:
    parts = [_FIXED.pack(code, language, version, opaque, flag)]
    if remark:
        r = utf8(remark)
        parts.append(struct.pack(">i", len(r)))
        parts.append(r)
    else:
        parts.append(b"\x00\x00\x00\x00")
    ext_parts = []
    for k, v in (ext_fields or {}).items():
        s = _to_str(v)
        if k is None or s is None:
            continue
        kb, vb = utf8(k), utf8(s)
        ext_parts.append(struct.pack(">h", len(kb)) + kb + struct.pack(">i", len(vb)) + vb)
    ext = b"".join(ext_parts)
    parts.append(struct.pack(">i", len(ext)))
    parts.append(ext)
    return b"".join(parts)


# --- msgpack (pocketmq's own) ----------------------------------------------------

def decode_msgpack(data) -> tuple:
    try:
        obj = _unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types
        raise ProtocolError(f"bad msgpack header: {e}") from None
    if type(obj) is not list or len(obj) != 7:
        raise ProtocolError("msgpack header is not a 7-element array")
    code, language, version, opaque, flag, remark, ext = obj
    # (`type(x) is int` also refuses bools, which are ints to isinstance)
    if not (type(code) is int and type(language) is int and type(version) is int
            and type(opaque) is int and type(flag) is int):
        for name, v in (("code", code), ("language", language), ("version", version),
                        ("opaque", opaque), ("flag", flag)):
            if type(v) is not int:
                raise ProtocolError(f"msgpack header field {name} is not an integer")
    if remark is not None and type(remark) is not str:
        raise ProtocolError("msgpack header remark is not a string")
    if type(ext) is dict:
        for v in ext.values():
            if type(v) is not str:
                break
        else:
            return code, language, version, opaque, flag, remark, ext   # all strings: as is
    return code, language, version, opaque, flag, remark, _safe_ext(ext)


# One Packer, reused: msgpack.packb builds a new one per call. Packer.pack runs in C
# holding the GIL and calls back into no Python code for these types, so threads
# (the sync facade's loop, a broker in the same process) cannot interleave in it.
# protocol.command.encode_parts packs msgpack headers with it too (its fast path).
pack_msgpack = msgpack.Packer(use_bin_type=True).pack
_unpackb = msgpack.unpackb


def encode_msgpack(code, language, version, opaque, flag, remark, ext_fields) -> bytes:
    if ext_fields:
        ext = ext_fields
        for v in ext_fields.values():   # fast path: already all strings (every response we build)
            if type(v) is not str:
                ext = {k: _to_str(v) for k, v in ext_fields.items() if v is not None}
                break
    else:
        ext = None
    try:
        return pack_msgpack([code, language, version, opaque, flag, remark, ext])
    except UnicodeEncodeError:
        return pack_msgpack([code, language, version, opaque, flag, sanitize(remark), sanitize(ext)])


DECODERS = {
    SerializeType.JSON: decode_json,
    SerializeType.ROCKETMQ: decode_rocketmq,
    SerializeType.MSGPACK: decode_msgpack,
}
ENCODERS = {
    SerializeType.JSON: encode_json,
    SerializeType.ROCKETMQ: encode_rocketmq,
    SerializeType.MSGPACK: encode_msgpack,
}
