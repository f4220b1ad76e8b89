"""`make shell` for real (integration tier): in the cpu env's own venv, with the user's rc files
putting another Python first, `python` is the env's and imports its DeepSpeed. The launcher with
fake Pythons is tests/own_job/test_shell_rc.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.shell_home import home  # noqa: F401 - a fixture


@pytest.mark.integration
def test_in_make_shell_python_is_the_envs_and_imports_its_deepspeed(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    home: Path,  # noqa: F811
) -> None:
    from envpython import env_python

    from repro.cli import job_commands
    from repro.cli.main import main

    venv = Path(env_python("cpu")).parent.parent
    seen: dict[str, Any] = {}
    monkeypatch.setattr(job_commands.os, "execvpe", lambda path, argv, env: seen.update(argv=argv, env=env))
    monkeypatch.setenv("SHELL", shutil.which("bash") or "/bin/bash")
    assert main(["shell", "--env", "cpu", "--engine", "venv", "--patch", "fixed"]) == 0
    probe = "python -c 'import sys, deepspeed; print(sys.prefix, deepspeed.__version__)'\nexit\n"
    done = subprocess.run(
        seen["argv"], env=dict(seen["env"], HOME=str(home)), input=probe, capture_output=True, text=True
    )
    assert done.stdout.split()[-2:] == [str(venv), "0.13.1"], (done.stdout, done.stderr[-3000:])
