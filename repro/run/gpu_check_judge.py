"""gpu-check verdicts: pure functions of what each step found (probe JSON, run records, exit codes).

proven: the step showed what it is there to show on this host; not provable: this host or this
torch cannot show it (torch 2.0 has no placeholder; one GPU cannot run a MiCS gather); failed:
it should have, and did not (the fix did not gather, zero3 did not run clean on the GPU...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from repro.core.runs import RunFinding, finding_of
from repro.run.gpu_check_plan import HIDDEN_EXPECTED_EXIT, StepKind, StepResult, Verdict
from repro.workload.record import Outcome


def _err(outcome: Any) -> str:
    return str(outcome.get("error")) if isinstance(outcome, Mapping) else "no answer"


def _ok(outcome: Any) -> bool:
    return isinstance(outcome, Mapping) and bool(outcome.get("ok"))


def _answer(kind: StepKind, facts: Mapping[str, object]) -> Callable[[Verdict, str], StepResult]:
    """The step's result for a verdict and its one-line summary, with these facts."""
    return partial(StepResult, kind, facts=dict(facts))


def host(facts: Mapping[str, Any]) -> StepResult:
    answer = _answer(StepKind.HOST, facts)
    gpus = list(facts.get("gpus") or [])
    if not gpus:
        return answer(Verdict.FAILED, "no GPU found on this host")
    names = ", ".join(sorted({str(g.get("name") or g.get("arch") or "?") for g in gpus}))
    return answer(Verdict.PROVEN, f"{len(gpus)} GPU(s): {names}")


def raw_torch(facts: Mapping[str, Any]) -> StepResult:
    answer = _answer(StepKind.RAW_TORCH, facts)
    if facts.get("manager") != "async_ops":
        return answer(Verdict.NOT_PROVABLE, f"torch {facts.get('torch')}: {facts.get('manager')}")
    ran_on = facts.get("ran_on") or {}
    nccl = f" (NCCL/RCCL {ran_on.get('nccl')})" if ran_on.get("nccl") else ""
    backend = f"{ran_on.get('backend')}{nccl}"
    lost = facts.get("cm_works") == 0
    note = "; cm.works is empty: this build loses the real work (pytorch#122807)" if lost else ""
    if facts.get("placeholder_type") == "_IllegalWork" and not _ok(facts.get("placeholder_wait")):
        landed = facts.get("async_landed")
        summary = (
            f"torch {facts.get('torch')} on {backend}: the manager hands out _IllegalWork "
            f"({_err(facts.get('placeholder_wait'))}); the gather {'landed' if landed else 'did NOT land'} "
            f"after cm.wait(){note}"
        )
        return answer(Verdict.PROVEN if landed or lost else Verdict.FAILED, summary)
    return answer(
        Verdict.FAILED, f"expected an _IllegalWork placeholder, got {facts.get('placeholder_type')}"
    )


def _gathers(probe: Any) -> bool:
    return (
        isinstance(probe, Mapping)
        and bool(probe.get("async_landed_after_wait"))
        and bool(probe.get("sync_landed"))
    )


def ds_gather(facts: Mapping[str, Any]) -> StepResult:
    answer = _answer(StepKind.DS_GATHER, facts)
    stock, fixed = facts.get("stock") or {}, facts.get("fixed")
    fix = facts.get("fix") or {}
    if not fix.get("applied"):
        return answer(
            Verdict.NOT_PROVABLE,
            f"DeepSpeed {facts.get('deepspeed')}: the fix does not apply ({fix.get('reason')})",
        )
    if not _gathers(fixed):
        return answer(Verdict.FAILED, "with the fix all_gather_coalesced did not gather on the device")
    if _gathers(stock):
        return answer(
            Verdict.NOT_PROVABLE,
            f"stock DeepSpeed {facts.get('deepspeed')} gathers correctly with torch "
            f"{facts.get('torch')}: no bug to show here",
        )
    failures = [
        f"{how}: {_err(stock.get(key))}"
        for how, key in (("async wait", "async_wait"), ("sync", "sync_call"))
        if not _ok(stock.get(key))
    ]
    return answer(
        Verdict.PROVEN,
        f"stock fails ({'; '.join(failures) or 'data did not land'}); fixed gathers async and sync",
    )


def _on_gpu(run: Mapping[str, Any]) -> bool:
    ran = run.get("ran_on") or {}
    return ran.get("device") == "gpu" and bool(ran.get("gpus"))


def _find(runs: Sequence[Mapping[str, Any]], scenario: str, patch: str) -> Mapping[str, Any] | None:
    found = [r for r in runs if (r.get("scenario"), r.get("patch")) == (scenario, patch)]
    return next((r for r in found if r.get("transport") in (None, "native")), None)


def _finding(record: Mapping[str, Any]) -> RunFinding | None:
    """The run's finding as the env verdict reads it (repro.core.runs); None for a record that
    names no known outcome."""
    return finding_of(record.get("outcome"), record.get("signature") or "none")


def repro(runs: Sequence[Mapping[str, Any]], exit_code: int, gpus: int) -> StepResult:
    facts = {
        "exit_code": exit_code,
        "runs": [{k: r.get(k) for k in ("scenario", "patch", "outcome", "reason")} for r in runs],
    }
    answer = _answer(StepKind.REPRO, facts)
    control = _find(runs, "zero3", "stock")
    if control is None or _finding(control) is not RunFinding.CLEAN or not _on_gpu(control):
        what = (
            "missing"
            if control is None
            else f"{control.get('outcome')}, ran_on {(control.get('ran_on') or {}).get('device')}"
        )
        return answer(Verdict.FAILED, f"zero3 did not run clean on the GPU ({what})")
    names = ", ".join(sorted(set((control.get("ran_on") or {}).get("gpus") or [])))
    if gpus < 2:
        return answer(Verdict.PROVEN, f"zero3 clean on {names}; MiCS needs 2 GPUs (smoke run below)")
    verdicts: list[str] = []
    failed = unproven = False
    for scenario in ("mics", "mics-hier"):
        stock, fixed = _find(runs, scenario, "stock"), _find(runs, scenario, "fixed")
        if fixed is None or _finding(fixed) is not RunFinding.CLEAN or not _on_gpu(fixed):
            failed = True
            verdicts.append(f"{scenario} fixed {fixed.get('outcome') if fixed else 'missing'}")
            continue
        shown = stock is not None and _finding(stock) is RunFinding.BUG
        unproven |= not shown
        verdicts.append(f"{scenario} stock {stock.get('outcome') if stock else 'missing'}, fixed clean")
    verdict = Verdict.FAILED if failed else Verdict.NOT_PROVABLE if unproven else Verdict.PROVEN
    return answer(verdict, f"zero3 clean on {names}; " + "; ".join(verdicts))


def mics_smoke(records: Mapping[str, Mapping[str, Any] | None], exit_codes: Mapping[str, int]) -> StepResult:
    fixed = records.get("fixed") or {}
    facts = {
        "exit_codes": dict(exit_codes),
        "records": {
            p: {k: (r or {}).get(k) for k in ("losses", "illegal_work_messages", "exception")}
            for p, r in records.items()
        },
    }
    answer = _answer(StepKind.MICS_SMOKE, facts)
    losses = list(fixed.get("losses") or [])
    if exit_codes.get("fixed") != 0 or not losses or any(v is None for v in losses) or not _on_gpu(fixed):
        return answer(
            Verdict.FAILED,
            f"MiCS shard 1 with the fix did not train on the GPU (exit {exit_codes.get('fixed')})",
        )
    stock = records.get("stock") or {}
    messages = stock.get("illegal_work_messages") or 0
    said = f"stock exit {exit_codes.get('stock')}, {messages} IllegalWork messages"
    return answer(
        Verdict.PROVEN, f"MiCS shard 1 trains on the GPU with the fix ({len(losses)} finite losses); {said}"
    )


def _ran(run: Mapping[str, Any]) -> object:
    ran_on = run.get("ran_on")
    return ran_on.get("ran") if isinstance(ran_on, Mapping) else None


def _not_run(run: Mapping[str, Any]) -> bool:
    """The record of a run that was never launched because torch saw no GPU (`env-error`, and its
    `ran_on.ran` false: the suite's own words that nothing ran)."""
    return run.get("outcome") == Outcome.ENV_ERROR.value and _ran(run) is False


def hidden(runs: Sequence[Mapping[str, Any]], exit_code: int) -> StepResult:
    """Proven from the records, not from the exit code alone: exit 6 also comes from a 1-GPU host
    whose MiCS runs are `unsupported` (the GPUs were seen, nothing verified) and from a crashed
    control. Only every run recorded `env-error` with nothing run shows the GPUs were hidden."""
    facts = {
        "exit_code": exit_code,
        "expected": HIDDEN_EXPECTED_EXIT,
        "runs": [{"scenario": r.get("scenario"), "outcome": r.get("outcome"), "ran": _ran(r)} for r in runs],
    }
    answer = _answer(StepKind.HIDDEN, facts)
    seen = [r for r in runs if not _not_run(r)]
    if not runs or seen:
        what = (
            "no run record"
            if not runs
            else ", ".join(f"{r.get('scenario')} {r.get('patch')} {r.get('outcome')}" for r in seen)
        )
        return answer(
            Verdict.FAILED,
            f"with the GPUs hidden check-fix exited {exit_code}, but its records do not show the GPUs "
            f"hidden (every run env-error, nothing run): {what}",
        )
    if exit_code != HIDDEN_EXPECTED_EXIT:
        return answer(
            Verdict.FAILED, f"with the GPUs hidden check-fix exited {exit_code}, not {HIDDEN_EXPECTED_EXIT}"
        )
    return answer(
        Verdict.PROVEN,
        f"with the GPUs hidden torch saw none: {len(runs)} run(s) env-error, none ran; "
        f"check-fix verified nothing and exited {exit_code}",
    )
