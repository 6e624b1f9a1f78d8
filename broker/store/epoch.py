"""The epoch file `{root}/epochFileCheckpoint` (RocketMQ 5's name): which master epoch wrote
which part of this store's commit log (controller mode, broker/core/failover.py).

Text, one entry per line, ascending by epoch and by start offset:

| field        | format         | meaning                                                  |
|--------------|----------------|----------------------------------------------------------|
| line 1       | `pocketmq-epoch 1` | marks the file and its version                       |
| each entry   | `<epoch> <start>`  | decimal; records from `start` (a record boundary) up |
|              |                    | to the next entry's start were written by the master |
|              |                    | of `epoch`                                           |
| last line    | `crc <crc32>`      | crc32 of every byte before this line: a torn or      |
|              |                    | foreign file is refused, never half-read             |

A master appends (its new epoch, its log's end) when it takes over; a slave holds its
master's entries (received in the HA handshake) for the part of the log it copied.
Written with write_file_atomic (tmp, fsync, rename, fsync dir): old or new, never torn.
"""
from __future__ import annotations

import zlib

from pocketmq.common.files import read_file, write_file_atomic

__all__ = ["EpochFileError", "read_epoch_file", "write_epoch_file", "EPOCH_FILE_NAME"]

EPOCH_FILE_NAME = "epochFileCheckpoint"
_HEAD = "pocketmq-epoch 1\n"


class EpochFileError(ValueError):
    """The epoch file exists but is not a valid one (the message names the file and why)."""


def encode_entries(entries: list[tuple[int, int]]) -> bytes:
    check(entries)
    body = (_HEAD + "".join(f"{e} {s}\n" for e, s in entries)).encode()
    return body + f"crc {zlib.crc32(body)}\n".encode()


def check(entries: list[tuple[int, int]]) -> None:
    for i, (e, s) in enumerate(entries):
        if e < 0 or s < 0:
            raise EpochFileError(f"epoch entry {i} ({e}, {s}) is negative")
        if i and (e <= entries[i - 1][0] or s < entries[i - 1][1]):
            raise EpochFileError(f"epoch entry {i} ({e}, {s}) does not follow ({entries[i - 1][0]}, "
                                 f"{entries[i - 1][1]})")


def decode_entries(data: bytes, path: str = "epoch file") -> list[tuple[int, int]]:
    text = data.decode("ascii", "replace")
    cut = text.rfind("crc ")
    if not text.startswith(_HEAD) or cut < 0 or not text.endswith("\n"):
        raise EpochFileError(f"{path} is not a pocketmq epoch file")
    body = data[:cut]
    try:
        crc = int(text[cut + 4:].strip())
    except ValueError:
        raise EpochFileError(f"{path}: bad crc line") from None
    if crc != zlib.crc32(body):
        raise EpochFileError(f"{path}: crc mismatch (torn or edited file)")
    out = []
    for line in text[len(_HEAD):cut].splitlines():
        parts = line.split()
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise EpochFileError(f"{path}: bad entry line {line!r}")
        out.append((int(parts[0]), int(parts[1])))
    check(out)
    return out


def read_epoch_file(path: str) -> list[tuple[int, int]]:
    """The entries; [] when the file does not exist. EpochFileError when it is not valid."""
    data = read_file(path)
    if data is None:
        return []
    return decode_entries(data, path)


def write_epoch_file(path: str, entries: list[tuple[int, int]]) -> None:
    write_file_atomic(path, encode_entries(entries))
