"""Issue 45, GPU path (round 4): what a ROCm rank records as its arch, and which visibility
variables really hide GPUs. The judge of gpu-check's hidden step is in tests/gpu/test_gpu_check.py."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from repro.engines.gpu_host import CUDA_VISIBILITY, ROCM_VISIBILITY, visible_count, visible_limit
from repro.workload import device


def _fake_torch(monkeypatch: pytest.MonkeyPatch, *, hip: str | None, cuda: str | None, props: Any) -> None:
    """A torch module as a rank on one GPU sees it (nothing of the real torch is imported)."""
    torch = types.ModuleType("torch")
    torch.version = types.SimpleNamespace(hip=hip, cuda=cuda)  # type: ignore[attr-defined]
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        device_count=lambda: 1,
        get_device_properties=lambda i: props,
        nccl=types.SimpleNamespace(version=lambda: (2, 18, 3)),
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(device, "rocm_runtime", lambda root="/": {"container": None, "host": None})


def test_rocm_arch_is_never_made_from_cuda_capability_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    # An MI100 whose torch does not expose gcnArchName: HIP's major/minor (9, 0) are no sm_90.
    mi100 = types.SimpleNamespace(name="AMD Instinct MI100", major=9, minor=0)
    _fake_torch(monkeypatch, hip="5.6.31061", cuda=None, props=mi100)
    found = device.ran_on("gpu", "nccl")
    assert found["gpus"] == ["AMD Instinct MI100"]
    assert found["arch"] == ["unknown"]


def test_rocm_arch_comes_from_gcn_arch_name(monkeypatch: pytest.MonkeyPatch) -> None:
    mi250 = types.SimpleNamespace(
        name="AMD Instinct MI250X", major=9, minor=0, gcnArchName="gfx90a:sramecc+:xnack-"
    )
    _fake_torch(monkeypatch, hip="6.1.40091", cuda=None, props=mi250)
    assert device.ran_on("gpu", "nccl")["arch"] == ["gfx90a:sramecc+:xnack-"]


def test_cuda_arch_is_the_compute_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    h200 = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0)
    _fake_torch(monkeypatch, hip=None, cuda="13.0", props=h200)
    assert device.ran_on("gpu", "nccl")["arch"] == ["sm_90"]


def test_an_empty_hip_visible_devices_hides_nothing() -> None:
    # ROCm/hip#3001: HIP ignored it and showed every GPU.
    assert visible_count(8, {"HIP_VISIBLE_DEVICES": ""}, ROCM_VISIBILITY) == 8
    assert visible_limit({"HIP_VISIBLE_DEVICES": " "}, ROCM_VISIBILITY) is None


def test_empty_rocr_or_cuda_visible_devices_still_hide_all() -> None:
    assert visible_count(8, {"HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": ""}, ROCM_VISIBILITY) == 0
    assert visible_count(8, {"CUDA_VISIBLE_DEVICES": ""}, ROCM_VISIBILITY) == 0
    assert visible_count(1, {"CUDA_VISIBLE_DEVICES": ""}, CUDA_VISIBILITY) == 0
    assert visible_count(8, {"HIP_VISIBLE_DEVICES": "0,1"}, ROCM_VISIBILITY) == 2


REPO = Path(__file__).resolve().parents[2]
# Where the lab explains itself: the docs, the Docker notes, code comments/messages, templates.
EXPLAINING = [
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "docker" / "README.md",
    *sorted((REPO / "repro").rglob("*.py")),
    *sorted((REPO / "repro").rglob("*.j2")),
]


def _mentions(needle: str, near: str, width: int = 200) -> list[str]:
    """Files where `needle` appears within `width` characters of `near` (one paragraph)."""
    found = []
    for path in EXPLAINING:
        text = " ".join(path.read_text().split())
        at = text.find(needle)
        while at >= 0 and near not in text[max(0, at - width) : at + width]:
            at = text.find(needle, at + 1)
        if at >= 0:
            found.append(str(path.relative_to(REPO)))
    return found


def test_deepspeed_without_rocm_home_fails_with_missing_cuda_exception_not_type_error() -> None:
    # DeepSpeed 0.13.1: is_rocm_pytorch() is False without ROCM_HOME, so setup.py asks
    # installed_cuda_version(), which raises MissingCUDAException (no CUDA_HOME).
    assert _mentions("ROCM_HOME", "TypeError") == []
    for page in ("docs/gpu-hosts.md", "docker/README.md", "docs/background.md"):
        assert "MissingCUDAException" in (REPO / page).read_text(), page


def test_apptainer_rocm_is_not_said_to_override_the_wheels_libraries() -> None:
    # torch's ROCm wheels load their bundled ROCm through $ORIGIN rpaths; --rocm cannot go ahead of them.
    assert _mentions("--rocm", "ahead of") == []
    assert "$ORIGIN" in (REPO / "docs" / "background.md").read_text()
    assert "$ORIGIN" in (REPO / "repro/upstream/templates/cluster/README.md.j2").read_text()


def test_docker_readme_names_every_hiding_variable() -> None:
    text = (REPO / "docker" / "README.md").read_text()
    step = next(p for p in text.split("\n7. ")[1:2])  # the DeepSpeed install step
    for name, _ in device.HIDE_GPUS:
        assert f"{name}=''" in " ".join(step.split()), name
