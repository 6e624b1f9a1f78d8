"""The HA stream's asyncio shells: a master's server for its slaves, a slave's client.

Wire format: protocol/ha.py. Rules (where to start, the slave's tail check, the
SYNC_MASTER gate): broker/core/replication.py. The store's two ends: broker/store/replica.py.

Master (`HAMaster`, on haListenPort): per slave connection one task reads its reports
(the first is where to start, later ones are acks) and one sends CommitLog bytes from
there, at most haTransferBatchSize a frame and never across a segment, as fast as the
slave's socket takes them; while nothing is new it waits for `notify()` (called on every
dispatch and every SYNC_MASTER wait) and sends a heartbeat each haSendHeartbeatInterval.
A slave silent for haHousekeepingInterval is dropped. The best ack of all slaves
(Java's push2SlaveMaxOffset) releases SYNC_MASTER's waiters.

Slave (`HASlave`): connects to its master's HA address (haMasterAddress, or what the
nameserver's REGISTER_BROKER answer names), asks from its own tail (SlaveStream checks the
overlap), appends what arrives (the store dispatches it: consume queues, index, held
pulls woken at once) and reports its write position after every read that appended and at
least every haSendHeartbeatInterval. A log that diverged from the master's stops the
stream with one ERROR naming both offsets; the data stays, and the check is repeated
every DIVERGED_RETRY_S (an operator may replace the master's or the slave's store).

Every buffer is bounded: the master writes one frame and waits for the socket to drain
before reading the next; the slave reads at most READ_BYTES at a time, and the store's
pending buffer holds at most one record.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from pocketmq.broker.core.failover import consistent_point
from pocketmq.broker.core.replication import (
    Diverged,
    SlaveStream,
    SlaveView,
    first_transfer_offset,
    is_slave_ok,
)
from pocketmq.broker.services.waiters import OffsetWaiters
from pocketmq.broker.store.replica import ReplicaBusy, ReplicaError
from pocketmq.protocol.ha import (
    HELLO_SIZE,
    ConfirmFrameDecoder,
    EpochReplyDecoder,
    FrameDecoder,
    HAProtocolError,
    ReportDecoder,
    decode_hello,
    encode_confirm_frame_head,
    encode_epoch_reply,
    encode_frame_head,
    encode_hello,
    encode_report,
)
from pocketmq.remoting.clock import monotonic_ms
from pocketmq.remoting.metrics import LatencyHistogram
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.broker.ha")

READ_BYTES = 256 * 1024
# a read this full means more was queued behind it: the slave is behind its master
BEHIND_READ_BYTES = READ_BYTES // 2
CONNECT_TIMEOUT_S = 3.0


class TruncationNeeded(Exception):
    """Controller mode: this slave's log runs past where it agrees with its master's."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"truncate at {offset}")
        self.offset = offset


class SecondRate:
    """Bytes in the last whole second (Java's transferredByteInSecond), counted as they pass
    in one-second buckets of the monotonic clock: no timer, one clock read per add."""

    __slots__ = ("mono_ms", "_sec", "_cur", "_last")

    def __init__(self, mono_ms: Callable[[], int] = monotonic_ms) -> None:
        self.mono_ms = mono_ms
        self._sec = -2
        self._cur = 0
        self._last = 0

    def add(self, n: int) -> None:
        sec = self.mono_ms() // 1000
        if sec != self._sec:
            self._last = self._cur if sec == self._sec + 1 else 0
            self._sec = sec
            self._cur = 0
        self._cur += n

    def per_second(self) -> int:
        sec = self.mono_ms() // 1000
        if sec == self._sec:
            return self._last
        return self._cur if sec == self._sec + 1 else 0


def _put(writer: asyncio.StreamWriter, *parts) -> None:
    """Write to a slave's connection; one closed under us (a reset seen by the reader task
    first) is a ConnectionError, as asyncio's own transports say it (uvloop's raise
    RuntimeError on a closed handle)."""
    if writer.transport.is_closing():
        raise ConnectionResetError("the slave's connection is closed")
    writer.writelines(parts)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad HA address {addr!r}; expected host:port")
    return host, int(port)


class _SlaveConn:
    __slots__ = ("remote", "request_offset", "ack_offset", "transferred", "connected_ms", "last_report_ms",
                 "first_report", "wake", "writer", "tasks", "rate", "replica_id", "sent_confirm")

    def __init__(self, remote: str, writer, now_ms: int) -> None:
        self.remote = remote
        self.writer = writer
        self.request_offset = -1
        self.ack_offset = -1
        self.transferred = -1
        self.connected_ms = now_ms
        self.last_report_ms = now_ms
        self.first_report = asyncio.Event()
        self.wake = asyncio.Event()
        self.tasks: tuple[asyncio.Task, ...] = ()
        self.rate: SecondRate | None = None     # bytes sent to it in the last second (haStatus)
        self.replica_id: int | None = None      # controller mode: from its hello
        self.sent_confirm = -1                  # controller mode: the confirm offset it was last sent

    def view(self) -> SlaveView:
        return SlaveView(self.remote, self.request_offset, self.ack_offset, self.transferred,
                         self.connected_ms, self.last_report_ms)


class HAMaster:
    """The master's end: serves slaves, tracks their acks, answers SYNC_MASTER's waits."""

    def __init__(self, store, *, host: str, port: int, batch_bytes: int = 32 * 1024,
                 heartbeat_ms: int = 5000, housekeeping_ms: int = 20_000, gap_max: int = 256 << 20,
                 waiters_max: int = 100_000, mono_ms: Callable[[], int] = monotonic_ms, link=None) -> None:
        self.store = store
        # controller mode (services/failover.py ControllerLink): the epoch handshake, acks
        # counted per SyncStateSet member, the confirm offset; None: 4.x master/slave
        self.link = link
        self.host = host
        self.port = port
        self.batch_bytes = max(1, batch_bytes)
        self.heartbeat_s = max(0.05, heartbeat_ms / 1000)
        self.housekeeping_s = max(0.1, housekeeping_ms / 1000)
        self.gap_max = gap_max
        self.mono_ms = mono_ms
        self.acked_max = 0          # Java's push2SlaveMaxOffset: the best ack of any slave
        self._conns: set[_SlaveConn] = set()
        self._waiters = OffsetWaiters(waiters_max)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        # SYNC_MASTER's time waiting for a slave's ack (metrics), timeouts included
        self.wait_latency = LatencyHistogram()
        # bytes sent to all slaves (metrics, haStatus's transfer rate)
        self.bytes_sent = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=READ_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    # -- what the broker asks ------------------------------------------------------------
    @property
    def connections(self) -> int:
        return len(self._conns)

    def views(self) -> list[SlaveView]:
        return sorted((c.view() for c in self._conns), key=lambda v: v.remote)

    def transfer_rates(self) -> dict[str, int]:
        """Bytes sent in the last second, per slave connection (by its remote address)."""
        return {c.remote: c.rate.per_second() if c.rate is not None else 0 for c in self._conns}

    def notify(self) -> None:
        """New bytes in the log: wake the senders that wait for them."""
        for c in self._conns:
            c.wake.set()

    def slave_ok(self, put_end: int) -> bool:
        if self.link is not None:
            return True         # the SyncStateSet decides (minInSyncReplicas is checked before the put)
        return is_slave_ok(len(self._conns), put_end, self.acked_max, self.gap_max)

    def _acks_needed(self) -> int:
        """Controller mode: how many SyncStateSet members must ack a send (all of them with
        allAckInSyncStateSet, else one, as 4.x SYNC_MASTER, but only members count)."""
        awaited = len(self.link.tracker.awaited)
        return awaited if self.link.all_ack else min(1, awaited)

    def sync_changed(self) -> None:
        """Controller mode: acks, members or the set changed: move the confirm offset (what
        consumers may read) and release the sends that enough members acked."""
        link = self.link
        tracker = link.tracker
        end = self.store.commit_log_max_offset
        old = self.store.confirm_offset
        if tracker.committed - {link.replica_id}:
            new = tracker.confirm_offset(end)
            # never lower: consumers may have read up to it (a member that rejoins the set
            # is committed only once it holds everything acknowledged, so this is a guard)
            self.store.set_confirm_offset(new if old is None or new > old else old)
        else:
            self.store.set_confirm_offset(None)
        k = self._acks_needed()
        point = tracker.acked_by(k, end) if k else end
        if point > 0:
            self._waiters.release(point)
        if self.store.confirm_offset != old:
            self.notify()       # the senders tell the slaves the new confirm offset

    def end_waits(self) -> None:
        """Controller mode: the lease lapsed: every waiting send is answered now (the fence
        refuses it) instead of at its timeout."""
        self._waiters.fail()

    def waiter(self, end_offset: int, timeout_s: float) -> asyncio.Future:
        """True once enough slaves acked `end_offset` (one; controller mode: see
        _acks_needed), False after `timeout_s`."""
        if self.link is not None and not self._acks_needed():
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(True)
            self.wait_latency.observe(0.0)
            return fut
        fut = self._waiters.waiter(end_offset, timeout_s)
        if fut.done():
            self.wait_latency.observe(0.0)
        else:
            self.notify()
            t0 = time.perf_counter()
            fut.add_done_callback(lambda _f: self.wait_latency.observe(time.perf_counter() - t0))
        return fut

    # -- connections ------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        remote = f"{peer[0]}:{peer[1]}" if peer else "?"
        conn = _SlaveConn(remote, writer, self.mono_ms())
        conn.rate = SecondRate(self.mono_ms)
        if self.link is not None and not await self._handshake(conn, reader, writer):
            writer.close()
            return
        self._conns.add(conn)
        log.info("slave %s connected to the HA service", remote)
        task = asyncio.current_task()
        self._tasks.add(task)
        read_task = asyncio.create_task(self._read_reports(conn, reader), name=f"ha-read-{remote}")
        send_task = asyncio.create_task(self._send(conn), name=f"ha-send-{remote}")
        # close() cancels these two, never this task: asyncio's stream server logs a
        # cancelled connection handler as an error
        conn.tasks = (read_task, send_task)
        try:
            done, pending = await asyncio.wait({read_task, send_task}, return_when=asyncio.FIRST_COMPLETED)
            for t in pending:
                t.cancel()
            for t in done | pending:
                try:
                    await t
                except asyncio.CancelledError:
                    pass
                except (ConnectionError, HAProtocolError, asyncio.IncompleteReadError, OSError) as e:
                    log.info("HA connection of slave %s: %s", remote, e)
                except Exception:
                    log.exception("HA connection of slave %s failed", remote)
        finally:
            read_task.cancel()
            send_task.cancel()
            self._conns.discard(conn)
            if conn.replica_id is not None and not any(c.replica_id == conn.replica_id for c in self._conns):
                self.link.tracker.on_disconnect(conn.replica_id)
                self.sync_changed()
                self.link.on_sync_change()
            self._tasks.discard(task)
            writer.close()
            log.info("slave %s disconnected from the HA service (acked %d)", remote, conn.ack_offset)

    async def _handshake(self, conn: _SlaveConn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Controller mode: the slave's hello, then this master's epoch, end and entries."""
        link = self.link
        try:
            async with asyncio.timeout(self.housekeeping_s):
                rid, epoch = decode_hello(await reader.readexactly(HELLO_SIZE))
            if epoch > link.epoch:
                log.warning("replica %d (%s) knows epoch %d, this master runs epoch %d: a newer master exists; "
                            "refusing it", rid, conn.remote, epoch, link.epoch)
                link.on_stale(epoch)
                return False
            writer.write(encode_epoch_reply(link.epoch, self.store.commit_log_max_offset, link.entries))
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, HAProtocolError, TimeoutError) as e:
            log.info("HA handshake with %s failed: %s", conn.remote, e)
            return False
        conn.replica_id = rid
        link.tracker.on_connect(rid, self.mono_ms())
        log.info("replica %d connected from %s (epoch %d)", rid, conn.remote, epoch)
        return True

    async def _read_reports(self, conn: _SlaveConn, reader: asyncio.StreamReader) -> None:
        decoder = ReportDecoder()
        while True:
            try:
                async with asyncio.timeout(self.housekeeping_s):
                    data = await reader.read(READ_BYTES)
            except TimeoutError:
                log.warning("slave %s sent nothing for %.0f s: closing", conn.remote, self.housekeeping_s)
                return
            if not data:
                return
            reports = decoder.feed(data)
            if not reports:
                continue
            conn.last_report_ms = self.mono_ms()
            offset = reports[-1]       # only the last one matters (Java reads it so too)
            if conn.request_offset < 0:
                conn.request_offset = reports[0]
                conn.first_report.set()
                if self.link is not None and reports[0] == 0:
                    # an empty slave has nothing to verify: it holds all of an empty log (so it
                    # can join the SyncStateSet of a master that has written nothing yet)
                    self.link.tracker.on_ack(conn.replica_id, 0, self.store.commit_log_max_offset, self.mono_ms())
                    self.sync_changed()
                if len(reports) == 1:
                    continue            # where to start: the sender answers it (past our end too)
            if offset <= conn.request_offset:
                # Not an ack: the start again. Our slave repeats it until its tail matched our
                # bytes (SlaveStream), a Java slave until it has something new; counting it
                # would let SYNC_MASTER acknowledge sends on the word of an unchecked log.
                continue
            if offset > self.store.commit_log_max_offset:
                log.error("slave %s acked offset %d past this master's end %d: its log is not this master's; "
                          "closing", conn.remote, offset, self.store.commit_log_max_offset)
                return
            if offset > conn.ack_offset:
                conn.ack_offset = offset
                if offset > self.acked_max:
                    self.acked_max = offset
                    if self.link is None:
                        self._waiters.release(offset)
                if self.link is not None:
                    self.link.tracker.on_ack(conn.replica_id, offset, self.store.commit_log_max_offset,
                                             self.mono_ms())
                    self.sync_changed()

    async def _send(self, conn: _SlaveConn) -> None:
        writer = conn.writer
        try:
            async with asyncio.timeout(self.housekeeping_s):
                await conn.first_report.wait()
        except TimeoutError:
            log.warning("slave %s never reported its offset: closing", conn.remote)
            return
        store = self.store
        nxt = first_transfer_offset(conn.request_offset, store.commit_log_min_offset, store.commit_log_max_offset)
        if nxt is None:
            end = store.commit_log_max_offset
            log.error("slave %s asks for offset %d, past this master's end %d: its log is not a prefix of this "
                      "master's; refusing it", conn.remote, conn.request_offset, end)
            # one heartbeat naming our end, so the slave can say why it was refused
            _put(writer, self._head(conn, end, 0))
            await writer.drain()
            return
        conn.transferred = nxt
        batch = self.batch_bytes
        heartbeat_s = self.heartbeat_s
        wake = conn.wake
        last_write = time.monotonic()
        while True:
            data = store.replica_read(nxt, batch)
            if data is None:
                log.error("offset %d that slave %s needs is no longer in this master's log (oldest %d): closing",
                          nxt, conn.remote, store.commit_log_min_offset)
                return
            if data:
                _put(writer, self._head(conn, nxt, len(data)), data)
                self.bytes_sent += len(data)
                conn.rate.add(len(data))
                await writer.drain()
                nxt += len(data)
                conn.transferred = nxt
                last_write = time.monotonic()
                continue
            wake.clear()
            if store.commit_log_max_offset > nxt:
                continue
            if self.link is not None and self._confirm() != conn.sent_confirm:
                _put(writer, self._head(conn, nxt, 0))      # the new confirm offset, at once
                await writer.drain()
                last_write = time.monotonic()
                continue
            left = heartbeat_s - (time.monotonic() - last_write)
            if left > 0:
                try:
                    async with asyncio.timeout(left):
                        await wake.wait()
                    continue
                except TimeoutError:
                    pass
            _put(writer, self._head(conn, nxt, 0))
            await writer.drain()
            last_write = time.monotonic()

    def _confirm(self) -> int:
        c = self.store.confirm_offset
        return self.store.commit_log_max_offset if c is None else c

    def _head(self, conn: _SlaveConn, offset: int, size: int) -> bytes:
        if self.link is None:
            return encode_frame_head(offset, size)
        conn.sent_confirm = c = self._confirm()
        return encode_confirm_frame_head(offset, size, c)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None    # the connections' tasks are ended below: nothing to wait for
        for c in list(self._conns):
            c.writer.close()
            for t in c.tasks:
                t.cancel()
        for t in list(self._tasks):
            try:
                await t
            except (asyncio.CancelledError, Exception):
                log.debug("HA connection task ended with an error at close", exc_info=True)
        self._waiters.fail()
        self._waiters.close()


class HASlave:
    """The slave's end: keeps one HA connection to the master and appends what it sends."""

    DIVERGED_RETRY_S = 30.0
    RETRY_S = 1.0
    RETRY_MAX_S = 5.0

    def __init__(self, store, *, master_ha_addr: str | None = None, report_ms: int = 5000,
                 housekeeping_ms: int = 20_000, segment_size: int, mono_ms: Callable[[], int] = monotonic_ms,
                 busy_poll=None, link=None) -> None:
        self.store = store
        # controller mode (services/failover.py ControllerLink): the epoch handshake, the
        # truncation it may call for, the master's confirm offset; None: 4.x
        self.link = link
        # the broker's BusyPoll (remoting/busy_poll.py) or None: a frame read is activity, so
        # the loop polls a moment for the next one instead of sleeping (a SYNC_MASTER's
        # sends wait for each round trip through here; the poller's own rules stop spinning
        # when it does not pay or when the CPU is shared)
        self.busy_poll = busy_poll
        # True while the reads come back full (the master has more than one read's worth
        # queued for us): the index pump waits (services/index_pump.py `hold`)
        self.behind = False
        self.on_caught_up: Callable[[], None] | None = None     # the index pump's kick
        self.master_ha_addr = master_ha_addr
        self.report_s = max(0.05, report_ms / 1000)
        self.housekeeping_s = max(0.1, housekeeping_ms / 1000)
        self.segment_size = segment_size
        self.mono_ms = mono_ms
        self.state = "no master address yet"
        self.error: str | None = None          # the divergence or stream error that stopped it
        self.connected = False
        self.reported = -1                     # the last offset reported to the master
        self.master_offset = -1                # the master's stream position (frames and heartbeats)
        self.last_frame_ms = 0                 # monotonic ms of the last frame (data or heartbeat)
        self.bytes_received = 0                # commit-log bytes received (metrics, haStatus)
        self.receive_rate = SecondRate(mono_ms)
        self.last_report_ms = 0                # monotonic ms of the last report written (haStatus)
        self.local_addr: str | None = None     # this end of the HA connection, as the master sees it
        self._addr_changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._last_logged: str | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ha-slave")

    def set_master(self, ha_addr: str | None) -> None:
        """The master's HA address changed (a REGISTER_BROKER answer): reconnect there."""
        if ha_addr and ha_addr != self.master_ha_addr:
            log.info("master HA address is now %s (was %s)", ha_addr, self.master_ha_addr)
            self.master_ha_addr = ha_addr
            self._addr_changed.set()
            if self._writer is not None:
                self._writer.close()

    def lag_bytes(self) -> int:
        """How far this slave's log is behind the master's stream position (-1: unknown)."""
        if self.master_offset < 0:
            return -1
        return max(0, self.master_offset - self.store.commit_log_max_offset)

    async def _run(self) -> None:
        delay = self.RETRY_S
        while True:
            addr = self.master_ha_addr
            if not addr:
                self.state = "no master address yet"
                self._addr_changed.clear()
                await self._addr_changed.wait()
                continue
            self._addr_changed.clear()
            try:
                await self._session(addr)
                delay = self.RETRY_S
            except TruncationNeeded as e:
                # the agent restarts this broker with its log cut there (failover.py)
                self._stopped(f"must truncate at {e.offset} before replicating", logging.WARNING)
                self.link.need_truncate(e.offset)
                return
            except Diverged as e:
                self._stopped(f"diverged: {e}", logging.ERROR)
                delay = self.DIVERGED_RETRY_S
            except ReplicaBusy as e:
                # a file of our own could not be created for now: not the master's bytes
                self._stopped(f"cannot store the master's bytes for now: {e}", logging.WARNING)
                delay = self.RETRY_MAX_S
            except ReplicaError as e:
                self._stopped(f"refused the master's bytes: {e}", logging.ERROR)
                delay = self.DIVERGED_RETRY_S
            except (OSError, asyncio.IncompleteReadError, HAProtocolError, TimeoutError) as e:
                self._stopped(f"connection to master {addr}: {type(e).__name__}: {e}", logging.WARNING)
                delay = min(self.RETRY_MAX_S, delay * 2)
            except Exception as e:
                # never a silent end of replication: say why, and try again
                log.exception("HA replication from %s failed", addr)
                self._stopped(f"failed: {type(e).__name__}: {e}", logging.ERROR)
                delay = self.DIVERGED_RETRY_S
            finally:
                self.connected = False
                if self.behind:
                    # not behind a master we are not connected to: the index pump may work
                    self.behind = False
                    if self.on_caught_up is not None:
                        self.on_caught_up()
                if self._writer is not None:
                    self._writer.close()
                    self._writer = None
            try:
                async with asyncio.timeout(delay):
                    await self._addr_changed.wait()
            except TimeoutError:
                pass

    def _stopped(self, why: str, level: int) -> None:
        self.state = why
        self.error = why if level >= logging.ERROR else None
        # once per distinct reason: a dead master is retried every few seconds
        if why != self._last_logged:
            log.log(level, "HA replication stopped: %s", why)
            self._last_logged = why

    async def _session(self, addr: str) -> None:
        host, port = split_addr(addr)
        self.state = f"connecting to {addr}"
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port, limit=READ_BYTES)
        self._writer = writer
        sock = writer.get_extra_info("sockname")
        self.local_addr = f"{sock[0]}:{sock[1]}" if sock else None
        self.last_frame_ms = self.mono_ms()
        store = self.store
        rest = b""
        if self.link is not None:
            rest = await self._handshake(reader, writer, addr)
        stream = SlaveStream(store.replica_reset(), self.segment_size,
                             lambda o, n: store.replica_read(o, n) or b"")
        decoder = FrameDecoder() if self.link is None else ConfirmFrameDecoder()
        first = stream.first_report()
        writer.write(encode_report(first))
        await writer.drain()
        self.reported = first
        self.last_report_ms = self.mono_ms()
        last_report = time.monotonic()
        self.connected = True
        self.state = f"replicating from {addr}"
        if self._last_logged is not None:
            log.info("HA replication from %s resumed at offset %d", addr, first)
        self._last_logged = None
        self.error = None
        while True:
            try:
                if rest:
                    data, rest = rest, b""      # frames that came with the handshake's reply
                else:
                    async with asyncio.timeout(min(self.report_s, self.housekeeping_s)):
                        data = await reader.read(READ_BYTES)
            except TimeoutError:
                data = None
                if self.mono_ms() - self.last_frame_ms > self.housekeeping_s * 1000:
                    raise TimeoutError(f"the master sent nothing for {self.housekeeping_s:.0f} s") from None
            if data is not None:
                if not data:
                    raise ConnectionError("the master closed the connection")
                self.last_frame_ms = self.mono_ms()
                was_behind = self.behind
                self.behind = len(data) >= BEHIND_READ_BYTES
                frames = decoder.feed(data)
                if self.link is not None:
                    frames = self._confirmed(frames)
                for offset, body in frames:
                    self.master_offset = offset + len(body)
                    self.bytes_received += len(body)
                    self.receive_rate.add(len(body))
                    out = stream.on_frame(offset, body)
                    if out is not None:
                        store.replica_append(*out)
                    elif store.replica_pending_bytes and not body:
                        store.replica_append(store.replica_received_end, b"")   # retry a transient failure
            report = stream.report(store.commit_log_max_offset)
            now = time.monotonic()
            if report != self.reported or now - last_report >= self.report_s:
                writer.write(encode_report(report))
                await writer.drain()
                self.reported = report
                self.last_report_ms = self.mono_ms()
                last_report = now
            if data is not None and was_behind and not self.behind and self.on_caught_up is not None:
                self.on_caught_up()
            if data and self.busy_poll is not None:
                self.busy_poll.kick()
            if data:
                # A read of buffered bytes does not suspend: without this turn of the loop the
                # callbacks the appends scheduled (held pulls woken, the index pump's step,
                # taking the IndexHints while they are fresh) would wait for the stream to
                # run dry.
                await asyncio.sleep(0)

    def _confirmed(self, frames):
        """Controller mode's frames: take the master's confirm offset (what this slave may
        serve), pass (offset, body) on."""
        out = []
        confirm = -1
        for offset, body, c in frames:
            out.append((offset, body))
            confirm = c
        if confirm >= 0 and confirm != self.store.confirm_offset:
            self.store.set_confirm_offset(confirm)
        return out

    async def _handshake(self, reader, writer, addr: str) -> bytes:
        """Controller mode: hello, the master's epochs; cut our log where it stops agreeing
        (TruncationNeeded: the agent does it with the store closed). Returns bytes read past
        the reply (the first frames)."""
        link = self.link
        writer.write(encode_hello(link.replica_id, link.epoch))
        await writer.drain()
        dec = EpochReplyDecoder()
        async with asyncio.timeout(self.housekeeping_s):
            while True:
                data = await reader.read(READ_BYTES)
                if not data:
                    raise ConnectionError("the master closed the connection during the handshake")
                got = dec.feed(data)
                if got is not None:
                    break
        epoch, master_end, entries, rest = got
        if epoch < link.epoch:
            raise ConnectionError(f"the master at {addr} runs epoch {epoch}, older than epoch {link.epoch} this "
                                  f"replica knows: a stale master")
        store = self.store
        end = store.commit_log_max_offset
        point = consistent_point(link.local_entries(), end, entries, master_end)
        if point < 0:
            raise Diverged(f"this replica's log (end {end}, epochs {link.local_entries()}) shares no epoch with "
                           f"the master's (end {master_end}, epochs {entries}): it is not this group's log")
        if point < end:
            raise TruncationNeeded(point)
        link.adopt_entries(entries)
        return rest

    async def close(self) -> None:
        if self._task is not None:
            try:
                await cancel_and_wait(self._task)
            except Exception:
                log.debug("HA slave task ended with an error at close", exc_info=True)
            self._task = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
