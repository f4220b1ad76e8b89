"""No rendered sentence compares a run with one its folder does not hold (issue 44, item 4).

Each text is rendered by the product from a folder that lacks the compared run: a stock-only probe
(no control, no fixed run), an own job's bundle (no plain ZeRO-3 run), a survey (no good/bad
verdicts), a run that died before its first step (no dtype seen)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from repro.core.runs import RunView, describe
from repro.report.build import build_report
from repro.run.job import RawRun, build_records
from repro.upstream.bundle import comment as issue_comment
from repro.upstream.bundle import source_refs
from tests.fixtures.job_records import STOCK_LOG, job_records, job_report, write_folder
from tests.fixtures.report_records import ResultsBuilder

pytestmark = pytest.mark.unit

# Words that compare a run with another one.
COMPARES_WITH_CONTROL = ("control's", "plain ZeRO-3")
COMPARES_WITH_FIXED = ("fixed run's", "part from the fixed")


def _stock_only_job() -> list[dict[str, Any]]:
    raw = RawRun("stock", job_report("stock", "torchrun --nproc_per_node 2 t.py", "/w"), STOCK_LOG, "x.log")
    return [dict(r) for r in build_records("cpu", [raw], None, "sha256:x", 600.0, "cpu")]


def _report_texts(folder: Path, out: Path) -> str:
    paths = build_report([folder], out, generated_at="2026-01-01T00:00:00Z")
    return paths.markdown.read_text() + paths.html.read_text()


def test_a_stock_only_probe_names_no_control_and_no_fixed_run(tmp_path: Path) -> None:
    [stock] = _stock_only_job()
    assert stock["first_divergent_step"] == 1  # its own NaN, nothing else to measure against
    said = describe(RunView(stock))
    assert "non-finite loss from step 1" in said, said
    assert not any(w in said for w in COMPARES_WITH_CONTROL + COMPARES_WITH_FIXED), said
    text = _report_texts(write_folder(tmp_path, "a", [stock], "2026-01-01T00:00:00+00:00"), tmp_path / "r")
    for words in COMPARES_WITH_CONTROL + COMPARES_WITH_FIXED:
        assert words not in text, [line for line in text.splitlines() if words in line][:3]


def test_a_suite_probe_without_its_control_says_non_finite_not_the_controls(tmp_path: Path) -> None:
    b = ResultsBuilder(tmp_path, "probe")
    b.env("cpu")
    b.run("cpu", "mics", "stock", outcome="reproduced", signature="illegal-work-divergence")
    b.runs[-1].update(losses=[2.5, None, None], first_divergent_step=1, control_run=None)
    said = describe(RunView(b.runs[-1]))
    assert "non-finite loss from step 1" in said and "control" not in said, said
    b.runs[-1]["control_run"] = "zero3-stock-fp32-async-w2"  # with one named, it says which
    said = describe(RunView(b.runs[-1]))
    assert "losses leave the control's (zero3-stock-fp32-async-w2) at step 1" in said, said


def test_an_own_jobs_issue_comment_claims_no_zero3_comparison() -> None:
    records = job_records()
    refs = source_refs.Refs("0.13.1", (), ())
    env = {"id": "cpu"}
    text = issue_comment.render_fitting(
        issue_comment.IssueInput("cpu", env, records, refs, "", "", "r", "c", ["true"], "make run")
    )
    assert "**clean**" in text, text
    assert "losses match plain ZeRO-3" not in text, text
    assert "no plain ZeRO-3 run here to compare losses with" in text


def test_a_survey_table_shows_each_probes_finding(tmp_path: Path) -> None:
    b = ResultsBuilder(tmp_path, "survey")
    b.env("cpu")
    b.run("cpu", "mics", "stock", outcome="reproduced", signature="illegal-work-warnings")
    folder = b.write()
    probes = [
        {"version": "0.12.6", "outcome": "clean", "signature": "none"},
        {"version": "0.13.1", "outcome": "reproduced", "signature": "illegal-work-warnings"},
        {"version": "0.14.0", "outcome": "env-error", "signature": "none"},
    ]
    (folder / "survey.json").write_text(json.dumps({"kind": "survey", "probes": probes, "change_points": []}))
    text = build_report([folder], folder, generated_at="2026-01-01T00:00:00Z").markdown.read_text()
    assert "| 0.12.6 | clean | none | clean |" in text, text
    assert "| 0.13.1 | reproduced | illegal-work-warnings | bug |" in text
    assert "| 0.14.0 | env-error | none | no-outcome |" in text


def test_a_run_that_died_before_its_first_step_has_no_default_dtype() -> None:
    early = job_report("stock", "torchrun --nproc_per_node 2 t.py", "/w", engine=False, exit_code=1)
    stock, fixed = job_records(command="torchrun --nproc_per_node 2 t.py", workdir="/w", stock=early)
    assert fixed["dtype"] == "bf16"
    # the same command's dtype (its other run trained bf16), the launcher's two ranks
    assert (stock["dtype"], stock["world_size"]) == ("bf16", 2), (stock["dtype"], stock["world_size"])
    [alone] = [
        dict(r)
        for r in build_records("cpu", [RawRun("stock", early, "boom\n", "x.log")], None, "d", 1.0, "cpu")
    ]
    assert alone["dtype"] == "unknown" and alone["dtype"] != "fp32"
