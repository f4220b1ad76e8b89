"""Issue 19: every run the user makes gets the same verdict in the summary, the report, check-fix,
probe and the bundle. One test (or a few) per defect of the issue, each on structured results and
exit codes; custom-job records are made by the product's own `build_records` from what the job
runner and the hook leave, so they are what `make run CMD=...` writes."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from repro.core.errors import NothingVerifiedError
from repro.core.fix_pairs import fix_pairs
from repro.core.verdict import (
    FixVerdict,
    Reproduces,
    Subject,
    check_fix,
    env_verdicts,
    views,
)
from repro.report.build import build_report
from repro.report.merge import load_and_merge
from repro.report.tables import rows
from repro.run import summary
from repro.run.job import RawRun, build_records
from repro.workload import runner
from repro.workload.classify import classify
from tests.fixtures.job_records import job_records, job_report, write_folder
from tests.fixtures.report_records import ResultsBuilder
from tests.fixtures.runspec import cpu_spec
from tests.fixtures.stand_in_engine import StandInEngine

# -- defect 1: own job, summary (and the same words in check-fix, report, issue comment) ----------------
OWN_JOB_HEADLINE = "cpu (your command): REPRODUCED; fix resolves it"


def test_1_the_summary_counts_the_custom_job_as_the_envs_evidence() -> None:
    records = job_records()
    [verdict] = env_verdicts(records)
    assert (verdict.reproduces, verdict.fixed, verdict.subject) == (
        Reproduces.YES,
        FixVerdict.YES,
        Subject.OWN_JOB,
    )
    assert verdict.headline() == OWN_JOB_HEADLINE
    assert summary.verdict_lines(records)[0] == OWN_JOB_HEADLINE  # type: ignore[arg-type]
    # check-fix's exit code comes from the same verdict: the job's fixed run verifies the fix.
    result = check_fix(records)
    assert (result.exit_code, result.verified) == (0, 1)
    assert verdict.to_dict()["headline"] == OWN_JOB_HEADLINE


def test_1_the_issue_comment_says_the_same_words() -> None:
    from repro.upstream.bundle import comment as issue_comment

    records = job_records()
    heads = issue_comment.headlines([issue_comment.RunRow.from_record(r) for r in records])
    answer = issue_comment.answer(heads, {"torch": "2.1.0", "deepspeed": "0.13.1"}, records)
    assert answer.verdict == OWN_JOB_HEADLINE
    assert answer.reproduced == ("Your command",) and answer.fixed is True


# -- defect 2: own job, report ------------------------------------------------------------------------
def test_2_a_report_of_custom_runs_only_answers_from_them(tmp_path: Path) -> None:
    folder = write_folder(tmp_path, "a", job_records(), "2026-01-01T00:00:00+00:00")
    data = json.loads(build_report([folder], tmp_path / "out").data.read_text())
    [head] = data["headline"]
    assert (head["reproduces"], head["fixed"], head["subject"]) == ("yes", "yes", "your command")
    assert head["headline"] == OWN_JOB_HEADLINE
    assert data["cause"]["verdict"] != "not-reproduced"


# -- defect 3: merging folders keeps both jobs -----------------------------------------------------------
def test_3_merging_two_folders_of_two_jobs_keeps_both(tmp_path: Path) -> None:
    a = write_folder(tmp_path, "a", job_records(command="python a.py"), "2026-01-01T00:00:00+00:00")
    b = write_folder(tmp_path, "b", job_records(command="python b.py"), "2026-01-02T00:00:00+00:00")
    merged = load_and_merge([a, b])
    assert len(merged.runs) == 4 and merged.superseded == ()
    assert len({r.job_id for r in merged.runs}) == 2
    table = rows(merged)
    assert len(table) == 2 and all(r.stock and r.fixed for r in table)
    # The same job run twice: the newer one is reported, the older is superseded.
    c = write_folder(tmp_path, "c", job_records(command="python a.py"), "2026-01-03T00:00:00+00:00")
    again = load_and_merge([a, b, c])
    assert len(again.runs) == 4 and len(again.superseded) == 2
    assert {r.invocation.folder.name for r in again.superseded} == {"a"}


# -- defect 4: a GPU env whose devices torch cannot see ----------------------------------------------
def _gpu_env_error_records(env: str = "rocm56") -> list[dict[str, Any]]:
    b = ResultsBuilder(Path("/nonexistent"), "x")
    b.env(env, platform="rocm", rocm="5.6")
    why = "torch sees no GPU (the device nodes are not here)"
    b.run(env, "zero3", "stock", world_size=4, losses=[], outcome="env-error", signature="none", reason=why)
    for scenario in ("mics", "mics-hier"):
        b.run(
            env, scenario, "fixed", world_size=4, losses=[], outcome="env-error", signature="none", reason=why
        )
    return b.runs


def test_4_env_error_fixed_runs_are_never_counted_against_the_fix() -> None:
    result = check_fix(_gpu_env_error_records())
    assert result.failures == () and not result.ok
    assert result.exit_code == NothingVerifiedError.exit_code == 6


def test_4_no_outcome_fixed_runs_count_neither_way() -> None:
    for outcome in ("env-error", "interrupted", "unsupported"):
        records = _gpu_env_error_records()
        for r in records:
            r["outcome"] = outcome
        [verdict] = env_verdicts(records)
        assert verdict.fix_failures == () and verdict.fixed is not FixVerdict.NO, outcome


def test_4_check_fix_exits_6_not_20(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.cli import run_commands
    from repro.cli.main import main

    monkeypatch.setattr(run_commands, "_run", lambda args, **kw: _gpu_env_error_records())
    assert main(["check-fix", "--env", "rocm56"]) == 6


# -- defect 5: a run in flight when SIGHUP/SIGTERM arrives is interrupted -------------------------------
_DIE_OF = "import os, signal as s; s.signal({0}, s.SIG_DFL); os.kill(os.getpid(), {0})"


@pytest.mark.parametrize(
    "code,want",
    [
        # The signal's default disposition first: under nohup (or a CI runner that ignores SIGHUP)
        # the child inherits SIG_IGN and would not die of it.
        (
            _DIE_OF.format(int(signal.SIGHUP)),
            -int(signal.SIGHUP),
        ),
        (
            _DIE_OF.format(int(signal.SIGTERM)),
            -int(signal.SIGTERM),
        ),
        # The pre-imported launcher exits 128+N when its rank died of signal N.
        ("import sys; sys.exit(129)", 129),
    ],
    ids=["SIGHUP", "SIGTERM", "rank-died-of-SIGHUP"],
)
def test_5_a_launcher_killed_by_a_stop_signal_is_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None, code: str, want: int
) -> None:
    monkeypatch.setattr(runner, "_command", lambda spec, port: [sys.executable, "-c", code])
    spec = cpu_spec(tmp_path, 30.0, 30.0)
    result = runner.launch(spec)
    assert result.launcher_code == want and result.status == "interrupted"
    record, status = runner.assemble(spec, result, {"env": "t", "scenario": "mics-replica"})
    assert status == "interrupted"
    assert classify(record, None, status).outcome == "interrupted"


def test_5_a_custom_job_killed_by_a_stop_signal_is_interrupted(tmp_path: Path, real_subprocess: None) -> None:
    from repro.workload import job

    out = tmp_path / "out"
    kill = (
        "import os, signal; signal.signal(signal.SIGHUP, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGHUP)"
    )
    argv = ["--cmd", f"{sys.executable} -c '{kill}'"]
    argv += ["--workdir", str(tmp_path), "--patch", "stock", "--device", "cpu", "--out", str(out)]
    argv += ["--timeout", "60", "--stall-timeout", "60"]
    job.main(argv)
    result = json.loads((out / job.JOB_JSON).read_text())
    assert result["status"] == "interrupted"
    [record] = build_records("cpu", [RawRun("stock", result, "", None)], None, "sha256:x", 600.0, "cpu")
    assert record["outcome"] == "interrupted"


# -- defect 6: probe and bisect refuse bad options at the front door ------------------------------------
BAD_OPTIONS = [["--world-size", "3"], ["--steps", "0"], ["--timeout", "nan"]]


@pytest.mark.parametrize("bad", BAD_OPTIONS)
def test_6_probe_with_bad_options_exits_128_before_probing(bad: list[str]) -> None:
    from repro.cli.bisect_commands import EXIT_ABORT, probe_main

    probed: list[Any] = []
    assert probe_main(["--env", "cpu", *bad], lambda spec: probed.append(spec)) == EXIT_ABORT == 128
    assert probed == []


@pytest.mark.parametrize("bad", BAD_OPTIONS)
def test_6_bisect_with_bad_options_exits_2_before_any_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: list[str]
) -> None:
    from repro.cli import bisect_commands
    from repro.cli.main import main

    def no_services() -> Any:
        raise AssertionError("bisect reached its services (matrix, engine) with bad options")

    monkeypatch.setattr(bisect_commands, "Services", no_services)
    argv = ["bisect", "--axis", "torch", "--versions", "2.0.0,2.1.0", "--out", str(tmp_path / "o")]
    assert main([*argv, "--results-root", str(tmp_path / "r"), *bad]) == 2
    assert not (tmp_path / "o").exists()


# -- defect 7: custom records carry provenance; the evidence check applies to them ----------------------
GPU_RAN = {"device": "gpu", "backend": "nccl", "gpus": ["AMD Instinct MI250X"], "hip": "5.6", "rank": 0}
CPU_RAN = {"device": "cpu", "backend": "gloo", "gpus": [], "hip": "5.6", "rank": 0}


def _rocm_job(ran_on: dict[str, Any] | None) -> list[dict[str, Any]]:
    extra = {"report": {"ran_on": ran_on}} if ran_on else {}
    return job_records(
        "rocm56",
        platform="rocm",
        stock=job_report("stock", "python t.py", "/w", device="gpu", **extra),
        fixed=job_report("fixed", "python t.py", "/w", device="gpu", **extra),
    )


def test_7_custom_records_say_what_they_ran_on() -> None:
    stock, _fixed = _rocm_job(GPU_RAN)
    assert stock["ran_on"]["device"] == "gpu" and stock["ran_on"]["gpus"] == ["AMD Instinct MI250X"]
    assert stock["ran_on"]["env_platform"] == "rocm" and stock["ran_on"]["joined_group"] is True
    [verdict] = env_verdicts(_rocm_job(GPU_RAN))
    assert verdict.reproduces is Reproduces.YES


@pytest.mark.parametrize("ran_on", [CPU_RAN, None], ids=["fell-back-to-cpu", "never-joined-a-group"])
def test_7_a_rocm_job_without_a_gpu_is_no_rocm_evidence(ran_on: dict[str, Any] | None) -> None:
    records = _rocm_job(ran_on)
    assert {r.outcome.value for r in views(records)} == {"env-error"}
    [verdict] = env_verdicts(records)
    assert verdict.reproduces is not Reproduces.YES and verdict.fix_failures == ()


def test_7_bad_if_failed_does_not_count_a_crash_without_a_gpu(tmp_path: Path) -> None:
    """The probe reads its run through the same evidence check: a rocm job that crashed before it
    joined a process group (no GPU) is unknown under BAD_IF=failed, not bad."""
    from repro.bisect.probe import BadIf, Judge, OrchestratedProbe, ProbeSpec
    from repro.bisect.search import ProbeVerdict
    from repro.core.results import InvocationDir, invocation_meta

    crashed = job_report("stock", "python t.py", str(tmp_path), device="gpu", exit_code=1, engine=False)
    crashed["hook_reports"] = []

    class Env:
        id = "rocm56"
        derived_from = None

        class platform:  # noqa: N801 - mimics the Enum attribute
            value = "rocm"

        def pins(self) -> dict[str, str]:
            return {"torch": "2.1.0", "deepspeed": "0.13.1"}

    class Matrix:
        default_id = "rocm56"

        def get(self, env_id: str) -> Env:
            return Env()

    class Engine(StandInEngine):
        def run_job(
            self, prepared: Any, args: Any, out_dir: Path, workdir: Path, timeout_s: Any, **kw: Any
        ) -> Any:
            from repro.engines.base import SuiteRun

            out_dir.mkdir(parents=True)
            (out_dir / "job.log").write_text("RuntimeError: no HIP GPUs are available\n")
            (out_dir / "job.json").write_text(json.dumps(crashed))
            return SuiteRun(1, False, 1.0, out_dir, out_dir / "job.log")

    (tmp_path / "o").mkdir()
    invocation = InvocationDir(tmp_path / "o", invocation_meta(["probe"], "make probe"))
    probe = OrchestratedProbe(Matrix(), Engine(), invocation, say=lambda _: None)  # type: ignore[arg-type]
    obs = probe(ProbeSpec(env_id="rocm56", command="python t.py", workdir=str(tmp_path)))
    assert obs.outcome == "env-error"
    assert Judge(BadIf.FAILED)(obs) is ProbeVerdict.UNKNOWN


def test_7_a_folder_without_a_platform_is_unknown_and_the_report_says_so(tmp_path: Path) -> None:
    records = _rocm_job(GPU_RAN)
    for r in records:
        r["ran_on"] = None  # an older record
    folder = write_folder(tmp_path, "old", records, "2026-01-01T00:00:00+00:00", platform="unknown")
    data = json.loads(build_report([folder], tmp_path / "out").data.read_text())
    [head] = data["headline"]
    assert head["platform"] == "unknown" and "no GPU evidence" in head["platform_note"]
    # Neither GPU evidence (the CPU wheel's torch.version.cuda says nothing) nor CPU evidence.
    assert data["cause"]["verdict"] == "inconclusive"
    merged = load_and_merge([folder])
    assert {r.backend.is_gpu for r in merged.runs} == {False}


# -- defect 8: a stock run that crashed before its first step ------------------------------------------
def test_8_a_stock_run_that_died_before_its_first_step_stays_paired(tmp_path: Path) -> None:
    early = job_report("stock", "python t.py", "/w", engine=False, exit_code=1)
    records = job_records(
        command="python t.py",
        workdir="/w",
        stock=early,
        stock_log="Traceback (most recent call last):\nRuntimeError: boom\n",
    )
    stock, fixed = records
    assert stock["world_size"] is None and fixed["world_size"] == 2
    assert len(fix_pairs(views(records))) == 1
    table = summary.table(records)  # type: ignore[arg-type]
    stock_row = table.splitlines()[2].split()
    assert stock_row[5] == "?"  # the ws column
    folder = write_folder(tmp_path, "a", records, "2026-01-01T00:00:00+00:00")
    [row] = rows(load_and_merge([folder]))
    assert row.stock is not None and row.fixed is not None
    assert (row.world_size, row.layout) == (2, "2")
    merged = load_and_merge([folder])
    only_stock = [r for r in merged.runs if r.patch == "stock"]
    from repro.core.runs import run_label

    assert "? ranks" in run_label(only_stock[0])


# -- defect 9: the cpu env says what ran ----------------------------------------------------------------
def test_9_the_cpu_env_is_labelled_by_what_ran(tmp_path: Path) -> None:
    folder = write_folder(tmp_path, "a", job_records(), "2026-01-01T00:00:00+00:00")
    data = json.loads(build_report([folder], tmp_path / "out").data.read_text())
    [head] = data["headline"]
    assert head["versions"]["platform"] == "cpu" and head["versions"]["cuda"] == "12.1"
    from repro.report.per_env import env_answer

    merged = load_and_merge([folder])
    label = env_answer(merged.envs["cpu"], merged).versions.label()
    assert label == "torch 2.1.0, DeepSpeed 0.13.1, CPU (gloo); torch wheel built with CUDA 12.1"


# -- the probe's good/bad/unknown reads each run the way the env verdict does ---------------------------
def test_the_probe_and_the_env_verdict_read_a_run_alike() -> None:
    from repro.bisect.probe import BadIf, verdict_for
    from repro.bisect.search import ProbeVerdict
    from repro.core.runs import RunFinding, run_finding
    from repro.workload.record import Outcome, Signature

    for outcome in Outcome:
        for signature in Signature:
            finding = run_finding(outcome, signature)  # every member has an answer
            probe = verdict_for(outcome.value, signature.value, BadIf.REPRODUCED)
            assert (probe is ProbeVerdict.BAD) == (finding is RunFinding.BUG), (outcome, signature)
    # A crash raised from an IllegalWork is the bug for the env verdict, so bad for the probe too.
    assert verdict_for("crashed", "illegal-work-crash", BadIf.REPRODUCED) is ProbeVerdict.BAD


def test_a_recorded_outcome_or_signature_this_tool_does_not_know_says_nothing() -> None:
    """Readers of files (pr checks, issue facts, the report's timeline, gpu-check) read a run's
    finding through finding_of: known values as run_finding reads them, any other value None."""
    from repro.core.runs import RunFinding, finding_of, run_finding
    from repro.workload.record import Outcome, Signature

    for outcome in Outcome:
        for signature in Signature:
            assert finding_of(outcome.value, signature.value) is run_finding(outcome, signature)
    assert finding_of("reproduced", "none") is RunFinding.BUG
    assert finding_of("exploded", "none") is None and finding_of("clean", "a-new-sign") is None
    assert finding_of(None, "none") is None
