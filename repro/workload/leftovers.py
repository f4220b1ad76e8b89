"""Every process a job started, also one that left its process group: found, stopped, named.

A job's command may start daemons that leave the session the runner signals (`setsid cmd &`, a
double fork, a server that daemonizes). Two marks find them after the command ends (Linux /proc):

* a token in the environment of every process of the job (`RUN_TOKEN_VAR`, unique per run): a
  process inherits it through fork and exec, whatever group or session it moves to;
* this runner's descendants: the runner is a child subreaper (parentwatch.become_subreaper), so
  an orphan of the job (one that cleared its environment, too) is reparented to it, not to init.

What is found gets SIGTERM, then SIGKILL; what is still alive after that is a survivor. The
standard library only: this runs inside the envs.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Collection, Iterable

RUN_TOKEN_VAR = "MICS_REPRO_RUN_TOKEN"
STOP_GRACE_S = 5.0
POLL_S = 0.1


def new_token() -> str:
    return secrets.token_hex(16)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:  # gone meanwhile, or another user's process
        return None


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, ...]."""
    data = _read(f"/proc/{pid}/stat")
    if data is None:
        return None
    fields = data.rsplit(b")", 1)[-1].split()
    return [f.decode() for f in fields] if len(fields) > 2 else None


def all_pids() -> list[int]:
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def _running(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def marked(token: str) -> list[int]:
    """Running processes whose environment holds this run's token (this process excluded)."""
    needle = f"{RUN_TOKEN_VAR}={token}".encode()
    found = []
    for pid in all_pids():
        if pid == os.getpid():
            continue
        environ = _read(f"/proc/{pid}/environ")
        if environ is not None and needle in environ.split(b"\0") and _running(pid):
            found.append(pid)
    return sorted(found)


def descendants(root: int) -> list[int]:
    """Running processes below `root` in the process tree."""
    children: dict[int, list[int]] = {}
    for pid in all_pids():
        fields = stat_fields(pid)
        if fields is not None and fields[0] != "Z" and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(found)


def find(token: str, exclude: Iterable[int] = (), below_me: bool = False) -> list[int]:
    """The job's processes still running: marked with its token, or (`below_me`: this process
    is the job's runner and a subreaper, so everything below it is the job's) below this one."""
    found = set(marked(token)) | (set(descendants(os.getpid())) if below_me else set())
    return sorted(found - set(exclude))


def _reap_children(exclude: Iterable[int]) -> None:
    """Collect the zombies of orphans reparented to this subreaper (never waitpid(-1), nor a pid
    in `exclude`: the runner's own Popen keeps its child's status)."""
    skip = set(exclude)
    for pid in [p for p in _zombie_children() if p not in skip]:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _zombie_children() -> list[int]:
    me = str(os.getpid())
    return [p for p in all_pids() if (f := stat_fields(p)) is not None and f[0] == "Z" and f[1] == me]


def describe(pid: int) -> str:
    data = _read(f"/proc/{pid}/cmdline") or b""
    return " ".join(a.decode(errors="replace") for a in data.split(b"\0") if a)[:200]


def stop(
    token: str, exclude: Collection[int] = (), below_me: bool = False
) -> tuple[dict[str, str], list[int]]:
    """SIGTERM, then SIGKILL, to every process of the job still running (`find`). Returns what
    was found ({pid: command line}) and the pids still alive after SIGKILL."""

    found: dict[str, str] = {}

    def left() -> list[int]:
        pids = find(token, exclude, below_me)
        found.update({str(pid): describe(pid) for pid in pids if str(pid) not in found})
        return pids

    if not left():
        return {}, []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _send(left(), sig, os.kill)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            if below_me:
                _reap_children(exclude)
            if not left():
                return found, []
            time.sleep(POLL_S)
    if below_me:
        _reap_children(exclude)
    return found, left()


def _send(pids: Iterable[int], sig: int, kill: Callable[[int, int], None]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, sig)
