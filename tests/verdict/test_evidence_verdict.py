"""The one env verdict (summary, check-fix, report, bundle) refuses to count a run for a platform
it did not run on: repro/core/verdict.py reads records through repro.core.evidence.as_evidence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from repro.core.verdict import check_fix, env_verdicts
from tests.fixtures.ran_on import CPU_RAN, ROCM_RAN


def _suite_of(env: str, ran_on: dict[str, Any]) -> list[dict[str, Any]]:
    """A control and mics stock/fixed as a suite records them (the fixed run clean and matching)."""
    ran = {**ran_on, "env_platform": "rocm"}
    common = {
        "dtype": "fp32",
        "world_size": 4,
        "transport": "native",
        "ran_on": ran,
        "steps": 3,
        "shard_size": 4,
        "hierarchical": False,
        "skipped_steps": 0,
        "illegal_work_messages": 0,
        "first_divergent_step": None,
        "weights_checksum": "w",
    }
    control = {
        **common,
        "env": env,
        "scenario": "zero3",
        "patch": "stock",
        "run_name": "zero3-stock-fp32-native-w4",
        "outcome": "clean",
        "signature": "none",
        "losses": [2.0, 1.9, 1.8],
        "control_run": None,
        "shard_size": None,
    }
    stock = {
        **common,
        "env": env,
        "scenario": "mics",
        "patch": "stock",
        "run_name": "mics-stock-fp32-native-w4",
        "outcome": "reproduced",
        "signature": "illegal-work-divergence",
        "losses": [None, None, None],
        "illegal_work_messages": 12,
        "first_divergent_step": 0,
        "control_run": control["run_name"],
    }
    fixed = {
        **common,
        "env": env,
        "scenario": "mics",
        "patch": "fixed",
        "run_name": "mics-fixed-fp32-native-w4",
        "outcome": "clean",
        "signature": "none",
        "losses": [2.0, 1.9, 1.8],
        "control_run": control["run_name"],
    }
    return [control, stock, fixed]


def test_the_verdict_refuses_a_cpu_run_as_rocm_evidence() -> None:
    on_gpu = env_verdicts(_suite_of("rocm56", ROCM_RAN))[0]
    assert "REPRODUCED" in on_gpu.headline()
    on_cpu = env_verdicts(_suite_of("rocm56", CPU_RAN))[0]
    assert "REPRODUCED" not in on_cpu.headline() and "resolves" not in on_cpu.headline()
    assert not check_fix(_suite_of("rocm56", CPU_RAN)).ok


def test_the_report_refuses_a_silent_cpu_fallback_as_rocm_evidence(tmp_path: Path) -> None:
    from fixtures.report_records import ResultsBuilder, standard_env

    from repro.report.build import build_report
    from repro.report.merge import load_and_merge

    b = ResultsBuilder(tmp_path, "20250102T000000Z-rocm56", command="make repro ENV=rocm56")
    b.env("rocm56", platform="rocm", rocm="5.6")
    standard_env(b, "rocm56")
    for record in b.runs:  # what the old `--device auto` did without a GPU: gloo on CPU
        record.update(backend="gloo", transport="async", ran_on=dict(CPU_RAN))
    folder = b.write()
    merged = load_and_merge([folder])
    assert {r.outcome.value for r in merged.runs} == {"env-error"}
    assert all("not evidence: env platform is rocm" in r.reason for r in merged.runs)
    data = json.loads(build_report([folder], tmp_path / "out").data.read_text())
    headline = next(h for h in data["headline"] if h["env"] == "rocm56")
    assert headline["reproduces"] == "inconclusive" and headline["fixed"] != "yes", headline


def test_one_cause_of_many_env_errors_is_said_once() -> None:
    runs = _suite_of("rocm56", ROCM_RAN)
    for r in runs:
        r.update(outcome="env-error", signature="none", reason="torch sees no GPU")
    verdict = env_verdicts(runs)[0]
    assert verdict.unverified_reason == "every fixed MiCS run is env-error (torch sees no GPU)"
