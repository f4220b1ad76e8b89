"""`python -m repro gpu-check`: what it does, as data (the steps) and how each step ends (verdicts).

A GPU host proves itself in one short command (at most about ten minutes once the env's venv
exists): the host's GPUs are recorded, the env's venv is built through the venv engine, torch's
coalescing manager and DeepSpeed's `all_gather_coalesced` are probed on the real backend, `repro`
runs on the GPUs (MiCS stock/fixed with 2+ GPUs; a MiCS shard-1 smoke run with one), and
`check-fix` with the GPUs hidden must verify nothing (exit 6). `plan()` is pure; the runner
(repro/run/gpu_check.py) walks the steps, the judge (repro/run/gpu_check_judge.py) decides.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from repro.core.errors import NothingVerifiedError

# What `check-fix` must exit with when the GPUs are hidden: nothing could run, nothing verified.
HIDDEN_EXPECTED_EXIT = NothingVerifiedError.exit_code
# Short runs: the check proves the machinery on this host, the full suite is `make repro`.
STEPS_PER_RUN = 5
RESULT_FILE = "gpu-check.json"
TEXT_FILE = "gpu-check.txt"


class StepKind(enum.Enum):
    HOST = "host"
    BUILD = "build"
    RAW_TORCH = "raw-torch"
    DS_GATHER = "ds-gather"
    REPRO = "repro"
    MICS_SMOKE = "mics-smoke"
    HIDDEN = "check-fix-hidden"


class Verdict(enum.Enum):
    PROVEN = "proven"
    NOT_PROVABLE = "not provable on this host"
    FAILED = "failed"
    SKIPPED = "skipped"  # a step it needs did not succeed

    @property
    def ok(self) -> bool:
        """Whether the check as a whole may still pass with this step's verdict."""
        return self in (Verdict.PROVEN, Verdict.NOT_PROVABLE)


@dataclass(frozen=True)
class Step:
    kind: StepKind
    title: str  # what the step shows when it is proven
    timeout_s: float
    cli: tuple[str, ...] = ()  # REPRO / HIDDEN: the `python -m repro` arguments (--out is added)
    hide_gpus: bool = False
    needs: tuple[StepKind, ...] = ()


def plan(env_id: str, gpus: int, steps: int = STEPS_PER_RUN) -> tuple[Step, ...]:
    """The steps for env `env_id` on a host showing `gpus` GPUs (at least one)."""
    common = ("--env", env_id, "--engine", "venv", "--steps", str(steps))
    scenarios = "zero3,mics,mics-hier" if gpus >= 2 else "zero3"
    out = [
        Step(StepKind.HOST, "the host's GPUs, driver, arch and NCCL/RCCL are recorded", 120),
        Step(StepKind.BUILD, "the env's venv is built (or reused) through the venv engine", 3600),
        Step(
            StepKind.RAW_TORCH,
            "torch's coalescing manager hands out _IllegalWork on the real backend",
            300,
            needs=(StepKind.BUILD,),
        ),
        Step(
            StepKind.DS_GATHER,
            "DeepSpeed's all_gather_coalesced fails stock and gathers with the fix, on the GPU",
            300,
            needs=(StepKind.BUILD,),
        ),
        Step(
            StepKind.REPRO,
            "repro runs on the GPUs: zero3 clean"
            + (", MiCS stock reproduces and fixed is clean" if gpus >= 2 else ""),
            900,
            cli=("repro", *common, "--scenarios", scenarios),
            needs=(StepKind.BUILD,),
        ),
    ]
    if gpus < 2:
        out.append(
            Step(
                StepKind.MICS_SMOKE,
                "MiCS (shard 1) trains on the GPU, stock and fixed (a smoke run: one rank shows no race)",
                600,
                needs=(StepKind.BUILD,),
            )
        )
    out.append(
        Step(
            StepKind.HIDDEN,
            f"check-fix with the GPUs hidden verifies nothing and exits {HIDDEN_EXPECTED_EXIT}",
            600,
            cli=("check-fix", *common, "--scenarios", "zero3,mics"),
            hide_gpus=True,
            needs=(StepKind.BUILD,),
        )
    )
    return tuple(out)


@dataclass(frozen=True)
class StepResult:
    kind: StepKind
    verdict: Verdict
    summary: str  # one line, the answer
    facts: dict[str, object]
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "step": self.kind.value,
            "verdict": self.verdict.value,
            "summary": self.summary,
            "facts": self.facts,
            "duration_s": round(self.duration_s, 1),
        }
