"""Which interpreter an integration test runs an env in.

Order: the variable MICS_TEST_PYTHON_<ENV> (e.g. MICS_TEST_PYTHON_CPU_LATEST), then the venv
engine's cached venv for that env if it is already built (CI builds them in .ci/run). Otherwise
the test is skipped with the command that builds the venv.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def env_python(env_id: str) -> str:
    var = "MICS_TEST_PYTHON_" + env_id.upper().replace("-", "_").replace("+", "_").replace(".", "_")
    given = os.environ.get(var)
    if given:
        if not Path(given).exists():
            pytest.fail(f"{var}={given} does not exist")
        return given
    python = cached_env_python(env_id)
    if python:
        return python
    pytest.skip(f"no venv for env {env_id}: run `python -m repro venv-python --env {env_id}` or set {var}")


def cached_env_python(env_id: str) -> str | None:
    """The venv engine's finished venv for env_id on this machine, or None (nothing is built)."""
    from repro.engines.venv.engine import MARKER, VenvEngine
    from repro.matrix.schema import load_matrix

    venv = VenvEngine().venv_dir(load_matrix().get(env_id))
    python = venv / "bin" / "python"
    # Only a finished venv has the marker (it is written as the last install step).
    if python.exists() and (venv / MARKER).exists():
        return str(python)
    return None
