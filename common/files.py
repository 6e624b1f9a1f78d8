"""Durable small-file writes for metadata (topics.json, consumerOffset.json, kvConfig.json, checkpoint...).

`write_file_atomic(path, data)`: write a temp file in the same directory, fsync it,
os.replace() it over `path`, then fsync the directory so the rename itself is durable.
A crash at any point leaves either the old or the new content, never a mix.
One writer per path at a time (callers serialise their own writes).

Every OS call goes through a `FileLayer` (default `OS_FILES`, the plain os calls): the
store's file-operations layer (`broker/store/fileops.py`) extends it, so a test that
injects failures or models the page cache sees the metadata writes too.

`NotOpened` (an OSError) marks a failure to create or open a file or directory: no data
already written was touched, so retrying later is safe (EMFILE, ENOSPC at creation...).
"""
from __future__ import annotations

import itertools
import os

__all__ = ["FileLayer", "OS_FILES", "NotOpened", "write_file_atomic", "fsync_dir", "read_file"]

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
_tmp_seq = itertools.count()     # temp names unique within the process (threads too)
_TMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


class NotOpened(OSError):
    """A file or directory could not be created or opened (nothing durable touched)."""


class FileLayer:
    """The OS calls of file writers, one method each (the plain os functions by default)."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def write(self, fd: int, data) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)


OS_FILES = FileLayer()


def fsync_dir(path: str, files: FileLayer = OS_FILES) -> None:
    """fsync a directory so that entries created, renamed or removed in it are durable.
    Raises NotOpened when the directory cannot be opened (retry later), OSError when the
    fsync itself fails."""
    try:
        fd = files.open(path, _DIR_FLAGS)
    except OSError as e:
        raise NotOpened(e.errno, f"cannot open directory {path}: {e.strerror}") from None
    try:
        files.fsync(fd)
    finally:
        files.close(fd)


def write_file_atomic(path: str, data: bytes, files: FileLayer = OS_FILES) -> None:
    """Replace `path` with `data` durably: tmp -> fsync -> os.replace -> fsync dir.

    Raises OSError (NotOpened when the temp file cannot be created); on failure the temp
    file is removed and `path` is untouched. Failures are never sticky: the old content
    stays valid and the next write tries again with a new temp file.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        files.makedirs(directory)
        tmp = f"{path}.{os.getpid()}-{next(_tmp_seq)}.tmp"
        fd = files.open(tmp, _TMP_FLAGS)
    except OSError as e:
        raise NotOpened(e.errno, f"cannot create a temp file for {path}: {e.strerror}") from None
    try:
        try:
            view = memoryview(data)
            while view:
                n = files.write(fd, view)
                view = view[n:]
            files.fsync(fd)
        finally:
            files.close(fd)
        files.replace(tmp, path)
    except BaseException:
        try:
            files.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory, files)


def read_file(path: str) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
