"""Is it MiCS logic or the ROCm environment? A pure function of the merged records.

The question is answered by comparing backends: the same failure on CPU/gloo and on a GPU backend
(RCCL on ROCm, NCCL on CUDA) cannot come from ROCm. Without a GPU run the answer says exactly what
is missing and what the CPU evidence shows (the reporter's signatures, the sync transport control).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict, cast

from repro.core.fix_pairs import stock_attempts
from repro.core.records import as_json
from repro.core.runs import describe, shows_bug
from repro.core.verdict import EvidenceData
from repro.report.merge import MergedResults
from repro.report.model import REPORTER_SIGNATURES, Backend, Outcome, Run, Signature
from repro.report.verdicts import CauseVerdict, Evidence, Missing

DEFAULT_GPU_ENV_HINT = ("rocm56",)


@dataclass(frozen=True)
class CauseAnswer:
    verdict: CauseVerdict
    summary: str
    evidence: tuple[Evidence, ...]
    missing: tuple[Missing, ...]

    def to_dict(self) -> CauseData:
        return cast(CauseData, as_json(self))


# The cause answer in report.json.
class CauseData(TypedDict):
    verdict: str
    summary: str
    evidence: list[EvidenceData]
    missing: list[dict[str, str]]  # Missing.to_dict


def _sync_control_evidence(stock: Sequence[Run]) -> list[Evidence]:
    """A synchronous transport completes every collective before returning, so the missing wait is harmless
    there: a sync run that matches the control next to an async run that does not isolates the cause."""

    def place(r: Run) -> tuple[str, str, str, int]:
        return r.env, r.scenario, r.key.dtype, r.key.world_size

    out = []
    for sync in (r for r in stock if r.key.transport == "sync"):
        twin = next((r for r in stock if r.key.transport == "async" and place(r) == place(sync)), None)
        if twin is None or not shows_bug(twin):
            continue
        control = f"sync transport control ({sync.env}, {sync.scenario}, {sync.key.dtype})"
        if sync.outcome is Outcome.CLEAN or sync.signature is Signature.ILLEGAL_WORK_WARNINGS:
            text = (
                f"{control}: {sync.illegal_work_messages} IllegalWork messages yet losses match ZeRO-3, "
                f"while the async run {twin.signature.value}: "
                "the missing wait on the real all-gather is the cause"
            )
        else:
            text = (
                f"{control} also fails ({sync.outcome.value}, {sync.signature.value}): "
                "something besides the missing wait is wrong"
            )
        out.append(Evidence(text, (sync.ident, twin.ident)))
    return out


def _reporter_match(runs: Sequence[Run]) -> list[Evidence]:
    out = []
    for scenario, expected in REPORTER_SIGNATURES.items():
        hits = [r for r in runs if r.scenario == scenario and shows_bug(r)]
        if not hits:
            continue
        same = [r for r in hits if r.signature is expected]
        verb = "matches" if same else "differs from"
        got = ", ".join(sorted({r.signature.value for r in hits}))
        out.append(
            Evidence(
                f"{scenario}: signature {got} {verb} the reporter's ({expected.value})",
                tuple(r.ident for r in hits),
            )
        )
    return out


def _gpu_hint(hint: Sequence[str]) -> Missing:
    env = hint[0] if hint else DEFAULT_GPU_ENV_HINT[0]
    return Missing(
        what="no ROCm/CUDA run (nccl backend) in these results, "
        "so CPU/gloo cannot be compared with a GPU backend",
        how=f"run `make repro ENV={env}` on an AMD host (or a CUDA env on an NVIDIA host) and merge: "
        f"`make report RESULTS=<this folder>,<new folder>`",
    )


@dataclass(frozen=True)
class _StockRuns:
    """The stock MiCS attempts, split the ways the answer compares them."""

    stock: list[Run]
    bug: list[Run]
    gpu_runs: list[Run]
    cpu_runs: list[Run]
    cpu_bug: list[Run]
    gpu_bug: list[Run]


def _split_stock(runs: Sequence[Run]) -> _StockRuns:
    """Each stock attempt sorted by backend and by whether it shows the bug."""
    stock = stock_attempts(runs)
    bug = [r for r in stock if shows_bug(r)]
    gpu_runs = [r for r in stock if r.backend.is_gpu]
    # A run whose backend is unknown (older folders) is neither CPU nor GPU evidence.
    cpu_runs = [r for r in stock if r.backend is Backend.CPU_GLOO]
    cpu_bug = [r for r in bug if r.backend is Backend.CPU_GLOO]
    gpu_bug = [r for r in bug if r.backend.is_gpu]
    return _StockRuns(stock, bug, gpu_runs, cpu_runs, cpu_bug, gpu_bug)


def cause(merged: MergedResults, gpu_env_hint: Sequence[str] = DEFAULT_GPU_ENV_HINT) -> CauseAnswer:
    """Logic or environment: the verdict from comparing the backends the bug shows on."""
    all_stock = [r for r in merged.runs if r.is_mics and r.patch == "stock"]
    runs = _split_stock(merged.runs)
    missing: tuple[Missing, ...] = () if runs.gpu_runs else (_gpu_hint(gpu_env_hint),)

    if not runs.bug:
        return _not_reproduced(runs.stock, missing)

    evidence = _reporter_match(runs.bug) + _sync_control_evidence(all_stock)
    if not runs.cpu_bug and not runs.gpu_bug:
        return _no_platform(runs.bug, evidence, missing)
    if not runs.gpu_runs:
        return _cpu_without_gpu_runs(runs.cpu_bug, evidence, missing)

    if runs.gpu_bug:
        on_gpu = _on_cpu_and_gpu if runs.cpu_bug else _on_gpu_only
        per_backend = sorted({r.backend for r in runs.gpu_bug}, key=lambda b: b.value)
        return on_gpu(runs, per_backend, evidence, missing)
    return _on_cpu_not_gpu(runs, evidence, missing)


def _not_reproduced(stock: Sequence[Run], missing: tuple[Missing, ...]) -> CauseAnswer:
    """No stock run shows the bug: nothing to attribute, every attempt listed."""
    evidence = [Evidence(describe(r), (r.ident,)) for r in stock]
    return CauseAnswer(
        CauseVerdict.NOT_REPRODUCED,
        "nothing to attribute: no stock MiCS run shows the bug in these results",
        tuple(evidence),
        tuple(missing),
    )


def _no_platform(bug: Sequence[Run], evidence: list[Evidence], missing: tuple[Missing, ...]) -> CauseAnswer:
    """Reproduced, but no failing run recorded what it ran on: neither CPU nor GPU evidence."""
    return CauseAnswer(
        CauseVerdict.INCONCLUSIVE,
        "reproduced, but these results do not say what the runs ran on (no platform or backend "
        "recorded): neither CPU nor GPU evidence",
        tuple([Evidence(describe(r), (r.ident,)) for r in bug] + evidence),
        tuple(missing),
    )


def _cpu_without_gpu_runs(
    cpu_bug: Sequence[Run], evidence: list[Evidence], missing: tuple[Missing, ...]
) -> CauseAnswer:
    """Fails on CPU/gloo and there is no GPU run at all: points to logic, the comparison is missing."""
    envs = sorted({r.env for r in cpu_bug})
    sigs = sorted({r.signature.value for r in cpu_bug})
    head = [
        Evidence(
            f"reproduced without any GPU or ROCm on CPU/gloo in {', '.join(envs)}: {', '.join(sigs)}",
            tuple(r.ident for r in cpu_bug),
        )
    ]
    return CauseAnswer(
        CauseVerdict.NEEDS_GPU_EVIDENCE,
        "the CPU evidence points to MiCS/DeepSpeed+torch logic (it fails without ROCm), but the GPU "
        "comparison is missing",
        tuple(head + evidence),
        tuple(missing),
    )


def _backend_lines(gpu_bug: Sequence[Run], per_backend: list[Backend]) -> list[Evidence]:
    """One line per GPU backend the bug shows on, with its failing runs."""
    return [
        Evidence(
            f"{b.label}: " + "; ".join(describe(r) for r in gpu_bug if r.backend is b),
            tuple(r.ident for r in gpu_bug if r.backend is b),
        )
        for b in per_backend
    ]


def _on_cpu_and_gpu(
    runs: _StockRuns, per_backend: list[Backend], evidence: list[Evidence], missing: tuple[Missing, ...]
) -> CauseAnswer:
    """The same failure on CPU/gloo and a GPU backend: MiCS logic, compared scenario by scenario."""
    backend_lines = _backend_lines(runs.gpu_bug, per_backend)
    scenario_lines = []
    for scenario in sorted({r.scenario for r in runs.gpu_bug} & {r.scenario for r in runs.cpu_bug}):
        g = sorted({r.signature.value for r in runs.gpu_bug if r.scenario == scenario})
        c = sorted({r.signature.value for r in runs.cpu_bug if r.scenario == scenario})
        same = "same signature" if set(g) & set(c) else "different signatures, both IllegalWork"
        scenario_lines.append(
            Evidence(
                f"{scenario}: GPU {', '.join(g)} / CPU {', '.join(c)}: {same}",
                tuple(r.ident for r in runs.bug if r.scenario == scenario),
            )
        )
    return CauseAnswer(
        CauseVerdict.MICS_LOGIC,
        "MiCS/DeepSpeed+torch logic: the same failure appears on CPU/gloo and on "
        + " and ".join(b.label for b in per_backend)
        + ", so it does not depend on ROCm or the backend",
        tuple(scenario_lines + backend_lines + evidence),
        tuple(missing),
    )


def _on_gpu_only(
    runs: _StockRuns, per_backend: list[Backend], evidence: list[Evidence], missing: tuple[Missing, ...]
) -> CauseAnswer:
    """Fails on a GPU backend but not on CPU/gloo: ROCm, the GPU backend, or logic on both vendors."""
    backend_lines = _backend_lines(runs.gpu_bug, per_backend)
    gpu_ok = [r for r in runs.gpu_runs if r.outcome is Outcome.CLEAN]
    rocm_only = per_backend == [Backend.ROCM_RCCL]
    cuda_clean = [r for r in gpu_ok if r.backend is Backend.CUDA_NCCL]
    cpu_clean = [r for r in runs.cpu_runs if r.outcome is Outcome.CLEAN]
    clean_lines = [Evidence(describe(r), (r.ident,)) for r in cuda_clean + cpu_clean]
    if rocm_only and cuda_clean:
        return CauseAnswer(
            CauseVerdict.ROCM_ENVIRONMENT,
            "the ROCm environment: only ROCm runs fail; the same scenarios run clean on CUDA"
            + (" and CPU/gloo" if cpu_clean else ""),
            tuple(backend_lines + clean_lines + evidence),
            tuple(missing),
        )
    if cpu_clean:
        return CauseAnswer(
            CauseVerdict.GPU_BACKEND,
            "the GPU backend: GPU runs fail while CPU/gloo runs of MiCS are clean",
            tuple(backend_lines + clean_lines + evidence),
            tuple(missing),
        )
    if len(per_backend) > 1:
        return CauseAnswer(
            CauseVerdict.MICS_LOGIC,
            "MiCS/DeepSpeed+torch logic: it fails on both ROCm and CUDA",
            tuple(backend_lines + evidence),
            tuple(missing),
        )
    lacking = Missing(
        "no CPU/gloo or other-vendor MiCS run to tell logic from environment",
        "run `make repro ENV=cpu` and merge",
    )
    return CauseAnswer(
        CauseVerdict.INCONCLUSIVE,
        f"reproduced on {per_backend[0].label} only; nothing to compare it with",
        tuple(backend_lines + evidence),
        (*missing, lacking),
    )


def _on_cpu_not_gpu(runs: _StockRuns, evidence: list[Evidence], missing: tuple[Missing, ...]) -> CauseAnswer:
    """Fails on CPU/gloo while the GPU runs here do not: inconclusive."""
    gpu_lines = [Evidence(describe(r), (r.ident,)) for r in runs.gpu_runs]
    return CauseAnswer(
        CauseVerdict.INCONCLUSIVE,
        "reproduced on CPU/gloo but not on the GPU runs in these results",
        tuple(evidence + [Evidence(describe(r), (r.ident,)) for r in runs.cpu_bug] + gpu_lines),
        tuple(missing),
    )
