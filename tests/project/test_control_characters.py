"""Issue #32 item 8: no control character in a value, at either front door.

A newline in a make variable split the recipe line it was pasted into, and the second line ran
(`make -i list MATRIX=$'x\\ntouch /tmp/p #'`). The Makefile now stops, before any recipe, when a
variable it reads from the command line or the environment holds one, naming the variable; the
Python front door (`python -m repro`) refuses the same in any argument. make and /bin/sh are
real here; PYTHON is a recorder script, so the tool itself never runs.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from repro.cli.main import main
from tests.fixtures.make_recorder import MAKEFILE, Make, user_variables

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")

CONTROLS = {
    "newline": "\n",
    "carriage return": "\r",
    "tab": "\t",
    "vertical tab": "\v",
    "form feed": "\f",
    "escape": "\x1b",
    "bell": "\x07",
    "DEL": "\x7f",
    "C1 CSI": "\x9b",
}


def checked_variables(text: str) -> set[str]:
    match = re.search(r"^USER_VARIABLES := ((?:.*\\\n)*.*)$", text, flags=re.M)
    assert match, "the Makefile lists the variables it checks in USER_VARIABLES"
    return set(match.group(1).replace("\\\n", " ").split())


def test_every_variable_the_makefile_reads_is_checked() -> None:
    text = MAKEFILE.read_text()
    missing = user_variables(text) - checked_variables(text)
    assert not missing, f"add to USER_VARIABLES in the Makefile: {sorted(missing)}"
    # read from the recipe's environment by the tool, or used by recipes without a flag
    assert {"RESUME", "PYTHON", "BOOTSTRAP_PYTHON"} <= checked_variables(text)


@needs_make
@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_a_control_character_stops_make_before_any_recipe(
    tmp_path: Path, real_subprocess: None, name: str
) -> None:
    make, marker = Make(tmp_path), tmp_path / "pwned"
    done = make("list", {"MATRIX": f"x{CONTROLS[name]}touch {marker} #"})
    assert done.returncode == 2
    assert b"MATRIX= holds a newline or another control character" in done.stderr
    assert not marker.exists()
    assert make.calls() == []  # not even the first half of the line ran


@needs_make
def test_every_variable_is_checked_on_the_command_line(tmp_path: Path, real_subprocess: None) -> None:
    make, marker = Make(tmp_path), tmp_path / "pwned"
    for name in sorted(checked_variables(MAKEFILE.read_text()) - {"PYTHON"}):
        done = make("list", {name: f"x\ntouch {marker} #"})
        assert done.returncode == 2, name
        assert f"{name}= holds a newline".encode() in done.stderr, name
    assert not marker.exists() and make.calls() == []


@needs_make
def test_the_environment_is_checked_only_for_the_makefiles_variables(
    tmp_path: Path, real_subprocess: None
) -> None:
    make, marker = Make(tmp_path), tmp_path / "pwned"
    done = make("list", {}, env={"CMD": f"x\ntouch {marker} #"})
    assert done.returncode == 2 and b"CMD= holds a newline" in done.stderr
    # multi-line variables the Makefile never reads are the environment's business
    done = make("list", {"MATRIX": "m.toml"}, env={"MY_PROMPT": "line one\nline two\x1b[0m"}, ignore=False)
    assert done.returncode == 0, done.stderr
    assert make.calls() == [["-m", "repro", "list", "--matrix", "m.toml"]]
    assert not marker.exists()


@needs_make
def test_ordinary_text_passes(tmp_path: Path, real_subprocess: None) -> None:
    make = Make(tmp_path)
    value = "héllo wörld ° € 'q' \"d\" $(shell true) `x` a  b"
    done = make("list", {"MATRIX": value}, ignore=False)
    assert done.returncode == 0, done.stderr
    assert make.calls() == [["-m", "repro", "list", "--matrix", value]]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["list", "--matrix", "x\ntouch /tmp/p"], "--matrix"),
        (["list", "--matrix=x\ry"], "--matrix"),
        (["repro", "--dry-run", "--env", "cpu\x1b]0;title\x07"], "--env"),
        (["report", "--results", "r\x9b2J"], "--results"),
    ],
)
def test_python_front_door_refuses_control_characters(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"the value of {option} holds" in err
    assert "\x1b" not in err and "\x9b" not in err and "touch" not in err


def test_probe_refuses_them_with_its_abort_code(capsys: pytest.CaptureFixture[str]) -> None:
    # `git bisect run` must stop, not mark the commit bad or skip it
    assert main(["probe", "--cmd", "python train.py\nrm -rf ~"]) == 128
    assert "the value of --cmd holds a newline" in capsys.readouterr().err
