"""Issue #32, round 3, item 5, with a real Slurm controller (slurm tier; .ci/start-slurm.sh starts
one): Ctrl-C while a RUNNER=slurm round's array job runs cancels that job, and its tasks never run
to their end. The runner's cancelling with the Slurm commands faked is tests/bisect/test_slurm_cancel.py.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from repro.bisect import rounds
from repro.bisect.probe import ProbeSpec


def slurm_answers() -> bool:
    if not all(shutil.which(tool) for tool in ("sbatch", "sinfo", "squeue", "scancel")):
        return False
    return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0


def squeue(job: str) -> list[str]:
    out = subprocess.run(
        ["squeue", "--noheader", "--jobs", job, "--format", "%i %T"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.split("\n") if out.returncode == 0 and out.stdout.strip() else []


@pytest.fixture
def sleeping_probe(tmp_path: Path) -> Iterator[rounds.ProbeCommand]:
    """A probe that sleeps until it is cancelled (the task would write a marker when it ends)."""
    stand_in = tmp_path / "stand_in" / "sleeper.py"
    stand_in.parent.mkdir()
    stand_in.write_text(
        "import pathlib, sys, time\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n"
        "time.sleep(300)\n"
        "out.mkdir(parents=True, exist_ok=True)\n"
        "(out / 'finished').write_text('the task was not cancelled')\n"
    )
    yield rounds.ProbeCommand(python=sys.executable, module="sleeper")


@pytest.mark.slurm
def test_a_real_array_job_is_cancelled_on_ctrl_c(
    tmp_path: Path, sleeping_probe: rounds.ProbeCommand, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not slurm_answers():
        pytest.skip("no Slurm controller answers (run .ci/start-slurm.sh)")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "stand_in"))
    lines: list[str] = []
    runner = rounds.Slurm(
        tmp_path / "out", sleeping_probe, 2, rounds.SlurmOptions(time_limit="0:10:00"), say=lines.append
    )

    # Ctrl-C once both tasks run, sent to the main thread as a terminal's reaches it (raise_signal
    # from this thread would not wake the main thread out of a blocking call). A squeue that fails
    # or times out on a busy controller is asked again (an exception would end this thread
    # silently); what it last said goes into the failure message.
    last: list[str] = []

    def running() -> int:
        try:
            rows = squeue(runner.submitted[0]) if runner.submitted else []
        except (OSError, subprocess.SubprocessError) as exc:
            rows = [f"squeue failed: {exc!r}"]
        last[:] = rows
        return len([r for r in rows if "RUNNING" in r])

    def press_ctrl_c_when_running() -> None:
        while running() < 2:
            time.sleep(0.5)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    # Ctrl-C as a terminal delivers it: Python's own handler, also when this test process was
    # started in the background of a non-interactive shell (which starts it with SIGINT ignored,
    # so the press would be lost and the tasks would run to their end).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    presser = threading.Thread(target=press_ctrl_c_when_running, daemon=True)
    presser.start()
    try:
        runner([ProbeSpec("cpu", label="a"), ProbeSpec("cpu", label="b")])
    except KeyboardInterrupt:
        pass
    else:
        pytest.fail(f"the array job ended before Ctrl-C was pressed; squeue last said {last}")
    finally:
        signal.signal(signal.SIGINT, previous)
    (job,) = runner.submitted
    assert f"slurm: cancelled array job {job}" in lines
    # scancel is asynchronous: wait until the array is gone. Not cancelled, its tasks would still
    # end (after their sleep) and leave their `finished` markers, which fails the test below.
    while squeue(job):
        time.sleep(1)
    assert not list((tmp_path / "out").glob("probes/*/finished")), "the tasks ran to their end"
