"""`make run` with a job that needs more than the env has, on the CPU twin (venv engine, torch 2.1.0 +
DeepSpeed 0.13.1): its package comes through REQUIREMENTS= from a wheel built here; the job sets its
own PYTHONPATH; another process holds torchrun's default port; the printed reproduce line, pasted
into a shell, gives the same outcome."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repro.engines.venv.joblayer import layer_freeze
from repro.workload.fix import FIX_ID
from tests.envpython import env_python
from tests.fixtures.classifier_job import make, project_with_package
from tests.fixtures.own_job import repro_run

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration
COMMAND = "torchrun --nproc_per_node 2 train_classifier.py"


def _runs(out: Path) -> dict[str, dict[str, Any]]:
    return {r["patch"]: r for r in json.loads((out / "results.json").read_text())["runs"]}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_python("cpu")
    root = tmp_path_factory.mktemp("job-with-deps")
    work, wheel = project_with_package(root)
    deps = root / "deps"  # the same package, for a job that brings it on its own PYTHONPATH
    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(wheel), str(deps)], check=True)
    return work


@pytest.fixture(scope="module")
def with_requirements(project: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("req") / "results"
    done = make(
        "run",
        "ENV=cpu",
        f"WORKDIR={project}",
        f"REQUIREMENTS={project / 'requirements.txt'}",
        f"OUT={out}",
        "STALL_TIMEOUT=240",
        f"CMD={COMMAND}",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    return out, done.stdout


def test_a_package_the_env_lacks_comes_from_requirements(
    with_requirements: tuple[Path, str], project: Path
) -> None:
    out, _ = with_requirements
    runs = _runs(out)
    assert (runs["stock"]["outcome"], runs["fixed"]["outcome"]) == ("reproduced", "clean")
    assert runs["fixed"]["fix"]["fix_id"] == FIX_ID and runs["stock"]["illegal_work_messages"] > 0
    layer = runs["fixed"]["job"]["requirements"]
    assert layer["added"] == {"mics-repro-testdep": "1.0"}
    assert layer["requirements_file"] == str(project / "requirements.txt")
    # The env's packages, torch and DeepSpeed among them, are exactly as pinned in the layer.
    base, seen = Path(layer["base"]), layer_freeze(Path(layer["layer"]))
    env_pins = layer_freeze(base)
    assert {k: seen[k] for k in env_pins} == env_pins and set(seen) - set(env_pins) == {"mics-repro-testdep"}
    assert seen["torch"].startswith("2.1.0") and seen["deepspeed"] == "0.13.1"
    # ... and so says the layer's own pip freeze.
    freeze = subprocess.run(
        [str(Path(layer["layer"]) / "bin" / "python"), "-m", "pip", "freeze", "--all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert "deepspeed==0.13.1" in freeze and any(re.match(r"torch==2\.1\.0(\+\w+)?$", x) for x in freeze)


def test_make_issue_on_the_run_names_the_job_and_its_package_and_no_host_path(
    with_requirements: tuple[Path, str], project: Path
) -> None:
    out, _ = with_requirements
    done = make("issue", f"RESULTS={out}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    text = (out / "ISSUE.md").read_text()
    assert COMMAND in text and "mics-repro-testdep" in text.replace("_", "-")
    assert str(project.parent) not in text and "WORKDIR=<your job folder>" in text


def test_the_printed_reproduce_line_gives_the_same_outcome(
    with_requirements: tuple[Path, str], tmp_path: Path
) -> None:
    _, stdout = with_requirements
    [line] = [x.removeprefix("reproduce: ") for x in stdout.splitlines() if x.startswith("reproduce: ")]
    assert "REQUIREMENTS=" in line and "ENGINE=venv" in line and "WORKDIR=" in line
    out = tmp_path / "again"
    done = subprocess.run(
        ["bash", "-c", f"{line} OUT={shlex.quote(str(out))} PYTHON={shlex.quote(sys.executable)}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=os.environ | {"ENGINE": ""},  # only what the line says
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    runs = _runs(out)
    assert (runs["stock"]["outcome"], runs["fixed"]["outcome"]) == ("reproduced", "clean")
    assert runs["fixed"]["job"]["requirements"]["added"] == {"mics-repro-testdep": "1.0"}


def test_a_requirement_moving_torch_is_refused_before_any_install(project: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = repro_run(project, out, COMMAND, "--packages", "mics-repro-other==1.0 torch==2.2.0")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "torch==2.2.0" in done.stderr and "torch==2.1.0" in done.stderr
    assert "pip install" not in done.stdout + done.stderr  # nothing was installed


@pytest.fixture
def port_29500_taken() -> Iterator[None]:
    holder = socket.socket()
    try:  # another torchrun on this host (if something already holds the port, that is the case too)
        holder.bind(("0.0.0.0", 29500))
        holder.listen()
    except OSError:
        pass
    try:
        yield
    finally:
        holder.close()


def test_a_job_with_its_own_pythonpath_next_to_another_torchrun_still_gets_the_fix(
    project: Path, tmp_path: Path, port_29500_taken: None
) -> None:
    out = tmp_path / "out"
    deps = project.parent / "deps"
    done = make(
        "run",
        "ENV=cpu",
        f"WORKDIR={project}",
        f"OUT={out}",
        "STALL_TIMEOUT=240",
        f"CMD=env PYTHONPATH={deps} {COMMAND}",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    runs = _runs(out)
    assert (runs["stock"]["outcome"], runs["fixed"]["outcome"]) == ("reproduced", "clean")
    assert runs["fixed"]["fix"]["fix_id"] == FIX_ID
    assert runs["fixed"]["job"]["deepspeed_imported"] is True
    for run in runs.values():  # a free port of its own, not torchrun's default the other holds
        assert run["job"]["rendezvous"]["set_by"] == "repro" and run["job"]["rendezvous"]["port"] != 29500
