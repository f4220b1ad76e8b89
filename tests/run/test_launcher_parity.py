"""The two launchers give the same evidence (issue: speed without changing what a run means).

The same plan runs twice in the real env, once with every run under its own torchrun and once
with the ranks forked from the pre-imported launcher (repro/workload/prefork_server.py). They
must agree on every run's outcome, signature, IllegalWork message count and exception type, and
for the runs whose numbers are deterministic (the control and the fixed runs: every gather
waited) on the losses and the final weights' checksum, bit for bit. The stock MiCS runs read
buffers that gloo fills while nobody waits, so their NaN pattern and checksum may differ from
one run to the next under either launcher; their outcome and message counts may not.

The reporter's stack's prefork half is the session's run of that plan through the front door
(tests/fixtures/cpu_plan.py, which test_suite_integration.py asserts on too); only its torchrun
half runs here, with the same steps.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from envpython import env_python

from repro.workload.runner import _rank_pids, alive
from tests.fixtures.cpu_plan import REPORTER_STEPS

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

PLANS = {
    # the reporter's stack: the whole default plan (control, 3 scenarios x stock/fixed, sync proof)
    "cpu": ("--steps", REPORTER_STEPS),
    # the newest torch and DeepSpeed: the fork path must hold there too
    "cpu-latest": ("--scenarios", "mics", "--no-sync-proof"),
}


def _suite(env_id: str, launcher: str, out: Path, plan: tuple[str, ...]) -> dict[str, Any]:
    python = env_python(env_id)
    argv = [python, "-m", "repro.workload.suite", "--env", env_id, "--device", "cpu"]
    argv += ["--out", str(out), "--no-artifacts", "--launcher", launcher, *plan]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data: dict[str, Any] = json.loads((out / "suite.json").read_text())
    for record in data["runs"]:
        run_dir = out / "runs" / record["run_name"]
        assert not [p for p in _rank_pids(str(run_dir)) if alive(p)], record["run_name"]
    return data


def _deterministic(record: dict[str, Any]) -> bool:
    return record["patch"] == "fixed" or (record["scenario"] == "zero3" and record["patch"] == "stock")


def _front_door_suite(reporter_stack: tuple[Path, dict[str, Any]]) -> dict[str, Any]:
    """The session's prefork run of the reporter's plan: its suite.json (run_repro checked that no
    rank outlived its run)."""
    out, _results = reporter_stack
    data: dict[str, Any] = json.loads((out / "cpu" / "suite.json").read_text())
    return data


@pytest.mark.parametrize("env_id", sorted(PLANS))
def test_prefork_and_torchrun_give_the_same_evidence(
    env_id: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    slow = _suite(env_id, "torchrun", tmp_path / "torchrun", PLANS[env_id])
    if env_id == "cpu":
        fast = _front_door_suite(request.getfixturevalue("reporter_stack"))
    else:
        fast = _suite(env_id, "prefork", tmp_path / "prefork", PLANS[env_id])
    assert slow["launcher"]["used"] == "torchrun" and fast["launcher"]["used"] == "prefork"
    assert fast["launcher"]["server"]["ready"] is True
    slow_runs = {r["run_name"]: r for r in slow["runs"]}
    fast_runs = {r["run_name"]: r for r in fast["runs"]}
    assert list(slow_runs) == list(fast_runs) and slow_runs
    compared = 0
    for name, a in slow_runs.items():
        b = fast_runs[name]
        assert a["launcher"] == {"kind": "torchrun", "note": ""}, name
        assert b["launcher"] == {"kind": "prefork", "note": ""}, name
        for key in ("outcome", "signature", "illegal_work_messages", "skipped_steps", "control_run"):
            assert a[key] == b[key], (name, key, a[key], b[key])
        assert (a["exception"] or {}).get("type") == (b["exception"] or {}).get("type"), name
        assert a["versions"] == b["versions"] and a["transport_info"] == b["transport_info"], name
        if _deterministic(a) and a["outcome"] == "clean":
            assert a["losses"] and a["losses"] == b["losses"], name
            assert a["weights_checksum"] and a["weights_checksum"] == b["weights_checksum"], name
            compared += 1
    assert compared >= 2  # at least the control and one fixed run were compared bit for bit
