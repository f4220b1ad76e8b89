"""`make build ENV=... DRY_RUN=1` prints the exact pins, build args and run flags."""

from __future__ import annotations

import pytest

from repro.cli import main as cli


def dry(env: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(["build", "--env", env, "--dry-run"]) == 0
    return capsys.readouterr().out


def test_rocm56_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    out = dry("rocm56", capsys)
    assert "torch = 2.1.0" in out and "deepspeed = 0.13.1" in out and "rocm = 5.6" in out
    assert "https://download.pytorch.org/whl/rocm5.6" in out
    assert "docker build -f docker/rocm56.Dockerfile" in out
    for flag in (
        "--device=/dev/kfd",
        "--device=/dev/dri",
        "--ipc=host",
        "--security-opt=seccomp=unconfined",
        "--network none",
    ):
        assert flag in out


def test_cpu_dry_run_has_no_device_flags(capsys: pytest.CaptureFixture[str]) -> None:
    out = dry("cpu", capsys)
    assert "--device" not in out and "--gpus" not in out and "--network none" in out


def test_cuda_dry_run_requests_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--gpus=all" in dry("cuda", capsys)


def test_derived_env_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["build", "--env", "cpu", "--torch", "2.2.2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "derived from cpu" in out and "torch = 2.2.2" in out
