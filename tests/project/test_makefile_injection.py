"""Make variables are data: every value reaches the tool as one literal argument.

Each target runs with PYTHON set to a recorder script, so nothing but make and /bin/sh are real;
every variable the Makefile reads from the user gets a value that would run a command if make
(`$(shell ...)`) or the shell (backticks, `$(...)`, quotes, `;`) ever interpreted it. The test
fails if any of those commands ran, or if a value arrived at the tool changed or split.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.fixtures.make_recorder import MAKEFILE, Make, phony_targets, user_variables

# Targets that do not end in `python -m repro` (or run real work even with PYTHON given).
NOT_REPRO = {"ci-fresh", "venv", "test", "test-unit", "lint", "help"}

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def repro_targets(text: str) -> list[str]:
    return [t for t in phony_targets(text) if t not in NOT_REPRO]


def hostile(marker_dir: Path, name: str) -> str:
    m = marker_dir / name
    return (
        f"v`touch {m}.bq`$(touch {m}.dollar)$(shell touch {m}.make)\"'; touch {m}.semi #"
        f'"; touch {m}.dq; $HOME'
    )


def test_the_makefile_reads_the_variables_we_expect() -> None:
    # Guards the discovery below: if it found nothing, the injection test would prove nothing.
    found = user_variables(MAKEFILE.read_text())
    assert {"ENV", "OUT", "BUNDLE", "CMD", "WORKDIR", "CONFIG", "RESULTS", "PRERELEASES"} <= found


def test_every_target_passes_hostile_values_as_literal_arguments(
    tmp_path: Path, real_subprocess: None
) -> None:
    text = MAKEFILE.read_text()
    variables = sorted(user_variables(text) - {"PYTHON", "PYTEST_ARGS", "BOOTSTRAP_PYTHON"})
    markers = tmp_path / "markers"
    markers.mkdir()
    make = Make(tmp_path)
    # Yes/no switches refuse any other value before a recipe runs (tests/project/test_makefile_switches.py
    # sends them hostile values); here they are on, so every flag they add is in the command line.
    switches = set(re.findall(r"\$\(call yes,([A-Z][A-Z0-9_]*)\)", text))
    values = {name: "1" if name in switches else hostile(markers, name) for name in variables}
    targets = repro_targets(text)
    assert "verify-bundle" in targets and "repro" in targets
    for target in targets:
        argv = make.argv(target, values)
        # Every value the target passes on arrives whole and unchanged.
        literal = set(values.values()) - {"1"}
        passed = [a for a in argv if "touch" in a]
        assert all(a in literal for a in passed), (target, passed)
        if target in ("repro", "verify-bundle", "run", "report", "bisect", "cluster"):
            assert passed, f"make {target} passed no value on: {argv}"
    ran = sorted(p.name for p in markers.iterdir())
    assert ran == [], f"hostile values were executed: {ran}"
