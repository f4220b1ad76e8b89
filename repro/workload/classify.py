"""Outcome classification: a pure function of a run's record and its control's record.

Outcomes (closed set, record.OUTCOMES):
  reproduced   a bug signature is present: IllegalWork messages, a crash raised from an
               _IllegalWork object (or, on a release that loses the coalesced work, torch's
               coalescing manager waiting None in the same gather), losses that leave the
               control's beyond the tolerance, or an fp16 overflow storm the control does not have.
  clean        no signature, and the losses match the control's within the tolerance. (A run whose
               control is unusable is clean only if its own losses are finite; the reason says the
               comparison was impossible.)
  crashed      any other failure (an exception not raised from an _IllegalWork object, a non-zero
               exit, or a control run with non-finite losses).
  hung         the run hit its timeout (stacks are in the record).
  env-error    the environment could not run the workload (import errors, missing devices, ...).
  unsupported  the installed DeepSpeed cannot run the scenario (e.g. no MiCS in 0.19.8).
  interrupted  the user stopped the run (Ctrl-C) before it finished.

Signatures (closed set, record.SIGNATURES) say which evidence the outcome rests on; precedence
is crash > IllegalWork + divergence > IllegalWork only > divergence > overflow storm.

Tolerance: step losses a and c (control) match when |a - c| <= TOLERANCE[dtype] * max(1, |c|);
a null (NaN/inf) loss never matches a finite one. Our fix makes MiCS match ZeRO-3 bit for bit on
CPU; the tolerance leaves room for reduction-order differences on GPUs.
An overflow storm: an fp16 run skips at least OVERFLOW_STORM_EXTRA more steps than its control.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from repro.workload.crash_signs import lost_coalesced_work, raised_from_illegal_work

TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 1e-2}
OVERFLOW_STORM_EXTRA = 3

# Runner-level statuses that decide the outcome before any evidence is weighed.
STATUS_OUTCOMES = {
    "hung": "hung",
    "interrupted": "interrupted",
    "unsupported": "unsupported",
    "env-error": "env-error",
}


@dataclass(frozen=True)
class Classification:
    """One run's outcome, signature and reason (values of record.Outcome / record.Signature; plain
    strings so the record's JSON stays as it was). Not the env verdict: see repro/core/verdict.py."""

    outcome: str
    signature: str
    reason: str
    first_divergent_step: int | None


def first_divergent_step(losses: list[float | None], control: list[float | None], dtype: str) -> int | None:
    """First step whose loss leaves the control's; None when all compared steps match.

    Steps beyond the shorter list are compared as missing: a run that stopped early diverges
    at the first step it lacks.
    """
    tol = TOLERANCE[dtype]
    for step in range(max(len(losses), len(control))):
        a = losses[step] if step < len(losses) else None
        c = control[step] if step < len(control) else None
        if a is None and c is None:
            continue
        if a is None or c is None:
            return step
        if abs(a - c) > tol * max(1.0, abs(c)):
            return step
    return None


def _first_non_finite(losses: list[float | None]) -> int | None:
    return next((i for i, v in enumerate(losses) if v is None), None)


def _control_usable(control: dict[str, Any] | None) -> bool:
    return bool(control and control.get("outcome") == "clean" and control.get("losses"))


def _describe_losses(losses: list[float | None]) -> str:
    bad = _first_non_finite(losses)
    return f"NaN/inf loss from step {bad}" if bad is not None else "losses finite"


def classify(
    record: dict[str, Any], control: dict[str, Any] | None, status: str | None = None
) -> Classification:
    """Classify one run. `control` is the classified zero3 record of the same env, dtype and
    world size (None for the control itself or when it is missing). `status` is the runner's
    verdict on how the run ended ("hung", "interrupted", "unsupported", "env-error" or None)."""
    if status in STATUS_OUTCOMES:
        outcome = STATUS_OUTCOMES[status]
        signature = "hang" if outcome == "hung" else "none"
        return Classification(outcome, signature, record.get("reason") or outcome, None)

    exc = record.get("exception")
    losses: list[float | None] = list(record.get("losses") or [])
    illegal = int(record.get("illegal_work_messages") or 0)
    failed = exc is not None or any(
        code not in (0, None) for code in (record.get("exit_codes") or {}).values()
    )

    if failed:
        where = f" on rank {exc.get('rank')}" if exc and exc.get("rank") is not None else ""
        summary = f"{exc.get('type')}: {exc.get('message')}" if exc else "non-zero exit"
        if raised_from_illegal_work(exc):
            extra = f"; {illegal} IllegalWork messages before it" if illegal else ""
            return Classification(
                "reproduced",
                "illegal-work-crash",
                f"crash raised from an IllegalWork object{where}: {summary}{extra}",
                None,
            )
        if lost_coalesced_work(exc):
            return Classification(
                "reproduced",
                "lost-work-crash",
                f"crash in torch's coalescing manager{where}: {summary}: this torch release lost the "
                "coalesced all-gather's work (pytorch#122807), so nothing waits for MiCS's gather",
                None,
            )
        return Classification("crashed", "crash", f"crashed{where}: {summary}", None)

    is_control = control is None and record.get("scenario") == "zero3"
    if is_control:
        bad = _first_non_finite(losses)
        if not losses or bad is not None:
            what = "no losses recorded" if not losses else f"non-finite loss from step {bad}"
            return Classification("crashed", "crash", f"control run produced {what}", None)
        return Classification("clean", "none", f"control: {len(losses)} finite losses", None)

    evidence: list[str] = []
    diverged_at: int | None = None
    storm = False
    if _control_usable(control):
        assert control is not None
        diverged_at = first_divergent_step(losses, control["losses"], record.get("dtype", "fp32"))
        if diverged_at is not None:
            evidence.append(
                f"losses leave the control's at step {diverged_at} "
                f"({_describe_losses(losses)}; control finite)"
            )
        extra_skips = int(record.get("skipped_steps") or 0) - int(control.get("skipped_steps") or 0)
        if record.get("dtype") == "fp16" and extra_skips >= OVERFLOW_STORM_EXTRA:
            storm = True
            evidence.append(
                f"{record.get('skipped_steps')} overflow-skipped steps vs "
                f"{control.get('skipped_steps')} in the control"
            )
        compared = f"losses match the control within {TOLERANCE[record.get('dtype', 'fp32')]:g}"
    else:
        bad = _first_non_finite(losses)
        if bad is not None:
            diverged_at = bad
            evidence.append(f"non-finite loss from step {bad} (no usable control to compare)")
        compared = "no usable control to compare losses with; losses finite"

    if illegal:
        evidence.insert(0, f"{illegal} IllegalWork messages")
    reason = "; ".join(evidence)
    if illegal and (diverged_at is not None or storm):
        return Classification("reproduced", "illegal-work-divergence", reason, diverged_at)
    if illegal:
        return Classification("reproduced", "illegal-work-warnings", f"{reason}; {compared}", None)
    if diverged_at is not None:
        return Classification("reproduced", "divergence", reason, diverged_at)
    if storm:
        return Classification("reproduced", "overflow-storm", reason, None)
    return Classification("clean", "none", f"no IllegalWork messages; {compared}", None)
