"""The one ladder of outcomes and signatures: the rungs every run is weighed on, the thresholds and
the divergence rule, shared by the suite's classifier (classify.py: our scenarios, on CPU or GPUs)
and the own-job judge (judge.py: a user's command). Each of them gathers its evidence its own way
(a suite record, a job's log and the hook's reports) and hands it here; what the evidence means is
decided only here.

The rungs, highest first (the first that holds decides):
  crash       an exception raised from an _IllegalWork object        reproduced / illegal-work-crash
              torch's coalescing manager waiting a lost work          reproduced / lost-work-crash
              any other failure                                       crashed / crash   (caller's words)
  evidence    IllegalWork seen and losses part / an overflow storm    reproduced / illegal-work-divergence
              IllegalWork seen, losses as the control's               reproduced / illegal-work-warnings
              losses part from the control's (or non-finite)          reproduced / divergence
              fp16 overflow storm the control does not have           reproduced / overflow-storm
              none of that                                            clean / none

Thresholds: step losses a and c (control) match when |a - c| <= tolerance * max(1, |c|), with
TOLERANCE[dtype] for a run whose dtype is known (our fix makes MiCS match ZeRO-3 bit for bit on CPU;
the tolerance leaves room for reduction-order differences on GPUs) and JOB_TOLERANCE, the widest, for
a user's job (its dtype is the job's business and its other run may be on non-deterministic GPUs).
A null (NaN/inf) loss never matches a finite one. An overflow storm: an fp16 run skips at least
OVERFLOW_STORM_EXTRA more steps than its control.

Runs inside the environments: standard library only (Python 3.9+).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from repro.workload.crash_signs import lost_coalesced_work, raised_from_illegal_work

TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 1e-2}
JOB_TOLERANCE = max(TOLERANCE.values())
OVERFLOW_STORM_EXTRA = 3

if TYPE_CHECKING:  # annotations only: the workload runs on Pythons whose typing cannot subscript these
    from collections.abc import Sequence

    from repro.workload.record import RecordedException

    Losses = Sequence[float | None]


@dataclass(frozen=True)
class Judgement:
    """One run's outcome, signature and reason (values of record.Outcome / record.Signature: plain
    strings so the record's JSON stays as it was), the first step whose loss leaves the control's,
    and notes for the reader. Not the env verdict: see repro/core/verdict.py."""

    outcome: str
    signature: str
    reason: str
    first_divergent_step: int | None
    notes: tuple[str, ...] = ()


def first_divergent_step(
    losses: Losses, control: Losses, tolerance: float, *, missing_diverges: bool = True
) -> int | None:
    """First step whose loss leaves the control's; None when every compared step matches.

    `missing_diverges`: steps beyond the shorter list count as missing, so a run that stopped early
    diverges at the first step it lacks (the suite: both runs make the same number of steps). A
    user's two runs may log different numbers of steps: they compare only the steps both have."""
    steps = max(len(losses), len(control)) if missing_diverges else min(len(losses), len(control))
    for step in range(steps):
        a = losses[step] if step < len(losses) else None
        c = control[step] if step < len(control) else None
        if a is None and c is None:
            continue
        if a is None or c is None or abs(a - c) > tolerance * max(1.0, abs(c)):
            return step
    return None


def first_non_finite(losses: Losses) -> int | None:
    return next((i for i, v in enumerate(losses) if v is None), None)


def crash(
    exc: RecordedException | None, where: str, illegal_work: int, *, in_framework: bool = True
) -> Judgement | None:
    """The crash rungs that are the bug; None for any other failure (the caller words it).
    `in_framework`: the frame that raised it is torch.distributed's or DeepSpeed's (a user's job
    may raise the bug's words itself; the suite's ranks run our own model, which raises none)."""
    if not exc or not in_framework:
        return None
    summary = f"{exc.get('type')}: {exc.get('message')}"
    if raised_from_illegal_work(exc):
        extra = f"; {illegal_work} IllegalWork messages before it" if illegal_work else ""
        why = f"crash raised from an IllegalWork object{where}: {summary}{extra}"
        return Judgement("reproduced", "illegal-work-crash", why, None)
    if lost_coalesced_work(exc):
        why = (
            f"crash in torch's coalescing manager{where}: {summary}: this torch release lost the "
            "coalesced all-gather's work (pytorch#122807), so nothing waits for MiCS's gather"
        )
        return Judgement("reproduced", "lost-work-crash", why, None)
    return None


@dataclass(frozen=True)
class Control:
    """The run a finished run is compared with: the suite's ZeRO-3 run of the same env, dtype and
    world size, or the fixed run of a user's command (for its stock run)."""

    losses: Losses
    skipped_steps: int


@dataclass(frozen=True)
class Words:
    """How the sentences of a reason name the comparison: the suite's records and a user's job have
    said it in their own words since their first release, and records and reports keep them."""

    parted: str  # "... at step {step}"; {detail} is describe(losses)
    non_finite: str  # "... from step {step}"
    storm: str  # "{skipped} ... vs {control} ..."
    prefix: str = ""  # before "no IllegalWork messages" in a clean reason
    compared_in_warnings: bool = True  # an IllegalWork-only reason also says how the losses compared


SUITE_WORDS = Words(
    parted="losses leave the control's at step {step} ({detail}; control finite)",
    non_finite="non-finite loss from step {step} (no usable control to compare)",
    storm="{skipped} overflow-skipped steps vs {control} in the control",
)
JOB_WORDS = Words(
    parted="losses part from the fixed run's at step {step}",
    non_finite="non-finite loss from step {step}",
    storm="{skipped} overflow-skipped steps vs {control} in the fixed run",
    prefix="exit code 0; ",
    compared_in_warnings=False,
)


@dataclass(frozen=True)
class Evidence:
    """What a run that ended without a crash shows, as the ladder's evidence rungs weigh it."""

    illegal_work: int
    losses: Losses
    skipped_steps: int
    control: Control | None
    tolerance: float
    words: Words
    storm_possible: bool = True  # an overflow storm can count (the suite: fp16 runs only)
    missing_diverges: bool = True  # see first_divergent_step
    non_finite_beside_control: bool = False  # NaN/inf is evidence even where a control matched (own jobs)
    illegal_work_source: str = ""  # after "N IllegalWork messages": who counted them, what corroborates
    none_source: str = ""  # after "no IllegalWork messages": whose messages were looked for


def _parting(ev: Evidence) -> tuple[int | None, list[str]]:
    """The step the losses part (from the control, or non-finite) and the sentences that say so."""
    said: list[str] = []
    step: int | None = None
    if ev.control is not None and ev.losses and ev.control.losses:
        step = first_divergent_step(
            ev.losses, ev.control.losses, ev.tolerance, missing_diverges=ev.missing_diverges
        )
        if step is not None:
            said.append(ev.words.parted.format(step=step, detail=describe(ev.losses)))
    if ev.control is None or ev.non_finite_beside_control:
        bad = first_non_finite(ev.losses)
        if bad is not None:
            said.append(ev.words.non_finite.format(step=bad))
            step = bad if step is None else min(step, bad)
    return step, said


def _storm(ev: Evidence) -> str:
    control = ev.control
    if control is None or not ev.storm_possible:
        return ""
    if ev.skipped_steps - control.skipped_steps < OVERFLOW_STORM_EXTRA:
        return ""
    return ev.words.storm.format(skipped=ev.skipped_steps, control=control.skipped_steps)


def weigh(ev: Evidence, *, compared: str = "", notes: Sequence[str] = ()) -> Judgement:
    """The evidence rungs. `compared` says how a run that matched compared (added to the
    IllegalWork-only reason and the clean reason when given)."""
    parted, evidence = _parting(ev)
    storm = _storm(ev)
    if storm:
        evidence.append(storm)
    if ev.illegal_work:
        evidence.insert(0, f"{ev.illegal_work} IllegalWork messages{ev.illegal_work_source}")
    reason = "; ".join(evidence)
    kept = tuple(notes)
    if ev.illegal_work and (parted is not None or storm):
        return Judgement("reproduced", "illegal-work-divergence", reason, parted, kept)
    if ev.illegal_work:
        said = _join(reason, compared) if ev.words.compared_in_warnings else reason
        return Judgement("reproduced", "illegal-work-warnings", said, None, kept)
    if parted is not None:
        return Judgement("reproduced", "divergence", reason, parted, kept)
    if storm:
        return Judgement("reproduced", "overflow-storm", reason, None, kept)
    clean = ev.words.prefix + _join(f"no IllegalWork messages{ev.none_source}", compared)
    return Judgement("clean", "none", clean, None, kept)


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def describe(losses: Losses) -> str:
    bad = first_non_finite(losses)
    return f"NaN/inf loss from step {bad}" if bad is not None else "losses finite"


def status_judgement(status: str, reason: str) -> Judgement:
    """How the runner says a run ended before any evidence is weighed (hung, interrupted, ...)."""
    return Judgement(status, "hang" if status == "hung" else "none", reason, None)
