"""Small guards of the host side: the Python version check that runs before any import, and the
engine-level time guard that follows the planned number of runs."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repro import __main__ as entry
from repro.core.errors import PythonVersionError
from repro.run.orchestrate import _ENGINE_SLACK_S, Request, planned_runs
from repro.workload import suite
from repro.workload.record import CPU_TRANSPORTS, PATCHES, SCENARIOS

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_old_python_gets_a_message_not_a_traceback() -> None:
    message = entry.python_too_old((3, 8, 18))
    assert message is not None and "needs Python >= 3.9" in message and "3.8.18" in message
    assert entry.python_too_old((3, 9, 0)) is None and entry.python_too_old((3, 11, 7)) is None
    assert entry.PYTHON_VERSION_EXIT == PythonVersionError.exit_code


def _python(names: tuple[str, ...], pyenv_versions: str) -> str | None:
    """The first of `names` on PATH that runs, else a pyenv Python whose version matches the glob
    `pyenv_versions`, if this machine has one."""
    for name in names:
        found = shutil.which(name)
        if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
            return found
    pyenv = Path.home() / ".pyenv" / "versions"
    for path in sorted(pyenv.glob(f"{pyenv_versions}/bin/python3")) if pyenv.is_dir() else []:
        return str(path)
    return None


def _old_python() -> str | None:
    return _python(("python3.8", "python3.7"), "3.[78].*")


def test_python_38_through_the_front_door(real_subprocess: None) -> None:
    old = _old_python()
    if old is None:
        pytest.skip("no Python 3.7/3.8 on this machine (the message itself is tested above)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [old, "-m", "repro", "list"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == PythonVersionError.exit_code, done.stderr
    assert "needs Python >= 3.9" in done.stderr and "Traceback" not in done.stderr


# Issue #45 item 3: `make repro DRY_RUN=1 PYTHON=<a system Python 3.12>` ran the tool with an
# interpreter that lacks its packages: a ModuleNotFoundError traceback. `-S` (no site-packages)
# makes any interpreter that bare, whatever this machine has installed into it.
def test_an_interpreter_without_the_tools_packages_gets_a_message_not_a_traceback() -> None:
    message = entry.packages_missing(["packaging", "jinja2"], (3, 12, 1))
    assert message is not None
    assert "needs the packages packaging, jinja2" in message and "Python 3.12.1" in message
    assert "torch 2.1" in message and "install Python 3.11" in message and "-m pip install -e ." in message
    older = entry.packages_missing(["packaging"], (3, 10, 4))
    assert older is not None and "install Python" not in older and "without PYTHON=" in older
    assert entry.packages_missing([], (3, 12, 1)) is None
    assert entry.missing_packages() == []  # the interpreter running the tests has them all


def _newer_python() -> str | None:
    """A CPython newer than torch 2.1 takes (3.12+), if this machine has one."""
    return _python(("python3.13", "python3.12"), "3.1[2-9].*")


def _make_repro_dry_run(python: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MAKEFLAGS", "MAKELEVEL")}
    return subprocess.run(
        ["make", "--no-print-directory", "repro", "DRY_RUN=1", f"PYTHON={python} -S"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_make_repro_dry_run_with_a_bare_python_says_what_to_install(real_subprocess: None) -> None:
    """The interpreter running the tests, made bare by -S: every machine has one, so this runs on
    a new CI machine too (the 3.12 case below needs a Python this machine may not have)."""
    done = _make_repro_dry_run(sys.executable)
    assert "Traceback" not in done.stderr, done.stderr
    assert f"Error {PythonVersionError.exit_code}" in done.stderr, done.stderr
    assert "needs the packages packaging" in done.stderr and "-m pip install -e ." in done.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_make_repro_dry_run_with_a_bare_python_312_says_what_to_install(real_subprocess: None) -> None:
    newer = _newer_python()
    if newer is None:
        pytest.skip("no Python 3.12+ on this machine (the message itself is tested above)")
    done = _make_repro_dry_run(newer)
    assert "Traceback" not in done.stderr, done.stderr
    assert f"Error {PythonVersionError.exit_code}" in done.stderr, done.stderr
    assert "needs the packages packaging" in done.stderr and "install Python 3.11" in done.stderr


def _subsets(items: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [c for n in range(1, len(items) + 1) for c in itertools.combinations(items, n)]


@pytest.mark.parametrize("sync_proof", [True, False])
def test_engine_time_guard_counts_the_runs_the_suite_plans(sync_proof: bool) -> None:
    scenarios = tuple(str(s) for s in SCENARIOS)
    for chosen, patches, transports in itertools.product(
        _subsets(scenarios),
        _subsets(tuple(str(p) for p in PATCHES)),
        _subsets(tuple(str(t) for t in CPU_TRANSPORTS)),
    ):
        request = Request(
            env_ids=("cpu",), scenarios=chosen, patches=patches, transports=transports, sync_proof=sync_proof
        )
        planned = suite.plan(list(chosen), list(patches), "fp32", list(transports), 4, sync_proof=sync_proof)
        assert planned_runs(request) == len(planned), (chosen, patches, transports)


def test_plain_gloo_alone_gets_no_sync_proof() -> None:
    # the sync proof is an adapter run: beside plain gloo only it would prove nothing about plain
    plain = [
        (r.scenario, r.patch, r.transport)
        for r in suite.plan(["mics"], ["stock", "fixed"], "fp32", ["plain"], 4, True)
    ]
    assert plain == [("zero3", "stock", "plain"), ("mics", "stock", "plain"), ("mics", "fixed", "plain")]
    both = suite.plan(["mics"], ["stock"], "fp32", ["plain", "async"], 4, True)
    assert [(r.scenario, r.transport) for r in both][-1] == ("mics", "sync")
    assert Request(env_ids=("cpu",), transports=("plain",)).transports == ("plain",)


def test_engine_time_guard_grows_with_the_plan() -> None:
    from repro.matrix.schema import load_matrix
    from repro.run import orchestrate

    every = Request(env_ids=("cpu",), transports=("async", "sync", "strict"), timeout_s=100.0)
    (step,) = orchestrate.plan(load_matrix(), every)
    assert planned_runs(every) > 9  # more than the 9 the old fixed guard assumed
    assert step.timeout_s == 100.0 * planned_runs(every) + _ENGINE_SLACK_S
