"""How the host side's output reaches the terminal: a live display where a person watches, plain lines
everywhere else (CI logs, pipes, files).

One interface, `Reporter`, two implementations:
- `PlainReporter`: every line printed as it comes, on stdout or stderr; a step's line once, when it
  begins. What the tool always printed, and what CI, a pipe, TERM=dumb, NO_COLOR, --quiet and
  --verbose get.
- `RichReporter`: rich's live display on an interactive terminal. A running step is a spinner row
  with its elapsed time under the lines printed so far; once it ends it is left as one line,
  "✓ <its words> (12 s)" (✗ when it failed or was interrupted). The display runs only while a step
  does, and stops before a failing step's log is shown, before a child process writes to the
  terminal itself, and at exit (also on Ctrl-C), so the terminal is never left mid-redraw or with
  a hidden cursor.

`choose()` picks one from the environment. rich is imported only by `RichReporter`: a host
without it gets plain lines.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.console import Console

# MICS_REPRO_PROGRESS=plain: plain lines on a terminal too (a screen reader, a terminal rich
# does not draw well).
PROGRESS_ENV = "MICS_REPRO_PROGRESS"


class Outcome(enum.Enum):
    DONE = "done"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


@dataclass
class Handle:
    """One step being shown; `ended` once its outcome is known (a failure may end it early)."""

    text: str
    started: float
    task_id: Any = None
    ended: bool = False


class Reporter(Protocol):
    def line(self, text: str, *, err: bool = False) -> None:
        """One line of output (err: a warning or an error, stderr)."""

    def raw(self, data: bytes) -> None:
        """Bytes copied from a subprocess (the tee of a suite's log), as they come."""

    def begin(self, text: str, *, plain: bool = True) -> Handle:
        """A long step begins. `plain`: its line is printed in plain mode too (False: the step is
        shown only live, where the lines around it already say what runs)."""

    def end(self, handle: Handle, outcome: Outcome) -> None:
        """The step ended."""

    def failed(self, header: str, log: str) -> None:
        """A step failed: its whole log is shown (stderr), after the live display has stopped."""

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """While the block runs, a child process writes to the terminal itself."""

    def close(self) -> None:
        """The tool is done with the terminal (idempotent)."""


def _print(text: str, *, err: bool = False) -> None:
    # Streams are looked up at call time, so pytest's capsys sees everything.
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


class PlainReporter:
    def line(self, text: str, *, err: bool = False) -> None:
        _print(text, err=err)

    def raw(self, data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()

    def begin(self, text: str, *, plain: bool = True) -> Handle:
        if plain:
            _print(text)
        return Handle(text, time.monotonic())

    def end(self, handle: Handle, outcome: Outcome) -> None:
        handle.ended = True

    def failed(self, header: str, log: str) -> None:
        _print(f"{header}\n{log}" if log else header, err=True)

    def paused(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


_MARKS = {Outcome.DONE: "✓", Outcome.FAILED: "✗", Outcome.INTERRUPTED: "✗"}


class RichReporter:
    """The live display (rich.progress.Progress, which draws through rich.live.Live)."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console if console is not None else Console(file=sys.stdout)
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),  # paths and "[build cpu]" are not markup
            TimeElapsedColumn(),
            console=self.console,
            transient=True,  # a finished step is printed as one line; the spinner row goes
            redirect_stdout=False,  # every line of ours comes through here; a child's, see paused()
            redirect_stderr=False,
        )
        self._lock = threading.RLock()
        self._running: list[Handle] = []
        self._live = False
        self._pauses = 0
        atexit.register(self.close)  # an exit that skips the CLI's own close still restores the cursor

    # -- the display, started while a step runs ----------------------------------------------
    def _start(self) -> None:
        if not self._live and self._running and not self._pauses:
            self.progress.start()
            self._live = True

    def _stop(self) -> None:
        if self._live:
            self.progress.stop()
            self._live = False

    def _say(self, text: str, *, err: bool = False) -> None:
        from rich.text import Text

        if self._live:  # above the spinner rows
            self.console.print(Text(text), soft_wrap=True)
        else:
            _print(text, err=err)

    # -- Reporter ----------------------------------------------------------------------------
    def line(self, text: str, *, err: bool = False) -> None:
        with self._lock:
            self._say(text, err=err)

    def raw(self, data: bytes) -> None:
        with self._lock:
            if not self._live:
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
                return
            for line in data.decode(errors="replace").splitlines():
                self._say(line)

    def begin(self, text: str, *, plain: bool = True) -> Handle:
        with self._lock:
            handle = Handle(text, time.monotonic())
            handle.task_id = self.progress.add_task(text, total=None)
            self._running.append(handle)
            self._start()
            return handle

    def end(self, handle: Handle, outcome: Outcome) -> None:
        with self._lock:
            if handle.ended:
                return
            handle.ended = True
            self._running.remove(handle)
            self.progress.remove_task(handle.task_id)
            took = time.monotonic() - handle.started
            suffix = "" if outcome is Outcome.DONE else f", {outcome.value}"
            self._say(f"{_MARKS[outcome]} {handle.text} ({took:.0f} s{suffix})")
            if not self._running:
                self._stop()

    def failed(self, header: str, log: str) -> None:
        with self._lock:
            for handle in list(reversed(self._running)):
                self.end(handle, Outcome.FAILED)
            self._stop()
            _print(f"{header}\n{log}" if log else header, err=True)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            self._pauses += 1
            self._stop()
        try:
            yield
        finally:
            with self._lock:
                self._pauses -= 1
                self._start()

    def close(self) -> None:
        with self._lock:
            for handle in list(reversed(self._running)):
                self.end(handle, Outcome.INTERRUPTED)
            self._stop()


def _set(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _tty(stream: IO[str] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def interactive(
    environ: Mapping[str, str] | None = None, stdout: IO[str] | None = None, stderr: IO[str] | None = None
) -> bool:
    """True where a person watches a terminal that can draw: stdout and stderr are TTYs, and no
    CI, TERM=dumb, NO_COLOR (https://no-color.org: any non-empty value) or
    MICS_REPRO_PROGRESS=plain says otherwise."""
    env = os.environ if environ is None else environ
    if env.get(PROGRESS_ENV, "").strip().lower() == "plain" or _set(env, "CI"):
        return False
    if env.get("TERM", "") == "dumb" or env.get("NO_COLOR", ""):
        return False
    return _tty(sys.stdout if stdout is None else stdout) and _tty(sys.stderr if stderr is None else stderr)


def choose(
    *,
    live_allowed: bool = True,
    environ: Mapping[str, str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> Reporter:
    """The live display where `interactive()` and rich is installed; plain lines otherwise.
    `live_allowed`: False for --quiet and --verbose (plain lines, as always)."""
    if live_allowed and interactive(environ, stdout, stderr):
        try:
            return RichReporter()
        except ImportError:
            pass
    return PlainReporter()
