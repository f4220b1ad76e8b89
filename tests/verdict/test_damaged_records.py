"""Issue #32 item 7: damaged input ends in exit 2 with a message naming the file (and the field),
never in a traceback. Every case goes through the front door (repro.cli.main.main with argv), as
`make report`, `make issue`, `make bundle`, `make repro RESUME=1` and `make run RESUME=1` do."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from repro.cli.main import main
from tests.fixtures.report_records import ResultsBuilder, standard_env
from tests.fixtures.stand_in_engine import RefusedEngine

HUGE = 64 * 1024 * 1024 + 1  # one byte over the largest record file the tool reads


def _raw(text: str | bytes) -> Callable[[dict[str, Any]], str | bytes]:
    return lambda _data: text


def _set(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], str]:
    def edit(data: dict[str, Any]) -> str:
        change(data)
        return json.dumps(data)

    return edit


def _huge(path: Path) -> None:
    # Sparse: nothing is written to disk, yet the file is larger than any record may be.
    with open(path, "r+b") as fh:
        fh.truncate(HUGE)


# (damage, what the message must name: any of these)
DAMAGES: dict[str, tuple[Callable[[dict[str, Any]], str | bytes] | None, tuple[str, ...]]] = {
    "invalid-json": (_raw('{"schema": 1, "runs": ['), ("not valid JSON",)),
    "latin-1": (_raw(b'{"schema": 1, "invocation": {"command": "caf\xe9"}}'), ("UTF-8",)),
    "nested-10000": (_raw('{"schema": 1, "runs": ' + "[" * 10000 + "]" * 10000 + "}"), ("nested",)),
    "huge": (None, ("too large",)),
    "runs-a-string": (_set(lambda d: d.update(runs="x")), ("runs",)),
    "run-a-number": (_set(lambda d: d.update(runs=[1])), ("runs[0]", "run #0")),
    "env-id-a-number": (_set(lambda d: d["runs"][0].update(env=5)), ("runs[0].env", "env 5")),
    "envs-a-list": (_set(lambda d: d.update(envs=[])), ("envs",)),
    "invocation-a-string": (_set(lambda d: d.update(invocation="x")), ("invocation",)),
    "env-a-string": (_set(lambda d: d["envs"].update(cpu="x")), ("envs.cpu", "env 'cpu'")),
    "argv-a-number": (_set(lambda d: d["invocation"].update(argv=5)), ("invocation.argv",)),
    "pins-a-list": (_set(lambda d: d["envs"]["cpu"].update(pins=["torch"])), ("pins",)),
    "losses-a-string": (_set(lambda d: d["runs"][0].update(losses="NaN")), ("losses",)),
    "world-size-a-word": (_set(lambda d: d["runs"][0].update(world_size="two")), ("world_size",)),
}


def _results(tmp_path: Path, damage: str) -> Path:
    b = ResultsBuilder(tmp_path / "results", "20250101T000000Z-cpu")
    b.env("cpu")
    standard_env(b, "cpu")
    folder = b.write()
    path = folder / "results.json"
    edit, _ = DAMAGES[damage]
    if edit is None:
        _huge(path)
    else:
        text = edit(json.loads(path.read_text()))
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


@pytest.fixture
def no_execution(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing past reading the records may run: no engine, no Docker."""

    def refused(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the damaged results were used")

    import repro.cli.run_commands as run_commands
    import repro.cli.upstream_commands as upstream
    import repro.run.job as job
    import repro.run.usecase as usecase

    monkeypatch.setattr(upstream, "_docker_client", lambda: object())
    # what the preflight sees before the results folder is opened
    monkeypatch.setattr(run_commands, "_engine", lambda _choice: RefusedEngine())
    monkeypatch.setattr(job, "execute_job", refused)
    monkeypatch.setattr(usecase, "execute", refused)


CONSUMERS: dict[str, Callable[[Path], list[str]]] = {
    "report": lambda f: ["report", "--results", str(f), "--out", str(f.parent / "report")],
    "bundle": lambda f: ["bundle", "--env", "cpu", "--results", str(f), "--out", str(f.parent / "bundle")],
    "repro RESUME=1": lambda f: ["repro", "--resume", "--out", str(f), "--engine", "venv"],
    "run RESUME=1": lambda f: ["run", "--resume", "--out", str(f), "--engine", "venv", "--cmd", "true"],
}


def _front_door(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.mark.usefixtures("no_execution")
@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_results_json_is_a_usage_error_naming_it(
    consumer: str, damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _results(tmp_path, damage)
    code, err = _front_door(CONSUMERS[consumer](folder), capsys)
    assert code == 2, err
    assert str(folder / "results.json") in err
    assert any(word in err for word in DAMAGES[damage][1]), err


# ---- ISSUE.md from a damaged bisect.json ------------------------------------------------------

GOOD_PROBE = {"version": "0.19.3", "outcome": "hung", "signature": "hang", "reason": "r", "verdict": "bad"}
GOOD_WALK: dict[str, Any] = {
    "kind": "bisect",
    "axis": "deepspeed",
    "env": "cpu",
    "scenario": "mics",
    "patch": "stock",
    "status": "found",
    "first_bad": "0.19.3",
    "last_good": "0.19.2",
    "evidence": {"first_bad": GOOD_PROBE, "last_good": {**GOOD_PROBE, "version": "0.19.2"}},
    "probes": [GOOD_PROBE],
    "change_points": [],
    "repro_command": "make repro",
    "unknown_between": [],
}
WALK_DAMAGES: dict[str, tuple[Any, str]] = {
    "invalid-json": (b'{"kind": ', "not valid JSON"),
    "latin-1": (b'{"kind": "b\xe9"}', "UTF-8"),
    "nested-10000": (("[" * 10000 + "]" * 10000).encode(), "nested"),
    "a-list": ([], "the file"),
    "probes-a-string": ({**GOOD_WALK, "probes": "x"}, "probes"),
    "probe-a-number": ({**GOOD_WALK, "probes": [1]}, "probes[0]"),
    "evidence-a-list": ({**GOOD_WALK, "evidence": []}, "evidence"),
    "first-bad-a-number": ({**GOOD_WALK, "evidence": {"first_bad": 5}}, "evidence.first_bad"),
    "outcome-missing": ({**GOOD_WALK, "evidence": {"first_bad": {"version": "1"}}}, "outcome"),
    "commits-a-number": ({**GOOD_WALK, "commits": 5}, "commits"),
    "subject-a-number": ({**GOOD_WALK, "first_bad_commit": {"short": "a", "subject": 5}}, "subject"),
    "change-points-a-string": ({**GOOD_WALK, "change_points": "x"}, "change_points"),
}


@pytest.mark.parametrize("damage", sorted(WALK_DAMAGES))
def test_a_damaged_bisect_json_is_a_usage_error_naming_it(
    damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text("{}")
    content, field = WALK_DAMAGES[damage]
    path = tmp_path / "bisect.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    code, err = _front_door(["issue", "--results", str(tmp_path)], capsys)
    assert code == 2, err
    assert str(path) in err and field in err, err


def test_a_first_bad_without_a_signature_still_makes_an_issue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The issue's facts are a typed model with defaults (repro/upstream/issue/facts.py): a field
    # ISSUE.md can do without is no reason to refuse the folder.
    (tmp_path / "results.json").write_text("{}")
    walk = {**GOOD_WALK, "evidence": {"first_bad": {"version": "1", "outcome": "x"}}}
    (tmp_path / "bisect.json").write_text(json.dumps(walk))
    code, err = _front_door(["issue", "--results", str(tmp_path)], capsys)
    assert code == 0, err
    assert (tmp_path / "ISSUE.md").is_file() and "Traceback" not in err


def test_the_good_bisect_json_of_these_cases_makes_an_issue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "bisect.json").write_text(json.dumps(GOOD_WALK))
    code, _ = _front_door(["issue", "--results", str(tmp_path)], capsys)
    assert code == 0 and "0.19.3" in (tmp_path / "ISSUE.md").read_text()


# ---- OUT=, results/latest, PACKAGES=, REQUIREMENTS= -----------------------------------------------


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("the user's own notes\n")
    return path


def _walk_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "walk"
    folder.mkdir()
    (folder / "results.json").write_text("{}")
    (folder / "bisect.json").write_text(json.dumps(GOOD_WALK))
    return folder


# OUT= of `make issue` names the file it writes: an existing file there is written (the user's
# choice; not this item), a file in place of its folder is not.
OUT_CASES = [(c, w) for c in ("issue", "report", "bundle", "gpu-check") for w in ("a file", "under a file")]


@pytest.mark.usefixtures("no_execution")
@pytest.mark.parametrize(("command", "where"), [c for c in OUT_CASES if c != ("issue", "a file")])
def test_out_that_cannot_be_written_is_a_usage_error(
    command: str, where: str, tmp_path: Path, a_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = a_file if where == "a file" else a_file / "sub" / "x"
    if command == "issue":
        argv = ["issue", "--results", str(_walk_folder(tmp_path))]
    elif command == "gpu-check":
        argv = ["gpu-check", "--env", "cpu"]
    else:
        folder = _results_ok(tmp_path)
        argv = [command, "--results", str(folder)] + (["--env", "cpu"] if command == "bundle" else [])
    code, err = _front_door([*argv, "--out", str(out)], capsys)
    assert code == 2, err
    assert str(a_file) in err
    assert a_file.read_text() == "the user's own notes\n"  # the file in the way is left as it was


def _results_ok(tmp_path: Path) -> Path:
    b = ResultsBuilder(tmp_path / "results", "20250101T000000Z-cpu")
    b.env("cpu")
    standard_env(b, "cpu")
    return b.write()


def test_issue_out_a_folder_or_in_a_missing_folder_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    walk = _walk_folder(tmp_path)
    for out in (tmp_path, tmp_path / "new" / "deeper" / "ISSUE.md"):
        code, err = _front_door(["issue", "--results", str(walk), "--out", str(out)], capsys)
        assert code == 2 and str(tmp_path) in err


@pytest.mark.usefixtures("no_execution")
@pytest.mark.parametrize("resume", [False, True])
def test_results_latest_that_is_a_folder_is_refused_and_kept(
    resume: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "results"
    mine = root / "latest" / "mine.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("kept")
    argv = ["run", "--results-root", str(root), "--engine", "venv", "--cmd", "true"]
    code, err = _front_door(argv + (["--resume"] if resume else []), capsys)
    assert code == 2 and "latest" in err and "not the link" in err
    assert mine.read_text() == "kept" and sorted(os.listdir(root)) == ["latest"]  # nothing made


@pytest.mark.usefixtures("no_execution")
def test_packages_with_an_open_quote_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "--results-root", str(tmp_path), "--engine", "venv", "--cmd", "true", "--packages", "'six"]
    code, err = _front_door(argv, capsys)
    assert code == 2 and "PACKAGES='six" in err and "quotation" in err


@pytest.mark.usefixtures("no_execution")
def test_requirements_not_utf8_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "requirements.txt"
    req.write_bytes(b"six==1.16.0  # caf\xe9\n")
    argv = ["run", "--results-root", str(tmp_path / "r"), "--engine", "venv", "--cmd", "true"]
    code, err = _front_door([*argv, "--requirements", str(req)], capsys)
    assert code == 2 and str(req) in err and "UTF-8" in err
