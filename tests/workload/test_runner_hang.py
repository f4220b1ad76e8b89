"""The launcher's hang handling with a fake torchrun: stacks captured, nothing left running.

The fake launcher starts two "ranks" that behave like ours (pid file, faulthandler on SIGUSR1,
heartbeat) and then block forever, as MiCS with replica groups does on DeepSpeed 0.19.6.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from repro.workload import runner
from tests.fixtures.runspec import cpu_spec

FAKE_RANK = r"""
import faulthandler, os, signal, sys, time
run_dir, rank = sys.argv[1], sys.argv[2]
# Arm the stack dump before announcing the pid: the launcher signals only pids it has read.
faulthandler.register(signal.SIGUSR1, file=open(os.path.join(run_dir, f"rank{rank}.stack"), "w"),
                      all_threads=True)
open(os.path.join(run_dir, f"rank{rank}.pid"), "w").write(str(os.getpid()))
signal.signal(signal.SIGINT, signal.SIG_IGN)   # a rank stuck in a collective ignores Ctrl-C
def blocked_in_collective():
    beats = 0
    while True:
        if mode == "beat" or beats == 0:  # "once": one step done, then stuck
            open(os.path.join(run_dir, f"rank{rank}.heartbeat"), "w").write("1")
            beats += 1
        time.sleep(0.2)
mode = sys.argv[3]
blocked_in_collective()
"""

FAKE_LAUNCHER = r"""
import subprocess, sys, time
run_dir, mode = sys.argv[1], sys.argv[2]
procs = [subprocess.Popen([sys.executable, "-c", open(sys.argv[3]).read(), run_dir, str(r), mode])
         for r in range(2)]
for p in procs:
    p.wait()
"""


def _spec(tmp_path: Path, timeout: float, stall: float) -> runner.RunSpec:
    return cpu_spec(tmp_path, timeout, stall)


@pytest.fixture
def fake_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None):  # type: ignore[no-untyped-def]
    rank_script = tmp_path / "rank.py"
    rank_script.write_text(FAKE_RANK)

    def install(mode: str) -> None:
        def command(spec: runner.RunSpec, port: int) -> list[str]:
            return [sys.executable, "-c", FAKE_LAUNCHER, spec.run_dir, mode, str(rank_script)]

        monkeypatch.setattr(runner, "_command", command)

    return install


def _pids(run_dir: str) -> list[int]:
    return runner._rank_pids(run_dir)


@pytest.mark.parametrize("mode,timeout,stall", [("beat", 10.0, 100.0), ("once", 100.0, 2.0)])
def test_hang_is_a_result_with_stacks_and_no_survivors(
    fake_torchrun,
    tmp_path: Path,
    mode: str,  # type: ignore[no-untyped-def]
    timeout: float,
    stall: float,
) -> None:
    fake_torchrun(mode)
    spec = _spec(tmp_path, timeout, stall)
    result = runner.launch(spec)
    assert result.status == "hung"
    assert set(result.stacks) == {"0", "1"}
    assert all("blocked_in_collective" in text for text in result.stacks.values())
    assert ("time limit" in result.hang_detail) == (mode == "beat")
    pids = _pids(spec.run_dir)
    assert len(pids) == 2
    time.sleep(0.2)
    assert not [p for p in pids if runner.alive(p)], "a rank outlived the run"
    record, status = runner.assemble(spec, result, {"env": "t", "scenario": "mics-replica"})
    assert status == "hung" and record["stacks"] == result.stacks and "stacks of 2 ranks" in record["reason"]


def test_launcher_failure_without_ranks_is_env_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_subprocess: None
) -> None:
    no_torch = "import sys; print('No module named torch'); sys.exit(1)"
    monkeypatch.setattr(runner, "_command", lambda spec, port: [sys.executable, "-c", no_torch])
    spec = _spec(tmp_path, 30.0, 30.0)
    result = runner.launch(spec)
    record, status = runner.assemble(spec, result, {"env": "t"})
    assert result.status is None and result.launcher_code == 1
    assert status == "env-error" and "No module named torch" in record["exception"]["message"]
