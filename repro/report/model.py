"""Typed, read-only views of a results folder: what the report is built from and nothing else.

The record dicts stay the source of truth (their keys are a contract, see
repro/workload/record.py); these classes only give them names and types and check the closed
sets, so a results folder written by a newer tool fails loudly instead of being misread.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.core.errors import UsageError
from repro.core.runs import RunView
from repro.workload.record import SCENARIOS
from repro.workload.record import Outcome as Outcome
from repro.workload.record import Signature as Signature

SCENARIOS_ORDER: tuple[str, ...] = tuple(SCENARIOS)


# What the reporter saw (deepspeedai/DeepSpeed#5080): warnings plus an fp16 overflow storm with the
# flat gather, an explicit IllegalWork exception with the hierarchical one.
REPORTER_SIGNATURES: Mapping[str, Signature] = {
    "mics": Signature.ILLEGAL_WORK_DIVERGENCE,
    "mics-hier": Signature.ILLEGAL_WORK_CRASH,
}


class Backend(str, enum.Enum):
    """Which communication stack a run used, as the report groups them."""

    CPU_GLOO = "cpu-gloo"
    ROCM_RCCL = "rocm-rccl"
    CUDA_NCCL = "cuda-nccl"
    GPU_UNKNOWN = "gpu-nccl"
    # Nothing says what ran (an older folder without the env's platform, a run without a backend):
    # neither CPU nor GPU evidence.
    UNKNOWN = "unknown"

    @property
    def is_gpu(self) -> bool:
        return self not in (Backend.CPU_GLOO, Backend.UNKNOWN)

    @property
    def label(self) -> str:
        return {
            Backend.CPU_GLOO: "CPU (gloo)",
            Backend.ROCM_RCCL: "ROCm (RCCL via torch's nccl backend)",
            Backend.CUDA_NCCL: "CUDA (NCCL)",
            Backend.GPU_UNKNOWN: "GPU (nccl backend, vendor unknown)",
            Backend.UNKNOWN: "unknown (no platform or backend recorded)",
        }[self]


@dataclass(frozen=True)
class InvocationView:
    """One `make repro` invocation = one results folder, as the report reads it."""

    folder: Path
    tool_version: str
    command: str
    argv: tuple[str, ...]
    started_at: str
    finished_at: str | None
    interrupted: bool
    host: Mapping[str, Any]


@dataclass(frozen=True)
class EnvInfo:
    id: str
    platform: str
    engine: str
    image_id: str | None
    pins: Mapping[str, str]
    derived_from: str | None
    artifacts: Mapping[str, Path]  # absolute paths
    invocation: InvocationView  # the newest invocation that ran this env
    suite_exit_code: int | None = None
    suite_timed_out: bool = False
    interrupted: bool = False
    venv: str | None = None

    def pin(self, name: str) -> str | None:
        value = self.pins.get(name)
        return str(value) if value else None


@dataclass(frozen=True)
class Run(RunView):
    """A run record plus where it was found: its invocation folder and its env's platform."""

    invocation: InvocationView = field(repr=False)
    env_platform: str = ""

    @property
    def backend(self) -> Backend:
        # A custom job's record has no `backend` of its own; its `ran_on` (from the hook) says.
        name = str(self.record.get("backend") or (self.record.get("ran_on") or {}).get("backend") or "")
        # A run that died before any rank reported has no backend: its env's platform tells.
        if name == "gloo" or (not name and self.env_platform == "cpu"):
            return Backend.CPU_GLOO
        if not name and self.env_platform not in ("rocm", "cuda"):
            return Backend.UNKNOWN  # a CPU wheel's torch.version.cuda must not make it CUDA evidence
        versions = self.record.get("versions") or {}
        if versions.get("hip") or self.env_platform == "rocm":
            return Backend.ROCM_RCCL
        if versions.get("cuda") or self.env_platform == "cuda":
            return Backend.CUDA_NCCL
        return Backend.GPU_UNKNOWN

    @property
    def started_at(self) -> str:
        return str(self.record.get("started_at") or self.invocation.started_at or "")


def check_closed_sets(record: Mapping[str, Any], where: str) -> None:
    """Fail early, naming the record, when an outcome/signature is outside the known sets."""
    for key, enum_type in (("outcome", Outcome), ("signature", Signature)):
        value = record.get(key)
        try:
            enum_type(value)
        except ValueError:
            allowed = ", ".join(m.value for m in enum_type)
            raise UsageError(
                f"{where}: record has {key}={value!r}",
                why=f"the report knows only: {allowed}",
                fix="rebuild the report with the tool version that wrote these results, or re-run the env",
            ) from None
    for key in ("env", "scenario", "patch", "dtype"):
        if not record.get(key):
            raise UsageError(
                f"{where}: record has no {key!r}",
                why="every run record names its env, scenario, patch and dtype",
                fix="re-run the env; the folder looks damaged",
            )
