"""One TCP connection speaking RemotingCommand frames (asyncio shell).

Both roles use it: servers receive requests and send responses; clients send
requests and match responses by opaque; either side may receive requests from
the other (NOTIFY_CONSUMER_IDS_CHANGED goes broker -> client).

Bounds: frames larger than `frame_size_bytes_max` close the connection; at
most `requests_in_flight_max` outgoing requests wait for a response (more
raise `TooManyRequests`); at most `handlers_in_flight_max` incoming requests
are processed concurrently (more are answered SYSTEM_BUSY); writes pause
the reader when the transport buffer is above its high-water mark.

Server side, the reader also pauses (one mask of reasons, `_pause`/`_unpause`):
* after `DISPATCH_SLICE` requests of one read (or 5 ms), to let other connections in: the rest
  stays in the decoder and is handled on the next loop turn (uvloop reads up to 32
  chunks of a pipelining peer in one go: 20,000 pipelined pulls used to keep the loop
  for seconds);
* while the peer does not read its replies (write high-water mark): no more requests
  are handled or read until it catches up;
* while a large partial frame waits for the server's `ReadBudget`
  (remoting/read_budget.py), which also closes a connection whose frame does not
  complete in time.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import traceback
from time import monotonic as _monotonic

from pocketmq.protocol.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode
from pocketmq.protocol.command import (
    FRAME_SIZE_BYTES_MAX_DEFAULT,
    FrameDecoder,
    RemotingCommand,
    encode_parts,
)
from pocketmq.protocol.errors import BodyError, HeaderError, ProtocolError
from pocketmq.remoting.read_budget import SMALL_FRAME_BYTES

log = logging.getLogger("pocketmq.remoting")

_opaque_seq = itertools.count(1)


def next_opaque() -> int:
    # Like the C++ client: a process-wide counter masked to a positive int.
    return next(_opaque_seq) & 0x7FFFFFFF


class RemotingError(Exception):
    """A request could not be completed (connection closed, timeout, overload)."""


class RequestTimeout(RemotingError):
    pass


class ConnectionClosed(RemotingError):
    pass


class TooManyRequests(RemotingError):
    pass


class _Expired(Exception):
    pass


_INF = float("inf")

# Requests handled per read callback (or per turn of a continuation) before yielding:
# at most DISPATCH_SLICE, and no more once DISPATCH_SLICE_S have passed (checked every 16).
DISPATCH_SLICE = 256
DISPATCH_SLICE_S = 0.005

# Reasons the reader is paused (a mask: reading resumes when none is left).
_PAUSE_WRITE, _PAUSE_SLICE, _PAUSE_BUDGET = 1, 2, 4


class Connection(asyncio.Protocol):
    """`handler(conn, cmd)` processes incoming requests; it returns a response,
    None (no response now, e.g. a held pull), or an awaitable of either."""

    # Output a peer has not read yet beyond this closes the connection (held-pull replays
    # and async handlers can still write while reading is paused).
    write_buffer_bytes_max = 64 * 1024 * 1024

    def __init__(self, handler=None, *, frame_size_bytes_max: int = FRAME_SIZE_BYTES_MAX_DEFAULT,
                 requests_in_flight_max: int = 65536, handlers_in_flight_max: int = 4096,
                 on_close=None, name: str = "", pause_reading_on_backpressure: bool = False,
                 busy_poll=None, processors: dict | None = None, read_budget=None):
        self.handler = handler
        # code -> proc(conn, cmd): a server's table (used instead of handler when given)
        self.processors = processors
        self.pause_reading_on_backpressure = pause_reading_on_backpressure
        self.busy_poll = busy_poll     # remoting.busy_poll.BusyPoll shared by a role, or None
        self.decoder = FrameDecoder(frame_size_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, asyncio.Future] = {}
        self.requests_in_flight_max = requests_in_flight_max
        self.handlers_in_flight_max = handlers_in_flight_max
        self.handlers_in_flight = 0
        self.on_close = on_close
        self.name = name
        self.remote_addr = ""
        self.remote_ip = ""        # the peer's address without the port (the ACL's white lists)
        self.closed = False
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.attrs: dict = {}  # per-connection state owned by the role (client id, language...)
        self.last_read_s = _monotonic()   # stamped on every read; RemotingServer.close_idle
        self.idle_seen_read_s: float | None = None  # ... compares it with the stamp it last saw
        self.idle_active_ms = 0                     # ... and the tick (its clock) that saw it change
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadlines: dict[int, float] = {}    # opaque -> loop time its request expires
        self._sweep_handle: asyncio.TimerHandle | None = None
        self._sweep_at = _INF
        # While one read is being processed, outgoing frames are collected here and
        # written with one writelines (one syscall) when the read is done.
        self._out: list | None = None
        # send() not overridden (ClientConnection does): _dispatch may queue a reply itself
        self._plain_send = type(self).send is Connection.send
        self._paused = 0                  # _PAUSE_* reasons the reader is paused for
        self._continue_scheduled = False
        # Server side: the shared budget for partial frames (remoting/read_budget.py).
        self.read_budget = read_budget
        self.partial_since: float | None = None   # monotonic s the frame in progress began
        self.budget_reserved = 0                  # bytes reserved for it
        self.budget_wanted = 0                    # bytes waited for (reading paused)

    # -- asyncio.Protocol ------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        peer = transport.get_extra_info("peername")
        if peer:
            self.remote_addr = f"{peer[0]}:{peer[1]}"
            self.remote_ip = str(peer[0])
        sock = transport.get_extra_info("socket")
        if sock is not None:
            import socket
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data):
        self.last_read_s = t0 = _monotonic()
        if self._paused & (_PAUSE_SLICE | _PAUSE_WRITE):
            self.decoder.feed(data)
            return      # bytes read before the pause took effect: handled when it ends
        self._handle(t0, data)

    def _handle(self, t0: float, data=None) -> None:
        """Decode and dispatch what the decoder holds after `data` (a read, or None), at
        most DISPATCH_SLICE requests on the server side (the rest on a later loop turn)."""
        dec = self.decoder
        next_command = dec.next_command
        self._out = out = []
        budget = DISPATCH_SLICE if self.pause_reading_on_backpressure else -1
        handled = 0
        failed = False
        try:
            cmd = None
            if data is not None:
                # a read of one whole frame (a sync request or its reply) skips the buffer
                cmd = dec.whole_frame(data)
                if cmd is None:
                    dec.feed(data)
            while True:
                if cmd is None:
                    cmd = next_command()
                    if cmd is None:
                        break
                handled += 1
                if cmd.flag & FLAG_RESPONSE:
                    fut = self.pending.pop(cmd.opaque, None)
                    if fut is None:
                        log.debug("%s: response with unknown opaque %d dropped", self.name, cmd.opaque)
                    elif not fut.done():
                        fut.set_result(cmd)
                else:
                    self._dispatch(cmd)
                cmd = None
                if handled == budget or (budget > 0 and not handled & 15
                                         and _monotonic() - t0 > DISPATCH_SLICE_S):
                    self._pause(_PAUSE_SLICE)
                    if not self._continue_scheduled:
                        self._continue_scheduled = True
                        (self._loop or asyncio.get_running_loop()).call_soon(self._continue)
                    break
        except ProtocolError as e:
            log.warning("%s: protocol error from %s, closing connection: %s", self.name, self.remote_addr, e)
            failed = True
            self.close()
        finally:
            self._out = None
            if out:
                transport = self.transport
                if not self.closed and transport is not None and not transport.is_closing():
                    transport.writelines(out)
                    if transport.get_write_buffer_size() > self.write_buffer_bytes_max:
                        self._check_write_buffer()
                if self.busy_poll is not None and self.pause_reading_on_backpressure:
                    # Server side, after answering: the peer's next request may follow at once.
                    # (A read that answered nothing, e.g. part of a large frame, is no reason to
                    # spin: the rest is on its way and the peer is not waiting for us.)
                    self.busy_poll.kick()
        if self.read_budget is not None and not failed and not self.closed:
            if dec.buffered_bytes or self.budget_reserved or self.budget_wanted:
                self._account_partial(t0, handled)
            else:
                # (the common case, every frame of the read complete: what _account_partial
                # would conclude, without the call)
                self.partial_since = None

    def _continue(self) -> None:
        """The next slice of requests already read (scheduled by _handle)."""
        self._continue_scheduled = False
        if self.closed or self._paused & _PAUSE_WRITE:
            return      # resume_writing continues
        self._handle(_monotonic())
        if self._paused & _PAUSE_SLICE and not self._continue_scheduled:
            self._unpause(_PAUSE_SLICE)     # the decoder holds no complete request any more

    # -- the reader's pauses ---------------------------------------------------------------
    def _pause(self, reason: int) -> None:
        if not self._paused and self.transport is not None:
            try:
                self.transport.pause_reading()
            except RuntimeError:
                pass
        self._paused |= reason

    def _unpause(self, reason: int) -> None:
        if not self._paused & reason:
            return
        self._paused &= ~reason
        if not self._paused and not self.closed and self.transport is not None:
            if self.partial_since is not None:
                self.partial_since = _monotonic()   # a frame's time runs only while we read
            try:
                self.transport.resume_reading()
            except RuntimeError:
                pass

    @property
    def read_paused(self) -> bool:
        """We stopped reading this peer (slice, write backpressure or budget)."""
        return self._paused != 0

    # -- the read budget (server side) -----------------------------------------------------
    def _account_partial(self, t0: float, handled: int) -> None:
        # Timing: a frame is timed from the end of the previous one (or from its first
        # byte after an idle spell).
        dec = self.decoder
        buffered = dec.buffered_bytes
        if not buffered:
            self.partial_since = None
        elif handled or self.partial_since is None:
            if self.partial_since is None:
                self.read_budget.track(self)
            self.partial_since = t0
        # Bytes: reserve the whole frame once a large one is under way.
        need = dec.pending_frame_bytes() if buffered > SMALL_FRAME_BYTES else 0
        if need == self.budget_reserved or self.budget_wanted:
            return
        budget = self.read_budget
        if self.budget_reserved:
            reserved, self.budget_reserved = self.budget_reserved, 0
            budget.release(reserved)
        if need:
            if budget.reserve(self, need):
                self.budget_reserved = need
            else:
                self.budget_wanted = need
                self._pause(_PAUSE_BUDGET)

    def budget_granted(self, nbytes: int) -> None:
        """Called by the ReadBudget: nbytes are reserved for the frame this connection waits with."""
        self.budget_wanted = 0
        self.budget_reserved = nbytes
        self.partial_since = _monotonic()      # its time starts now
        self._unpause(_PAUSE_BUDGET)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc):
        self.closed = True
        budget = self.read_budget
        if budget is not None:
            budget.forget(self)
            self.budget_wanted = 0
            if self.budget_reserved:
                reserved, self.budget_reserved = self.budget_reserved, 0
                budget.release(reserved)
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        self._sweep_at = _INF
        self._can_write.set()
        err = ConnectionClosed(f"connection to {self.remote_addr} closed")
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
        if self.on_close is not None:
            try:
                self.on_close(self)
            except Exception:
                log.exception("on_close callback failed")

    def pause_writing(self):
        self._can_write.clear()
        # Server side: a peer that does not read its replies must not make us buffer
        # without bound, so stop reading and handling its requests until it catches up.
        # (Not for client connections: two peers that both stop reading would deadlock.)
        if self.pause_reading_on_backpressure:
            self._pause(_PAUSE_WRITE)

    def resume_writing(self):
        self._can_write.set()
        if self.pause_reading_on_backpressure and not self.closed:
            self._unpause(_PAUSE_WRITE)
            if (self.decoder.buffered_bytes or self._paused & _PAUSE_SLICE) and not self._continue_scheduled:
                # requests read before (or while) pausing wait in the decoder
                self._continue_scheduled = True
                (self._loop or asyncio.get_running_loop()).call_soon(self._continue)

    # -- incoming requests ---------------------------------------------------------------
    def _dispatch(self, cmd: RemotingCommand) -> None:
        processors = self.processors
        if processors is None and self.handler is None:
            if not cmd.is_oneway:
                self.send(cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                       f" request type {cmd.code} not supported"))
            return
        if self.handlers_in_flight >= self.handlers_in_flight_max:
            if not cmd.is_oneway:
                self.send(cmd.response(ResponseCode.SYSTEM_BUSY,
                                       "[OVERLOAD]system busy, start flow control for a while"))
            return
        try:
            if processors is not None:
                # a server's processor table, looked up here: one call less per request
                proc = processors.get(cmd.code)
                if proc is None:
                    result = cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                          f" request type {cmd.code} not supported")
                else:
                    result = proc(self, cmd)
            else:
                result = self.handler(self, cmd)
        except Exception as e:
            result = self._error_response(cmd, e)
        if result is None:
            return
        if type(result) is RemotingCommand:
            if not (cmd.flag & FLAG_ONEWAY):
                out = self._out
                if out is not None and self._plain_send:
                    # inside a read (always, from _handle): queued for its one writelines,
                    # which checks the transport (send() without the call)
                    out.extend(encode_parts(result))
                else:
                    self.send(result)
            return
        self.handlers_in_flight += 1
        task = asyncio.ensure_future(result)
        task.add_done_callback(lambda t, cmd=cmd: self._handler_done(cmd, t))

    def _handler_done(self, cmd: RemotingCommand, task: asyncio.Future) -> None:
        self.handlers_in_flight -= 1
        if task.cancelled():
            return
        exc = task.exception()
        resp = self._error_response(cmd, exc) if exc is not None else task.result()
        if resp is not None and not (cmd.flag & FLAG_ONEWAY):
            self.send(resp)

    def _error_response(self, cmd: RemotingCommand, e: BaseException) -> RemotingCommand:
        # Input errors (a bad header field or body, text a peer sent that UTF-8 cannot hold)
        # are the peer's: one log line, the message as remark. Anything else is our bug: a
        # traceback. The remark is always encodable (the encoders are total).
        if isinstance(e, (HeaderError, BodyError, UnicodeError)):
            remark = str(e) if not isinstance(e, UnicodeError) else f"invalid text in request: {e.reason}"
            log.info("%s: code %d from %s refused: %s", self.name, cmd.code, self.remote_addr,
                     ascii(remark[:200]))
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark)
        log.error("%s: processor for code %d failed:\n%s", self.name, cmd.code,
                  "".join(traceback.format_exception(e)))
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")

    # -- outgoing ----------------------------------------------------------------------
    def send(self, cmd: RemotingCommand) -> None:
        if self.closed or self.transport is None or self.transport.is_closing():
            return
        out = self._out
        if out is not None:
            out.extend(encode_parts(cmd))
        else:
            self.transport.writelines(encode_parts(cmd))
            self._check_write_buffer()

    def _check_write_buffer(self) -> None:
        if self.transport.get_write_buffer_size() > self.write_buffer_bytes_max:
            log.warning("%s: %s does not read its replies (%d bytes queued), closing", self.name,
                        self.remote_addr, self.transport.get_write_buffer_size())
            self.transport.abort()

    async def drain(self) -> None:
        if not self._can_write.is_set():
            await self._can_write.wait()

    async def request(self, cmd: RemotingCommand, timeout_s: float) -> RemotingCommand:
        if self.closed:
            raise ConnectionClosed(f"connection to {self.remote_addr} closed")
        pending = self.pending
        if len(pending) >= self.requests_in_flight_max:
            raise TooManyRequests(f"{len(pending)} requests in flight to {self.remote_addr}")
        opaque = cmd.opaque = next_opaque()
        loop = self._loop or asyncio.get_running_loop()
        fut = loop.create_future()
        pending[opaque] = fut
        # Timeouts: a deadline per request, expired by one sweep timer per connection
        # (like Java's scanResponseTable) rather than a timer per request, which cost a
        # call_later and a cancel on every send. Not asyncio.wait_for either: on 3.11 it
        # can swallow a cancellation that races with the response, and a cancelled pull
        # loop would then start another long poll.
        deadline = loop.time() + timeout_s
        self._deadlines[opaque] = deadline
        if deadline < self._sweep_at:
            self._arm_sweep(loop, deadline)
        self.send(cmd)
        if self.busy_poll is not None and len(pending) == 1:
            # A lone request (a sync send): its reply is the next event, stay awake for it.
            # With more in flight the loop has work anyway, and spinning would only compete.
            self.busy_poll.kick()
        try:
            return await fut
        except _Expired:
            raise RequestTimeout(f"code {cmd.code} to {self.remote_addr}: no response in {timeout_s}s") from None
        finally:
            pending.pop(opaque, None)
            self._deadlines.pop(opaque, None)

    # The sweep runs at the earliest deadline, but at most every _SWEEP_S: a request may
    # time out up to that much late, which no RocketMQ timeout (seconds) notices.
    _SWEEP_S = 0.05

    def _arm_sweep(self, loop, when: float) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
        self._sweep_at = when
        self._sweep_handle = loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        self._sweep_handle = None
        self._sweep_at = _INF
        deadlines = self._deadlines
        if not deadlines:
            return
        loop = self._loop or asyncio.get_running_loop()
        now = loop.time()
        nearest = _INF
        for opaque, deadline in list(deadlines.items()):
            if deadline <= now:
                del deadlines[opaque]
                fut = self.pending.get(opaque)
                if fut is not None and not fut.done():
                    fut.set_exception(_Expired())
            elif deadline < nearest:
                nearest = deadline
        if nearest < _INF:
            self._arm_sweep(loop, max(nearest, now + self._SWEEP_S))

    def oneway(self, cmd: RemotingCommand) -> None:
        cmd.opaque = next_opaque()
        cmd.flag |= FLAG_ONEWAY
        self.send(cmd)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
