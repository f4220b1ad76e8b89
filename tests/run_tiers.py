"""`make test`: every tier, with the side stream (tests/conftest.py SIDE_STREAM: the Docker and
bootstrap tiers and the PR regression test) running beside the others.

Why two streams: the Docker tests spend much of their time in dockerd and on the disk (exporting,
saving and loading multi-GB images), the bootstrap test on the network; the other real tests on
the CPU (torchrun ranks). On 2 cores, side by side took less than one after the other (figures
in docs/developing.md). The two streams share no files, images or ports:
the side stream's tests use their own images and results folders, every rendezvous port of ours
is a free one, and DeepSpeed's test harness takes the first free port from 29500.

The side stream's output goes to a log file, named when it starts, and is printed whole after
the other stream's so the two never interleave. The exit status is the first failure of: the unit
tier, the other real tiers, the side stream. "No tests collected" (pytest's 5, e.g. with
PYTEST_ARGS naming a file of one tier only) is not a failure. On Ctrl-C every stream is
interrupted, the Docker log is still printed, and the status is 130.

Usage: python tests/run_tiers.py [PYTEST_ARGS...]
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NO_TESTS = 5


def _xdist() -> list[str]:
    return ["-n", "2"] if importlib.util.find_spec("xdist") else []


def _ok(rc: int) -> int:
    return 0 if rc == NO_TESTS else rc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT first (pytest's own Ctrl-C: fixtures tear down, runs are stopped), then harder."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def _print_log(log: Path, rc: int | None, seconds: float) -> None:
    print(f"\n===== the side stream (ran beside the others; {seconds:.0f} s; log {log}) =====", flush=True)
    sys.stdout.write(log.read_text(errors="replace"))
    status = "interrupted" if rc is None else f"exit status {rc}"
    print(f"===== end of the side stream: {status} =====", flush=True)


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    fd, name = tempfile.mkstemp(prefix="mics-repro-side-stream-", suffix=".log")
    log = Path(name)
    started = time.monotonic()
    with os.fdopen(fd, "wb") as sink:
        side = subprocess.Popen(
            [*pytest, "-m", "side_stream and not unit", *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped as a whole on Ctrl-C
        )
    print(f"make test: the side stream (Docker, bootstrap) runs beside the rest; its output follows ({log})")
    sys.stdout.flush()
    results: list[int] = []
    try:
        results.append(_ok(subprocess.call([*pytest, "-m", "unit", *_xdist(), *args])))
        results.append(_ok(subprocess.call([*pytest, "-m", "not unit and not side_stream", *args])))
        waiting = time.monotonic()
        side_rc = side.wait()
        print(f"make test: waited {time.monotonic() - waiting:.0f} s for the side stream", flush=True)
    except KeyboardInterrupt:
        _stop(side)
        _print_log(log, None, time.monotonic() - started)
        return 130
    _print_log(log, side_rc, time.monotonic() - started)
    results.append(_ok(side_rc))
    return next((rc for rc in results if rc), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
