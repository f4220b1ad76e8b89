"""Which host variables reach a GPU run, decided in one place for every engine and the cluster scripts.

A site's GPU selection (`*_VISIBLE_DEVICES`) and its communication and runtime tuning (NCCL_*,
RCCL_*, HSA_*, MIOPEN_*) are part of how a run behaves: a container (or Apptainer's --cleanenv)
would otherwise drop them silently. Only these names pass; nothing else of the host's environment
does, so no credential can ride along. What passed is handed to the suite as JSON in
PASSTHROUGH_VAR, which the workload copies into every record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

# Exact names: GPU selection (HIP honours CUDA_VISIBLE_DEVICES too) and the runtimes' debug switches.
PASSTHROUGH_NAMES = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "CUDA_DEVICE_ORDER",
    "CUDA_LAUNCH_BLOCKING",
    "HIP_LAUNCH_BLOCKING",
    "AMD_LOG_LEVEL",
    "AMD_SERIALIZE_KERNEL",
)
# Prefixes: NCCL/RCCL (collectives: NCCL_DEBUG, NCCL_SOCKET_IFNAME, NCCL_IB_HCA...), the ROCm runtime
# (HSA_*, e.g. HSA_OVERRIDE_GFX_VERSION, HSA_FORCE_FINE_GRAIN_PCIE) and MIOpen's kernel caches.
PASSTHROUGH_PREFIXES = ("NCCL_", "RCCL_", "HSA_", "MIOPEN_", "TORCH_NCCL_")
# The suite reads this (JSON {name: value}) and records it; repro/workload names it literally.
PASSTHROUGH_VAR = "MICS_REPRO_PASSTHROUGH"


def allowed(name: str) -> bool:
    return name in PASSTHROUGH_NAMES or name.startswith(PASSTHROUGH_PREFIXES)


def passthrough(environ: Mapping[str, str], platform: str) -> dict[str, str]:
    """The host variables a run on `platform` gets, sorted by name. CPU runs get none: they never
    touch a GPU, and the suite hides GPUs from them itself."""
    if platform == "cpu":
        return {}
    return {name: environ[name] for name in sorted(environ) if allowed(name)}


def run_environment(environ: Mapping[str, str], platform: str) -> dict[str, str]:
    """The variables plus PASSTHROUGH_VAR describing them (always set, `{}` when nothing passed)."""
    passed = passthrough(environ, platform)
    return {**passed, PASSTHROUGH_VAR: json.dumps(passed, sort_keys=True)}
