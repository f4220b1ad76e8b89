"""The pre-imported launcher (repro/workload/prefork*.py) with the real server and a stand-in
rank entry point (tests/fixtures/prefork_entry.py): what makes a forked run as trustworthy as a
torchrun one. Every run is fresh processes in a session of its own, with torchrun's variables;
what the server imported is not imported again; a failed rank stops its peers; a hang is
stopped as a whole; a server that cannot serve says why (the runner then uses torchrun)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from repro.workload import runner
from repro.workload.prefork import PreforkServer, PreforkUnavailable
from tests.fixtures.runspec import cpu_spec

REPO = Path(__file__).resolve().parents[2]
STAND_IN = ("--preload", "tests.fixtures.prefork_heavy", "--required", "tests.fixtures.prefork_heavy")
ENTRY = ("--entry", "tests.fixtures.prefork_entry:main")


def _server(tmp_path: Path, *args: str) -> PreforkServer:
    env = dict(os.environ, MARK="from-the-suite")
    return PreforkServer(env, str(REPO), str(tmp_path / "prefork.log"), runner.alive, args)


@pytest.fixture
def server(tmp_path: Path, real_subprocess: None) -> Iterator[PreforkServer]:
    srv = _server(tmp_path, *STAND_IN, *ENTRY)
    yield srv
    srv.close()


def _ranks(run_dir: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(world)]


def _start(server: PreforkServer, run_dir: Path, mode: str, world: int = 2) -> Any:
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MARK="run-env", MASTER_PORT="12345")
    argv = ["--run-dir", str(run_dir), "--mode", mode]
    return server.start(argv, env, world, str(run_dir / "launcher.log"))


def test_each_run_is_fresh_processes_in_its_own_session(server: PreforkServer, tmp_path: Path) -> None:
    first = _start(server, tmp_path / "a", "ok")
    second = _start(server, tmp_path / "b", "ok", world=3)
    assert first.wait() == 0 and second.wait() == 0
    ready = server.ready_info()
    assert ready is not None and ready["modules"] == ["tests.fixtures.prefork_heavy"]
    a, b = _ranks(tmp_path / "a", 2), _ranks(tmp_path / "b", 3)
    pids = {r["pid"] for r in a + b}
    assert len(pids) == 5 and ready["pid"] not in pids
    # one session (= process group) per run, led by the run's leader, whose children the ranks are
    assert {(r["sid"], r["pgid"], r["ppid"]) for r in a} == {(first.pid,) * 3}
    assert {(r["sid"], r["pgid"], r["ppid"]) for r in b} == {(second.pid,) * 3}
    for rank, seen in enumerate(b):
        assert seen["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_RANK": str(rank),
            "MASTER_PORT": "12345",
            "MARK": "run-env",  # the run's environment, not the server's
        }
        # imported once, by the server, before the fork
        assert seen["heavy_imported_in"] == ready["pid"]
        # a fresh interpreter's dispositions, not the leader's
        assert "default_int_handler" in seen["sigint"] and seen["sigterm_default"]
    assert "forking 2 ranks" in (tmp_path / "a" / "launcher.log").read_text()
    # what an import printed went to the server's log, not into its replies
    assert "printed on stdout by an import" in (tmp_path / "prefork.log").read_text()


def test_a_failed_rank_stops_its_peers_and_sets_the_exit_code(server: PreforkServer, tmp_path: Path) -> None:
    run = _start(server, tmp_path / "f", "fail1", world=3)
    assert run.wait() == 3
    pids = [r["pid"] for r in _ranks(tmp_path / "f", 3)]
    assert not [p for p in pids if runner.alive(p)]
    assert "rank 1" in (tmp_path / "f" / "launcher.log").read_text()


def test_a_run_end_is_seen_when_the_server_reports_it_not_at_a_poll(
    server: PreforkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the run's exit wakes its waiter (the replies' reader notifies); no sleeping poll loop
    from repro.workload import prefork

    def no_sleep(seconds: float) -> None:
        raise AssertionError("ForkedRun.wait slept while the server could report the exit")

    monkeypatch.setattr(prefork, "time", SimpleNamespace(monotonic=time.monotonic, sleep=no_sleep))
    run = _start(server, tmp_path / "w", "ok")
    hung = _start(server, tmp_path / "h", "hang")
    with pytest.raises(subprocess.TimeoutExpired):  # a timeout still applies, without sleeping
        hung.wait(timeout=0.01)
    os.killpg(hung.pid, 9)
    assert hung.wait() == -9
    assert run.wait() == 0
    runner.wait_exit(run, 30.0)  # returns at once for a run that has ended


def _spec(tmp_path: Path) -> runner.RunSpec:
    return cpu_spec(tmp_path, 4.0, 100.0, model_args=("--mode", "hang"))


def test_a_hung_forked_run_is_stopped_as_a_whole(server: PreforkServer, tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    result = runner.launch(spec, server=server)
    assert result.status == "hung" and result.launcher == "prefork" and result.launcher_note == ""
    assert set(result.stacks) == {"0", "1"} and all("main" in s for s in result.stacks.values())
    pids = runner._rank_pids(spec.run_dir)
    assert len(pids) == 2
    assert not [p for p in pids if runner.alive(p)], "a rank outlived the run"
    record, status = runner.assemble(spec, result, {"env": "t", "scenario": "mics-replica"})
    assert status == "hung" and record["launcher"] == {"kind": "prefork", "note": ""}


MISSING = ("--preload", "surely_not_a_module_xyz", "--required", "surely_not_a_module_xyz")


def test_a_server_that_cannot_import_what_it_needs_is_unavailable(
    tmp_path: Path, real_subprocess: None
) -> None:
    srv = _server(tmp_path, *MISSING, *ENTRY)
    try:
        with pytest.raises(PreforkUnavailable, match="surely_not_a_module_xyz"):
            _start(srv, tmp_path / "x", "ok")
    finally:
        srv.close()


def test_the_runner_falls_back_to_torchrun_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None
) -> None:
    srv = _server(tmp_path, *MISSING)
    ok = "import sys; sys.exit(0)"
    monkeypatch.setattr(runner, "_command", lambda spec, port: [runner.sys.executable, "-c", ok])
    try:
        result = runner.launch(_spec(tmp_path), server=srv)
    finally:
        srv.close()
    assert result.launcher == "torchrun" and result.launcher_code == 0
    assert "ran under torchrun" in result.launcher_note and "surely_not_a_module_xyz" in result.launcher_note


def test_a_run_whose_server_died_still_ends(server: PreforkServer, tmp_path: Path) -> None:
    run = _start(server, tmp_path / "d", "hang")
    server.abandon()  # the server is killed; the run's session lives on until it is stopped
    deadline = time.monotonic() + 60
    while not server.dead and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.dead and run.poll() is None
    os.killpg(run.pid, 9)
    assert run.wait(timeout=60) == -1  # ended; its code could no longer be reported


def test_a_server_never_ready_is_given_up_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None
) -> None:
    monkeypatch.setattr("repro.workload.prefork.READY_TIMEOUT_S", 1.0)
    srv = _server(tmp_path, "--preload", "tests.fixtures.prefork_stuck", *ENTRY)
    try:
        with pytest.raises(PreforkUnavailable, match="not ready after 1 s"):
            _start(srv, tmp_path / "x", "ok")
        srv.proc.wait(timeout=60)  # killed, not left importing
        with pytest.raises(PreforkUnavailable, match="not ready after 1 s"):  # no second wait
            _start(srv, tmp_path / "y", "ok")
    finally:
        srv.close()


def test_a_task_is_one_process_with_its_own_output_files(server: PreforkServer, tmp_path: Path) -> None:
    # how ds_report and collect_env run (repro/workload/artifacts.py): one process, no ranks
    out, err = tmp_path / "task.out", tmp_path / "task.err"
    env = dict(os.environ, RANK="0", MARK="task-env")
    task = server.start_task(
        "tests.fixtures.prefork_entry:main", ["--run-dir", str(tmp_path / "t")], env, str(out), str(err)
    )
    assert task.wait() == 0
    seen = json.loads((tmp_path / "t" / "rank0.json").read_text())
    assert seen["sid"] == task.pid and seen["env"]["MARK"] == "task-env"
    assert out.exists() and err.exists()
