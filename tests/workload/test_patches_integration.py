"""The shipped patches on a real install (integration tier): the fix that `repro.workload.fix`
compiles in a dev venv's DeepSpeed is, AST for AST, what the shipped patch makes of the pristine
sdist. The patches against stand-ins and the generator are tests/workload/test_patches.py.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest

from repro.upstream import patchgen
from repro.workload import fix
from tests.envpython import patching_python
from tests.fixtures.deepspeed_sdist import find_method, unpack

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.parametrize(
    "var,version", [("MICS_TEST_PYTHON_T21", "0.13.1"), ("MICS_TEST_PYTHON_T213_DS0196", "0.19.6")]
)
def test_real_install_compiles_the_shipped_patch(var: str, version: str, tmp_path: Path) -> None:
    python = patching_python(var, version)
    out = tmp_path / "fix.json"
    proc = subprocess.run(
        [python, "-m", "repro.workload.fix", "--out", str(out)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["deepspeed"] == version and result["fix_id"] == fix.FIX_ID

    tree = unpack(version, tmp_path / "sdist")
    proc = subprocess.run(
        ["patch", "-p1", "--batch", "-i", str(patchgen.patch_file(version))],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for target in fix.TARGETS:
        expected = find_method((tree / target.path).read_text(), target)
        assert ast.dump(fix.parse_function(result["sources"][target.qualname])) == ast.dump(expected)
