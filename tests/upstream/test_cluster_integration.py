"""The CPU twin through the cluster launcher for real (integration tier): launch-node.sh runs
both hierarchical runs with the dev venv's torch 2.1 + DeepSpeed 0.13.1 (MICS_TEST_PYTHON_T21),
torchrun and a c10d rendezvous on this host; stock hits IllegalWork, fixed completes. The
launchers' contents and logic with stand-ins are tests/upstream/test_cluster.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.upstream.cluster import scripts as cluster
from tests.fixtures.cluster_twin import hier_stock_and_fixed, twin_env, venv_python, written


@pytest.mark.integration
def test_cpu_twin_runs_through_launch_node_with_c10d_rendezvous(tmp_path: Path) -> None:
    python = venv_python()
    out = written(tmp_path, cluster.CPU_TWIN, "cpu")
    stock, fixed = hier_stock_and_fixed(out, tmp_path / "results", twin_env(python, out))
    assert stock["exit_code"] != "0" and any("IllegalWork" in e for e in stock["errors"]), stock
    assert fixed["exit_code"] == "0" and fixed["errors"] == [] and fixed["steps_completed"] == 3, fixed
    assert fixed["non_finite_losses"] == 0 and fixed["ranks_reported"] == 4
