"""Make switches (DRY_RUN=1, FORCE=1, KEEP=1, ...) are yes/no, and "0" means no.

`make repro DRY_RUN=0` used to start a dry run: the Makefile tested switches for any text at all.
Every switch now goes through one rule (`yes` and SWITCHES in the Makefile), the one the tool
applies to RESUME= (repro/core/flags.py): 1/true/yes/on in any case are yes, 0/false/no/off or
empty are no, and any other value stops make with the switch's name before a recipe runs. Each
switch is found in the Makefile, so a new one is covered without editing this file. make and
/bin/sh are real; PYTHON is a recorder script, so the tool itself never runs.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.fixtures.make_recorder import MAKEFILE, Make, phony_targets

OFF = ("0", "no", "false", "off", "NO", "False", " 0 ", "")
ON = ("1", "yes", "true", "on", "TRUE", "On")
NEITHER = ("maybe", "2", "y", "1 0", "off-ish")
# These run pytest, ruff or pip themselves, not `python -m repro`.
NOT_REPRO = {"ci-fresh", "venv", "test", "test-unit", "test-fast", "lint"}

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def switches(text: str) -> dict[str, str]:
    """Each switch variable and the CLI flag it turns on: `$(if $(call yes,VAR),--flag)`."""
    found = re.findall(r"\$\(if \$\(call yes,([A-Z][A-Z0-9_]*)\),(--[a-z-]+)\)", text)
    return dict(found)


def test_the_makefile_has_the_switches_we_expect() -> None:
    # Guards the discovery below, and that no switch is still tested for "any text".
    text = MAKEFILE.read_text()
    found = switches(text)
    assert {"DRY_RUN": "--dry-run", "FORCE": "--force", "QUIET": "--quiet", "KEEP": "--keep"}.items() <= (
        found.items()
    )
    match = re.search(r"^SWITCHES := ((?:.*\\\n)*.*)$", text, flags=re.M)
    assert match, "the Makefile lists its yes/no variables in SWITCHES"
    listed = set(match.group(1).replace("\\\n", " ").split())
    assert set(found) == listed, "SWITCHES (checked yes/no) and the switches the targets read differ"
    truthy_text = re.findall(r"\$\(if \$\(value ([A-Z][A-Z0-9_]*)\),--[a-z-]+\)", text)
    assert truthy_text == [], f"switches that any value turns on (use $(call yes,...)): {truthy_text}"


def test_every_switch_is_off_unless_set_to_a_yes(tmp_path: Path, real_subprocess: None) -> None:
    make = Make(tmp_path)
    text = MAKEFILE.read_text()
    found = switches(text)
    # Each target once with every switch on: which flags it passes on.
    passed = {t: make.argv(t, dict.fromkeys(found, "1")) for t in phony_targets(text) if t not in NOT_REPRO}
    checked = []
    for variable, flag in sorted(found.items()):
        # The first target that passes this switch on when it is 1.
        target = next((t for t, argv in passed.items() if flag in argv), None)
        assert target, f"no make target passes {variable}=1 on as {flag}"
        assert flag not in make.argv(target, {}), (target, variable, "unset")
        for value in OFF:
            argv = make.argv(target, {variable: value})
            assert flag not in argv, (target, f"{variable}={value}", argv)
        for value in ON:
            argv = make.argv(target, {variable: value})
            assert flag in argv, (target, f"{variable}={value}", argv)
        checked.append(variable)
    assert len(checked) >= 10, checked


def test_a_switch_that_is_neither_yes_nor_no_stops_make(tmp_path: Path, real_subprocess: None) -> None:
    make = Make(tmp_path)
    marker = tmp_path / "ran"
    hostile = f"v`touch {marker}.bq`$(touch {marker}.dollar)$(shell touch {marker}.make)"
    for variable in sorted(switches(MAKEFILE.read_text())):
        for value in (*NEITHER, hostile):
            done = make("repro", {variable: value}, ignore=False)
            stderr = done.stderr.decode()
            assert done.returncode == 2, (variable, value, stderr)
            assert f"{variable}= is neither yes nor no" in stderr, stderr
            assert f"give {variable}=1 or {variable}=0" in stderr, stderr
    assert make.calls() == [], "make reached the tool with a switch it refused"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ran")) == []


def test_a_switch_from_the_environment_that_is_neither_is_a_no_with_a_warning(
    tmp_path: Path, real_subprocess: None
) -> None:
    # A shell may hold NETWORK=host or VERBOSE=2 for another program: make goes on, says so, and
    # the switch stays off. The same text on the command line is refused (test above).
    make = Make(tmp_path)
    environ = {"NETWORK": "host", "DRY_RUN": "maybe"}
    done = make("repro", {}, env=environ, ignore=False)
    assert done.returncode == 0, done.stderr
    for variable in ("NETWORK", "DRY_RUN"):
        assert f"{variable} in the environment is neither yes nor no: taken as no".encode() in done.stderr
    argv = make.calls()[-1]
    assert "--dry-run" not in argv and "--network" not in argv, argv
    assert "--dry-run" in make.argv("repro", {}, env={**environ, "DRY_RUN": "yes"})
