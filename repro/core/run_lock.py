"""One run per results folder: a run holds an exclusive lock on its folder for its whole life.

Two runs writing one folder (two `make run ... RESUME=1` of one interrupted invocation, started
in two terminals) would each clear and rerun the same unfinished runs, overwrite each other's
records and stop each other's processes. So a run, before it reads or writes a results folder,
takes `fcntl.flock(LOCK_EX)` on a lock file inside it and keeps it until it exits; a second run
finds it held and refuses, naming the first run's process. The kernel releases the lock when
the holder dies, however it dies, so a lock is never stale (the file is: it stays, unlocked).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from repro.core.errors import UsageError

LOCK_NAME = ".repro-run.lock"
_HELD: dict[str, int] = {}  # folder -> descriptor, open until the command ends (release_all)


class FolderInUseError(UsageError):
    """Another run holds the results folder (exit 2, like any other folder that cannot be used)."""


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 64).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"


def lock_folder(folder: Path) -> None:
    """Take the folder's run lock until the command ends (`release_all`, or the process's end;
    again for a folder it holds: no-op); FolderInUseError when another process holds it."""
    key = str(folder.resolve())
    if key in _HELD:
        return
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise UsageError(
            f"cannot lock the results folder {folder}",
            why=f"{exc.strerror or exc} ({folder / LOCK_NAME})",
            fix="choose a folder you can write: OUT=<folder>, or RESULTS_ROOT/--results-root",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        raise FolderInUseError(
            f"{folder} is in use by another run (pid {pid})",
            why="two runs in one results folder would overwrite each other's records and stop each "
            "other's processes",
            fix=f"wait for that run to end (or stop it: kill {pid}), then run again; or give another OUT=",
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _HELD[key] = fd


def release(folder: Path) -> None:
    """Give the lock up before the process ends (a folder about to be removed)."""
    fd = _HELD.pop(str(folder.resolve()), None)
    if fd is not None:
        os.close(fd)


def release_all() -> None:
    """The command has ended (repro.cli.main): its folders are free for the next run."""
    for folder in list(_HELD):
        os.close(_HELD.pop(folder))
