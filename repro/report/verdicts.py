"""The closed answer sets of the report and the small value types that carry their evidence.

Each question gets its own Enum so a verdict of one can never be passed off as another's.
Values are the strings that appear in REPORT.md, report.html data attributes and report.json.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypedDict, cast

from repro.core.fix_pairs import PairStatus as PairStatus
from repro.core.records import as_json

# The per-env answers (reproduces? fixed? and the pairing behind them) are THE env verdict of
# repro.core.verdict, shared with the summary, check-fix and the bundle.
from repro.core.verdict import Evidence as Evidence
from repro.core.verdict import FixVerdict as FixVerdict
from repro.core.verdict import Reproduces as Reproduces


class CauseVerdict(str, enum.Enum):
    MICS_LOGIC = "mics-logic"  # same failure on CPU/gloo and a GPU backend: backend-agnostic
    ROCM_ENVIRONMENT = "rocm-environment"  # only ROCm fails; CUDA and CPU runs are clean
    GPU_BACKEND = "gpu-backend"  # fails on a GPU backend only; CPU runs clean
    NEEDS_GPU_EVIDENCE = "needs-gpu-evidence"  # reproduced on CPU/gloo; no GPU run to compare
    NOT_REPRODUCED = "not-reproduced"
    INCONCLUSIVE = "inconclusive"


class UpgradeVerdict(str, enum.Enum):
    YES = "yes"  # a newer torch/DeepSpeed runs MiCS clean
    NO = "no"  # every newer env still reproduces or has no MiCS any more
    NO_NEWER_ENV = "no-newer-env"
    NOT_APPLICABLE = "n/a"  # nothing reproduced anywhere
    INCONCLUSIVE = "inconclusive"


class UpgradeOutcome(str, enum.Enum):
    RESOLVED = "resolved"
    STILL_REPRODUCES = "still-reproduces"
    MICS_REMOVED = "mics-removed"  # unsupported: not a fix
    INCONCLUSIVE = "inconclusive"
    NOT_TESTED = "not-tested"


class VersionRelation(str, enum.Enum):
    NEWER = "newer"
    OLDER = "older"
    SAME = "same"
    MIXED = "mixed"  # one newer, the other older
    UNKNOWN = "unknown"


class FindingKind(str, enum.Enum):
    HANG = "hang"
    CRASH = "crash"
    ENV_ERROR = "env-error"
    UNSUPPORTED = "unsupported"
    INTERRUPTED = "interrupted"
    NO_EVIDENCE = "no-evidence"  # the run ended without saying anything about the bug
    CONTROL_FAILED = "control-failed"
    FIX_REGRESSION = "fix-regression"
    CONFIG_PROBLEM = "config-problem"


@dataclass(frozen=True)
class EnvVersions:
    torch: str | None
    deepspeed: str | None
    rocm: str | None
    cuda: str | None
    python: str | None
    platform: str | None = None  # the env's (cpu | rocm | cuda); None: not known

    def label(self) -> str:
        parts = [f"torch {self.torch or '?'}", f"DeepSpeed {self.deepspeed or '?'}"]
        if self.platform == "cpu":
            # What ran, not what the wheel was built for: PyPI's torch is the CUDA build.
            built = f"; torch wheel built with CUDA {self.cuda}" if self.cuda else ""
            built += f"; torch wheel built with ROCm {self.rocm}" if self.rocm else ""
            return ", ".join(parts) + ", CPU (gloo)" + built
        if self.rocm:
            parts.append(f"ROCm {self.rocm}")
        if self.cuda:
            parts.append(f"CUDA {self.cuda}")
        if not self.rocm and not self.cuda:
            parts.append("CPU")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, str | None]:
        return cast("dict[str, str | None]", as_json(self))


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    env: str
    run: str | None  # Run.ident, None for env- or invocation-wide findings
    summary: str
    excerpt: str = ""  # stack or traceback excerpt, verbatim
    logs: tuple[str, ...] = ()

    def to_dict(self) -> FindingData:
        return cast(FindingData, as_json(self))


# A Finding in report.json.
class FindingData(TypedDict):
    kind: str
    env: str
    run: str | None
    summary: str
    excerpt: str
    logs: list[str]


@dataclass(frozen=True)
class Missing:
    """Something the results lack to answer fully, and the command that would supply it."""

    what: str
    how: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"what": self.what, "how": self.how}
