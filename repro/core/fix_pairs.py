"""Stock and fixed runs side by side: which runs pair up in one env, which ZeRO-3 control each MiCS
run is judged against, and what each pair says (PairStatus). The env verdict
(repro/core/verdict.py) decides from these pairs; the report shows them.

Pure functions of typed run views (repro.core.runs.RunView over the record dicts).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from repro.core.runs import RunView, run_label, shows_bug
from repro.workload.controls import choose_control
from repro.workload.record import Outcome, Patch

R = TypeVar("R", bound=RunView)


class PairStatus(str, enum.Enum):
    """Stock vs fixed run of the same scenario/dtype/transport/layout in one env."""

    RESOLVED = "resolved"
    RESOLVED_UNVERIFIED = "resolved-unverified"
    NOT_RESOLVED = "not-resolved"
    REGRESSION = "regression"
    BOTH_CLEAN = "both-clean"
    OTHER_FAILURE_PERSISTS = "other-failure-persists"
    OTHER_FAILURE_GONE = "other-failure-gone"
    FIXED_MISSING = "fixed-missing"
    STOCK_MISSING = "stock-missing"
    NO_OUTCOME = "no-outcome"  # one side was interrupted, env-error, unsupported or no-evidence


NO_OUTCOME = (Outcome.INTERRUPTED, Outcome.ENV_ERROR, Outcome.UNSUPPORTED, Outcome.NO_EVIDENCE)


def control_for(run: RunView, runs: Sequence[RunView]) -> RunView | None:
    """The ZeRO-3 run the MiCS run was compared with: the record names it (control_run); older records
    get one by the suite's own rule (repro.workload.controls)."""
    if run.control_run:
        named = next((c for c in runs if c.env == run.env and c.name == run.control_run), None)
        if named is not None:
            return named
    controls = [c for c in runs if c.is_control and c.env == run.env]
    return choose_control(run.key.control_key, controls, lambda c: c.key.control_key)


def control_usable(control: RunView | None) -> bool:
    return control is not None and control.outcome is Outcome.CLEAN


@dataclass(frozen=True)
class FixPair:
    stock: RunView | None
    fixed: RunView | None
    control: RunView | None
    status: PairStatus
    detail: str

    def to_dict(self) -> dict[str, str | None]:
        return {
            "label": self.label,
            "stock": self.stock.ident if self.stock else None,
            "fixed": self.fixed.ident if self.fixed else None,
            "control": self.control.ident if self.control else None,
            "status": self.status.value,
            "detail": self.detail,
        }

    @property
    def label(self) -> str:
        run = self.stock or self.fixed
        assert run is not None  # a pair has at least one side
        return run_label(run)


def fixed_matches_control(fixed: RunView, control: RunView | None) -> tuple[bool, str]:
    """A fixed run counts as resolved only if it is clean, silent and indistinguishable from ZeRO-3."""
    if fixed.outcome is not Outcome.CLEAN:
        return False, f"fixed run {fixed.outcome.value} ({fixed.signature.value})"
    if fixed.illegal_work_messages:
        return False, f"fixed run still logs {fixed.illegal_work_messages} IllegalWork messages"
    if fixed.first_divergent_step is not None:
        return False, f"fixed run leaves the control's losses at step {fixed.first_divergent_step}"
    more_skips = control is not None and fixed.skipped_steps > control.skipped_steps
    if control is not None and control.outcome is Outcome.CLEAN and more_skips:
        return False, f"fixed run skipped {fixed.skipped_steps} steps, the control {control.skipped_steps}"
    same_weights = (
        control is not None
        and fixed.weights_checksum is not None
        and fixed.weights_checksum == control.weights_checksum
    )
    return True, "clean, no IllegalWork, losses match the control" + (
        "; final weights identical to the control's" if same_weights else ""
    )


def pair_status(
    stock: RunView | None, fixed: RunView | None, control: RunView | None
) -> tuple[PairStatus, str]:
    if fixed is None:
        return PairStatus.FIXED_MISSING, "no fixed run"
    if stock is None:
        return PairStatus.STOCK_MISSING, "no stock run"
    if stock.outcome in NO_OUTCOME or fixed.outcome in NO_OUTCOME:
        return PairStatus.NO_OUTCOME, f"stock {stock.outcome.value}, fixed {fixed.outcome.value}"
    good, why = fixed_matches_control(fixed, control)
    if shows_bug(stock):
        same = same_failures(stock, fixed) if not good else None
        if same:
            return PairStatus.RESOLVED_UNVERIFIED, same
        if not good:
            return PairStatus.NOT_RESOLVED, why
        if fixed.is_custom:  # the judge compared the job's fixed run with its stock run
            return PairStatus.RESOLVED, "clean with the fix, no IllegalWork; the stock run shows the bug"
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


def same_failures(stock: RunView, fixed: RunView) -> str | None:
    """Why a fixed pytest session that failed is not counted against the fix, or None. It holds
    when the fix took the bug's evidence away (no IllegalWork, not the bug) and every test that
    failed with the fix failed without it in the same words: those failures are the tests' own
    (e.g. a test broken while it was skipped), and they cannot show the fix works either."""
    own, theirs = fixed.failed_tests, stock.failed_tests
    if not own or theirs is None or fixed.illegal_work_messages or shows_bug(fixed):
        return None
    if fixed.outcome is not Outcome.CRASHED or any(theirs.get(test) != why for test, why in own.items()):
        return None
    first = next(iter(own.items()))
    return (
        f"no IllegalWork with the fix; the same {len(own)} test(s) fail with and without it (first: "
        f"{first[0]}: {first[1]}): not the bug, and they cannot verify the fix"
    )


def fix_pairs(runs: Sequence[RunView]) -> list[FixPair]:
    """Stock/fixed pairs of every MiCS run of one env, in run order."""
    groups: dict[tuple[Any, ...], dict[str, RunView]] = {}
    for run in runs:
        if run.is_mics or run.is_custom:
            groups.setdefault(run.key.without_patch(), {})[run.patch] = run
    pairs = []
    for sides in groups.values():
        stock, fixed = sides.get(Patch.STOCK.value), sides.get(Patch.FIXED.value)
        if fixed is None and stock is not None and stock.is_sync_control:
            continue  # a cause control: it has no fixed twin by design
        either = stock or fixed
        assert either is not None  # every group was made from one of its runs
        control = None if either.is_custom else control_for(either, runs)
        status, detail = pair_status(stock, fixed, control)
        pairs.append(FixPair(stock=stock, fixed=fixed, control=control, status=status, detail=detail))
    return pairs


def stock_attempts(runs: Sequence[R]) -> list[R]:
    """Stock runs that try to reproduce: MiCS runs of the suite and the user's own jobs (custom);
    sync-transport runs are cause controls and do not count."""
    return [
        r
        for r in runs
        if (r.is_mics or r.is_custom) and r.patch == Patch.STOCK.value and not r.is_sync_control
    ]


def fixed_attempts(runs: Sequence[R]) -> list[R]:
    """Fixed runs that can verify the fix (the counterpart of `stock_attempts`)."""
    return [
        r
        for r in runs
        if (r.is_mics or r.is_custom) and r.patch == Patch.FIXED.value and not r.is_sync_control
    ]
