"""Hang by evidence (#34) through the two runners, with stand-in ranks (plain Python, no torch)
that record their collectives as real ranks do and then block: ranks 0,1 in one collective,
ranks 2,3 in another, at the same position of the world group.

Each run is given a 20 s time limit and a 600 s stall limit: before the evidence rule the
runners could only end it with "exceeded the 20 s time limit"; now the reason names the deadlock.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from repro.workload import collectives, runner
from tests.fixtures.job_main import run_gpu_job
from tests.fixtures.runspec import cpu_spec

STANDIN = Path(__file__).parents[1] / "fixtures" / "standin_ranks.py"
REASON = "deadlock: ranks 0,1 in all_reduce and ranks 2,3 in broadcast on group [0,1,2,3] (collective #4"

LAUNCHER = r"""
import subprocess, sys
standin, run_dir, folder = sys.argv[1:4]
procs = [subprocess.Popen([sys.executable, standin, folder, str(r), "4",
                           "all_reduce" if r < 2 else "broadcast", run_dir]) for r in range(4)]
for p in procs:
    p.wait()
"""


def test_the_suite_runner_ends_a_proven_deadlock_as_hung_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None
) -> None:
    def command(spec: runner.RunSpec, port: int) -> list[str]:
        folder = str(Path(spec.run_dir) / collectives.FOLDER)
        return [sys.executable, "-c", LAUNCHER, str(STANDIN), spec.run_dir, folder]

    monkeypatch.setattr(runner, "_command", command)
    spec = cpu_spec(tmp_path, 20.0, 600.0, world_size=4)
    result = runner.launch(spec)
    assert result.status == "hung"
    assert result.hang_detail.startswith(REASON), result.hang_detail
    assert set(result.stacks) == {"0", "1", "2", "3"}
    assert all("blocked_in_collective" in text for text in result.stacks.values())
    time.sleep(0.2)
    assert not [p for p in runner._rank_pids(spec.run_dir) if runner.alive(p)], "a rank outlived the run"
    record, status = runner.assemble(spec, result, {"env": "t", "scenario": "mics-replica"})
    assert status == "hung" and record["reason"].startswith(f"hung: {REASON}")


def test_the_job_runner_ends_a_proven_deadlock_as_hung_with_its_reason(
    tmp_path: Path, real_subprocess: None
) -> None:
    folder = f"$MICS_REPRO_JOB_DIR/{collectives.FOLDER}"
    ranks = " ".join(
        f"{sys.executable} {STANDIN} {folder} {r} 4 {'all_reduce' if r < 2 else 'broadcast'} &"
        for r in range(4)
    )
    result = run_gpu_job(tmp_path, f"{ranks} wait", stall="600", timeout="20")
    assert result["status"] == "hung" and result["survivors"] == []
    assert str(result["hang_detail"]).startswith(REASON), result["hang_detail"]
    assert len(result["stacks"]) == 4  # every stand-in rank's stack, dumped as before
    assert all("blocked_in_collective" in text for text in result["stacks"].values())
