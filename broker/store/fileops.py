"""The store's file-operations layer: every OS call the store makes on its files.

`FileOps` extends `common.files.FileLayer` (open, write, fsync, close, replace, unlink,
makedirs: what the atomic metadata write uses) with the calls of the mapped files:
creating a preallocated file, opening one, ftruncate, fdatasync, mmap, fstat, directory
fsync. The default is the plain os calls; a test subclasses it to inject failures
(EMFILE, ENOSPC, EIO) or to model the page cache (tests/fault/test_storage_sim.py).

Records are written into and read from the mappings, except the large writes of a
slave's replicated runs (`pwrite`: one system call instead of a page fault for every
4 KiB page a first write into the mapping takes, ~0.2 against ~1.6 ms of CPU per MiB
measured here); otherwise the layer is called when a file is created, opened or synced.

Failure classes (docs/store.md "Storage faults"): a call that creates or opens a file
raises `NotOpened` (common.files) and is transient — nothing already written is affected,
the next attempt retries it; a failed fdatasync/fsync of a store file is sticky.
"""
from __future__ import annotations

import errno
import mmap
import os

from pocketmq.common.files import FileLayer, NotOpened, fsync_dir

__all__ = ["FileOps", "NotOpened"]

_CREATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_OPEN_FLAGS = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)


class FileOps(FileLayer):
    """The OS calls the store makes on its files; tests subclass it to inject failures."""

    def __init__(self, preallocate: bool = True) -> None:
        self.preallocate = preallocate

    # ------------------------------------------------------------------ primitives

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fallocate(self, fd: int, size: int) -> None:
        os.posix_fallocate(fd, 0, size)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def pwrite(self, fd: int, data, offset: int) -> None:
        """All of `data` at `offset` of the file (the page cache the mappings share)."""
        while data:
            n = os.pwrite(fd, data, offset)
            data = data[n:]
            offset += n

    def dup(self, fd: int) -> int:
        return os.dup(fd)

    def pread_into(self, fd: int, buf, offset: int) -> int:
        """Read into `buf` from `offset` (the GIL released); the bytes read."""
        return os.preadv(fd, [buf], offset)

    def fstat_size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def mmap(self, fd: int, size: int) -> mmap.mmap:
        return mmap.mmap(fd, size)

    # ------------------------------------------------------------------ composed

    def create(self, path: str, size: int) -> int:
        """A new file of `size` bytes (zeros, preallocated when the file system can).
        Raises NotOpened; on failure nothing is left behind."""
        try:
            fd = self.open(path, _CREATE_FLAGS)
        except OSError as e:
            raise NotOpened(e.errno, f"cannot create {path}: {e.strerror}") from None
        try:
            self.ftruncate(fd, size)
            if self.preallocate and hasattr(os, "posix_fallocate"):
                try:
                    self.fallocate(fd, size)
                except OSError as e:
                    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                        raise
        except OSError as e:
            self._discard(fd, path)
            raise NotOpened(e.errno, f"cannot create {path}: {e.strerror}") from None
        except BaseException:
            self._discard(fd, path)
            raise
        return fd

    def _discard(self, fd: int, path: str) -> None:
        self.close(fd)
        try:
            self.unlink(path)
        except OSError:
            pass

    def open_existing(self, path: str) -> int:
        """Open an existing store file read/write. Raises NotOpened."""
        try:
            return self.open(path, _OPEN_FLAGS)
        except OSError as e:
            raise NotOpened(e.errno, f"cannot open {path}: {e.strerror}") from None

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries durable. NotOpened when it cannot be opened
        (transient), OSError when the fsync fails (sticky)."""
        fsync_dir(path, self)
