"""Per-env verdicts, the summary table and the results store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from repro.core import results
from repro.core.errors import UsageError
from repro.core.verdict import env_verdict, fixed_runs_clean
from repro.run import summary


def r(scenario: str, patch: str, outcome: str, transport: str = "async", env: str = "cpu") -> dict[str, Any]:
    return {"env": env, "scenario": scenario, "patch": patch, "outcome": outcome, "signature": "none",
            "transport": transport, "logs": {}}


def test_reproduced_and_fixed() -> None:
    runs = [r("zero3", "stock", "clean"), r("mics", "stock", "reproduced"), r("mics", "fixed", "clean")]
    v = env_verdict("cpu", runs)
    assert v.reproduces is True and v.fix_resolves is True
    assert fixed_runs_clean(runs) == (True, [])


def test_fix_fails() -> None:
    runs = [r("mics", "stock", "reproduced"), r("mics-hier", "fixed", "clean"), r("mics", "fixed", "reproduced")]
    assert env_verdict("cpu", runs).fix_resolves is False
    ok, bad = fixed_runs_clean(runs)
    assert not ok and len(bad) == 1


def test_sync_transport_runs_do_not_decide() -> None:
    runs = [r("mics", "stock", "clean"), r("mics", "stock", "reproduced", transport="sync")]
    assert env_verdict("cpu", runs).reproduces is False


def test_unsupported_gives_no_evidence() -> None:
    v = env_verdict("cpu", [r("mics", "stock", "unsupported"), r("mics", "fixed", "unsupported")])
    assert v.reproduces is None and v.fix_resolves is None and v.problems


def test_check_fix_without_fixed_runs_fails() -> None:
    assert fixed_runs_clean([r("mics", "stock", "reproduced")])[0] is False


def test_summary_lists_every_run_and_verdict() -> None:
    runs = [r("zero3", "stock", "clean"), r("mics", "stock", "reproduced")]
    text = summary.render(runs, "results/x")
    assert text.count("\ncpu ") == 2 and "cpu: REPRODUCED" in text


def test_invocation_folder_never_reused_and_latest_points_to_newest(tmp_path: Path) -> None:
    a = results.new_invocation_dir(tmp_path, ["cpu"])
    b = results.new_invocation_dir(tmp_path, ["cpu"])
    assert a != b
    inv = results.Invocation(b, results.invocation_meta(["repro"], "make repro"))
    inv.add_runs("cpu", [{"env": "cpu", "logs": {"launcher": "runs/x/launcher.log"}}])
    results.point_latest(tmp_path, b)
    data = results.load(results.resolve_results_dir(tmp_path, None))
    assert data["runs"][0]["logs"]["launcher"] == "cpu/runs/x/launcher.log"
    assert json.loads((b / "results.json").read_text())["invocation"]["command"] == "make repro"


def test_missing_results_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        results.resolve_results_dir(tmp_path, None)
