"""One error family for the protocol layer (h11 style)."""
from __future__ import annotations


class ProtocolError(Exception):
    """Bytes that are not a valid RocketMQ frame. The connection must be closed."""


class HeaderError(ValueError):
    """A request's custom header is missing a required field or holds a bad value.

    Processors answer it with SYSTEM_ERROR and the message as remark, the way
    the Java broker answers "the custom field <x> is null".
    """


class BodyError(ValueError):
    """A JSON body that cannot be understood."""
