"""repro.core.progress: which display a terminal gets, what the live one draws, and that a failure
or an interrupt leaves it stopped with the whole log shown (issue 22, item 18)."""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from repro.core import cmd, console, progress
from repro.core.console import Level
from repro.core.progress import PlainReporter, RichReporter


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


TTY = {"TERM": "xterm-256color"}
SHOW_CURSOR = "\x1b[?25h"


def _lines(drawn: str) -> list[str]:
    """What a terminal was told to print, without its cursor movements."""
    return [line for line in re.split(r"[\r\n]", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn)) if line]


@pytest.mark.parametrize(
    ("environ", "stdout_tty", "stderr_tty", "live"),
    [
        (TTY, True, True, True),
        (TTY, False, True, False),  # piped into a file or `tee`
        (TTY, True, False, False),
        ({**TTY, "CI": "true"}, True, True, False),
        ({**TTY, "CI": "false"}, True, True, True),
        ({"TERM": "dumb"}, True, True, False),
        ({**TTY, "NO_COLOR": "1"}, True, True, False),
        ({**TTY, "NO_COLOR": ""}, True, True, True),  # no-color.org: only a non-empty value counts
        ({**TTY, "MICS_REPRO_PROGRESS": "plain"}, True, True, False),
    ],
)
def test_the_display_is_chosen_by_the_terminal_and_the_environment(
    environ: dict[str, str], stdout_tty: bool, stderr_tty: bool, live: bool
) -> None:
    chosen = progress.choose(environ=environ, stdout=_Stream(stdout_tty), stderr=_Stream(stderr_tty))
    assert isinstance(chosen, RichReporter if live else PlainReporter)
    chosen.close()


def test_quiet_and_verbose_get_plain_lines_on_a_terminal() -> None:
    chosen = progress.choose(live_allowed=False, environ=TTY, stdout=_Stream(True), stderr=_Stream(True))
    assert isinstance(chosen, PlainReporter)


def test_without_rich_a_terminal_gets_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rich.progress", None)  # `import rich.progress` raises ImportError
    chosen = progress.choose(environ=TTY, stdout=_Stream(True), stderr=_Stream(True))
    assert isinstance(chosen, PlainReporter)


@pytest.fixture
def screen() -> Iterator[tuple[RichReporter, io.StringIO]]:
    out = io.StringIO()
    shown = RichReporter(Console(file=out, force_terminal=True, width=200, color_system=None))
    yield shown, out
    shown.close()


def test_the_live_display_draws_each_step_and_leaves_one_line_per_finished_step(
    screen: tuple[RichReporter, io.StringIO],
) -> None:
    shown, out = screen
    outer = shown.begin("venv: creating /c/venvs/cpu with Python 3.11.7 (torch is big: minutes)")
    assert shown.progress.live.is_started  # a step runs: the display is on
    inner = shown.begin("venv: torch: torch==2.1.0 [cpu]")  # brackets are text, not rich markup
    shown.line("+ pip install torch==2.1.0")
    shown.end(inner, progress.Outcome.DONE)
    shown.end(outer, progress.Outcome.DONE)
    assert not shown.progress.live.is_started  # no step runs: the terminal is left alone
    text = out.getvalue()
    assert "venv: torch: torch==2.1.0 [cpu]" in text  # drawn while running, with its words
    assert "+ pip install torch==2.1.0" in _lines(text)
    assert text.endswith(SHOW_CURSOR + "\r")  # the cursor it hid while drawing is back
    finished = [line for line in _lines(text) if line.startswith(("✓", "✗"))]
    assert [line.rsplit(" (", 1)[0] for line in finished] == [
        "✓ venv: torch: torch==2.1.0 [cpu]",
        "✓ venv: creating /c/venvs/cpu with Python 3.11.7 (torch is big: minutes)",
    ]


def test_a_failure_stops_the_display_and_shows_the_whole_log(
    screen: tuple[RichReporter, io.StringIO], capsys: pytest.CaptureFixture[str]
) -> None:
    shown, out = screen
    handle = shown.begin("venv: deepspeed: deepspeed==0.13.1")
    log = "\n".join(f"pip line {n}" for n in range(300))
    shown.failed("venv: pip step deepspeed failed; its output (also in /c/logs/venv-cpu.log):", log)
    assert not shown.progress.live.is_started
    assert handle.ended
    assert [line.rsplit(" (", 1)[0] for line in _lines(out.getvalue()) if line.startswith("✗")] == [
        "✗ venv: deepspeed: deepspeed==0.13.1"
    ]
    err = capsys.readouterr().err
    assert err.splitlines()[1:] == log.splitlines()  # every line, none cut
    shown.end(handle, progress.Outcome.FAILED)  # the block's own end afterwards: nothing more
    assert out.getvalue().count("✗") == 1


def test_an_interrupt_stops_the_display_and_marks_the_step(screen: tuple[RichReporter, io.StringIO]) -> None:
    shown, out = screen
    shown.begin("docker: building mics-repro:cpu-x (log: /c/logs/build-cpu.log)")
    shown.close()  # what the CLI does on its way out of Ctrl-C
    assert not shown.progress.live.is_started
    (line,) = [line for line in _lines(out.getvalue()) if line.startswith("✗")]
    assert line.startswith("✗ docker: building mics-repro:cpu-x (log: /c/logs/build-cpu.log) (")
    assert line.endswith(", interrupted)")
    assert out.getvalue().endswith(SHOW_CURSOR + "\r")


def test_a_child_writing_to_the_terminal_pauses_the_display(screen: tuple[RichReporter, io.StringIO]) -> None:
    shown, _ = screen
    shown.begin("venv: creating")
    with shown.paused():
        assert not shown.progress.live.is_started
    assert shown.progress.live.is_started


# -- through repro.core.console, as the steps use it ----------------------------------------------
@pytest.mark.parametrize(
    ("level", "out"),
    [
        (Level.QUIET, ""),
        (Level.NORMAL, "venv: creating /c/venvs/cpu\n"),
        (Level.VERBOSE, "venv: creating /c/venvs/cpu\n"),
    ],
)
def test_in_plain_lines_a_task_prints_its_words_once(
    level: Level, out: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = console.get_level()
    console.set_level(level)  # capsys: not a terminal, so plain lines
    try:
        with console.task("venv: creating /c/venvs/cpu"):
            pass
        with console.task("cpu: running the suite", plain=False):  # shown only live
            pass
    finally:
        console.set_level(before)
    assert capsys.readouterr() == (out, "")


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """console's reporter is the live display, drawing into a string."""
    out = io.StringIO()
    before = console.get_level()
    console.set_level(Level.NORMAL)
    monkeypatch.setattr(
        progress,
        "choose",
        lambda **_: RichReporter(Console(file=out, force_terminal=True, width=200, color_system=None)),
    )
    yield out
    console.set_level(before)


def test_a_failing_task_ends_failed_and_an_interrupted_one_interrupted(live: io.StringIO) -> None:
    with pytest.raises(RuntimeError), console.task("wheelhouse: fetching what cpu needs"):
        raise RuntimeError("boom")
    with pytest.raises(KeyboardInterrupt), console.task("docker: building mics-repro:cpu-x"):
        raise KeyboardInterrupt
    lines = [line for line in _lines(live.getvalue()) if line.startswith("✗")]
    assert lines[0].startswith("✗ wheelhouse: fetching what cpu needs (") and lines[0].endswith("failed)")
    assert lines[1].startswith("✗ docker: building mics-repro:cpu-x (") and lines[1].endswith("interrupted)")
    reporter = console.reporter()
    assert isinstance(reporter, RichReporter) and not reporter.progress.live.is_started


def test_a_failing_logged_step_prints_its_log_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """cmd.run_logged: pip's lines go to the log only; on failure that step's part is shown."""
    log = tmp_path / "venv-cpu.log"
    log.write_text("an earlier step's lines\n")
    lines = [f"Collecting thing{n}" for n in range(200)] + ["ERROR: No matching distribution"]

    def fake_run(argv: Any, **kw: Any) -> cmd.CmdResult:
        assert kw["tee"] == log and kw["show"] is False  # not streamed at the normal level
        with open(log, "a") as sink:
            sink.write("\n".join(lines) + "\n")
        return cmd.CmdResult(tuple(argv), 1)

    monkeypatch.setattr(cmd, "run", fake_run)
    before = console.get_level()
    console.set_level(Level.NORMAL)
    try:
        result, text = cmd.run_logged(["pip", "install", "thing"], log, "venv: pip step torch")
    finally:
        console.set_level(before)
    assert result.returncode == 1
    assert text.splitlines() == lines  # this step's part: all of it, not the earlier step's
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing of pip's on stdout
    assert captured.err.splitlines() == [
        f"venv: pip step torch failed; its output (also in {log}):",
        *lines,
    ]


# -- on a real terminal (a pseudo-terminal), Ctrl-C -----------------------------------------------
_DRIVER = """
import sys
from pathlib import Path
from repro.cli.main import main
from repro.core import cmd, console

PIP = "import time; print('pip', 'says', flush=True); time.sleep(600)"

def handler(args):
    with console.task("venv: torch: torch==2.1.0"):
        cmd.run_logged([sys.executable, "-c", PIP], Path(sys.argv[1]), "venv: pip step torch")
    return 0

sys.exit(main(["list"], handler=handler))
"""


def test_ctrl_c_on_a_terminal_stops_the_display_and_exits_130(tmp_path: Path, real_subprocess: None) -> None:
    import os
    import pty
    import select
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NO_COLOR", "MICS_REPRO_PROGRESS")}
    env.update(TERM="xterm-256color", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout and stderr are the pseudo-terminal
        # SIGINT at its default, as for a terminal's foreground job: a test run started in the
        # background of a non-interactive shell would hand it down ignored.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execve(sys.executable, [sys.executable, "-c", _DRIVER, str(tmp_path / "venv-cpu.log")], env)
    drawn = b""
    log = tmp_path / "venv-cpu.log"

    def pip_runs() -> bool:
        return b"torch==2.1.0" in drawn and log.exists() and "pip says" in log.read_text()

    def read_for(seconds: float, until: Any = None) -> None:
        nonlocal drawn
        deadline = time.monotonic() + seconds  # bounds a failure only
        while time.monotonic() < deadline and not (until and until()):
            ready, _, _ = select.select([fd], [], [], 0.1)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child is gone
                return
            if not chunk:
                return
            drawn += chunk

    try:
        read_for(120, until=pip_runs)
        assert pip_runs(), drawn  # the spinner row is up, and pip is writing its log
        os.kill(pid, signal.SIGINT)  # what the terminal sends its foreground job on Ctrl-C
        read_for(600)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = drawn.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 130
    assert b"pip says" not in drawn  # pip's output went to the log
    lines = _lines(text)
    assert lines[-1] == "interrupted"  # the usual message, last
    assert any(line.startswith("✗ venv: torch: torch==2.1.0 (") for line in lines)
    # The display stopped before the message: the cursor it hid is shown again, and nothing is
    # drawn after the message.
    assert SHOW_CURSOR in text and text.rindex(SHOW_CURSOR) < text.rindex("interrupted")
