"""Storage-fault simulation (issue 11, "Build as lasting tests"; TigerBeetle's VOPR is the model).

The file store runs in-process on a file-operations layer (`SimFiles`, a
broker.store.fileops.FileOps) that
  * injects failures at seeded points: EMFILE/ENOSPC when a file or directory is opened or
    created (segments, consume-queue files, the checkpoint's temp file, directories to
    fsync), ENOSPC on temp-file writes, EIO on temp-file fsyncs, ENOMEM on mmap — all
    transient — and EIO on an fdatasync of a store file (sticky);
  * models the page cache: it records what each fdatasync/fsync made durable and which
    directory entries (creations, renames, unlinks) a directory fsync made durable. A
    simulated crash keeps the durable state plus a seeded part of the rest: a prefix of
    each directory's unsynced entry changes (journaled file systems apply them in order),
    and per 4 KiB dirty page the old bytes, the new bytes, or a torn mix (a 512-byte
    sector prefix of the new).

A seeded workload of single puts, batch puts, flushes, consume-queue flushes, fault windows
(descriptor exhaustion, a full disk), a rare sticky fsync error, crashes and clean restarts
runs against it, with small segments and consume-queue files so that both roll often.

Invariants:
  * SYNC_FLUSH semantics: a put is acknowledged once flush() returned an offset covering it.
    After every restart each acknowledged message is present exactly once, at its queue
    offset, with its body; queues are contiguous; nothing appears that was never put.
  * Recovery never cuts below the acknowledged end; unacknowledged messages lost in a
    crash are counted, and any non-zero tail recovery threw away is reported
    (RecoveryReport.truncated_from/lost_bytes).
  * Transient failures: the store never becomes failed from them; puts during a window may
    answer CREATE_MAPEDFILE_FAILED, and once the window closes the next put succeeds
    without a restart; flush() never raises for them.
  * Sticky failures: after an fdatasync EIO the store refuses puts (SERVICE_NOT_AVAILABLE),
    flush() raises StoreError and never calls fdatasync again, until a restart.

Seeded: POCKETMQ_FUZZ_SEED (default random, printed), POCKETMQ_SIM_ITERATIONS (runs of
STEPS operations, default 8: about 30 s on a loaded 2-core host). A failure prints the seed and the run, step
and recent operations; `POCKETMQ_FUZZ_SEED=<seed> pytest tests/fault/test_storage_sim.py`
replays it. Release checks: POCKETMQ_SIM_ITERATIONS=500 (docs/reliability.md).
"""
from __future__ import annotations

import collections
import errno
import os
import random

import pytest

from pocketmq.broker.store.api import GetMessageStatus as GS, MessageBatchToStore, MessageToStore
from pocketmq.broker.store.api import PutMessageStatus as PS, StoreError
from pocketmq.broker.store.fileops import FileOps
from pocketmq.broker.store.store import MessageStore
from pocketmq.broker.store.store_config import StoreConfig
from pocketmq.protocol.message import decode_records

pytestmark = pytest.mark.fault

SEED = int(os.environ.get("POCKETMQ_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
ITERATIONS = int(os.environ.get("POCKETMQ_SIM_ITERATIONS", "8"))
STEPS = 400
PAGE, SECTOR = 4096, 512
SEG = 16 * 1024
CQ_FILE = 20 * 32
HOST = (bytes([10, 0, 0, 7]), 40000)
QUEUES = [(t, q) for t in ("SimA", "SimB", "SimC") for q in (0, 1)]


class Fault(OSError):
    pass


class SimFiles(FileOps):
    """FileOps with seeded fault injection and a page-cache/directory-journal model."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(preallocate=False)
        self.rng = rng
        # fault probabilities, per call (set by the workload's windows)
        self.p_open = 0.0           # EMFILE/ENOSPC on creating or opening a file/directory
        self.open_errno = errno.EMFILE
        self.p_write = 0.0          # ENOSPC on a temp-file write
        self.p_tmp_fsync = 0.0      # EIO on a temp-file fsync (transient: the temp file is dropped)
        self.p_mmap = 0.0           # ENOMEM on mmap
        self.p_datasync = 0.0       # EIO on fdatasync of a store file (sticky)
        self.enabled = True
        self.injected = collections.Counter()
        self.datasyncs = 0
        self.sticky_injected = False
        # the model
        self._next_id = 0
        self.ids: dict[str, int] = {}            # live path -> file id
        self.paths: dict[int, str] = {}          # file id -> live path
        self.synced: dict[int, bytes] = {}       # file id -> content made durable
        self.fds: dict[int, int] = {}            # fd -> file id
        self.dir_fds: dict[int, str] = {}        # fd -> directory
        self.durable: dict[str, dict[str, int]] = {}      # dir -> name -> id (durable entries)
        self.pending: dict[str, list] = {}                 # dir -> entry changes since its last fsync

    # ---------------------------------------------------------------- faults

    def _maybe(self, p: float, err: int, what: str) -> None:
        if self.enabled and p and self.rng.random() < p:
            self.injected[f"{what} {errno.errorcode[err]}"] += 1
            raise Fault(err, f"injected {errno.errorcode[err]} ({what})")

    # ---------------------------------------------------------------- namespace model

    def _new_id(self, path: str) -> int:
        self._next_id += 1
        fid = self._next_id
        old = self.ids.get(path)
        if old is not None:
            self.paths.pop(old, None)
        self.ids[path] = fid
        self.paths[fid] = path
        d, name = os.path.split(path)
        self.pending.setdefault(d, []).append(("set", name, fid))
        return fid

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        directory = bool(flags & getattr(os, "O_DIRECTORY", 0))
        self._maybe(self.p_open, self.open_errno, "open directory" if directory else
                    "create" if flags & os.O_CREAT else "open")
        existed = os.path.exists(path)
        fd = os.open(path, flags, mode)
        if directory:
            self.dir_fds[fd] = path
            return fd
        fid = self.ids.get(path)
        if fid is None or not existed:
            fid = self._new_id(path)
        self.fds[fd] = fid
        return fd

    def write(self, fd: int, data) -> int:
        self._maybe(self.p_write, errno.ENOSPC, "write")
        return os.write(fd, data)

    def mmap(self, fd: int, size: int):
        self._maybe(self.p_mmap, errno.ENOMEM, "mmap")
        return super().mmap(fd, size)

    def close(self, fd: int) -> None:
        self.fds.pop(fd, None)
        self.dir_fds.pop(fd, None)
        os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)
        fid = self.ids.pop(src)
        old = self.ids.get(dst)
        if old is not None:
            self.paths.pop(old, None)
        self.ids[dst] = fid
        self.paths[fid] = dst
        d = os.path.dirname(src)
        self.pending.setdefault(d, []).append(("del", os.path.basename(src), 0))
        self.pending[d].append(("set", os.path.basename(dst), fid))

    def unlink(self, path: str) -> None:
        os.unlink(path)
        fid = self.ids.pop(path, None)
        if fid is not None:
            self.paths.pop(fid, None)
        d, name = os.path.split(path)
        self.pending.setdefault(d, []).append(("del", name, 0))

    def fsync(self, fd: int) -> None:
        if fd in self.dir_fds:
            os.fsync(fd)
            d = self.dir_fds[fd]
            view = self.durable.setdefault(d, {})
            for op in self.pending.pop(d, []):
                _apply(view, op)
            return
        self._maybe(self.p_tmp_fsync, errno.EIO, "fsync temp file")
        os.fsync(fd)
        self._sync(fd)

    def fdatasync(self, fd: int) -> None:
        self.datasyncs += 1
        if self.enabled and self.p_datasync and self.rng.random() < self.p_datasync:
            self.injected["fdatasync EIO"] += 1
            self.sticky_injected = True
            raise Fault(errno.EIO, "injected EIO (fdatasync)")
        os.fdatasync(fd)
        self._sync(fd)

    def _sync(self, fd: int) -> None:
        fid = self.fds.get(fd)
        if fid is not None:
            size = os.fstat(fd).st_size
            self.synced[fid] = os.pread(fd, size, 0)

    # ---------------------------------------------------------------- crash

    def crash(self, root: str) -> dict:
        """Replace the files under root with what a power cut would leave (the store must
        have been abandoned). Returns counts of what was lost."""
        rng = self.rng
        stats = collections.Counter()
        dirs = set(self.durable) | set(self.pending)
        for d in sorted(dirs):
            if not os.path.isdir(d):
                continue
            view = dict(self.durable.get(d, {}))
            ops = self.pending.get(d, [])
            k = rng.randint(0, len(ops))
            for op in ops[:k]:
                _apply(view, op)
            stats["entry changes lost"] += len(ops) - k
            live = {os.path.basename(path): fid for path, fid in self.ids.items() if os.path.dirname(path) == d}
            out = {name: self._survivor(fid, stats) for name, fid in view.items()}
            for name in live:
                if name not in out:
                    os.unlink(os.path.join(d, name))
                    stats["files vanished"] += 1
            for name, data in out.items():
                if data is not None:
                    with open(os.path.join(d, name), "wb") as f:
                        f.write(data)
        self.rebase(root)
        return stats

    def _survivor(self, fid: int, stats) -> bytes | None:
        path = self.paths.get(fid)
        live = None
        if path is not None and os.path.exists(path):
            with open(path, "rb") as f:
                live = f.read()
        base = self.synced.get(fid)
        if live is None:
            return base
        if base is None:
            base = bytes(len(live))
        if len(base) < len(live):
            base += bytes(len(live) - len(base))
        out = bytearray(base[:len(live)])
        for pos in range(0, len(live), PAGE):
            new = live[pos:pos + PAGE]
            if new == out[pos:pos + PAGE]:
                continue
            r = self.rng.random()
            if r < 0.4:
                stats["dirty pages lost"] += 1
            elif r < 0.8:
                out[pos:pos + len(new)] = new
            else:
                cut = self.rng.randrange(0, len(new), SECTOR)
                out[pos:pos + cut] = new[:cut]
                stats["dirty pages torn"] += 1
        return bytes(out)

    def rebase(self, root: str) -> None:
        """After a crash (or before the first open): what is on disk is durable."""
        self.ids.clear()
        self.paths.clear()
        self.synced.clear()
        self.fds.clear()
        self.dir_fds.clear()
        self.durable.clear()
        self.pending.clear()
        for d, _subdirs, names in os.walk(root):
            view = self.durable.setdefault(d, {})
            for name in names:
                path = os.path.join(d, name)
                self._next_id += 1
                fid = self._next_id
                self.ids[path] = fid
                self.paths[fid] = path
                with open(path, "rb") as f:
                    self.synced[fid] = f.read()
                view[name] = fid


def _apply(view: dict, op) -> None:
    kind, name, fid = op
    if kind == "set":
        view[name] = fid
    else:
        view.pop(name, None)


class Sim:
    def __init__(self, seed: int, root: str) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.root = root
        self.files = SimFiles(random.Random(seed ^ 0x5EED))
        self.cfg = StoreConfig(root, mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=CQ_FILE,
                               store_host=(bytes([10, 0, 0, 1]), 10911), total_physical_memory_bytes=1 << 34,
                               checkpoint_interval_bytes=3 * SEG)
        self.store: MessageStore | None = None
        self.seq = 0
        self.now = 1_000_000
        self.acked: dict[tuple[str, int, int], bytes] = {}     # (topic, qid, queue offset) -> body
        self.acked_end = 0
        self.pending: list[tuple[str, int, int, bytes, int]] = []   # put OK, not yet flushed
        self.all_bodies: set[bytes] = set()
        self.window = 0               # steps left in a fault window
        self.window_refusals = 0
        self.failed_at_datasyncs = -1
        self.trace: collections.deque = collections.deque(maxlen=12)
        self.stats = collections.Counter()
        self.step = 0

    # ---------------------------------------------------------------- lifecycle

    def open(self):
        """Open (recover) the store; returns the RecoveryReport."""
        self.files.enabled = False        # recovery itself runs without injected faults
        try:
            self.store = MessageStore(self.cfg, file_ops=self.files)
            report = self.store.open()
        finally:
            self.files.enabled = True
        self.failed_at_datasyncs = -1
        return report

    def restart(self, crash: bool) -> None:
        assert self.store is not None
        if crash:
            self.store.abandon()
            lost = self.files.crash(self.root)
            self.stats.update(lost)
            self.stats["crashes"] += 1
        else:
            self.store.close()
            self.stats["clean restarts"] += 1
        sticky = self.files.sticky_injected
        report = self.open()
        self.files.sticky_injected = False
        self.audit(report, crash, sticky)

    # ---------------------------------------------------------------- operations

    def body(self) -> bytes:
        self.seq += 1
        b = b"%d:%d:" % (self.seed & 0xFFFF, self.seq) + bytes([65 + self.seq % 26]) * self.rng.randrange(20, 700)
        self.all_bodies.add(b)
        return b

    def check_put(self, r, topic, qid, bodies) -> None:
        s = self.store
        if r.status is PS.PUT_OK:
            assert self.failed_at_datasyncs < 0, "a put succeeded on a failed store"
            for i, b in enumerate(bodies):
                self.pending.append((topic, qid, r.queue_offset + i, b, r.wrote_offset + r.wrote_bytes))
            self.stats["puts ok"] += len(bodies)
        elif r.status is PS.SERVICE_NOT_AVAILABLE:
            assert s.failed is not None, "SERVICE_NOT_AVAILABLE from a store that has not failed"
            assert self.files.sticky_injected, f"store failed without a sticky fault: {s.failed}"
            self.stats["refused (sticky)"] += len(bodies)
        elif r.status is PS.CREATE_MAPEDFILE_FAILED:
            assert s.failed is None
            assert self.window > 0 or self.files.p_open or self.files.p_mmap, \
                "CREATE_MAPEDFILE_FAILED with no fault injected"
            self.window_refusals += 1
            self.stats["refused (transient)"] += len(bodies)
        else:
            raise AssertionError(f"unexpected put status {r.status}")

    def op_put(self) -> None:
        topic, qid = self.rng.choice(QUEUES)
        b = self.body()
        self.now += 1
        r = self.store.put_message(MessageToStore(topic, qid, 0, b, f"KEYS\x01k{self.seq}", 0, self.now - 1,
                                                  HOST, self.now))
        self.check_put(r, topic, qid, [b])

    def op_batch(self) -> None:
        topic, qid = self.rng.choice(QUEUES)
        bodies = [self.body() for _ in range(self.rng.randint(1, 6))]
        self.now += 1
        r = self.store.put_messages(MessageBatchToStore(topic, qid, 0, self.now - 1, HOST, self.now,
                                                        [(0, b, "") for b in bodies]))
        self.check_put(r, topic, qid, bodies)

    def op_flush(self) -> None:
        s = self.store
        before = self.files.datasyncs
        try:
            flushed = s.flush()
        except StoreError:
            assert self.files.sticky_injected, f"flush failed without a sticky fault: {s.failed}"
            assert s.failed is not None
            if self.failed_at_datasyncs >= 0:
                assert self.files.datasyncs == before, "a failed store called fdatasync again"
            self.failed_at_datasyncs = self.files.datasyncs
            return
        keep = []
        for p in self.pending:
            if p[4] <= flushed:
                self.acked[(p[0], p[1], p[2])] = p[3]
                self.acked_end = max(self.acked_end, p[4])
                self.stats["acked"] += 1
            else:
                keep.append(p)
        self.pending = keep

    def op_flush_cq(self) -> None:
        try:
            self.store.flush_consume_queues()
        except StoreError:
            assert self.files.sticky_injected, f"consume-queue flush failed without a sticky fault: {self.store.failed}"
            self.failed_at_datasyncs = self.files.datasyncs

    def op_window(self) -> None:
        """Open a transient fault window: descriptor exhaustion or a full disk, a few steps."""
        if self.window:
            return
        f = self.files
        kind = self.rng.choice(["emfile", "enospc", "sprinkle"])
        self.window = self.rng.randint(3, 25)
        self.window_refusals = 0
        if kind == "emfile":
            f.p_open, f.open_errno = 1.0, errno.EMFILE
            f.p_mmap = 0.2
        elif kind == "enospc":
            f.p_open, f.open_errno = 1.0, errno.ENOSPC
            f.p_write = 1.0
        else:
            f.p_open, f.open_errno = 0.3, self.rng.choice([errno.EMFILE, errno.ENOSPC])
            f.p_write, f.p_tmp_fsync, f.p_mmap = 0.3, 0.3, 0.1
        self.stats[f"fault windows ({kind})"] += 1

    def close_window(self) -> None:
        f = self.files
        f.p_open = f.p_write = f.p_tmp_fsync = f.p_mmap = 0.0
        if self.store.failed is None:
            # recovered by itself: the next put succeeds without a restart
            topic, qid = self.rng.choice(QUEUES)
            b = self.body()
            self.now += 1
            r = self.store.put_message(MessageToStore(topic, qid, 0, b, "", 0, self.now, HOST, self.now))
            assert r.status is PS.PUT_OK, f"still refused after the fault window closed: {r.status}"
            self.check_put(r, topic, qid, [b])
            self.stats["windows recovered without restart"] += 1

    def op_sticky(self) -> None:
        if not self.files.sticky_injected and self.rng.random() < 0.3:
            self.files.p_datasync = 1.0

    # ---------------------------------------------------------------- audit

    def audit(self, report, crashed: bool, sticky: bool) -> None:
        s = self.store
        assert s.failed is None
        if crashed:
            assert report.commit_log_max_offset >= self.acked_end, (report, self.acked_end)
            if report.truncated_from >= 0:
                assert report.truncated_from >= self.acked_end, (report, self.acked_end)
                self.stats["recoveries reporting a cut"] += 1
        found: dict[tuple[str, int, int], bytes] = {}
        seen = set()
        for topic, qid in QUEUES:
            lo, hi = s.get_min_offset_in_queue(topic, qid), s.get_max_offset_in_queue(topic, qid)
            assert lo == 0, (topic, qid, lo)
            off = lo
            while off < hi:
                r = s.get_message(topic, qid, off, 64)
                assert r.status is GS.FOUND, (topic, qid, off, hi, r.status)
                msgs = decode_records(b"".join(bytes(b) for b in r.buffers))
                for m in msgs:
                    assert m.queue_offset == off, ("queue not contiguous", topic, qid, off, m.queue_offset)
                    assert m.body in self.all_bodies, ("a message that was never put", topic, qid, off)
                    assert m.body not in seen, ("duplicated message", topic, qid, off)
                    seen.add(m.body)
                    found[(topic, qid, off)] = m.body
                    off += 1
                assert off == r.next_begin_offset
        for key, body in self.acked.items():
            assert found.get(key) == body, ("acknowledged message lost or moved", key, found.get(key, b"")[:20])
        lost = 0
        for topic, qid, qo, body, _end in self.pending:
            if found.get((topic, qid, qo)) == body:
                self.acked[(topic, qid, qo)] = body        # survived: durable from now on
            else:
                lost += 1
        self.stats["unacknowledged lost in crashes"] += lost
        self.stats["acknowledged audited"] += len(self.acked)
        if lost and crashed:
            self.stats["crashes losing unacknowledged data"] += 1
        self.pending = []
        self.acked_end = s.commit_log_max_offset

    # ---------------------------------------------------------------- run

    def run(self, steps: int) -> None:
        self.files.rebase(self.root)
        self.audit(self.open(), False, False)
        ops = [(self.op_put, 40), (self.op_batch, 15), (self.op_flush, 20), (self.op_flush_cq, 6),
               (self.op_window, 3), (self.op_sticky, 1), (lambda: self.restart(True), 3),
               (lambda: self.restart(False), 1)]
        fns, weights = zip(*ops)
        for self.step in range(steps):
            op = self.rng.choices(fns, weights)[0]
            self.trace.append(getattr(op, "__name__", "restart"))
            op()
            if self.window:
                self.window -= 1
                if not self.window:
                    self.close_window()
            if self.files.p_datasync and self.store.failed is not None:
                self.files.p_datasync = 0.0
                # sticky: refuses puts, flush never retried, until a restart
                assert self.store.put_message(MessageToStore("SimA", 0, 0, b"x", "", 0, 1, HOST, 1)).status \
                    is PS.SERVICE_NOT_AVAILABLE
                self.op_flush()
                self.op_flush()
                self.stats["sticky failures"] += 1
                self.restart(crash=self.rng.random() < 0.7)
        self.restart(crash=True)
        self.store.close()


@pytest.mark.parametrize("run", range(ITERATIONS))
def test_storage_fault_simulation(tmp_path, run):
    seed = (SEED + run) % 2**32
    sim = Sim(seed, str(tmp_path / "store"))
    try:
        sim.run(STEPS)
    except BaseException:
        print(f"storage sim FAILED: POCKETMQ_FUZZ_SEED={SEED} run={run} (sim seed {seed}) step={sim.step} "
              f"recent ops={list(sim.trace)} stats={dict(sim.stats)}")
        raise
    print(f"storage sim seed={seed}: {dict(sim.stats)} injected={dict(sim.files.injected)}")
    assert sim.stats["acknowledged audited"] > 0
