"""The host's side of a full disk: an OSError with ENOSPC becomes a DiskFullError (exit 28) that
says what was being written, where, how much is free there and what to do (the in-env runner's
side, and the test and the free-space reading both share: repro/workload/diskfull.py)."""

from __future__ import annotations

from repro.core.errors import DiskFullError
from repro.workload import diskfull

is_disk_full = diskfull.is_disk_full


def disk_full_error(exc: OSError, what: str, path: object = None) -> DiskFullError:
    return disk_full_at(what, path if path is not None else (exc.filename or "(unknown file)"))


def disk_full_at(what: str, path: object) -> DiskFullError:
    """The error for `what`, written at `path`, with the free space there now."""
    return DiskFullError.writing(what, path, diskfull.size_text(diskfull.free_bytes(str(path))))
