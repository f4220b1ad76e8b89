"""Inventory (issue 19): the env verdict's words are written once, in repro/core/verdict.py, and
every place that prints or stores a verdict takes them (and the decision) from there.

1. No other module or template of the product holds a verdict phrase as text.
2. The places that print or store a verdict do not re-derive it from raw outcome strings: no
   comparison with an outcome's value (`r["outcome"] == "reproduced"`) in them.
3. Each closed set the verdict words cover is covered whole (a new member needs its words).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from repro.core import verdict
from repro.core.verdict import FixVerdict, Reproduces, fix_words, reproduces_words
from repro.workload.record import OUTCOMES

REPO = Path(__file__).resolve().parents[2]
PRODUCT = REPO / "repro"
THE_MODULE = PRODUCT / "core" / "verdict.py"

# Where a verdict is printed or stored: the summary, check-fix (cli), `make run`'s lines, the report,
# the issue comment and bundle, and the probe.
READERS = (
    "repro/run/summary.py",
    "repro/run/usecase.py",
    "repro/cli/run_commands.py",
    "repro/cli/job_commands.py",
    "repro/cli/upstream_commands.py",
    "repro/cli/bisect_commands.py",
    "repro/report/per_env.py",
    "repro/report/cause.py",
    "repro/report/upgrade.py",
    "repro/report/answers.py",
    "repro/upstream/bundle/comment.py",
    "repro/upstream/bundle/make.py",
    "repro/bisect/probe.py",
)


def verdict_phrases() -> list[str]:
    phrases = [reproduces_words(r) for r in Reproduces] + [fix_words(f) for f in FixVerdict]
    phrases.append(verdict.NO_STOCK_RUN_WORDS)
    phrases.append(verdict.TOO_FEW_DEVICES_FIX_WORDS)
    return phrases


# Too common to search as a substring ("no evidence for rocm" explains a refused run): a text holds
# it only when it is the whole text.
WHOLE_ONLY = {"no evidence"}


def string_constants(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


@functools.cache
def product_texts() -> list[tuple[Path, str]]:
    """Every string constant of the product's Python and every template, with where it is."""
    out: list[tuple[Path, str]] = []
    for path in sorted(PRODUCT.rglob("*.py")):
        if path != THE_MODULE:
            out += [(path, text) for text in string_constants(path)]
    for path in sorted(PRODUCT.rglob("*.j2")):
        out.append((path, path.read_text()))
    return out


def test_every_member_has_words() -> None:
    # Each function reads a table keyed by the enum, so a member without words would fail here.
    assert len({reproduces_words(r) for r in Reproduces}) == len(Reproduces)
    assert len({fix_words(f) for f in FixVerdict}) == len(FixVerdict)


@pytest.mark.parametrize("phrase", verdict_phrases())
def test_verdict_words_live_only_in_the_verdict_module(phrase: str) -> None:
    assert phrase in THE_MODULE.read_text()
    places = {
        str(p.relative_to(REPO))
        for p, text in product_texts()
        if (text == phrase if phrase in WHOLE_ONLY else phrase in text)
    }
    elsewhere = sorted(places)
    assert elsewhere == [], f"{phrase!r} is written outside repro/core/verdict.py: {elsewhere}"


def _outcome_comparisons(path: Path) -> list[int]:
    """Lines that compare something with an outcome's value as a string literal."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        literals = [o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)]
        for o in operands:
            if isinstance(o, (ast.Tuple, ast.List, ast.Set)):
                literals += [
                    e.value for e in o.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                ]
        if any(text in OUTCOMES for text in literals):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("reader", READERS)
def test_readers_do_not_rederive_the_verdict_from_outcome_strings(reader: str) -> None:
    path = REPO / reader
    assert path.exists(), reader
    assert _outcome_comparisons(path) == [], f"{reader} compares raw outcome strings"


def test_the_readers_take_the_verdict_from_the_one_module() -> None:
    """Each reader that decides or words a verdict imports it from repro.core.verdict (or from a
    module that re-exports it) instead of computing its own."""
    takers = {
        "repro/run/summary.py": "env_verdicts",
        "repro/run/usecase.py": "check_fix",
        "repro/cli/run_commands.py": "check_fix_outcome",  # the use case's, which raises the verdict's
        "repro/run/job.py": "env_verdicts",
        "repro/report/per_env.py": "env_verdict",
        "repro/upstream/bundle/comment.py": "env_verdicts",
        "repro/bisect/probe.py": "run_finding",
    }
    sources = ("repro.core.verdict", "repro.core.runs", "repro.run.usecase")
    for reader, name in takers.items():
        tree = ast.parse((REPO / reader).read_text())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in sources
            for alias in node.names
        }
        assert name in imported, f"{reader} does not take {name} from the verdict"
