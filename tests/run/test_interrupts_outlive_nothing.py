"""Interrupts, round 2 (issue 22, items 6-8): nothing of a run outlives the tool, also after
SIGKILL of the tool; RESUME=1 reruns only what did not finish; a stop during the summary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.processes import stand_in_server
from tests.fixtures.stand_in_engine import PlanEngine, killed_during, use_engine

REPO = Path(__file__).resolve().parents[2]


# ---- item 6: the artifact tasks never outlive an interruption --------------------------------------


class _Handle:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        return None


def test_an_artifact_task_started_while_abandoning_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The race of ArtifactCapture._start and abandon(): the server hands back a task after
    abandon() looked at the tasks it knew; that task must be stopped too."""
    from repro.workload import artifacts

    killed: list[int] = []
    monkeypatch.setattr(artifacts, "_kill", lambda handle: killed.append(handle.pid))
    holder: list[Any] = []
    ready = threading.Event()

    class Server:
        def start_task(self, entry: str, argv: Any, env: Any, stdout: str, stderr: str) -> _Handle:
            ready.wait(30)
            holder[0].abandon()  # Ctrl-C arrives while the server is forking the task
            return _Handle(4242)

    capture = artifacts.ArtifactCapture("/tmp/unused-" + str(os.getpid()), "cpu", Server())  # type: ignore[arg-type]
    holder.append(capture)
    ready.set()
    capture._starter.join(30)
    assert not capture._starter.is_alive()
    assert killed == [4242]


def test_after_an_interruption_no_fresh_interpreter_replaces_the_closed_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from repro.workload import artifacts
    from repro.workload.prefork import PreforkUnavailable

    holder: list[Any] = []
    ready = threading.Event()
    started: list[str] = []
    monkeypatch.setattr(artifacts.subprocess, "Popen", lambda *a, **k: started.append("popen"))

    class Server:
        def start_task(self, *args: Any) -> Any:
            ready.wait(30)
            holder[0].abandon()  # the suite was interrupted and closed the server
            raise PreforkUnavailable("the pre-imported launcher is gone")

    capture = artifacts.ArtifactCapture("/tmp/unused-" + str(os.getpid()), "cpu", Server())  # type: ignore[arg-type]
    holder.append(capture)
    ready.set()
    capture._starter.join(30)
    assert started == []


# ---- item 6: SIGKILL of the tool ------------------------------------------------------------------

# A child that, stopped by SIGTERM, writes the signal's name to the marker file (its argv[1]).
_STOPS_INTO_MARKER = """
import os, signal, sys, time
from repro.workload import parentwatch
marker = sys.argv[1]
def stop(signum, frame):
    open(marker + ".tmp", "w").write(signal.Signals(signum).name)
    os.rename(marker + ".tmp", marker)  # whole, for the test's reader
    os._exit(130)
signal.signal(signal.SIGTERM, stop)
"""
_CHILD = (
    _STOPS_INTO_MARKER
    + """
assert parentwatch.follow_parent()
open(marker + ".ready", "w").write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""
)
_TOOL = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
time.sleep(3600)
"""


def _wait_for(path: Path, bound_s: float = 60) -> bool:
    deadline = time.monotonic() + bound_s  # bounds a failure only
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


def test_a_process_of_the_run_stops_when_the_tool_is_killed(tmp_path: Path, real_subprocess: None) -> None:
    marker = tmp_path / "stopped"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    tool = subprocess.Popen([sys.executable, "-c", _TOOL, _CHILD, str(marker)], env=env)
    try:
        assert _wait_for(Path(str(marker) + ".ready")), "the run's process did not start"
        child = int(Path(str(marker) + ".ready").read_text())
        tool.send_signal(signal.SIGKILL)  # no clean-up of the tool's own runs
        tool.wait()
        stopped = _wait_for(marker)
    finally:
        if tool.poll() is None:
            tool.kill()
            tool.wait()
        if not marker.exists() and Path(str(marker) + ".ready").exists():
            os.kill(int(Path(str(marker) + ".ready").read_text()), signal.SIGKILL)
    assert stopped and marker.read_text() == "SIGTERM"
    assert child > 0


def test_the_prefork_server_stops_its_runs_when_the_suite_is_gone(
    tmp_path: Path, real_subprocess: None
) -> None:
    from repro.workload import runner

    server = stand_in_server(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    try:
        run = server.start(
            ["--run-dir", str(run_dir), "--mode", "hang"], dict(os.environ), 2, str(run_dir / "l.log")
        )
        # Every rank up first, so the check below covers them all (a stop that comes while the
        # leader still forks: tests/run/test_run_lifecycle.py).
        deadline = time.monotonic() + 60
        while len(runner._rank_pids(str(run_dir))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.proc.stdin is not None
        server.proc.stdin.close()  # what a SIGKILLed suite leaves: the end of the server's input
        try:
            code = run.wait(timeout=90)
        except subprocess.TimeoutExpired:
            code = None
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, UnboundLocalError):
            pass
        server.abandon()
    assert code is not None, "the run outlived its suite"
    # The server reports a run's end only once its session is empty (prefork_server._reap).
    assert len(runner._rank_pids(str(run_dir))) == 2
    assert not [p for p in runner._rank_pids(str(run_dir)) if runner.alive(p)]


# ---- items 7 and 8: RESUME=1, and a stop during the summary ----------------------------------------


def _repro(tmp_path: Path, *extra: str) -> int:
    from repro.cli import main as cli

    out = tmp_path / "out"
    return cli.main(["repro", "--env", "cpu,cpu-latest", "--out", str(out), *extra])


def _results(tmp_path: Path) -> dict[str, Any]:
    import json

    data: dict[str, Any] = json.loads((tmp_path / "out" / "results.json").read_text())
    return data


def test_resume_reruns_only_the_env_that_did_not_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_engine(monkeypatch, PlanEngine(stop_at=("cpu-latest",)))
    assert _repro(tmp_path) == 130
    assert "RESUME=1" in capsys.readouterr().err
    cpu_runs = [r["run_name"] for r in _results(tmp_path)["runs"] if r["env"] == "cpu"]
    assert cpu_runs and _results(tmp_path)["invocation"]["interrupted"]

    again = use_engine(monkeypatch, PlanEngine())
    assert _repro(tmp_path) == 2  # without RESUME=1 the folder is never written over
    assert _repro(tmp_path, "--resume") == 0
    assert again.calls == ["cpu-latest"]
    data = _results(tmp_path)
    assert [r["run_name"] for r in data["runs"] if r["env"] == "cpu"] == cpu_runs  # kept, not rerun
    assert {r["env"] for r in data["runs"]} == {"cpu", "cpu-latest"}
    assert not data["invocation"]["interrupted"] and data["invocation"]["finished_at"]
    assert len(data["invocation"]["resumed_at"]) == 1


def test_resume_after_a_sigkill_recognises_the_unfinished_invocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = use_engine(monkeypatch, PlanEngine())
    assert _repro(tmp_path) == 0
    # What a SIGKILL during cpu-latest's suite leaves: cpu recorded, finished_at null.
    killed_during(tmp_path / "out", "cpu-latest")
    engine.calls.clear()
    monkeypatch.setenv("RESUME", "1")  # `make repro RESUME=1`
    assert _repro(tmp_path) == 0
    assert engine.calls == ["cpu-latest"]
    assert {r["env"] for r in _results(tmp_path)["runs"]} == {"cpu", "cpu-latest"}


def test_a_stop_during_the_summary_leaves_finished_results_and_nothing_to_redo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("repro.cli.run_commands._engine", lambda choice: PlanEngine())

    def stopped(*args: Any, **kwargs: Any) -> str:
        raise KeyboardInterrupt("SIGTERM")

    import repro.run.summary

    monkeypatch.setattr(repro.run.summary, "render", stopped)
    for module in ("repro.run.usecase", "repro.cli.run_commands"):
        if hasattr(sys.modules.get(module), "render"):
            monkeypatch.setattr(f"{module}.render", stopped)
    assert _repro(tmp_path) == 130
    err = capsys.readouterr().err
    assert "RESUME=1" not in err and "nothing to redo" in err
    invocation = _results(tmp_path)["invocation"]
    assert invocation["finished_at"] and not invocation["interrupted"]


_LOCK_HOLDER = """
import fcntl, os, sys, time
fh = open(sys.argv[1], "w")
fcntl.flock(fh, fcntl.LOCK_EX)
open(sys.argv[1] + ".held", "w").write("1")
time.sleep(3600)
"""
_FOLLOWER = (
    _STOPS_INTO_MARKER
    + """
assert parentwatch.follow_owner(sys.argv[2])
open(marker + ".ready", "w").write("1")
while True:
    time.sleep(0.1)
"""
)


def test_a_run_in_a_container_stops_when_the_owner_lock_is_released(
    tmp_path: Path, real_subprocess: None
) -> None:
    """The Docker engine's watch (no parent to follow in a container): the tool holds a lock on a
    file bound into the container; its death (here: SIGKILL of the holder) stops the suite."""
    lock = tmp_path / "owner.lock"
    marker = tmp_path / "stopped"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    holder = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, str(lock)], env=env)
    follower = None
    try:
        assert _wait_for(Path(str(lock) + ".held"))
        follower = subprocess.Popen([sys.executable, "-c", _FOLLOWER, str(marker), str(lock)], env=env)
        assert _wait_for(Path(str(marker) + ".ready"))
        assert not marker.exists()  # the tool lives: nothing stops
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        stopped = _wait_for(marker)
    finally:
        for proc in (holder, follower):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert stopped and marker.read_text() == "SIGTERM"
