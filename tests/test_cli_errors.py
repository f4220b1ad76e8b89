"""Bad input at the front door: a clear error, a distinct exit code, and nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.cli import main as cli
from repro.core.errors import DeviceUnavailableError, DockerUnavailableError, UnknownEnvError
from repro.engines import base as engines


def run(args: list[str], tmp_path: Path) -> int:
    return cli.main([*args, "--results-root", str(tmp_path / "results")])


def left_behind(tmp_path: Path) -> list[Path]:
    root = tmp_path / "results"
    return list(root.rglob("*")) if root.exists() else []


def test_unknown_env_suggests_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run(["repro", "--env", "rocm65"], tmp_path)
    err = capsys.readouterr().err
    assert code == UnknownEnvError.exit_code
    assert "rocm56" in err and "rocm64" in err  # lists valid ids and suggests close ones
    assert left_behind(tmp_path) == []


def test_bad_scenario_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["repro", "--scenarios", "mics,nope"], tmp_path) == 2
    assert "SCENARIOS" in capsys.readouterr().err
    assert left_behind(tmp_path) == []


def test_bad_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "c.json"
    bad.write_text("{ not json")
    assert run(["repro", "--config", str(bad)], tmp_path) == 5
    assert "not valid JSON" in capsys.readouterr().err
    assert left_behind(tmp_path) == []


def test_docker_without_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_daemon(*a: object, **k: object) -> object:
        raise DockerUnavailableError("no Docker daemon answers", fix="start dockerd or use ENGINE=venv")
    import repro.engines.docker.engine as engine_docker
    monkeypatch.setattr(engine_docker.DockerEngine, "connect", classmethod(lambda cls, **k: no_daemon()))
    assert run(["repro", "--engine", "docker"], tmp_path) == DockerUnavailableError.exit_code
    assert left_behind(tmp_path) == []


def test_rocm_env_without_gpu_fails_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    built: list[str] = []

    class FakeEngine:
        kind = engines.EngineKind.VENV

        def describe(self) -> str:
            return "fake"

        def preflight(self, env: object) -> None:
            from repro.engines import preflight
            preflight.check_devices(env)  # type: ignore[arg-type]

        def prepare(self, env: object) -> object:
            built.append("prepared")
            raise AssertionError("must not prepare")

    monkeypatch.setattr("repro.cli.run_commands._engine", lambda args: FakeEngine())
    monkeypatch.setattr("os.path.exists", lambda p: False if str(p).startswith("/dev/") else Path(p).exists())
    code = run(["repro", "--env", "rocm56"], tmp_path)
    assert code == DeviceUnavailableError.exit_code, capsys.readouterr().err
    assert built == [] and left_behind(tmp_path) == []


def test_dry_run_prints_plan_without_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["repro", "--env", "cpu", "--dry-run"], tmp_path) == 0
    out = capsys.readouterr().out
    assert "torch=2.1.0" in out and "repro.workload.suite" in out
    assert left_behind(tmp_path) == []
