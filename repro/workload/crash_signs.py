"""Which crashes are the bug: read from a run's exception (type, message, traceback), one place for
the suite's classifier (classify.py) and the own-job judge (judge.py).

Runs inside the environments: standard library only (Python 3.8+).
"""

from __future__ import annotations

from typing import Any

_ILLEGAL_WORK_MARKERS = ("IllegalWork", "_IllegalWork")
# torch's `_coalescing_manager` waiting, on exit of a synchronous block, the work its release lost:
# `work.wait()` on None (pytorch#122807, releases in gloo_transport.LOSES_BLOCK_WORK).
_LOST_WORK_MESSAGE = "'NoneType' object has no attribute 'wait'"
_LOST_WORK_FRAME = "_coalescing_manager"


def _text(exc: dict[str, Any]) -> str:
    return f"{exc.get('message') or ''}\n{exc.get('traceback') or ''}"


def raised_from_illegal_work(exc: dict[str, Any] | None) -> bool:
    """The exception came from an `_IllegalWork` placeholder (its wait() or DeepSpeed's check)."""
    return bool(exc) and any(marker in _text(exc) for marker in _ILLEGAL_WORK_MARKERS)  # type: ignore[arg-type]


def lost_coalesced_work(exc: dict[str, Any] | None) -> bool:
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
