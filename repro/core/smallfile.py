"""Read an input file the user named without trusting what it is: only a regular file, only up to
a size. `CONFIG=/dev/zero` would otherwise fill the memory, `/dev/stdin` or a FIFO block forever."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotRegularFile(OSError):
    """The path is a folder, FIFO, device or socket."""


class FileTooLarge(OSError):
    """The file holds more than the caller's limit."""


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; OSError (or one of the two above) else.

    Opened non-blocking, so a FIFO is recognised instead of waited on, and checked on the open
    descriptor, so what is read is what was checked."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, device or socket)"
            raise NotRegularFile(f"{path} is {kind}")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"{path} is larger than {limit} bytes")
    return data
