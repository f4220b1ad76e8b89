"""Nothing of a run outlives the tool: a process the tool started follows it when it dies.

SIGKILL of the tool runs none of its clean-up, and the suite it started (in a session of its own,
so that the tool can stop it as a group) would go on running its ranks and writing into the
results folder. So the suite asks the kernel for a signal when its parent dies
(`prctl(PR_SET_PDEATHSIG)`, Linux), and, where that is not available, a thread notices the
parent change (the process is re-parented to init or a subreaper). Either way the suite gets
SIGTERM, which its stop handler turns into the ordinary interrupt: its runs are stopped and what
finished is recorded. This module runs inside the envs: the standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.5
# In a container the tool is no parent (init is): the Docker engine holds an exclusive lock on a
# file it binds in read-only (the owner lock), and the suite waits for that lock, which the kernel
# releases when the tool dies, however it dies.
OWNER_LOCK_ENV = "MICS_REPRO_OWNER_LOCK"
OWNER_LOCK_DIR = "/run/mics-repro-owner"
OWNER_LOCK_PATH = f"{OWNER_LOCK_DIR}/owner.lock"


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def group_alive(pgid: int) -> bool:
    """Whether a process of the process group (or session) `pgid` is left, a zombie included."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_each(send: Callable[[int, int], None], targets: Iterable[int], sig: int) -> None:
    """`send(target, sig)` (os.kill, os.killpg) to each target; one that is gone already is skipped."""
    for target in targets:
        with contextlib.suppress(ProcessLookupError):
            send(target, sig)


def become_subreaper() -> bool:
    """Orphaned descendants of this process (a double fork, a `setsid cmd &`) are reparented to
    it instead of init (Linux 3.4+), so it can find, stop and reap them; False where the kernel
    cannot."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def _terminate_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def follow_parent() -> bool:
    """From now on, the death of this process's parent stops this process (SIGTERM to itself).
    Returns False when the parent is already gone (then the SIGTERM is sent) or is init itself
    (in a container: the container's lifetime is the limit)."""
    parent = os.getppid()
    if parent == 1:
        return False
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the kernel sends it when the parent dies
    if os.getppid() != parent:  # it died before the request took effect
        _terminate_self()
        return False

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S)
        _terminate_self()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    return True


def follow_owner(path: str | None) -> bool:
    """When the process holding the owner lock at `path` ends (the tool, across a container's
    bind mount), SIGTERM to this process. False when there is no such lock."""
    if not path:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False

    def wait() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks while the tool lives
        except OSError:
            return
        _terminate_self()

    threading.Thread(target=wait, name="owner-watch", daemon=True).start()
    return True


def follow_tool() -> None:
    """Both watches: the parent (venv engine) and the owner lock (Docker engine)."""
    follow_parent()
    follow_owner(os.environ.get(OWNER_LOCK_ENV))
