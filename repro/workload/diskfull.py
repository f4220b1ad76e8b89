"""A full disk ends a run at once, with what, where, how much is free and what to do.

A write of the lab's own files (a run's log, job.json, results.json) that fails with ENOSPC
would otherwise end in a traceback, or worse, block: a log writer thread that dies leaves the
job's output pipe undrained, so the job stalls until the stall limit. Every such write raises
`DiskFull` instead, which the runner (repro/workload/job.py) and the tool's front door
(repro/cli/main.py) turn into one message and exit code `EXIT_DISK_FULL`. The standard library
only: this runs inside the envs too.
"""

from __future__ import annotations

import errno
import os
import shutil

EXIT_DISK_FULL = 28  # ENOSPC's number: a distinct exit code for the in-env runner and the tool


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: str) -> int | None:
    """Free space for an unprivileged writer on the file system holding `path` (or its nearest
    existing parent); None when it cannot be asked."""
    here = os.path.abspath(path)
    while not os.path.exists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    try:
        return shutil.disk_usage(here).free
    except OSError:
        return None


def size_text(n: int | None) -> str:
    if n is None:
        return "an unknown amount"
    size, unit = float(n), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"


class DiskFull(OSError):
    """ENOSPC/EDQUOT while writing `path` (what the lab was writing: `what`)."""

    def __init__(self, what: str, path: str, cause: OSError | None = None) -> None:
        self.what, self.path = what, path
        self.free = free_bytes(path)
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        self.detail = (cause.strerror if cause is not None else None) or os.strerror(errno.ENOSPC)

    def message(self) -> str:
        folder = os.path.dirname(os.path.abspath(self.path))
        return (
            f"error: the disk is full: writing {self.what} failed ({self.detail})\n"
            f"  where: {self.path} ({size_text(self.free)} free there)\n"
            f"  what to do: free space on the disk that holds {folder}, or give another OUT= on a"
            " disk with room; then run the same command with RESUME=1 to finish what did not"
        )
