"""Interpreter-start hook for `python -m repro run` / `make shell` (repro/workload/jobhook.py).

This folder goes first on PYTHONPATH of a custom job, so every Python process of the job (launcher
children included) imports this module at start. It does nothing unless MICS_REPRO_HOOK=1: then it
puts the lab's repository on sys.path and activates the hook. Nothing is written into the user's
environment; leaving the folder off PYTHONPATH removes the hook.
"""

import os
import sys


def _activate() -> None:
    root = os.environ.get("MICS_REPRO_ROOT") or os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    if root not in sys.path:
        sys.path.append(root)  # last: the job's own modules always win
    from repro.workload import jobhook

    jobhook.activate(os.environ)


if os.environ.get("MICS_REPRO_HOOK") == "1":
    _activate()
