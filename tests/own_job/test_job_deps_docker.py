"""`make run ENGINE=docker REQUIREMENTS=...`: the job's package (a wheel built here) in an image FROM
the CPU twin's image, with the env's packages as constraints; stock reproduces, fixed is clean, and
nothing of the env moved. Needs a Docker daemon and the local base image (.ci/run provides both).

On the newest stack (`cpu-latest`: torch 2.13's CPU build, a 1.2 GB image) rather than the
reporter's (5.2 GB, PyPI's CUDA build of torch 2.1): what is checked here does not depend on the
stack, and the bundle below flattens and saves the whole job image. The reporter's image makes its
own bundle round trip in test_bundle_docker.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.classifier_job import project_with_package
from tests.fixtures.own_job import docker_job

pytestmark = [pytest.mark.docker, pytest.mark.integration]
ENV = "cpu-latest"
LIST = (
    "import importlib.metadata as m, json\n"
    "print(json.dumps({d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()}))"
)


def _packages(image: str) -> dict[str, str]:
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "python", "-c", LIST],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def job_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("docker-job")
    work, _ = project_with_package(root)
    out = root / "results" / "run"
    done = docker_job(
        work,
        out,
        "torchrun --nproc_per_node 2 train_classifier.py",
        "--requirements",
        str(work / "requirements.txt"),
        # strict: a missing wait reads poisoned buffers every time. On the async transport this
        # job's stock run is a real race (its losses part from the fixed run's at step 0 in one run
        # and stay within 2% in the next: illegal-work-divergence vs -warnings), and the bundle test
        # below needs the same outcome twice.
        "--transport",
        "strict",
        env=ENV,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # The job image is kept: its tag holds the digest of the (deterministic) wheel and the lines,
    # so the next test run reuses it instead of building it again.
    yield out


def test_the_jobs_package_in_an_image_over_the_envs(job_run: Path) -> None:
    runs = {r["patch"]: r for r in json.loads((job_run / "results.json").read_text())["runs"]}
    assert (runs["stock"]["outcome"], runs["fixed"]["outcome"]) == ("reproduced", "clean")
    # On strict the stock job reads the unfilled buffers every time: its losses always part.
    assert runs["stock"]["signature"] == "illegal-work-divergence"
    assert runs["stock"]["first_divergent_step"] is not None
    layer = runs["fixed"]["job"]["requirements"]
    assert layer["added"] == {"mics-repro-testdep": "1.0"}
    env_packages, job_packages = _packages(layer["base"]), _packages(layer["image_id"])
    assert {k: job_packages[k] for k in env_packages} == env_packages
    assert set(job_packages) - set(env_packages) == {"mics-repro-testdep"}


def test_a_bundle_of_the_job_verifies_offline_in_its_image(job_run: Path, tmp_path: Path) -> None:
    """The bundle packs the job's image (its packages installed): verify-bundle reruns the job with
    no network and no package index, and gets the same outcomes.

    Loading the tarball into a Docker that lacks the image is test_bundle_docker.py's round trip (the
    same flatten, save and load, of the env's image); here the flattened job image is kept and
    verify reuses it by id (REUSE_IMAGE=1), which saves loading 5 GB a second time per test run.
    """
    import docker

    from repro.cli.main import main
    from repro.upstream.bundle.manifest import Manifest

    results = job_run.parent
    out = tmp_path / "bundles" / ENV
    argv = ["bundle", "--env", ENV, "--results", str(job_run), "--out", str(out)]
    assert main([*argv, "--results-root", str(results), "--keep-image", "--no-archive"]) == 0
    manifest = Manifest.read(out)
    job_image = json.loads((job_run / "results.json").read_text())["runs"][0]["job"]["requirements"][
        "image_id"
    ]
    assert manifest.image["source_id"] == job_image  # the job's image, not the env's
    client = docker.from_env(timeout=600)
    try:
        verify = ["verify-bundle", "--bundle", str(out), "--results-root", str(results), "--reuse-image"]
        assert main(verify) == 0
    finally:
        try:
            client.images.remove(manifest.image["id"], force=True)
        except docker.errors.ImageNotFound:
            pass
