"""RESUME=1 reruns runs, not envs (issue 22 item 7): which runs of an unfinished suite are kept
and which run again (a control that runs again takes the runs judged against it along), the
records merged into the same results.json and the env verdict recomputed over them; after a
SIGKILL (`finished_at: null`) too. `make run` the same: only its unfinished stock/fixed run.

The suite runs for real (repro.workload.suite, in process) with torchrun replaced by a stand-in
that writes the per-rank records a real run writes, as tests/run/test_suite_schedule.py does.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.core.verdict import FixVerdict, Reproduces, env_verdicts
from repro.engines.base import Prepared, SuiteRun
from repro.workload import resume, runner, suite
from tests.fixtures.fake_job import VenvJobEngine, argv_value
from tests.fixtures.prefork import FakePreforkServer
from tests.fixtures.runspec import LaunchStandIn, write_fake_ranks
from tests.fixtures.stand_in_engine import StandInEngine, killed_during, use_engine

# ---- which runs are kept (pure) ---------------------------------------------------------------------


def _key(scenario: str, patch: str, transport: str = "async") -> resume.RunKey:
    return resume.RunKey(scenario, patch, transport, "fp32", 2)


def _rec(
    key: resume.RunKey, outcome: str = "clean", control: str | None = "zero3-stock-fp32-async-w2"
) -> Any:
    return {
        "scenario": key.scenario,
        "patch": key.patch,
        "transport": key.transport,
        "dtype": key.dtype,
        "world_size": key.world_size,
        "run_name": key.run_name,
        "outcome": outcome,
        "control_run": None if key.is_control else control,
    }


PLAN = [
    _key("zero3", "stock"),
    _key("mics", "stock"),
    _key("mics", "fixed"),
    _key("mics-hier", "stock"),
    _key("mics", "stock", "sync"),  # the sync proof: judged against the async control
]


def test_finished_runs_are_kept_and_interrupted_or_missing_ones_run_again() -> None:
    previous = [_rec(PLAN[0]), _rec(PLAN[1], "reproduced"), _rec(PLAN[2], "interrupted"), _rec(PLAN[4])]
    kept, redo = resume.split(PLAN, previous)
    assert [r["run_name"] for r in kept] == [PLAN[0].run_name, PLAN[1].run_name, PLAN[4].run_name]
    assert redo == [2, 3]  # the interrupted one and the one that has no record


def test_a_control_that_runs_again_takes_the_runs_judged_against_it_along() -> None:
    previous = [_rec(PLAN[0], "interrupted"), _rec(PLAN[1], "reproduced"), _rec(PLAN[4])]
    kept, redo = resume.split(PLAN, previous)
    assert kept == [] and redo == [0, 1, 2, 3, 4]


def test_a_run_judged_against_another_control_than_the_suite_picks_now_runs_again() -> None:
    plan = [
        _key("zero3", "stock"),
        _key("mics", "stock"),
        _key("zero3", "stock", "sync"),
        _key("mics", "stock", "sync"),
    ]
    # mics/sync was judged against the async control while the sync control had not run; now the
    # sync control exists (it runs again) and is the one the suite picks for it.
    previous = [_rec(plan[0]), _rec(plan[1], "reproduced"), _rec(plan[3], "reproduced")]
    kept, redo = resume.split(plan, previous)
    assert [r["run_name"] for r in kept] == [plan[0].run_name, plan[1].run_name]
    assert redo == [2, 3]


def test_a_record_of_other_settings_is_not_the_planned_run() -> None:
    previous = [_rec(PLAN[0]), _rec(PLAN[1])]
    kept, redo = resume.split(PLAN[:2], previous, lambda i, record: i == 0)
    assert [r["run_name"] for r in kept] == [PLAN[0].run_name] and redo == [1]


# ---- the suite finishes its own folder ----------------------------------------------------------------


class ScriptedLaunch(LaunchStandIn):
    """Stands in for runner.launch: MiCS stock runs reproduce (NaN losses, IllegalWork lines), the
    rest match the control; the runs named in `interrupt` come back interrupted (once each)."""

    def __init__(self, interrupt: Sequence[tuple[str, str]] = ()) -> None:
        self.interrupt = set(interrupt)
        self.started: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def launch(self, spec: runner.RunSpec, stop: threading.Event | None, server: Any) -> runner.LaunchResult:
        with self.lock:
            self.started.append((spec.env, spec.run_name))
        if (spec.env, spec.run_name) in self.interrupt:
            self.interrupt.discard((spec.env, spec.run_name))
            return runner.LaunchResult("interrupted", None, 0.1, {}, "")
        return write_fake_ranks(spec)


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch) -> ScriptedLaunch:
    fake = ScriptedLaunch()
    monkeypatch.setattr(runner, "launch", fake)
    monkeypatch.setattr(suite, "start_prefork", lambda out, device: FakePreforkServer())
    monkeypatch.setattr(suite, "mics_available", lambda: True)
    return fake


SUITE_ARGS = ["--device", "cpu", "--no-artifacts", "--jobs", "1", "--world-size", "2", "--steps", "3"]
CONTROL = "zero3-stock-fp32-async-w2"


def _suite(out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    code = suite.main(["--env", "cpu", "--out", str(out), *SUITE_ARGS, *extra])
    return code, json.loads((out / "suite.json").read_text())


def test_the_suite_resumes_its_folder_keeping_finished_runs_untouched(
    tmp_path: Path, launch: ScriptedLaunch
) -> None:
    out = tmp_path / "cpu"
    launch.interrupt = {("cpu", "mics-stock-fp32-async-w2")}
    code, first = _suite(out)
    assert code == 130 and first["runs"][0]["run_name"] == CONTROL
    # Runs the pool had already started beside the interrupted one finish and are recorded too.
    finished = {r["run_name"]: r for r in first["runs"] if r["outcome"] != "interrupted"}
    assert CONTROL in finished and "mics-stock-fp32-async-w2" not in finished
    stamps = {name: (out / "runs" / name / "record.json").stat().st_mtime_ns for name in finished}
    launch.started.clear()

    code, data = _suite(out, "--resume")
    assert code == 0
    redone = [name for _env, name in launch.started]
    runs = {r["run_name"]: r for r in data["runs"]}
    assert len(runs) == 8 and set(redone) == set(runs) - set(finished)
    assert redone[0] == "mics-stock-fp32-async-w2"
    # the finished runs' records and files are untouched
    assert {name: runs[name] for name in finished} == finished
    assert {n: (out / "runs" / n / "record.json").stat().st_mtime_ns for n in finished} == stamps
    assert not [r for r in data["runs"] if r["outcome"] == "interrupted"]
    assert all(r["control_run"] == CONTROL for r in data["runs"][1:])  # judged against the kept one
    assert runs["mics-stock-fp32-async-w2"]["outcome"] == "reproduced"
    assert data["resumed"] == {"kept": list(finished), "redone": len(redone)} and not data["interrupted"]
    # the interrupted attempt's folder made way for the run's new one (no second copy)
    assert sorted(os.listdir(out / "runs")) == sorted(runs)


def test_a_suite_resumed_with_other_steps_runs_everything_again(
    tmp_path: Path, launch: ScriptedLaunch
) -> None:
    out = tmp_path / "cpu"
    launch.interrupt = {("cpu", "mics-stock-fp32-async-w2")}
    assert _suite(out)[0] == 130
    launch.started.clear()
    code = suite.main(["--env", "cpu", "--out", str(out), *SUITE_ARGS[:-1], "4", "--resume"])
    assert code == 0 and len(launch.started) == 8


# ---- the host: results.json merged, the verdict recomputed, envs not redone ------------------------------


class SuiteEngine(StandInEngine):
    """An engine whose suite is the real one, in process (with the scripted launcher); a suite
    that was interrupted raises KeyboardInterrupt afterwards, as the tool's Ctrl-C would."""

    name = "in-process suite"

    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.args: dict[str, list[str]] = {}

    def prepare(self, env: Any) -> Prepared:
        self.prepared.append(env.id)
        return super().prepare(env)

    def run_suite(self, prepared: Prepared, args: Sequence[str], out_dir: Path, timeout_s: float) -> SuiteRun:
        self.args[prepared.env_id] = list(args)
        code = suite.main([*args, "--out", str(out_dir), "--no-artifacts", "--jobs", "1", "--steps", "3"])
        if code == 130:
            raise KeyboardInterrupt("SIGINT")
        return SuiteRun(code, False, 0.1, out_dir, None)


@pytest.fixture
def suite_engine(monkeypatch: pytest.MonkeyPatch) -> SuiteEngine:
    """SuiteEngine behind the CLI."""
    return use_engine(monkeypatch, SuiteEngine())


def _repro(out: Path, *extra: str) -> int:
    from repro.cli import main as cli

    return cli.main(["repro", "--env", "cpu,cpu-latest", "--world-size", "2", "--out", str(out), *extra])


def _results(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    return data


def test_resume_reruns_only_the_unfinished_runs_and_recomputes_the_verdict(
    tmp_path: Path, launch: ScriptedLaunch, suite_engine: SuiteEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = suite_engine
    out = tmp_path / "out"
    launch.interrupt = {("cpu-latest", "mics-fixed-fp32-async-w2")}
    assert _repro(out) == 130
    assert f"RESUME=1 OUT={out.resolve()}" in capsys.readouterr().err  # the command, ready to paste
    before = _results(out)
    assert before["invocation"]["interrupted"]
    [cut] = env_verdicts([r for r in before["runs"] if r["env"] == "cpu-latest"])
    assert cut.fixed is not FixVerdict.YES  # the fixed run was cut short: the fix is not shown yet
    cpu_before = [r for r in before["runs"] if r["env"] == "cpu"]
    latest_kept = [r for r in before["runs"] if r["env"] == "cpu-latest" and r["outcome"] != "interrupted"]
    launch.started.clear()
    engine.prepared.clear()

    assert _repro(out) == 2  # without RESUME=1 the folder is never written over
    assert _repro(out, "--resume") == 0
    assert engine.prepared == ["cpu-latest"]  # cpu finished: not prepared, not run
    assert "--resume" in engine.args["cpu-latest"]
    redone = [name for env, name in launch.started]
    assert {env for env, _ in launch.started} == {"cpu-latest"}
    assert redone[0] == "mics-fixed-fp32-async-w2" and not set(redone) & {r["run_name"] for r in latest_kept}
    data = _results(out)
    assert [r for r in data["runs"] if r["env"] == "cpu"] == cpu_before
    latest = [r for r in data["runs"] if r["env"] == "cpu-latest"]
    assert latest[: len(latest_kept)] == latest_kept and len(latest) == len(cpu_before) == 8
    assert not [r for r in data["runs"] if r["outcome"] == "interrupted"]
    assert not data["invocation"]["interrupted"] and data["invocation"]["finished_at"]
    assert data["envs"]["cpu-latest"]["suite_exit_code"] == 0
    # The verdict over the merged runs: the same EnvVerdict a fresh run of both envs gives.
    for verdict in env_verdicts(data["runs"]):
        assert (verdict.reproduces, verdict.fixed) == (Reproduces.YES, FixVerdict.YES), verdict.env


def test_resume_after_a_sigkill_reruns_the_runs_with_no_final_record(
    tmp_path: Path, launch: ScriptedLaunch, suite_engine: SuiteEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = suite_engine
    out = tmp_path / "out"
    assert _repro(out) == 0
    # What a SIGKILL of the tool during cpu-latest's suite leaves: the suite had saved 3 records
    # of its runs (suite.json is written after each), the tool none of them, finished_at null.
    suite_file = out / "cpu-latest" / "suite.json"
    left = json.loads(suite_file.read_text())
    left["runs"] = left["runs"][:3]
    left.pop("finished_at")
    suite_file.write_text(json.dumps(left))
    killed_during(out, "cpu-latest")
    launch.started.clear()
    engine.prepared.clear()
    monkeypatch.setenv("RESUME", "1")  # `make repro RESUME=1`
    assert _repro(out) == 0
    assert engine.prepared == ["cpu-latest"] and len(launch.started) == 5
    assert not {name for _e, name in launch.started} & {r["run_name"] for r in left["runs"]}
    runs = [r for r in _results(out)["runs"] if r["env"] == "cpu-latest"]
    assert len(runs) == 8 and runs[:3] == [
        {**r, "logs": {k: f"cpu-latest/{v}" for k, v in r["logs"].items()}} for r in left["runs"]
    ]


def test_an_env_with_a_run_recorded_as_interrupted_is_unfinished(tmp_path: Path) -> None:
    from repro.core.results import InvocationDir, invocation_meta
    from repro.matrix.schema import load_matrix
    from repro.run.orchestrate import Request, plan, unfinished_envs

    steps = plan(load_matrix(), Request(env_ids=("cpu",), scenarios=("zero3",), sync_proof=False))
    invocation = InvocationDir(tmp_path, invocation_meta([], "make repro"))
    invocation.add_env("cpu", {"suite_exit_code": 0, "suite_timed_out": False, "interrupted": False})
    record = {"env": "cpu", "scenario": "zero3", "patch": "stock", "transport": "async", "dtype": "fp32"}
    invocation.add_runs("cpu", [{**record, "outcome": "interrupted", "logs": {}}])  # type: ignore[typeddict-item]
    assert unfinished_envs(invocation, steps) == ["cpu"]
    invocation.data["runs"][0]["outcome"] = "clean"
    assert unfinished_envs(invocation, steps) == []


# ---- make run -----------------------------------------------------------------------------------------


class JobEngine(VenvJobEngine):
    """The in-env job runner's files for each patch; `cut` patches are interrupted (Ctrl-C while
    the job runs: a log, no job.json) the first time. `calls` are the patches run."""

    def __init__(self, cut: Sequence[str] = ()) -> None:
        super().__init__(
            cut=cut,
            cut_log="step 0 loss 2.5\n",
            call_of=lambda argv: argv_value(argv, "--patch"),
            job={"fix_report": True},
        )


def _run(tmp_path: Path, *extra: str, command: str = "torchrun train.py") -> int:
    from repro.cli import main as cli

    work = tmp_path / "proj"
    work.mkdir(exist_ok=True)
    return cli.main(
        [
            "run",
            "--env",
            "cpu",
            "--cmd",
            command,
            "--workdir",
            str(work),
            "--out",
            str(tmp_path / "out"),
            *extra,
        ]
    )


def test_make_run_resume_reruns_only_the_job_run_that_did_not_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = use_engine(monkeypatch, JobEngine(cut=("fixed",)), "job_commands")
    assert _run(tmp_path) == 130
    out = tmp_path / "out"
    assert f"RESUME=1 OUT={out.resolve()}" in capsys.readouterr().err
    first = _results(out)
    assert first["invocation"]["interrupted"] and first["invocation"]["finished_at"]
    assert {r["patch"]: r["outcome"] for r in first["runs"]} == {
        "stock": "reproduced",
        "fixed": "interrupted",
    }
    stock_job = out / "cpu" / "custom-stock" / "job.json"
    stamp = stock_job.stat().st_mtime_ns

    assert _run(tmp_path) == 2  # without RESUME=1 the folder is never written over
    assert _run(tmp_path, "--resume") == 0
    assert engine.calls == ["stock", "fixed", "fixed"]  # stock ran once
    assert stock_job.stat().st_mtime_ns == stamp
    data = _results(out)
    runs = {r["patch"]: r for r in data["runs"]}
    assert len(data["runs"]) == 2 and runs["fixed"]["outcome"] == "clean"
    assert runs["stock"]["first_divergent_step"] == 1  # judged against the fixed run done now
    assert not data["invocation"]["interrupted"] and data["invocation"]["finished_at"]
    [verdict] = env_verdicts(data["runs"])
    assert (verdict.reproduces, verdict.fixed) == (Reproduces.YES, FixVerdict.YES)


def test_make_run_resume_after_a_sigkill_and_of_a_finished_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = use_engine(monkeypatch, JobEngine(), "job_commands")
    assert _run(tmp_path) == 0
    out = tmp_path / "out"
    # A SIGKILL during the fixed run: its job.json never written, no records, finished_at null.
    (out / "cpu" / "custom-fixed" / "job.json").unlink()
    data = _results(out)
    data["runs"], data["invocation"]["finished_at"] = [], None
    (out / "results.json").write_text(json.dumps(data))
    engine.calls.clear()
    monkeypatch.setenv("RESUME", "1")  # `make run RESUME=1`
    assert _run(tmp_path) == 0
    assert engine.calls == ["fixed"] and len(_results(out)["runs"]) == 2
    prepared = engine.prepared
    assert _run(tmp_path) == 0  # everything finished: nothing runs, the env is not prepared again
    assert engine.calls == ["fixed"] and engine.prepared == prepared
    assert len(_results(out)["runs"]) == 2
    assert _run(tmp_path, command="python other.py") == 2  # another job's folder is not resumed
