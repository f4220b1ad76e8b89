"""Make switches (DRY_RUN=1, FORCE=1, KEEP=1, ...) are yes/no, and "0" means no.

`make repro DRY_RUN=0` used to start a dry run: the Makefile tested switches for any text at all.
Every switch now goes through one rule (`yes` and SWITCHES in the Makefile), the one the tool
applies to RESUME= (repro/core/flags.py): 1/true/yes/on in any case are yes, 0/false/no/off or
empty are no, and any other value stops make with the switch's name before a recipe runs. Each
switch is found in the Makefile, so a new one is covered without editing this file. make and
/bin/sh are real; PYTHON is a recorder script, so the tool itself never runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAKEFILE = REPO / "Makefile"
OFF = ("0", "no", "false", "off", "NO", "False", " 0 ", "")
ON = ("1", "yes", "true", "on", "TRUE", "On")
NEITHER = ("maybe", "2", "y", "1 0", "off-ish")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")

RECORDER = """#!{python}
import json, sys
with open({log!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


def switches(text: str) -> dict[str, str]:
    """Each switch variable and the CLI flag it turns on: `$(if $(call yes,VAR),--flag)`."""
    found = re.findall(r"\$\(if \$\(call yes,([A-Z][A-Z0-9_]*)\),(--[a-z-]+)\)", text)
    return dict(found)


def targets(text: str) -> list[str]:
    names: list[str] = []
    for line in re.findall(r"^\.PHONY:(.*)$", text, flags=re.M):
        names += line.split()
    # These run pytest, ruff or pip themselves, not `python -m repro`.
    return sorted(set(names) - {"ci-fresh", "venv", "test", "test-unit", "test-fast", "lint"})


@pytest.fixture
def recorder(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "argv.jsonl"
    script = tmp_path / "recorder"
    script.write_text(RECORDER.format(python=sys.executable, log=str(log)))
    script.chmod(0o755)
    return script, log


def argv_of(target: str, script: Path, log: Path, cwd: Path, **values: str) -> list[str]:
    before = log.read_text() if log.exists() else ""
    done = subprocess.run(
        ["make", "-s", "-C", str(REPO), target, f"PYTHON={script}"] + [f"{k}={v}" for k, v in values.items()],
        capture_output=True,
        text=True,
        cwd=cwd,
    )
    assert done.returncode == 0, (target, values, done.stderr)
    calls = log.read_text()[len(before) :].splitlines()
    assert calls, f"make {target} did not reach the tool"
    return list(json.loads(calls[-1]))


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


def test_every_switch_is_off_unless_set_to_a_yes(
    tmp_path: Path, recorder: tuple[Path, Path], real_subprocess: None
) -> None:
    script, log = recorder
    text = MAKEFILE.read_text()
    checked = []
    for variable, flag in sorted(switches(text).items()):
        # The first target that passes this switch on when it is 1.
        target = next(
            (t for t in targets(text) if flag in argv_of(t, script, log, tmp_path, **{variable: "1"})),
            None,
        )
        assert target, f"no make target passes {variable}=1 on as {flag}"
        assert flag not in argv_of(target, script, log, tmp_path), (target, variable, "unset")
        for value in OFF:
            argv = argv_of(target, script, log, tmp_path, **{variable: value})
            assert flag not in argv, (target, f"{variable}={value}", argv)
        for value in ON:
            argv = argv_of(target, script, log, tmp_path, **{variable: value})
            assert flag in argv, (target, f"{variable}={value}", argv)
        checked.append(variable)
    assert len(checked) >= 10, checked


def test_a_switch_that_is_neither_yes_nor_no_stops_make(
    tmp_path: Path, recorder: tuple[Path, Path], real_subprocess: None
) -> None:
    script, log = recorder
    marker = tmp_path / "ran"
    hostile = f"v`touch {marker}.bq`$(touch {marker}.dollar)$(shell touch {marker}.make)"
    for variable in sorted(switches(MAKEFILE.read_text())):
        for value in (*NEITHER, hostile):
            done = subprocess.run(
                ["make", "-s", "-C", str(REPO), "repro", f"PYTHON={script}", f"{variable}={value}"],
                capture_output=True,
                text=True,
                cwd=tmp_path,
            )
            assert done.returncode == 2, (variable, value, done.stderr)
            assert f"{variable}= is neither yes nor no" in done.stderr, done.stderr
            assert f"give {variable}=1 or {variable}=0" in done.stderr, done.stderr
    assert not log.exists(), "make reached the tool with a switch it refused"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ran")) == []


def test_a_switch_from_the_environment_that_is_neither_is_a_no_with_a_warning(
    tmp_path: Path, recorder: tuple[Path, Path], real_subprocess: None
) -> None:
    # A shell may hold NETWORK=host or VERBOSE=2 for another program: make goes on, says so, and
    # the switch stays off. The same text on the command line is refused (test above).
    script, log = recorder
    environ = {**os.environ, "NETWORK": "host", "DRY_RUN": "maybe"}
    done = subprocess.run(
        ["make", "-s", "-C", str(REPO), "repro", f"PYTHON={script}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environ,
    )
    assert done.returncode == 0, done.stderr
    for variable in ("NETWORK", "DRY_RUN"):
        assert f"{variable} in the environment is neither yes nor no: taken as no" in done.stderr
    argv = json.loads(log.read_text().splitlines()[-1])
    assert "--dry-run" not in argv and "--network" not in argv, argv
    environ["DRY_RUN"] = "yes"
    assert "--dry-run" in argv_of_env("repro", script, log, tmp_path, environ)


def argv_of_env(target: str, script: Path, log: Path, cwd: Path, environ: dict[str, str]) -> list[str]:
    before = log.read_text() if log.exists() else ""
    done = subprocess.run(
        ["make", "-s", "-C", str(REPO), target, f"PYTHON={script}"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environ,
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(log.read_text()[len(before) :].splitlines()[-1]))
