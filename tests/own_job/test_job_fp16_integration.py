"""A user's own fp16 job on the CPU twin with torch 2.1 (issue #43): the reporter's DeepSpeed config
(fp16, ZeRO-3 + MiCS, adapted to 2 ranks) and a small fp16 model of the job's own, through
`make run ENV=cpu` (venv engine). torch 2.1 has no Half kernels on CPU and DeepSpeed's CPU
accelerator calls fp16 unsupported; with the CPU twin's Half kernels adapter the job trains in
fp16, stock reproduces the bug and the fix makes it clean.
"""

from __future__ import annotations

from typing import Any

import pytest

from repro.workload.fix import FIX_ID
from tests.envpython import env_python
from tests.fixtures.classifier_job import run_job
from tests.fixtures.fp16_job import COMMAND, STEPS, write_fp16_project

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fp16_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    env_python("cpu")  # skips (or fails in CI) when the env's venv is not built
    project = write_fp16_project(tmp_path_factory.mktemp("fp16-project"))
    out = tmp_path_factory.mktemp("fp16-job") / "results"
    _stdout, results = run_job(project, out, COMMAND)
    return {r["patch"]: r for r in results["runs"]}


def test_the_fp16_job_trains_in_fp16_on_torch_2_1(fp16_runs: dict[str, dict[str, Any]]) -> None:
    assert set(fp16_runs) == {"stock", "fixed"}
    for record in fp16_runs.values():
        assert record["versions"]["torch"].startswith("2.1.")
        assert record["exception"] is None, record["exception"]
        assert record["dtype"] == "fp16" and record["world_size"] == 2
        info = record["transport_info"]
        assert info["cpu_shims"]["fp16_claimed"] is True  # the accelerator says fp16 is supported
        half = info["half_kernels"]
        assert "not implemented for 'Half'" in half["reason"]
        # the job's own matmul and layer norm, forward and backward, went through the adapter
        forward_backward = ("native_layer_norm", "native_layer_norm_backward")
        for op in ("aten.addmm.default", *(f"aten.{name}.default" for name in forward_backward)):
            assert op in half["upcast_ops"]


def test_stock_reproduces_and_fixed_is_clean(fp16_runs: dict[str, dict[str, Any]]) -> None:
    stock, fixed = fp16_runs["stock"], fp16_runs["fixed"]
    assert stock["outcome"] == "reproduced" and stock["illegal_work_messages"] > 0
    assert fixed["outcome"] == "clean" and fixed["illegal_work_messages"] == 0
    assert fixed["fix"]["fix_id"] == FIX_ID and stock["fix"] is None
    assert len(fixed["losses"]) == STEPS and all(v is not None for v in fixed["losses"])
    assert fixed["skipped_steps"] == 0
