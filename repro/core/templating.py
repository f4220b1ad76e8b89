"""The one Jinja set-up every rendered text uses (report, issue comment, bundle README, cluster
scripts): strict about undefined names so a renamed field fails loudly instead of printing nothing,
and whitespace rules that keep Markdown tables and shell scripts exactly as written."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import jinja2


def environment(
    folder: Path, *, autoescape: bool = False, filters: Mapping[str, Callable[..., str]] | None = None
) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        autoescape=autoescape,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["fence"] = fence
    env.filters.update(filters or {})
    return env


def fence(text: str) -> str:
    """A Markdown code fence longer than any run of backticks inside `text`."""
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return "`" * max(3, longest + 1)
