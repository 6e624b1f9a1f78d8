"""Client exceptions, and the one table from broker response codes to them.

Expected outcomes of a request (PULL_NOT_FOUND, FLUSH_DISK_TIMEOUT on send...)
are values, not exceptions; everything a caller must react to is one of the
classes below. `retriable` says whether the producer may try again on another
broker (Java's retryResponseCodes plus connection problems).
"""
from __future__ import annotations

import re

from pocketmq.protocol.codes import ResponseCode


class MQClientError(Exception):
    """Base of every error raised by pocketmq's client."""
    retriable = False


class ClientStateError(MQClientError):
    """Used before start() or after close()."""


class InvalidArgumentError(MQClientError, ValueError):
    """A message, topic, group or option the client refuses before sending."""


class MessageTooLargeError(InvalidArgumentError):
    """Body larger than the producer's max_message_size_bytes."""


class NoRouteError(MQClientError):
    """No route for a topic (the NameServer does not know it, or it has no writable queue)."""
    retriable = True


class MessageNotFoundError(MQClientError, LookupError):
    """view_message: no message has this id (client/query.py)."""


class RemotingFailure(MQClientError):
    """The request did not complete: connection refused or closed, nameserver unreachable."""
    retriable = True


class RequestTimeoutError(RemotingFailure, TimeoutError):
    """No response in time."""


class BrokerError(MQClientError):
    """The broker (or nameserver) answered with an error response code."""

    def __init__(self, code: int, remark: str | None = None, addr: str | None = None):
        self.code = code
        self.remark = remark or ""
        self.addr = addr
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = str(code)
        where = f" from {addr}" if addr else ""
        super().__init__(f"{name} ({code}){where}: {self.remark}")


class BrokerSystemError(BrokerError):
    retriable = True


class SystemBusyError(BrokerError):
    retriable = False   # Java does not retry SYSTEM_BUSY on sync send


class RequestCodeNotSupportedError(BrokerError):
    pass


class MessageIllegalError(BrokerError):
    pass


class ServiceNotAvailableError(BrokerError):
    retriable = True


class VersionNotSupportedError(BrokerError):
    pass


class NoPermissionError(BrokerError):
    retriable = True


class TopicNotExistError(BrokerError):
    retriable = True


class QueryNotFoundError(BrokerError):
    pass


class SubscriptionError(BrokerError):
    """SUBSCRIPTION_PARSE_FAILED / NOT_EXIST / NOT_LATEST / GROUP_NOT_EXIST."""


class ConsumerNotOnlineError(BrokerError):
    pass


class FlowControlError(BrokerError):
    pass


class NotInCurrentUnitError(BrokerError):
    retriable = True


class AclDeniedError(BrokerError, PermissionError):
    """The broker's (or nameserver's) plain ACL refused the request. RocketMQ 4.x answers a
    deny as SYSTEM_ERROR whose remark is the AclException's text plus a stack frame (no
    code of its own), so it is told from other system errors by that remark. Never
    retried: another broker of the cluster has the same accounts.

    `account`: the access key the client signed with (None: it had no credentials);
    `reason`: the broker's words, e.g. "No default permission for TopicX"."""

    def __init__(self, code: int, remark: str | None = None, addr: str | None = None,
                 account: str | None = None):
        BrokerError.__init__(self, code, remark, addr)
        self.account = account
        self.reason = acl_deny_reason(self.remark)
        who = f"account {account}" if account else "a client without credentials (no accessKey)"
        where = f" by {addr}" if addr else ""
        Exception.__init__(self, f"ACL denied {who}{where}: {self.reason}")


_ACL_MARK = "AclException"
# "org.apache.rocketmq.acl.common.AclException: <message>, <class.method(File.java:123)>"
_ACL_REMARK = re.compile(r"AclException:\s*(?P<msg>.*?)(?:,\s*[\w$.<>]+\([^()]*\))?\s*$", re.S)


def is_acl_deny(code: int, remark: str | None) -> bool:
    return code == ResponseCode.SYSTEM_ERROR and bool(remark) and _ACL_MARK in remark


def acl_deny_reason(remark: str) -> str:
    """The AclException's message from a deny's remark (the stack frame dropped)."""
    m = _ACL_REMARK.search(remark or "")
    return m.group("msg").strip() if m and m.group("msg").strip() else (remark or "").strip()


# The only place response codes become exception classes.
ERROR_TABLE: dict[int, type[BrokerError]] = {
    ResponseCode.SYSTEM_ERROR: BrokerSystemError,
    ResponseCode.SYSTEM_BUSY: SystemBusyError,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: RequestCodeNotSupportedError,
    ResponseCode.MESSAGE_ILLEGAL: MessageIllegalError,
    ResponseCode.SERVICE_NOT_AVAILABLE: ServiceNotAvailableError,
    ResponseCode.VERSION_NOT_SUPPORTED: VersionNotSupportedError,
    ResponseCode.NO_PERMISSION: NoPermissionError,
    ResponseCode.TOPIC_NOT_EXIST: TopicNotExistError,
    ResponseCode.QUERY_NOT_FOUND: QueryNotFoundError,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: SubscriptionError,
    ResponseCode.SUBSCRIPTION_NOT_EXIST: SubscriptionError,
    ResponseCode.SUBSCRIPTION_NOT_LATEST: SubscriptionError,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: SubscriptionError,
    ResponseCode.NO_BUYER_ID: NotInCurrentUnitError,
    ResponseCode.NOT_IN_CURRENT_UNIT: NotInCurrentUnitError,
    ResponseCode.CONSUMER_NOT_ONLINE: ConsumerNotOnlineError,
    ResponseCode.FLOW_CONTROL: FlowControlError,
}


def error_for(code: int, remark: str | None = None, addr: str | None = None,
              account: str | None = None) -> BrokerError:
    """`account`: the access key the request was signed with, named by an ACL deny."""
    if is_acl_deny(code, remark):
        return AclDeniedError(code, remark, addr, account)
    return ERROR_TABLE.get(code, BrokerError)(code, remark, addr)


def wrap_remoting(e: Exception, addr: str | None = None) -> MQClientError:
    """Turn a remoting-layer exception into a client exception."""
    from pocketmq.remoting.connection import RequestTimeout
    if isinstance(e, MQClientError):
        return e
    where = f" ({addr})" if addr else ""
    if isinstance(e, RequestTimeout):
        return RequestTimeoutError(f"{e}{where}")
    return RemotingFailure(f"{e}{where}")
