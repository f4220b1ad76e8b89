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
from repro.workload.record import SCENARIOS

SCENARIOS_ORDER: tuple[str, ...] = tuple(SCENARIOS)
MICS_SCENARIOS = ("mics", "mics-hier", "mics-replica")
CONTROL_SCENARIO = "zero3"
# The two configurations in the bug report: flat gather (the reporter's config) and hierarchical.
REPORTER_SCENARIOS = ("mics", "mics-hier")


class Outcome(str, enum.Enum):
    """Mirror of record.OUTCOMES (a test keeps the two in step)."""

    REPRODUCED = "reproduced"
    CLEAN = "clean"
    CRASHED = "crashed"
    HUNG = "hung"
    ENV_ERROR = "env-error"
    UNSUPPORTED = "unsupported"
    INTERRUPTED = "interrupted"


class Signature(str, enum.Enum):
    """Mirror of record.SIGNATURES (a test keeps the two in step)."""

    ILLEGAL_WORK_CRASH = "illegal-work-crash"
    ILLEGAL_WORK_DIVERGENCE = "illegal-work-divergence"
    ILLEGAL_WORK_WARNINGS = "illegal-work-warnings"
    DIVERGENCE = "divergence"
    OVERFLOW_STORM = "overflow-storm"
    CRASH = "crash"
    HANG = "hang"
    NONE = "none"

    @property
    def is_illegal_work(self) -> bool:
        return self.value.startswith("illegal-work")


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

    @property
    def is_gpu(self) -> bool:
        return self is not Backend.CPU_GLOO

    @property
    def label(self) -> str:
        return {
            Backend.CPU_GLOO: "CPU (gloo)",
            Backend.ROCM_RCCL: "ROCm (RCCL via torch's nccl backend)",
            Backend.CUDA_NCCL: "CUDA (NCCL)",
            Backend.GPU_UNKNOWN: "GPU (nccl backend, vendor unknown)",
        }[self]


@dataclass(frozen=True)
class Invocation:
    """One `make repro` invocation = one results folder."""

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
    invocation: Invocation  # the newest invocation that ran this env
    suite_exit_code: int | None = None
    suite_timed_out: bool = False
    interrupted: bool = False
    venv: str | None = None

    def pin(self, *names: str) -> str | None:
        for name in names:
            value = self.pins.get(name)
            if value:
                return str(value)
        return None


@dataclass(frozen=True)
class RunKey:
    """Identifies a run within a merged result set; `patch` aside, it pairs stock with fixed."""

    env: str
    scenario: str
    patch: str
    dtype: str
    transport: str
    world_size: int
    shard_size: int | None
    hierarchical: bool

    def without_patch(self) -> tuple[str, str, str, str, int, int | None, bool]:
        return (
            self.env,
            self.scenario,
            self.dtype,
            self.transport,
            self.world_size,
            self.shard_size,
            self.hierarchical,
        )


@dataclass(frozen=True)
class Run:
    record: Mapping[str, Any] = field(repr=False)
    invocation: Invocation = field(repr=False)
    env_platform: str = ""

    # -- identity -------------------------------------------------------------------------
    @property
    def key(self) -> RunKey:
        r = self.record
        return RunKey(
            env=str(r["env"]),
            scenario=str(r["scenario"]),
            patch=str(r["patch"]),
            dtype=str(r["dtype"]),
            transport=str(r.get("transport") or "native"),
            world_size=int(r.get("world_size") or 0),
            shard_size=None if r.get("shard_size") is None else int(r["shard_size"]),
            hierarchical=bool(r.get("hierarchical")),
        )

    @property
    def name(self) -> str:
        """The record's run_name (unique within an env); rebuilt the same way for older records."""
        given = self.record.get("run_name")
        if given:
            return str(given)
        k = self.key
        return f"{k.scenario}-{k.patch}-{k.dtype}-{k.transport}-w{k.world_size}"

    @property
    def ident(self) -> str:
        return f"{self.env}/{self.name}"

    @property
    def env(self) -> str:
        return self.key.env

    @property
    def scenario(self) -> str:
        return self.key.scenario

    @property
    def patch(self) -> str:
        return self.key.patch

    @property
    def is_sync_control(self) -> bool:
        """Sync transport completes every collective at once: a cause control, not a reproduction try."""
        return self.key.transport == "sync"

    @property
    def control_run(self) -> str | None:
        value = self.record.get("control_run")
        return str(value) if value else None

    @property
    def is_mics(self) -> bool:
        return self.scenario in MICS_SCENARIOS

    @property
    def is_control(self) -> bool:
        return self.scenario == CONTROL_SCENARIO

    # -- evidence -------------------------------------------------------------------------
    @property
    def outcome(self) -> Outcome:
        return Outcome(self.record["outcome"])

    @property
    def signature(self) -> Signature:
        return Signature(self.record["signature"])

    @property
    def reason(self) -> str:
        return str(self.record.get("reason") or "")

    @property
    def backend(self) -> Backend:
        name = str(self.record.get("backend") or "")
        # A run that died before any rank reported has no backend: its env's platform tells.
        if name == "gloo" or (not name and self.env_platform == "cpu"):
            return Backend.CPU_GLOO
        versions = self.record.get("versions") or {}
        if versions.get("hip") or self.env_platform == "rocm":
            return Backend.ROCM_RCCL
        if versions.get("cuda") or self.env_platform == "cuda":
            return Backend.CUDA_NCCL
        return Backend.GPU_UNKNOWN

    @property
    def losses(self) -> list[float | None]:
        return [None if v is None else float(v) for v in (self.record.get("losses") or [])]

    @property
    def loss_scale(self) -> list[float | None]:
        return [None if v is None else float(v) for v in (self.record.get("loss_scale") or [])]

    @property
    def illegal_work_messages(self) -> int:
        return int(self.record.get("illegal_work_messages") or 0)

    @property
    def skipped_steps(self) -> int:
        return int(self.record.get("skipped_steps") or 0)

    @property
    def first_divergent_step(self) -> int | None:
        value = self.record.get("first_divergent_step")
        return None if value is None else int(value)

    @property
    def exception(self) -> Mapping[str, Any] | None:
        exc = self.record.get("exception")
        return exc if isinstance(exc, Mapping) else None

    @property
    def exception_line(self) -> str | None:
        exc = self.exception
        if exc is None:
            return None
        message = str(exc.get("message") or "").strip().splitlines()
        head = f"{exc.get('type') or 'Exception'}: {message[0] if message else ''}".rstrip(": ")
        rank = exc.get("rank")
        return head if rank is None else f"{head} (rank {rank})"

    @property
    def stacks(self) -> Mapping[str, str]:
        stacks = self.record.get("stacks") or {}
        return {str(k): str(v) for k, v in stacks.items()}

    @property
    def versions(self) -> Mapping[str, Any]:
        return dict(self.record.get("versions") or {})

    @property
    def started_at(self) -> str:
        return str(self.record.get("started_at") or self.invocation.started_at or "")

    def log_path(self, name: str) -> Path | None:
        rel = (self.record.get("logs") or {}).get(name)
        return None if rel is None else self.invocation.folder / str(rel)


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
