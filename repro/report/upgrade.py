"""Does upgrading torch/DeepSpeed resolve it? A pure function of the per-env answers.

Baseline: the reporter's install (torch 2.1.0 + DeepSpeed 0.13.1, from the ds_report in
deepspeedai/DeepSpeed#5080) when an env with those versions reproduces, else the oldest env that
reproduces. Every other env is placed against it by version (newer / older / mixed); MiCS removed
(unsupported) in a newer env is reported as such, never as resolved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict, cast

from packaging.version import InvalidVersion, Version

from repro.core.records import as_json
from repro.report.per_env import EnvAnswer
from repro.report.verdicts import Missing, Reproduces, UpgradeOutcome, UpgradeVerdict, VersionRelation
from repro.workload.closed import assert_never

REPORTER_TORCH = "2.1.0"
REPORTER_DEEPSPEED = "0.13.1"


@dataclass(frozen=True)
class UpgradeStep:
    env: str
    versions: str
    relation: VersionRelation
    outcome: UpgradeOutcome
    signatures: tuple[str, ...]
    detail: str

    def to_dict(self) -> UpgradeStepData:
        return cast(UpgradeStepData, as_json(self))


# An UpgradeStep in report.json.
class UpgradeStepData(TypedDict):
    env: str
    versions: str
    relation: str
    outcome: str
    signatures: list[str]
    detail: str


@dataclass(frozen=True)
class UpgradeAnswer:
    verdict: UpgradeVerdict
    summary: str
    baseline: str | None  # "torch X + DeepSpeed Y"
    steps: tuple[UpgradeStep, ...]  # every env other than the baseline, newer ones first
    missing: tuple[Missing, ...]

    def to_dict(self) -> UpgradeData:
        return cast(UpgradeData, as_json(self))


# The upgrade answer in report.json.
class UpgradeData(TypedDict):
    verdict: str
    summary: str
    baseline: str | None
    steps: list[UpgradeStepData]
    missing: list[dict[str, str]]  # Missing.to_dict


def _release(text: str | None) -> tuple[int, ...] | None:
    """Compare releases without local tags: 2.1.0+rocm5.6 and 2.1.0 are the same torch."""
    try:
        return Version(text).release if text else None
    except InvalidVersion:
        return None


def relation(base: tuple[str | None, str | None], other: tuple[str | None, str | None]) -> VersionRelation:
    bt, bd, ot, od = (_release(v) for v in (*base, *other))
    if None in (bt, bd, ot, od):
        return VersionRelation.UNKNOWN
    assert bt is not None and bd is not None and ot is not None and od is not None
    if (ot, od) == (bt, bd):
        return VersionRelation.SAME
    if ot >= bt and od >= bd:
        return VersionRelation.NEWER
    if ot <= bt and od <= bd:
        return VersionRelation.OLDER
    return VersionRelation.MIXED


def upgrade_outcome(reproduces: Reproduces) -> UpgradeOutcome:
    """What an env's verdict means for an upgrade to it (MiCS removed is not a fix)."""
    if reproduces is Reproduces.NO:
        return UpgradeOutcome.RESOLVED
    if reproduces is Reproduces.YES:
        return UpgradeOutcome.STILL_REPRODUCES
    if reproduces is Reproduces.UNSUPPORTED:
        return UpgradeOutcome.MICS_REMOVED
    if reproduces is Reproduces.INCONCLUSIVE or reproduces is Reproduces.TOO_FEW_DEVICES:
        return UpgradeOutcome.INCONCLUSIVE
    if reproduces is Reproduces.NOT_TESTED:
        return UpgradeOutcome.NOT_TESTED
    assert_never(reproduces)


def _pair(e: EnvAnswer) -> tuple[str | None, str | None]:
    return e.versions.torch, e.versions.deepspeed


def _baseline(envs: Sequence[EnvAnswer]) -> tuple[str | None, str | None] | None:
    # Only envs whose versions parse can be placed on the version line.
    bad = [e for e in envs if e.reproduces is Reproduces.YES and None not in map(_release, _pair(e))]
    if not bad:
        return None
    reporter = (REPORTER_TORCH, REPORTER_DEEPSPEED)
    for e in bad:
        if relation(reporter, _pair(e)) is VersionRelation.SAME:
            return _pair(e)
    return min((_pair(e) for e in bad), key=lambda p: (_release(p[0]) or (), _release(p[1]) or ()))


def upgrade(envs: Sequence[EnvAnswer]) -> UpgradeAnswer:
    base = _baseline(envs)
    if base is None and any(e.reproduces is Reproduces.YES for e in envs):
        return UpgradeAnswer(
            UpgradeVerdict.INCONCLUSIVE,
            "the envs that reproduce have torch/DeepSpeed versions that cannot be ordered",
            None,
            (),
            (Missing("release version numbers (pins) for the reproducing envs"),),
        )
    if base is None:
        return UpgradeAnswer(
            UpgradeVerdict.NOT_APPLICABLE,
            "no env reproduces the bug, so there is nothing for an upgrade to resolve",
            None,
            (),
            (),
        )
    base_label = f"torch {base[0]} + DeepSpeed {base[1]}"
    steps = []
    for e in envs:
        rel = relation(base, _pair(e))
        if rel is VersionRelation.SAME:
            continue
        outcome = upgrade_outcome(e.reproduces)
        detail = "; ".join(ev.text for ev in e.reproduce_evidence[:3])
        steps.append(UpgradeStep(e.env.id, e.versions.label(), rel, outcome, e.signatures, detail))
    order = [VersionRelation.NEWER, VersionRelation.MIXED, VersionRelation.UNKNOWN, VersionRelation.OLDER]
    steps.sort(key=lambda s: order.index(s.relation))
    newer = [s for s in steps if s.relation is VersionRelation.NEWER]
    if not newer:
        return UpgradeAnswer(
            UpgradeVerdict.NO_NEWER_ENV,
            f"not tested: no env newer than {base_label} in these results",
            base_label,
            tuple(steps),
            (
                Missing(
                    f"a run with torch/DeepSpeed newer than {base_label}",
                    "`make repro ENV=<env> TORCH=<newer> DEEPSPEED=<newer>` and merge the results",
                ),
            ),
        )
    resolved = [s for s in newer if s.outcome is UpgradeOutcome.RESOLVED]
    still = [s for s in newer if s.outcome in (UpgradeOutcome.STILL_REPRODUCES, UpgradeOutcome.MICS_REMOVED)]

    def names(items: Sequence[UpgradeStep]) -> str:
        return "; ".join(
            f"{s.versions} ({s.outcome.value}{': ' + ', '.join(s.signatures) if s.signatures else ''})"
            for s in items
        )

    if resolved:
        summary = f"{names(resolved)} runs MiCS clean"
        if still:
            summary += f"; but {names(still)}"
        return UpgradeAnswer(UpgradeVerdict.YES, summary, base_label, tuple(steps), ())
    if still and len(still) == len(newer):
        removed = [s for s in still if s.outcome is UpgradeOutcome.MICS_REMOVED]
        summary = names(still)
        if removed:
            summary += ". MiCS removed (unsupported) is not a fix"
        return UpgradeAnswer(UpgradeVerdict.NO, summary, base_label, tuple(steps), ())
    return UpgradeAnswer(UpgradeVerdict.INCONCLUSIVE, names(newer), base_label, tuple(steps), ())
