"""`repro --engine docker` and `--engine venv` give the same outcomes for the CPU twin.

Runs the real front door twice: in the CPU twin image (built from docker/cpu.Dockerfile on the
local base, networking off in the container) and in the cached venv. Needs a Docker daemon,
the local base image and the cpu venv (.ci/run provides all three).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repro.engines.docker.engine import daemon_status

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.docker, pytest.mark.integration]
SCENARIO_ARGS = ["--scenarios", "mics,mics-hier", "--steps", "4", "--world-size", "2"]


def repro(engine: str, out: Path) -> list[dict[str, object]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro",
            "repro",
            "--env",
            "cpu",
            "--engine",
            engine,
            "--out",
            str(out),
            *SCENARIO_ARGS,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "verdict:" in done.stdout
    return json.loads((out / "results.json").read_text())["runs"]  # type: ignore[no-any-return]


def test_docker_and_venv_agree(tmp_path: Path) -> None:
    up, why = daemon_status()
    if not up:
        pytest.skip(f"needs a Docker daemon: {why}")
    in_docker = repro("docker", tmp_path / "docker")
    in_venv = repro("venv", tmp_path / "venv")

    def outcomes(runs: list[dict[str, object]]) -> dict[str, tuple[object, object]]:
        return {str(r["run_name"]): (r["outcome"], r["signature"]) for r in runs}

    assert outcomes(in_docker) == outcomes(in_venv)
    assert {o for o, _ in outcomes(in_docker).values()} >= {"reproduced", "clean"}
    # The container really ran the pinned image, with its own versions recorded.
    assert all(r["versions"]["torch"].startswith("2.1.0") for r in in_docker)  # type: ignore[index]
    results = json.loads((tmp_path / "docker" / "results.json").read_text())
    assert results["envs"]["cpu"]["engine"] == "docker" and results["envs"]["cpu"]["image_id"]

    # The two invocations merge into one report whose answers agree with the records.
    from repro.report import build_report

    paths = build_report([tmp_path / "docker", tmp_path / "venv"], tmp_path / "report")
    headline = {h["env"]: h for h in json.loads(paths.data.read_text())["headline"]}
    reproduced = any(r["outcome"] == "reproduced" and r["patch"] == "stock" for r in in_docker + in_venv)
    fixed_clean = all(r["outcome"] == "clean" for r in in_docker + in_venv if r["patch"] == "fixed")
    assert headline["cpu"]["reproduces"] == ("yes" if reproduced else "no")
    assert headline["cpu"]["fixed"] == ("yes" if fixed_clean else "no")
