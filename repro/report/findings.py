"""Everything else the runs show besides the IllegalWork bug: hangs, crashes, env errors..."""

from __future__ import annotations

from collections.abc import Sequence

from repro.core.runs import describe, run_label, shows_bug
from repro.report.merge import MergedResults
from repro.report.model import EnvInfo, Outcome, Run
from repro.report.verdicts import Finding, FindingKind
from repro.workload.closed import assert_never

STACK_LINES = 14
TRACEBACK_LINES = 10


def stack_excerpt(run: Run, max_ranks: int = 2) -> str:
    """The top frames (most recent first, as faulthandler writes them) of the first ranks' stacks."""
    chunks = []
    for rank in sorted(run.stacks, key=lambda r: (not r.isdigit(), int(r) if r.isdigit() else 0, r))[
        :max_ranks
    ]:
        lines = [line for line in run.stacks[rank].splitlines() if line.strip()]
        more = len(lines) - STACK_LINES
        body = "\n".join(lines[:STACK_LINES]) + (f"\n  ... {more} more lines" if more > 0 else "")
        chunks.append(f"--- rank {rank} ---\n{body}")
    hidden = len(run.stacks) - max_ranks
    if hidden > 0:
        chunks.append(f"({hidden} more ranks' stacks in the run's rank*.stack files)")
    return "\n".join(chunks)


def traceback_excerpt(run: Run) -> str:
    exc = run.exception
    if exc is None:
        return ""
    lines = [line for line in str(exc.get("traceback") or "").splitlines() if line.strip()]
    return "\n".join(lines[-TRACEBACK_LINES:])


def _logs(run: Run) -> tuple[str, ...]:
    return tuple(str(v) for v in (run.record.get("logs") or {}).values())


def run_findings(run: Run, runs: Sequence[Run]) -> list[Finding]:
    out: list[Finding] = []

    def found(kind: FindingKind, summary: str, excerpt: str = "", logs: tuple[str, ...] = ()) -> None:
        out.append(Finding(kind, run.env, run.ident, summary, excerpt, logs))

    outcome = run.outcome
    if outcome is Outcome.HUNG:
        reason = run.reason if run.reason.startswith("hung") else f"hung: {run.reason or 'timed out'}"
        summary = f"{run_label(run)}: {reason}"
        if run.record.get("timeout_s"):
            summary += f" (limit {run.record['timeout_s']} s)"
        found(FindingKind.HANG, summary, stack_excerpt(run), _logs(run))
    elif outcome is Outcome.CRASHED and (run.patch == "fixed" or not shows_bug(run)):
        # A stock IllegalWork crash is the bug itself and is reported under the answers.
        found(FindingKind.CRASH, describe(run), traceback_excerpt(run), _logs(run))
    elif outcome is Outcome.ENV_ERROR:
        found(FindingKind.ENV_ERROR, f"{run_label(run)}: {run.reason}", traceback_excerpt(run), _logs(run))
    elif outcome is Outcome.UNSUPPORTED:
        found(FindingKind.UNSUPPORTED, f"{run_label(run)}: {run.reason}")
    elif outcome is Outcome.INTERRUPTED:
        found(FindingKind.INTERRUPTED, f"{run_label(run)}: interrupted")
    elif outcome is Outcome.NO_EVIDENCE:
        found(FindingKind.NO_EVIDENCE, f"{run_label(run)}: {run.reason}")
    elif outcome is Outcome.REPRODUCED or outcome is Outcome.CLEAN or outcome is Outcome.CRASHED:
        pass  # the bug itself (reported under the answers), or nothing to report on its own
    else:
        assert_never(outcome)
    if run.is_control and outcome not in (Outcome.CLEAN, Outcome.INTERRUPTED):
        found(
            FindingKind.CONTROL_FAILED,
            f"the ZeRO-3 control did not run clean ({outcome.value}): MiCS losses in this env "
            "could not be compared with it",
        )
    if run.is_mics and run.patch == "fixed" and outcome is not Outcome.CLEAN:
        stock = next(
            (r for r in runs if r.patch == "stock" and r.key.without_patch() == run.key.without_patch()), None
        )
        if stock is not None and stock.outcome is Outcome.CLEAN:
            found(
                FindingKind.FIX_REGRESSION,
                f"clean without the fix, {outcome.value} ({run.signature.value}) with it",
            )
    return out


def suite_findings(env: EnvInfo) -> list[Finding]:
    """The env's whole suite, as opposed to one run, did not finish normally."""
    where = env.invocation.folder.name
    if env.suite_timed_out:
        kind, said = FindingKind.HANG, f"hit its time limit in {where}: runs after that point are missing"
    elif env.interrupted:
        kind, said = FindingKind.INTERRUPTED, f"was interrupted in {where}"
    elif env.suite_exit_code not in (None, 0):
        kind, said = (
            FindingKind.ENV_ERROR,
            f"exited {env.suite_exit_code} in {where}: some runs may lack records",
        )
    else:
        return []
    return [Finding(kind, env.id, None, f"the suite of env {env.id} {said}")]


def other_findings(merged: MergedResults) -> list[Finding]:
    findings: list[Finding] = []
    for env_id in merged.envs:
        runs = merged.runs_of(env_id)
        for run in runs:
            findings.extend(run_findings(run, runs))
        problems = sorted({str(p) for r in runs for p in (r.record.get("config_problems") or [])})
        for problem in problems:
            findings.append(Finding(FindingKind.CONFIG_PROBLEM, env_id, None, problem))
    for env in merged.envs.values():
        findings.extend(suite_findings(env))
    for inv in merged.invocations:
        if inv.interrupted:
            env_ids = sorted({r.env for r in merged.runs if r.invocation == inv})
            findings.append(
                Finding(
                    FindingKind.INTERRUPTED,
                    ",".join(env_ids) or "-",
                    None,
                    f"invocation {inv.folder.name} was interrupted (started {inv.started_at}); "
                    "runs it did not reach are missing. "
                    f"Re-run: {inv.command or 'the same make repro command'}",
                )
            )
    return findings
