"""Bad input at the front door: a clear error, a distinct exit code, and nothing left behind."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from repro.cli import main as cli
from repro.core.errors import (
    DeviceUnavailableError,
    DockerUnavailableError,
    Interrupted,
    NothingVerifiedError,
    ReproError,
    SuiteFailedError,
    UnknownEnvError,
    UsageError,
)
from repro.engines import base as engines
from tests.fixtures.stand_in_engine import RefusedEngine, StandInEngine, use_engine, write_suite


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


def test_rocm_env_without_gpu_fails_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class DevicesChecked(RefusedEngine):
        def preflight(self, env: Any) -> None:
            from repro.engines import preflight

            super().preflight(env)
            preflight.check_devices(env)

    engine = use_engine(monkeypatch, DevicesChecked())
    monkeypatch.setattr("os.path.exists", lambda p: False if str(p).startswith("/dev/") else Path(p).exists())
    code = run(["repro", "--env", "rocm56"], tmp_path)
    assert code == DeviceUnavailableError.exit_code, capsys.readouterr().err
    assert "prepare" not in engine.calls and left_behind(tmp_path) == []


def test_dry_run_prints_plan_without_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["repro", "--env", "cpu", "--dry-run"], tmp_path) == 0
    out = capsys.readouterr().out
    assert "torch=2.1.0" in out and "repro.workload.suite" in out
    # README: "print the plan (pins, build args, run flags)"
    assert "docker build -f docker/cpu.Dockerfile" in out and "run flags: --network none" in out
    assert left_behind(tmp_path) == []


def test_rocm_dry_run_names_run_flags_and_held_back_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    assert run(["repro", "--env", "rocm56", "--dry-run"], tmp_path) == 0
    out = capsys.readouterr().out
    assert "--device=/dev/kfd" in out and "NCCL_DEBUG=INFO" in out
    assert "held back (the container has no network): NCCL_SOCKET_IFNAME" in out


# -- numbers are checked at the front door, before any engine or folder ---------------------------
def _refused(flag: str, name: str, allowed: str, *values: str) -> list[tuple[str, str, str, str]]:
    """(flag, value, name, allowed) for each value the flag refuses, naming `allowed`."""
    return [(flag, value, name, allowed) for value in values]


BAD_NUMBERS = [
    *_refused("--steps", "STEPS", ">= 1", "0", "-1"),
    *_refused("--world-size", "WORLD_SIZE", "1 (the control only) or an even number >= 2", "0", "3"),
    *_refused("--world-size", "WORLD_SIZE", "or an even number >= 2", "-2"),
    *_refused("--timeout", "TIMEOUT", "> 0 and finite", "nan", "inf", "0", "-5"),
    *_refused("--stall-timeout", "STALL_TIMEOUT", "> 0 and finite", "nan", "0"),
    *_refused("--jobs", "JOBS", ">= 1", "-3", "0"),
]


@pytest.mark.parametrize("flag,value,name,allowed", BAD_NUMBERS)
@pytest.mark.parametrize("command", ["repro", "check-fix", "build"])
def test_bad_numbers_fail_before_any_build(
    command: str,
    flag: str,
    value: str,
    name: str,
    allowed: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine = use_engine(monkeypatch, RefusedEngine())  # bad numbers fail before preflight
    code = run([command, "--env", "cpu", f"{flag}={value}"], tmp_path)
    err = capsys.readouterr().err
    assert code == UsageError.exit_code, err
    assert f"{name}={value}" in err or f"{name}={float(value)}" in err
    assert allowed in err  # the message names the allowed range
    assert engine.calls == [] and left_behind(tmp_path) == []


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--world-size", "4"),
        ("--world-size", "2"),
        ("--world-size", "1"),
        ("--steps", "1"),
        ("--timeout", "0.5"),
        ("--jobs", "1"),
    ],
)
def test_numbers_the_suite_accepts_pass_the_front_door(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["repro", "--env", "cpu", flag, value, "--dry-run"], tmp_path) == 0
    assert f"{flag} {value}" in capsys.readouterr().out  # handed to the suite as given


# -- a suite that did not run its plan ends `make repro` non-zero ---------------------------------
# What the suite plans for `make repro` on the cpu env without overrides (README "Scenarios"):
# the control, each MiCS scenario stock and fixed, and the sync-transport proof; all fp32.
MICS_RUNS = [(s, p) for s in ("mics", "mics-hier", "mics-replica") for p in ("stock", "fixed")]
CPU_PLAN = [
    ("zero3", "stock", "async", "fp32"),
    *((s, p, "async", "fp32") for s, p in MICS_RUNS),
    ("mics", "stock", "sync", "fp32"),
]
# The same on a GPU env: the native backend and the reporter's fp16; no sync proof.
GPU_PLAN = [("zero3", "stock", "native", "fp16"), *((s, p, "native", "fp16") for s, p in MICS_RUNS)]


class SuiteEngine(StandInEngine):
    """Runs a scripted 'suite': writes a record for each of `keys` (scenario, patch, transport,
    dtype) to suite.json and exits with `code`."""

    name = "scripted suite"

    def __init__(
        self,
        code: int,
        keys: list[tuple[str, str, str, str]],
        timed_out: bool = False,
        outcome: str = "clean",
    ) -> None:
        self.code, self.keys, self.timed_out, self.outcome = code, keys, timed_out, outcome

    def run_suite(self, prepared: Any, args: Any, out_dir: Path, timeout_s: float) -> engines.SuiteRun:
        runs = [(f"run{i}", key) for i, key in enumerate(self.keys)]
        write_suite(out_dir, prepared.env_id, runs, self.outcome)
        return engines.SuiteRun(self.code, self.timed_out, 0.1, out_dir, None)


@pytest.mark.parametrize(
    "code,runs,timed_out,why",
    [
        (2, 0, False, "exited with 2"),  # e.g. the suite rejected its arguments
        (1, 3, False, "exited with 1"),  # a crash after some records
        (124, 2, True, "time limit"),
        (0, 0, False, "no run"),
        (0, 7, False, "no record for 1 planned run(s): mics/stock/sync/fp32"),  # exit 0, one lost
    ],
)
def test_an_incomplete_suite_is_a_suite_failure(
    code: int,
    runs: int,
    timed_out: bool,
    why: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine = SuiteEngine(code, CPU_PLAN[:runs], timed_out)
    monkeypatch.setattr("repro.cli.run_commands._engine", lambda choice: engine)
    out = tmp_path / "out"
    assert run(["repro", "--env", "cpu", "--out", str(out)], tmp_path) == SuiteFailedError.exit_code
    assert why in capsys.readouterr().err
    assert (out / "results.json").is_file()  # what ran is kept


def test_a_complete_suite_exits_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("repro.cli.run_commands._engine", lambda choice: SuiteEngine(0, CPU_PLAN))
    assert run(["repro", "--env", "cpu", "--out", str(tmp_path / "out")], tmp_path) == 0


def test_records_of_other_runs_do_not_stand_in_for_planned_ones(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As many records as planned runs, but one planned run (mics-hier fixed) has none: a control
    recorded twice does not make up for it."""
    keys = [key for key in CPU_PLAN if key[:2] != ("mics-hier", "fixed")] + [CPU_PLAN[0]]
    monkeypatch.setattr("repro.cli.run_commands._engine", lambda choice: SuiteEngine(0, keys))
    code = run(["repro", "--env", "cpu", "--out", str(tmp_path / "out")], tmp_path)
    assert code == SuiteFailedError.exit_code
    assert "no record for 1 planned run(s): mics-hier/fixed/async/fp32" in capsys.readouterr().err


@pytest.mark.parametrize("dropped", [None, ("mics-replica", "fixed", "native", "fp16")])
def test_gpu_env_runs_recorded_unsupported_count_as_recorded(
    dropped: tuple[str, str, str, str] | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On a GPU host with too few GPUs the suite records every planned run, those it cannot lay
    out as `unsupported` (native backend, fp16 by default): nothing is missing. One without a
    record is a suite failure."""
    keys = [key for key in GPU_PLAN if key != dropped]
    engine = SuiteEngine(0, keys, outcome="unsupported")
    monkeypatch.setattr("repro.cli.run_commands._engine", lambda choice: engine)
    code = run(["repro", "--env", "rocm56", "--out", str(tmp_path / "out")], tmp_path)
    err = capsys.readouterr().err
    if dropped is None:
        assert code != SuiteFailedError.exit_code and "no record for" not in err
    else:
        assert code == SuiteFailedError.exit_code
        assert "no record for 1 planned run(s): mics-replica/fixed/native/fp16" in err


# -- exit codes --------------------------------------------------------------------------------
def test_exit_codes_are_distinct_per_kind() -> None:
    kinds = {
        "usage": UsageError,
        "env": DockerUnavailableError,
        "suite": SuiteFailedError,
        "nothing verified": NothingVerifiedError,
        "interrupted": Interrupted,
    }
    codes = {name: cls.exit_code for name, cls in kinds.items()}
    assert len(set(codes.values())) == len(codes), codes
    assert codes["interrupted"] == 130 and 0 not in codes.values()


def test_docs_document_every_exit_code() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "options.md").read_text()
    table = readme[readme.index("## Exit codes") :]
    table = table[: table.index("\n## ", 3)] if "\n## " in table[3:] else table
    documented = {int(m) for m in re.findall(r"^\|\s*`?(\d+)", table, re.M)}
    import repro.core.errors as errors_module

    codes = {
        cls.exit_code
        for cls in vars(errors_module).values()
        if isinstance(cls, type) and issubclass(cls, ReproError)
    }
    assert codes <= documented, sorted(codes - documented)
    assert {0, 1, 2, 125, 128, 130} <= documented


def test_options_argparse_rejects_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["repro", "--steps", "many"]) == UsageError.exit_code
    assert "--steps" in capsys.readouterr().err
    assert cli.main(["no-such-command"]) == UsageError.exit_code


@pytest.mark.parametrize(
    "argv",
    [
        ["probe", "--bad-if", "sometimes"],  # an invalid choice (argparse)
        ["probe", "--no-such-option"],  # an unknown option (argparse, top-level parser)
        ["probe", "--steps", "many"],  # a value of the wrong type
        ["probe", "--bad-if", "differs"],  # a bad combination (the tool's own UsageError)
    ],
)
def test_probe_option_errors_exit_128_so_git_bisect_stops(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # `git bisect run` reads 1-127 (2 included) as bad or skip; 128 and above stop it.
    assert cli.main(argv) == 128
    assert "error" in capsys.readouterr().err


def test_interrupt_exits_130(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def interrupted(choice: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr("repro.cli.run_commands._engine", interrupted)
    assert run(["repro", "--env", "cpu"], tmp_path) == 130


def test_python_m_repro_is_the_front_door(tmp_path: Path, real_subprocess: None) -> None:
    """Through a real `python -m repro`: a bad number exits with the usage code and no traceback."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "repro", "repro", "--world-size", "3", "--results-root", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == UsageError.exit_code, proc.stderr
    assert "WORLD_SIZE=3" in proc.stderr and "Traceback" not in proc.stderr


def test_guard_refuses_fc_list_as_a_missing_program() -> None:
    # matplotlib's first use with an empty MPLCONFIGDIR runs `fc-list` and falls back when it is
    # missing; the default tier's guard must look like that, not like a failed assertion.
    with pytest.raises(FileNotFoundError):
        subprocess.Popen(["fc-list", "--format=%{file}\\n"])
    with pytest.raises(AssertionError):
        subprocess.Popen(["ls"])
