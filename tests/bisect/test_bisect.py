"""The pure bisection/survey core, the outcome -> verdict table, and the bisect/survey commands
driven end to end through the real orchestration with a fake matrix and a fake engine."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.bisect.probe import BadIf, Judge, Observation, verdict_for
from repro.bisect.search import Bisection, BisectStatus, ProbeVerdict, Survey
from repro.cli import bisect_commands as bisect_cli
from repro.core.errors import Interrupted, UsageError
from tests.fixtures.scripted_verdicts import B, G, U, bisect, regressions, scripted, survey


def regression(n: int, first_bad: int) -> list[ProbeVerdict]:
    return [G if i < first_bad else B for i in range(n)]


# -- bisection core --------------------------------------------------------------------------
def test_finds_the_boundary_of_a_literal_list() -> None:
    asked, judge = scripted([G, G, G, B, B, B, B, B])
    result = bisect(range(8), judge)
    assert result.status is BisectStatus.FOUND
    assert (result.before, result.after, result.before_verdict) == (2, 3, G)
    assert asked[:2] == [0, 7]  # both ends are checked before any midpoint
    assert [i for i, _ in result.probes] == asked


@pytest.mark.parametrize("first_bad", [1, 7])
def test_boundary_at_either_edge(first_bad: int) -> None:
    result = bisect(range(8), scripted(regression(8, first_bad))[1])
    assert (result.before, result.after) == (first_bad - 1, first_bad)


def test_two_candidates_cost_two_probes() -> None:
    result = bisect(range(2), scripted([G, B])[1])
    assert (result.before, result.after, result.probe_count) == (0, 1, 2)


def test_unknowns_at_the_start_are_searched_not_walked() -> None:
    asked, judge = scripted([U, U, U, G, G, B, B, B])
    result = bisect(range(8), judge)
    assert asked == [0, 7, 3, 5, 4]  # more in tests/bisect/test_bisect_search_unknowns.py
    assert (result.before, result.after) == (4, 5)


def test_unknowns_at_the_end_are_searched_not_walked() -> None:
    asked, judge = scripted([G, G, B, B, B, U, U, U])
    result = bisect(range(8), judge)
    assert asked == [0, 7, 3, 1, 2]
    assert (result.before, result.after) == (1, 2)


def test_unknown_midpoint_is_stepped_around() -> None:
    verdicts = [G, G, G, G, U, B, B, B, B]
    asked, judge = scripted(verdicts)
    result = bisect(range(9), judge)
    assert 4 in asked  # the midpoint was tried, found unknown, and a neighbour probed instead
    assert (result.before, result.after, result.unknown_between) == (3, 5, (4,))


def test_unknowns_inside_the_boundary_are_reported() -> None:
    result = bisect(range(6), scripted([G, G, U, U, B, B])[1])
    assert (result.before, result.after, result.unknown_between) == (1, 4, (2, 3))


def test_all_unknown_gives_no_verdict() -> None:
    result = bisect(range(5), scripted([U] * 5)[1])
    assert result.status is BisectStatus.NO_VERDICT
    assert result.probe_count == 5


def test_same_verdict_at_both_ends_gives_no_transition() -> None:
    asked, judge = scripted([B, B, G, B, B])
    result = bisect(range(5), judge)
    assert result.status is BisectStatus.NO_TRANSITION
    assert asked == [0, 4]


def test_only_one_decisive_end_is_no_transition() -> None:
    result = bisect(range(4), scripted([G, U, U, U])[1])
    assert result.status is BisectStatus.NO_TRANSITION
    assert result.before_verdict is G


def test_a_fix_is_found_the_same_way() -> None:
    result = bisect(range(6), scripted([B, B, B, B, G, G])[1])
    assert (result.before, result.after, result.before_verdict) == (3, 4, B)


def test_fewer_than_two_candidates() -> None:
    assert bisect([1], scripted([G])[1]).status is BisectStatus.TOO_FEW


def test_recording_twice_is_a_programming_error() -> None:
    state = Bisection(3)
    state.record(0, G)
    with pytest.raises(ValueError):
        state.record(0, G)


def test_bounds_narrow_as_probes_come_in() -> None:
    state = Bisection(17)
    assert state.bounds() == (0, 16)  # nothing known: resume from the whole range
    verdicts = regression(17, 11)
    spans = []
    while (i := state.next_probe()) is not None:
        state.record(i, verdicts[i])
        lo, hi = state.bounds()
        assert verdicts[lo] is G and verdicts[hi] is B
        spans.append(hi - lo)
    assert spans[-1] == 1 and spans == sorted(spans, reverse=True)


@pytest.mark.parametrize("n", range(2, 70))
def test_probe_count_bound_exhaustive(n: int) -> None:
    limit = math.ceil(math.log2(n)) + 2
    for first_bad in range(1, n):
        result = bisect(range(n), scripted(regression(n, first_bad))[1])
        assert (result.before, result.after) == (first_bad - 1, first_bad)
        assert result.probe_count <= limit, (n, first_bad, result.probe_count)


@settings(max_examples=300, deadline=None)
@given(regressions(300))
def test_probe_count_bound_hypothesis(case: tuple[int, int]) -> None:
    n, first_bad = case
    result = bisect(range(n), scripted(regression(n, first_bad))[1])
    assert (result.before, result.after) == (first_bad - 1, first_bad)
    assert result.probe_count <= math.ceil(math.log2(n)) + 2


@settings(max_examples=400, deadline=None)
@given(regressions(60, lambda n: st.lists(st.booleans(), min_size=n, max_size=n)))
def test_unknowns_never_hide_a_wrong_answer(case: tuple[int, int, list[bool]]) -> None:
    n, first_bad, unknown = case
    truth = regression(n, first_bad)
    seen = [U if unknown[i] else truth[i] for i in range(n)]
    result = bisect(range(n), scripted(seen)[1])
    assert result.probe_count <= n and len({i for i, _ in result.probes}) == result.probe_count
    known = [i for i in range(n) if seen[i] is not U]
    if not known:
        assert result.status is BisectStatus.NO_VERDICT
    elif seen[known[0]] is seen[known[-1]]:
        assert result.status is BisectStatus.NO_TRANSITION
    else:
        assert result.status is BisectStatus.FOUND
        assert result.before is not None and result.after is not None
        assert seen[result.before] is G and seen[result.after] is B
        assert result.before < first_bad <= result.after
        # Everything strictly inside the boundary was tried and found unknown.
        assert result.unknown_between == tuple(range(result.before + 1, result.after))
        assert all(seen[i] is U for i in result.unknown_between)


# -- survey core -----------------------------------------------------------------------------
def test_survey_finds_every_change_of_a_literal_list() -> None:
    keys = ["a"] * 5 + ["b"] * 9 + ["c"] * 2
    result = survey(keys, lambda k: k)
    assert [(c.before, c.after, c.key_before, c.key_after) for c in result.change_points] == [
        (4, 5, "a", "b"),
        (13, 14, "b", "c"),
    ]
    assert result.probe_count < len(keys)


def test_survey_with_equal_ends_probes_only_the_ends() -> None:
    result = survey(["x"] * 20, lambda k: k)
    assert result.order == (0, 19) and result.change_points == ()


def test_survey_every_probes_all_and_sees_islands() -> None:
    keys = ["a", "a", "b", "a", "a"]
    assumed = survey(keys, lambda k: k)
    assert assumed.change_points == ()  # ends agree: the island is not looked for
    every = survey(keys, lambda k: k, every=True)
    assert every.order == (0, 1, 2, 3, 4)
    assert [(c.before, c.after) for c in every.change_points] == [(1, 2), (2, 3)]


def test_survey_steps_around_unknowns() -> None:
    keys: list[str | None] = [None, "a", "a", None, None, "b", "b", None]
    result = survey(keys, lambda k: k)
    assert [(c.before, c.after) for c in result.change_points] == [(2, 5)]
    assert result.change_points[0].unknown_between == (3, 4)
    assert {0, 7} <= set(result.keys)  # the edges were tried and walked over


def blocks(draw: Any) -> list[int]:
    sizes = draw(st.lists(st.integers(1, 12), min_size=1, max_size=6))
    return [b for b, size in enumerate(sizes) for _ in range(size)]


@settings(max_examples=300, deadline=None)
@given(st.composite(blocks)())
def test_survey_finds_all_changes_of_distinct_blocks(keys: list[int]) -> None:
    result = survey(keys, lambda k: k)
    truth = [(i, i + 1) for i in range(len(keys) - 1) if keys[i] != keys[i + 1]]
    assert [(c.before, c.after) for c in result.change_points] == truth


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=30))
def test_survey_every_matches_a_plain_scan(keys: list[str]) -> None:
    result = survey(keys, lambda k: k, every=True)
    truth = [(i, i + 1) for i in range(len(keys) - 1) if keys[i] != keys[i + 1]]
    assert [(c.before, c.after) for c in result.change_points] == truth
    assert result.probe_count == len(keys)


def test_survey_state_refuses_double_records() -> None:
    state: Survey[str] = Survey(2)
    state.record(0, "a")
    with pytest.raises(ValueError):
        state.record(0, "a")


# -- outcome -> verdict ----------------------------------------------------------------------
TABLE = {
    # outcome:      reproduced, failed
    "reproduced": (B, B),
    "clean": (G, G),
    "crashed": (U, B),
    "hung": (U, B),
    "unsupported": (U, U),
    "env-error": (U, U),
    "interrupted": (U, U),
}


@pytest.mark.parametrize("outcome", sorted(TABLE))
def test_verdict_table(outcome: str) -> None:
    want_reproduced, want_failed = TABLE[outcome]
    assert verdict_for(outcome, "none", BadIf.REPRODUCED) is want_reproduced
    assert verdict_for(outcome, "none", BadIf.FAILED) is want_failed


def test_differs_compares_outcome_and_signature() -> None:
    ref = ("reproduced", "illegal-work-crash")
    assert verdict_for("reproduced", "illegal-work-crash", BadIf.DIFFERS, ref) is G
    assert verdict_for("reproduced", "illegal-work-divergence", BadIf.DIFFERS, ref) is B
    assert verdict_for("unsupported", "none", BadIf.DIFFERS, ref) is B
    assert verdict_for("env-error", "none", BadIf.DIFFERS, ref) is U


def obs(label: str, outcome: str, signature: str = "none") -> Observation:
    return Observation(label, outcome, signature, "why", 1.0)


def test_judge_takes_its_reference_from_the_first_decisive_probe() -> None:
    judge = Judge(BadIf.DIFFERS)
    assert judge(obs("1", "env-error")) is U
    assert judge(obs("2", "clean")) is G
    assert judge.reference == ("clean", "none")
    assert judge(obs("3", "reproduced", "illegal-work-divergence")) is B


# -- the commands, through the real orchestration ------------------------------------------------
from repro.bisect.driver import WalkRequest  # noqa: E402
from tests.fixtures.fake_bisect import (  # noqa: E402 - the fakes the commands below run on
    TORCHES,
    FakeEngine,
    FakeEnv,
    FakeMatrix,
    parse,
    torch_behaviour,
)


def walk_argv(
    tmp: Path, axis: str, versions: str, *argv: str, out: str | None = "o", results: Path | None = None
) -> list[str]:
    """The options of `bisect`/`survey` over `versions` of `axis`, `argv` between them and the output
    folders: `--out tmp/out` (none where out is None), `--results-root` results or tmp."""
    where = ["--out", str(tmp / out)] if out is not None else []
    return ["--axis", axis, "--versions", versions, *argv, *where, "--results-root", str(results or tmp)]


def walk_args(
    command: str,
    tmp: Path,
    axis: str,
    versions: str,
    *argv: str,
    out: str | None = "o",
    results: Path | None = None,
) -> WalkRequest:
    return parse(command, walk_argv(tmp, axis, versions, *argv, out=out, results=results))


def run_bisect(
    tmp: Path, engine: FakeEngine, extra: list[str], out: str = "out"
) -> tuple[dict[str, Any], list[str]]:
    lines: list[str] = []
    args = walk_args("bisect", tmp, "torch", TORCHES, *extra, out=out, results=tmp / "results")
    services = bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lines.append)
    assert bisect_cli.run_bisect(args, services) == 0
    return json.loads((tmp / out / "bisect.json").read_text()), lines


def test_bisect_command_finds_first_bad_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, lines = run_bisect(tmp_path, FakeEngine(torch_behaviour), ["--from", "2.0.0", "--to", "2.3.0"])
    assert (data["status"], data["last_good"], data["first_bad"]) == ("found", "2.0.1", "2.1.0")
    assert data["direction"] == "regression"
    assert data["evidence"]["first_bad"]["reason"] == "reproduced because 2.1.0"
    assert data["repro_command"] == "make repro ENV=cpu TORCH=2.1.0 SCENARIOS=mics PATCH=stock"
    assert data["probe_count"] <= math.ceil(math.log2(8)) + 2
    for probe in data["probes"]:
        assert {"version", "outcome", "signature", "verdict", "reason", "seconds"} <= set(probe)
    assert data["change_points"][0]["before"] == "2.0.1" and data["change_points"][0]["after"] == "2.1.0"
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["env"] for r in results["runs"]} == {p["env"] for p in data["probes"]}
    assert any("first bad: 2.1.0" in line for line in lines)
    assert any(data["repro_command"] in line for line in lines)


def test_second_identical_bisect_reuses_every_env(tmp_path: Path) -> None:
    engine = FakeEngine(torch_behaviour)
    first, _ = run_bisect(tmp_path, engine, ["--from", "2.0.0"], out="one")
    second, _ = run_bisect(tmp_path, engine, ["--from", "2.0.0"], out="two")
    assert first["envs_built"] == first["probe_count"] and first["envs_reused"] == 0
    assert second["envs_built"] == 0 and second["envs_reused"] == second["probe_count"]
    assert [p["version"] for p in first["probes"]] == [p["version"] for p in second["probes"]]


def test_install_failure_is_stepped_around(tmp_path: Path) -> None:
    engine = FakeEngine(torch_behaviour, broken=["2.0.1-0.13.1", "2.1.1-0.13.1"])
    data, _ = run_bisect(tmp_path, engine, ["--from", "2.0.0", "--to", "2.3.0"])
    assert (data["last_good"], data["first_bad"]) == ("2.0.0", "2.1.0")
    assert data["unknown_between"] == ["2.0.1"]
    broken = [p for p in data["probes"] if p["version"] == "2.0.1"]
    assert broken and broken[0]["outcome"] == "env-error" and broken[0]["verdict"] == "unknown"


def test_a_release_the_matrix_cannot_pair_is_unknown(tmp_path: Path) -> None:
    lines: list[str] = []
    args = walk_args("bisect", tmp_path, "torch", TORCHES, "--from", "2.0.0")
    matrix = FakeMatrix(unpairable=["2.3.0", "2.2.1"])
    bisect_cli.run_bisect(
        args, bisect_cli.Services(matrix=matrix, engine=FakeEngine(torch_behaviour), say=lines.append)
    )
    data = json.loads((tmp_path / "o" / "bisect.json").read_text())
    assert data["probes"][1]["verdict"] == "unknown"
    # The unknown end is searched past, not walked: 2.2.1 (unknown too) is never probed.
    assert [p["version"] for p in data["probes"]] == ["2.0.0", "2.3.0", "2.1.1", "2.0.1", "2.1.0"]
    assert "no wheel index" in data["probes"][1]["reason"]
    assert (data["last_good"], data["first_bad"]) == ("2.0.1", "2.1.0")


def test_versions_must_be_versions(tmp_path: Path) -> None:
    args = parse("bisect", ["--axis", "torch", "--versions", "2.0.1,main,2.1.0", "--from", "2.0.1"])
    with pytest.raises(UsageError):
        bisect_cli.run_bisect(
            args, bisect_cli.Services(matrix=FakeMatrix(), engine=FakeEngine(torch_behaviour))
        )


def test_deepspeed_axis_keeps_the_torch_pin(tmp_path: Path) -> None:
    def ds(env: FakeEnv) -> tuple[str, str]:
        assert env.torch == "2.1.0"
        return ("reproduced", "illegal-work-crash") if env.deepspeed < "0.13.0" else ("clean", "none")

    lines: list[str] = []
    args = walk_args(
        "bisect", tmp_path, "deepspeed", "0.12.5,0.12.6,0.13.0,0.13.1", "--torch", "2.1.0", "--from", "0.12.5"
    )
    services = bisect_cli.Services(matrix=FakeMatrix(), engine=FakeEngine(ds), say=lines.append)
    bisect_cli.run_bisect(args, services)
    data = json.loads((tmp_path / "o" / "bisect.json").read_text())
    # Bad at the start, good at the end: the range shows where it was fixed.
    assert (data["direction"], data["first_bad"], data["last_good"]) == ("fix", "0.12.6", "0.13.0")
    layered = {p["version"]: p["layered_on"] for p in data["probes"]}
    assert layered["0.12.6"] == "/venvs/base" and layered.get("0.13.1", None) is None
    assert any("layered on base" in line for line in lines)
    assert (
        data["repro_command"] == "make repro ENV=cpu TORCH=2.1.0 DEEPSPEED=0.12.6 SCENARIOS=mics PATCH=stock"
    )


def test_bad_if_differs_uses_the_good_end_as_reference(tmp_path: Path) -> None:
    def removed(env: FakeEnv) -> tuple[str, str]:
        return ("unsupported", "none") if env.torch >= "2.2" else ("reproduced", "illegal-work-divergence")

    data, _ = run_bisect(tmp_path, FakeEngine(removed), ["--from", "2.1.0", "--bad-if", "differs"])
    assert (data["last_good"], data["first_bad"]) == ("2.1.2", "2.2.0")
    assert data["reference"] == ["reproduced", "illegal-work-divergence"]


def test_unsupported_is_unknown_for_the_default_rule(tmp_path: Path) -> None:
    def removed(env: FakeEnv) -> tuple[str, str]:
        return ("unsupported", "none") if env.torch >= "2.2" else ("reproduced", "illegal-work-divergence")

    data, lines = run_bisect(tmp_path, FakeEngine(removed), ["--from", "2.1.0"])
    assert data["status"] == "no-transition"
    assert any("survey" in line for line in lines)


def test_interrupted_bisect_prints_a_resume_command(tmp_path: Path) -> None:
    engine = FakeEngine(torch_behaviour, interrupt_at=4)
    args = walk_args("bisect", tmp_path, "torch", TORCHES, "--from", "2.0.0")
    with pytest.raises(Interrupted) as info:
        bisect_cli.run_bisect(
            args, bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lambda _: None)
        )
    data = json.loads((tmp_path / "o" / "bisect.json").read_text())
    assert data["interrupted"] and data["probe_count"] == 3
    lo, hi = (
        data["resume_command"].split("FROM=")[1].split()[0],
        data["resume_command"].split("TO=")[1].split()[0],
    )
    assert (lo, hi) != ("2.0.0", "2.3.0")  # narrowed by the probes already made
    versions = TORCHES.split(",")
    assert versions.index(lo) < versions.index("2.1.0") <= versions.index(hi)
    assert data["resume_command"] in info.value.fix


def test_dry_run_touches_no_engine(tmp_path: Path) -> None:
    lines: list[str] = []
    args = walk_args("bisect", tmp_path, "torch", TORCHES, "--from", "2.0.1", "--dry-run", out=None)
    engine = FakeEngine(torch_behaviour)
    bisect_cli.run_bisect(args, bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lines.append))
    assert engine.prepares == 0 and not list(tmp_path.iterdir())
    assert any("2.0.1, 2.1.0" in line for line in lines)


DS_RELEASES = "0.12.5,0.12.6,0.13.0,0.13.1,0.13.2,0.13.3,0.14.0,0.14.5,0.15.0,0.16.0,0.19.6,0.19.7,0.19.8"


def ds_survey_argv(tmp: Path, out: str) -> list[str]:
    """`survey` over DS_RELEASES on torch 2.1.0."""
    return walk_argv(tmp, "deepspeed", DS_RELEASES, "--from", "0.12.5", "--torch", "2.1.0", out=out)


def ds_landscape(env: FakeEnv) -> tuple[str, str]:
    from packaging.version import Version

    v = Version(env.deepspeed)
    if v < Version("0.13.0"):
        return "reproduced", "illegal-work-crash"
    if v < Version("0.13.2"):
        return "reproduced", "illegal-work-divergence"
    if v < Version("0.19.7"):
        return "reproduced", "illegal-work-warnings"
    return "unsupported", "none"


@pytest.mark.parametrize("every", [False, True])
def test_survey_command_reports_every_change_point(tmp_path: Path, every: bool) -> None:
    lines: list[str] = []
    argv = ds_survey_argv(tmp_path, "s")
    args = parse("survey", argv + (["--every"] if every else []))
    engine = FakeEngine(ds_landscape, broken=["2.1.0-0.14.0"])
    assert (
        bisect_cli.run_survey(args, bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lines.append))
        == 0
    )
    data = json.loads((tmp_path / "s" / "survey.json").read_text())
    got = [
        (c["before"], c["after"], c["signature_before"], c["signature_after"]) for c in data["change_points"]
    ]
    assert got == [
        ("0.12.6", "0.13.0", "illegal-work-crash", "illegal-work-divergence"),
        ("0.13.1", "0.13.2", "illegal-work-divergence", "illegal-work-warnings"),
        ("0.19.6", "0.19.7", "illegal-work-warnings", "none"),
    ]
    assert data["change_points"][2]["outcome_after"] == "unsupported"
    n = len(DS_RELEASES.split(","))
    assert data["probe_count"] == n if every else data["probe_count"] < n
    if every:
        assert data["unknown"] == ["0.14.0"]
    assert [s["outcome"] for s in data["segments"]] == ["reproduced"] * 3 + ["unsupported"]


def test_interrupted_survey_saves_what_it_has_and_names_the_command(tmp_path: Path) -> None:
    """The one driver handles Ctrl-C for both commands: save, mark interrupted, say how to go on."""
    argv = ds_survey_argv(tmp_path, "s")
    engine = FakeEngine(ds_landscape, interrupt_at=3)
    with pytest.raises(Interrupted) as info:
        bisect_cli.run_survey(
            parse("survey", argv), bisect_cli.Services(matrix=FakeMatrix(), engine=engine, say=lambda _: None)
        )
    data = json.loads((tmp_path / "s" / "survey.json").read_text())
    assert data["interrupted"] and data["probe_count"] == 2 and not data.get("done")
    results = json.loads((tmp_path / "s" / "results.json").read_text())
    command = results["invocation"]["command"]
    assert command == (
        f"make survey AXIS=deepspeed FROM=0.12.5 TO=0.19.8 TORCH=2.1.0 VERSIONS={DS_RELEASES} "
        "ENV=cpu SCENARIO=mics PATCH=stock"
    )
    assert command in info.value.fix


def test_bisect_rejects_pinning_the_walked_axis(tmp_path: Path) -> None:
    args = parse("bisect", ["--axis", "torch", "--torch", "2.1.0", "--versions", TORCHES, "--from", "2.0.0"])
    with pytest.raises(UsageError):
        bisect_cli.run_bisect(
            args, bisect_cli.Services(matrix=FakeMatrix(), engine=FakeEngine(torch_behaviour))
        )


def test_bisect_refuses_to_overwrite_out(tmp_path: Path) -> None:
    run_bisect(tmp_path, FakeEngine(torch_behaviour), ["--from", "2.0.0"])
    with pytest.raises(UsageError):
        run_bisect(tmp_path, FakeEngine(torch_behaviour), ["--from", "2.0.0"])


def test_report_reads_the_timeline_files(tmp_path: Path) -> None:
    from repro.report.timeline import load_timelines

    data, _ = run_bisect(tmp_path, FakeEngine(torch_behaviour), ["--from", "2.0.0"])
    args = parse("survey", ds_survey_argv(tmp_path, "out"))
    with pytest.raises(UsageError):  # the bisect already wrote results.json there
        bisect_cli.run_survey(args, bisect_cli.Services(matrix=FakeMatrix(), engine=FakeEngine(ds_landscape)))
    args = replace(args, folder=replace(args.folder, out=tmp_path / "survey"))
    bisect_cli.run_survey(
        args, bisect_cli.Services(matrix=FakeMatrix(), engine=FakeEngine(ds_landscape), say=lambda _: None)
    )
    (bisect_timeline,) = load_timelines(tmp_path / "out")
    (survey_timeline,) = load_timelines(tmp_path / "survey")
    assert bisect_timeline["change_points"][0]["after"] == data["first_bad"]
    assert len(bisect_timeline["probes"]) == data["probe_count"]
    assert [c["after"] for c in survey_timeline["change_points"]] == ["0.13.0", "0.13.2", "0.19.7"]
