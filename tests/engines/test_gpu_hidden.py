"""Issue 33 item 2: an empty HIP_VISIBLE_DEVICES did not hide AMD GPUs on ROCm 5.2 (ROCm/hip#3001),
an empty ROCR_VISIBLE_DEVICES did. Every place that hides the GPUs hides them with all three
variables, taken from one constant (repro.workload.device.HIDE_GPUS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from repro.core import cmd
from repro.engines.docker import joblayer as docker_joblayer
from repro.engines.docker.dockerfiles import render
from repro.matrix.schema import load_matrix
from repro.run import gpu_check_device
from repro.workload import job, runner
from repro.workload.device import HIDE_GPUS, hide_gpus_env

REPO = Path(__file__).resolve().parents[2]
ALL_HIDDEN = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}


def test_the_constant_hides_with_rocr_too() -> None:
    assert dict(HIDE_GPUS) == ALL_HIDDEN
    fresh = hide_gpus_env()
    fresh["ROCR_VISIBLE_DEVICES"] = "0"  # a caller's copy, never the constant
    assert hide_gpus_env() == ALL_HIDDEN


def test_cpu_runs_hide_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "0,1")  # the host's selection must not leak in
    env = runner.base_env("cpu")
    assert {k: env[k] for k in ALL_HIDDEN} == ALL_HIDDEN
    gpu = runner.base_env("gpu")
    assert gpu["ROCR_VISIBLE_DEVICES"] == "0,1"  # GPU runs keep the host's selection


def test_cpu_jobs_hide_every_gpu() -> None:
    env = job.hook_environment(
        {"ROCR_VISIBLE_DEVICES": "3"},
        patch="stock",
        device="cpu",
        transport="native",
        job_dir=None,
        user_pythonpath=None,
    )
    assert {k: env[k] for k in ALL_HIDDEN} == ALL_HIDDEN


@pytest.mark.parametrize("env_id", ["rocm56", "cuda", "cpu"])
def test_deepspeed_install_step_and_dockerfile_hide_with_rocr(env_id: str) -> None:
    env = load_matrix().get(env_id)
    step = next(s for s in env.install_steps() if s.name == "deepspeed")
    assert dict(step.environment) == {"DS_BUILD_OPS": "0", **ALL_HIDDEN}
    text = render(env)
    ds_line = next(line for line in text.splitlines() if "DS_BUILD_OPS=0" in line and line.startswith("RUN"))
    assert "ROCR_VISIBLE_DEVICES=''" in ds_line and "HIP_VISIBLE_DEVICES=''" in ds_line
    # The committed Dockerfile is the generated one (`python -m repro dockerfiles --check`).
    assert (REPO / "docker" / f"{env_id}.Dockerfile").read_text() == text


def test_job_layer_dockerfile_hides_with_rocr() -> None:
    text = docker_joblayer.dockerfile("mics-repro:rocm56-x")
    install = next(line for line in text.splitlines() if "pip install" in line)
    for name in ALL_HIDDEN:
        assert f"{name}=''" in install


def test_gpu_check_hidden_step_hides_with_rocr(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, str] | None] = []

    def fake_run(argv: Any, **kwargs: Any) -> cmd.CmdResult:
        seen.append(kwargs.get("extra_env"))
        return cmd.CmdResult(tuple(argv), 0)

    monkeypatch.setattr(cmd, "run", fake_run)
    device = gpu_check_device.HostDevice.__new__(gpu_check_device.HostDevice)
    assert device.cli(["check-fix"], hide_gpus=True, timeout_s=1) == 0
    assert seen == [ALL_HIDDEN]


def test_cluster_cpu_runs_hide_with_rocr() -> None:
    template = (REPO / "repro" / "upstream" / "templates" / "cluster" / "launch-node.sh.j2").read_text()
    cpu_line = next(line for line in template.splitlines() if '"DS_ACCELERATOR=cpu"' in line)
    for name in ALL_HIDDEN:
        assert f'"{name}="' in cpu_line
