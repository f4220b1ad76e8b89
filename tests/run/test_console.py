"""repro.core.console: what each level shows, and on which stream."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from repro.core import console
from repro.core.console import Level


@pytest.fixture(autouse=True)
def restore_level() -> Iterator[None]:
    before = console.get_level()
    yield
    console.set_level(before)


def emit_all() -> None:
    console.result("R")
    console.info("I")
    console.detail("D")
    console.warn("W")
    console.error("E")
    console.stream(b"B\n")


@pytest.mark.parametrize(
    ("level", "out", "err"),
    [
        (Level.QUIET, "R\n", "W\nE\n"),
        (Level.NORMAL, "R\nI\nB\n", "W\nE\n"),
        (Level.VERBOSE, "R\nI\nD\nB\n", "W\nE\n"),
    ],
)
def test_each_level_shows_its_lines_on_the_right_stream(
    level: Level, out: str, err: str, capsys: pytest.CaptureFixture[str]
) -> None:
    console.set_level(level)
    emit_all()
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (out, err)


@pytest.mark.parametrize(
    ("quiet", "verbose", "level"),
    [
        (False, False, Level.NORMAL),
        (True, False, Level.QUIET),
        (False, True, Level.VERBOSE),
        (True, True, Level.QUIET),
    ],
)
def test_flags_map_to_levels_and_quiet_wins(quiet: bool, verbose: bool, level: Level) -> None:
    assert console.level_from_flags(quiet=quiet, verbose=verbose) is level


def test_the_default_is_normal() -> None:
    assert console.get_level() is Level.NORMAL


def test_quiet_flag_keeps_results(capsys: pytest.CaptureFixture[str]) -> None:
    # `list` prints its table as results; a dry run's plan is a result too. --quiet must keep them.
    from repro.cli.main import main

    assert main(["--quiet", "list"]) == 0
    out = capsys.readouterr().out
    assert "cpu" in out and "platform" in out
    assert console.get_level() is console.Level.QUIET
    assert main(["list"]) == 0  # the next invocation is back at the default level
    assert console.get_level() is console.Level.NORMAL
