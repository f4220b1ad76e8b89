"""THE env verdict: does MiCS show the bug in this env, does our fix resolve it, and was anything
verified. One decision, read by the end-of-run summary, `check-fix`, the report, the issue comment
and the bundle, so they can never disagree.

Pure functions of typed run views (repro.core.runs.RunView over the record dicts).

- reproduces: a stock MiCS run (sync-transport runs are cause controls and do not count) shows the
  bug (Reproduces).
- fixed: stock and fixed runs are paired by scenario/dtype/transport/layout; a fixed run counts as
  resolved only if it is clean, silent and matches the ZeRO-3 control. A failure that the stock run
  has too and that is not the IllegalWork bug (e.g. the replica-group hang of DeepSpeed 0.19.x,
  docs/background.md section 5) is a separate finding, never counted against the fix (FixVerdict).
- verified: at least one fixed MiCS run ran steps, has finite losses, and matches a clean control
  with finite losses. Without one, `check-fix` has checked nothing and must not pass.
- custom jobs (`make run CMD=...`, scenario "custom") are the env's evidence like the suite's MiCS
  runs: a job's stock and fixed runs are one pair (by job id) and each other's control (the judge,
  repro/workload/judge.py, compared them), so no ZeRO-3 control is needed to resolve or verify.
- a fixed run that did not run to an outcome (env-error, interrupted, unsupported) is never counted
  against the fix: it is no evidence either way.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from repro.core.errors import FixNotResolvedError, NothingVerifiedError, ReproError
from repro.core.evidence import as_evidence
from repro.core.fix_pairs import (
    NO_OUTCOME,
    FixPair,
    PairStatus,
    control_for,
    fix_pairs,
    fixed_attempts,
    fixed_matches_control,
    stock_attempts,
)
from repro.core.runs import RunView, describe, run_label, shows_bug
from repro.workload import layout as lay
from repro.workload.classify import first_divergent_step
from repro.workload.record import Outcome


class Reproduces(str, enum.Enum):
    YES = "yes"  # a stock MiCS run shows the IllegalWork bug
    NO = "no"  # the reporter's MiCS configurations ran clean
    UNSUPPORTED = "unsupported"  # MiCS is not available in this install (removed, or config rejected)
    # Every stock MiCS run had too few GPUs (ranks) to form a shard group: says nothing about MiCS.
    TOO_FEW_DEVICES = "too-few-devices"
    INCONCLUSIVE = "inconclusive"  # runs failed in other ways (hang, env-error, interrupted)
    NOT_TESTED = "not-tested"  # no stock MiCS run in the results


class FixVerdict(str, enum.Enum):
    YES = "yes"  # every reproduced run is clean with the fix and matches the control
    NO = "no"  # a fixed run still fails, or the fix broke a run that was clean
    UNVERIFIED = "unverified"  # fixed runs are clean but there is no usable control to compare with
    INCONCLUSIVE = "inconclusive"  # fixed counterparts missing or did not run to an outcome
    NOT_APPLICABLE = "n/a"  # nothing reproduced in this env, so there is nothing to fix
    NOT_TESTED = "not-tested"  # no fixed MiCS run in the results


@dataclass(frozen=True)
class Evidence:
    """One sentence of evidence and the runs (`RunView.ident`) it rests on."""

    text: str
    runs: tuple[str, ...] = ()

    def to_dict(self) -> EvidenceData:
        return {"text": self.text, "runs": list(self.runs)}


# Evidence in report.json.
class EvidenceData(TypedDict):
    text: str
    runs: list[str]


# The two configurations in the bug report: flat gather (the reporter's config) and hierarchical.
REPORTER_SCENARIOS = ("mics", "mics-hier")


@dataclass(frozen=True)
class Shortfall:
    """Why MiCS did not run: the layout had `have` devices, the smallest MiCS scenario asked for
    needs `needs` (repro/workload/layout.py)."""

    have: int
    needs: int
    on_gpus: bool

    def to_dict(self) -> ShortfallData:
        return {"have": self.have, "needs": self.needs, "on_gpus": self.on_gpus}


# A Shortfall in report.json.
class ShortfallData(TypedDict):
    have: int
    needs: int
    on_gpus: bool


def devices_needed(run: RunView) -> int | None:
    """The GPUs (ranks on CPU) this unsupported run needed, when its layout had too few: the suite
    records such a run without launching it, with no shard size (repro/workload/suite.py `_skip`).
    Derived from the record's scenario, world size and backend, so older records read the same."""
    if run.outcome is not Outcome.UNSUPPORTED or run.scenario not in lay.MIN_GPU_RANKS:
        return None
    key = run.key
    if key.shard_size is not None or key.world_size < 1:
        return None  # a MiCS layout that ran out of MiCS (no MiCS in this DeepSpeed), not of GPUs
    on_cpu = run.record.get("backend") == "gloo"
    need = (
        lay.cpu_layout(key.scenario, key.world_size)
        if on_cpu
        else lay.gpu_layout(key.scenario, key.world_size, 1)
    ).needs
    return need or None


def shortfall(runs: Sequence[RunView]) -> Shortfall | None:
    """The shortfall shared by every stock MiCS attempt, or None when any of them had what it needed."""
    stock = stock_attempts(runs)
    needs = [devices_needed(r) for r in stock]
    if not stock or None in needs:
        return None
    return Shortfall(
        have=max(r.key.world_size for r in stock),
        needs=min(n for n in needs if n is not None),
        on_gpus=any(r.record.get("backend") != "gloo" for r in stock),
    )


def reproduces(runs: Sequence[RunView]) -> tuple[Reproduces, list[Evidence]]:
    stock = stock_attempts(runs)
    if not stock:
        return Reproduces.NOT_TESTED, [Evidence("no stock MiCS run in these results")]
    bug = [r for r in stock if shows_bug(r)]
    if bug:
        return Reproduces.YES, [Evidence(describe(r), (r.ident,)) for r in bug]
    if shortfall(runs) is not None:
        return Reproduces.TOO_FEW_DEVICES, [
            Evidence(f"{run_label(r)}: {r.reason or 'unsupported: too few devices'}", (r.ident,))
            for r in stock
        ]
    if all(r.outcome is Outcome.UNSUPPORTED for r in stock):
        return Reproduces.UNSUPPORTED, [
            Evidence(f"{run_label(r)}: {r.reason or 'unsupported'}", (r.ident,)) for r in stock
        ]
    evidence = [Evidence(describe(r), (r.ident,)) for r in stock]
    considered = [
        r
        for r in stock
        if (r.scenario in REPORTER_SCENARIOS or r.is_custom) and r.outcome is not Outcome.UNSUPPORTED
    ]
    if considered and all(r.outcome is Outcome.CLEAN for r in considered):
        return Reproduces.NO, evidence
    return Reproduces.INCONCLUSIVE, evidence


def fix_verdict(pairs: Sequence[FixPair]) -> tuple[FixVerdict, list[Evidence]]:
    evidence = [
        Evidence(
            f"{p.label}: {p.status.value}: {p.detail}",
            tuple(r.ident for r in (p.stock, p.fixed) if r is not None),
        )
        for p in pairs
    ]
    statuses = {p.status for p in pairs}
    if not any(p.fixed is not None for p in pairs):
        return FixVerdict.NOT_TESTED, evidence or [Evidence("no MiCS run or own job in these results")]
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


def control_problems(runs: Sequence[RunView]) -> list[Evidence]:
    return [
        Evidence(f"control {describe(r)}: losses of MiCS runs could not be compared with it", (r.ident,))
        for r in runs
        if r.is_control and r.outcome is not Outcome.CLEAN
    ]


def _finite_losses(run: RunView) -> bool:
    losses = run.losses
    return bool(losses) and all(v is not None for v in losses)


def why_not_verified(fixed: RunView, runs: Sequence[RunView]) -> str | None:
    """None when this fixed run verifies the fix: it ran steps, its losses are finite and match a
    clean control's finite losses (recomputed here, not taken from the record). Else why not."""
    if fixed.outcome is not Outcome.CLEAN:
        return f"{fixed.name}: {fixed.outcome.value} ({fixed.reason or fixed.signature.value})"
    if fixed.is_custom:
        return _why_job_not_verified(fixed)
    if not fixed.losses:
        return f"{fixed.name}: ran no steps (no losses recorded)"
    if not _finite_losses(fixed):
        return f"{fixed.name}: NaN/inf losses"
    control = control_for(fixed, runs)
    if control is None:
        return f"{fixed.name}: no ZeRO-3 control of the same dtype and world size to compare with"
    if control.outcome is not Outcome.CLEAN or not _finite_losses(control):
        return (
            f"{fixed.name}: its control {control.name} is {control.outcome.value} "
            f"({control.reason or 'no finite losses'}): nothing to compare with"
        )
    step = first_divergent_step(fixed.losses, control.losses, fixed.key.dtype)
    if step is not None:
        return f"{fixed.name}: losses leave the control's at step {step}"
    good, why = fixed_matches_control(fixed, control)
    return None if good else f"{fixed.name}: {why}"


def _why_job_not_verified(fixed: RunView) -> str | None:
    """A custom job's clean fixed run verifies the fix once DeepSpeed ran a step in it (the hook saw
    the engine: the record has its world size) and its losses, where the output has any, are finite."""
    if not (fixed.record.get("job") or {}).get("deepspeed_imported"):
        return f"{fixed.name}: the command never imported DeepSpeed"
    if not fixed.record.get("world_size"):
        return f"{fixed.name}: no DeepSpeed optimizer step was seen"
    if fixed.losses and not _finite_losses(fixed):
        return f"{fixed.name}: NaN/inf losses"
    return None


def verification(runs: Sequence[RunView]) -> tuple[tuple[str, ...], str]:
    """(fixed runs that verify the fix, why nothing is verified; "" when something is).

    Sync-transport runs do not count: a synchronous transport hides the missing wait, so a clean
    fixed run over it proves nothing about the fix."""
    fixed = fixed_attempts(runs)
    if not fixed:
        return (), "no fixed MiCS run was made"
    reasons = {r.ident: why_not_verified(r, runs) for r in fixed}
    verified = tuple(ident for ident, why in reasons.items() if why is None)
    if verified:
        return verified, ""
    if all(r.outcome is Outcome.UNSUPPORTED for r in fixed):
        return (), f"every fixed MiCS run is unsupported ({fixed[0].reason or 'no MiCS in this DeepSpeed'})"
    if all(r.outcome is Outcome.ENV_ERROR for r in fixed) and len({r.reason for r in fixed}) == 1:
        # One cause stopped them all (e.g. no GPU of the env's platform): say it once.
        return (), f"every fixed MiCS run is env-error ({fixed[0].reason})"
    return (), "; ".join(why for why in reasons.values() if why)


def _fix_failures(pairs: Sequence[FixPair]) -> tuple[Evidence, ...]:
    """Fixed runs that count against the fix. A fixed run without a stock twin (check-fix runs only
    fixed ones) that crashed, hung or reproduced counts too: nothing here shows it is a separate bug.
    One that did not run to an outcome (env-error, interrupted, unsupported: NO_OUTCOME) never
    counts: it says nothing about the fix (e.g. a GPU env whose devices torch cannot see)."""
    failing = []
    for p in pairs:
        against = p.status in (PairStatus.NOT_RESOLVED, PairStatus.REGRESSION) or (
            p.status in (PairStatus.STOCK_MISSING, PairStatus.NO_OUTCOME)
            and p.fixed is not None
            and p.fixed.outcome is not Outcome.CLEAN
            and p.fixed.outcome not in NO_OUTCOME
        )
        if against and p.fixed is not None:
            detail = p.detail if p.stock is not None else f"{p.detail}; fixed {describe(p.fixed)}"
            failing.append(Evidence(f"{p.fixed.name}: {p.status.value}: {detail}", (p.fixed.ident,)))
    return tuple(failing)


class Subject(str, enum.Enum):
    """What the env's verdict rests on: the suite's MiCS runs, the user's own jobs, or both."""

    SUITE = "suite"
    OWN_JOB = "your command"
    BOTH = "suite and your command"
    NONE = "none"  # no stock or fixed attempt at all


def subject_of(runs: Sequence[RunView]) -> Subject:
    attempts = stock_attempts(runs) + fixed_attempts(runs)
    custom = any(r.is_custom for r in attempts)
    suite = any(not r.is_custom for r in attempts)
    if custom and suite:
        return Subject.BOTH
    if custom:
        return Subject.OWN_JOB
    return Subject.SUITE if suite else Subject.NONE


# The verdict's words: the ONLY place they are written (tests/verdict/test_verdict_words.py keeps it so).
# The report prints the enum values next to them. "no evidence" is what the summary has always said
# when no stock MiCS run ran to an outcome; docs/how-it-works.md quotes it.
_REPRODUCES_WORDS = {
    Reproduces.YES: "REPRODUCED",
    Reproduces.NO: "not reproduced",
    Reproduces.UNSUPPORTED: "no evidence (MiCS unsupported here)",
    Reproduces.TOO_FEW_DEVICES: "no evidence (too few GPUs here for MiCS to run)",
    Reproduces.INCONCLUSIVE: "no evidence",
    Reproduces.NOT_TESTED: "no evidence (no stock MiCS run)",
}
_FIX_WORDS = {
    FixVerdict.YES: "fix resolves it",
    FixVerdict.NO: "FIX DOES NOT RESOLVE IT",
    FixVerdict.UNVERIFIED: "fix unverified (no usable control to compare with)",
    FixVerdict.INCONCLUSIVE: "fix not evaluated (inconclusive)",
    FixVerdict.NOT_APPLICABLE: "fix not evaluated (nothing reproduced)",
    FixVerdict.NOT_TESTED: "fix not evaluated",
}


def reproduces_words(reproduces: Reproduces) -> str:
    return _REPRODUCES_WORDS[reproduces]


def fix_words(fixed: FixVerdict) -> str:
    return _FIX_WORDS[fixed]


SAME_TESTS_FAIL_WORDS = "fix unverified (the same tests fail with and without it)"
NO_STOCK_RUN_WORDS = "fix not evaluated (no stock run to compare with)"  # check-fix runs only fixed ones
TOO_FEW_DEVICES_FIX_WORDS = "fix not evaluated (MiCS could not run here)"  # with Reproduces.TOO_FEW_DEVICES


def shortfall_words(short: Shortfall) -> str:
    """TOO_FEW_DEVICES with its numbers: the cause is the host, and the smallest one that can test it."""
    if short.on_gpus:
        gpus = "GPU" if short.have == 1 else "GPUs"
        return (
            f"no evidence ({short.have} {gpus} here, too few for MiCS: its shard group needs at least "
            f"{short.needs} GPUs, one rank each; run on a host with {short.needs} or more GPUs)"
        )
    ranks = "rank" if short.have == 1 else "ranks"
    return (
        f"no evidence ({short.have} {ranks} here, too few for MiCS: its shard group needs at least "
        f"{short.needs} ranks; run with WORLD_SIZE={short.needs} or more)"
    )


# An env's verdict in report.json (EnvVerdict's fields, its texts, and the enums' values).
class VerdictData(TypedDict):
    env: str
    subject: str
    headline: str
    reproduces: str
    reproduces_text: str
    signatures: list[str]
    reproduce_evidence: list[EvidenceData]
    fixed: str
    fix_text: str
    fix_evidence: list[EvidenceData]
    pairs: list[dict[str, str | None]]  # FixPair.to_dict
    control_problems: list[EvidenceData]
    other_failures: list[EvidenceData]
    fix_failures: list[EvidenceData]
    verified: list[str]
    unverified_reason: str
    shortfall: ShortfallData | None
    notes: list[str]


@dataclass(frozen=True)
class EnvVerdict:
    """The one verdict of one env, with the evidence behind each part. It decides (reproduces,
    fixed, verified), words (`headline`, `notes`) and serialises (`to_dict`) the answer; every
    reader (summary, check-fix, report, issue comment, bundle) takes both from here."""

    env: str
    reproduces: Reproduces
    signatures: tuple[str, ...]  # of the stock runs that show the bug
    reproduce_evidence: tuple[Evidence, ...]
    fixed: FixVerdict
    fix_evidence: tuple[Evidence, ...]
    pairs: tuple[FixPair, ...]
    control_problems: tuple[Evidence, ...]
    # Failures the stock run has too and that are not the IllegalWork bug: reported on their own.
    other_failures: tuple[Evidence, ...]
    fix_failures: tuple[Evidence, ...]  # fixed runs that count against the fix
    verified: tuple[str, ...]  # fixed runs (idents) that ran steps and matched a clean control
    unverified_reason: str  # why `verified` is empty; "" when it is not
    subject: Subject = Subject.SUITE
    shortfall: Shortfall | None = None  # set with Reproduces.TOO_FEW_DEVICES

    @property
    def nothing_verified(self) -> bool:
        return not self.verified

    @property
    def all_fixed_clean(self) -> bool:
        """Every fixed run of a pair came out clean (and there is at least one)."""
        fixed = [p.fixed for p in self.pairs if p.fixed is not None]
        return bool(fixed) and all(r.outcome is Outcome.CLEAN for r in fixed)

    @property
    def reproduces_text(self) -> str:
        if self.reproduces is Reproduces.NOT_TESTED and self.subject is Subject.OWN_JOB:
            return "no evidence (no stock run of your command)"
        if self.reproduces is Reproduces.TOO_FEW_DEVICES and self.shortfall is not None:
            return shortfall_words(self.shortfall)
        return reproduces_words(self.reproduces)

    @property
    def fix_text(self) -> str:
        if self.reproduces is Reproduces.NOT_TESTED and self.fixed is FixVerdict.NOT_APPLICABLE:
            return NO_STOCK_RUN_WORDS
        if self.reproduces is Reproduces.TOO_FEW_DEVICES and self.fixed is FixVerdict.NOT_APPLICABLE:
            return TOO_FEW_DEVICES_FIX_WORDS
        if self.fixed is FixVerdict.UNVERIFIED and self._tests_fail_both_ways():
            return SAME_TESTS_FAIL_WORDS
        return fix_words(self.fixed)

    def _unverified_pairs(self) -> list[FixPair]:
        return [p for p in self.pairs if p.status is PairStatus.RESOLVED_UNVERIFIED]

    def _tests_fail_both_ways(self) -> bool:
        """Unverified only because a pytest job's tests fail the same way with and without the fix
        (fix_pairs.same_failures), not for want of a control."""
        pairs = self._unverified_pairs()
        return bool(pairs) and all(p.fixed is not None and p.fixed.failed_tests for p in pairs)

    @property
    def label(self) -> str:
        """The env, and what its verdict rests on when that is not (only) the suite."""
        own = self.subject in (Subject.OWN_JOB, Subject.BOTH)
        return f"{self.env} ({self.subject.value})" if own else self.env

    def headline(self) -> str:
        return f"{self.label}: {self.reproduces_text}; {self.fix_text}"

    def notes(self) -> list[str]:
        """What the summary prints under the headline."""
        lines = [f"separate problem, not counted against the fix: {e.text}" for e in self.other_failures]
        # e.g. plain gloo, which cannot coalesce: stock MiCS fails there, the fix falls back
        lines += [
            f"stock failure that is not the IllegalWork bug, gone with the fix: {p.label}: {p.detail}"
            for p in self.pairs
            if p.status is PairStatus.OTHER_FAILURE_GONE
        ]
        if self._tests_fail_both_ways():
            lines += [f"fix unverified: {p.label}: {p.detail}" for p in self._unverified_pairs()]
        if self.nothing_verified and any(p.fixed is not None for p in self.pairs):
            lines.append(f"nothing verified: {self.unverified_reason}")
        elif self.verified and self.reproduces is Reproduces.NOT_TESTED:
            names = ", ".join(ident.split("/", 1)[1] for ident in self.verified)
            lines.append(f"fixed runs that ran clean and match the ZeRO-3 control: {names}")
        return lines

    def to_dict(self) -> VerdictData:
        return {
            "env": self.env,
            "subject": self.subject.value,
            "headline": self.headline(),
            "reproduces": self.reproduces.value,
            "reproduces_text": self.reproduces_text,
            "signatures": list(self.signatures),
            "reproduce_evidence": [e.to_dict() for e in self.reproduce_evidence],
            "fixed": self.fixed.value,
            "fix_text": self.fix_text,
            "fix_evidence": [e.to_dict() for e in self.fix_evidence],
            "pairs": [p.to_dict() for p in self.pairs],
            "control_problems": [e.to_dict() for e in self.control_problems],
            "other_failures": [e.to_dict() for e in self.other_failures],
            "fix_failures": [e.to_dict() for e in self.fix_failures],
            "verified": list(self.verified),
            "unverified_reason": self.unverified_reason,
            "shortfall": None if self.shortfall is None else self.shortfall.to_dict(),
            "notes": self.notes(),
        }


def env_verdict(env: str, runs: Sequence[RunView]) -> EnvVerdict:
    """The verdict of `env` from its runs (runs of other envs are ignored)."""
    mine = [r for r in runs if r.env == env]
    repro, repro_evidence = reproduces(mine)
    pairs = fix_pairs(mine)
    fixed, fix_evidence = fix_verdict(pairs)
    verified, unverified_reason = verification(mine)
    return EnvVerdict(
        env=env,
        reproduces=repro,
        signatures=tuple(sorted({r.signature.value for r in stock_attempts(mine) if shows_bug(r)})),
        reproduce_evidence=tuple(repro_evidence),
        fixed=fixed,
        fix_evidence=tuple(fix_evidence),
        pairs=tuple(pairs),
        control_problems=tuple(control_problems(mine)),
        other_failures=tuple(
            Evidence(f"{p.label}: {p.detail}", tuple(r.ident for r in (p.stock, p.fixed) if r is not None))
            for p in pairs
            if p.status is PairStatus.OTHER_FAILURE_PERSISTS
        ),
        fix_failures=_fix_failures(pairs),
        verified=verified,
        unverified_reason=unverified_reason,
        subject=subject_of(mine),
        shortfall=shortfall(mine) if repro is Reproduces.TOO_FEW_DEVICES else None,
    )


def views(records: Iterable[Mapping[str, Any]], platforms: Mapping[str, str] | None = None) -> list[RunView]:
    """Runs as evidence: one that did not run on its env's platform (repro/core/evidence.py) is an
    env-error naming why. `platforms`: env id -> platform where known (else the record's own)."""
    return [RunView(r) for r in as_evidence(records, platforms)]


def env_verdicts(
    records: Sequence[Mapping[str, Any]], platforms: Mapping[str, str] | None = None
) -> list[EnvVerdict]:
    """One verdict per env of the records, in the order the envs first appear. `platforms`: env id
    -> platform (results.json's envs) where known, for the evidence check."""
    runs = views(records, platforms)
    envs = list(dict.fromkeys(r.env for r in runs))
    return [env_verdict(env, runs) for env in envs]


@dataclass(frozen=True)
class FixCheck:
    """`check-fix`'s answer: failures first, then whether anything was verified at all. Its exit
    code comes from here (0 ok, FixNotResolvedError 20, NothingVerifiedError 6), so it is the one
    verdict's, never a re-derivation from outcome strings."""

    failures: tuple[str, ...]
    unverified: tuple[str, ...]  # "<env>: <why nothing was verified>"
    verified: int
    verdicts: tuple[EnvVerdict, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures and not self.unverified

    def error(self) -> ReproError | None:
        """What check-fix raises (its exit code), or None when the fix is verified everywhere."""
        if self.failures:
            return FixNotResolvedError(
                "the fix does not resolve the failure in every fixed run",
                why="; ".join(self.failures),
                fix="see the records in the results folder for evidence",
            )
        if self.unverified:
            return NothingVerifiedError(
                "check-fix verified nothing: no fixed MiCS run ran steps and matched a clean control",
                why="; ".join(self.unverified),
                fix="look at the control's record; check STEPS/WORLD_SIZE, and that this DeepSpeed has MiCS",
            )
        return None

    @property
    def exit_code(self) -> int:
        error = self.error()
        return 0 if error is None else error.exit_code


def check_fix(records: Sequence[Mapping[str, Any]], platforms: Mapping[str, str] | None = None) -> FixCheck:
    verdicts = env_verdicts(records, platforms)
    if not verdicts:
        return FixCheck((), ("no run was recorded",), 0)
    return FixCheck(
        failures=tuple(f"{v.env}: {e.text}" for v in verdicts for e in v.fix_failures),
        unverified=tuple(f"{v.env}: {v.unverified_reason}" for v in verdicts if v.nothing_verified),
        verified=sum(len(v.verified) for v in verdicts),
        verdicts=tuple(verdicts),
    )
