"""`python -m repro`: see repro/cli/main.py.

The Python version is checked before anything else of this package is imported: on an older
Python those imports fail with an unrelated `TypeError: 'ABCMeta' object is not subscriptable`.
So are the packages the tool needs: `make repro PYTHON=/usr/bin/python3.12` runs the interpreter as
it is, and a system Python without them failed with a `ModuleNotFoundError` traceback.
Keep this file importable (and the checks runnable) by Python 3.7+.
"""

from __future__ import annotations

import importlib.util
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


# pyproject.toml's dependencies that every command imports, by their import names. `docker` and
# `matplotlib` are imported where they are used (the Docker engine, the report's plots), so a GPU
# host's own Python can run `python -m repro gpu-check` (venv engine) without them; `rich` is left
# out too: without it the tool prints plain lines (repro/core/progress.py).
HOST_PACKAGES = ("packaging", "jinja2")
# The newest Python every env's torch has wheels for (torch 2.1, the reporter's: 3.8 to 3.11).
NEWEST_FOR_EVERY_ENV = (3, 11)


def missing_packages(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> list[str]:
    """The tool's packages this interpreter cannot import (found without importing them)."""
    wanted = [*HOST_PACKAGES, *(["tomli"] if tuple(version[:2]) < (3, 11) else [])]
    return [name for name in wanted if importlib.util.find_spec(name) is None]


def packages_missing(
    missing: list[str], version: tuple[int, ...] = tuple(sys.version_info[:3])
) -> str | None:
    """The message for an interpreter that lacks the tool's packages, else None: what to install,
    and, on a Python newer than the reporter's torch takes, which Python to install instead."""
    if not missing:
        return None
    have = ".".join(map(str, version))
    newest = ".".join(map(str, NEWEST_FOR_EVERY_ENV))
    lines = [
        f"error: python -m repro needs the packages {', '.join(missing)}, which Python {have} "
        f"({sys.executable}) does not have.",
        "  why: PYTHON= runs the tool with that interpreter as it is; without PYTHON=, make sets up "
        ".venv/ with them itself.",
    ]
    if tuple(version[:2]) > NEWEST_FOR_EVERY_ENV:
        lines.append(
            f"  and: torch 2.1 (the reporter's env, `make repro`'s default) has no wheels for Python {have}: "
            f"a venv of it (ENGINE=venv) needs Python 3.9 to {newest}."
        )
        lines.append(
            f"  fix: install Python {newest} (`uv python install {newest}`, or your distribution's "
            f"python{newest}) and run make without PYTHON= (BOOTSTRAP_PYTHON=python{newest} if python3 "
            f"is not it); or install the packages into this Python: {sys.executable} -m pip install -e ."
        )
    else:
        lines.append(
            "  fix: run make without PYTHON=, or install the packages into this Python: "
            f"{sys.executable} -m pip install -e ."
        )
    return "\n".join(lines)


def _run() -> int:
    problem = python_too_old() or packages_missing(missing_packages())
    if problem is not None:
        print(problem, file=sys.stderr)
        return PYTHON_VERSION_EXIT
    from repro.cli.main import main

    return main()


if __name__ == "__main__":
    sys.exit(_run())
