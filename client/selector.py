"""MessageSelector: what a consumer subscribes to in a topic (Java's MessageSelector).

    consumer.subscribe("T", MessageSelector.by_sql("a > 5 AND region = 'eu'"))
    consumer.subscribe("T", MessageSelector.by_tag("TagA || TagB"))
    consumer.subscribe("T", "TagA || TagB")        # the string form: a tag expression

A tag expression is checked by the broker on the consume queue's tag hash codes and
again by the client on the exact tags. An SQL92 expression is checked by the broker
alone, on each message's properties (TAGS among them); the broker needs
`enablePropertyFilter=true` and answers a pull with an expression it cannot parse
with SUBSCRIPTION_PARSE_FAILED naming the column. The client does not parse SQL92
itself: the broker's dialect is the one that counts.
"""
from __future__ import annotations

from typing import NamedTuple

from pocketmq.client.errors import InvalidArgumentError

__all__ = ["MessageSelector", "selector_of"]

TAG = "TAG"
SQL92 = "SQL92"


class MessageSelector(NamedTuple):
    expression_type: str        # "TAG" or "SQL92", as sent on the wire (expressionType)
    expression: str

    @classmethod
    def by_sql(cls, sql: str) -> MessageSelector:
        """Messages whose properties satisfy an SQL92 expression (RocketMQ's dialect)."""
        if not isinstance(sql, str) or not sql.strip():
            raise InvalidArgumentError(f"an SQL92 selector needs a non-empty expression, got {sql!r}")
        return cls(SQL92, sql)

    @classmethod
    def by_tag(cls, tag: str | None = "*") -> MessageSelector:
        """Messages with one of the tags of `tag` ("A || B"); "*", "" or None: every message."""
        if tag is not None and not isinstance(tag, str):
            raise InvalidArgumentError(f"a tag selector needs a string, got {tag!r}")
        return cls(TAG, tag.strip() if tag and tag.strip() else "*")


def selector_of(expression: str | MessageSelector | None) -> MessageSelector:
    """What subscribe() accepts, as a MessageSelector: a string is a tag expression."""
    if isinstance(expression, MessageSelector):
        return expression
    if expression is None or isinstance(expression, str):
        return MessageSelector.by_tag(expression)
    raise InvalidArgumentError(f"subscribe() takes a tag expression or a MessageSelector, got {expression!r}")
