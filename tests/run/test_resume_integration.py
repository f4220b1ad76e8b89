"""RESUME=1 on the CPU twin (torch 2.1.0 + DeepSpeed 0.13.1, venv engine), through the front door:
a real `repro` is stopped with SIGINT once its first run (the ZeRO-3 control) has its record, and
the same command with --resume runs only what did not finish. The control is not run again (its
record and files are untouched), the results.json is whole and the verdict is the full one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from envpython import env_python

from repro.core.verdict import FixVerdict, Reproduces, env_verdicts
from repro.workload.record import RECORD_KEYS

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

CONTROL = "zero3-stock-fp32-async-w4"


def _command(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "repro",
        "repro",
        "--env",
        "cpu",
        "--engine",
        "venv",
        "--scenarios",
        "mics",
        "--patch",
        "stock,fixed",
        "--no-sync-proof",
        "--steps",
        "4",
        "--jobs",
        "1",
        "--out",
        str(out),
        *extra,
    ]


def _ctrl_c_reaches_it() -> None:
    """Child set-up: SIGINT at its default, as in a terminal's foreground job. A test run started
    in the background of a non-interactive shell (`cmd &`, as a CI script may) inherits SIGINT
    ignored, and Python then never turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stopped(argv: list[str], ready: Callable[[], bool], early: str, settle_s: float = 0) -> str:
    """Run `argv`, Ctrl-C it (SIGINT) once `ready()` holds and `settle_s` more seconds passed (`early`:
    the failure when it ends before), and check that it stopped as interrupted (exit 130): its
    stderr."""
    tool = subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_reaches_it,
    )
    try:
        deadline = time.monotonic() + 600  # bounds a failure only
        while not ready() and tool.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tool.poll() is None, early
        time.sleep(settle_s)
        tool.send_signal(signal.SIGINT)  # Ctrl-C
        stdout, stderr = tool.communicate(timeout=300)
    finally:
        if tool.poll() is None:
            tool.kill()
            tool.wait()
    assert tool.returncode == 130, stdout[-3000:] + stderr[-3000:]
    return stderr


def _records(suite_file: Path) -> list[dict[str, Any]]:
    try:
        runs: list[dict[str, Any]] = json.loads(suite_file.read_text())["runs"]
    except (OSError, ValueError, KeyError):
        return []
    return runs


def test_a_real_run_stopped_after_its_control_resumes_without_running_the_control_again(
    tmp_path: Path,
) -> None:
    env_python("cpu")  # skips (or fails in CI) when the env's venv is not built
    out = tmp_path / "results"
    stderr = _stopped(
        _command(out),
        lambda: bool(_records(out / "cpu" / "suite.json")),
        "the run ended before its first record was seen",
    )
    assert f"RESUME=1 OUT={out.resolve()}" in stderr or f"--resume --out {out.resolve()}" in stderr
    first = json.loads((out / "results.json").read_text())
    assert first["invocation"]["interrupted"]
    before = {r["run_name"]: r for r in first["runs"]}
    assert before[CONTROL]["outcome"] == "clean"
    finished = {n for n, r in before.items() if r["outcome"] != "interrupted"}
    assert finished != {CONTROL, "mics-stock-fp32-async-w4", "mics-fixed-fp32-async-w4"}, "nothing to redo"
    control_dir = out / "cpu" / "runs" / CONTROL
    stamps = {p.name: p.stat().st_mtime_ns for p in control_dir.iterdir() if p.is_file()}

    done = subprocess.run(
        _command(out, "--resume"), cwd=REPO, capture_output=True, text=True, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the control ran once: its files and record are the first attempt's
    assert {p.name: p.stat().st_mtime_ns for p in control_dir.iterdir() if p.is_file()} == stamps
    suite = json.loads((out / "cpu" / "suite.json").read_text())
    assert CONTROL in suite["resumed"]["kept"] and suite["resumed"]["redone"] == 3 - len(finished)
    data = json.loads((out / "results.json").read_text())
    runs = {r["run_name"]: r for r in data["runs"]}
    assert len(data["runs"]) == 3 and set(runs) == {
        CONTROL,
        "mics-stock-fp32-async-w4",
        "mics-fixed-fp32-async-w4",
    }
    for name in finished:
        assert runs[name] == before[name]
    for record in data["runs"]:
        assert set(RECORD_KEYS) <= set(record)
        assert record["outcome"] != "interrupted"
        assert all((out / path).exists() for path in (record.get("logs") or {}).values()), record["logs"]
    assert runs["mics-stock-fp32-async-w4"]["control_run"] == CONTROL
    invocation = data["invocation"]
    assert invocation["finished_at"] and not invocation["interrupted"] and len(invocation["resumed_at"]) == 1
    [verdict] = env_verdicts(data["runs"])
    assert (verdict.reproduces, verdict.fixed) == (Reproduces.YES, FixVerdict.YES)


def test_make_run_stopped_during_its_fixed_run_resumes_with_the_printed_command(tmp_path: Path) -> None:
    """`make run`: SIGINT once the stock run finished; the command the message prints (a make line
    with RESUME=1 OUT=...) runs only the fixed run, and both records are judged as in one run."""
    import shlex
    import shutil

    from tests.fixtures.classifier_job import TRAIN

    make = shutil.which("make")
    if make is None:
        pytest.skip("no make on PATH")
    env_python("cpu")
    work = tmp_path / "their-project"
    work.mkdir()
    (work / "train_classifier.py").write_text(TRAIN)
    out = tmp_path / "results"
    command = "torchrun --nproc_per_node 2 train_classifier.py"
    argv = [sys.executable, "-m", "repro", "run", "--env", "cpu", "--engine", "venv", "--workdir", str(work)]
    # strict: the stock job's losses part from the fixed run's every time, so the divergence step
    # asserted below proves the resumed fixed run was judged against. On async that parting is a
    # race (tests/own_job/test_job_integration.py), and this test would assert luck.
    argv += ["--out", str(out), "--stall-timeout", "240", "--transport", "strict", "--cmd", command]
    stock_job = out / "cpu" / "custom-stock" / "job.json"
    # 1 s after the stock run: the fixed run is under way
    stderr = _stopped(argv, stock_job.exists, "the job ended before its stock run was seen to finish", 1)
    first = json.loads((out / "results.json").read_text())
    assert first["invocation"]["interrupted"]
    assert {r["patch"]: r["outcome"] for r in first["runs"]}["fixed"] == "interrupted"
    line = stderr.split("into the same folder: ", 1)[1].splitlines()[0]
    assert f"RESUME=1 OUT={shlex.quote(str(out.resolve()))}" in line and " make run " in f" {line}"
    assert "TRANSPORT=strict" in line  # the rest of the run keeps the transport it started with
    stamps = {p.name: p.stat().st_mtime_ns for p in stock_job.parent.iterdir() if p.is_file()}

    done = subprocess.run(
        ["bash", "-c", f"{line} --no-print-directory PYTHON={shlex.quote(sys.executable)}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in stock_job.parent.iterdir() if p.is_file()} == stamps
    data = json.loads((out / "results.json").read_text())
    runs = {r["patch"]: r for r in data["runs"]}
    assert len(data["runs"]) == 2 and runs["fixed"]["outcome"] == "clean"
    assert runs["stock"]["outcome"] == "reproduced" and runs["stock"]["first_divergent_step"] is not None
    assert {r["transport"] for r in data["runs"]} == {"strict"}
    invocation = data["invocation"]
    assert invocation["finished_at"] and not invocation["interrupted"] and len(invocation["resumed_at"]) == 1
    [verdict] = env_verdicts(data["runs"])
    assert (verdict.reproduces, verdict.fixed) == (Reproduces.YES, FixVerdict.YES)
