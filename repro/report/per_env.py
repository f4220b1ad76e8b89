"""Per-env answers of the report: THE env verdict (repro.core.verdict) plus what the report adds
(the env's versions and backends). Nothing is decided here, so the report, the summary, check-fix
and the bundle give the same answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from repro.core.runs import SCENARIO_LABELS as SCENARIO_LABELS
from repro.core.runs import describe as describe
from repro.core.runs import run_label as run_label
from repro.core.runs import shows_bug as shows_bug
from repro.core.verdict import FixPair as FixPair
from repro.core.verdict import control_for as control_for
from repro.core.verdict import env_verdict
from repro.core.verdict import stock_attempts as stock_attempts
from repro.report.merge import MergedResults
from repro.report.model import EnvInfo, Run
from repro.report.verdicts import (
    EnvVersions,
    Evidence,
    FixVerdict,
    Reproduces,
    evidence_dicts,
)


def env_versions(env: EnvInfo, runs: Sequence[Run]) -> EnvVersions:
    """Pins first (what was asked for); the installed versions the records saw fill the gaps."""
    seen: dict[str, str] = {}
    for run in runs:
        for name, value in run.versions.items():
            if value and name not in seen:
                seen[name] = str(value)
    return EnvVersions(
        torch=env.pin("torch") or seen.get("torch"),
        deepspeed=env.pin("deepspeed") or seen.get("deepspeed"),
        rocm=env.pin("rocm") or seen.get("hip"),
        cuda=env.pin("cuda") or seen.get("cuda"),
        python=env.pin("python") or seen.get("python"),
    )


@dataclass(frozen=True)
class EnvAnswer:
    """The headline of one env plus the evidence behind its two verdicts."""

    env: EnvInfo
    versions: EnvVersions
    backends: tuple[str, ...]
    reproduces: Reproduces
    signatures: tuple[str, ...]  # of the runs that show the bug
    reproduce_evidence: tuple[Evidence, ...]
    fixed: FixVerdict
    fix_evidence: tuple[Evidence, ...]
    pairs: tuple[FixPair, ...]
    control_problems: tuple[Evidence, ...]

    def headline(self) -> str:
        sig = f" ({', '.join(self.signatures)})" if self.signatures else ""
        return (
            f"{self.env.id} [{self.versions.label()}]: reproduces: {self.reproduces.value}{sig}; "
            f"fixed by the patch: {self.fixed.value}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env.id,
            "platform": self.env.platform,
            "versions": self.versions.to_dict(),
            "pins": dict(self.env.pins),
            "backends": list(self.backends),
            "reproduces": self.reproduces.value,
            "signatures": list(self.signatures),
            "reproduce_evidence": evidence_dicts(self.reproduce_evidence),
            "fixed": self.fixed.value,
            "fix_evidence": evidence_dicts(self.fix_evidence),
            "pairs": [p.to_dict() for p in self.pairs],
            "control_problems": evidence_dicts(self.control_problems),
        }


def env_answer(env: EnvInfo, merged: MergedResults) -> EnvAnswer:
    runs = merged.runs_of(env.id)
    verdict = env_verdict(env.id, runs)
    return EnvAnswer(
        env=env,
        versions=env_versions(env, runs),
        backends=tuple(sorted({r.backend.label for r in runs})),
        reproduces=verdict.reproduces,
        signatures=verdict.signatures,
        reproduce_evidence=verdict.reproduce_evidence + verdict.control_problems,
        fixed=verdict.fixed,
        fix_evidence=verdict.fix_evidence,
        pairs=verdict.pairs,
        control_problems=verdict.control_problems,
    )
