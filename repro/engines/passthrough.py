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
# What was held back from a networkless run (JSON {name: value}, set only when something was).
DROPPED_VAR = "MICS_REPRO_PASSTHROUGH_DROPPED"
# Settings that name the host's network: interfaces, InfiniBand/RoCE devices, socket and network
# plugins. A suite container runs with networking off (only `lo`), so a cluster's usual
# NCCL_SOCKET_IFNAME=ib0 would leave NCCL no interface and crash every run; without them NCCL uses
# loopback for its bootstrap and shared memory / P2P between the GPUs of the one host. Debug and
# tuning settings (NCCL_DEBUG, NCCL_ALGO, RCCL_MSCCL_ENABLE...) still pass.
NETWORK_PREFIXES = (
    "NCCL_SOCKET_",
    "NCCL_IB",
    "NCCL_NET",
    "NCCL_UCX_",
    "NCCL_COLLNET",
    "NCCL_CROSS_NIC",
    "NCCL_NSOCKS_PERTHREAD",
)


def split(
    environ: Mapping[str, str], platform: str, *, networkless: bool = False
) -> tuple[dict[str, str], dict[str, str]]:
    """(passed, dropped): the allowlisted host variables a run on `platform` gets, sorted by name,
    and those held back because they name the host's network while the run has none."""
    if platform == "cpu":
        return {}, {}
    allowlisted = {
        name: environ[name]
        for name in sorted(environ)
        if name in PASSTHROUGH_NAMES or name.startswith(PASSTHROUGH_PREFIXES)
    }
    dropped = {k: v for k, v in allowlisted.items() if networkless and k.startswith(NETWORK_PREFIXES)}
    return {k: v for k, v in allowlisted.items() if k not in dropped}, dropped


def passthrough(environ: Mapping[str, str], platform: str, *, networkless: bool = False) -> dict[str, str]:
    """The host variables a run on `platform` gets, sorted by name. CPU runs get none: they never
    touch a GPU, and the suite hides GPUs from them itself."""
    return split(environ, platform, networkless=networkless)[0]


def run_environment(
    environ: Mapping[str, str], platform: str, *, networkless: bool = False
) -> dict[str, str]:
    """The variables plus PASSTHROUGH_VAR describing them (always set, `{}` when nothing passed),
    and DROPPED_VAR naming what a networkless run did not get (only when something was dropped)."""
    passed, dropped = split(environ, platform, networkless=networkless)
    out = {**passed, PASSTHROUGH_VAR: json.dumps(passed, sort_keys=True)}
    if dropped:
        out[DROPPED_VAR] = json.dumps(dropped, sort_keys=True)
    return out
