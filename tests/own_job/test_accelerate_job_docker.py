"""The accelerate custom loop (tests/fixtures/accelerate_job.py) under `make run ENGINE=docker`
(issue #44 items 1 and 7): accelerate's launcher checks its port with `localhost`, which an empty
/etc/hosts could not resolve when the container ran with the network disabled; with the network
off and a loopback kept, stock reproduces on the bug's path and fixed is clean. Its bundle and
verify-bundle (a 3 GB image round trip) are the closing note's, measured by hand; the same bundle
path of a job with its own packages is tests/own_job/test_job_deps_docker.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.accelerate_job import command, write_accelerate_project
from tests.fixtures.own_job import docker_job

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def test_the_custom_loop_in_the_image_without_a_network(tmp_path: Path) -> None:
    work = write_accelerate_project(tmp_path / "proj")
    out = tmp_path / "out"
    done = docker_job(work, out, command("bf16"), "--requirements", str(work / "requirements.txt"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    runs = {r["patch"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    stock, fixed = runs["stock"], runs["fixed"]
    assert stock["outcome"] == "reproduced" and stock["signature"].startswith("illegal-work"), stock["reason"]
    assert fixed["outcome"] == "clean" and fixed["illegal_work_messages"] == 0, fixed["reason"]
    assert (fixed["dtype"], fixed["world_size"]) == ("bf16", 2)
    assert "gaierror" not in (out / stock["logs"]["job"]).read_text()
