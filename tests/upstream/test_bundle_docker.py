"""Bundles for real (Docker tier): the CPU image of the session's short suite, bundled, removed,
loaded back and rerun offline with the same outcomes. The default tier's bundle tests, with a fake
docker-py client, are in tests/upstream/test_bundle.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from repro.upstream.bundle.manifest import Manifest


@pytest.mark.docker
def test_real_bundle_reproduces_after_the_image_is_removed(
    docker_cpu_repro: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """make bundle ENV=cpu, remove the image, make verify-bundle: same outcomes from the loaded image."""
    docker = pytest.importorskip("docker")
    from repro.engines.docker.engine import daemon_status
    from repro.matrix.schema import load_matrix

    up, why = daemon_status()
    if not up:
        pytest.skip(f"no Docker daemon: {why}")
    client = docker.from_env(timeout=600)
    env = load_matrix().get("cpu")  # the env of the shared run
    try:
        client.images.get(env.image_tag())
    except docker.errors.ImageNotFound:
        pytest.skip(f"{env.image_tag()} is not built (make build ENV={env.id} ENGINE=docker)")
    results = tmp_path / "results"
    from repro.cli.main import main

    # The session's short suite in the image (tests/fixtures/docker_repro.py): flat and
    # hierarchical MiCS, stock and fixed, 2 ranks, 4 steps.
    repro_out, _runs = docker_cpu_repro
    out = tmp_path / "bundles" / env.id
    assert (
        main(
            [
                "bundle",
                "--env",
                env.id,
                "--results",
                str(repro_out),
                "--out",
                str(out),
                "--results-root",
                str(results),
            ]
        )
        == 0
    )
    manifest = Manifest.read(out)
    try:  # `bundle` removes its flattened image after saving it; make sure: verify must load it
        client.images.remove(manifest.image["id"], force=True)
    except docker.errors.ImageNotFound:
        pass
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(manifest.image["id"])
    archive = out.with_name(out.name + ".tar")
    shutil.rmtree(out)  # and work from the single archive
    try:
        assert main(["verify-bundle", "--bundle", str(archive), "--results-root", str(results)]) == 0
    finally:
        try:
            client.images.remove(manifest.image["id"], force=True)
        except docker.errors.ImageNotFound:
            pass
