"""Hardening, round 4 (issue 45): nothing a run started outlives it, one run per results folder,
a full disk ends a run at once, and a forked run ends only once its ranks are gone."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repro.workload import runner
from repro.workload.prefork import PreforkServer
from tests.fixtures.processes import stand_in_server
from tests.fixtures.resume_job_engine import JobEngine, run_job


def _wait_for(check: object, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


# ---- item 4: a forked run ends only once its ranks are gone ------------------------------------------


@pytest.fixture
def server(tmp_path: Path, real_subprocess: None) -> Iterator[PreforkServer]:
    srv = stand_in_server(tmp_path)
    yield srv
    srv.abandon()


def _hanging_run(server: PreforkServer, run_dir: Path, world: int = 2) -> tuple[object, list[int]]:
    run_dir.mkdir()
    argv = ["--run-dir", str(run_dir), "--mode", "hang"]
    run = server.start(argv, dict(os.environ), world, str(run_dir / "launcher.log"))
    assert _wait_for(lambda: len(runner._rank_pids(str(run_dir))) == world), "the ranks did not start"
    return run, runner._rank_pids(str(run_dir))


def test_a_run_whose_leader_died_first_has_not_ended_while_its_ranks_live(
    server: PreforkServer, tmp_path: Path
) -> None:
    """The leader gone before its ranks (what a SIGKILL of the whole session can leave for a
    moment, made certain here by killing the leader alone): the run is not reported ended while
    a rank still runs, and is once they are stopped."""
    run, ranks = _hanging_run(server, tmp_path / "run")
    os.kill(run.pid, signal.SIGKILL)  # type: ignore[attr-defined]
    try:
        code = run.wait(timeout=5)  # type: ignore[attr-defined]
    except subprocess.TimeoutExpired:
        code = None
    living = [p for p in ranks if runner.alive(p)]
    assert code is None or not living, f"the run ended ({code}) while its ranks {living} ran"
    assert living == ranks  # nothing stopped them: the run goes on
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    assert run.wait(timeout=60) == -signal.SIGKILL  # type: ignore[attr-defined]
    assert not [p for p in ranks if runner.alive(p)]


def _holds_off(pid: int, sig: int) -> bool:
    """Whether process `pid` ignores or blocks `sig` (/proc/PID/status masks)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    lines = [line for line in status.splitlines() if line.startswith(("SigIgn", "SigBlk"))]
    masks = [int(line.split()[1], 16) for line in lines]
    return any(mask & (1 << (sig - 1)) for mask in masks)


def test_a_stop_sent_before_the_leader_forks_reaches_every_rank(
    server: PreforkServer, tmp_path: Path
) -> None:
    """SIGTERM to the run's session while its leader has not forked its ranks yet (held here
    at its log, a FIFO nobody reads yet): the ranks it forks after that must not run on."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = run_dir / "launcher.log"
    os.mkfifo(log)
    argv = ["--run-dir", str(run_dir), "--mode", "hang"]
    run = server.start(argv, dict(os.environ), 2, str(log))
    assert _wait_for(lambda: _holds_off(run.pid, signal.SIGTERM)), "the leader never set up its signals"
    os.killpg(run.pid, signal.SIGTERM)
    reader = threading.Thread(target=lambda: open(log, "rb").read(), daemon=True)
    reader.start()  # the leader's log opens: it goes on, forking the ranks
    try:
        code = run.wait(timeout=20)
    except subprocess.TimeoutExpired:
        code = None
    living = [p for p in runner._rank_pids(str(run_dir)) if runner.alive(p)]
    if code is None:
        os.killpg(run.pid, signal.SIGKILL)
    assert code is not None, f"the ranks missed the stop: {living} still running"
    assert not living


# ---- item 1: nothing a job started outlives its run -------------------------------------------------


def _with_arg(arg: str) -> list[int]:
    """Running processes with `arg` in their command line (found whatever the runner does)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if arg.encode() in argv and state != "Z":
            found.append(int(entry))
    return found


def test_daemons_a_job_started_are_stopped_and_named(tmp_path: Path, real_subprocess: None) -> None:
    """`setsid cmd &` and a double fork leave the job's process group: the run still ends them."""
    from repro.workload import job

    seconds = f"{3000 + os.getpid() % 1000}.{time.monotonic_ns() % 1000000}"  # only this test's sleeps
    # one leaves the session at once, one the classic way (fork, setsid, fork; the middle exits)
    both = f'for i in $(seq 300); do [ "$(pgrep -fxc "sleep {seconds}")" = 2 ] && break; sleep 0.1; done'
    command = f"setsid sleep {seconds} & (setsid sh -c 'sleep {seconds} &' &) ; {both}; echo started"
    out = tmp_path / "out"
    argv = ["--cmd", command, "--workdir", str(tmp_path), "--out", str(out), "--device", "gpu"]
    try:
        assert job.main([*argv, "--timeout", "600"]) == 0
        left = _with_arg(seconds)
    finally:
        for pid in _with_arg(seconds):
            os.kill(pid, signal.SIGKILL)
    result = json.loads((out / job.JOB_JSON).read_text())
    assert not left, f"the job's daemons {left} outlived its run (survivors: {result['survivors']})"
    assert result["survivors"] == []
    stopped = result["left_running"]
    assert sorted(stopped.values()).count(f"sleep {seconds}") == 2
    from repro.run.job import RawRun, build_records

    [record] = build_records("cpu", [RawRun("stock", result, "", None)], None, "sha256:x", 600.0)
    assert record["job"] is not None and record["job"]["left_running"] == stopped
    assert "process(es) the job left running after its command ended" in str(record["reason"])


# ---- item 2: one run per results folder -------------------------------------------------------------

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, str(os.getpid()).encode())
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_resume_of_a_folder_in_use_refuses_and_names_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], real_subprocess: None
) -> None:
    """Two `make run ... RESUME=1` of one interrupted invocation: the one that comes second, while
    the first (here a process holding the folder's run lock) still runs, touches nothing."""
    engine = JobEngine(cut=("stock",))
    monkeypatch.setattr("repro.cli.job_commands._engine", lambda choice: engine)
    assert run_job(tmp_path) == 130  # interrupted: RESUME=1 would run the stock run again
    engine.outs.clear()
    out = tmp_path / "out"
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out / ".repro-run.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None and first.stdout.readline() == "held\n"
        capsys.readouterr()
        code = run_job(tmp_path, "--resume")
        err = capsys.readouterr().err
    finally:
        first.communicate("")
    assert code == 2, "the second run went ahead in a folder another run holds"
    assert f"is in use by another run (pid {first.pid})" in err
    assert engine.outs == []
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    # Once the first has ended, the same RESUME=1 goes ahead.
    assert run_job(tmp_path, "--resume") == 0 and engine.outs


# ---- item 3: a full disk ends the run at once ---------------------------------------------------------


class _FullDisk:
    """A log file on a disk that has just filled up: every write fails with ENOSPC."""

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        pass


def test_a_job_whose_log_hits_a_full_disk_stops_at_once_with_a_clear_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    real_subprocess: None,
) -> None:
    """The job writes on and on; its log cannot be written. Not a stall (the job blocked on its
    undrained output until the stall limit) and no traceback: exit 28 with the disk's words."""
    from repro.workload import job

    marker = f"{4000 + os.getpid() % 1000}.{time.monotonic_ns() % 1000000}"
    real_open = open

    def full_log(path: str, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return _FullDisk() if str(path).endswith(job.JOB_LOG) else real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(job, "open", full_log, raising=False)  # what the runner's module opens
    out = tmp_path / "out"
    command = f"while true; do echo {marker}; done"
    argv = ["--cmd", command, "--workdir", str(tmp_path), "--out", str(out), "--device", "gpu"]
    code = job.main([*argv, "--stall-timeout", "20", "--timeout", "600"])
    err = capsys.readouterr().err
    assert code == 28, f"the run went on to {code} ({(out / job.JOB_JSON).is_file() and 'hung'})"
    assert "error: the disk is full: writing the job's log failed (No space left on device)" in err
    assert str(out / job.JOB_LOG) in err and "free there" in err and "RESUME=1" in err
    assert "Traceback" not in err
    assert not _with_text(marker)  # nothing of the job is left


def _with_text(text: str) -> list[int]:
    """Running processes whose command line holds `text`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        if text.encode() in argv and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def test_results_json_on_a_full_disk_ends_the_run_with_the_disks_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from repro.core import results

    engine = JobEngine()
    monkeypatch.setattr("repro.cli.job_commands._engine", lambda choice: engine)

    def full(path: str, data: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(results, "write_json_atomic", full)
    code = run_job(tmp_path)
    err = capsys.readouterr().err
    assert code == 28
    assert "error: the disk is full: writing the results (results.json) failed" in err
    assert str(tmp_path / "out" / "results.json") in err and "free there" in err and "RESUME=1" in err
    assert engine.outs == []  # it ended at once: nothing ran on a disk that cannot hold its results


def test_a_job_runner_that_stopped_on_a_full_disk_ends_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The in-env runner exits 28 (its log or job.json could not be written): the tool stops
    there with the disk's words, not a `crashed` record judged from a cut log."""
    from repro.engines.base import SuiteRun

    class FullEngine(JobEngine):
        def run_job(self, prepared: Any, args: Any, out_dir: Path, *rest: Any, **kw: Any) -> SuiteRun:
            self.outs.append(out_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            return SuiteRun(28, False, 1.0, out_dir, None)

    engine = FullEngine()
    monkeypatch.setattr("repro.cli.job_commands._engine", lambda choice: engine)
    code = run_job(tmp_path)
    err = capsys.readouterr().err
    assert code == 28, err
    assert "error: the disk is full: writing the stock run's files" in err
    assert len(engine.outs) == 1  # the fixed run did not start
