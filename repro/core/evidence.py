"""A run is evidence only for the platform it really ran on.

`platform_mismatch(record, env_platform)` says why a record cannot count for its env (a run of a
`rocm` env that fell back to CPU/gloo, a `cpu` env that ran on an NVIDIA GPU with NCCL, a `cuda`
env whose torch is a ROCm build), or None. The summary, `check-fix`, the report and the bundle
all read runs through the one env verdict (repro/core/verdict.py), which applies `as_evidence`
first, so none of them can present such a run as evidence for that env.

What ran comes from the record's `ran_on` (repro/workload/device.py); records from before it
existed fall back to `backend` ("gloo" is CPU, "nccl" a GPU) and `versions` (torch.version.hip /
.cuda). The env's platform comes from the caller (the matrix or results.json's envs), else from
`ran_on["env_platform"]`, which the suite writes from `--device`. Custom jobs (`make run CMD=`)
get their `ran_on` from the interpreter-start hook in every process that joins a process group
(repro/workload/jobhook.py, repro/run/job.py `job_ran_on`) and are checked the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Outcomes that are already no evidence: nothing to refuse.
_NOT_EVIDENCE = ("env-error", "unsupported", "interrupted", "no-evidence")


def _ran_device(record: Mapping[str, Any]) -> str | None:
    ran_on = record.get("ran_on") or {}
    if ran_on:
        # Never launched (device null): nothing ran, so nothing can be mislabelled.
        return ran_on.get("device") if ran_on.get("ran", True) else None
    backend = record.get("backend")
    return {"gloo": "cpu", "nccl": "gpu"}.get(str(backend)) if backend else None


def _build(record: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(hip, cuda) of the torch that ran."""
    ran_on = record.get("ran_on") or {}
    source = ran_on if ("hip" in ran_on or "cuda" in ran_on) else (record.get("versions") or {})
    return source.get("hip"), source.get("cuda")


def env_platform_of(record: Mapping[str, Any]) -> str | None:
    """The platform the suite was told the env has (its `--device`), if it was told."""
    value = (record.get("ran_on") or {}).get("env_platform")
    return str(value) if value else None


def platform_mismatch(record: Mapping[str, Any], env_platform: str | None = None) -> str | None:
    """Why `record` is no evidence for an env of `env_platform` (cpu | rocm | cuda), or None.
    `env_platform` None: the one the record names (ran_on.env_platform); unknown: no claim."""
    platform = env_platform or env_platform_of(record)
    device = _ran_device(record)
    ran_on = record.get("ran_on") or {}
    if platform in ("rocm", "cuda") and ran_on and ran_on.get("ran", True) and device is None:
        # A custom job none of whose processes joined a process group (it crashed first, e.g. for
        # lack of a GPU): nothing shows it used one, so it is no evidence for a GPU env.
        return (
            f"env platform is {platform} but no process of the run reported joining a process group "
            f"on a GPU: no evidence for {platform}"
        )
    if platform not in ("cpu", "rocm", "cuda") or device is None:
        return None
    backend = (record.get("ran_on") or {}).get("backend") or record.get("backend")
    if platform == "cpu":
        if device != "cpu":
            return f"env platform is cpu but the run ran on a GPU ({backend}): not evidence for the CPU twin"
        return None
    if device != "gpu":
        return (
            f"env platform is {platform} but the run ran on CPU ({backend}): torch saw no GPU, so it is "
            f"no evidence for {platform}"
        )
    hip, cuda = _build(record)
    if platform == "rocm" and not hip:
        return f"env platform is rocm but the run used a non-ROCm torch (CUDA {cuda}): not evidence for rocm"
    if platform == "cuda" and hip:
        return f"env platform is cuda but the run used a ROCm torch (HIP {hip}): not evidence for cuda"
    return None


def as_evidence(
    records: Iterable[Mapping[str, Any]], platforms: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The records as evidence: copies, where a run that did not run on its env's platform is an
    `env-error` naming why (signature "none"). `platforms`: env id -> platform, where known.
    Mappings, not RunRecords: older tools' and hand-made records too (repro.core.runs.RunView)."""
    out = []
    for record in records:
        copy = dict(record)
        if copy.get("outcome") not in _NOT_EVIDENCE:
            why = platform_mismatch(copy, (platforms or {}).get(str(copy.get("env"))))
            if why:
                copy.update(
                    outcome="env-error",
                    signature="none",
                    first_divergent_step=None,
                    reason=f"not evidence: {why} (recorded as {copy.get('outcome')}: {copy.get('reason')})",
                )
        out.append(copy)
    return out


def platforms_of(envs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """env id -> platform from results.json's `envs` section."""
    return {env_id: str(info["platform"]) for env_id, info in envs.items() if info.get("platform")}
