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

Signatures (closed set, record.SIGNATURES) say which evidence the outcome rests on. The ladder
they are decided on, its thresholds and its divergence rule are ladder.py's, shared with the
own-job judge (judge.py); this module only gathers a suite record's evidence for it.
"""

from __future__ import annotations

from repro.workload import ladder
from repro.workload.ladder import TOLERANCE
from repro.workload.record import RunRecord

# A suite run's judgement (its historical name here).
Classification = ladder.Judgement

# Runner-level statuses that decide the outcome (of the same name) before any evidence is weighed.
STATUS_OUTCOMES = ("hung", "interrupted", "unsupported", "env-error")


def first_divergent_step(losses: list[float | None], control: list[float | None], dtype: str) -> int | None:
    """First step whose loss leaves the control's (ladder.first_divergent_step with the dtype's
    tolerance; steps beyond the shorter list count as missing)."""
    return ladder.first_divergent_step(losses, control, TOLERANCE[dtype])


def _failed(record: RunRecord) -> bool:
    exc = record.get("exception")
    return exc is not None or any(code not in (0, None) for code in (record.get("exit_codes") or {}).values())


def _crashed(record: RunRecord, illegal: int) -> Classification:
    exc = record.get("exception")
    where = f" on rank {exc.get('rank')}" if exc and exc.get("rank") is not None else ""
    bug = ladder.crash(exc, where, illegal)
    if bug is not None:
        return bug
    summary = f"{exc.get('type')}: {exc.get('message')}" if exc else "non-zero exit"
    return Classification("crashed", "crash", f"crashed{where}: {summary}", None)


def _as_control(losses: list[float | None]) -> Classification:
    bad = ladder.first_non_finite(losses)
    if not losses or bad is not None:
        what = "no losses recorded" if not losses else f"non-finite loss from step {bad}"
        return Classification("crashed", "crash", f"control run produced {what}", None)
    return Classification("clean", "none", f"control: {len(losses)} finite losses", None)


def classify(record: RunRecord, control: RunRecord | None, status: str | None = None) -> Classification:
    """Classify one run. `control` is the classified zero3 record of the same env, dtype and
    world size (None for the control itself or when it is missing). `status` is the runner's
    verdict on how the run ended ("hung", "interrupted", "unsupported", "env-error" or None)."""
    if status in STATUS_OUTCOMES:
        return ladder.status_judgement(status, record.get("reason") or status)
    losses: list[float | None] = list(record.get("losses") or [])
    illegal = int(record.get("illegal_work_messages") or 0)
    if _failed(record):
        return _crashed(record, illegal)
    if control is None and record.get("scenario") == "zero3":
        return _as_control(losses)
    dtype = record.get("dtype", "fp32")
    usable = control if control and control.get("outcome") == "clean" and control.get("losses") else None
    evidence = ladder.Evidence(
        illegal_work=illegal,
        losses=losses,
        skipped_steps=int(record.get("skipped_steps") or 0),
        control=ladder.Control(usable["losses"], int(usable.get("skipped_steps") or 0)) if usable else None,
        tolerance=TOLERANCE[dtype],
        words=ladder.SUITE_WORDS,
        storm_possible=dtype == "fp16",
    )
    compared = (
        f"losses match the control within {TOLERANCE[dtype]:g}"
        if usable
        else "no usable control to compare losses with; losses finite"
    )
    return ladder.weigh(evidence, compared=compared)
