"""Interpreter-start hook for `python -m repro run` / `make shell` (repro/workload/jobhook.py).

This folder goes first on PYTHONPATH of a custom job, so every Python process of the job (launcher
children included) imports this module at start. It does nothing unless MICS_REPRO_HOOK=1: then it
puts the lab's repository on sys.path and activates the hook. A job that replaces PYTHONPATH skips
this door; the .pth in the env's site-packages (repro/workload/hookpth.py) is the other one, and
activation is idempotent. The env's own `sitecustomize` (Debian's Python has one), which this
module shadows, is run afterwards either way.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _activate() -> None:
    root = os.environ.get("MICS_REPRO_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
    if root not in sys.path:
        sys.path.append(root)  # last: the job's own modules always win
    from repro.workload import jobhook

    jobhook.activate(os.environ)


def _run_shadowed_sitecustomize() -> None:
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get("MICS_REPRO_HOOK") == "1":
    _activate()
_run_shadowed_sitecustomize()
