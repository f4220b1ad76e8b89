"""`python -m repro gpu-check` with the device layer faked: the whole command runs on CPU.

The fake device answers as a GPU host would (an H200, 8 MI100s, a torch 2.0 env, a broken fix):
host facts, a prepared venv, the probes' JSON, the records `repro` writes and the exit codes.
Plan and verdicts are real; nothing starts a process.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from repro.cli import main as cli
from repro.engines.base import EngineKind, Prepared
from repro.matrix.schema import load_matrix
from repro.run import gpu_check as gc
from repro.run.gpu_check_plan import StepKind, Verdict, plan

H200 = [{"index": "0", "name": "NVIDIA H200", "driver": "550.54.15", "arch": "sm_90"}]
MI100 = [{"index": str(i), "arch": "gfx908"} for i in range(8)]

ILLEGAL = {"ok": False, "result": None, "error": "ValueError: Illegal to call wait on IllegalWork object"}
OK = {"ok": True, "result": "NoneType", "error": None}


def raw_facts(torch: str = "2.1.0+cu121", works: int = 1) -> dict[str, Any]:
    return {
        "probe": "raw-torch",
        "torch": torch,
        "ran_on": {"device": "gpu", "backend": "nccl", "nccl": "2.18.1", "gpus": ["NVIDIA H200"]},
        "manager": "async_ops",
        "placeholder_type": "_IllegalWork",
        "placeholder_wait": ILLEGAL,
        "cm_works": works,
        "async_landed": True,
        "sync_exit": OK,
        "sync_landed": True,
    }


def gather(ok: bool) -> dict[str, Any]:
    return {
        "async_call": OK,
        "async_handle": "_CoalescingManager" if ok else "_IllegalWork",
        "async_wait": OK if ok else ILLEGAL,
        "async_landed_after_wait": ok,
        "sync_call": OK if ok else ILLEGAL,
        "sync_landed": ok,
    }


def ds_facts(stock_ok: bool = False, fixed_ok: bool = True) -> dict[str, Any]:
    return {
        "probe": "ds-gather",
        "torch": "2.1.0",
        "deepspeed": "0.13.1",
        "stock": gather(stock_ok),
        "fix": {"applied": True},
        "fixed": gather(fixed_ok),
    }


def record(scenario: str, patch: str, outcome: str, gpus: list[str]) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "patch": patch,
        "outcome": outcome,
        "transport": "native",
        "reason": "",
        "ran_on": {"device": "gpu", "gpus": gpus},
    }


def not_run(scenario: str, patch: str) -> dict[str, Any]:
    """A record of a run the suite never launched because torch saw no GPU."""
    return {
        "scenario": scenario,
        "patch": patch,
        "outcome": "env-error",
        "transport": "native",
        "reason": "env platform is cuda but torch (CUDA 12.1 build) sees no GPU",
        "ran_on": {"device": None, "gpus": [], "ran": False},
    }


class FakeDevice:
    """A GPU host as gpu-check sees it; `answers` overrides what a step gets."""

    def __init__(self, gpus: list[dict[str, str]], platform: str = "cuda", **answers: Any) -> None:
        self.gpus, self.platform, self.answers = gpus, platform, answers
        self.calls: list[tuple[str, Any]] = []

    def host_facts(self) -> dict[str, Any]:
        return {"platform": self.platform, "gpus": self.gpus, "visible": len(self.gpus), "driver": "x"}

    def prepare(self, env: Any) -> Prepared:
        self.calls.append(("prepare", env.id))
        return Prepared(
            EngineKind.VENV, env.id, "/venvs/x", "/venvs/x", True, {"platform": env.platform.value}
        )

    def probe(self, prepared: Prepared, probe: str, out: Path, timeout_s: float) -> int:
        self.calls.append(("probe", probe))
        facts = self.answers.get(probe) or (raw_facts() if probe == "raw-torch" else ds_facts())
        out.write_text(json.dumps(facts))
        return 0

    def smoke(self, prepared: Prepared, argv: Sequence[str], run_dir: Path, timeout_s: float) -> int:
        patch = argv[argv.index("--patch") + 1]
        self.calls.append(("smoke", patch))
        config = json.loads((run_dir / "ds_config.json").read_text())
        assert config["zero_optimization"]["mics_shard_size"] == 1
        rank = {"losses": [2.0, 1.9, 1.8], "ran_on": {"device": "gpu", "gpus": ["NVIDIA H200"]}}
        (run_dir / "rank0.json").write_text(json.dumps(rank))
        return 0

    def cli(self, args: Sequence[str], hide_gpus: bool, timeout_s: float) -> int:
        command = args[0]
        self.calls.append(("cli", (command, hide_gpus)))
        out = Path(args[args.index("--out") + 1])
        out.mkdir(parents=True)
        if command == "check-fix":  # GPUs hidden: torch saw none, every run env-error, none launched
            hidden = self.answers.get("hidden_runs")
            if hidden is None:
                hidden = [not_run("zero3", "fixed"), not_run("mics", "fixed")]
            (out / "results.json").write_text(json.dumps({"runs": hidden}))
            return int(self.answers.get("hidden_exit", 6))
        names = [str(g.get("name") or g.get("arch")) for g in self.gpus]
        runs = self.answers.get("runs") or [record("zero3", "stock", "clean", names[:1])]
        if len(self.gpus) > 1 and "runs" not in self.answers:
            for scenario in ("mics", "mics-hier"):
                runs += [
                    record(scenario, "stock", "reproduced", names),
                    record(scenario, "fixed", "clean", names),
                ]
        (out / "results.json").write_text(json.dumps({"runs": runs}))
        return 0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeDevice]:
    made: dict[str, FakeDevice] = {}

    def install(device: FakeDevice) -> None:
        made["device"] = device
        monkeypatch.setattr("repro.run.gpu_check_device.HostDevice", lambda: device)

    made["install"] = install  # type: ignore[assignment]
    return made


def run_check(
    fake: dict[str, Any], device: FakeDevice, tmp_path: Path, *extra: str
) -> tuple[int, dict[str, Any]]:
    fake["install"](device)
    code = cli.main(["gpu-check", "--out", str(tmp_path / "gc"), *extra])
    data = json.loads((tmp_path / "gc" / "gpu-check.json").read_text())
    return code, data


def verdicts(data: dict[str, Any]) -> dict[str, str]:
    return {s["step"]: s["verdict"] for s in data["steps"]}


def test_single_h200_proves_every_step(fake: dict[str, Any], tmp_path: Path) -> None:
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
    fake: dict[str, Any], tmp_path: Path
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


def test_a_fix_that_does_not_gather_fails_the_check(fake: dict[str, Any], tmp_path: Path) -> None:
    code, data = run_check(fake, FakeDevice(H200, **{"ds-gather": ds_facts(fixed_ok=False)}), tmp_path)
    assert code == 15 and data["ok"] is False and verdicts(data)["ds-gather"] == "failed"


def test_hidden_gpus_must_verify_nothing(fake: dict[str, Any], tmp_path: Path) -> None:
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
    fake: dict[str, Any], tmp_path: Path, runs: list[dict[str, Any]]
) -> None:
    code, data = run_check(fake, FakeDevice(H200, hidden_exit=6, hidden_runs=runs), tmp_path)
    hidden = next(s for s in data["steps"] if s["step"] == "check-fix-hidden")
    assert code == 15 and hidden["verdict"] == "failed", hidden["summary"]
    assert hidden["facts"]["exit_code"] == 6


def test_hidden_proof_names_the_records(fake: dict[str, Any], tmp_path: Path) -> None:
    code, data = run_check(fake, FakeDevice(H200), tmp_path)
    hidden = next(s for s in data["steps"] if s["step"] == "check-fix-hidden")
    assert code == 0 and hidden["verdict"] == "proven"
    assert [r["ran"] for r in hidden["facts"]["runs"]] == [False, False]
    assert "torch saw none" in hidden["summary"]


def test_zero3_on_cpu_is_no_proof_for_a_gpu(fake: dict[str, Any], tmp_path: Path) -> None:
    cpu_run = {**record("zero3", "stock", "clean", []), "ran_on": {"device": "cpu", "gpus": []}}
    code, data = run_check(fake, FakeDevice(H200, runs=[cpu_run]), tmp_path)
    assert code == 15 and verdicts(data)["repro"] == "failed"


def test_stock_that_works_is_not_provable_not_failed(fake: dict[str, Any], tmp_path: Path) -> None:
    code, data = run_check(fake, FakeDevice(H200, **{"ds-gather": ds_facts(stock_ok=True)}), tmp_path)
    assert code == 0 and verdicts(data)["ds-gather"] == "not provable on this host"


def test_lost_work_is_named(fake: dict[str, Any], tmp_path: Path) -> None:
    code, data = run_check(
        fake, FakeDevice(H200, **{"raw-torch": raw_facts("2.2.2+rocm5.7", works=0)}), tmp_path
    )
    raw = next(s for s in data["steps"] if s["step"] == "raw-torch")
    assert code == 0 and raw["verdict"] == "proven" and "pytorch#122807" in raw["summary"]


def test_failed_build_skips_what_needs_the_venv(fake: dict[str, Any], tmp_path: Path) -> None:
    from repro.core.errors import BuildError

    class NoBuild(FakeDevice):
        def prepare(self, env: Any) -> Prepared:
            raise BuildError("venv for cuda: pip step torch failed")

    code, data = run_check(fake, NoBuild(H200), tmp_path)
    assert code == 15
    assert verdicts(data)["build"] == "failed" and verdicts(data)["repro"] == "skipped"
    assert not any(c[0] in ("probe", "cli", "smoke") for c in fake["device"].calls)


def test_no_gpu_is_exit_11(fake: dict[str, Any], tmp_path: Path) -> None:
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


# ---- integration: the in-env probes themselves, on gloo with the CPU transport adapter -------------


@pytest.mark.integration
@pytest.mark.parametrize("env_id", ["cpu", "cpu-latest"])
def test_probes_run_in_the_env_and_the_judge_reads_them(
    env_id: str, tmp_path: Path, real_subprocess: None
) -> None:
    import os
    import subprocess

    from repro.core.paths import REPO_ROOT
    from repro.run import gpu_check_judge as judge
    from tests.envpython import env_python

    python = env_python(env_id)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    facts = {}
    for probe in ("raw-torch", "ds-gather"):
        out = tmp_path / f"{probe}.json"
        done = subprocess.run(
            [python, "-m", "repro.workload.gpucheck", probe, "--device", "cpu", "--out", str(out)],
            env=env,
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        facts[probe] = json.loads(out.read_text())
    raw = judge.raw_torch(facts["raw-torch"])
    assert raw.verdict is Verdict.PROVEN and facts["raw-torch"]["placeholder_type"] == "_IllegalWork"
    ds = judge.ds_gather(facts["ds-gather"])
    assert ds.verdict is Verdict.PROVEN, ds.summary  # stock fails, fixed gathers async and sync


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
