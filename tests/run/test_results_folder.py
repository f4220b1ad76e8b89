"""The results folder at the front door: a bad OUT= is a clear error, and a build that fails
before any suite ran leaves no results folder and does not move results/latest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from repro.cli import main as cli
from repro.core import results
from repro.core.errors import BuildError, UsageError
from tests.fixtures.stand_in_engine import FailingBuild


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("repro.cli.run_commands._engine", lambda choice: FailingBuild())


def _repro(tmp_path: Path, *extra: str) -> int:
    return cli.main(["repro", "--env", "cpu", "--results-root", str(tmp_path / "results"), *extra])


@pytest.mark.parametrize("kind", ["file", "under-a-file", "unwritable"])
def test_bad_out_is_a_usage_error_not_a_traceback(
    kind: str, tmp_path: Path, failing: None, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    out = {
        "file": a_file,
        "under-a-file": a_file / "out",
        # /proc refuses new folders even to root (chmod would not stop root).
        "unwritable": Path("/proc/mics-repro-out"),
    }[kind]
    assert _repro(tmp_path, "--out", str(out)) == UsageError.exit_code
    err = capsys.readouterr().err
    assert f"OUT={out}" in err and "Traceback" not in err
    assert a_file.read_text() == "mine"


def test_unwritable_results_root_is_a_usage_error(
    tmp_path: Path, failing: None, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "results"
    a_file.write_text("")
    assert _repro(tmp_path) == UsageError.exit_code
    assert f"the results root {a_file}" in capsys.readouterr().err


def test_failed_build_leaves_no_folder_and_keeps_latest(tmp_path: Path, failing: None) -> None:
    root = tmp_path / "results"
    earlier = root / "20260101T000000Z-cpu"
    earlier.mkdir(parents=True)
    results.point_latest(root, earlier)
    assert _repro(tmp_path) == BuildError.exit_code
    assert sorted(p.name for p in root.iterdir()) == sorted([results.LATEST, earlier.name])
    assert os.readlink(root / results.LATEST) == earlier.name


def test_failed_first_build_leaves_no_latest(tmp_path: Path, failing: None) -> None:
    assert _repro(tmp_path) == BuildError.exit_code
    assert list((tmp_path / "results").iterdir()) == []


def test_failed_build_into_out(tmp_path: Path, failing: None) -> None:
    made, given = tmp_path / "new-out", tmp_path / "empty-out"
    given.mkdir()
    assert _repro(tmp_path, "--out", str(made)) == BuildError.exit_code
    assert _repro(tmp_path, "--out", str(given)) == BuildError.exit_code
    assert not made.exists() and given.is_dir() and list(given.iterdir()) == []


def test_out_with_results_is_refused(
    tmp_path: Path, failing: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / results.RESULTS_FILE).write_text("{}")
    assert _repro(tmp_path, "--out", str(out)) == UsageError.exit_code
    assert "already holds results" in capsys.readouterr().err
    assert (out / results.RESULTS_FILE).read_text() == "{}"
