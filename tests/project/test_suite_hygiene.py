"""The suite's own rules (STYLE.md 15): test modules never import each other (what they share
lives in tests/fixtures/), each lives in its feature's folder (docs/developing.md, "Tests"), and
the tier markers are declared in one place (tests/conftest.py)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_test_module_imports_another() -> None:
    offenders = {}
    for path in sorted(TESTS.glob("*/test_*.py")):
        bad = {m for m in _imported_modules(path) if m.split(".")[-1].startswith("test_")}
        if bad:
            offenders[path.name] = sorted(bad)
    assert not offenders, f"move what these share into tests/fixtures/: {offenders}"


def test_every_test_module_lives_in_a_feature_folder() -> None:
    assert not sorted(p.name for p in TESTS.glob("test_*.py")), "move them into a folder under tests/"
    modules = [p.name for p in TESTS.glob("*/test_*.py")]
    # pytest imports each by its file name (its folder is no package): a name may be used once
    assert len(modules) == len(set(modules)) > 100, sorted(m for m in modules if modules.count(m) > 1)


def test_tiers_are_declared_only_in_conftest() -> None:
    pyproject = (TESTS.parent / "pyproject.toml").read_text()
    makefile = (TESTS.parent / "Makefile").read_text()
    assert "markers = [" not in pyproject
    assert "not integration and not docker" not in makefile
