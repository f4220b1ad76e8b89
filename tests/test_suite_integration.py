"""The reproduction suite with the real torch and DeepSpeed releases, under real torchrun.

Each test runs `python -m repro.workload.suite` in an env's venv (tests/envpython.py says which)
and checks the records it wrote: the outcomes, the evidence behind them, and that nothing was
left running. What is asserted is the behaviour these releases show (FACTS.md §2), found by
the tool itself from losses, log lines and exceptions.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from repro.workload.classify import first_divergent_step
from repro.workload.record import RECORD_KEYS
from repro.workload.runner import _alive, _rank_pids

from envpython import env_python

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def run_suite(env_id: str, out: Path, *args: str) -> dict[str, Any]:
    python = env_python(env_id)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([python, "-m", "repro.workload.suite", "--env", env_id, "--out", str(out), *args],
                          cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    suite = json.loads((out / "suite.json").read_text())
    for record in suite["runs"]:
        assert set(RECORD_KEYS) <= set(record), sorted(set(RECORD_KEYS) - set(record))
        # No rank of any run may outlive it.
        run_dir = out / "runs" / record["run_name"]
        if run_dir.exists():
            assert not [p for p in _rank_pids(str(run_dir)) if _alive(p)], record["run_name"]
    return suite


def by_name(suite: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {(r["scenario"], r["patch"], r["transport"]): r for r in suite["runs"]}


def matches_control(run: dict[str, Any], control: dict[str, Any]) -> bool:
    return bool(run["losses"]) and first_divergent_step(run["losses"], control["losses"], run["dtype"]) is None


def test_reporter_stack_on_cpu(tmp_path: Path) -> None:
    """torch 2.1.0 + DeepSpeed 0.13.1: every scenario, stock and fixed, plus the sync control."""
    suite = run_suite("cpu", tmp_path, "--steps", "8")
    runs = by_name(suite)
    control = runs[("zero3", "stock", "async")]
    assert control["outcome"] == "clean" and control["versions"]["torch"].startswith("2.1.0")

    flat = runs[("mics", "stock", "async")]
    assert flat["outcome"] == "reproduced" and flat["signature"] == "illegal-work-divergence"
    assert flat["illegal_work_messages"] > 0 and flat["first_divergent_step"] is not None

    hier = runs[("mics-hier", "stock", "async")]
    assert hier["outcome"] == "reproduced" and hier["signature"] == "illegal-work-crash"
    assert hier["exception"]["type"] == "RuntimeError"
    assert "Illegal to call wait on IllegalWork object" in hier["exception"]["message"]
    assert hier["layout"]["nodes"] == 2

    for scenario in ("mics", "mics-hier"):
        fixed = runs[(scenario, "fixed", "async")]
        assert fixed["outcome"] == "clean", fixed["reason"]
        assert fixed["illegal_work_messages"] == 0 and matches_control(fixed, control)
        assert fixed["weights_checksum"] == control["weights_checksum"]
        assert fixed["fix"] and fixed["fix"].get("applied")

    # The missing wait is the cause: the same stock code over a transport that completes every
    # collective before returning still logs the IllegalWork messages but computes correctly.
    sync = runs[("mics", "stock", "sync")]
    assert sync["illegal_work_messages"] > 0 and sync["signature"] == "illegal-work-warnings"
    assert matches_control(sync, control)

    artifacts = suite["artifacts"]
    assert "deepspeed" in (tmp_path / artifacts["ds_report"]).read_text().lower()
    assert "PyTorch version" in (tmp_path / artifacts["collect_env"]).read_text()


def test_fp16_overflow_storm_on_reporter_stack(tmp_path: Path) -> None:
    suite = run_suite("cpu", tmp_path, "--dtype", "fp16", "--scenarios", "mics", "--no-sync-proof",
                      "--no-artifacts", "--steps", "8")
    runs = by_name(suite)
    control, stock, fixed = (runs[("zero3", "stock", "async")], runs[("mics", "stock", "async")],
                             runs[("mics", "fixed", "async")])
    assert control["outcome"] == "clean", control["reason"]
    assert stock["outcome"] == "reproduced" and stock["skipped_steps"] > control["skipped_steps"]
    scales = [s for s in stock["loss_scale"] if s is not None]
    assert scales and scales[-1] < scales[0], "the loss scale should fall under the overflow storm"
    assert fixed["outcome"] == "clean" and fixed["skipped_steps"] == control["skipped_steps"]


def test_newest_stack_with_mics(tmp_path: Path) -> None:
    """torch 2.13 + DeepSpeed 0.19.6: same bug, ValueError; replica groups deadlock (a hang)."""
    suite = run_suite("cpu-latest", tmp_path, "--no-artifacts", "--stall-timeout", "40", "--steps", "8")
    runs = by_name(suite)
    assert runs[("mics", "stock", "async")]["outcome"] == "reproduced"
    hier = runs[("mics-hier", "stock", "async")]
    assert hier["signature"] == "illegal-work-crash" and hier["exception"]["type"] == "ValueError"
    for scenario in ("mics", "mics-hier"):
        assert runs[(scenario, "fixed", "async")]["outcome"] == "clean"
    replica = runs[("mics-replica", "stock", "async")]
    assert replica["outcome"] == "hung" and replica["signature"] == "hang"
    assert set(replica["stacks"]) == {"0", "1", "2", "3"} and all(replica["stacks"].values())


def test_mics_removed(tmp_path: Path) -> None:
    suite = run_suite("cpu-ds0198", tmp_path, "--no-artifacts", "--scenarios", "mics,mics-hier",
                      "--no-sync-proof", "--steps", "8")
    runs = by_name(suite)
    assert runs[("zero3", "stock", "async")]["outcome"] == "clean"
    for key, run in runs.items():
        if key[0] != "zero3":
            assert run["outcome"] == "unsupported" and "MiCS" in run["reason"]
