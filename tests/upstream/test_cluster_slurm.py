"""The CPU twin's batch script through a real `sbatch` (slurm tier, and integration: it runs the
dev venv's torch 2.1 + DeepSpeed 0.13.1, MICS_TEST_PYTHON_T21). Needs a Slurm controller and node
on this host: CI starts one (.ci/start-slurm.sh). The launchers' contents and logic with
stand-ins are tests/upstream/test_cluster.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from repro.upstream.cluster import scripts as cluster
from tests.fixtures.cluster_twin import twin_env, venv_python, written


@pytest.mark.integration
@pytest.mark.slurm  # and the slurm tier: CI requires a Slurm controller for it
def test_cpu_twin_through_a_real_sbatch(tmp_path: Path) -> None:
    """Needs a Slurm controller and node on this host: CI starts one (.ci/start-slurm.sh)."""
    python = venv_python()
    if shutil.which("sbatch") is None or subprocess.run(["sinfo", "-h"], capture_output=True).returncode:
        pytest.skip("no Slurm cluster answers here (sbatch/sinfo)")
    out = written(tmp_path, cluster.CPU_TWIN, "cpu")
    env = twin_env(python, out)
    env.update(RESULTS=str(tmp_path / "results"), RUNS="mics-hier-stock mics-hier-fixed")
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--wait",
            f"--chdir={out.parent}",
            "--export=ALL",
            str(out / "mics-cpu-twin.sbatch"),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = proc.stdout.strip().split(";")[0]
    log = out.parent / f"mics-repro-{job}.out"
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    rows = {r["run"]: r for r in summary}
    assert rows["mics-hier-stock"]["exit_code"] != "0", log.read_text() if log.exists() else summary
    assert rows["mics-hier-fixed"]["exit_code"] == "0" and rows["mics-hier-fixed"]["non_finite_losses"] == 0
