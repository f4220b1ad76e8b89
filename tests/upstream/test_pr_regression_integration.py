"""The PR's DeepSpeed-style regression test for real (integration tier): it must FAIL on stock
DeepSpeed (every test of the file) and PASS with the shipped patch, in a real venv, on CPU through
our gloo harness. Venvs are found through the same variables as tests/workload/test_fix_integration.py. Our
runner's logic (default tier) is tests/upstream/test_pr_regression.py.

`make test` runs this file in its side stream (tests/conftest.py SIDE_STREAM_MODULES).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.upstream.pr import regression as pr
from repro.upstream.pr.regression import Variant
from tests.envpython import patching_python

VENVS = [
    pytest.param("MICS_TEST_PYTHON_T21", "0.13.1", id="torch2.1-ds0.13.1"),
    pytest.param("MICS_TEST_PYTHON_T213_DS0196", "0.19.6", id="torch2.13-ds0.19.6"),
]


@pytest.mark.integration
@pytest.mark.parametrize("var,version", VENVS)
def test_regression_test_fails_stock_and_passes_patched(var: str, version: str, tmp_path: Path) -> None:
    python = patching_python(var, version)
    stock = pr.run_variant(python, Variant.STOCK, tmp_path / "stock")
    patched = pr.run_variant(python, Variant.PATCHED, tmp_path / "patched")
    assert stock.deepspeed == patched.deepspeed == version
    assert len(stock.results) == 4, pr.summary([stock, patched])
    assert pr.discriminates(stock, patched) == [], pr.summary([stock, patched])
    # The stock failures are the bug, not a harness problem: torch's placeholder is named.
    comm = [r for r in stock.results if r.test_id.startswith("TestAllGatherCoalesced")]
    assert comm and all("IllegalWork" in r.message for r in comm), [r.message[-300:] for r in comm]
