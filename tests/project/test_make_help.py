"""`make help` (issue #29 item 7): the Makefile's header in whole sentences, then one line for every
target the Makefile defines, read from its rules, so a new target without a help line fails here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = ROOT / "Makefile"
# `a b c: prerequisites` at the start of a line; not `X := ...`, `X ?= ...`, `X = ...`, recipes.
_RULE = re.compile(r"^(?P<targets>[A-Za-z0-9][A-Za-z0-9_. -]*?)\s*:(?![:=])")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def makefile_targets(text: str) -> set[str]:
    found: set[str] = set()
    for line in text.splitlines():
        m = _RULE.match(line)
        if m and not line.startswith("\t"):
            found.update(t for t in m["targets"].split() if not t.startswith("."))
    return found


def make_help() -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "-C", str(ROOT), "help", f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_parser_sees_the_rules() -> None:
    text = "a b: x\n\tcmd: not a rule\nV := y\nW ?= z\n.PHONY: a\nc:\n$(VENV)/x: y\n"
    assert makefile_targets(text) == {"a", "b", "c"}


def test_make_help_lists_every_target_once_and_the_header_whole(real_subprocess: None) -> None:
    targets = makefile_targets(MAKEFILE.read_text())
    # The targets the issue found missing are among those the Makefile defines.
    assert {"run", "survey", "bisect", "issue", "bundle", "shell", "gpu-check", "probe", "cluster"} <= targets
    out = make_help()
    header, _, rest = out.partition("\nTargets")
    block = rest.partition("usage: python -m repro")[0]
    listed = re.findall(r"^  make (\S+) ", block, re.MULTILINE)
    missing = sorted(targets - set(listed))
    assert not missing, f"targets without a line in `make help`: {missing}"
    assert len(listed) == len(set(listed)), "a target is listed twice"
    # The header ends with a whole sentence, not "... is not run when a".
    assert header.strip().endswith(".") and "is not run when a" not in out
    assert "usage: python -m repro" in out  # then the CLI's own help
