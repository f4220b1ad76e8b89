"""`repro --engine docker` and `--engine venv` give the same outcomes for the CPU twin.

Runs the real front door twice: in the CPU twin image (built from docker/cpu.Dockerfile on the
local base, networking off in the container; the session's shared run,
tests/fixtures/docker_repro.py) and in the cached venv. Needs a Docker daemon,
the local base image and the cpu venv (.ci/run provides all three).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.docker_repro import repro_cpu

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def test_docker_and_venv_agree(docker_cpu_repro: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    docker_out, in_docker = docker_cpu_repro
    in_venv = repro_cpu("venv", tmp_path / "venv")

    def outcomes(runs: list[dict[str, object]]) -> dict[str, tuple[object, object]]:
        return {str(r["run_name"]): (r["outcome"], r["signature"]) for r in runs}

    assert outcomes(in_docker) == outcomes(in_venv)
    assert {o for o, _ in outcomes(in_docker).values()} >= {"reproduced", "clean"}
    # The container really ran the pinned image, with its own versions recorded.
    assert all(r["versions"]["torch"].startswith("2.1.0") for r in in_docker)
    results = json.loads((docker_out / "results.json").read_text())
    assert results["envs"]["cpu"]["engine"] == "docker" and results["envs"]["cpu"]["image_id"]

    # The two invocations merge into one report whose answers agree with the records.
    from repro.report import build_report

    paths = build_report([docker_out, tmp_path / "venv"], tmp_path / "report")
    headline = {h["env"]: h for h in json.loads(paths.data.read_text())["headline"]}
    reproduced = any(r["outcome"] == "reproduced" and r["patch"] == "stock" for r in in_docker + in_venv)
    fixed_clean = all(r["outcome"] == "clean" for r in in_docker + in_venv if r["patch"] == "fixed")
    assert headline["cpu"]["reproduces"] == ("yes" if reproduced else "no")
    assert headline["cpu"]["fixed"] == ("yes" if fixed_clean else "no")
