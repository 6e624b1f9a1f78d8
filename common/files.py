"""Durable small-file writes for metadata (topics.json, consumerOffset.json, kvConfig.json, checkpoint...).

`write_file_atomic(path, data)`: write a temp file in the same directory, fsync it,
os.replace() it over `path`, then fsync the directory so the rename itself is durable.
A crash at any point leaves either the old or the new content, never a mix.
One writer per path at a time (callers serialise their own writes).
"""
from __future__ import annotations

import os
import tempfile

__all__ = ["write_file_atomic", "fsync_dir", "read_file"]


def fsync_dir(path: str) -> None:
    """fsync a directory so that entries created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: str, data: bytes) -> None:
    """Replace `path` with `data` durably: tmp -> fsync -> os.replace -> fsync dir.

    Raises OSError; on failure the temp file is removed and `path` is untouched.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)


def read_file(path: str) -> bytes | None:
    """The file's bytes, or None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
