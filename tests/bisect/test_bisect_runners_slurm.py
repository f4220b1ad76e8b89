"""PARALLEL=k as a real Slurm array job (slurm tier; .ci/start-slurm.sh starts slurmctld and slurmd
on localhost): two probes a round, each a child `probe` process, one of which dies without
probe.json. Local rounds, and the Slurm runner with sbatch faked, are tests/bisect/test_bisect_runners.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from repro.bisect import rounds
from tests.fixtures.bisect_rounds import (
    ENTRY,
    cores,  # noqa: F401 - a fixture (autouse)
    ds,  # noqa: F401 - a fixture
    run_parallel,
)
from tests.fixtures.ds_git import FakeDeepSpeed


def slurm_answers() -> bool:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.slurm
def test_slurm_rounds_for_real(tmp_path: Path, ds: FakeDeepSpeed) -> None:  # noqa: F811
    """Two probes a round as a real Slurm array job (.ci/start-slurm.sh: slurmctld + slurmd on
    localhost); one probe dies without probe.json there (a failed task): unknown, stepped around."""
    if not slurm_answers():
        pytest.skip("no Slurm controller answers (run .ci/start-slurm.sh)")
    os.environ["MICS_TEST_DIE_FOR"] = ds.shas["later"][:7]
    try:

        def make(**kw: Any) -> rounds.RoundRunner:
            command = rounds.ProbeCommand(python=sys.executable, module=ENTRY)
            return rounds.Slurm(
                kw["invocation"].folder, command, 2, rounds.SlurmOptions(time_limit="0:10:00")
            )

        data, _ = run_parallel(tmp_path, ds, make, [])
    finally:
        del os.environ["MICS_TEST_DIE_FOR"]
    assert data["first_bad_commit"]["sha"] == ds.bad
    assert (data["runner"], data["parallel"]) == ("slurm", 2)
    slurm = tmp_path / "out" / "slurm"
    assert data["rounds"] == 3 and len(list(slurm.glob("round-*.sbatch"))) == 3
    # Each round was one array of two tasks, each with its own log (%a: the task id).
    assert sorted(p.name for p in slurm.glob("round-01-*.out")) == ["round-01-0.out", "round-01-1.out"]
    # Rounds: ends; v0.2.0 + repaired; bad + later (the one that dies).
    died = [p for p in data["probes"] if p["version"] == ds.shas["later"][:7]]
    assert died[0]["verdict"] == "unknown" and "Slurm array task" in died[0]["reason"]
