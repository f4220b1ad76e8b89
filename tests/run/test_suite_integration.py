"""The reproduction with the real torch and DeepSpeed releases, as `make repro` runs it (CPU: ranks
forked from the pre-imported launcher; tests/run/test_launcher_parity.py compares it with torchrun).

Each env runs once per module through the front door (`python -m repro repro --engine venv`,
which reuses the env's cached venv; tests/envpython.py says when one exists) and the tests check
the records it wrote: the outcomes, the evidence behind them, and that nothing was left running.
What is asserted is the behaviour these releases show (docs/background.md §2), found by the tool itself
from losses, log lines and exceptions. The last test merges every invocation into one report
and reads the report back against the records (several envs, two invocations of one env).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from repro.workload.classify import first_divergent_step
from tests.fixtures.cpu_plan import run_repro

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def reporter_fp16(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("cpu-fp16") / "results"
    return out, run_repro(
        "cpu", out, "--dtype", "fp16", "--scenarios", "mics", "--no-sync-proof", "--steps", "8"
    )


@pytest.fixture(scope="module")
def newest_stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("cpu-latest") / "results"
    return out, run_repro("cpu-latest", out, "--stall-timeout", "40", "--steps", "8")


@pytest.fixture(scope="module")
def mics_removed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("cpu-ds0198") / "results"
    return out, run_repro(
        "cpu-ds0198", out, "--scenarios", "mics,mics-hier", "--no-sync-proof", "--steps", "8"
    )


def by_name(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {(r["scenario"], r["patch"], r["transport"]): r for r in results["runs"]}


def matches_control(run: dict[str, Any], control: dict[str, Any]) -> bool:
    return (
        bool(run["losses"]) and first_divergent_step(run["losses"], control["losses"], run["dtype"]) is None
    )


def test_reporter_stack_on_cpu(reporter_stack: tuple[Path, dict[str, Any]]) -> None:
    """torch 2.1.0 + DeepSpeed 0.13.1: every scenario, stock and fixed, plus the sync control."""
    out, results = reporter_stack
    runs = by_name(results)
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

    artifacts = results["envs"]["cpu"]["artifacts"]
    assert "deepspeed" in (out / artifacts["ds_report"]).read_text().lower()
    assert "PyTorch version" in (out / artifacts["collect_env"]).read_text()


def test_fp16_overflow_storm_on_reporter_stack(reporter_fp16: tuple[Path, dict[str, Any]]) -> None:
    runs = by_name(reporter_fp16[1])
    control, stock, fixed = (
        runs[("zero3", "stock", "async")],
        runs[("mics", "stock", "async")],
        runs[("mics", "fixed", "async")],
    )
    assert control["outcome"] == "clean", control["reason"]
    assert stock["outcome"] == "reproduced" and stock["skipped_steps"] > control["skipped_steps"]
    scales = [s for s in stock["loss_scale"] if s is not None]
    assert scales and scales[-1] < scales[0], "the loss scale should fall under the overflow storm"
    assert fixed["outcome"] == "clean" and fixed["skipped_steps"] == control["skipped_steps"]


def test_newest_stack_with_mics(newest_stack: tuple[Path, dict[str, Any]]) -> None:
    """torch 2.13 + DeepSpeed 0.19.6: same bug, ValueError; replica groups deadlock (a hang)."""
    runs = by_name(newest_stack[1])
    assert runs[("mics", "stock", "async")]["outcome"] == "reproduced"
    hier = runs[("mics-hier", "stock", "async")]
    assert hier["signature"] == "illegal-work-crash" and hier["exception"]["type"] == "ValueError"
    for scenario in ("mics", "mics-hier"):
        assert runs[(scenario, "fixed", "async")]["outcome"] == "clean"
    replica = runs[("mics-replica", "stock", "async")]
    assert replica["outcome"] == "hung" and replica["signature"] == "hang"
    assert set(replica["stacks"]) == {"0", "1", "2", "3"} and all(replica["stacks"].values())


def test_mics_removed(mics_removed: tuple[Path, dict[str, Any]]) -> None:
    runs = by_name(mics_removed[1])
    assert runs[("zero3", "stock", "async")]["outcome"] == "clean"
    for key, run in runs.items():
        if key[0] != "zero3":
            assert run["outcome"] == "unsupported" and "MiCS" in run["reason"]


# ---- one report from every invocation above, read back against the records ------------------


def _bug(record: dict[str, Any]) -> bool:
    return record["outcome"] == "reproduced" or (
        record["outcome"] == "crashed" and record["signature"] == "illegal-work-crash"
    )


def _expected_headline(records: list[dict[str, Any]]) -> tuple[str, str]:
    """(reproduces, fixed) for one env, worked out from its records alone."""
    stock = [
        r for r in records if r["scenario"] != "zero3" and r["patch"] == "stock" and r["transport"] != "sync"
    ]
    if any(_bug(r) for r in stock):
        reproduces = "yes"
    elif stock and all(r["outcome"] == "unsupported" for r in stock):
        reproduces = "unsupported"
    else:
        reproduces = "other"
    fixed_of = {
        (r["scenario"], r["dtype"], r["transport"], r["world_size"]): r
        for r in records
        if r["patch"] == "fixed"
    }
    twins = [
        fixed_of.get((r["scenario"], r["dtype"], r["transport"], r["world_size"])) for r in stock if _bug(r)
    ]
    if not twins:
        fixed = "n/a" if reproduces == "unsupported" else "other"
    elif all(t is not None and t["outcome"] == "clean" and t["illegal_work_messages"] == 0 for t in twins):
        fixed = "yes"
    else:
        fixed = "no"
    return reproduces, fixed


def test_report_from_several_envs_agrees_with_records(
    reporter_stack: tuple[Path, dict[str, Any]],
    reporter_fp16: tuple[Path, dict[str, Any]],
    newest_stack: tuple[Path, dict[str, Any]],
    mics_removed: tuple[Path, dict[str, Any]],
    tmp_path: Path,
) -> None:
    folders = [reporter_stack[0], reporter_fp16[0], newest_stack[0], mics_removed[0]]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro",
            "report",
            "--results",
            ",".join(map(str, folders)),
            "--out",
            str(tmp_path / "report"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    markdown = (tmp_path / "report" / "REPORT.md").read_text()
    assert (tmp_path / "report" / "report.html").stat().st_size > 0

    records: dict[str, list[dict[str, Any]]] = {}
    for _out, results in (reporter_stack, reporter_fp16, newest_stack, mics_removed):
        for record in results["runs"]:
            records.setdefault(record["env"], []).append(record)
    assert set(records) == {"cpu", "cpu-latest", "cpu-ds0198"}

    # Headline: one line per env, each answer as the records have it.
    headline = {h["env"]: h for h in report["headline"]}
    assert set(headline) == set(records)
    for env_id, runs in records.items():
        reproduces, fixed = _expected_headline(runs)
        assert headline[env_id]["reproduces"] == reproduces, (env_id, headline[env_id])
        if fixed != "other":
            assert headline[env_id]["fixed"] == fixed, (env_id, headline[env_id])
        assert f"`{env_id}`" in markdown or env_id in markdown

    # The table carries every run of every invocation, with the record's own numbers.
    cells = {}
    for row in report["table"]:
        for side in ("stock", "fixed"):
            if row[side]:
                cells[row[side]["run"]] = row[side]
    for env_id, runs in records.items():
        for record in runs:
            matching = [
                c
                for ident, c in cells.items()
                if ident.endswith("/" + record["run_name"]) and ident.startswith(env_id)
            ]
            assert matching, f"{env_id}/{record['run_name']} missing from the table"
            assert any(
                c["outcome"] == record["outcome"]
                and c["illegal_work"] == record["illegal_work_messages"]
                and c["skipped_steps"] == record["skipped_steps"]
                and c["first_divergent_step"] == record["first_divergent_step"]
                for c in matching
            ), (record["run_name"], matching)

    # MiCS logic or ROCm: CPU-only evidence, so the GPU comparison is named as missing, and the
    # sync-transport control's IllegalWork count is the record's.
    cause = report["cause"]
    assert cause["verdict"] == "needs-gpu-evidence"
    assert any("ROCm" in m["what"] or "nccl" in m["what"] for m in cause["missing"])
    sync = next(r for r in records["cpu"] if r["transport"] == "sync")
    assert any(f"{sync['illegal_work_messages']} IllegalWork" in e["text"] for e in cause["evidence"])

    # Upgrading: the newer stack still reproduces, the newest DeepSpeed has no MiCS: not a fix.
    upgrade = report["upgrade"]
    steps = {s["env"]: s for s in upgrade["steps"]}
    assert _expected_headline(records["cpu-latest"])[0] == "yes"
    assert steps["cpu-latest"]["outcome"] == "still-reproduces"
    assert steps["cpu-ds0198"]["outcome"] == "mics-removed"
    assert upgrade["verdict"] == "no"

    # Anything else the runs found: every hung record is a finding with its stacks.
    hung = sorted(
        (r["env"], r["run_name"]) for runs in records.values() for r in runs if r["outcome"] == "hung"
    )
    findings = [f for f in report["findings"] if f["kind"] == "hang"]
    assert sorted((f["env"], f["run"].rsplit("/", 1)[-1]) for f in findings) == hung
    assert all(f["excerpt"] for f in findings)
