"""The PR's DeepSpeed-style regression test: our runner's logic (fast tier). The real thing (it
must FAIL on stock DeepSpeed and PASS with the shipped patch, in a real venv) is
tests/upstream/test_pr_regression_integration.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from repro.upstream.pr import regression as pr
from repro.upstream.pr.regression import CaseResult, Outcome, Variant, VariantRun

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="unit.runtime.zero.test_mics_coalesced_wait.TestAllGatherCoalesced"
          name="test_gathers_every_tensor[True]" time="1.0">
  <failure message="2 of 2 ranks failed: RuntimeError: Illegal to call wait on IllegalWork object">x</failure>
</testcase>
<testcase classname="unit.runtime.zero.test_mics_coalesced_wait.TestMiCSFlatAllGather"
          name="test_failed_wait_is_raised" time="1.0"/>
<testcase classname="unit.runtime.zero.test_mics_coalesced_wait.TestMiCSFlatAllGather"
          name="test_gather_waits_for_real_work" time="0.1"><skipped message="no MiCS"/></testcase>
</testsuite></testsuites>"""


def _run(variant: Variant, **outcomes: Outcome) -> VariantRun:
    return VariantRun(variant, "0.13.1", 0, tuple(CaseResult(k, v, "") for k, v in outcomes.items()))


def test_parse_junit_reads_each_outcome() -> None:
    results = {r.test_id: r for r in pr.parse_junit(JUNIT)}
    assert results["TestAllGatherCoalesced::test_gathers_every_tensor[True]"].outcome is Outcome.FAILED
    assert "IllegalWork" in results["TestAllGatherCoalesced::test_gathers_every_tensor[True]"].message
    assert results["TestMiCSFlatAllGather::test_failed_wait_is_raised"].outcome is Outcome.PASSED
    assert results["TestMiCSFlatAllGather::test_gather_waits_for_real_work"].outcome is Outcome.SKIPPED


def test_parse_junit_reads_the_element_text_when_pytest_shortened_the_message() -> None:
    # pytest >= 9.2 keeps only the first lines of a long failure in the `message` attribute.
    xml = """<testsuites><testsuite><testcase classname="t.TestAllGatherCoalesced" name="x">
<failure message="2 of 2 ranks failed:&#10;[+26 more lines; full report in element text]">2 of 2 ranks failed:
--- rank 0 ---
RuntimeError: Illegal to call wait on IllegalWork object</failure></testcase></testsuite></testsuites>"""
    (result,) = pr.parse_junit(xml)
    assert result.outcome is Outcome.FAILED and "IllegalWork" in result.message


def test_discriminates_only_when_stock_fails_and_patched_passes() -> None:
    good = pr.discriminates(
        _run(Variant.STOCK, a=Outcome.FAILED, b=Outcome.FAILED),
        _run(Variant.PATCHED, a=Outcome.PASSED, b=Outcome.PASSED),
    )
    assert good == []
    passing_stock = pr.discriminates(
        _run(Variant.STOCK, a=Outcome.FAILED, b=Outcome.PASSED),
        _run(Variant.PATCHED, a=Outcome.PASSED, b=Outcome.PASSED),
    )
    assert passing_stock == ["stock: b passed, expected failed"]
    skipped = pr.discriminates(
        _run(Variant.STOCK, a=Outcome.SKIPPED), _run(Variant.PATCHED, a=Outcome.SKIPPED)
    )
    assert len(skipped) == 2
    missing = pr.discriminates(_run(Variant.STOCK, a=Outcome.FAILED), _run(Variant.PATCHED))
    assert any("no test" in p for p in missing) and any("different tests" in p for p in missing)


def test_summary_has_a_row_per_test_and_a_column_per_variant() -> None:
    text = pr.summary([_run(Variant.STOCK, a=Outcome.FAILED), _run(Variant.PATCHED, a=Outcome.PASSED)])
    header, row = text.splitlines()
    assert header.split() == ["test", "stock", "patched"] and row.split() == ["a", "failed", "passed"]


def test_the_pr_test_file_is_deepspeed_style() -> None:
    """DeepSpeed's layout and conventions: unit.common.DistributedTest with a world_size, license header."""
    source = pr.TEST_FILE.read_text()
    assert pr.TEST_FILE.relative_to(pr.PR_DIR).parts[:4] == ("tests", "unit", "runtime", "zero")
    assert source.startswith("# Copyright (c) Microsoft Corporation.\n# SPDX-License-Identifier: Apache-2.0")
    tree = ast.parse(source)
    imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "unit.common" in imports and not any((m or "").startswith("repro") for m in imports)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")]
    assert classes
    for cls in classes:
        assert [b.id for b in cls.bases if isinstance(b, ast.Name)] == ["DistributedTest"]
        sizes = [
            s
            for s in cls.body
            if isinstance(s, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "world_size" for t in s.targets)
        ]
        assert sizes, f"{cls.name} sets no world_size"


def test_patched_copy_applies_the_patch_to_a_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "site" / "deepspeed"
    (package / "comm").mkdir(parents=True)
    (package / "comm" / "torch.py").write_text("x = 1\n")
    patch = tmp_path / "fix.patch"
    patch.write_text(
        "--- a/deepspeed/comm/torch.py\n+++ b/deepspeed/comm/torch.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    )
    calls: list[tuple[list[str], Path | None]] = []

    def fake_run(argv: list[str], **kw: object) -> object:
        calls.append((list(argv), kw.get("cwd")))  # type: ignore[arg-type]
        target = Path(str(kw["cwd"])) / "deepspeed" / "comm" / "torch.py"
        target.write_text("x = 2\n")
        return pr.cmd.CmdResult(tuple(argv), 0)

    monkeypatch.setattr(pr.cmd, "run", fake_run)
    monkeypatch.setattr(pr.shutil, "which", lambda name: "/usr/bin/patch")
    dest = pr.patched_copy(package, patch, tmp_path / "work")
    assert (dest / "deepspeed" / "comm" / "torch.py").read_text() == "x = 2\n"
    assert (package / "comm" / "torch.py").read_text() == "x = 1\n", "the installed package must not change"
    assert calls[0][0][:2] == ["patch", "-p1"] and calls[0][1] == dest


def test_patch_for_names_the_shipped_patches() -> None:
    assert pr.patch_for("0.13.1").name == "deepspeed-0.13.1.patch"
    with pytest.raises(pr.RunError, match="no patch for DeepSpeed 9.9.9"):
        pr.patch_for("9.9.9")
