"""Bootstrap tier: on a fresh machine the two README commands set themselves up.

A new clone of this repository (its committed HEAD) and a bare Python (a new venv with nothing
but pip: no packaging, jinja2, docker or pytest) first on PATH, as on a clean laptop or a
`python:3.11-slim` container. `make repro DRY_RUN=1` must make the project-local .venv/ itself
and print the plan; `make test` must then reuse it and collect every test. Needs git, make and a
reachable package index (PyPI): a minute or two.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bootstrap

REPO_ROOT = Path(__file__).resolve().parents[2]
MISSING_ON_A_BARE_PYTHON = ("packaging", "jinja2", "docker", "pytest")


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    for tool in ("git", "make"):
        if shutil.which(tool) is None:
            pytest.skip(f"`{tool}` is not installed")
    work = tmp_path_factory.mktemp("bootstrap")
    clone = work / "clone"
    done = _run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(clone)], work, dict(os.environ)
    )
    assert done.returncode == 0, done.stdout
    bare = work / "bare"
    base = getattr(sys, "_base_executable", sys.executable)  # not this venv's packages
    done = _run([base, "-m", "venv", str(bare)], work, dict(os.environ))
    if done.returncode != 0 and "ensurepip" in done.stdout:
        pytest.skip(f"this Python cannot make venvs (no ensurepip): {done.stdout.strip()}")
    assert done.returncode == 0, done.stdout
    # The environment of a new shell: the bare Python first on PATH, nothing of ours selected.
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PYTHON",
            "PYTHONPATH",
            "PYTHONHOME",
            "VIRTUAL_ENV",
            "BOOTSTRAP_PYTHON",
            "MAKEFLAGS",
            "MAKELEVEL",
            "MICS_REPRO_REQUIRE_TIERS",
            "PYTEST_ADDOPTS",
        )
    }
    env["PATH"] = f"{bare / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return clone, env


def test_the_python_on_path_is_bare(fresh: tuple[Path, dict[str, str]]) -> None:
    clone, env = fresh
    probe = (
        "import importlib.util as u, sys; print(sys.prefix); "
        "print([m for m in sys.argv[1:] if u.find_spec(m)])"
    )
    # Not from the clone: its docker/ folder would import as a namespace package.
    done = _run(["python3", "-c", probe, *MISSING_ON_A_BARE_PYTHON], clone.parent, env)
    prefix, found = done.stdout.strip().splitlines()
    assert prefix.endswith("bare") and found == "[]", done.stdout


def test_make_repro_then_make_test_set_themselves_up(fresh: tuple[Path, dict[str, str]]) -> None:
    clone, env = fresh
    repro = _run(["make", "repro", "DRY_RUN=1"], clone, env)
    assert repro.returncode == 0, repro.stdout
    assert "setting up the host-side Python in .venv/" in repro.stdout
    assert "dry run" in repro.stdout and "python -m repro.workload.suite" in repro.stdout
    venv_python = clone / ".venv" / "bin" / "python"
    assert venv_python.exists()

    test = _run(["make", "test", "PYTEST_ARGS=--co -q"], clone, env)
    assert test.returncode == 0, test.stdout
    assert "setting up the host-side Python" not in test.stdout  # reused: pyproject.toml is unchanged
    assert ".venv/bin/python tests/run_tiers.py" in test.stdout  # the clone's own venv runs the tiers
    # every stream collected (pytest exits 0 only then): the unit tier, the other real tiers and
    # the side stream, whose output follows theirs
    assert test.stdout.count("tests collected") == 3, test.stdout[-3000:]
    assert "end of the side stream: exit status 0" in test.stdout
    status = _run(["git", "status", "--porcelain"], clone, env)
    assert status.stdout == "", "the set-up left files git would see (is .venv/ ignored?)"
