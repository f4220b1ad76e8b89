"""Console output of the host side: one place decides what is shown, and on which stream.

- `result`: what a command produced (a table, a JSON figure, "wrote X"): stdout, always shown.
- `info`: progress (a step begins, a figure along the way); `detail`: only with --verbose. Both
  on stdout, so a make log reads in order; --quiet hides them.
- `warn`, `error`: diagnostics on stderr, never hidden.
- `stream`: raw bytes copied from a subprocess or container (the tee of a build log): progress.
- `task`: a long step as a block (a build, a download, the runs): its line when it begins, and on an
  interactive terminal a live spinner row until it ends (repro/core/progress.py); `failed`: a
  failing step's whole log, on stderr, after that display has stopped.

Every line goes through one progress reporter (repro/core/progress.py): plain lines, or rich's
live display where a person watches a terminal (only at the normal level: --quiet and --verbose
print plain lines). Texts are printed as given, except that control characters, ESC sequences
and bidi overrides in them are shown escaped (`\\x1b`, `\\u202e`): lines quote records, commit
subjects and CMD=, which must not clear the screen or reorder what is read
(repro/core/printable.py). Callers keep their own `docker:`/`venv:`/`warning:` prefixes, which
tests and users grep for. Every line is flushed at once so that it
interleaves correctly with the output of the subprocesses we start. The level is process-wide:
the CLI sets it once from --quiet/--verbose (`set_level`), tests read and restore it. Streams are
looked up at call time, so pytest's capsys sees everything.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator

from repro.core import progress
from repro.core.printable import printable


class Level(enum.IntEnum):
    QUIET = 0  # results, warnings and errors only
    NORMAL = 1  # + steps and progress (the default)
    VERBOSE = 2  # + details


_level = Level.NORMAL
_reporter: progress.Reporter | None = None


def set_level(level: Level) -> None:
    global _level
    _level = level
    close()  # the next line chooses again: the display depends on the level


def reporter() -> progress.Reporter:
    """The reporter for this process, chosen on first use (the level and the terminal then)."""
    global _reporter
    if _reporter is None:
        _reporter = progress.choose(live_allowed=_level is Level.NORMAL)
    return _reporter


def close() -> None:
    """Stop the live display, if one runs (the CLI, on its way out; idempotent)."""
    global _reporter
    if _reporter is not None:
        _reporter.close()
        _reporter = None


def level_from_flags(*, quiet: bool = False, verbose: bool = False) -> Level:
    """--quiet wins over --verbose: a script that asked for silence gets it."""
    if quiet:
        return Level.QUIET
    return Level.VERBOSE if verbose else Level.NORMAL


def get_level() -> Level:
    return _level


def shows(level: Level) -> bool:
    return _level >= level


def _shown(text: str) -> str:
    return printable(text, keep_newlines=True)


def result(text: str) -> None:
    reporter().line(_shown(text))


@contextlib.contextmanager
def task(text: str, *, plain: bool = True) -> Iterator[None]:
    """A long step: `text` when it begins (`plain=False`: only on the live display), and its end
    there, done, failed (an exception) or interrupted (Ctrl-C, or what signals.py makes of
    SIGTERM/SIGHUP)."""
    if not shows(Level.NORMAL):
        yield
        return
    shown = reporter()
    handle = shown.begin(_shown(text), plain=plain)
    try:
        yield
    except KeyboardInterrupt:
        shown.end(handle, progress.Outcome.INTERRUPTED)
        raise
    except BaseException:
        shown.end(handle, progress.Outcome.FAILED)
        raise
    shown.end(handle, progress.Outcome.DONE)


def info(text: str) -> None:
    if shows(Level.NORMAL):
        reporter().line(_shown(text))


def detail(text: str) -> None:
    if shows(Level.VERBOSE):
        reporter().line(_shown(text))


def warn(text: str) -> None:
    reporter().line(_shown(text), err=True)


def error(text: str) -> None:
    # An error ends the step that runs: the live display stops first, so the message is not drawn over.
    reporter().failed(_shown(text), "")


def failed(header: str, log: str) -> None:
    """A step failed: `header`, then its whole output (`log`), on stderr; shown at every level."""
    reporter().failed(_shown(header), log)


def stream(data: bytes) -> None:
    if shows(Level.NORMAL):
        reporter().raw(data)


def paused() -> contextlib.AbstractContextManager[None]:
    """While the block runs, a child process writes to the terminal itself (cmd.run without tee
    or capture): the live display steps aside."""
    return reporter().paused()
