"""Issue #30: the lab verifies a `make pr` branch at its commit, and the affected range.

The judgement and the range's rows are pure; the verification and the range run here on a small
DeepSpeed-shaped git repository the test makes (tests/fixtures/ds_pr_git.py), with stand-in probe
and survey runners that answer by commit and release the way real ones can, so every outcome the
lab can see (the bug at REF, a branch that is still broken, a commit that does not import) is
exercised. The real probes of DeepSpeed master are the closing note's, not a test's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from repro.cli import main as cli
from repro.core.errors import UsageError
from repro.upstream.pr import affected_range as pr_range
from repro.upstream.pr import checks as pr_checks
from repro.upstream.pr import fix as pr_fix
from repro.upstream.pr.checks import Expect, Seen
from repro.upstream.pr.description import record_from, render
from repro.upstream.pr.verify import CellCache, Verification, export_tree
from tests.fixtures.ds_git import git
from tests.fixtures.ds_pr_git import MICS, FakeDeepSpeedPr
from tests.fixtures.pr_verify_standins import (
    BUG,
    CLEAN,
    NO_IMPORT,
    REFUSED,
    STACKS,
    StandInProbe,
    StandInSurvey,
    ds,  # noqa: F401 - a fixture
    made,  # noqa: F401 - a fixture
    regression_stand_in,
)


def seen(probe: Mapping[str, Any]) -> Seen:
    return Seen.from_probe(probe)


# -- judgement -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expect", "ref", "branch", "ok"),
    [
        (Expect.FIXES, BUG, CLEAN, True),
        (Expect.FIXES, BUG, BUG, False),  # the branch did not fix it
        (Expect.FIXES, CLEAN, CLEAN, False),  # REF did not show the bug: nothing was verified
        (Expect.FIXES, {**BUG, "outcome": "crashed", "signature": "illegal-work-crash"}, CLEAN, True),
        (Expect.FIXES, BUG, REFUSED, False),
        (Expect.FIXES_REFUSAL, REFUSED, CLEAN, True),
        (Expect.FIXES_REFUSAL, {**REFUSED, "reason": "RuntimeError: boom"}, CLEAN, False),
        (Expect.FIXES_REFUSAL, REFUSED, REFUSED, False),
        (Expect.UNCHANGED, CLEAN, CLEAN, True),
        (Expect.UNCHANGED, CLEAN, BUG, False),  # the change broke the control
        (Expect.UNCHANGED, BUG, BUG, False),
        (Expect.FIXES, NO_IMPORT, NO_IMPORT, None),  # says nothing about the change
        (Expect.FIXES, NO_IMPORT, CLEAN, False),  # one side importing is not "not applicable"
    ],
)
def test_judge(expect: Expect, ref: dict[str, Any], branch: dict[str, Any], ok: bool | None) -> None:
    got, why = pr_checks.judge(expect, seen(ref), seen(branch))
    assert got is ok
    if ok is None:
        assert "not applicable" in why and "custom_op" in why
    else:
        assert ref["outcome"] in why and branch["outcome"] in why


def test_plan_runs_plain_gloo_only_on_the_newest_torch() -> None:
    keys = [(stack.name, check.key) for stack, check in pr_checks.plan(STACKS)]
    assert ("newest", "mics@plain") in keys and ("reporter", "mics@plain") not in keys
    assert {k for _, k in keys} == {"mics", "mics-hier", "zero3", "mics@plain"}
    assert len(keys) == 7
    assert [c.key for _, c in pr_checks.plan(STACKS[1:])].count("mics") == 1


@pytest.mark.parametrize(
    ("ref", "branch", "ok"),
    [
        ({"t::a": "failed", "t::b": "failed"}, {"t::a": "passed", "t::b": "passed"}, True),
        ({"t::a": "passed"}, {"t::a": "passed"}, False),  # does not fail before the change
        ({"t::a": "failed"}, {"t::a": "failed"}, False),
        ({"t::a": "failed"}, {"t::b": "passed"}, False),
        ({}, {}, False),
    ],
)
def test_regression_must_fail_at_ref_and_pass_on_the_branch(
    ref: dict[str, str], branch: dict[str, str], ok: bool
) -> None:
    assert pr_checks.regression_ok(ref, branch)[0] is ok


def test_enclosing_function_names_the_innermost_def() -> None:
    calls = [n for n, line in enumerate(MICS.splitlines(), 1) if "dist.all_gather_coalesced(" in line]
    names = [pr_fix.enclosing_function(MICS, n) for n in calls]
    assert names == [
        "_flat_all_gather_with_coalescing_manager",
        "_hierarchical_all_gather_params",
        "_hierarchical_all_gather_params",
    ]
    assert pr_fix.enclosing_function(MICS, 1) is None
    assert pr_fix.enclosing_function("def (:\n", 1) is None


# -- the range's rows ------------------------------------------------------------------------------
def test_release_rows_first_with_mics_then_last_of_each_minor() -> None:
    index = [
        "0.8.3",
        "0.9.0",
        "0.9.2",
        "0.9.5",
        "0.10.0",
        "0.10.3",
        "0.13.0",
        "0.13.1",
        "0.14.0rc1",
        "0.19.6",
        "0.19.7",
    ]
    assert pr_range.release_rows(index, "0.9.2", "0.19.6") == ["0.9.2", "0.9.5", "0.10.3", "0.13.1", "0.19.6"]
    assert pr_range.release_rows(index, "0.13.1", "0.13.1") == ["0.13.1"]
    assert pr_range.release_rows(index, "x", "0.19.6") == []


def test_first_mics_release_is_the_oldest_tag_with_mics() -> None:
    has = {"v0.9.2", "v0.9.3", "v0.10.0"}
    tags = ["v0.10.0", "v0.9.1", "v0.9.3", "v0.9.2", "nightly", "v0.9.0"]
    assert pr_range.first_mics_release(tags, lambda t: t in has) == "0.9.2"
    assert pr_range.first_mics_release(tags, lambda t: False) is None


@pytest.mark.parametrize(
    ("probe", "words"),
    [
        (BUG, "bug (illegal-work-divergence)"),
        (CLEAN, "clean"),
        (NO_IMPORT, "does not import"),
        ({"outcome": "unsupported", "signature": "none", "reason": "no MiCS"}, "unsupported"),
        (REFUSED, "crashed (crash)"),
        (
            {
                "outcome": "env-error",
                "signature": "none",
                "reason": "BuildError: pip step deepspeed failed (exit 1)",
            },
            "does not install",
        ),
        (
            {"outcome": "env-error", "signature": "none", "reason": "BuildError: pip step torch failed"},
            "env-error (none)",
        ),
        (None, "-"),
    ],
)
def test_cell_words(probe: dict[str, Any] | None, words: str) -> None:
    assert pr_range.cell_words(probe) == words


# -- on a git repository ---------------------------------------------------------------------------
def test_verification_of_a_good_branch(made: tuple[Path, dict[str, Any]], ds: FakeDeepSpeedPr) -> None:  # noqa: F811
    out, pr = made
    probe = StandInProbe(pr)
    data = Verification(pr, STACKS, out, str(ds.path), probe=probe, regression=regression_stand_in).run()

    assert data["verified"] is True and data["complete"] is True
    assert {(c.commit, c.patch) for c in probe.calls} == {(pr["ref_sha"], "stock"), (pr["commit"], "stock")}
    assert len(probe.calls) == 14
    assert [r["ok"] for r in data["regression"]] == [True, True]
    assert data["regression"][0]["ref"] == {"TestMiCS::test_failed_wait_is_raised": "failed"}
    assert json.loads((out / "verify.json").read_text()) == data
    # A second verification of the same commits reads the cached probes: nothing runs again.
    again = StandInProbe(pr)
    assert (
        Verification(pr, STACKS, out, str(ds.path), probe=again, regression=regression_stand_in).run()[
            "checks"
        ]
        == data["checks"]
    )
    assert again.calls == []
    # Nothing of the checkout moved: the trees came out through git archive.
    assert git(ds.path, "status", "--porcelain") == "" and "worktree" not in git(ds.path, "worktree", "list")


@pytest.mark.parametrize(
    "answers",
    [
        {("branch", "mics-hier", "2.13.0"): BUG},  # the branch leaves the hierarchical gather broken
        {("branch", "zero3", "2.1.0"): BUG},  # the change breaks the control
        {("ref", "mics@plain", "2.13.0"): CLEAN},  # REF does not show the refusal
    ],
)
def test_verification_says_no_when_any_check_fails(
    made: tuple[Path, dict[str, Any]],  # noqa: F811
    ds: FakeDeepSpeedPr,  # noqa: F811
    answers: dict[tuple[str, str, str], dict[str, Any]],
) -> None:
    out, pr = made
    data = Verification(
        pr, STACKS, out, str(ds.path), probe=StandInProbe(pr, answers), regression=regression_stand_in
    ).run()
    assert data["verified"] is False
    assert [c["ok"] for c in data["checks"]].count(False) == 1
    text = render(record_from(pr), data, None)
    assert "Not as expected" in text and "**no**" in text


def test_a_torch_the_commit_does_not_import_with_is_not_applicable(
    made: tuple[Path, dict[str, Any]],  # noqa: F811
    ds: FakeDeepSpeedPr,  # noqa: F811
) -> None:
    out, pr = made
    answers = {
        (side, key, "2.1.0"): NO_IMPORT
        for side in ("ref", "branch")
        for key in ("mics", "mics-hier", "zero3")
    }
    data = Verification(
        pr, STACKS, out, str(ds.path), probe=StandInProbe(pr, answers), regression=regression_stand_in
    ).run()
    assert data["verified"] is True  # judged on the newest torch; 2.1.0 says nothing either way
    reporter = [c for c in data["checks"] if c["stack"] == "reporter"]
    assert [c["ok"] for c in reporter] == [None, None, None]
    assert data["regression"][0]["ok"] is None and "not run" in data["regression"][0]["why"]
    text = render(record_from(pr), data, None)
    # not applicable: listed with its reason, once for the checks that share it, not in the table
    assert "Not as expected, or not applicable:" in text and "custom_op" in text
    assert "\n- `mics`, `mics-hier`, `zero3`, torch 2.1.0: not applicable" in text
    assert "| `mics` | 2.1.0" not in text and "| `mics` | 2.13.0 |" in text
    # the callers' evidence names only judged checks
    assert "`mics-hier` on torch 2.13.0: REF reproduced" in text and "`mics-hier` on torch 2.1.0" not in text


def test_nothing_judged_is_not_verified(made: tuple[Path, dict[str, Any]], ds: FakeDeepSpeedPr) -> None:  # noqa: F811
    out, pr = made
    answers = {
        (s, k, t): NO_IMPORT
        for s in ("ref", "branch")
        for k in ("mics", "mics-hier", "zero3", "mics@plain")
        for t in ("2.1.0", "2.13.0")
    }
    data = Verification(
        pr, STACKS, out, str(ds.path), probe=StandInProbe(pr, answers), regression=regression_stand_in
    ).run()
    assert data["verified"] is False


def test_range_rows_cells_cache_and_description(
    made: tuple[Path, dict[str, Any]],  # noqa: F811
    ds: FakeDeepSpeedPr,  # noqa: F811
    tmp_path: Path,
) -> None:
    out, pr = made
    from repro.upstream.pr.verify_run import tag_reader

    read, _ = tag_reader(str(ds.path))
    columns = [pr_range.Column("2.0.1", "cpu"), pr_range.Column("2.13.0", "cpu-latest")]
    verification = Verification(
        pr, STACKS, out, str(ds.path), probe=StandInProbe(pr), regression=regression_stand_in
    ).run()
    cache = CellCache("pr-range", tmp_path / "range-cache")
    survey, probe = StandInSurvey(), StandInProbe(pr)

    def affected() -> pr_range.AffectedRange:
        return pr_range.AffectedRange(
            pr, columns, ["0.9.1", "0.9.2", "0.9.9"], out, str(ds.path), read, verification,
            cache=cache, survey=survey, probe=probe,
        )  # fmt: skip

    data = affected().run()
    # 3 releases x 2 torch, stock and fixed, less the fixed probe of the release that did not run
    # on 2.13.0; plus REF and the branch on 2.0.1 (2.13.0's came from verify.json).
    assert data["complete"] and data["probes_run"] == 11 + 2 and data["probes_cached"] == 2
    assert ("2.13.0", "fixed", ("0.9.2", "0.9.9")) in survey.calls
    applies = {r["deepspeed"]: r["applies"] for r in data["rows"]}
    # v0.9.1 has no MiCS handle (the fix does not apply), v0.9.2 does, 0.9.9 has no tag here.
    assert applies["0.9.1"] is False and applies["0.9.2"] is True and applies["0.9.9"] is None
    ref_row = data["rows"][-1]
    assert ref_row["is_ref"] and ref_row["cells"]["2.13.0"]["stock"]["outcome"] == "reproduced"
    assert ref_row["cells"]["2.13.0"]["fixed"]["outcome"] == "clean"
    # 2.13.0's REF cells came from verify.json; 2.0.1's were probed.
    assert [(c.torch, c.commit) for c in probe.calls] == [("2.0.1", pr["ref_sha"]), ("2.0.1", pr["commit"])]

    again = affected().run()
    assert again["probes_run"] == 0 and again["probes_cached"] == 15
    assert len(survey.calls) == 4  # nothing surveyed the second time

    # One release missing from the cache: a survey needs two ends, so that one is a probe.
    (cache.root / f"{pr_range.cell_key(columns[0], '0.9.2', 'stock')}.json").unlink()
    before = len(probe.calls)
    assert affected().run()["probes_run"] == 1 and len(survey.calls) == 4
    assert [(c.deepspeed, c.patch, c.torch) for c in probe.calls[before:]] == [("0.9.2", "stock", "2.0.1")]

    text = render(record_from(pr), verification, again)
    assert "## Affected range" in text and "| torch 2.0.1 | torch 2.13.0 |" in text
    assert "| 0.9.2 | yes | clean / clean | bug (illegal-work-divergence) / clean |" in text
    assert "| 0.9.1 | no | clean / clean | crashed (crash) |" in text
    assert "## Verified in the lab" in text
    # torches that agree share a row
    assert "| regression test | 2.1.0, 2.13.0 | 1 failed | 1 passed | yes |" in text
    assert "| `mics@plain` | 2.13.0 | crashed (crash) | clean (none) | yes |" in text
    # the points raised upstream carry the lab's evidence
    assert "In the lab on plain gloo (torch 2.13.0, flat MiCS, 4 ranks): REF crashed" in text
    failed_wait = (
        "`TestMiCS::test_failed_wait_is_raised` (torch 2.1.0, 2.13.0): failed at REF, passed on the branch"
    )
    assert failed_wait in text
    assert "ZeRO-3 control (torch 2.1.0, 2.13.0): clean at REF, clean on the branch" in text
    # each call site is listed once, with the checks of the function that holds it
    lines = [line for line in text.splitlines() if "in `_hierarchical_all_gather_params`" in line]
    assert lines and all(
        "Lab: `mics-hier` on torch 2.1.0, 2.13.0: REF reproduced" in line for line in lines
    ), lines


@pytest.mark.parametrize("target", ["/etc", "../../outside", "../.."])
def test_a_tree_whose_link_leaves_it_is_refused(ds: FakeDeepSpeedPr, tmp_path: Path, target: str) -> None:  # noqa: F811
    (ds.path / "deepspeed/escape").symlink_to(target)
    git(ds.path, "add", "-A")
    git(ds.path, "commit", "-q", "-m", "a link out")
    sha = git(ds.path, "rev-parse", "HEAD")
    with pytest.raises(UsageError, match="deepspeed/escape"):
        export_tree(str(ds.path), sha, tmp_path / "tree", ["deepspeed"])
    assert not (tmp_path / "tree" / "deepspeed").exists()


def test_the_rerendered_description_is_scrubbed_of_host_paths(
    made: tuple[Path, dict[str, Any]],  # noqa: F811
    ds: FakeDeepSpeedPr,  # noqa: F811
) -> None:
    """Reasons are quoted from run records; a host path in one must not reach PR_DESCRIPTION.md."""

    from repro.upstream.pr import verify_run as pr_verify_run

    out, pr = made
    home = str(Path.home())
    leaky = {**BUG, "reason": f"crash in {home}/.cache/mics-repro/venvs/x/deepspeed/mics.py line 240"}
    answers = {("branch", "mics", "2.1.0"): leaky}
    args = pr_verify_run.VerifyRequest(ds_repo=str(ds.path), engine="venv", verify=True, range=False)
    verified = pr_verify_run.run(
        out, args, {"probe": StandInProbe(pr, answers), "regression": regression_stand_in}
    )
    text = (out / "PR_DESCRIPTION.md").read_text()
    assert verified is False and "Not as expected" in text and "line 240" in text
    assert home not in text and "/.cache/mics-repro" in json.dumps(
        json.loads((out / "verify.json").read_text())
    )


def test_pr_verify_without_pr_json_is_a_usage_error(tmp_path: Path, ds: FakeDeepSpeedPr) -> None:  # noqa: F811
    assert cli.main(["pr-verify", "--pr", str(tmp_path), "--ds-repo", str(ds.path)]) == 2


@pytest.mark.parametrize(
    ("reason", "want"),
    [
        (
            "BuildError: venv for cpu+ds0.9.5: pip step deepspeed failed (exit 1) (AttributeError: "
            "'FieldInfo' object has no attribute 'required')",
            "AttributeError: 'FieldInfo' object has no attribute 'required'",
        ),
        (
            "environment: ImportError: cannot import name 'log' from 'torch.x' (/root/.cache/venv/a.py)",
            "ImportError: cannot import name 'log' from 'torch.x'",
        ),
        (
            "crashed on rank 1: TypeError: _coalescing_manager() missing 1 required positional argument: "
            "'reqs'",
            "TypeError: _coalescing_manager() missing 1 required positional argument: 'reqs'",
        ),
        ("no progress for 60 s", "no progress for 60 s"),
    ],
)
def test_cause_is_the_last_error_named(reason: str, want: str) -> None:
    assert pr_range.cause({"reason": reason}) == want


def test_range_notes_and_fix_applies_without_a_tag() -> None:
    from repro.upstream.pr.description import range_table

    failing = {"outcome": "env-error", "signature": "none", "reason": "environment: ImportError: no log"}
    ranged = {
        "columns": [{"torch": "2.1.0", "env": "cpu"}, {"torch": "2.13.0", "env": "cpu-latest"}],
        "rows": [
            {
                "deepspeed": "0.19.6",
                "applies": None,
                "cells": {"2.1.0": {"stock": failing}, "2.13.0": {"stock": BUG, "fixed": CLEAN}},
            },
            {
                "deepspeed": "0.12.6",
                "applies": None,
                "cells": {"2.1.0": {"stock": failing}, "2.13.0": {"stock": failing}},
            },
        ],
        "complete": True,
    }
    table = range_table(ranged)
    assert table is not None
    assert [r["applies"] for r in table["rows"]] == ["yes (by its fixed run; no tag)", "?"]
    assert table["rows"][0]["cells"] == ["does not import", "bug (illegal-work-divergence) / clean"]
    assert table["notes"] == [
        {
            "what": "does not import: ImportError: no log",
            "where": ["0.19.6 + torch 2.1.0", "0.12.6 + torch 2.1.0", "0.12.6 + torch 2.13.0"],
        }
    ]


def test_log_path_keeps_the_version_dots(tmp_path: Path) -> None:
    from repro.upstream.pr.out_folders import log_path

    assert log_path(tmp_path / "torch2.13.0-ref-stock") == tmp_path / "torch2.13.0-ref-stock.log"


def test_a_survey_never_reuses_an_earlier_folder(tmp_path: Path) -> None:
    (tmp_path / "torch2.1.0-fixed").mkdir()
    (tmp_path / "torch2.1.0-fixed-2").mkdir()
    assert pr_range.fresh_folder(tmp_path / "torch2.1.0-fixed") == tmp_path / "torch2.1.0-fixed-3"
    assert pr_range.fresh_folder(tmp_path / "x") == tmp_path / "x"


def test_the_torches_come_from_refs_ci_and_the_suite_runs_on_its_default() -> None:
    """#43 item 6: the reporter's torch, every preset of REF's cpu-torch-latest.yml and the
    newest; DeepSpeed's own tests (the long step) on the torch that workflow installs by default."""
    from repro.matrix.schema import load_matrix
    from repro.upstream.pr.checks import UPSTREAM_CI
    from repro.upstream.pr.verify_run import stacks

    matrix = load_matrix()
    ci = {"default": "2.10.0", "presets": ["2.7.1", "2.10.0", "2.13.0"]}
    chosen = stacks(matrix, ci)
    assert [(s.name, s.env, s.torch) for s in chosen] == [
        ("reporter", "cpu", "2.1.0"),
        ("torch2.7.1", "cpu+torch2.7.1+ds0.19.6", "2.7.1"),
        ("torch2.10.0", "cpu+torch2.10.0+ds0.19.6", "2.10.0"),
        ("newest", "cpu-latest", "2.13.0"),  # a preset that is the newest's torch: one stack
    ]
    assert [s.name for s in chosen if s.suite] == ["torch2.10.0"]
    keys = [(stack.name, check.key) for stack, check in pr_checks.plan(chosen)]
    assert {k for n, k in keys if n == "torch2.7.1"} == {"mics", "mics-hier", "zero3", "mics@plain"}
    assert chosen[1].kind == UPSTREAM_CI and chosen[0].kind == "reporter"
    # No workflow at REF (an older DeepSpeed): the two stacks of the matrix, both with the suite.
    assert [(s.name, s.suite) for s in stacks(matrix, None)] == [("reporter", True), ("newest", True)]


def test_torches_chooses_and_refuses_what_cannot_be_verified() -> None:
    from repro.matrix.schema import load_matrix
    from repro.upstream.pr.verify_run import stacks

    matrix = load_matrix()
    ci = {"default": "2.10.0", "presets": ["2.10.0"]}
    chosen = stacks(matrix, ci, "2.10.0, 2.13.0,2.10.0")
    assert [(s.name, s.suite) for s in chosen] == [("torch2.10.0", True), ("newest", False)]
    chosen = stacks(matrix, ci, "2.9.1,2.13.0")  # REF's CI torch not among them: the suite on each
    assert [(s.name, s.suite) for s in chosen] == [("torch2.9.1", True), ("newest", True)]
    refused = (("2.10.0+cpu", "not a torch release"), ("x", "not a torch release"), ("1.5.0", "knows"))
    for bad, words in refused:
        with pytest.raises(UsageError) as err:
            stacks(matrix, ci, bad)
        assert words in err.value.render(), bad
    with pytest.raises(UsageError, match="names no torch"):
        stacks(matrix, ci, " , ")


def test_the_suite_runs_only_on_its_stacks(
    made: tuple[Path, dict[str, Any]],  # noqa: F811
    ds: FakeDeepSpeedPr,  # noqa: F811
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    out, pr = made
    ran: list[str] = []

    def suite(call: Any) -> dict[str, Any]:
        ran.append(call.torch)
        return {"tests": {}, "counts": {}, "exit_code": 0, "from_log": False}

    stacks = [replace(STACKS[0], suite=False), STACKS[1]]
    data = Verification(
        pr, stacks, out, str(ds.path), "venv", StandInProbe(pr, {}), regression_stand_in,
        CellCache("pr-verify", tmp_path / "cache" / "pr-verify"), suite=suite,
    ).run()  # fmt: skip
    assert [e["torch"] for e in data["suite"]] == ["2.13.0"] and set(ran) == {"2.13.0"}
