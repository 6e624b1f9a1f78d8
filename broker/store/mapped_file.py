"""Fixed-size memory-mapped files, and a directory of them named by start offset.

A MappedFile is one preallocated file (ftruncate, then posix_fallocate when possible so
that a full disk shows up as ENOSPC when the file is created, not as SIGBUS on a write
into a hole), mapped MAP_SHARED read/write. Its write position lives in memory; the
owners (CommitLog, ConsumeQueue) recover it by scanning at open.

File names are the start offset as 20 zero-padded decimal digits; file k of a queue
starts at k * file_size (only the first file may have been deleted from the front).

Durability: `sync()` is os.fdatasync(fd). On Linux the page cache is unified, so it also
writes the dirty pages of the shared mapping; unlike mmap.flush() it releases the GIL,
so a flush thread does not stall the event loop. A newly created file also needs its
directory entry synced once (`dir_synced`).

A file whose mapping still has exported memoryviews (a pull response being written)
cannot be unmapped: destroy() unlinks it anyway and keeps the object as a "zombie" to
close later; the mapping stays valid until then.
"""
from __future__ import annotations

import errno
import logging
import os
import re

from pocketmq.broker.store.api import StoreError
from pocketmq.broker.store.fileops import FileOps, NotOpened

# FileOps lives in fileops.py; re-exported here for the callers that import it from this module
__all__ = ["FileOps", "MappedFile", "MappedFileQueue", "offset_file_name"]

log = logging.getLogger("pocketmq.store")

_NAME_RE = re.compile(r"^\d{20}$")


def offset_file_name(offset: int) -> str:
    return "%020d" % offset


class MappedFile:
    __slots__ = ("path", "start", "size", "fd", "mm", "view", "wrote", "flushed", "dir_synced", "ops")

    def __init__(self, path: str, start: int, size: int, fd: int, dir_synced: bool, ops: FileOps) -> None:
        self.path = path
        self.start = start
        self.size = size
        self.fd = fd
        self.ops = ops
        try:
            self.mm = ops.mmap(fd, size)
        except OSError as e:      # ENOMEM, or the map count limit: as transient as a failed open
            raise NotOpened(e.errno, f"cannot map {path}: {e.strerror}") from None
        self.view = memoryview(self.mm)
        self.wrote = 0          # bytes written (in-memory write position)
        self.flushed = 0        # bytes known durable
        self.dir_synced = dir_synced

    @classmethod
    def create(cls, path: str, start: int, size: int, ops: FileOps) -> "MappedFile":
        try:
            fd = ops.create(path, size)
        except NotOpened:
            raise
        except OSError as e:        # whatever a layer raises while creating: nothing was written
            raise NotOpened(e.errno, f"cannot create {path}: {e.strerror}") from None
        try:
            return cls(path, start, size, fd, dir_synced=False, ops=ops)
        except BaseException:
            ops._discard(fd, path)       # a file left behind would make the retry fail (O_EXCL)
            raise

    @classmethod
    def open(cls, path: str, start: int, size: int, ops: FileOps) -> "MappedFile":
        fd = ops.open_existing(path)
        try:
            actual = ops.fstat_size(fd)
            if actual != size:
                raise StoreError(f"{path}: size {actual} != configured segment size {size}")
            # dir_synced=False: the run that created it may have died before syncing its
            # directory (the entry is then only in the page cache): the first flush does it
            return cls(path, start, size, fd, dir_synced=False, ops=ops)
        except BaseException:
            ops.close(fd)
            raise

    @property
    def end(self) -> int:
        return self.start + self.size

    def close(self) -> bool:
        """Unmap and close; False (nothing done yet) while memoryviews of the mapping live."""
        if self.fd >= 0:
            # the mapping holds its own descriptor: ours is only for fdatasync
            self.ops.close(self.fd)
            self.fd = -1
        if self.mm is None:
            return True
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            self.view = memoryview(self.mm)
            return False
        self.mm = None
        return True

    def __repr__(self) -> str:
        return f"MappedFile({self.path!r}, wrote={self.wrote})"


class MappedFileQueue:
    """The files of one directory, contiguous, in start-offset order."""

    def __init__(self, directory: str, file_size: int, ops: FileOps) -> None:
        self.directory = directory
        self.file_size = file_size
        self.ops = ops
        self.files: list[MappedFile] = []
        self.zombies: list[MappedFile] = []

    def load(self) -> None:
        """Map the existing files. Raises StoreError on a wrong size or a hole."""
        if not os.path.isdir(self.directory):
            return
        names = []
        for name in os.listdir(self.directory):
            if _NAME_RE.match(name):
                names.append(name)
            elif name.endswith(".tmp"):
                continue
            else:
                log.warning("ignoring stray file %s in %s", name, self.directory)
        names.sort()
        prev = None
        for i, name in enumerate(names):
            start = int(name)
            path = os.path.join(self.directory, name)
            if i == len(names) - 1 and os.path.getsize(path) < self.file_size:
                # a last file cut short (copied, truncated): what is missing reads as zeros
                log.warning("%s is shorter than %d bytes: extending it with zeros", path, self.file_size)
                os.truncate(path, self.file_size)
            if start % self.file_size:
                raise StoreError(f"{self.directory}/{name}: start is not a multiple of {self.file_size}")
            if prev is not None and start != prev + self.file_size:
                raise StoreError(f"{self.directory}: hole between {offset_file_name(prev)} and {name}")
            self.files.append(MappedFile.open(path, start, self.file_size, self.ops))
            prev = start

    @property
    def first(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, offset: int) -> MappedFile | None:
        files = self.files
        if not files:
            return None
        idx = (offset - files[0].start) // self.file_size
        if 0 <= idx < len(files):
            return files[idx]
        return None

    def create(self, start: int) -> MappedFile:
        """Create the file starting at `start` (must continue the queue). Raises NotOpened
        (transient: nothing was written, the next call tries again)."""
        if self.files and start != self.files[-1].end:
            raise ValueError(f"new file at {start} does not follow {self.files[-1].end}")
        try:
            self.ops.makedirs(self.directory)
        except OSError as e:
            raise NotOpened(e.errno, f"cannot create {self.directory}: {e.strerror}") from None
        mf = MappedFile.create(os.path.join(self.directory, offset_file_name(start)), start,
                               self.file_size, self.ops)
        self.files.append(mf)
        return mf

    def _destroy(self, mf: MappedFile) -> None:
        try:
            self.ops.unlink(mf.path)
        except FileNotFoundError:
            pass
        if not mf.close():
            self.zombies.append(mf)

    def delete_first(self, count: int) -> list[MappedFile]:
        victims = self.files[:count]
        self.files = self.files[count:]
        for mf in victims:
            self._destroy(mf)
        self.reap()
        return victims

    def delete_after(self, mf_keep: MappedFile) -> list[MappedFile]:
        """Delete every file after mf_keep."""
        idx = self.files.index(mf_keep)
        victims = self.files[idx + 1:]
        self.files = self.files[:idx + 1]
        for mf in reversed(victims):
            self._destroy(mf)
        return victims

    def delete_last(self) -> None:
        mf = self.files.pop()
        self._destroy(mf)

    def reap(self) -> None:
        """Retry closing unlinked files whose mappings were still exported."""
        if self.zombies:
            self.zombies = [mf for mf in self.zombies if not mf.close()]

    def close(self) -> None:
        for mf in self.files:
            if not mf.close():
                self.zombies.append(mf)
        self.files = []
        self.reap()
        # whatever is still exported is closed by the GC once its views are gone
        self.zombies = []

    def sync_dir(self) -> None:
        if os.path.isdir(self.directory):
            self.ops.fsync_dir(self.directory)


_ZERO_CHUNK = bytes(1 << 20)


def _last_nonzero_dense(view, start: int, end: int) -> int:
    step = len(_ZERO_CHUNK)
    hi = end
    while hi > start:
        lo = max(start, hi - step)
        chunk = bytes(view[lo:hi])
        if chunk != _ZERO_CHUNK[:hi - lo]:
            return lo + len(chunk.rstrip(b"\x00"))
        hi = lo
    return start


def data_extents(fd: int, start: int, end: int) -> list[tuple[int, int]] | None:
    """The ranges of [start, end) of a file that may hold non-zero bytes, from the file
    system (SEEK_DATA / SEEK_HOLE): unwritten preallocated extents and holes read as zeros,
    pages written (dirty or flushed) or read count as data. None when the file system
    cannot tell (the caller then reads everything)."""
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_data is None or fd < 0:
        return None
    out = []
    off = start
    try:
        while off < end:
            try:
                d = os.lseek(fd, off, seek_data)
            except OSError as e:
                if e.errno == errno.ENXIO:      # no data at or after off
                    break
                raise
            if d >= end:
                break
            h = min(os.lseek(fd, d, os.SEEK_HOLE), end)
            out.append((d, h))
            off = h
    except OSError:
        return None
    return out


def last_nonzero(view, fd: int, start: int, end: int) -> int:
    """Offset just past the last non-zero byte of view[start:end] (a mapping of the file
    `fd`), or `start` when that range is all zeros. Reads only what the file system reports
    as data: recovery looks past the end of a 1 GiB segment without touching (and making
    resident) its never-written pages."""
    extents = data_extents(fd, start, end)
    if extents is None:
        return _last_nonzero_dense(view, start, end)
    for d, h in reversed(extents):
        r = _last_nonzero_dense(view, d, h)
        if r > d:
            return r
    return start
