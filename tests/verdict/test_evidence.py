"""A run is evidence only for the platform it ran on (repro/core/evidence.py), and the one env
verdict (summary, check-fix, report, bundle) refuses to count it otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from repro.core import evidence
from tests.fixtures.ran_on import CPU_RAN, CUDA_RAN, ROCM_RAN


def record(env: str, ran_on: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "env": env,
        "scenario": "mics",
        "patch": "stock",
        "dtype": "fp32",
        "world_size": 4,
        "transport": "native",
        "outcome": "reproduced",
        "signature": "illegal-work-divergence",
        "reason": "IllegalWork warnings",
        "ran_on": ran_on,
        "backend": None,
        "versions": {},
    }
    base.update(fields)
    return base


@pytest.mark.parametrize(
    "platform, ran_on, refused",
    [
        ("rocm", CPU_RAN, "ran on CPU"),
        ("rocm", CUDA_RAN, "non-ROCm torch"),
        ("rocm", ROCM_RAN, None),
        ("cuda", ROCM_RAN, "ROCm torch"),
        ("cuda", CUDA_RAN, None),
        ("cuda", CPU_RAN, "ran on CPU"),
        ("cpu", CUDA_RAN, "ran on a GPU"),
        ("cpu", CPU_RAN, None),
    ],
)
def test_platform_mismatch(platform: str, ran_on: dict[str, Any], refused: str | None) -> None:
    why = evidence.platform_mismatch(record("x", ran_on), platform)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why and platform in why


def test_older_records_fall_back_to_backend_and_versions() -> None:
    old_cpu = record("rocm56", None, backend="gloo", versions={"hip": "5.6"})
    assert "ran on CPU" in (evidence.platform_mismatch(old_cpu, "rocm") or "")
    old_gpu = record("rocm56", None, backend="nccl", versions={"hip": "5.6"})
    assert evidence.platform_mismatch(old_gpu, "rocm") is None
    assert "ROCm torch" in (evidence.platform_mismatch(old_gpu, "cuda") or "")


def test_no_claim_without_a_platform_or_a_run() -> None:
    assert evidence.platform_mismatch(record("x", CPU_RAN), None) is None  # platform unknown
    never = {"device": None, "ran": False, "env_platform": "rocm"}
    assert evidence.platform_mismatch(record("x", never, outcome="env-error"), "rocm") is None
    # the record names its env's platform itself (the suite writes it from --device)
    assert evidence.platform_mismatch(record("x", {**CPU_RAN, "env_platform": "rocm"})) is not None


def test_as_evidence_turns_mismatches_into_env_errors() -> None:
    records = [record("rocm56", CPU_RAN), record("rocm56", ROCM_RAN), record("cpu", CPU_RAN)]
    out = evidence.as_evidence(records, {"rocm56": "rocm", "cpu": "cpu"})
    assert [r["outcome"] for r in out] == ["env-error", "reproduced", "reproduced"]
    assert out[0]["reason"].startswith("not evidence: env platform is rocm")
    assert "reproduced" in out[0]["reason"]
    assert records[0]["outcome"] == "reproduced"  # copies: the stored record is untouched
    assert evidence.platforms_of({"rocm56": {"platform": "rocm"}, "odd": {}}) == {"rocm56": "rocm"}


def test_the_bundle_refuses_runs_of_another_platform() -> None:
    from repro.core.errors import BundleError
    from repro.upstream.bundle.make import refuse_other_platform

    refuse_other_platform("rocm56", "rocm", [record("rocm56", ROCM_RAN)])
    with pytest.raises(BundleError, match="did not run on its platform") as caught:
        refuse_other_platform(
            "rocm56",
            "rocm",
            [record("rocm56", ROCM_RAN, run_name="ok"), record("rocm56", CPU_RAN, run_name="mics-stock")],
        )
    assert "mics-stock: env platform is rocm but the run ran on CPU" in str(caught.value.why)
