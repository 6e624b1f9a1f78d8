"""Java ``.properties`` files and RocketMQ-style daemon configuration, without I/O.

Shared by ``broker.config`` and ``nameserver.config`` (siblings that may not
import each other) through ``common.daemon_config``, which reads the file and
the environment. This module stays pure: stdlib only, no file, socket, clock or
environment access; everything here is a function of its arguments.

What RocketMQ 4.9 does, and what we do:

* ``BrokerStartup``/``NamesrvStartup`` load ``-c FILE`` with
  ``java.util.Properties.load`` and copy each entry onto the config objects
  through ``MixAll.properties2Object``: the key is a setter's name minus "set"
  with a lower-cased first letter; int/long/boolean/String values are parsed
  with ``Integer.parseInt``/``Long.parseLong``/``Boolean.parseBoolean``.
  Unknown keys and unparsable values are dropped *silently*. We refuse both,
  naming the key and where it came from (``file:line`` or the command-line flag),
  and suggest the closest known key for a typo.
* ``parse_properties`` follows ``Properties.load``: ``#``/``!`` comment lines,
  ``key=value``, ``key: value`` and ``key value``, a trailing odd backslash
  continues the line (the next line's leading blanks are dropped), ``\\t \\n \\r
  \\f \\uXXXX`` escapes and ``\\c`` -> ``c``. One deliberate difference: the
  value's trailing (unescaped) blanks are trimmed too, because Java keeps them
  and then ``Integer.parseInt("10911 ")`` fails and the line is ignored.
* Booleans are ``true``/``false`` in any case (Java maps every other word to
  false; we refuse it). Integers are ``[+-]?[0-9]+`` (no ``_``, no hex).
  Enums are matched by constant name, case-sensitively like ``Enum.valueOf``.
* The command line is commons-cli shaped: ``-c/--configFile``, ``-p``, ``-h``...
  plus ``--key=value`` / ``--key value`` for any config key (our addition).
  Precedence: defaults < file < command line.
"""
from __future__ import annotations

import difflib
import enum
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "LAYER_COMMAND_LINE",
    "LAYER_FILE",
    "CliOption",
    "CommandLine",
    "ConfigError",
    "LoadReport",
    "PropertyLine",
    "ResolvedSettings",
    "Setting",
    "closest_key",
    "coerce_value",
    "decode_properties",
    "error_from_validation",
    "example_value",
    "format_properties",
    "java_str",
    "parse_bool",
    "parse_command_line",
    "parse_enum",
    "parse_float",
    "parse_int",
    "parse_properties",
    "set_properties",
    "resolve_settings",
    "usage",
]

LAYER_FILE = "file"
LAYER_COMMAND_LINE = "command line"

_BLANKS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_INT_RE = re.compile(r"[+-]?[0-9]+")
_NEWLINE_RE = re.compile(r"\r\n|\r|\n")


class ConfigError(ValueError):
    """A configuration that cannot be used. ``str()`` is the one-line message.

    ``key`` is the offending key as written (None for a command-line problem
    that is not about a key), ``source`` where it came from (``path:line``,
    ``command line --key``, ``environment NAME`` or ``default``).
    """

    def __init__(self, key: str | None, source: str, detail: str) -> None:
        self.key = key
        self.source = source
        self.detail = detail
        super().__init__(f"{source}: {detail}" if key is None else f"{source}: {key}: {detail}")


class PropertyLine(typing.NamedTuple):
    """One entry of a .properties text; ``line`` is the first physical line (1-based)."""

    key: str
    value: str
    line: int


class Setting(typing.NamedTuple):
    """A raw ``key=value`` before typing, with where it came from."""

    key: str
    value: str
    source: str
    layer: str


# ---------------------------------------------------------------------------
# .properties text


def decode_properties(data: bytes) -> str:
    """Bytes of a .properties file to text: UTF-8 (BOM dropped), else ISO-8859-1.

    Java reads ISO-8859-1; real files are mostly ASCII and sometimes carry
    UTF-8 comments, for which UTF-8 gives the better answer.
    """
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("iso-8859-1")


def parse_properties(text: str, *, source: str = "<properties>") -> list[PropertyLine]:
    """Entries of a .properties text in file order (duplicates kept; last wins later).

    Raises ConfigError(key, "source:line", ...) for a malformed ``\\uXXXX``.
    """
    text = text.removeprefix("\ufeff")
    lines = _NEWLINE_RE.split(text)
    entries: list[PropertyLine] = []
    index = 0
    while index < len(lines):
        first_line = index + 1
        natural = lines[index].lstrip(_BLANKS)
        index += 1
        if not natural or natural[0] in "#!":
            continue
        parts = [natural]
        while _continues(parts[-1]):
            parts[-1] = parts[-1][:-1]
            if index >= len(lines):
                break
            parts.append(lines[index].lstrip(_BLANKS))
            index += 1
        logical = "".join(parts)
        raw_key, raw_value = _split_key_value(logical)
        where = f"{source}:{first_line}"
        key = _unescape(raw_key, where, None)
        value = _unescape(_rstrip_unescaped(raw_value), where, key)
        entries.append(PropertyLine(key, value, first_line))
    return entries


def set_properties(text: str, updates: dict[str, str]) -> str:
    """``text`` with each key of ``updates`` set to its value: the key's last entry
    rewritten in place (continuation lines of that entry dropped, earlier duplicates
    removed), keys not present appended. Comments, blank lines, other entries and the
    file's line ending stay as they were. Values are written escaped so that
    ``parse_properties`` reads them back unchanged.
    """
    text = text.removeprefix("\ufeff")
    newline = m.group(0) if (m := _NEWLINE_RE.search(text)) else "\n"
    lines = _NEWLINE_RE.split(text)
    trailing = bool(lines) and lines[-1] == ""
    if trailing:
        lines.pop()
    # (first, last) physical line of every entry, keyed by its unescaped key
    spans: dict[str, list[tuple[int, int]]] = {}
    index = 0
    while index < len(lines):
        first = index
        natural = lines[index].lstrip(_BLANKS)
        index += 1
        if not natural or natural[0] in "#!":
            continue
        current = natural
        while _continues(current) and index < len(lines):
            current = lines[index]
            index += 1
        raw_key, _ = _split_key_value(natural[:-1] if _continues(natural) else natural)
        key = _unescape(raw_key, "<properties>", None)
        spans.setdefault(key, []).append((first, index - 1))
    replace: dict[int, tuple[int, str | None]] = {}
    appended = []
    for key, value in updates.items():
        line = f"{_escape(key, is_key=True)}={_escape(value, is_key=False)}"
        found = spans.get(key)
        if not found:
            appended.append(line)
            continue
        for first, last in found[:-1]:
            replace[first] = (last, None)
        first, last = found[-1]
        replace[first] = (last, line)
    out = []
    index = 0
    while index < len(lines):
        if index in replace:
            last, line = replace[index]
            if line is not None:
                out.append(line)
            index = last + 1
            continue
        out.append(lines[index])
        index += 1
    out.extend(appended)
    return newline.join(out) + (newline if out else "")


def _escape(text: str, *, is_key: bool) -> str:
    """Properties.store's escaping: backslash, separators in keys, leading blanks, controls."""
    out = []
    for position, char in enumerate(text):
        if char == "\\":
            out.append("\\\\")
        elif char in "\t\n\r\f":
            out.append("\\" + {"\t": "t", "\n": "n", "\r": "r", "\f": "f"}[char])
        elif char == " " and (is_key or position == 0):
            out.append("\\ ")
        elif char in "=:#!" and (is_key or position == 0):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)


def _continues(line: str) -> bool:
    backslashes = len(line) - len(line.rstrip("\\"))
    return backslashes % 2 == 1


def _split_key_value(line: str) -> tuple[str, str]:
    key_end = len(line)
    value_start = len(line)
    has_separator = False
    escaped = False
    for position, char in enumerate(line):
        if not escaped and char in "=:":
            key_end, value_start, has_separator = position, position + 1, True
            break
        if not escaped and char in _BLANKS:
            key_end, value_start = position, position + 1
            break
        escaped = (char == "\\") and not escaped
    while value_start < len(line):
        char = line[value_start]
        if char not in _BLANKS:
            if not has_separator and char in "=:":
                has_separator = True
            else:
                break
        value_start += 1
    return line[:key_end], line[value_start:]


def _rstrip_unescaped(raw: str) -> str:
    end = len(raw)
    while end > 0 and raw[end - 1] in _BLANKS:
        backslashes = 0
        while end - 2 - backslashes >= 0 and raw[end - 2 - backslashes] == "\\":
            backslashes += 1
        if backslashes % 2 == 1:
            break
        end -= 1
    return raw[:end]


def _unescape(raw: str, where: str, key: str | None) -> str:
    if "\\" not in raw:
        return raw
    out: list[str] = []
    position = 0
    while position < len(raw):
        char = raw[position]
        position += 1
        if char != "\\":
            out.append(char)
            continue
        if position >= len(raw):
            break  # a lone trailing backslash: Java drops it as well
        char = raw[position]
        position += 1
        if char == "u":
            digits = raw[position : position + 4]
            if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise ConfigError(key, where, f"malformed \\uXXXX escape: \\u{digits}")
            out.append(chr(int(digits, 16)))
            position += 4
        else:
            out.append(_ESCAPES.get(char, char))
    result = "".join(out)
    if any("\ud800" <= c <= "\udfff" for c in result):
        result = result.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return result


# ---------------------------------------------------------------------------
# values


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def parse_int(text: str) -> int:
    stripped = text.strip()
    if not _INT_RE.fullmatch(stripped):
        raise ValueError(f"expected an integer, got {text!r}")
    return int(stripped)


def parse_float(text: str) -> float:
    stripped = text.strip()
    try:
        if "_" in stripped:
            raise ValueError
        return float(stripped)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


_EnumT = typing.TypeVar("_EnumT", bound=enum.Enum)


def parse_enum(text: str, enum_type: type[_EnumT]) -> _EnumT:
    stripped = text.strip()
    try:
        return enum_type[stripped]
    except KeyError:
        pass
    names = [member.name for member in enum_type]
    hint = closest_key(stripped, names)
    suffix = f"; did you mean {hint}?" if hint else ""
    raise ValueError(f"expected one of {', '.join(names)}, got {text!r}{suffix}")


def coerce_value(text: str, annotation: object) -> object:
    """Turn a raw string into the Python type ``annotation`` names.

    Handles bool, int, float, str, enum types, ``Annotated[...]`` and
    ``X | None`` (an empty string then means None). Raises ValueError with a
    message fit for an operator.
    """
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) != 1:
            raise TypeError(f"unsupported config type {annotation!r}")
        if text.strip() == "":
            return None
        return coerce_value(text, members[0])
    if annotation is bool:
        return parse_bool(text)
    if annotation is int:
        return parse_int(text)
    if annotation is float:
        return parse_float(text)
    if annotation is str:
        return text
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return parse_enum(text, annotation)
    raise TypeError(f"unsupported config type {annotation!r}")


def example_value(annotation: object) -> str:
    """What a value of ``annotation`` looks like, for an operator: ``true``, ``<integer>``,
    ``ASYNC_FLUSH|SYNC_FLUSH``... (the types coerce_value handles)."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return example_value(members[0]) if len(members) == 1 else "<value>"
    if annotation is bool:
        return "true"
    if annotation is int:
        return "<integer>"
    if annotation is float:
        return "<number>"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "|".join(member.name for member in annotation)
    return "<text>" if annotation is str else "<value>"


def java_str(value: object) -> str:
    """A value the way RocketMQ prints it in ``-p`` output (None -> empty)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return value.name
    return str(value)


# What a listing shows in place of a secret that is set (an unset one stays empty).
MASKED = "******"


def format_properties(items: Iterable[tuple[str, object]], *, secret: Iterable[str] = ()) -> str:
    """``key=value`` lines (RocketMQ's ``printConfigItem`` shape), newline-terminated.
    The values of the keys in ``secret`` are printed as ``MASKED`` when set."""
    hidden = frozenset(secret)
    return "".join(f"{key}={MASKED if key in hidden and java_str(value) else java_str(value)}\n"
                   for key, value in items)


def closest_key(key: str, known: Iterable[str]) -> str | None:
    """The known key the operator most likely meant, or None."""
    candidates = list(known)
    lowered = key.lower()
    for candidate in candidates:
        if candidate.lower() == lowered:
            return candidate
    matches = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if matches:
        return matches[0]
    by_lower = {candidate.lower(): candidate for candidate in candidates}
    matches = difflib.get_close_matches(lowered, list(by_lower), n=1, cutoff=0.6)
    return by_lower[matches[0]] if matches else None


# ---------------------------------------------------------------------------
# layering and reporting


@dataclass(frozen=True)
class ResolvedSettings:
    """Typed values of the explicitly set keys (canonical names), and where each came from."""

    values: dict[str, object]
    sources: dict[str, str]
    ignored: tuple[str, ...]
    notes: tuple[str, ...]


def resolve_settings(
    settings: Iterable[Setting],
    field_types: Mapping[str, object],
    *,
    aliases: Mapping[str, str] | None = None,
    ignored_keys: Mapping[str, str] | None = None,
) -> ResolvedSettings:
    """Apply settings in order (later wins) onto the known keys, typing each value.

    ``aliases`` maps an old spelling to its canonical key. ``ignored_keys``
    maps keys that are accepted and dropped (with the reason, for a note).
    Raises ConfigError for an unknown key or a value of the wrong type.
    """
    aliases = aliases or {}
    ignored_keys = ignored_keys or {}
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    layers: dict[str, str] = {}
    ignored: list[str] = []
    notes: list[str] = []
    for setting in settings:
        key = setting.key
        if key in field_types:
            canonical = key
        elif key in aliases:
            canonical = aliases[key]
            notes.append(f"{setting.source}: {key} is the old spelling of {canonical}")
        elif key in ignored_keys:
            if key not in ignored:
                ignored.append(key)
            notes.append(f"{setting.source}: {key} is ignored: {ignored_keys[key]}")
            continue
        else:
            if key == "":
                raise ConfigError(key, setting.source, "empty key")
            hint = closest_key(key, [*field_types, *aliases])
            suffix = f"; did you mean {hint}?" if hint else ""
            raise ConfigError(key, setting.source, f"unknown key{suffix}")
        try:
            value = coerce_value(setting.value, field_types[canonical])
        except ValueError as exc:
            raise ConfigError(key, setting.source, str(exc)) from None
        if canonical in values and layers[canonical] == setting.layer:
            notes.append(
                f"{canonical} is set twice ({sources[canonical]} and {setting.source}); "
                "the later value wins"
            )
        values[canonical] = value
        sources[canonical] = setting.source
        layers[canonical] = setting.layer
    return ResolvedSettings(values, sources, tuple(ignored), tuple(notes))


def error_from_validation(
    errors: Sequence[Mapping[str, object]], sources: Mapping[str, str]
) -> ConfigError:
    """A ConfigError from validation errors shaped like pydantic's ``errors()``.

    A field error names its key in ``loc``; a cross-field error carries
    ``ctx={"key": ..., "related": (...)}`` and is blamed on the first of those
    keys that was explicitly set.
    """
    first = errors[0]
    loc = first.get("loc") or ()
    ctx = first.get("ctx") or {}
    assert isinstance(loc, tuple) and isinstance(ctx, dict)
    key = loc[0] if loc and isinstance(loc[0], str) else ctx.get("key")
    candidates = [key, *ctx.get("related", ())]
    source = next((sources[k] for k in candidates if k in sources), "default")
    detail = str(first.get("msg", "invalid value"))
    detail = detail.removeprefix("Value error, ")
    if loc and "input" in first and first.get("type") != "value_error":
        given = first["input"]
        detail += f" (got {given!r})" if isinstance(given, str) else f" (got {java_str(given)})"
    if len(errors) > 1:
        detail += f" (and {len(errors) - 1} more problem(s))"
    return ConfigError(key if isinstance(key, str) else None, source, detail)


@dataclass(frozen=True)
class LoadReport:
    """What a configuration load did, for the start-up log.

    ``sources`` maps every explicitly set key (canonical name) to where its
    value came from. ``unused_keys`` are explicitly set keys that pocketmq
    accepts but does not act on, in the order they were set.
    """

    config_file: str | None = None
    sources: Mapping[str, str] = field(default_factory=dict)
    unused_keys: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def unused_line(self) -> str | None:
        """The one start-up log line about accepted-but-unused keys, or None."""
        if not self.unused_keys:
            return None
        return "accepted but not used by pocketmq: " + ", ".join(self.unused_keys)


# ---------------------------------------------------------------------------
# command line


@dataclass(frozen=True)
class CliOption:
    """One named option. ``setting_key``: its value becomes a setting of that key."""

    short: str
    long: str
    takes_value: bool
    help: str
    setting_key: str | None = None


@dataclass(frozen=True)
class CommandLine:
    """``options`` maps a given option's long name to its value (True for a flag)."""

    options: Mapping[str, str | bool]
    overrides: tuple[Setting, ...]


def parse_command_line(
    argv: Sequence[str], options: Sequence[CliOption], *, value_hint: Callable[[str], str | None]
) -> CommandLine:
    """Split argv into the named options and ``--key=value``/``--key value`` settings.

    Every ``--name`` that is not a named option becomes a Setting; whether the
    key exists is checked later by resolve_settings (which suggests the
    closest key). ``value_hint(name)`` is an example value for a key
    (``example_value`` of its type) or None when ``name`` is no key: a key
    given without a value is refused with that example (``--listenPort=<integer>``),
    a name that is no key is passed on without a value, so that
    resolve_settings reports it as an unknown key, naming the closest one.
    Raises ConfigError for a malformed command line.
    """
    by_short = {option.short: option for option in options}
    by_long = {option.long: option for option in options}
    given: dict[str, str | bool] = {}
    overrides: list[Setting] = []
    arguments = list(argv)
    position = 0

    def take_value(label: str, attached: str | None) -> str:
        nonlocal position
        if attached is not None:
            return attached
        if position >= len(arguments) or arguments[position].startswith("--"):
            raise ConfigError(None, f"command line {label}", "needs a value")
        value = arguments[position]
        position += 1
        return value

    def record(option: CliOption, label: str, value: str | bool) -> None:
        if option.setting_key is not None:
            assert isinstance(value, str)
            overrides.append(Setting(option.setting_key, value, f"command line {label}", LAYER_COMMAND_LINE))
            return
        if option.long in given and option.takes_value:
            raise ConfigError(None, f"command line {label}", "given more than once")
        given[option.long] = value

    while position < len(arguments):
        argument = arguments[position]
        position += 1
        if argument.startswith("--") and len(argument) > 2:
            name, equals, attached = argument[2:].partition("=")
            value_attached = attached if equals else None
            option = by_long.get(name)
            if option is not None:
                label = f"--{name}"
                if option.takes_value:
                    record(option, label, take_value(label, value_attached))
                elif value_attached is not None:
                    raise ConfigError(None, f"command line {label}", "takes no value")
                else:
                    record(option, label, True)
                continue
            label = f"--{name}"
            if value_attached is None and (
                position >= len(arguments) or arguments[position].startswith("--")
            ):
                example = value_hint(name)
                if example is None:
                    overrides.append(Setting(name, "", f"command line {label}", LAYER_COMMAND_LINE))
                    continue
                raise ConfigError(name, f"command line {label}", f"needs a value (--{name}={example})")
            value = take_value(label, value_attached)
            overrides.append(Setting(name, value, f"command line {label}", LAYER_COMMAND_LINE))
            continue
        if argument.startswith("-") and len(argument) > 1 and not argument.startswith("--"):
            letter, attached = argument[1], argument[2:]
            option = by_short.get(letter)
            if option is None or (attached and not option.takes_value):
                raise ConfigError(None, f"command line {argument}", "unknown option")
            label = f"-{letter}"
            if option.takes_value:
                record(option, label, take_value(label, attached or None))
            else:
                record(option, label, True)
            continue
        raise ConfigError(None, f"command line {argument!r}", "unexpected argument")
    return CommandLine(given, tuple(overrides))


def usage(prog: str, options: Sequence[CliOption]) -> str:
    """A commons-cli style help text."""
    lines = [f"usage: {prog} " + " ".join(
        f"[-{o.short} <arg>]" if o.takes_value else f"[-{o.short}]" for o in options
    ) + " [--key=value ...]"]
    for option in options:
        argument = " <arg>" if option.takes_value else ""
        lines.append(f" -{option.short},--{option.long}{argument}".ljust(34) + option.help)
    lines.append(" --<key>=<value>, --<key> <value>".ljust(34) + "override any config key (wins over -c)")
    return "\n".join(lines) + "\n"
