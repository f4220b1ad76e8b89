"""What the repository ships cites only what a user has: itself and public upstream sources.

No path of the machines this lab was built on, no working notes outside the repository (the
background they held is in docs/background.md), and nothing about those machines' own set-up.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("repro", "docker", "env_matrix", "docs", "patches", "README.md", "Makefile", "pyproject.toml")
FORBIDDEN = {
    "working notes outside the repository": re.compile(r"\bFACTS\b"),
    "a path on the build machines": re.compile(r"/work/|\.\./shared\b|/root/"),
    "the build machines' own set-up": re.compile(r"project's machines|capped at \d"),
}


def shipped_files() -> list[Path]:
    files: list[Path] = []
    for name in SHIPPED:
        path = REPO / name
        if path.is_file():
            files.append(path)
        else:
            files += [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return files


def test_shipped_files_cite_nothing_outside_the_repository() -> None:
    found = []
    for path in shipped_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {what}: {line.strip()[:100]}")
    assert found == []


def test_the_background_document_is_there_and_cited() -> None:
    background = REPO / "docs" / "background.md"
    assert background.is_file()
    cited = [
        p
        for p in shipped_files()
        if p != background and "docs/background.md" in p.read_text(errors="replace")
    ]
    assert cited, "nothing points readers at docs/background.md"
