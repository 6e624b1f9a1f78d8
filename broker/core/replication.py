"""Master/slave replication's rules: pure functions and small state machines, no I/O, no clock.

The asyncio shell (broker/services/ha.py) owns the sockets and timers; the stream's bytes
are protocol/ha.py's; the store's two ends are broker/store/replica.py's. What is decided
here:

* `first_transfer_offset`: where a master starts sending to a slave that reported `request`.
  Java starts an empty slave (request 0) at its newest segment; we start it at the oldest,
  so a new slave holds everything the master still has.
* `SlaveStream`: the slave's view of one HA connection. A slave with data does not ask for
  its end S but for up to `VERIFY_BYTES` before it (never across a segment start), and
  compares what the master sends for [S', S) with its own log before appending anything:
  a log whose tail is not the master's (a diverged log: the master lost its disk and took
  other writes, or another master) is refused with both offsets named, never appended to.
  Until that check passes the slave keeps reporting S', so a SYNC_MASTER never counts
  unverified bytes as replicated.
* `is_slave_ok` and `suggest_broker_id`: Java 4.9's SYNC_MASTER gate (HAService.isSlaveOK) and
  PullMessageProcessor's suggestWhichBrokerId.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

__all__ = ["VERIFY_BYTES", "Diverged", "SlaveStream", "first_transfer_offset", "is_slave_ok",
           "suggest_broker_id", "SlaveView"]

# How much of its own tail a slave checks against the master's bytes on every connection.
# A diverged log differs in its last record (offsets, timestamps, body CRC are in it);
# 4 KiB covers the last record of all but large messages at the cost of one resend.
VERIFY_BYTES = 4096


class Diverged(Exception):
    """The slave's log is not a prefix of the master's: replication stops (the data stays)."""


def first_transfer_offset(request: int, min_offset: int, max_offset: int) -> int | None:
    """Where a master starts sending to a slave whose first report is `request`; None when
    the slave's log is longer than the master's (it cannot be a prefix: the connection is
    refused, after one heartbeat naming the master's end so the slave can say why)."""
    if request > max_offset:
        return None
    if request == 0 or request < min_offset:
        # an empty slave copies everything there is; one whose end was deleted here is
        # sent the oldest bytes, and refuses them (it is too far behind: SlaveStream)
        return min_offset
    return request


def is_slave_ok(connections: int, put_end: int, acked_max: int, gap_max: int) -> bool:
    """Java's HAService.isSlaveOK: a slave is connected and the best one is less than
    haMaxGapNotInSync (haSlaveFallbehindMax) behind the message just stored."""
    return connections > 0 and put_end - acked_max < gap_max


def suggest_broker_id(slow: bool, slave_read_enable: bool, which_when_slow: int, group_broker_id: int) -> int:
    """PullMessageProcessor's suggestWhichBrokerId: a consumer whose messages lie further
    behind the log's end than the memory limit (`slow`: accessMessageInMemoryMaxRatio
    percent of totalPhysicalMemoryBytes, it reads from disk) is sent to its group's
    whichBrokerWhenConsumeSlowly (1) when slaveReadEnable; otherwise to the group's
    brokerId (0). Without slaveReadEnable always to the master, so a consumer that fell
    back to a slave while the master was away returns to it."""
    if not slave_read_enable:
        return 0
    return which_when_slow if slow else group_broker_id


class SlaveView(NamedTuple):
    """What a master knows of one connected slave (for haStatus, metrics, SYNC_MASTER)."""
    remote: str
    request_offset: int        # its first report (-1: none yet)
    ack_offset: int            # its last report
    transferred: int           # where the next bytes sent to it start
    connected_ms: int          # monotonic ms of the connection
    last_report_ms: int        # monotonic ms of its last report


class SlaveStream:
    """The slave's side of one HA connection, as a state machine over received frames.

    `read_own(offset, n)` returns up to n bytes of the slave's own log at `offset` (never
    across a segment; b"" past the end). Frames go in through `on_frame`; what comes out
    is the (offset, bytes) to append to the store, after the verified part."""

    __slots__ = ("stored_end", "verify_from", "position", "_read_own", "verified")

    def __init__(self, stored_end: int, segment_size: int, read_own: Callable[[int, int], bytes],
                 verify_bytes: int = VERIFY_BYTES) -> None:
        self.stored_end = stored_end
        if stored_end > 0:
            seg_start = (stored_end - 1) - (stored_end - 1) % segment_size
            self.verify_from = max(seg_start, stored_end - verify_bytes)
        else:
            self.verify_from = 0
        self.position = -1          # where the next frame must start (-1: before the first)
        self._read_own = read_own
        self.verified = stored_end == 0

    def first_report(self) -> int:
        return self.verify_from

    def report(self, appended_end: int) -> int:
        """The offset to report now: the store's end once the tail is verified."""
        return appended_end if self.verified else self.verify_from

    def on_frame(self, offset: int, body: bytes) -> tuple[int, bytes] | None:
        """(offset, bytes to append) or None; raises Diverged."""
        end = self.stored_end
        if self.position < 0:
            if not body:
                if offset < self.verify_from or (offset < end and offset != self.verify_from):
                    raise Diverged(f"the master's log ends at offset {offset}, this slave's at {end}: "
                                   f"the slave's log is not a prefix of the master's")
                return None
            if end and offset > end:
                raise Diverged(f"the master's log starts at offset {offset}, after this slave's end at {end}: "
                               f"the records between were deleted on the master (the slave is too far behind)")
            if offset < self.verify_from:
                raise Diverged(f"the master sent offset {offset}, this slave asked for {self.verify_from}")
            self.position = offset
        elif offset != self.position:
            raise Diverged(f"the master sent offset {offset}, the stream was at {self.position}")
        if not body:
            return None
        pos = self.position
        self.position = pos + len(body)
        if pos < end:
            n = min(end - pos, len(body))
            own = self._read_own(pos, n)
            if own != body[:n]:
                at = pos + next((i for i in range(min(len(own), n)) if own[i] != body[i]), min(len(own), n))
                raise Diverged(f"this slave's log differs from the master's at offset {at} (the slave's log "
                               f"ends at {end}, the master sent [{pos}, {pos + len(body)})): the slave's log is "
                               f"not a prefix of the master's")
            if pos + n >= end:
                self.verified = True
            if n == len(body):
                return None
            return end, body[n:]
        self.verified = True
        return pos, body
