"""README and docs/ stay true to the tree: every relative link leads to a file that exists, and
every `make` line they show names targets and variables the Makefile has.

README is the page a newcomer reads first; a stale target there is the first thing they run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAKEFILE = (ROOT / "Makefile").read_text()

# Variables a `make` line may set that the Makefile reads through the environment of the tool
# rather than by name (make passes every command-line variable on to the recipe's environment).
ENVIRONMENT_ONLY = {"MICS_REPRO_CACHE", "MICS_REPRO_PYTHON", "NO_COLOR", "TERM", "HOME", "PATH"}


def _targets() -> set[str]:
    found: set[str] = set()
    for line in MAKEFILE.splitlines():
        m = re.match(r"^([A-Za-z0-9_.%/ -]+):(?!=)", line)
        if m and not line.startswith((".", "\t")):
            found.update(t for t in m.group(1).split() if not t.startswith(("$", ".")))
    return found


def _make_lines(text: str) -> list[str]:
    """Each `make ...` command shown in a code span or block, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    # Code only: fenced blocks and inline code spans (prose says "make" as a verb).
    code = re.findall(r"(?ms)^```[^\n]*\n(.*?)^```", joined) + re.findall(r"`([^`\n]+)`", joined)
    return [m.group(0) for chunk in code for m in re.finditer(r"(?m)(?<![\w/.-])make [^\n`]*", chunk)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_to_files(page: Path) -> None:
    text = page.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.name}: links to missing files: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_make_lines_name_real_targets_and_variables(page: Path) -> None:
    targets = _targets()
    unknown_targets, unknown_vars = set(), set()
    for line in _make_lines(page.read_text()):
        words = line.split()[1:]
        for word in words:
            if word.startswith(("#", "(")):
                break
            m = re.match(r"^([A-Z][A-Z0-9_]*)=", word)
            if m:
                if m.group(1) not in ENVIRONMENT_ONLY and not re.search(rf"\b{m.group(1)}\b", MAKEFILE):
                    unknown_vars.add(m.group(1))
            elif re.match(r"^[a-z][a-z0-9-]*$", word):
                if word not in targets:
                    unknown_targets.add(word)
                break  # only the first bare word is a target in these examples
            else:
                break
    assert not unknown_targets, f"{page.name}: make targets the Makefile lacks: {sorted(unknown_targets)}"
    assert not unknown_vars, f"{page.name}: make variables the Makefile never reads: {sorted(unknown_vars)}"


def test_readme_is_short_and_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in readme, f"README does not link docs/{page.name}"


def test_the_parser_sees_what_it_checks() -> None:
    # The checks above would pass on nothing if the parsers found nothing.
    assert {"repro", "run", "bisect", "survey", "issue", "bundle", "test"} <= _targets()
    lines = _make_lines((ROOT / "README.md").read_text())
    assert any(line.startswith("make run ") and "REQUIREMENTS=" in line for line in lines)
    assert any(line.startswith("make bisect ") for line in lines)
