"""The reproduce line of a custom job (repro/run/job.py `reproduce_line`) is complete: pasted into a
shell it reaches the tool as the same job (env, engine, WORKDIR, REQUIREMENTS/PACKAGES, the user's
environment before `make`, PATCH, CMD), so it prints the same line again. make and bash are real; the
tool is a recorder (PYTHON=), as in tests/project/test_makefile_injection.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repro.cli.job_commands import job_request
from repro.cli.main import build_parser
from repro.engines import jobdeps
from repro.run.job import JobRequest, inherited_environment, reproduce_line
from tests.fixtures.wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")

RECORDER = """#!{python}
import json, os, sys
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "env": {{k: os.environ.get(k) for k in {names!r}}}}}) + "\\n")
"""


def test_the_printed_line_pasted_into_a_shell_is_the_same_job(tmp_path: Path, real_subprocess: None) -> None:
    work = tmp_path / "my project"
    work.mkdir()
    wheel = build_wheel(tmp_path / "wheels", "their_pkg", "0.3", "X = 1\n")
    req = work / "requirements.txt"
    req.write_text("transformers==4.36.2\n")
    environ = {"PYTHONPATH": str(tmp_path / "deps"), "CUDA_VISIBLE_DEVICES": "2,3", "NCCL_DEBUG": "INFO"}
    request = JobRequest(
        env_id="cuda",
        command="""HF_HOME=$PWD/hf torchrun --nproc_per_node 2 train.py --name "it's" """,
        patches=("stock",),
        workdir=work,
        stall_s=900.0,
        deps=jobdeps.parse(str(req), f"accelerate==0.25.0 {wheel}"),
        engine="docker",
        network=True,
        inherited=inherited_environment(environ, "cuda"),
        deepspeed_src=tmp_path / "Deep Speed",
    )
    line = reproduce_line(request)
    assert line.startswith("CUDA_VISIBLE_DEVICES=2,3 NCCL_DEBUG=INFO PYTHONPATH=")
    for part in (
        "ENV=cuda",
        "ENGINE=docker",
        "REQUIREMENTS=",
        "PACKAGES=",
        "PATCH=stock",
        "NETWORK=1",
        "DEEPSPEED_SRC=",
    ):
        assert part in line

    log = tmp_path / "argv.jsonl"
    recorder = tmp_path / "recorder"
    recorder.write_text(
        RECORDER.format(python=sys.executable, log=str(log), names=[k for k, _ in environ.items()])
    )
    recorder.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if k not in environ and k != "ENGINE"}
    done = subprocess.run(
        ["bash", "-c", f"{line} PYTHON={recorder}"], cwd=REPO, env=clean, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(log.read_text().splitlines()[-1])
    argv = seen["argv"]
    assert argv[:2] == ["-m", "repro"]
    args = build_parser().parse_args(argv[2:])
    again = job_request(args, "cuda", "cuda", {k: v for k, v in seen["env"].items() if v is not None})
    assert again == request
    assert reproduce_line(again) == line


def test_without_extras_the_line_stays_short(tmp_path: Path) -> None:
    line = reproduce_line(JobRequest(env_id="cpu", command="python train.py", workdir=tmp_path))
    assert line == f"make run ENV=cpu WORKDIR={tmp_path.resolve()} CMD='python train.py'"


def test_a_deepspeed_src_that_is_no_checkout_is_refused_before_any_results_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make run DEEPSPEED_SRC=` builds the checkout into a layer (SourceOverlay): a folder without
    setup.py is bad input (exit 2), said before the env is prepared or a results folder opened."""
    from repro.cli.main import main
    from tests.fixtures.stand_in_engine import RefusedEngine, use_engine

    class NeverReached(RefusedEngine):
        def failure(self) -> Exception:
            return AssertionError("the engine was reached")

    engine = use_engine(monkeypatch, NeverReached(), "job_commands")
    (tmp_path / "not-deepspeed").mkdir()
    argv = ["run", "--env", "cpu", "--engine", "venv", "--cmd", "python -c pass", "--workdir", str(tmp_path)]
    argv += ["--deepspeed-src", str(tmp_path / "not-deepspeed"), "--results-root", str(tmp_path / "results")]
    assert main(argv) == 2
    assert "is not a Python project checkout" in capsys.readouterr().err
    assert engine.calls == [] and not (tmp_path / "results").exists()
