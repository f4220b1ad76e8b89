"""The report's answers, every branch, driven by synthetic results folders (see fixtures/report_records)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.report_records import STEPS, ResultsBuilder, standard_env

from repro.report.answers import Answers, answer_all, relation
from repro.report.merge import load_and_merge
from repro.report.model import Outcome, Signature
from repro.report.per_env import EnvAnswer
from repro.report.verdicts import (
    CauseVerdict,
    FindingKind,
    FixVerdict,
    PairStatus,
    Reproduces,
    UpgradeOutcome,
    UpgradeVerdict,
    VersionRelation,
)
from repro.workload import record


def answers_of(*builders: ResultsBuilder, hint: tuple[str, ...] = ("rocm56",)) -> Answers:
    return answer_all(load_and_merge([b.write() for b in builders]), hint)


def env(a: Answers, env_id: str) -> EnvAnswer:
    return next(e for e in a.envs if e.env.id == env_id)


@pytest.fixture()
def b(tmp_path: Path) -> ResultsBuilder:
    return ResultsBuilder(tmp_path, "20250101T000000Z-test")


def _standard(b: ResultsBuilder, env_id: str, pins: dict[str, str] | None = None, **runs: bool) -> None:
    """The env `env_id` (with `pins`, its platform or versions) and its usual suite (standard_env's
    `runs` options)."""
    b.env(env_id, **(pins or {}))
    standard_env(b, env_id, **runs)


def test_enums_mirror_the_record_contract() -> None:
    assert tuple(o.value for o in Outcome) == record.OUTCOMES
    assert tuple(s.value for s in Signature) == record.SIGNATURES


def test_cpu_only_reproduces_and_fix_resolves_but_gpu_evidence_is_missing(b: ResultsBuilder) -> None:
    _standard(b, "cpu", sync_control=True)
    a = answers_of(b, hint=("rocm56", "cuda121"))
    cpu = env(a, "cpu")
    assert cpu.reproduces is Reproduces.YES
    assert set(cpu.signatures) == {"illegal-work-divergence", "illegal-work-crash"}
    assert cpu.fixed is FixVerdict.YES
    assert {p.status for p in cpu.verdict.pairs} == {PairStatus.RESOLVED}
    assert a.cause.verdict is CauseVerdict.NEEDS_GPU_EVIDENCE
    assert len(a.cause.missing) == 1 and "make repro ENV=rocm56" in a.cause.missing[0].how
    runs = {run for ev in a.cause.evidence for run in ev.runs}
    assert "cpu/mics-stock-fp32-sync-w2" in runs  # the sync transport control is cited
    assert any("matches the reporter's" in ev.text for ev in a.cause.evidence)


def test_sync_transport_runs_do_not_count_as_reproductions(b: ResultsBuilder) -> None:
    b.env("cpu")
    b.clean("cpu", "zero3", transport="sync")
    sync = b.run("cpu", "mics", transport="sync", illegal=3)
    assert sync["outcome"] == "reproduced"  # what the classifier says about the sync run itself
    b.clean("cpu", "zero3")
    b.clean("cpu", "mics")
    b.clean("cpu", "mics-hier")
    a = answers_of(b)
    assert env(a, "cpu").reproduces is Reproduces.NO
    assert a.cause.verdict is CauseVerdict.NOT_REPRODUCED


def test_same_signature_on_gpu_means_mics_logic(b: ResultsBuilder) -> None:
    _standard(b, "cpu")
    _standard(b, "rocm56", {"platform": "rocm", "rocm": "5.6"})
    a = answers_of(b)
    assert a.cause.verdict is CauseVerdict.MICS_LOGIC
    assert a.cause.missing == ()
    assert any(
        ev.text.startswith("mics: GPU illegal-work-divergence / CPU illegal-work-divergence: same")
        for ev in a.cause.evidence
    )
    assert env(a, "rocm56").backends == ("ROCm (RCCL via torch's nccl backend)",)


def test_rocm_only_failure_with_clean_cuda_means_rocm_environment(b: ResultsBuilder) -> None:
    _standard(b, "rocm56", {"platform": "rocm", "rocm": "5.6"})
    _standard(b, "cuda121", {"platform": "cuda", "cuda": "12.1"}, bug=False)
    a = answers_of(b)
    assert a.cause.verdict is CauseVerdict.ROCM_ENVIRONMENT
    assert env(a, "cuda121").reproduces is Reproduces.NO


def test_gpu_failure_with_clean_cpu_means_gpu_backend(b: ResultsBuilder) -> None:
    _standard(b, "cpu", bug=False)
    _standard(b, "cuda121", {"platform": "cuda", "cuda": "12.1"})
    assert answers_of(b).cause.verdict is CauseVerdict.GPU_BACKEND


def test_gpu_only_evidence_is_inconclusive_without_anything_to_compare(b: ResultsBuilder) -> None:
    _standard(b, "rocm56", {"platform": "rocm", "rocm": "5.6"})
    cause = answers_of(b).cause
    assert cause.verdict is CauseVerdict.INCONCLUSIVE
    assert any("CPU/gloo" in m.what for m in cause.missing)


def test_cpu_failure_with_clean_gpu_is_inconclusive(b: ResultsBuilder) -> None:
    _standard(b, "cpu")
    _standard(b, "rocm56", {"platform": "rocm", "rocm": "5.6"}, bug=False)
    assert answers_of(b).cause.verdict is CauseVerdict.INCONCLUSIVE


def test_fix_fails_in_one_env(b: ResultsBuilder) -> None:
    _standard(b, "cpu")
    _standard(b, "cpu+torch2.2.2", {"torch": "2.2.2"}, fix_works=False)
    a = answers_of(b)
    assert env(a, "cpu").fixed is FixVerdict.YES
    broken = env(a, "cpu+torch2.2.2")
    assert broken.fixed is FixVerdict.NO
    assert [p.status for p in broken.verdict.pairs if p.stock and p.stock.scenario == "mics"] == [
        PairStatus.NOT_RESOLVED
    ]


def test_fix_that_breaks_a_clean_run_is_a_regression(b: ResultsBuilder) -> None:
    _standard(b, "cpu", {"torch": "2.0.1"}, bug=False, fix_works=False)
    a = answers_of(b)
    assert env(a, "cpu").reproduces is Reproduces.NO
    assert env(a, "cpu").fixed is FixVerdict.NO
    assert [f.kind for f in a.findings] == [FindingKind.FIX_REGRESSION]


def test_upgrade_resolves(b: ResultsBuilder) -> None:
    _standard(b, "cpu")
    _standard(b, "cpu+torch9.0.0+ds1.0.0", {"torch": "9.0.0", "deepspeed": "1.0.0"}, bug=False)
    up = answers_of(b).upgrade
    assert up.verdict is UpgradeVerdict.YES
    assert up.baseline == "torch 2.1.0 + DeepSpeed 0.13.1"
    assert [(s.env, s.relation, s.outcome) for s in up.steps] == [
        ("cpu+torch9.0.0+ds1.0.0", VersionRelation.NEWER, UpgradeOutcome.RESOLVED)
    ]


def test_newer_env_still_failing_and_mics_removed_is_not_resolved(b: ResultsBuilder) -> None:
    _standard(b, "cpu")
    _standard(b, "cpu+ds0.19.6", {"torch": "2.13.0", "deepspeed": "0.19.6"})
    b.env("cpu+ds0.19.8", torch="2.13.0", deepspeed="0.19.8")
    b.clean("cpu+ds0.19.8", "zero3")
    for scenario in ("mics", "mics-hier"):
        for patch in ("stock", "fixed"):
            b.run(
                "cpu+ds0.19.8",
                scenario,
                patch,
                status="unsupported",
                losses=[],
                reason="unsupported: this DeepSpeed has no MiCS",
            )
    _standard(b, "cpu+torch2.0.1", {"torch": "2.0.1"}, bug=False)
    a = answers_of(b)
    assert env(a, "cpu+ds0.19.8").reproduces is Reproduces.UNSUPPORTED
    assert env(a, "cpu+ds0.19.8").fixed is FixVerdict.NOT_APPLICABLE
    up = a.upgrade
    assert up.verdict is UpgradeVerdict.NO
    outcomes = {s.env: (s.relation, s.outcome) for s in up.steps}
    assert outcomes == {
        "cpu+ds0.19.6": (VersionRelation.NEWER, UpgradeOutcome.STILL_REPRODUCES),
        "cpu+ds0.19.8": (VersionRelation.NEWER, UpgradeOutcome.MICS_REMOVED),
        "cpu+torch2.0.1": (VersionRelation.OLDER, UpgradeOutcome.RESOLVED),
    }
    assert up.steps[-1].relation is VersionRelation.OLDER  # newer envs are listed first
    assert {f.kind for f in a.findings} == {FindingKind.UNSUPPORTED}


def test_no_newer_env_says_what_to_run(b: ResultsBuilder) -> None:
    _standard(b, "cpu")
    up = answers_of(b).upgrade
    assert up.verdict is UpgradeVerdict.NO_NEWER_ENV and up.missing
    assert "TORCH=" in up.missing[0].how


def test_all_clean(b: ResultsBuilder) -> None:
    _standard(b, "cpu", {"torch": "2.0.1"}, bug=False)
    a = answers_of(b)
    assert env(a, "cpu").reproduces is Reproduces.NO
    assert env(a, "cpu").fixed is FixVerdict.NOT_APPLICABLE
    assert {p.status for p in env(a, "cpu").verdict.pairs} == {PairStatus.BOTH_CLEAN}
    assert a.cause.verdict is CauseVerdict.NOT_REPRODUCED
    assert a.upgrade.verdict is UpgradeVerdict.NOT_APPLICABLE
    assert a.findings == ()


def test_hang_is_reported_with_scenario_and_stack(b: ResultsBuilder) -> None:
    _standard(b, "cpu", {"torch": "2.13.0", "deepspeed": "0.19.6"}, bug=False)
    b.hang("cpu", "mics-replica", "stock")
    b.hang("cpu", "mics-replica", "fixed")
    a = answers_of(b)
    hangs = [f for f in a.findings if f.kind is FindingKind.HANG]
    assert [f.run for f in hangs] == [
        "cpu/mics-replica-stock-fp32-async-w4",
        "cpu/mics-replica-fixed-fp32-async-w4",
    ]
    assert "allreduce_mics_shard_grads" in hangs[0].excerpt and "rank 1" in hangs[0].excerpt
    # The reporter's configurations ran clean: the hang is another bug, not a reproduction.
    assert env(a, "cpu").reproduces is Reproduces.NO
    replica = [p for p in env(a, "cpu").verdict.pairs if p.status is PairStatus.OTHER_FAILURE_PERSISTS]
    assert len(replica) == 1


def test_replica_hang_with_the_bug_reproduced_report_and_summary_agree(b: ResultsBuilder) -> None:
    """`make repro ENV=cpu TORCH=2.13.0 DEEPSPEED=0.19.6`: the bug reproduces, the fix resolves it and
    the replica-group hang (stock and fixed alike) is a separate finding. The summary printed at the
    end of the run says the same as the report: it once said "FIX DOES NOT RESOLVE IT"."""
    from repro.core.verdict import check_fix
    from repro.run import summary

    _standard(b, "cpu", {"torch": "2.13.0", "deepspeed": "0.19.6"})
    b.hang("cpu", "mics-replica", "stock")
    b.hang("cpu", "mics-replica", "fixed")
    a = answers_of(b)
    cpu = env(a, "cpu")
    assert (cpu.reproduces, cpu.fixed) == (Reproduces.YES, FixVerdict.YES)
    assert "fixed by the patch: yes" in cpu.headline()
    assert {f.run for f in a.findings if f.kind is FindingKind.HANG} == {
        "cpu/mics-replica-stock-fp32-async-w4",
        "cpu/mics-replica-fixed-fp32-async-w4",
    }
    text = summary.render(b.runs, "results/x")
    assert "cpu: REPRODUCED; fix resolves it" in text and "FIX DOES NOT RESOLVE IT" not in text
    assert "not the IllegalWork bug, not addressed by the fix" in text
    assert check_fix(b.runs).ok


def test_only_a_hang_is_inconclusive(b: ResultsBuilder) -> None:
    b.env("cpu")
    b.clean("cpu", "zero3", world_size=4)
    b.hang("cpu", "mics", "stock")
    assert env(answers_of(b), "cpu").reproduces is Reproduces.INCONCLUSIVE


def test_crashed_control_leaves_the_fix_unverified(b: ResultsBuilder) -> None:
    b.env("cpu")
    control = b.run("cpu", "zero3", losses=[5.0] + [None] * (STEPS - 1))
    assert control["outcome"] == "crashed"
    b.diverging_bug("cpu", "mics")
    b.clean("cpu", "mics", "fixed")
    a = answers_of(b)
    cpu = env(a, "cpu")
    assert cpu.reproduces is Reproduces.YES  # IllegalWork messages need no control
    assert cpu.fixed is FixVerdict.UNVERIFIED
    assert [p.status for p in cpu.verdict.pairs] == [PairStatus.RESOLVED_UNVERIFIED]
    assert cpu.verdict.control_problems and FindingKind.CONTROL_FAILED in {f.kind for f in a.findings}


def test_interrupted_invocation(tmp_path: Path) -> None:
    b = ResultsBuilder(tmp_path, "20250101T000000Z-cpu", interrupted=True)
    b.env("cpu")
    b.clean("cpu", "zero3")
    b.diverging_bug("cpu", "mics")
    b.run("cpu", "mics", "fixed", status="interrupted", losses=[5.0])
    a = answers_of(b)
    assert env(a, "cpu").fixed is FixVerdict.INCONCLUSIVE
    interrupted = [f for f in a.findings if f.kind is FindingKind.INTERRUPTED]
    assert {f.run for f in interrupted} == {"cpu/mics-fixed-fp32-async-w2", None}
    assert any("make repro" in f.summary for f in interrupted if f.run is None)


def test_nothing_tested(b: ResultsBuilder) -> None:
    b.env("cpu")
    b.clean("cpu", "zero3")
    a = answers_of(b)
    assert env(a, "cpu").reproduces is Reproduces.NOT_TESTED
    assert env(a, "cpu").fixed is FixVerdict.NOT_TESTED


def test_env_error_is_inconclusive_and_listed(b: ResultsBuilder) -> None:
    b.env("rocm56", platform="rocm", rocm="5.6")
    b.run("rocm56", "mics", status="env-error", losses=[], reason="environment: no /dev/kfd")
    a = answers_of(b)
    assert env(a, "rocm56").reproduces is Reproduces.INCONCLUSIVE
    assert [f.kind for f in a.findings] == [FindingKind.ENV_ERROR]


@pytest.mark.parametrize(
    ("base", "other", "expected"),
    [
        (("2.1.0", "0.13.1"), ("2.1.0+rocm5.6", "0.13.1"), VersionRelation.SAME),
        (("2.1.0", "0.13.1"), ("2.13.0", "0.19.6"), VersionRelation.NEWER),
        (("2.1.0", "0.13.1"), ("2.1.0", "0.14.0"), VersionRelation.NEWER),
        (("2.1.0", "0.13.1"), ("2.0.1", "0.13.1"), VersionRelation.OLDER),
        (("2.1.0", "0.13.1"), ("2.0.1", "0.14.5"), VersionRelation.MIXED),
        (("2.1.0", "0.13.1"), ("nightly", "0.14.5"), VersionRelation.UNKNOWN),
    ],
)
def test_version_relation(base: tuple[str, str], other: tuple[str, str], expected: VersionRelation) -> None:
    assert relation(base, other) is expected


def test_baseline_prefers_the_reporters_versions(b: ResultsBuilder) -> None:
    _standard(b, "cpu+torch2.3.1", {"torch": "2.3.1", "deepspeed": "0.14.5"})
    _standard(b, "cpu")
    up = answers_of(b).upgrade
    assert up.baseline == "torch 2.1.0 + DeepSpeed 0.13.1"
    assert [(s.env, s.outcome) for s in up.steps] == [("cpu+torch2.3.1", UpgradeOutcome.STILL_REPRODUCES)]


def test_unorderable_versions_make_the_upgrade_answer_inconclusive(b: ResultsBuilder) -> None:
    _standard(b, "cpu+nightly", {"torch": "nightly", "deepspeed": "master"})
    up = answers_of(b).upgrade
    assert up.verdict is UpgradeVerdict.INCONCLUSIVE and up.baseline is None


def test_unorderable_env_is_listed_but_not_called_newer(b: ResultsBuilder) -> None:
    _standard(b, "cpu")
    _standard(b, "cpu+nightly", {"torch": "nightly", "deepspeed": "master"}, bug=False)
    up = answers_of(b).upgrade
    assert up.verdict is UpgradeVerdict.NO_NEWER_ENV
    assert [(s.env, s.relation) for s in up.steps] == [("cpu+nightly", VersionRelation.UNKNOWN)]


def test_suite_level_failures_are_findings(b: ResultsBuilder) -> None:
    b.env("cpu", suite_timed_out=True)
    b.clean("cpu", "zero3")
    b.env("rocm56", platform="rocm", rocm="5.6", suite_exit_code=3)
    b.clean("rocm56", "zero3")
    found = {(f.env, f.kind, f.run) for f in answers_of(b).findings}
    assert found == {("cpu", FindingKind.HANG, None), ("rocm56", FindingKind.ENV_ERROR, None)}


def test_gpu_env_hint_comes_from_the_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.core.errors import MatrixError
    from repro.matrix import schema as matrix_module
    from repro.report.build import gpu_env_ids

    m = matrix_module.load_matrix()
    ids = gpu_env_ids()
    platforms = [m.get(i).platform.value for i in ids]
    assert set(platforms) <= {"rocm", "cuda"} and platforms == sorted(platforms, key=lambda p: p != "rocm")
    assert len(ids) == sum(1 for i in m.ids() if m.get(i).platform.value in ("rocm", "cuda"))

    def broken() -> None:
        raise MatrixError("env_matrix/envs.toml is malformed")

    monkeypatch.setattr(matrix_module, "load_matrix", broken)
    assert gpu_env_ids() == ("rocm56",)


def test_run_without_backend_takes_its_envs_platform(b: ResultsBuilder) -> None:
    b.env("cpu")
    b.env("rocm56", platform="rocm", rocm="5.6")
    for env_id in ("cpu", "rocm56"):
        rec = b.run(env_id, "mics", status="env-error", losses=[], reason="no rank reported")
        rec["backend"] = None
        rec["versions"] = {}
    merged = load_and_merge([b.write()])
    assert {r.env: r.backend.is_gpu for r in merged.runs} == {"cpu": False, "rocm56": True}
