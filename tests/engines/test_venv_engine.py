"""Integration tier: the venv engine builds a real venv (real pip, torch, DeepSpeed) and runs in it.

The env comes from MICS_REPRO_TEST_VENV_ENV (default `cpu-latest`: torch 2.13 CPU, about 1 GB).
Installs run offline from the wheelhouse (MICS_REPRO_CACHE/wheelhouse), which proves it holds
everything the env needs; the test skips, saying what to run, when it does not. The venv is built
in a temporary cache so the build itself is what is tested (a minute or two).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from repro.core.errors import PythonVersionError
from repro.engines import preflight
from repro.engines.base import Prepared
from repro.engines.venv.engine import VenvEngine, VenvMarker
from repro.engines.wheelhouse import DownloadPlan, Wheelhouse
from repro.matrix.model import Env
from repro.matrix.schema import load_matrix

pytestmark = pytest.mark.integration

STAND_IN_SUITE = """import json, os, sys, time
args = sys.argv[1:]
out = args[args.index("--out") + 1]
os.makedirs(out, exist_ok=True)
if "--hang-at-once" in args:  # the timeout's test: no torch import to wait for
    open(os.path.join(out, "suite.json"), "w").write("{}")
    time.sleep(3600)
import torch, deepspeed
with open(os.path.join(out, "suite.json"), "w") as f:
    json.dump({"runs": [], "torch": torch.__version__, "deepspeed": deepspeed.__version__,
               "executable": sys.executable}, f)
print("stand-in suite done", flush=True)
"""


@pytest.fixture(scope="module")
def env() -> Env:
    env_id = os.environ.get("MICS_REPRO_TEST_VENV_ENV", "cpu-latest")
    chosen = load_matrix().get(env_id)
    missing = Wheelhouse(offline=True).missing(DownloadPlan.for_env(chosen))
    if missing:
        pytest.skip(
            f"the wheelhouse lacks {', '.join(missing)} for env {env_id}: fill it first "
            f"(python -m repro build ENV={env_id} ENGINE=venv, or Wheelhouse().ensure(env))"
        )
    return chosen


@pytest.fixture(scope="module")
def built(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VenvEngine, Prepared]]:
    repo = tmp_path_factory.mktemp("repo")
    (repo / "repro" / "workload").mkdir(parents=True)
    (repo / "repro" / "__init__.py").write_text("")
    (repo / "repro" / "workload" / "__init__.py").write_text("")
    (repo / "repro" / "workload" / "suite.py").write_text(STAND_IN_SUITE)
    engine = VenvEngine(
        root=tmp_path_factory.mktemp("venvs"), wheelhouse=Wheelhouse(offline=True), repo_root=repo
    )
    try:
        engine.preflight(env)
    except PythonVersionError as exc:
        pytest.skip(f"this host's Python cannot build env {env.id}: {exc.what}")
    yield engine, engine.prepare(env)


def test_built_venv_has_the_marker_and_is_reused(env: Env, built: tuple[VenvEngine, Prepared]) -> None:
    engine, prepared = built
    assert not prepared.reused
    marker = VenvMarker.read(Path(prepared.handle))
    assert marker is not None and dict(marker.pins) == env.pins()
    assert engine.prepare(env).reused


def test_console_scripts_survive_the_rename(built: tuple[VenvEngine, Prepared]) -> None:
    _engine, prepared = built
    torchrun = Path(prepared.handle) / "bin" / "torchrun"
    assert torchrun.read_text().splitlines()[0] == f"#!{prepared.handle}/bin/python"
    result = subprocess.run([str(torchrun), "--help"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_suite_runs_with_the_pinned_packages(
    env: Env, built: tuple[VenvEngine, Prepared], tmp_path: Path
) -> None:
    engine, prepared = built
    run = engine.run_suite(prepared, ["--env", env.id], tmp_path / "out", timeout_s=600)
    assert run.exit_code == 0 and not run.timed_out
    suite = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert suite["torch"].split("+")[0] == env.torch and suite["deepspeed"] == env.deepspeed
    assert suite["executable"] == f"{prepared.handle}/bin/python"
    assert "stand-in suite done" in (tmp_path / "out" / "engine.log").read_text()


def test_hung_suite_is_a_timed_out_result(built: tuple[VenvEngine, Prepared], tmp_path: Path) -> None:
    engine, prepared = built
    # 10 s: enough for a bare Python to start and write its file on a loaded host; the stand-in
    # hangs before it imports anything.
    run = engine.run_suite(prepared, ["--hang-at-once"], tmp_path / "out", timeout_s=10)
    assert run.timed_out and run.exit_code == 124
    assert (tmp_path / "out" / "suite.json").exists()


def test_python_table_agrees_with_the_built_venv(env: Env, built: tuple[VenvEngine, Prepared]) -> None:
    _engine, prepared = built
    probe = "import sys; print(sys.version.split()[0])"
    version = subprocess.run(
        [f"{prepared.handle}/bin/python", "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    preflight.check_python(env, version, prepared.handle)  # a venv that built must pass the table
