"""Per-env verdict from the records: does MiCS break here, and does our fix repair it?

Pure functions of the records; used by the end-of-run summary, `check-fix` and bisection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAILURE_OUTCOMES = ("reproduced", "crashed", "hung")


@dataclass(frozen=True)
class EnvVerdict:
    env: str
    reproduces: bool | None     # None: no stock MiCS run produced evidence either way
    fix_resolves: bool | None   # None: no fixed MiCS run, or nothing to fix
    stock: tuple[str, ...]      # "scenario: outcome (signature)" for stock MiCS runs
    fixed: tuple[str, ...]
    problems: tuple[str, ...]   # env-error / unsupported / hung runs worth a look

    def headline(self) -> str:
        rep = {True: "REPRODUCED", False: "not reproduced", None: "no evidence"}[self.reproduces]
        fix = {True: "fix resolves it", False: "FIX DOES NOT RESOLVE IT", None: "fix not evaluated"}[
            self.fix_resolves]
        return f"{self.env}: {rep}; {fix}"


def _mics(runs: list[dict[str, Any]], patch: str) -> list[dict[str, Any]]:
    return [r for r in runs if r.get("scenario") != "zero3" and r.get("patch") == patch
            and r.get("transport") != "sync"]


def _label(run: dict[str, Any]) -> str:
    return f"{run.get('scenario')}/{run.get('patch')}/{run.get('transport')}: {run.get('outcome')} ({run.get('signature')})"


def env_verdict(env: str, runs: list[dict[str, Any]]) -> EnvVerdict:
    mine = [r for r in runs if r.get("env") == env]
    stock, fixed = _mics(mine, "stock"), _mics(mine, "fixed")
    decisive = [r for r in stock if r.get("outcome") in ("reproduced", "clean")]
    reproduces = any(r["outcome"] == "reproduced" for r in decisive) if decisive else None
    judged = [r for r in fixed if r.get("outcome") not in ("unsupported", "interrupted")]
    if not judged or reproduces is None:
        fix_resolves = None
    else:
        fix_resolves = all(r.get("outcome") == "clean" for r in judged)
    problems = tuple(_label(r) for r in mine if r.get("outcome") in ("env-error", "unsupported", "hung",
                                                                     "crashed", "interrupted"))
    return EnvVerdict(env, reproduces, fix_resolves, tuple(_label(r) for r in stock),
                      tuple(_label(r) for r in fixed), problems)


def fixed_runs_clean(runs: list[dict[str, Any]]) -> tuple[bool, list[str]]:
    """For `check-fix`: every fixed MiCS run that could run is clean. Returns (ok, failures)."""
    fixed = [r for r in runs if r.get("patch") == "fixed" and r.get("scenario") != "zero3"]
    bad = [_label(r) for r in fixed if r.get("outcome") not in ("clean", "unsupported")]
    if not fixed:
        return False, ["no fixed MiCS run was made"]
    return not bad, bad
