"""End to end on a CPU-only host: a GPU env whose torch sees no GPU is never reported as evidence.

The real orchestrator plans `make repro ENV=rocm56` (and ENV=cuda), the real venv engine runs the
real suite, and the real summary and check-fix read the records. Only the env's build is replaced:
it runs in the CPU env's cached venv (torch 2.1.0 from PyPI, a CUDA build), so for rocm56 torch is
the wrong kind of build and for cuda it sees no GPU: every run must end env-error, nothing may be
launched, and no "REPRODUCED" line may appear.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.envpython import env_python

pytestmark = pytest.mark.integration


def _repro(env_id: str, tmp_path: Path) -> tuple[list[dict], str, Path]:
    from repro.core.results import InvocationDir
    from repro.engines.base import EngineKind, Prepared
    from repro.engines.venv.engine import VenvEngine
    from repro.matrix.model import Env
    from repro.matrix.schema import load_matrix
    from repro.run.orchestrate import Request, execute, plan
    from repro.run.summary import render

    cpu_venv = Path(env_python("cpu")).parent.parent

    class CpuVenvForAnyEnv(VenvEngine):
        """The real venv engine, minus building: every env runs in the CPU env's venv."""

        def preflight(self, env: Env) -> None:  # the devices are absent here on purpose
            pass

        def prepare(self, env: Env) -> Prepared:
            return Prepared(EngineKind.VENV, env.id, str(cpu_venv), f"venv {cpu_venv.name}", True)

    steps = plan(load_matrix(), Request(env_ids=(env_id,), steps=2))
    folder = tmp_path / "results"
    folder.mkdir()
    runs = execute(steps, CpuVenvForAnyEnv(), InvocationDir(folder, {}), say=print)
    return [dict(r) for r in runs], render(runs, str(folder)), folder


@pytest.mark.parametrize(
    "env_id, platform, cause",
    [
        ("rocm56", "rocm", "torch.version.hip is None"),  # the wrong kind of torch build
        ("cuda", "cuda", "sees no GPU"),  # the right kind, but no GPU on this host
    ],
)
def test_gpu_env_without_its_gpu_is_an_env_error_not_evidence(
    tmp_path: Path, env_id: str, platform: str, cause: str
) -> None:
    from repro.core.verdict import check_fix

    runs, summary, folder = _repro(env_id, tmp_path)
    assert runs, summary
    assert {r["outcome"] for r in runs} == {"env-error"}, summary
    for r in runs:
        assert cause in r["reason"] and r["ran_on"]["env_platform"] == platform
        assert r["ran_on"]["ran"] is False and r["backend"] == "nccl" and r["transport"] == "native"
        assert r["dtype"] == "fp16"  # the reporter's precision, the default on GPU envs
    assert not list((folder / env_id / "runs").glob("*/rank*.json")), "a run was launched"
    assert "REPRODUCED" not in summary and "fix resolves it" not in summary
    assert not check_fix(runs).ok
