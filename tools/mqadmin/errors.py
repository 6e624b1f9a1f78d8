"""What a failed mqadmin command tells the user: one `mqadmin: ...` line and an exit code.

Client exceptions (client.errors) become AdminError here, with the wording mqadmin has
always used: "cannot reach <role> <addr> (<reason>)" for a transport failure and
"<what> failed: <remark> (<CODE> from <where>)" for an error response.
"""
from __future__ import annotations

from pocketmq.client.api import DEFAULT_TIMEOUT_S
from pocketmq.client.errors import BrokerError, RequestTimeoutError
from pocketmq.protocol.codes import ResponseCode
from pocketmq.remoting.connection import RequestTimeout

PROG = "mqadmin"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class AdminError(Exception):
    """An operation failed; the message is what the user sees."""
    exit_code = EXIT_FAILED


class UsageError(AdminError):
    exit_code = EXIT_USAGE


def code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"code {code}"


def one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def failed(e: BrokerError, what: str, where: str) -> AdminError:
    """An error response (a BrokerError from ClientAPI) as the user sees it."""
    return AdminError(f"{what} failed: {one_line(e.remark) or 'no details'} ({code_name(e.code)} from {where})")


def transport_reason(e: BaseException, timeout_s: float = DEFAULT_TIMEOUT_S, addr: str | None = None,
                     connect_timeout_s: float | None = None) -> str:
    """Short human reason for a transport failure: a remoting error, or the client's
    RemotingFailure wrapping one (its text is the remoting error's plus " (addr)").

    The client's exceptions carry the reason only as text (the OS error of the connect,
    "closed", "timeout"), so it is read from there."""
    if isinstance(e, (RequestTimeout, RequestTimeoutError)):
        return f"no response within {timeout_s:g}s"
    text = str(e)
    if addr and text.endswith(f" ({addr})"):
        text = text[:-len(addr) - 3]
    low = text.lower()
    if "errno 111" in low or "refused" in low or "errno 61]" in low:
        return "connection refused"
    if low.endswith(": timeout"):
        return (f"connect timed out after {connect_timeout_s:g}s" if connect_timeout_s is not None
                else "connect timed out")
    if "errno 113" in low or "no route to host" in low:
        return "no route to host"
    if "errno 101" in low or "network is unreachable" in low:
        return "network unreachable"
    if "name or service not known" in low or "nodename nor servname" in low or "errno -2" in low \
            or "errno -3" in low or "errno -5" in low:
        return "unknown host"
    if "closed" in low:
        return "connection closed by the server"
    if text.startswith("cannot connect to ") and ": " in text:
        return text.split(": ", 1)[1]
    return one_line(text) or type(e).__name__
