"""Per-env answers of the report: THE env verdict (repro.core.verdict) plus what the report adds
(the env's versions and backends). Nothing is decided here, so the report, the summary, check-fix
and the bundle give the same answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from repro.core.records import as_json
from repro.core.verdict import EnvVerdict, VerdictData, env_verdict
from repro.report.merge import MergedResults
from repro.report.model import EnvInfo, Run
from repro.report.verdicts import EnvVersions, Evidence, FixVerdict, Reproduces


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
        platform=env.platform if env.platform in ("cpu", "rocm", "cuda") else None,
    )


@dataclass(frozen=True)
class EnvAnswer:
    """The env's one verdict (decided and worded by repro.core.verdict.EnvVerdict) plus what the
    report adds: the env's versions and backends. Nothing here re-derives the verdict."""

    env: EnvInfo
    versions: EnvVersions
    backends: tuple[str, ...]
    verdict: EnvVerdict

    @property
    def reproduces(self) -> Reproduces:
        return self.verdict.reproduces

    @property
    def fixed(self) -> FixVerdict:
        return self.verdict.fixed

    @property
    def signatures(self) -> tuple[str, ...]:
        return self.verdict.signatures

    @property
    def reproduce_evidence(self) -> tuple[Evidence, ...]:
        return self.verdict.reproduce_evidence + self.verdict.control_problems

    @property
    def platform_note(self) -> str:
        """A folder that does not say its env's platform (older records): what that means."""
        if self.env.platform in ("cpu", "rocm", "cuda"):
            return ""
        return (
            f"platform unknown ({self.env.platform}): results.json does not say what this env is, so "
            "its runs are no GPU evidence"
        )

    def headline(self) -> str:
        sig = f" ({', '.join(self.signatures)})" if self.signatures else ""
        return (
            f"{self.env.id} [{self.versions.label()}]: reproduces: {self.reproduces.value}{sig}; "
            f"fixed by the patch: {self.fixed.value}; verdict: {self.verdict.headline()}"
        )

    def to_dict(self) -> EnvAnswerData:
        return {
            **self.verdict.to_dict(),
            # The report's evidence for "reproduces" lists the control problems too (as it always did).
            "reproduce_evidence": as_json(self.reproduce_evidence),
            "platform": self.env.platform,
            "platform_note": self.platform_note,
            "versions": self.versions.to_dict(),
            "pins": dict(self.env.pins),
            "backends": list(self.backends),
        }


# An env's headline entry in report.json: its verdict, with what the env is.
class EnvAnswerData(VerdictData):
    platform: str
    platform_note: str
    versions: dict[str, str | None]  # EnvVersions.to_dict
    pins: dict[str, str]
    backends: list[str]


def env_answer(env: EnvInfo, merged: MergedResults) -> EnvAnswer:
    runs = merged.runs_of(env.id)
    return EnvAnswer(
        env=env,
        versions=env_versions(env, runs),
        backends=tuple(sorted({r.backend.label for r in runs})),
        verdict=env_verdict(env.id, runs),
    )
