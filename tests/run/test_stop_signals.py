"""SIGTERM and SIGHUP stop every level like Ctrl-C, and the host outwaits the suite's escalation.

The real-process tests run the real host seam (repro.core.cmd.run under the host's signal
handlers), the real suite and the real launcher (repro.workload.runner); only torchrun is a
stand-in whose two ranks per run ignore SIGINT and SIGTERM, so only the launcher's last step
(SIGKILL) stops them. Before the fix, SIGTERM killed the host at once and orphaned everything;
and a host that waited no longer than the suite's escalation killed the suite before its ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.core import cmd, signals
from repro.engines.docker import engine as docker_engine
from repro.workload import defaults, runner
from tests.fixtures.processes import running

STUBBORN_RANK = r"""
import os, signal, sys, time
run_dir, rank = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGINT, signal.SIG_IGN)    # stuck in a collective: deaf to Ctrl-C
signal.signal(signal.SIGTERM, signal.SIG_IGN)   # and to terminate: only SIGKILL works
open(os.path.join(run_dir, f"rank{rank}.pid"), "w").write(str(os.getpid()))
while True:
    time.sleep(0.2)
"""

LAUNCHER = r"""
import os, subprocess, sys
run_dir, rank_script = sys.argv[1], sys.argv[2]
open(os.path.join(run_dir, "launcher.pid"), "w").write(str(os.getpid()))
procs = [subprocess.Popen([sys.executable, rank_script, run_dir, str(r)]) for r in range(2)]
for p in procs:
    p.wait()
"""

# The suite as a real process, with torchrun replaced and MiCS declared present; sys.argv is
# set so that suite.main() takes the command-line path (which installs the signal handlers).
SUITE = r"""
import os, sys
from repro.workload import runner, suite
out, launcher, rank_script = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "suite.pid"), "w").write(str(os.getpid()))
runner._command = lambda spec, port: [sys.executable, launcher, spec.run_dir, rank_script]
suite.mics_available = lambda: True
sys.argv = ["suite", "--env", "t", "--out", out, "--device", "cpu", "--no-artifacts", "--world-size", "2",
            "--scenarios", "mics", "--patches", "stock", "--no-sync-proof", "--jobs", "2",
            "--steps", "1", "--timeout", "600", "--stall-timeout", "600"]
sys.exit(suite.main())
"""

# The host: its stop handlers, then the suite through the one subprocess door, as the venv engine does.
HOST = r"""
import sys
from repro.core import cmd, signals
signals.install_stop_handlers()
try:
    cmd.run([sys.executable, *sys.argv[1:]])
except KeyboardInterrupt:
    print("host: interrupted", flush=True)
    sys.exit(130)
"""


def _wait_for(predicate, what: str, limit_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    # A bound only against a broken test machine: the condition is what is asserted.
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def _pids(out: Path, pattern: str) -> list[int]:
    return [int(p.read_text()) for p in out.glob(pattern) if p.read_text().strip()]


def _default_stop_signals() -> None:
    """A test run under `nohup` (or a CI runner that ignores SIGHUP) passes the ignored disposition
    on, and the handlers rightly keep a signal the parent ignored: start these from the default."""
    for sig in signals.STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


@pytest.fixture
def scripts(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for name, text in (("rank", STUBBORN_RANK), ("launcher", LAUNCHER), ("suite", SUITE), ("host", HOST)):
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(text)
    return paths


@pytest.mark.parametrize("target,sig", [("host", signal.SIGTERM), ("suite", signal.SIGHUP)])
def test_signal_stops_every_level_keeps_records_and_leaves_no_process(
    tmp_path: Path, scripts: dict[str, Path], real_subprocess: None, target: str, sig: int
) -> None:
    out = tmp_path / "out"
    suite_argv = [str(scripts["suite"]), str(out), str(scripts["launcher"]), str(scripts["rank"])]
    argv = (
        [sys.executable, str(scripts["host"]), *suite_argv]
        if target == "host"
        else [sys.executable, *suite_argv]
    )
    env = {**os.environ, "PYTHONPATH": str(runner.REPO_ROOT)}
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_default_stop_signals,
    )
    try:
        # Both runs (control and MiCS) started, each with both ranks up.
        _wait_for(lambda: len(_pids(out, "runs/*/rank*.pid")) == 4, "four ranks running")
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # the test failed: do not leave the tree behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = output.decode(errors="replace")
    assert proc.returncode == 130, text

    everyone = _pids(out, "runs/*/rank*.pid") + _pids(out, "runs/*/launcher.pid") + _pids(out, "suite.pid")
    assert len(everyone) == 7
    _wait_for(lambda: not [p for p in everyone if running(p)], "every process gone", limit_s=10)

    data = json.loads((out / "suite.json").read_text())
    assert data["interrupted"] is True
    assert [(r["scenario"], r["outcome"]) for r in data["runs"]] == [
        ("zero3", "interrupted"),
        ("mics", "interrupted"),
    ], text
    for run_dir in out.glob("runs/*"):
        assert (run_dir / "record.json").is_file()


def test_host_grace_outlasts_the_suites_escalation() -> None:
    # The launcher's steps are the ones the suite's bound counts.
    assert runner.STOP_GRACE_S == defaults.RANK_STOP_GRACE_S
    assert runner.STACK_WAIT_S == defaults.STACK_WAIT_S
    assert defaults.SUITE_STOP_S >= defaults.STACK_WAIT_S + 3 * defaults.RANK_STOP_GRACE_S
    # Each step the host and Docker give the suite is longer than all of the suite's steps.
    assert cmd.STOP_GRACE_S > defaults.SUITE_STOP_S
    assert cmd.STOP_GRACE_S - defaults.SUITE_STOP_S >= cmd.RECORD_MARGIN_S > 0
    assert int(docker_engine.STOP_GRACE_S) > defaults.SUITE_STOP_S  # `docker stop -t` takes whole seconds


def test_host_handler_turns_the_first_signal_into_ctrl_c_and_ignores_the_next() -> None:
    saved = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    try:
        _default_stop_signals()  # from the default, as in a terminal (not as under nohup)
        signals.install_stop_handlers()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(1)  # the handler runs between bytecodes; this is never reached in full
        os.kill(os.getpid(), signal.SIGTERM)  # while cleaning up: reported, not raised
        time.sleep(0.05)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_host_handler_keeps_a_signal_the_parent_ignored() -> None:
    saved = {sig: signal.getsignal(sig) for sig in signals.STOP_SIGNALS}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as `nohup` leaves it
        signals.install_stop_handlers()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert callable(signal.getsignal(signal.SIGTERM))
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_interrupted_container_keeps_the_suites_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fixtures.fake_docker_engine import FakeClient, FakeWheelhouse, Script, _fake_repo, _prepared

    monkeypatch.setenv("MICS_REPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MICS_REPRO_CA_BUNDLE", "none")
    monkeypatch.delenv("MICS_REPRO_KEEP_CONTAINER", raising=False)
    client = FakeClient(
        Script(interrupt_on_wait=True, results={"suite.json": b'{"runs": [{"outcome": "interrupted"}]}'})
    )
    engine = docker_engine.DockerEngine(
        client,
        repo_root=_fake_repo(tmp_path),
        wheelhouse=FakeWheelhouse(tmp_path / "wheels"),
        log_dir=tmp_path / "logs",
        build_args={},
    )
    with pytest.raises(KeyboardInterrupt):  # what SIGTERM/SIGHUP become on the host
        engine.run_suite(_prepared(), [], tmp_path / "out", timeout_s=None)
    (box,) = client.created
    assert box.signals == ["SIGINT"]  # the suite was asked to stop and record, not killed
    assert json.loads((tmp_path / "out" / "suite.json").read_text())["runs"] == [{"outcome": "interrupted"}]
    assert client.live == {}  # and the container is gone


def test_the_command_line_installs_the_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.cli import main as cli_main

    calls: list[str] = []
    monkeypatch.setattr(cli_main, "install_stop_handlers", lambda: calls.append("installed"))
    monkeypatch.setattr(sys, "argv", ["repro", "list"])
    assert cli_main.main() == 0  # `python -m repro list`
    assert cli_main.main(["list"]) == 0  # a test calling main(): the pytest process keeps its own
    assert calls == ["installed"]
