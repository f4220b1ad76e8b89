"""Issue #32, round 3, item 5: Ctrl-C (or SIGTERM, or any error) during a RUNNER=slurm round
cancels the array job the run submitted, and only that one.

The subprocess seam (repro.core.cmd.run, or the runner's `launch`) is faked: sbatch answers a job
id, squeue says the array still runs or raises what the user pressed, scancel is recorded. The
`slurm`-marked test of tests/bisect/test_slurm_cancel_slurm.py does the same with a real controller
(.ci/start-slurm.sh).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from repro.bisect import rounds
from repro.bisect.probe import ProbeSpec
from repro.cli import bisect_commands as bisect_cli
from repro.cli.main import main
from repro.core import cmd, signals
from repro.core.cmd import CmdResult
from repro.core.errors import MissingToolError, RunError
from tests.fixtures.fake_bisect import TORCHES, FakeEngine, FakeMatrix, torch_behaviour

INTERRUPTED = 130


class FakeSlurm:
    """The Slurm commands as the runner sees them through its one subprocess door. Job ids count
    up from 4242; squeue answers `running` for `polls` looks, then whatever `on_wait` does."""

    def __init__(self, on_wait: Callable[[], CmdResult] | None = None, polls: int = 1) -> None:
        self.calls: list[list[str]] = []
        self.next_id = 4242
        self.on_wait, self.polls = on_wait, polls
        self.looks = 0

    def __call__(self, argv: list[str], **kw: Any) -> CmdResult:
        argv = [str(a) for a in argv]
        self.calls.append(argv)
        if argv[0] == "sbatch":
            if "--wait" in argv and self.on_wait is not None:
                # An sbatch that waits: the array job runs meanwhile, and that is where Ctrl-C lands.
                self.next_id += 1
                return self.on_wait()
            self.next_id += 1
            return CmdResult(tuple(argv), 0, f"{self.next_id - 1}\n")
        if argv[0] == "squeue":
            return self.wait_answer(argv)
        if argv[0] == "scancel":
            return CmdResult(tuple(argv), 0)
        raise AssertionError(f"unexpected command {argv}")

    def wait_answer(self, argv: list[str]) -> CmdResult:
        self.looks += 1
        if self.looks <= self.polls:
            return CmdResult(tuple(argv), 0, f"{self.next_id - 1}_0 RUNNING\n")
        if self.on_wait is not None:
            return self.on_wait()
        return CmdResult(tuple(argv), 0, "")  # nothing left: the array ended

    @property
    def submitted(self) -> list[str]:
        return [str(i) for i in range(4242, self.next_id)]

    @property
    def cancels(self) -> list[list[str]]:
        return [call[1:] for call in self.calls if call[0] == "scancel"]


def interrupt() -> CmdResult:
    raise KeyboardInterrupt


def bisect_argv(tmp_path: Path) -> list[str]:
    return ["bisect", "--axis", "torch", "--versions", TORCHES, "--good", "2.0.0", "--bad", "2.3.0",
            "--runner", "slurm", "--parallel", "2", "--out", str(tmp_path / "out"),
            "--results-root", str(tmp_path / "results")]  # fmt: skip


def services(lines: list[str], runner: Any = None) -> bisect_cli.Services:
    return bisect_cli.Services(
        matrix=FakeMatrix(), engine=FakeEngine(torch_behaviour), say=lines.append, runner=runner
    )


def run_front_door(tmp_path: Path, svc: bisect_cli.Services) -> int:
    """`python -m repro bisect ...` as a user types it, with the fakes as its services."""
    return main(
        bisect_argv(tmp_path),
        handler=lambda args: bisect_cli.run_bisect(bisect_cli.walk_request(args), svc),
    )


def slurm_rounds(out: Path, launch: Any) -> rounds.Slurm:
    """Probe rounds of two at a time as Slurm array jobs, `launch` standing in for the Slurm
    commands, in `out`; nothing said."""
    return rounds.Slurm(out, rounds.ProbeCommand(), 2, launch=launch, say=lambda _: None)


def assert_wait_failure_cancels(
    tmp_path: Path, on_wait: Callable[[], CmdResult], error: type[Exception], match: str
) -> None:
    """A round whose wait for the job fails (`on_wait`) ends in `error` (its text matching `match`)
    and cancels the job it submitted."""
    slurm = FakeSlurm(on_wait=on_wait)
    runner = slurm_rounds(tmp_path, slurm)
    with pytest.raises(error, match=match):
        runner([ProbeSpec("cpu", label="a")])
    assert slurm.cancels == [["4242"]]


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue is asked again at once (the runner sleeps 0 s between looks)."""
    monkeypatch.setattr(rounds, "POLL_FIRST_S", 0.0, raising=False)
    monkeypatch.setattr(rounds, "POLL_MAX_S", 0.0, raising=False)


def test_ctrl_c_while_the_array_runs_cancels_that_job_and_exits_130(
    tmp_path: Path, no_sleep: None, capsys: pytest.CaptureFixture[str]
) -> None:
    slurm = FakeSlurm(on_wait=interrupt)

    def make(**kw: Any) -> rounds.Slurm:
        return rounds.Slurm(kw["invocation"].folder, rounds.ProbeCommand(), 2, launch=slurm)

    assert run_front_door(tmp_path, services([], make)) == INTERRUPTED
    assert slurm.submitted == ["4242"]
    assert slurm.cancels == [["4242"]]  # exactly the job this run submitted
    data = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert data["interrupted"] is True


def test_the_real_wiring_cancels_through_the_one_subprocess_door(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_sleep: None
) -> None:
    """No runner injected: the driver builds the Slurm runner from the command line, and every
    Slurm command goes through repro.core.cmd.run."""
    slurm = FakeSlurm(on_wait=interrupt, polls=3)
    monkeypatch.setattr(cmd, "run", slurm)
    lines: list[str] = []
    assert run_front_door(tmp_path, services(lines)) == INTERRUPTED
    assert [c[0] for c in slurm.calls] == ["sbatch", "squeue", "squeue", "squeue", "squeue", "scancel"]
    assert slurm.cancels == [["4242"]]
    assert (tmp_path / "out" / "slurm" / "round-01.job").read_text() == "4242\n"
    assert "slurm: cancelled array job 4242" in lines


def test_sigterm_cancels_like_ctrl_c(tmp_path: Path, no_sleep: None) -> None:
    """A CI cancel or `timeout` sends SIGTERM: the stop handlers (repro/core/signals.py) turn it
    into the same interrupt, and the array is cancelled."""
    previous = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    signals.install_stop_handlers()

    def sigterm() -> CmdResult:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises in this frame long before
        raise AssertionError("SIGTERM did not interrupt")

    slurm = FakeSlurm(on_wait=sigterm)
    try:
        runner = slurm_rounds(tmp_path, slurm)
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            runner([ProbeSpec("cpu", label="a"), ProbeSpec("cpu", label="b")])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert slurm.cancels == [["4242"]]


def test_any_error_leaving_the_round_cancels_the_job(tmp_path: Path, no_sleep: None) -> None:
    def broken() -> CmdResult:
        raise RunError("the disk is full")

    assert_wait_failure_cancels(tmp_path, broken, RunError, "disk is full")


def test_a_controller_that_stops_answering_ends_the_wait_and_cancels(tmp_path: Path, no_sleep: None) -> None:
    def down() -> CmdResult:
        return CmdResult(("squeue",), 1, "", "slurm_load_jobs error: Unable to contact slurm controller")

    assert_wait_failure_cancels(tmp_path, down, MissingToolError, "squeue failed")


def test_only_the_running_round_is_cancelled(tmp_path: Path, no_sleep: None) -> None:
    """Round 1's job ended on its own; Ctrl-C in round 2 cancels round 2's job, not round 1's, and
    never anything by user or partition."""
    slurm = FakeSlurm()
    runner = slurm_rounds(tmp_path, slurm)
    runner([ProbeSpec("cpu", label="a"), ProbeSpec("cpu", label="b")])
    assert slurm.cancels == [] and runner.submitted == ["4242"]
    slurm.looks, slurm.on_wait = 0, interrupt
    with pytest.raises(KeyboardInterrupt):
        runner([ProbeSpec("cpu", label="c")])
    assert runner.submitted == ["4242", "4243"] and slurm.cancels == [["4243"]]


def test_a_finished_round_reads_its_probes_and_cancels_nothing(tmp_path: Path, no_sleep: None) -> None:
    forgotten = FakeSlurm(
        on_wait=lambda: CmdResult(("squeue",), 1, "", "slurm_load_jobs error: Invalid job id specified")
    )
    runner = slurm_rounds(tmp_path, forgotten)
    (obs,) = runner([ProbeSpec("cpu", label="a")])
    assert obs.outcome == "env-error" and "Slurm array task 4242_0 left no probe.json" in obs.reason
    assert forgotten.cancels == [] and [c[0] for c in forgotten.calls] == ["sbatch", "squeue", "squeue"]


def test_ctrl_c_while_sbatch_submits_cancels_by_this_runs_job_name_only(tmp_path: Path) -> None:
    """Interrupted before sbatch printed an id: a job may exist that we cannot name by id, so it
    is cancelled by its name, which carries this runner's random token (and the user's name)."""
    calls: list[list[str]] = []

    def launch(argv: list[str], **kw: Any) -> CmdResult:
        calls.append([str(a) for a in argv])
        if argv[0] == "sbatch":
            raise KeyboardInterrupt
        return CmdResult(tuple(argv), 0)

    one = slurm_rounds(tmp_path, launch)
    other = slurm_rounds(tmp_path / "b", launch)
    with pytest.raises(KeyboardInterrupt):
        one([ProbeSpec("cpu", label="a")])
    cancel = calls[-1]
    assert cancel[:2] == ["scancel", f"--name={one.job_name}"] and one.token in cancel[1]
    assert one.job_name != other.job_name
    assert all(arg.startswith(("--name=", "--user=")) for arg in cancel[1:])
    script = (tmp_path / "slurm" / "round-01.sbatch").read_text()
    assert f"#SBATCH --job-name={one.job_name}\n" in script


def test_a_failed_scancel_does_not_hide_the_interrupt(
    tmp_path: Path, no_sleep: None, capsys: pytest.CaptureFixture[str]
) -> None:
    def launch(argv: list[str], **kw: Any) -> CmdResult:
        if argv[0] == "sbatch":
            return CmdResult(tuple(argv), 0, "4242\n")
        if argv[0] == "squeue":
            raise KeyboardInterrupt
        raise MissingToolError("`scancel` is not installed or not on PATH")

    runner = slurm_rounds(tmp_path, launch)
    with pytest.raises(KeyboardInterrupt):
        runner([ProbeSpec("cpu", label="a")])
    assert "scancel 4242" in capsys.readouterr().err  # what to run by hand
