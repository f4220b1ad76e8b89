"""The env's platform decides the device (repro/workload/device.py, the suite, the orchestrator):
no silent CPU fallback for a GPU env, no GPU for the CPU env, layouts from the GPUs really seen,
fp16 by default on GPUs. torch and torchrun are faked; the records are the suite's own."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from repro.workload import device as dev
from repro.workload import runner, suite
from tests.fixtures.layouts import layout_shapes, reporter_layouts
from tests.fixtures.prefork import FakePreforkServer
from tests.fixtures.runspec import LaunchStandIn

ROCM_NO_GPU = dev.TorchView(gpus=0, hip="5.6.31061-8c743ae5d", cuda=None)


def test_decide_cpu_needs_no_probe_and_ignores_gpus() -> None:
    assert dev.decide("cpu", None) == dev.Decision("cpu", 0, "cpu")
    assert dev.decide("cpu", dev.TorchView(gpus=8, cuda="12.1")).device == "cpu"


def test_decide_gpu_platforms() -> None:
    ok = dev.decide("rocm", dev.TorchView(gpus=8, hip="5.6"))
    assert (ok.device, ok.gpus, ok.error) == ("gpu", 8, None)
    assert dev.decide("cuda", dev.TorchView(gpus=2, cuda="12.1")).error is None
    assert dev.decide("gpu", dev.TorchView(gpus=1, hip="6.1")).error is None
    # auto keeps the old behaviour for hand-made command lines
    assert dev.decide("auto", dev.TorchView(gpus=0, cuda="12.1")).device == "cpu"
    assert dev.decide("auto", dev.TorchView(gpus=4, cuda="12.1")).device == "gpu"


def test_no_gpu_names_causes_and_fixes() -> None:
    missing = dev.decide("rocm", ROCM_NO_GPU)
    assert missing.device == "gpu" and missing.gpus == 0 and missing.error
    for words in ("/dev/kfd", "--device /dev/dri", "gfx908", "driver", "no evidence for rocm"):
        assert words in missing.error.replace("nothing here can be evidence", "no evidence"), words
    no_access = dev.decide(
        "rocm", dev.TorchView(0, "5.6", None, None, {"/dev/kfd": False, "/dev/dri/renderD128": False})
    )
    assert no_access.error and "usermod -aG render,video" in no_access.error
    assert "--device /dev/dri" not in no_access.error  # the nodes are there: not the first suspect
    cuda = dev.decide("cuda", dev.TorchView(0, None, "12.1", "CUDA initialization: no driver", {}))
    assert cuda.error and "--gpus all" in cuda.error and "nvidia-smi" in cuda.error
    assert "no driver" in cuda.error


def test_wrong_kind_of_torch_is_an_env_error() -> None:
    cuda_torch = dev.decide("rocm", dev.TorchView(gpus=1, cuda="12.1"))
    assert cuda_torch.error and "torch.version.hip is None" in cuda_torch.error
    rocm_torch = dev.decide("cuda", dev.TorchView(gpus=1, hip="5.6"))
    assert rocm_torch.error and "ROCm" in rocm_torch.error


class FakeLaunch(LaunchStandIn):
    """Stands in for torchrun on GPUs: rank records as a real GPU run writes them."""

    def __init__(self) -> None:
        self.specs: list[runner.RunSpec] = []
        self.lock = threading.Lock()

    def launch(self, spec: runner.RunSpec, stop: threading.Event | None, server: Any) -> runner.LaunchResult:
        with self.lock:
            self.specs.append(spec)
        for rank in range(spec.world_size):
            data = {
                "rank": rank,
                "losses": [2.0, 1.9],
                "illegal_work_messages": 0,
                "exception": None,
                "versions": {"torch": "fake", "cuda": "12.1"},
                "steps_completed": 2,
                "backend": "nccl",
                "ran_on": {
                    "device": "gpu",
                    "backend": "nccl",
                    "gpu_count": 1,
                    "gpus": ["NVIDIA H200"],
                    "arch": ["sm_90"],
                    "hip": None,
                    "cuda": "12.1",
                    "nccl": "2.18.1",
                    "ran": True,
                },
            }
            Path(spec.run_dir, f"rank{rank}.json").write_text(json.dumps(data))
        return runner.LaunchResult(None, 0, 0.1, {}, "")


def _refuse_launch(
    spec: runner.RunSpec, progress: Any = None, stop: Any = None, server: Any = None
) -> runner.LaunchResult:
    raise AssertionError(f"nothing may be launched here, got {spec.run_name}")


def _suite(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    view: dev.TorchView | None,
    argv: str,
    launch: Any = _refuse_launch,
) -> dict[str, Any]:
    """The suite run with the options `argv` (split at spaces) on a host whose torch sees `view`."""

    def probe() -> dev.TorchView:
        if view is None:
            raise AssertionError("a cpu env must not ask torch about GPUs")
        return view

    monkeypatch.setattr(suite.dev, "probe", probe)
    monkeypatch.setattr(suite.runner, "launch", launch)
    monkeypatch.setattr(suite, "mics_available", lambda: True)
    monkeypatch.setattr(suite, "start_prefork", lambda out, device: FakePreforkServer())
    out = tmp_path / "out"
    assert suite.main(["--out", str(out), "--no-artifacts", "--jobs", "1", *argv.split()]) == 0
    data: dict[str, Any] = json.loads((out / "suite.json").read_text())
    return data


def test_rocm_env_without_gpu_ends_every_run_env_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _suite(tmp_path, monkeypatch, ROCM_NO_GPU, "--env rocm56 --device rocm")
    runs = data["runs"]
    assert len(runs) == 7  # control + 3 scenarios x 2 patches, nothing over a CPU transport
    assert {r["outcome"] for r in runs} == {"env-error"}
    assert all("/dev/kfd" in r["reason"] and "render" in r["reason"] for r in runs)
    assert {r["transport"] for r in runs} == {"native"} and {r["dtype"] for r in runs} == {"fp16"}
    for r in runs:
        assert r["ran_on"]["device"] is None and r["ran_on"]["ran"] is False
        assert r["ran_on"]["env_platform"] == "rocm" and r["ran_on"]["hip"].startswith("5.6")
    assert data["device_error"] and data["platform"] == "rocm"
    from repro.run.summary import verdict_lines

    assert not any("REPRODUCED" in line for line in verdict_lines(runs))


def test_cpu_env_runs_on_cpu_on_a_gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launched = FakeLaunch()
    data = _suite(
        tmp_path,
        monkeypatch,
        None,
        "--env cpu --device cpu --world-size 2 --scenarios mics --patches stock --no-sync-proof",
        launch=launched,
    )
    assert {s.device for s in launched.specs} == {"cpu"} and data["device"] == "cpu"
    assert {r["dtype"] for r in data["runs"]} == {"fp32"}  # CPU keeps its default precision
    env = runner.launch_env(launched.specs[0])
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["HIP_VISIBLE_DEVICES"] == ""
    assert env["DS_ACCELERATOR"] == "cpu"


def test_one_gpu_runs_the_control_and_says_what_mics_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched = FakeLaunch()
    data = _suite(
        tmp_path, monkeypatch, dev.TorchView(gpus=1, cuda="12.1"), "--env cuda --device cuda", launch=launched
    )
    assert [s.run_name for s in launched.specs] == ["zero3-stock-fp16-native-w1"]
    by_outcome: dict[str, list[dict[str, Any]]] = {}
    for r in data["runs"]:
        by_outcome.setdefault(r["outcome"], []).append(r)
    assert [r["scenario"] for r in by_outcome["clean"]] == ["zero3"]
    assert len(by_outcome["unsupported"]) == 6
    needs = {r["scenario"]: r["reason"] for r in by_outcome["unsupported"]}
    assert "needs at least 2 GPUs" in needs["mics"] and "needs at least 4 GPUs" in needs["mics-replica"]
    control = by_outcome["clean"][0]
    assert control["ran_on"]["gpus"] == ["NVIDIA H200"] and control["ran_on"]["env_platform"] == "cuda"
    assert "planned_device" not in control["ran_on"]  # what rank 0 said, not what was planned
    from repro.run.summary import verdict_lines

    assert "FIX DOES NOT RESOLVE IT" not in verdict_lines(data["runs"])[0]


def test_eight_gpus_run_the_reporters_layouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launched = FakeLaunch()
    _suite(
        tmp_path,
        monkeypatch,
        dev.TorchView(gpus=8, hip="5.6"),
        "--env rocm56 --device rocm --patches stock",
        launch=launched,
    )
    assert layout_shapes(launched.specs) == reporter_layouts(8)
    hier = [s for s in launched.specs if s.scenario == "mics-hier"]
    assert {runner.launch_env(s)["NDEV_PER_NODE"] for s in hier} == {"4"}


def test_world_size_above_the_gpus_is_an_env_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _suite(
        tmp_path, monkeypatch, dev.TorchView(gpus=4, hip="5.6"), "--env rocm56 --device rocm --world-size 8"
    )
    assert {r["outcome"] for r in data["runs"]} == {"env-error"}
    assert "WORLD_SIZE=8" in data["runs"][0]["reason"]


def test_dtype_default_and_override() -> None:
    assert suite.default_dtype("gpu", None) == "fp16"
    assert suite.default_dtype("cpu", None) == "fp32"
    assert suite.default_dtype("gpu", {"bf16": {"enabled": True}}) == "bf16"


def test_orchestrator_passes_the_envs_platform() -> None:
    from repro.matrix.schema import load_matrix
    from repro.run.orchestrate import Request, plan

    matrix = load_matrix()
    steps = plan(matrix, Request(env_ids=("cpu", "rocm56", "cuda")))
    devices = {s.env.id: s.suite_args[s.suite_args.index("--device") + 1] for s in steps}
    assert devices == {"cpu": "cpu", "rocm56": "rocm", "cuda": "cuda"}
    for step in steps:  # the suite accepts what the orchestrator sends
        suite.parser().parse_args([*step.suite_args, "--out", "x"])


def test_world_size_one_is_the_control_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launched = FakeLaunch()
    data = _suite(
        tmp_path,
        monkeypatch,
        dev.TorchView(gpus=8, cuda="12.1"),
        "--env cuda --device cuda --world-size 1 --patches fixed",
        launch=launched,
    )
    assert [s.run_name for s in launched.specs] == ["zero3-stock-fp16-native-w1"]
    assert [r["outcome"] for r in data["runs"]] == ["clean"] + ["unsupported"] * 3
    with pytest.raises(SystemExit):
        suite.main(["--env", "x", "--out", str(tmp_path / "odd"), "--world-size", "3"])


def test_gpu_default_is_the_reporters_fp16_with_their_loss_scale_settings() -> None:
    from repro.core.paths import REPO_ROOT
    from repro.workload import ds_config

    reporter = json.loads((Path(REPO_ROOT) / "repro" / "configs" / "reporter_ds_config.json").read_text())
    shape = ds_config.ScenarioShape("mics", 8, 8, False, 8)
    built = ds_config.build_config(shape, dtype=suite.default_dtype("gpu", None)).config
    assert built["fp16"] == reporter["fp16"]
