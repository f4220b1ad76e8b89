"""`make run ENGINE=docker`: the user's command in the CPU twin image, WORKDIR bound read-write at
the same path, no network; the same script as tests/own_job/test_job_integration.py, stock and fixed.
Needs a Docker daemon and the local base image (.ci/run provides both)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.fixtures.classifier_job import TRAIN
from tests.fixtures.own_job import docker_job

pytestmark = [pytest.mark.docker, pytest.mark.integration]

CHECK = textwrap.dedent("""\
    import os, socket
    with open("made_in_container.txt", "w") as fh:
        fh.write(os.getcwd())
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=3)
        print("network: yes")
    except OSError:
        print("network: no")
""")


def test_custom_command_in_the_image(tmp_path: Path) -> None:
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train_classifier.py").write_text(TRAIN)
    (work / "check.py").write_text(CHECK)
    out = tmp_path / "out"
    done = docker_job(work, out, "python check.py && torchrun --nproc_per_node 2 train_classifier.py")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # Written inside the container, at the same path, into the user's folder.
    assert (work / "made_in_container.txt").read_text() == str(work)
    runs = {r["patch"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    for run in runs.values():
        log = (out / run["logs"]["job"]).read_text()
        assert "network: no" in log
        assert run["versions"]["torch"].startswith("2.1.0")
    assert (runs["stock"]["outcome"], runs["fixed"]["outcome"]) == ("reproduced", "clean")
    assert runs["stock"]["illegal_work_messages"] > 0
