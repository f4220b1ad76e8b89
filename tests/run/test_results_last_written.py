"""`make report` (and `make issue`) without RESULTS= take the folder the last command wrote, OUT=
or not, and say which folder that is (issue #44: a survey written with OUT=/elsewhere was not what
`make report` reported)."""

from __future__ import annotations

from pathlib import Path

from repro.core.results import RESULTS_FILE, note_written, point_latest, resolve_results_dir


def _results(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / RESULTS_FILE).write_text("{}")
    return folder


def test_the_folder_written_with_out_is_reported_and_named(tmp_path: Path) -> None:
    root = tmp_path / "results"
    older = _results(root / "20261204T000000Z-cpu")
    point_latest(root, older)
    note_written(root, older)
    survey = _results(tmp_path / "elsewhere" / "survey")
    note_written(root, survey)  # `make survey OUT=elsewhere/survey`: results/latest stays
    said: list[str] = []
    assert resolve_results_dir(root, None, said.append) == survey.resolve()
    words = "the folder the last command wrote"
    assert said == [f"results: {survey.resolve()}, {words} (results/latest is {older.resolve()})"]


def test_results_given_elsewhere_says_which_folder_the_last_command_wrote(tmp_path: Path) -> None:
    root = tmp_path / "results"
    newest = _results(root / "new")
    point_latest(root, newest)
    note_written(root, newest)
    old = _results(tmp_path / "old")
    said: list[str] = []
    assert resolve_results_dir(root, str(old), said.append) == old.resolve()
    assert said == [f"results: {old.resolve()} (RESULTS=; the last command wrote {newest.resolve()})"]
    said.clear()
    assert resolve_results_dir(root, None, said.append) == newest.resolve() and said == []


def test_a_written_folder_that_is_gone_falls_back_to_latest(tmp_path: Path) -> None:
    root = tmp_path / "results"
    latest = _results(root / "a")
    point_latest(root, latest)
    note_written(root, tmp_path / "removed-since")
    assert resolve_results_dir(root, None) == latest.resolve()


def test_someones_file_of_that_name_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "results"
    root.mkdir()
    (root / ".last-written").write_text("mine")
    note_written(root, _results(tmp_path / "x"))
    assert (root / ".last-written").read_text() == "mine"
