"""The templates' own words never take the shape of a secret. Every rendered text is scrubbed
before it is handed out, and prose such as "the session: `...`" reads to the scrubber as a
secret-named `name: value` pair: the value was replaced by `<secret>` in PR_DESCRIPTION.md
(a hung session's reason, measured on DeepSpeed master in session 17)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from repro.core.scrub import Scrubber

REPRO = Path(__file__).resolve().parents[2] / "repro"
TEMPLATES = sorted(REPRO.rglob("*.j2"))
# What a template's placeholders are read as: a value of the shape a rendering gives them.
VALUE = "`v4lue with words`"


def prose(template: str) -> str:
    """The template's own text with each `{{ ... }}` as a value and each tag or comment removed."""
    text = re.sub(r"\{\{.*?\}\}", VALUE, template, flags=re.S)
    return re.sub(r"\{%.*?%\}|\{#.*?#\}", "", text, flags=re.S)


def secret_shaped_lines(text: str) -> list[str]:
    scrubbed = Scrubber.secrets(environ={}).text(text)
    return [a for a, b in zip(text.splitlines(), scrubbed.splitlines()) if a != b]


def test_the_templates_are_found() -> None:
    names = {p.name for p in TEMPLATES}
    assert {"PR_DESCRIPTION.md.j2", "ISSUE.md.j2", "REPORT.md.j2", "report.html.j2"} <= names


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(REPRO)))
def test_no_template_words_read_as_a_secret(path: Path) -> None:
    assert secret_shaped_lines(prose(path.read_text())) == []


def test_the_check_finds_prose_shaped_as_a_secret() -> None:
    # The wording PR_DESCRIPTION.md.j2 had: the check must see it.
    assert secret_shaped_lines(prose("(the lab stopped the session: {{ s.stopped | code }})"))
    assert not secret_shaped_lines(prose("(stopped by the lab, which found {{ s.stopped | code }})"))
