"""Half-built venvs never pile up in the cache: an interrupted build removes its own, and one a
killed build left behind is removed at the next start unless a live build holds its lock.

Real processes: a builder killed with SIGKILL (no clean-up of its own can run), a builder that is
still alive, and a venv build stopped by SIGTERM through the host's signal handlers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from repro.engines.venv import engine as venv_engine
from repro.engines.venv.engine import remove_stale_temps
from tests.fixtures.processes import running

# Does what a build does before its long pip steps: takes the venv's lock and makes its temp dir.
BUILDER = r"""
import fcntl, os, sys, tempfile
root, name = sys.argv[1], sys.argv[2]
lock = open(os.path.join(root, f".{name}.lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX)
tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=root)
open(os.path.join(tmp, "torch.whl-contents"), "w").write("gigabytes")
print(tmp, flush=True)
sys.stdin.read()  # until the test closes stdin or kills us
"""


def _builder(root: Path, name: str) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(root), name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_killed_build_leaves_a_temp_venv_that_the_next_start_removes(
    tmp_path: Path, real_subprocess: None
) -> None:
    root = tmp_path / "venvs"
    root.mkdir()
    finished = root / "cpu-1234abcd"  # a finished venv and its lock are never touched
    (finished / "bin").mkdir(parents=True)
    killed, left = _builder(root, "cpu-1234abcd")
    alive, busy = _builder(root, "cpu-latest-99ff")
    try:
        killed.kill()  # SIGKILL: no finally, no handler; only the kernel releases the lock
        killed.wait()
        assert left.is_dir()  # what a killed build leaves today

        removed = remove_stale_temps(root)

        assert removed == [left] and not left.exists()
        assert busy.is_dir(), "a build in progress (its lock is held) lost its temp venv"
        assert finished.is_dir() and (root / ".cpu-1234abcd.lock").is_file()
    finally:
        assert alive.stdin is not None
        alive.stdin.close()
        alive.wait()
    assert remove_stale_temps(root) == [busy]  # its builder is gone now


def test_swap_leftover_and_foreign_entries(tmp_path: Path) -> None:
    root = tmp_path / "venvs"
    (root / ".cpu-1234abcd.stale" / "bin").mkdir(parents=True)  # killed between the two renames
    (root / ".hidden-file").write_text("not a dir")
    (root / "notes.txt").write_text("")
    assert remove_stale_temps(root) == [root / ".cpu-1234abcd.stale"]
    assert (root / ".hidden-file").exists() and (root / "notes.txt").exists()
    assert remove_stale_temps(tmp_path / "absent") == []


def test_prepare_cleans_up_before_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Path] = []

    def stop_here(root: Path) -> list[Path]:
        seen.append(root)
        raise RuntimeError("stop after the clean-up")

    monkeypatch.setattr(venv_engine, "remove_stale_temps", stop_here)
    engine = venv_engine.VenvEngine(root=tmp_path / "venvs", python=sys.executable)
    interp = venv_engine.Interpreter(sys.executable, "3.11.7")
    monkeypatch.setattr(engine, "interpreter", lambda env: interp)
    monkeypatch.setattr(venv_engine.preflight, "check_python", lambda *a: None)
    env = SimpleNamespace(id="cpu", pins=lambda: {"torch": "2.1.0"}, pins_key=lambda: "k")
    # The engine first takes the env's pins for its interpreter (Env.for_python): the same env here.
    env.python_choice = SimpleNamespace(describe=lambda: "the stand-in interpreter")
    env.for_python = lambda minor, why: env
    with pytest.raises(RuntimeError, match="stop after the clean-up"):
        engine.prepare(env)  # type: ignore[arg-type]
    assert seen == [tmp_path / "venvs"]


# A host process building a venv whose pip step never ends (a real `python -m venv`, then a
# stand-in for pip started through the one subprocess door).
HOST_BUILD = r"""
import sys
from pathlib import Path
from types import SimpleNamespace
from repro.core import cmd, signals
from repro.engines.venv import engine as ve

root, pid_file = Path(sys.argv[1]), sys.argv[2]
signals.install_stop_handlers()
step = SimpleNamespace(name="torch", specs=("torch==2.1.0",), environment=(), check=False,
                       pip_install_args=lambda index: ["install", "torch==2.1.0"])
env = SimpleNamespace(id="cpu", install_steps=lambda: [step], host_torch=False)
engine = ve.VenvEngine(root=root, wheelhouse=SimpleNamespace(path=root / "wheels", offline=True))

def pip(argv, environment, tmp, env, what):
    cmd.run(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 600"])

engine._pip = pip
root.mkdir(parents=True, exist_ok=True)
try:
    engine._build(env, ve.Interpreter(sys.executable, "3"), None, root / "cpu-k", wheelhouse_only=True)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_sigterm_during_a_venv_build_leaves_no_temp_venv_and_no_process(
    tmp_path: Path, real_subprocess: None
) -> None:
    root, pid_file = tmp_path / "venvs", tmp_path / "pip.pid"
    env: dict[str, Any] = {**os.environ, "PYTHONPATH": str(venv_engine.REPO_ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOST_BUILD, str(root), str(pid_file)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120  # only against a broken machine; the state is what is asserted
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        temps = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(".cpu-k.")]
        assert len(temps) == 1  # the build is in its temp venv
        proc.send_signal(signal.SIGTERM)  # SIGHUP takes the same handler (test_stop_signals.py)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, output.decode(errors="replace")
    assert [p.name for p in root.iterdir() if p.is_dir()] == []  # no temp venv, no half venv
    pip_pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while running(pip_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(pip_pid), "the pip step outlived the build"
