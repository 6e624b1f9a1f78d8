"""What a server's connections may hold of requests not yet complete (asyncio shell).

One `ReadBudget` per server, shared by its connections (issue 11, item 6: only
`maxFrameSize` bounded a connection, so 20 connections each sending an unfinished
15 MiB frame held 300 MiB).

* Bytes. A connection holding part of a frame larger than `SMALL_FRAME_BYTES` reserves
  the whole frame (its length prefix says how big) before reading more. When the
  reservations would pass `bytes_max`, that connection stops being read
  (`transport.pause_reading`) and waits in line; reservations freed by frames that
  complete or connections that close admit the waiters in order. A reserved frame can
  always complete, so the budget never deadlocks, and one frame is admitted even when it
  alone is larger than the budget. Smaller partial frames are not counted: each
  connection holds at most one, bounded by the connection count.
* Time. A frame must complete within `frame_timeout_ms` of the previous one (of the
  first byte after a pause), or its connection is closed with one log line (slowloris).
  A connection we stopped reading (waiting for budget, or not reading its replies) is not
  timed: its clock restarts when we read it again.
  One sweep timer per server checks the connections holding partial frames.

The connection side (when to reserve, release, pause) is `remoting/connection.py`.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from time import monotonic

log = logging.getLogger("pocketmq.remoting")

# The daemons' defaults (maxBufferedRequestBytes, frameReadTimeoutMillis).
READ_BUFFER_BYTES_MAX_DEFAULT = 128 << 20
FRAME_READ_TIMEOUT_MS_DEFAULT = 30_000

# Partial frames up to this size are not reserved (most requests; the hot path skips the
# budget for them).
SMALL_FRAME_BYTES = 64 * 1024


class ReadBudget:
    def __init__(self, bytes_max: int, frame_timeout_ms: int, name: str = "server"):
        if bytes_max < 1 or frame_timeout_ms < 1:
            raise ValueError(f"read budget needs bytes_max >= 1 and frame_timeout_ms >= 1, "
                             f"got {bytes_max}, {frame_timeout_ms}")
        self.bytes_max = bytes_max
        self.frame_timeout_s = frame_timeout_ms / 1000
        self.name = name
        self.reserved = 0
        self.waiters: deque = deque()     # connections paused until their frame fits
        self.partial: set = set()         # connections that may hold part of a frame
        self._sweep_handle: asyncio.TimerHandle | None = None
        self.timeouts = 0                 # connections closed for a frame that did not complete

    # -- bytes -------------------------------------------------------------------------
    def reserve(self, conn, nbytes: int) -> bool:
        """Reserve nbytes for conn's frame, or queue conn (False: pause its reading; it is
        admitted later through conn.budget_granted)."""
        if not self.waiters and (self.reserved == 0 or self.reserved + nbytes <= self.bytes_max):
            self.reserved += nbytes
            return True
        self.waiters.append(conn)
        return False

    def release(self, nbytes: int) -> None:
        self.reserved -= nbytes
        self._admit()

    def _admit(self) -> None:
        waiters = self.waiters
        while waiters:
            conn = waiters[0]
            need = conn.budget_wanted
            if conn.closed or not need:
                waiters.popleft()
                continue
            if self.reserved and self.reserved + need > self.bytes_max:
                return
            waiters.popleft()
            self.reserved += need
            conn.budget_granted(need)

    def forget(self, conn) -> None:
        """conn closed: drop it from the line and the sweep (its reservation is released by
        the connection)."""
        self.partial.discard(conn)
        if conn in self.waiters:
            self.waiters.remove(conn)
            self._admit()

    # -- time --------------------------------------------------------------------------
    def track(self, conn) -> None:
        """conn holds part of a frame since conn.partial_since: time it."""
        self.partial.add(conn)
        if self._sweep_handle is None:
            loop = asyncio.get_running_loop()
            self._sweep_handle = loop.call_later(self._sweep_interval_s(), self._sweep)

    def _sweep_interval_s(self) -> float:
        return min(1.0, max(0.05, self.frame_timeout_s / 4))

    def _sweep(self) -> None:
        self._sweep_handle = None
        now = monotonic()
        limit = self.frame_timeout_s
        for conn in list(self.partial):
            since = conn.partial_since
            if conn.closed or since is None:
                self.partial.discard(conn)
            elif conn.read_paused:
                continue            # we stopped reading it (budget, backpressure): not its fault
            elif now - since > limit:
                self.partial.discard(conn)
                self.timeouts += 1
                log.warning("%s: closing %s: a request frame started %.1f s ago is not complete "
                            "(%d bytes of %s received; frameReadTimeoutMillis=%d)", self.name,
                            conn.remote_addr, now - since, conn.decoder.buffered_bytes,
                            conn.decoder.pending_frame_bytes() or "?", int(limit * 1000))
                conn.abort()
        if self.partial:
            self._sweep_handle = asyncio.get_running_loop().call_later(self._sweep_interval_s(), self._sweep)

    def close(self) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
