"""The name rules: which strings may name a topic, a group, a client or a broker.

One owner (re-exported by `common.constants`, where the other domain constants live):
the decoders in `protocol.headers.typed` and `protocol.bodies` check names where they
enter, so a name that reaches a table, a file or a reply body is known to be printable
ASCII, and every encoder can write it back out.

| kind | rule | source |
|---|---|---|
| topic | `^[%|a-zA-Z0-9_-]+$`, at most 127 characters | Java 4.9 TopicValidator |
| group | `^[%|a-zA-Z0-9_-]+$`, at most 255 characters | Java 4.9 Validators.checkGroup |
| clientId | printable ASCII without space, at most 255 | ours: Java's broker does not check it; clients build `ip@instance[@unit]`, C++ `pid-ip@instance`, Go `ip@pid#nanos` |
| brokerName, clusterName | printable ASCII without space, at most 255 | ours: Java defaults brokerName to the host name (dots) and checks nothing |

Pure: no I/O.
"""
from __future__ import annotations

import re

# Java's TopicValidator.VALID_PATTERN_STR: topics and groups (use fullmatch: $ would let a
# trailing newline through).
VALID_NAME_CHARS = r"^[%|a-zA-Z0-9_-]+$"
VALID_NAME_RE = re.compile(VALID_NAME_CHARS)
TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255           # Java's Validators.CHARACTER_MAX_LENGTH
# clientId, brokerName, clusterName: printable ASCII (0x21-0x7e), so every log line, reply
# body and file can hold them, whatever the encoder.
_PRINTABLE_RE = re.compile(r"[!-~]+")
ID_MAX_LENGTH = 255

TOPIC, GROUP, CLIENT_ID, BROKER = "topic", "group", "clientId", "broker"
_RULES = {
    TOPIC: (VALID_NAME_RE, TOPIC_MAX_LENGTH, "^[%|a-zA-Z0-9_-]+$"),
    GROUP: (VALID_NAME_RE, GROUP_MAX_LENGTH, "^[%|a-zA-Z0-9_-]+$"),
    CLIENT_ID: (_PRINTABLE_RE, ID_MAX_LENGTH, "printable ASCII without spaces"),
    BROKER: (_PRINTABLE_RE, ID_MAX_LENGTH, "printable ASCII without spaces"),
}


def shown(value: str) -> str:
    """`value` for a remark or a log line: non-ASCII as backslash escapes, so the text is
    encodable whatever the value holds (a lone surrogate included)."""
    return value if value.isascii() else value.encode("ascii", "backslashreplace").decode("ascii")


def name_error(kind: str, field: str, value) -> str | None:
    """None when `value` is a valid name of `kind` (TOPIC, GROUP, CLIENT_ID, BROKER), else a
    remark naming `field` and the rule (Java's wording for topics)."""
    pattern, max_len, rule = _RULES[kind]
    if type(value) is not str:
        return f"the {field} is not a string"
    if pattern.fullmatch(value) is None:
        if not value.strip():
            return f"The specified {field} is blank."
        return f"The specified {field}[{shown(value)}] contains illegal characters, allowing only {rule}"
    if len(value) > max_len:
        return f"The specified {field} is longer than {field} max length ({max_len})."
    return None


# Header fields (extFields keys) that carry a name, checked by check_ext_names.
EXT_NAME_FIELDS = (("topic", TOPIC), ("consumerGroup", GROUP), ("producerGroup", GROUP),
                   ("group", GROUP), ("clientID", CLIENT_ID), ("clientId", CLIENT_ID),
                   ("brokerName", BROKER), ("clusterName", BROKER), ("cluster", BROKER),
                   ("brokerAddr", BROKER), ("haServerAddr", BROKER))
