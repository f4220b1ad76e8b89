"""Console output of the host side: one place decides what is shown, and on which stream.

- `result`: what a command produced (a table, a JSON figure, "wrote X"): stdout, always shown.
- `step`: a long step begins (a build, a download, a run); `info`: progress; `detail`: only with
  --verbose. All on stdout, so a make log reads in order; --quiet hides them.
- `warn`, `error`: diagnostics on stderr, never hidden.
- `stream`: raw bytes copied from a subprocess or container (the tee of a build log): progress.

Texts are printed as given (callers keep their own `docker:`/`venv:`/`warning:` prefixes, which
tests and users grep for). Every line is flushed at once so that it interleaves correctly with the
output of the subprocesses we start. The level is process-wide: the CLI sets it once from
--quiet/--verbose (`set_level`), tests read and restore it. Streams are looked up at call time, so
pytest's capsys sees everything.
"""

from __future__ import annotations

import enum
import sys


class Level(enum.IntEnum):
    QUIET = 0  # results, warnings and errors only
    NORMAL = 1  # + steps and progress (the default)
    VERBOSE = 2  # + details


_level = Level.NORMAL


def set_level(level: Level) -> None:
    global _level
    _level = level


def level_from_flags(*, quiet: bool = False, verbose: bool = False) -> Level:
    """--quiet wins over --verbose: a script that asked for silence gets it."""
    if quiet:
        return Level.QUIET
    return Level.VERBOSE if verbose else Level.NORMAL


def get_level() -> Level:
    return _level


def shows(level: Level) -> bool:
    return _level >= level


def result(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def step(text: str) -> None:
    if shows(Level.NORMAL):
        print(text, file=sys.stdout, flush=True)


def info(text: str) -> None:
    if shows(Level.NORMAL):
        print(text, file=sys.stdout, flush=True)


def detail(text: str) -> None:
    if shows(Level.VERBOSE):
        print(text, file=sys.stdout, flush=True)


def warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def error(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def stream(data: bytes) -> None:
    if shows(Level.NORMAL):
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
