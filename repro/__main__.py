"""`python -m repro`: see repro/cli/main.py.

The Python version is checked before anything else of this package is imported: on an older
Python those imports fail with an unrelated `TypeError: 'ABCMeta' object is not subscriptable`.
Keep this file importable (and the check runnable) by Python 3.7+.
"""

from __future__ import annotations

import sys

MIN_PYTHON = (3, 9)
# repro.core.errors.PythonVersionError.exit_code, not imported for the reason above (a test keeps
# the two equal).
PYTHON_VERSION_EXIT = 12


def python_too_old(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> str | None:
    """The message for a Python older than MIN_PYTHON, else None."""
    if tuple(version[:2]) >= MIN_PYTHON:
        return None
    need = ".".join(map(str, MIN_PYTHON))
    have = ".".join(map(str, version))
    return (
        f"error: python -m repro needs Python >= {need}; this is Python {have} ({sys.executable}).\n"
        f"  fix: run it with Python {need} to 3.11, e.g. `make repro PYTHON=python3.11`"
    )


def _run() -> int:
    problem = python_too_old()
    if problem is not None:
        print(problem, file=sys.stderr)
        return PYTHON_VERSION_EXIT
    from repro.cli.main import main

    return main()


if __name__ == "__main__":
    sys.exit(_run())
