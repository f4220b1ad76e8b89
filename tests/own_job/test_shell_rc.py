"""`make shell` (repro/cli/job_commands.py, repro/run/shellrc.py): the env's venv is first on PATH
after the user's rc files ran, though their conda/pyenv block puts another Python first. With a
real env's venv (integration tier): tests/own_job/test_shell_rc_integration.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from repro.engines.base import EngineKind, Prepared
from repro.run.shellrc import launch
from tests.fixtures.shell_home import (
    fake_python,
    home,  # noqa: F401 - a fixture
)
from tests.fixtures.stand_in_engine import StandInEngine


def _started_shell(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, shell: str) -> dict[str, Any]:
    from repro.cli import job_commands
    from repro.cli.main import main

    venv = tmp_path / "venvs" / "cpu-abc"
    fake_python(venv / "bin", "env-python")

    class Engine(StandInEngine):
        def prepare(self, env: Any) -> Prepared:
            return Prepared(EngineKind.VENV, env.id, str(venv), "cpu venv", True, {"platform": "cpu"})

    seen: dict[str, Any] = {}
    monkeypatch.setattr(job_commands, "_engine", lambda choice, shell=False: Engine())
    monkeypatch.setattr(job_commands, "_install_hook_pth", lambda bin_dir: None)
    monkeypatch.setattr(job_commands.os, "execvpe", lambda path, argv, env: seen.update(argv=argv, env=env))
    monkeypatch.setenv("SHELL", shell)
    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))
    assert main(["shell", "--env", "cpu"]) == 0
    return seen


@pytest.mark.parametrize("name", ["bash", "zsh"])
def test_the_envs_python_wins_over_the_users_rc_files(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    home: Path,  # noqa: F811
    real_subprocess: None,
    name: str,
) -> None:
    shell = shutil.which(name)
    if shell is None:
        pytest.skip(f"no {name} on this host")
    seen = _started_shell(monkeypatch, tmp_path, shell)
    env = dict(seen["env"], HOME=str(home))
    # The interactive shell reads its commands from stdin here, as from a terminal.
    done = subprocess.run(seen["argv"], env=env, input="python\nexit\n", capture_output=True, text=True)
    assert done.stdout.split() == ["env-python"], (done.stdout, done.stderr[-2000:])
    # Before: the shell ran the user's rc file last, and their Python won.
    plain = subprocess.run(
        [shell, "-i"],
        env=dict(env, ZDOTDIR=str(home)),
        input="python\nexit\n",
        capture_output=True,
        text=True,
    )
    assert plain.stdout.split() == ["conda-python"]


def test_another_shell_gets_bash_and_says_so(tmp_path: Path) -> None:
    started = launch("/usr/bin/tcsh", "/v/bin", "/v", "(cpu stock) ", tmp_path, {"HOME": "/home/u"})
    assert "make shell supports bash, zsh, fish" in started.note and started.argv[1] == "--rcfile"
    rc = Path(started.argv[2]).read_text()
    assert rc.index(".bashrc") < rc.index("export PATH=/v/bin:")
    fish = launch("/usr/bin/fish", "/v/bin", "/v", "(cpu stock) ", tmp_path, {})
    assert fish.argv[:3] == ["/usr/bin/fish", "-i", "-C"] and "set -gx PATH /v/bin $PATH" in fish.argv[3]
