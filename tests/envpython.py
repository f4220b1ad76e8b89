"""Which interpreter an integration test runs an env in.

Order: the variable MICS_TEST_PYTHON_<ENV> (e.g. MICS_TEST_PYTHON_CPU_LATEST), then the venv
engine's cached venv for that env if it is already built (CI builds them in .ci/run). Otherwise
the test is skipped with the command that builds the venv.

Also the interpreters named by a variable of their own: a module's torch venv (`cpu_python`,
default the cpu env's venv) and a dev venv the shipped patch is applied in (`patching_python`).
"""

from __future__ import annotations

import os
import shutil
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


def cpu_python(var: str, what: str) -> tuple[str, list[pytest.MarkDecorator]]:
    """The interpreter `var` names (default: the venv engine's venv of the cpu env, torch 2.1 +
    DeepSpeed 0.13.1, when it is built) and a module's marks for it: the integration tier, skipped
    without it (`what`: what the module needs)."""
    python = os.environ.get(var, cached_env_python("cpu") or "")
    why = f"no {what} at {python!r}: set {var} or run `python -m repro venv-python --env cpu`"
    return python, [pytest.mark.integration, pytest.mark.skipif(not os.path.exists(python), reason=why)]


def patching_python(var: str, version: str) -> str:
    """The python of the dev venv `var` names (torch + DeepSpeed `version`), where GNU patch can
    apply the shipped patch; else the test is skipped."""
    python = os.environ.get(var)
    if not python or not Path(python).is_file():
        pytest.skip(f"{var} is not set to an existing python (dev venv with torch + DeepSpeed {version})")
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed (apt-get install patch)")
    return python
