"""Per-env verdicts, the summary table and the results store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.report_records import STEPS, ResultsBuilder, standard_env

from repro.core import results
from repro.core.errors import FixNotResolvedError, NothingVerifiedError, ReproError, UsageError
from repro.core.fix_pairs import PairStatus, control_for
from repro.core.runs import RunView
from repro.core.verdict import (
    FixVerdict,
    Reproduces,
    check_fix,
    env_verdict,
    env_verdicts,
)
from repro.run import summary
from repro.workload import record
from repro.workload.controls import ControlKey, choose_control, record_key


@pytest.fixture()
def b(tmp_path: Path) -> ResultsBuilder:
    builder = ResultsBuilder(tmp_path, "20250101T000000Z-test")
    builder.env("cpu", torch="2.13.0", deepspeed="0.19.6")
    return builder


def one(b: ResultsBuilder, env: str = "cpu") -> Any:
    return env_verdict(env, [RunView(r) for r in b.runs])


def test_reproduced_and_fixed(b: ResultsBuilder) -> None:
    standard_env(b, "cpu")
    v = one(b)
    assert v.reproduces is Reproduces.YES and v.fixed is FixVerdict.YES
    assert set(v.verified) == {"cpu/mics-fixed-fp32-async-w2", "cpu/mics-hier-fixed-fp32-async-w2"}
    assert check_fix(b.runs).ok
    assert "cpu: REPRODUCED; fix resolves it" in summary.render(b.runs, "results/x")


def test_fix_fails(b: ResultsBuilder) -> None:
    standard_env(b, "cpu", fix_works=False)
    v = one(b)
    assert v.fixed is FixVerdict.NO
    result = check_fix(b.runs)
    assert [f.split(":")[1].strip() for f in result.failures] == ["mics-fixed-fp32-async-w2"]
    assert "FIX DOES NOT RESOLVE IT" in summary.render(b.runs, "results/x")


def test_replica_hang_is_one_verdict_everywhere(b: ResultsBuilder) -> None:
    """The replica-group hang of DeepSpeed 0.19.x (stock and fixed alike) is a separate bug: the
    summary, check-fix and the report all say reproduced + fixed, and name the hang on its own."""
    from repro.report.answers import answer_all
    from repro.report.merge import load_and_merge

    standard_env(b, "cpu")
    b.hang("cpu", "mics-replica", "stock")
    b.hang("cpu", "mics-replica", "fixed")
    v = one(b)
    assert (v.reproduces, v.fixed) == (Reproduces.YES, FixVerdict.YES)
    assert [p.status for p in v.pairs if p.stock and p.stock.scenario == "mics-replica"] == [
        PairStatus.OTHER_FAILURE_PERSISTS
    ]
    assert len(v.other_failures) == 1 and "hung" in v.other_failures[0].text
    assert v.fix_failures == ()
    text = summary.render(b.runs, "results/x")
    assert "cpu: REPRODUCED; fix resolves it" in text and "FIX DOES NOT" not in text
    assert "separate problem, not counted against the fix: MiCS with replica groups" in text
    assert check_fix(b.runs).ok
    report = answer_all(load_and_merge([b.write()]), ("rocm56",)).envs[0]
    assert (report.reproduces, report.fixed) == (v.reproduces, v.fixed)
    assert [p.to_dict() for p in report.verdict.pairs] == [p.to_dict() for p in v.pairs]


def test_sync_transport_runs_do_not_decide(b: ResultsBuilder) -> None:
    b.clean("cpu", "zero3")
    b.clean("cpu", "mics")
    b.clean("cpu", "mics-hier")
    b.clean("cpu", "zero3", transport="sync")
    b.run("cpu", "mics", transport="sync", illegal=3)
    assert one(b).reproduces is Reproduces.NO


def test_views_of_plain_dicts_need_only_the_record_keys() -> None:
    rec = record.empty_record(
        env="cpu",
        scenario="mics",
        patch="stock",
        dtype="fp32",
        world_size=2,
        transport="async",
        outcome="reproduced",
        signature="divergence",
    )
    (v,) = env_verdicts([rec])
    assert v.reproduces is Reproduces.YES and v.fixed is FixVerdict.NOT_TESTED
    assert "cpu: REPRODUCED; fix not evaluated" in summary.render([rec], "results/x")


# -- nothing verified (issue 12 item 4): check-fix must not pass on an empty check --------------------


def fixed_only(b: ResultsBuilder, **control: Any) -> None:
    """What check-fix runs: the stock ZeRO-3 control and the fixed MiCS runs."""
    b.clean("cpu", "zero3", **control)
    b.clean("cpu", "mics", "fixed")


def test_check_fix_passes_when_a_fixed_run_matches_a_clean_control(b: ResultsBuilder) -> None:
    fixed_only(b)
    result = check_fix(b.runs)
    assert result.ok and result.verified == 1
    text = summary.render(b.runs, "results/x")
    assert "cpu: no evidence (no stock MiCS run); fix not evaluated (no stock run to compare with)" in text
    assert "fixed runs that ran clean and match the ZeRO-3 control: mics-fixed-fp32-async-w2" in text


def test_steps_zero_verifies_nothing(b: ResultsBuilder) -> None:
    # STEPS=0: the control has no losses (classified crashed); the fixed run has none either and,
    # with no usable control, the classifier calls it clean. Nothing was compared.
    fixed_only(b, losses=[])
    assert b.runs[0]["outcome"] == "crashed" and b.runs[1]["outcome"] == "clean"
    v = one(b)
    assert v.nothing_verified and "zero3-stock-fp32-async-w2 is crashed" in v.unverified_reason
    result = check_fix(b.runs)
    assert not result.failures and result.unverified and not result.ok
    assert "nothing verified:" in summary.render(b.runs, "results/x")


def test_fixed_run_without_steps_verifies_nothing_even_with_a_good_control(b: ResultsBuilder) -> None:
    b.clean("cpu", "zero3")
    b.run("cpu", "mics", "fixed", losses=[], outcome="clean", signature="none")
    assert "ran no steps" in one(b).unverified_reason and not check_fix(b.runs).ok


def test_every_fixed_run_unsupported_verifies_nothing(b: ResultsBuilder) -> None:
    b.clean("cpu", "zero3")
    for scenario in ("mics", "mics-hier"):
        b.run("cpu", scenario, "fixed", status="unsupported", losses=[], reason="no MiCS_Init")
    result = check_fix(b.runs)
    assert not result.failures and result.verified == 0
    assert result.unverified == ("cpu: every fixed MiCS run is unsupported (no MiCS_Init)",)


def test_sync_fixed_runs_verify_nothing(b: ResultsBuilder) -> None:
    b.clean("cpu", "zero3", transport="sync")
    b.clean("cpu", "mics", "fixed", transport="sync")
    assert not check_fix(b.runs).ok and one(b).unverified_reason == "no fixed MiCS run was made"


def test_losses_are_compared_again_not_taken_from_the_record(b: ResultsBuilder) -> None:
    b.clean("cpu", "zero3")
    b.run("cpu", "mics", "fixed", losses=[9.0] * STEPS, outcome="clean", signature="none")
    b.runs[-1]["first_divergent_step"] = None  # a record that claims a match it does not have
    assert "leave the control's at step 0" in one(b).unverified_reason


def test_no_runs_verify_nothing() -> None:
    assert check_fix([]).unverified == ("no run was recorded",)


def test_nothing_verified_has_its_own_exit_code() -> None:
    codes = [cls.exit_code for cls in ReproError.__subclasses__() if cls is not NothingVerifiedError]
    assert NothingVerifiedError.exit_code not in codes and NothingVerifiedError.exit_code != 0


# -- control matching: one rule for the suite and the report ---------------------------------------


def ck(dtype: str = "fp32", transport: str = "async", ws: int = 2, patch: str = "stock") -> ControlKey:
    return ControlKey(dtype, transport, ws, patch)


def test_control_needs_same_dtype_and_world_size_and_prefers_transport_then_patch() -> None:
    candidates = [
        ck("bf16"),
        ck(ws=4),
        ck(transport="sync", patch="fixed"),
        ck(transport="sync"),
        ck(patch="fixed"),
        ck(),
    ]
    pick = choose_control(ck(patch="fixed"), candidates, lambda c: c)
    assert pick is candidates[4]
    assert choose_control(ck(transport="strict"), candidates, lambda c: c) is candidates[3]
    assert choose_control(ck("fp16"), candidates, lambda c: c) is None


def test_suite_and_report_pick_the_same_control(b: ResultsBuilder) -> None:
    sync = b.clean("cpu", "zero3", transport="sync")
    native = b.clean("cpu", "zero3")
    mics = b.clean("cpu", "mics", "fixed", transport="strict")
    views = [RunView(r) for r in b.runs]
    suite_pick = choose_control(record_key(mics), [sync, native], record_key)
    assert suite_pick is sync  # neither matches the transport: the earliest wins, as in the suite
    unnamed = RunView({**mics, "control_run": None})
    report_pick = control_for(unnamed, views)
    assert report_pick is not None and report_pick.record is suite_pick
    assert control_for(RunView(mics), views) is not None  # the record names its own


def test_closed_sets_are_the_record_enums() -> None:
    from repro.engines.docker import dockerfiles
    from repro.report import model
    from repro.workload import train

    assert model.Outcome is record.Outcome and model.Signature is record.Signature
    assert train.PATCHES == record.PATCHES == ("stock", "fixed")
    assert dockerfiles.SUITE_SCENARIOS == ",".join(record.SCENARIOS)
    assert set(record.RunRecord.__annotations__) == set(record.RECORD_KEYS)


def test_invocation_folder_never_reused_and_latest_points_to_newest(tmp_path: Path) -> None:
    a = results.new_invocation_dir(tmp_path, ["cpu"])
    b = results.new_invocation_dir(tmp_path, ["cpu"])
    assert a != b
    inv = results.InvocationDir(b, results.invocation_meta(["repro"], "make repro"))
    inv.add_runs("cpu", [{"env": "cpu", "logs": {"launcher": "runs/x/launcher.log"}}])
    results.point_latest(tmp_path, b)
    data = results.load(results.resolve_results_dir(tmp_path, None))
    assert data["runs"][0]["logs"]["launcher"] == "cpu/runs/x/launcher.log"
    assert json.loads((b / "results.json").read_text())["invocation"]["command"] == "make repro"


def test_missing_results_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        results.resolve_results_dir(tmp_path, None)


# -- the issue comment and the bundle's README read the same verdict --------------------------------


def comment_answer(b: ResultsBuilder) -> Any:
    from repro.upstream.bundle import comment as ic

    heads = ic.headlines([ic.RunRow.from_record(r) for r in b.runs])
    return ic.answer(heads, b.runs[0]["versions"], b.runs)


def test_issue_comment_says_fixed_when_the_fix_resolves_it(b: ResultsBuilder) -> None:
    standard_env(b, "cpu")
    a = comment_answer(b)
    assert a.fixed is True and a.reproduced == ("Flat MiCS", "Hierarchical MiCS")
    assert "With the patch below every MiCS run is **clean** (losses match plain ZeRO-3)." in a.summary


def test_issue_comment_reports_the_replica_hang_apart_from_the_fix(b: ResultsBuilder) -> None:
    standard_env(b, "cpu")
    b.hang("cpu", "mics-replica", "stock")
    b.hang("cpu", "mics-replica", "fixed")
    a = comment_answer(b)
    assert a.fixed is True and "not every MiCS run is clean" not in a.summary
    assert "Separately, and with or without the patch: MiCS with replica groups" in a.summary


def test_issue_comment_names_the_fixed_run_that_fails(b: ResultsBuilder) -> None:
    standard_env(b, "cpu", fix_works=False)
    a = comment_answer(b)
    assert a.fixed is False and "(mics-fixed-fp32-async-w2: reproduced)" in a.summary


# -- check-fix through the front door: the exit code says what was (not) verified --------------------


@pytest.mark.parametrize(
    ("make_runs", "code", "said"),
    [
        (lambda b: fixed_only(b), 0, "1 fixed MiCS run(s) ran clean and matched"),
        (lambda b: fixed_only(b, losses=[]), NothingVerifiedError.exit_code, "nothing to compare with"),
        (
            lambda b: [
                b.clean("cpu", "zero3"),
                b.run("cpu", "mics", "fixed", status="unsupported", losses=[]),
            ],
            NothingVerifiedError.exit_code,
            "every fixed MiCS run is unsupported",
        ),
        (
            lambda b: [b.clean("cpu", "zero3"), b.diverging_bug("cpu", "mics", "fixed")],
            FixNotResolvedError.exit_code,
            "mics-fixed",
        ),
    ],
)
def test_check_fix_exit_codes(
    b: ResultsBuilder,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    make_runs: Any,
    code: int,
    said: str,
) -> None:
    from repro.cli import main as cli
    from repro.cli import run_commands

    make_runs(b)
    # The runs themselves are faked (no engine); parsing, the verdict and the error catch are real.
    monkeypatch.setattr(run_commands, "_run", lambda args, **kw: list(b.runs))
    assert cli.main(["check-fix", "--env", "cpu"]) == code
    out = capsys.readouterr()
    assert said in (out.out if code == 0 else out.err)


def test_plain_gloo_pair_is_named_under_the_verdict(b: ResultsBuilder) -> None:
    """Plain gloo (no adapter): stock MiCS dies on gloo's refusal to coalesce, which is not the
    IllegalWork bug; the fixed run trains like the control. The summary names the pair."""
    b.clean("cpu", "zero3", transport="plain")
    refusal = {
        "type": "RuntimeError",
        "message": "Backend gloo does not implement startCoalescing",
        "rank": 0,
    }
    b.run("cpu", "mics", "stock", transport="plain", losses=[], exception=refusal)
    b.clean("cpu", "mics", "fixed", transport="plain")
    v = one(b)
    assert [p.status for p in v.pairs] == [PairStatus.OTHER_FAILURE_GONE]
    assert v.reproduces is not Reproduces.YES and v.fix_failures == ()
    text = summary.render(b.runs, "results/x")
    assert "stock failure that is not the IllegalWork bug, gone with the fix: MiCS flat gather" in text
    assert "plain transport" in text
