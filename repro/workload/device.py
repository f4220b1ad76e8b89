"""Which device the suite runs on, decided by the env's platform, and what actually ran.

The env's platform decides (`--device cpu|rocm|cuda`; the orchestrator passes it). A `cpu` env
runs on CPU also where torch sees a GPU (PyPI's torch is a CUDA build), and a `rocm`/`cuda` env
runs only on GPUs of its own kind: when torch sees none, or is the other kind of build, every
planned run ends `env-error` with the likely cause and its fix, and nothing is launched. The old
`auto` (GPU when torch sees one, else CPU) stays for hand-made command lines.

`decide()` is pure; `probe()` asks torch and the device nodes; `ran_on()` describes, from inside a
rank, what a run really used (the record's `ran_on`).
"""

from __future__ import annotations

import glob
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, TypedDict

REQUESTS = ("auto", "cpu", "gpu", "rocm", "cuda")

# What hides every GPU from a process (CPU runs, DeepSpeed's install, gpu-check's hidden step). All
# three: HIP honours CUDA_VISIBLE_DEVICES, but an empty HIP_VISIBLE_DEVICES did not hide AMD GPUs on
# ROCm 5.2 (ROCm/hip#3001) while an empty ROCR_VISIBLE_DEVICES, applied below HIP, did.
HIDE_GPUS: tuple[tuple[str, str], ...] = (
    ("CUDA_VISIBLE_DEVICES", ""),
    ("HIP_VISIBLE_DEVICES", ""),
    ("ROCR_VISIBLE_DEVICES", ""),
)


def hide_gpus_env() -> dict[str, str]:
    """HIDE_GPUS as a fresh dict, for `env.update(...)` / `extra_env=`."""
    return dict(HIDE_GPUS)


@dataclass(frozen=True)
class TorchView:
    """What torch and the device nodes in this env show."""

    gpus: int = 0
    hip: str | None = None  # torch.version.hip: a ROCm build
    cuda: str | None = None  # torch.version.cuda: a CUDA build
    init_error: str | None = None  # torch's warning/exception when it initialised the GPU runtime
    dev_nodes: dict[str, bool] = field(default_factory=dict)  # path -> readable and writable


@dataclass(frozen=True)
class Decision:
    device: str  # "cpu" | "gpu": what the runs use (train.py --device)
    gpus: int  # GPUs torch sees (0 on CPU)
    platform: str | None  # what the env asked for: cpu | rocm | cuda | gpu | None (auto)
    error: str | None = None  # set: no run can be evidence here; every run ends env-error with it


def probe() -> TorchView:
    import torch  # only here: the CPU path must not pay for CUDA/ROCm probing

    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception as exc:  # a broken driver/runtime raises here rather than answering
            count, error = 0, f"{type(exc).__name__}: {exc}"
    for item in caught:  # torch reports a failed runtime initialisation as a UserWarning
        if error is None and ("CUDA initialization" in str(item.message) or "HIP" in str(item.message)):
            error = str(item.message).strip()
    nodes = (
        ["/dev/kfd", *sorted(glob.glob("/dev/dri/renderD*"))]
        if hip
        else ["/dev/nvidiactl", *sorted(glob.glob("/dev/nvidia[0-9]*"))]
    )
    return TorchView(
        count, hip, cuda, error, {p: os.access(p, os.R_OK | os.W_OK) for p in nodes if os.path.exists(p)}
    )


def _rocm_causes(view: TorchView) -> list[str]:
    causes = []
    kfd = view.dev_nodes.get("/dev/kfd")
    renders = [p for p in view.dev_nodes if p.startswith("/dev/dri/renderD")]
    if kfd is None or not renders:
        causes.append(
            "the GPU device nodes are not here (/dev/kfd and /dev/dri/renderD*): pass them "
            "to the container (docker run --device /dev/kfd --device /dev/dri --group-add video "
            "--group-add render), or load the amdgpu driver on the host (ls /dev/kfd)"
        )
    elif kfd is False or not all(view.dev_nodes[p] for p in renders):
        causes.append(
            "the device nodes exist but this user cannot open them: add the user to the groups "
            "that own /dev/kfd and /dev/dri/renderD* (usually render and video: "
            "sudo usermod -aG render,video $USER, then log in again; containers: --group-add)"
        )
    causes.append(
        "the GPU's gfx arch is not one this torch wheel was built for (rocminfo | grep gfx; "
        "MI100 is gfx908, MI200 gfx90a, MI300 gfx942): use an env whose torch supports it"
    )
    causes.append("HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES hide every GPU: unset them or list GPUs")
    causes.append(
        "the ROCm kernel driver or runtime is missing or too old for this torch (dmesg | grep amdgpu)"
    )
    return causes


def _cuda_causes(view: TorchView) -> list[str]:
    causes = []
    if not view.dev_nodes:
        causes.append(
            "no NVIDIA device nodes are here (/dev/nvidia*): give the container the GPUs "
            "(docker run --gpus all, which needs the NVIDIA container toolkit registered with "
            "the daemon: sudo nvidia-ctk runtime configure --runtime=docker, restart docker)"
        )
    causes.append(
        f"the NVIDIA driver is missing or older than CUDA {view.cuda} needs "
        "(run nvidia-smi on the host; upgrade the driver)"
    )
    causes.append("CUDA_VISIBLE_DEVICES hides every GPU: unset it or list GPUs")
    return causes


def _no_gpu(platform: str, view: TorchView) -> str:
    build = f"ROCm {view.hip}" if view.hip else f"CUDA {view.cuda}" if view.cuda else "CPU-only"
    causes = _rocm_causes(view) if platform == "rocm" or view.hip else _cuda_causes(view)
    text = (
        f"env platform is {platform} but torch ({build} build) sees no GPU, so nothing here can be "
        f"evidence for {platform}. Likely causes and fixes: "
        + "; ".join(f"({i}) {c}" for i, c in enumerate(causes, 1))
    )
    if view.init_error:
        text += f". torch said: {view.init_error}"
    return text


def _wrong_build(platform: str, view: TorchView) -> str | None:
    if platform == "rocm" and not view.hip:
        kind = f"a CUDA {view.cuda} build" if view.cuda else "a CPU-only build"
        return (
            f"env platform is rocm but its torch is {kind} (torch.version.hip is None): it cannot use "
            "AMD GPUs; rebuild the env (its torch must come from PyTorch's rocm wheel index)"
        )
    if platform == "cuda" and (view.hip or not view.cuda):
        kind = f"a ROCm {view.hip} build" if view.hip else "a CPU-only build"
        return (
            f"env platform is cuda but its torch is {kind} (torch.version.cuda is {view.cuda!r}): "
            "rebuild the env (its torch must be a CUDA build)"
        )
    return None


def decide(requested: str, view: TorchView | None) -> Decision:
    """Pure: the device the runs use, or why none can. `view` may be None only for "cpu"."""
    if requested not in REQUESTS:
        raise ValueError(f"unknown device {requested!r}; choose from {', '.join(REQUESTS)}")
    if requested == "cpu":
        return Decision("cpu", 0, "cpu")
    assert view is not None, "only a cpu request needs no probe"
    if requested == "auto":
        return Decision("gpu", view.gpus, None) if view.gpus else Decision("cpu", 0, None)
    wrong = _wrong_build(requested, view)
    if wrong:
        return Decision("gpu", view.gpus, requested, wrong)
    if view.gpus == 0:
        return Decision("gpu", 0, requested, _no_gpu(requested, view))
    return Decision("gpu", view.gpus, requested)


# A record's `ran_on`: what a run's processes really used (ran_on) or, never launched, what the suite
# saw (view_summary); "rank" is the hook's (jobhook.py), "env_platform" the suite's.
class RanOn(TypedDict, total=False):
    device: str | None  # "cpu" | "gpu"; None: never launched
    planned_device: str | None
    backend: str | None
    gpu_count: int
    gpus: list[str]
    arch: list[str]
    hip: str | None
    cuda: str | None
    nccl: str | None
    ran: bool
    visible_devices: dict[str, str]
    passed_env: dict[str, str]
    dropped_env: dict[str, str]
    rocm_runtime: dict[str, str | None]
    rank: int
    env_platform: str | None
    # custom runs (repro/run/job.py job_ran_on): every process that joined a process group
    devices: list[str]
    processes: int
    joined_group: bool


def view_summary(view: TorchView | None, device: str | None) -> RanOn:
    """`ran_on` for a run that was never launched: what the suite saw, and that nothing ran."""
    return {
        "device": None,
        "planned_device": device,
        "backend": None,
        "gpu_count": view.gpus if view else 0,
        "gpus": [],
        "arch": [],
        "hip": view.hip if view else None,
        "cuda": view.cuda if view else None,
        "nccl": None,
        "ran": False,
    }


def _engine_said(var: str) -> dict[str, str]:
    """The JSON object of variables the engine described in `var` (repro/engines/passthrough.py);
    {} when run directly."""
    try:
        said = json.loads(os.environ.get(var) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in said.items()} if isinstance(said, dict) else {}


def passed_env() -> dict[str, str]:
    """The host variables the engine passed through (NCCL_*, HSA_*, *_VISIBLE_DEVICES...)."""
    return _engine_said("MICS_REPRO_PASSTHROUGH")


def rocm_runtime(root: str = "/") -> dict[str, str | None]:
    """The ROCm this process sees (/opt/rocm/.info/version: the image's, or the host's in a venv)
    and the host's as the cluster scripts pass it (MICS_REPRO_HOST_ROCM; absent elsewhere)."""
    container = None
    for name in ("version", "version-dev"):
        try:
            with open(os.path.join(root, "opt/rocm/.info", name)) as fh:
                container = fh.readline().strip() or None
        except OSError:
            continue
        if container:
            break
    return {"container": container, "host": os.environ.get("MICS_REPRO_HOST_ROCM") or None}


UNKNOWN_ARCH = "unknown"


def gpu_arch(props: Any, *, rocm: bool) -> str:
    """A GPU's arch as its platform names it: ROCm's gcnArchName ("gfx90a:sramecc+:xnack-"), CUDA's
    compute capability ("sm_90"). On ROCm the major/minor fields are no CUDA capability (HIP maps
    its own numbers there: an MI100 would read as sm_90), so without gcnArchName it is unknown."""
    if rocm:
        arch = getattr(props, "gcnArchName", None)
        return str(arch) if arch else UNKNOWN_ARCH
    return f"sm_{props.major}{props.minor}"


def ran_on(device: str, backend: str | None) -> RanOn:
    """What a rank actually used (train.py, rank 0, after the process group is up)."""
    found: RanOn = {
        "device": device,
        "backend": backend,
        "gpu_count": 0,
        "gpus": [],
        "arch": [],
        "hip": None,
        "cuda": None,
        "nccl": None,
        "ran": True,
        "visible_devices": {k: os.environ[k] for k, _ in HIDE_GPUS if k in os.environ},
        "passed_env": passed_env(),
        # host NCCL settings the engine held back: they name a network this run does not have
        "dropped_env": _engine_said("MICS_REPRO_PASSTHROUGH_DROPPED"),
    }
    try:
        import torch
    except ImportError:
        return found
    found["hip"] = getattr(torch.version, "hip", None)
    found["cuda"] = getattr(torch.version, "cuda", None)
    if found["hip"]:
        found["rocm_runtime"] = rocm_runtime()
    if device != "gpu":
        return found
    count = torch.cuda.device_count()
    found["gpu_count"] = count
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        found["gpus"].append(str(props.name))
        found["arch"].append(gpu_arch(props, rocm=bool(found["hip"])))
    found["nccl"] = nccl_version(torch)
    return found


def nccl_version(torch: Any) -> str | None:
    """The NCCL (RCCL on ROCm) version torch was built with, or None."""
    try:
        nccl = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):
        return None
    return ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
