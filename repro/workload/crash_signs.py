"""Which crashes are the bug: read from a run's exception (type, message, traceback), one place for
the suite's classifier (classify.py) and the own-job judge (judge.py).

Runs inside the environments: standard library only (Python 3.9+).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repro.workload.record import RecordedException

_ILLEGAL_WORK_MARKERS = ("IllegalWork", "_IllegalWork")
# A traceback's frame line: `  File "/.../torch/distributed/distributed_c10d.py", line 1, in wait`.
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+', re.MULTILINE)
# Where the bug raises: torch's _IllegalWork (torch/distributed/distributed_c10d.py) or DeepSpeed's
# code around it; any file of the job's own (or an import of it) is not the bug.
_FRAMEWORK_FILE = re.compile(r"(?:^|[/\\])(?:torch[/\\]distributed|deepspeed)[/\\][^\n]*\.py$")
# torch's `_coalescing_manager` waiting, on exit of a synchronous block, the work its release lost:
# `work.wait()` on None (pytorch#122807, releases in gloo_transport.LOSES_BLOCK_WORK).
_LOST_WORK_MESSAGE = "'NoneType' object has no attribute 'wait'"
_LOST_WORK_FRAME = "_coalescing_manager"


def _text(exc: RecordedException) -> str:
    return f"{exc.get('message') or ''}\n{exc.get('traceback') or ''}"


def raising_file(exc: RecordedException | None) -> str | None:
    """The file of the innermost frame of the exception's traceback (the one that raised), or None
    when the traceback names no frame."""
    frames = _FRAME.findall(str((exc or {}).get("traceback") or ""))
    return frames[-1] if frames else None


def raised_in_framework(exc: RecordedException | None, framework_dirs: Sequence[str] = ()) -> bool:
    """The raising frame is torch.distributed's or DeepSpeed's code: under one of `framework_dirs`
    (the package folders the job's processes imported, as the hook recorded them; a DeepSpeed
    checkout in the job's WORKDIR included), or, where none are known, a file under a
    `torch/distributed/` or `deepspeed/` folder."""
    where = raising_file(exc)
    if where is None:
        return False
    if framework_dirs:
        return any(where.startswith(folder.rstrip("/\\") + sep) for folder in framework_dirs for sep in "/\\")
    return bool(_FRAMEWORK_FILE.search(where))


def raised_from_illegal_work(exc: RecordedException | None) -> bool:
    """The exception names an `_IllegalWork` placeholder (its wait() or DeepSpeed's check). Enough
    for the suite (classify.py): its ranks run our own model, whose code raises nothing of the kind.
    A custom job's code is not ours: the judge also asks `raised_in_framework`."""
    if not exc:
        return False
    return any(marker in _text(exc) for marker in _ILLEGAL_WORK_MARKERS)


def lost_coalesced_work(exc: RecordedException | None) -> bool:
    """The exception is torch's coalescing manager waiting a coalesced work the release lost.

    DeepSpeed's synchronous MiCS gather (the hierarchical one) enters `_coalescing_manager` with
    `device=` and `async_ops=False`; on such a release the manager's own `work.wait()` meets None
    before DeepSpeed can wait its `_IllegalWork`. The same gather, the same missing work.
    """
    if not exc or exc.get("type") != "AttributeError":
        return False
    return _LOST_WORK_MESSAGE in str(exc.get("message") or "") and _LOST_WORK_FRAME in str(
        exc.get("traceback") or ""
    )
