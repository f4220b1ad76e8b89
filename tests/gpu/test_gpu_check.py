"""`python -m repro gpu-check` with the device layer faked: the whole command runs on CPU.

The fake device answers as a GPU host would (an H200, 8 MI100s, a torch 2.0 env, a broken fix):
host facts, a prepared venv, the probes' JSON, the records `repro` writes and the exit codes.
Plan and verdicts are real; nothing starts a process. The in-env probes run for real in
tests/gpu/test_gpu_check_integration.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from repro.cli import main as cli
from repro.engines.base import Prepared
from repro.matrix.schema import load_matrix
from repro.run import gpu_check as gc
from repro.run.gpu_check_plan import StepKind, Verdict, plan
from tests.fixtures.fake_gpu_device import (
    H200,
    FakeDevice,
    ds_facts,
    fake,  # noqa: F401 - a fixture
    not_run,
    raw_facts,
    record,
    run_check,
)

MI100 = [{"index": str(i), "arch": "gfx908"} for i in range(8)]


def verdicts(data: dict[str, Any]) -> dict[str, str]:
    return {s["step"]: s["verdict"] for s in data["steps"]}


def test_single_h200_proves_every_step(fake: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    device = FakeDevice(H200)
    code, data = run_check(fake, device, tmp_path)
    assert code == 0 and data["ok"] is True and data["env"] == "cuda" and data["gpus"] == 1
    assert verdicts(data) == {
        "host": "proven",
        "build": "proven",
        "raw-torch": "proven",
        "ds-gather": "proven",
        "repro": "proven",
        "mics-smoke": "proven",
        "check-fix-hidden": "proven",
    }
    assert ("cli", ("check-fix", True)) in device.calls and ("cli", ("repro", False)) in device.calls
    assert [c for c in device.calls if c[0] == "smoke"] == [("smoke", "stock"), ("smoke", "fixed")]
    text = (tmp_path / "gc" / "gpu-check.txt").read_text()
    assert "PASSED" in text and "mics-smoke" in text


def test_eight_mi100s_run_mics_stock_and_fixed_and_pick_the_rocm5_env(
    fake: dict[str, Any],  # noqa: F811
    tmp_path: Path,
) -> None:
    device = FakeDevice(MI100, platform="rocm")
    code, data = run_check(fake, device, tmp_path)
    assert code == 0 and data["env"] == "rocm56" and data["gpus"] == 8
    assert "mics-smoke" not in verdicts(data) and verdicts(data)["repro"] == "proven"
    repro = next(s for s in data["steps"] if s["step"] == "repro")
    assert {(r["scenario"], r["patch"]) for r in repro["facts"]["runs"]} >= {
        ("mics", "fixed"),
        ("mics-hier", "stock"),
    }


def test_a_fix_that_does_not_gather_fails_the_check(fake: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    code, data = run_check(fake, FakeDevice(H200, **{"ds-gather": ds_facts(fixed_ok=False)}), tmp_path)
    assert code == 15 and data["ok"] is False and verdicts(data)["ds-gather"] == "failed"


def test_hidden_gpus_must_verify_nothing(fake: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    code, data = run_check(fake, FakeDevice(H200, hidden_exit=0), tmp_path)
    assert code == 15 and verdicts(data)["check-fix-hidden"] == "failed"


@pytest.mark.parametrize(
    "runs",
    [
        # A 1-GPU host where hiding did not work: zero3 ran on the GPU, MiCS is unsupported (1 GPU).
        [
            {**record("zero3", "fixed", "clean", ["NVIDIA H200"]), "ran_on": {"device": "gpu", "ran": True}},
            {**record("mics", "fixed", "unsupported", []), "ran_on": {"device": None, "ran": False}},
        ],
        # A control that crashed (it ran: nothing says the GPUs were hidden).
        [{**record("zero3", "fixed", "crashed", ["NVIDIA H200"]), "ran_on": {"device": "gpu", "ran": True}}],
        # env-error, but a record that does not say nothing ran.
        [{**not_run("zero3", "fixed"), "ran_on": {"device": "gpu", "gpus": ["NVIDIA H200"]}}],
        # No record at all (check-fix died before writing one).
        [],
    ],
    ids=["gpus-seen-mics-unsupported", "crashed-control", "ran-not-recorded", "no-records"],
)
def test_exit_6_alone_is_no_proof_the_gpus_were_hidden(
    fake: dict[str, Any],  # noqa: F811
    tmp_path: Path,
    runs: list[dict[str, Any]],
) -> None:
    code, data = run_check(fake, FakeDevice(H200, hidden_exit=6, hidden_runs=runs), tmp_path)
    hidden = next(s for s in data["steps"] if s["step"] == "check-fix-hidden")
    assert code == 15 and hidden["verdict"] == "failed", hidden["summary"]
    assert hidden["facts"]["exit_code"] == 6


def test_hidden_proof_names_the_records(fake: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    code, data = run_check(fake, FakeDevice(H200), tmp_path)
    hidden = next(s for s in data["steps"] if s["step"] == "check-fix-hidden")
    assert code == 0 and hidden["verdict"] == "proven"
    assert [r["ran"] for r in hidden["facts"]["runs"]] == [False, False]
    assert "torch saw none" in hidden["summary"]


def test_zero3_on_cpu_is_no_proof_for_a_gpu(fake: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    cpu_run = {**record("zero3", "stock", "clean", []), "ran_on": {"device": "cpu", "gpus": []}}
    code, data = run_check(fake, FakeDevice(H200, runs=[cpu_run]), tmp_path)
    assert code == 15 and verdicts(data)["repro"] == "failed"


def test_stock_that_works_is_not_provable_not_failed(fake: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    code, data = run_check(fake, FakeDevice(H200, **{"ds-gather": ds_facts(stock_ok=True)}), tmp_path)
    assert code == 0 and verdicts(data)["ds-gather"] == "not provable on this host"


def test_lost_work_is_named(fake: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    code, data = run_check(
        fake, FakeDevice(H200, **{"raw-torch": raw_facts("2.2.2+rocm5.7", works=0)}), tmp_path
    )
    raw = next(s for s in data["steps"] if s["step"] == "raw-torch")
    assert code == 0 and raw["verdict"] == "proven" and "pytorch#122807" in raw["summary"]


def test_failed_build_skips_what_needs_the_venv(fake: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    from repro.core.errors import BuildError

    class NoBuild(FakeDevice):
        def prepare(self, env: Any) -> Prepared:
            raise BuildError("venv for cuda: pip step torch failed")

    code, data = run_check(fake, NoBuild(H200), tmp_path)
    assert code == 15
    assert verdicts(data)["build"] == "failed" and verdicts(data)["repro"] == "skipped"
    assert not any(c[0] in ("probe", "cli", "smoke") for c in fake["device"].calls)


def test_no_gpu_is_exit_11(fake: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    fake["install"](FakeDevice([], platform=None))  # type: ignore[arg-type]
    assert cli.main(["gpu-check", "--out", str(tmp_path / "gc")]) == 11


def test_plan_is_data() -> None:
    one = [s.kind for s in plan("cuda", 1)]
    two = [s.kind for s in plan("cuda", 2)]
    assert StepKind.MICS_SMOKE in one and StepKind.MICS_SMOKE not in two
    assert [s for s in plan("cuda", 1) if s.kind is StepKind.HIDDEN][0].hide_gpus
    repro_step = next(s for s in plan("rocm56", 8) if s.kind is StepKind.REPRO)
    assert "mics-hier" in repro_step.cli[repro_step.cli.index("--scenarios") + 1]


def test_env_choice_follows_the_arch() -> None:
    matrix = load_matrix()
    mi300 = {"platform": "rocm", "gpus": [{"arch": "gfx942"}]}
    assert gc.choose_env(mi300, matrix, None).id == "rocm61"  # ROCm 5 wheels have no gfx942 kernels
    assert gc.choose_env({"platform": "cuda", "gpus": H200}, matrix, None).id == "cuda"
    assert Verdict.NOT_PROVABLE.ok and not Verdict.SKIPPED.ok


def test_repro_step_reads_runs_as_the_env_verdict_does() -> None:
    # A stock run that ended `crashed` with an IllegalWork crash shows the bug (core.runs), as the
    # summary says; the step must call the GPU proof proven, not "not provable".
    from repro.run import gpu_check_judge

    gpus = ["AMD Instinct MI100", "AMD Instinct MI100"]
    runs = [record("zero3", "stock", "clean", gpus[:1])]
    for scenario in ("mics", "mics-hier"):
        stock = {**record(scenario, "stock", "crashed", gpus), "signature": "illegal-work-crash"}
        runs += [stock, record(scenario, "fixed", "clean", gpus)]
    assert gpu_check_judge.repro(runs, 1, 2).verdict.value == "proven"
    runs[1] = {**runs[1], "signature": "crash"}  # another crash is not the bug
    assert gpu_check_judge.repro(runs, 1, 2).verdict.value != "proven"
