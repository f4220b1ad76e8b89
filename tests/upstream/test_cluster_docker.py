"""The CPU twin through the cluster launcher in the env's image (Docker tier): RUNTIME=docker,
host networking, the same rendezvous as on a cluster; stock hits IllegalWork, fixed completes.
The launchers' contents and logic with stand-ins are tests/upstream/test_cluster.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from repro.upstream.cluster import scripts as cluster
from tests.fixtures.cluster_twin import hier_stock_and_fixed, rendezvous_port, written


@pytest.mark.docker
def test_cpu_twin_runs_in_the_image_through_launch_node(tmp_path: Path) -> None:
    """RUNTIME=docker: the env's image, host networking, the same rendezvous as on a cluster."""
    docker = pytest.importorskip("docker")
    from repro.matrix.schema import load_matrix

    tag = load_matrix().get("cpu").image_tag()
    try:
        docker.from_env().images.get(tag)
    except Exception as exc:  # no daemon, or the image is not built
        pytest.skip(f"{tag} is not available ({type(exc).__name__}); make build ENV=cpu ENGINE=docker")
    out = written(tmp_path, cluster.CPU_TWIN, "cpu")
    env = dict(os.environ, RUNTIME="docker", IMAGE_REF=tag, STEPS="3", PORT=rendezvous_port())
    stock, fixed = hier_stock_and_fixed(out, tmp_path / "results", env)
    assert stock["exit_code"] != "0" and any("IllegalWork" in e for e in stock["errors"]), stock
    assert fixed["exit_code"] == "0" and fixed["errors"] == [] and fixed["non_finite_losses"] == 0, fixed
