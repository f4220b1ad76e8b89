"""Per-env answers, pure functions of the records: does it reproduce, and does the fix resolve it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from repro.report.merge import MergedResults
from repro.report.model import (
    CONTROL_SCENARIO,
    REPORTER_SCENARIOS,
    EnvInfo,
    Outcome,
    Run,
    Signature,
)
from repro.report.verdicts import (
    EnvVersions,
    Evidence,
    FixVerdict,
    PairStatus,
    Reproduces,
    evidence_dicts,
)

SCENARIO_LABELS = {
    "zero3": "ZeRO-3 (control)",
    "mics": "MiCS flat gather",
    "mics-hier": "MiCS hierarchical gather",
    "mics-replica": "MiCS with replica groups",
}


def run_label(run: Run) -> str:
    k = run.key
    layout = f"{k.world_size} ranks" + (f", shard {k.shard_size}" if k.shard_size else "")
    transport = "" if k.transport == "native" else f", {k.transport} transport"
    return f"{SCENARIO_LABELS.get(k.scenario, k.scenario)} ({k.patch}, {k.dtype}{transport}, {layout})"


def shows_bug(run: Run) -> bool:
    """The run exhibits the reported bug: classify said reproduced, or it died from an IllegalWork."""
    if run.outcome is Outcome.REPRODUCED:
        return True
    return run.outcome is Outcome.CRASHED and run.signature is Signature.ILLEGAL_WORK_CRASH


def describe(run: Run) -> str:
    """A sentence of the run's evidence, only from its record."""
    parts = [f"{run_label(run)}: {run.outcome.value}", f"signature {run.signature.value}"]
    if run.illegal_work_messages:
        parts.append(f"{run.illegal_work_messages} IllegalWork messages")
    if run.first_divergent_step is not None:
        parts.append(f"losses leave the control's at step {run.first_divergent_step}")
    if run.skipped_steps:
        parts.append(f"{run.skipped_steps} skipped (overflow) steps")
    nan_steps = sum(1 for v in run.losses if v is None)
    if nan_steps:
        parts.append(f"{nan_steps} NaN/inf loss steps")
    if run.exception_line:
        parts.append(run.exception_line)
    return "; ".join(parts)


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


def control_for(run: Run, runs: Sequence[Run]) -> Run | None:
    """The ZeRO-3 run the MiCS run was compared with: the record names it (control_run); older records
    get the nearest one: same env, dtype and world size, preferring the same transport and patch."""
    if run.control_run:
        named = next((c for c in runs if c.env == run.env and c.name == run.control_run), None)
        if named is not None:
            return named
    k = run.key
    candidates = [
        c
        for c in runs
        if c.scenario == CONTROL_SCENARIO
        and c.env == k.env
        and c.key.dtype == k.dtype
        and c.key.world_size == k.world_size
    ]
    candidates.sort(key=lambda c: (c.key.transport != k.transport, c.patch != k.patch, c.patch != "stock"))
    return candidates[0] if candidates else None


def control_usable(control: Run | None) -> bool:
    return control is not None and control.outcome is Outcome.CLEAN


@dataclass(frozen=True)
class FixPair:
    stock: Run | None
    fixed: Run | None
    control: Run | None
    status: PairStatus
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "stock": self.stock.ident if self.stock else None,
            "fixed": self.fixed.ident if self.fixed else None,
            "control": self.control.ident if self.control else None,
            "status": self.status.value,
            "detail": self.detail,
        }


NO_OUTCOME = (Outcome.INTERRUPTED, Outcome.ENV_ERROR, Outcome.UNSUPPORTED)


def fixed_matches_control(fixed: Run, control: Run | None) -> tuple[bool, str]:
    """A fixed run counts as resolved only if it is clean, silent and indistinguishable from ZeRO-3."""
    if fixed.outcome is not Outcome.CLEAN:
        return False, f"fixed run {fixed.outcome.value} ({fixed.signature.value})"
    if fixed.illegal_work_messages:
        return False, f"fixed run still logs {fixed.illegal_work_messages} IllegalWork messages"
    if fixed.first_divergent_step is not None:
        return False, f"fixed run leaves the control's losses at step {fixed.first_divergent_step}"
    if (
        control is not None
        and control.outcome is Outcome.CLEAN
        and fixed.skipped_steps > control.skipped_steps
    ):
        return False, f"fixed run skipped {fixed.skipped_steps} steps, the control {control.skipped_steps}"
    same_weights = (
        control is not None
        and fixed.record.get("weights_checksum") is not None
        and fixed.record.get("weights_checksum") == control.record.get("weights_checksum")
    )
    return True, "clean, no IllegalWork, losses match the control" + (
        "; final weights identical to the control's" if same_weights else ""
    )


def pair_status(stock: Run | None, fixed: Run | None, control: Run | None) -> tuple[PairStatus, str]:
    if fixed is None:
        return PairStatus.FIXED_MISSING, "no fixed run"
    if stock is None:
        return PairStatus.STOCK_MISSING, "no stock run"
    if stock.outcome in NO_OUTCOME or fixed.outcome in NO_OUTCOME:
        return PairStatus.NO_OUTCOME, f"stock {stock.outcome.value}, fixed {fixed.outcome.value}"
    good, why = fixed_matches_control(fixed, control)
    if shows_bug(stock):
        if not good:
            return PairStatus.NOT_RESOLVED, why
        if not control_usable(control):
            state = "missing" if control is None else control.outcome.value
            return PairStatus.RESOLVED_UNVERIFIED, f"{why}, but the control is {state}: not compared"
        return PairStatus.RESOLVED, why
    if stock.outcome is Outcome.CLEAN:
        return (
            (PairStatus.BOTH_CLEAN, "clean with and without the fix")
            if good
            else (PairStatus.REGRESSION, f"stock run clean, {why}")
        )
    if good:
        return PairStatus.OTHER_FAILURE_GONE, f"stock {stock.outcome.value} ({stock.signature.value}); {why}"
    return PairStatus.OTHER_FAILURE_PERSISTS, (
        f"stock {stock.outcome.value} ({stock.signature.value}), fixed {fixed.outcome.value} "
        f"({fixed.signature.value}): not the IllegalWork bug, not addressed by the fix"
    )


def fix_pairs(runs: Sequence[Run]) -> list[FixPair]:
    """Stock/fixed pairs of every MiCS run of one env, in run order."""
    groups: dict[tuple[Any, ...], dict[str, Run]] = {}
    for run in runs:
        if run.is_mics:
            groups.setdefault(run.key.without_patch(), {})[run.patch] = run
    pairs = []
    for sides in groups.values():
        stock, fixed = sides.get("stock"), sides.get("fixed")
        if fixed is None and stock is not None and stock.is_sync_control:
            continue  # a cause control: it has no fixed twin by design
        control = control_for(stock or fixed, runs)  # type: ignore[arg-type]
        status, detail = pair_status(stock, fixed, control)
        pairs.append(FixPair(stock=stock, fixed=fixed, control=control, status=status, detail=detail))
    return pairs


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


def stock_attempts(runs: Sequence[Run]) -> list[Run]:
    """Stock MiCS runs that try to reproduce; sync-transport runs are cause controls and do not count."""
    return [r for r in runs if r.is_mics and r.patch == "stock" and not r.is_sync_control]


def reproduces(runs: Sequence[Run]) -> tuple[Reproduces, list[Evidence]]:
    stock = stock_attempts(runs)
    if not stock:
        return Reproduces.NOT_TESTED, [Evidence("no stock MiCS run in these results")]
    bug = [r for r in stock if shows_bug(r)]
    if bug:
        return Reproduces.YES, [Evidence(describe(r), (r.ident,)) for r in bug]
    if all(r.outcome is Outcome.UNSUPPORTED for r in stock):
        return Reproduces.UNSUPPORTED, [
            Evidence(f"{run_label(r)}: {r.reason or 'unsupported'}", (r.ident,)) for r in stock
        ]
    evidence = [Evidence(describe(r), (r.ident,)) for r in stock]
    considered = [
        r for r in stock if r.scenario in REPORTER_SCENARIOS and r.outcome is not Outcome.UNSUPPORTED
    ]
    if considered and all(r.outcome is Outcome.CLEAN for r in considered):
        return Reproduces.NO, evidence
    return Reproduces.INCONCLUSIVE, evidence


def fix_verdict(pairs: Sequence[FixPair]) -> tuple[FixVerdict, list[Evidence]]:
    evidence = [
        Evidence(
            f"{run_label(p.stock or p.fixed)}: {p.status.value}: {p.detail}",  # type: ignore[arg-type]
            tuple(r.ident for r in (p.stock, p.fixed) if r is not None),
        )
        for p in pairs
    ]
    statuses = {p.status for p in pairs}
    if not any(p.fixed is not None for p in pairs):
        return FixVerdict.NOT_TESTED, evidence or [Evidence("no MiCS run in these results")]
    if statuses & {PairStatus.NOT_RESOLVED, PairStatus.REGRESSION}:
        return FixVerdict.NO, evidence
    bug_pairs = [p for p in pairs if p.stock is not None and shows_bug(p.stock)]
    if not bug_pairs:
        return FixVerdict.NOT_APPLICABLE, evidence
    bug_statuses = {p.status for p in bug_pairs}
    if bug_statuses == {PairStatus.RESOLVED}:
        return FixVerdict.YES, evidence
    if bug_statuses <= {PairStatus.RESOLVED, PairStatus.RESOLVED_UNVERIFIED}:
        return FixVerdict.UNVERIFIED, evidence
    return FixVerdict.INCONCLUSIVE, evidence


def control_problems(runs: Sequence[Run]) -> list[Evidence]:
    return [
        Evidence(f"control {describe(r)}: losses of MiCS runs could not be compared with it", (r.ident,))
        for r in runs
        if r.is_control and r.outcome is not Outcome.CLEAN
    ]


def env_answer(env: EnvInfo, merged: MergedResults) -> EnvAnswer:
    runs = merged.runs_of(env.id)
    repro, repro_evidence = reproduces(runs)
    pairs = fix_pairs(runs)
    fixed, fix_evidence = fix_verdict(pairs)
    problems = control_problems(runs)
    signatures = sorted({r.signature.value for r in stock_attempts(runs) if shows_bug(r)})
    backends = sorted({r.backend.label for r in runs})
    return EnvAnswer(
        env=env,
        versions=env_versions(env, runs),
        backends=tuple(backends),
        reproduces=repro,
        signatures=tuple(signatures),
        reproduce_evidence=tuple(repro_evidence + problems),
        fixed=fixed,
        fix_evidence=tuple(fix_evidence),
        pairs=tuple(pairs),
        control_problems=tuple(problems),
    )
