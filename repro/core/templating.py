"""The one Jinja set-up every rendered text uses (report, issue, issue comment, bundle README,
cluster scripts): strict about undefined names so a renamed field fails loudly instead of printing
nothing, whitespace rules that keep Markdown tables and shell scripts exactly as written, and THE
place where a value from a record is escaped for the text it lands in (`Target`).

Values come from records anyone can edit or craft (a commit subject, a scenario name, CMD=, an env
id in a shared results folder). In Markdown pasted into GitHub a raw value could open a tag
(`<script>`, `</details>`), a link (`[x](javascript:...)`), a heading (`# ...` at a line's start),
ping people (`@team`) or close a code fence; in HTML it could open a tag; anywhere, an ESC sequence
or a bidi override makes the text read as something else. So every `{{ value }}` is escaped by the
environment itself (a finalize hook, or autoescape), and a template opts out only through a filter
that made the value safe for its context (`code`, `fence` + `verbatim`, `html`, `md`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from markupsafe import Markup

from repro.core.printable import printable
from repro.workload.closed import assert_never


class Target(enum.Enum):
    """What a template writes, and so how its values are escaped."""

    TEXT = "text"  # shell scripts and files for programs: values as given (their callers quote)
    MARKDOWN = "markdown"  # GitHub-flavoured Markdown (ISSUE.md, REPORT.md, ISSUE_COMMENT.md)
    HTML = "html"  # report.html


Clean = Callable[[str], str]  # applied to every value before it is escaped (e.g. the scrubber)


def _same(text: str) -> str:
    return text


def environment(
    folder: Path,
    *,
    target: Target = Target.TEXT,
    filters: Mapping[str, Callable[..., Any]] | None = None,
    clean: Clean = _same,
) -> jinja2.Environment:
    """`clean` runs on each value before escaping, so what it looks for (a secret, a host path)
    is matched in the value as recorded, not in its escaped form."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        autoescape=target is Target.HTML,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["fence"] = fence
    if target is Target.MARKDOWN:
        env.finalize = lambda value: _md_finalize(value, clean)
        env.filters.update(_markdown_filters(clean))
    elif target is Target.HTML:
        env.finalize = lambda value: _html_finalize(value, clean)
        env.filters["verbatim"] = lambda value: printable(clean(str(value)), keep_newlines=True)
    elif target is Target.TEXT:
        pass
    else:
        assert_never(target)
    env.filters.update(filters or {})
    return env


def fence(text: str) -> str:
    """A Markdown code fence longer than any run of backticks inside `text`."""
    return "`" * max(3, _longest_backticks(str(text)) + 1)


def _longest_backticks(text: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return longest


# ---- Markdown --------------------------------------------------------------------------------

_NEWLINES = re.compile(r"\r\n|[\r\n\u2028\u2029\x85\x0b\x0c]")
# A value placed at a line's start must not start a block: heading, setext underline, list item,
# quote, thematic break, fence.
_BLOCK_START = re.compile(r"^(\s*)([#=+\-*_~]|\d{1,9}(?=[.)](?:\s|$)))")
# `@name` as GitHub reads a mention (not an e-mail address: a word character before the @).
_MENTION = re.compile(r"(?<![\w])@(?=[A-Za-z0-9])")


def one_line(text: str) -> str:
    return _NEWLINES.sub(" ", text)


def md_inline(value: object) -> str:
    """A value as literal inline Markdown text (also safe in a table cell): no HTML, no code span,
    no link or image, no block at a line's start, no mention, no line break, no control or bidi
    character. What it shows reads as the value did."""
    text = printable(one_line(str(value)))
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
    # Entities, not backslashes: `\](javascript:` would still read as a link to a naive scan.
    text = text.replace("[", "&#91;").replace("]", "&#93;")
    text = _BLOCK_START.sub(lambda m: f"{m.group(1)}\\{m.group(2)}", text, count=1)
    # GitHub does not link a mention inside a code span; the name after it stays plain text.
    return _MENTION.sub("`@`", text)


_CODE_SPAN = re.compile(r"(`+)(.+?)\1(?!`)")


def prose(value: object) -> Markup:
    """The tool's own sentences that quote names as code spans (`x`): each span stays a code span
    (its content shown literally), everything between is escaped like any value."""
    text, parts, at = printable(one_line(str(value))), [], 0
    for match in _CODE_SPAN.finditer(text):
        parts += [
            md_inline(text[at : match.start()]) if at < match.start() else "",
            code_span(match.group(2)),
        ]
        at = match.end()
    parts.append(md_inline(text[at:]) if at < len(text) else "")
    return Markup("".join(parts))


def code_span(value: object, *, cell: bool = False) -> Markup:
    """A whole inline code span: its content is shown literally (no HTML, no Markdown, no
    mention), with a fence of backticks longer than any run inside it and no line breaks. In a
    table cell (`cell=True`) a `|` is escaped too: GFM splits cells before it parses code spans."""
    text = printable(one_line(str(value)))
    if cell:
        text = text.replace("|", "\\|")
    ticks = "`" * (_longest_backticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return Markup(f"{ticks}{pad}{text}{pad}{ticks}")


def html_text(value: object) -> Markup:
    """A value inside raw HTML in Markdown (`<summary>...`): HTML-escaped, on one line, and no
    mention (GitHub links mentions in HTML text too, but not inside <code>)."""
    text = printable(one_line(str(value)))
    # Element content, never an attribute: quotes stay as they are (they read better in a stack).
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    # Brackets as entities as in md_inline: inert here, and no `](javascript:` for a scan to find.
    text = text.replace("[", "&#91;").replace("]", "&#93;")
    return Markup(_MENTION.sub("<code>@</code>", text))


def link_target(value: object) -> Markup:
    """A link's destination: http(s) only (a `javascript:` or `data:` URL becomes `#`), and
    percent-encoded so that no `)`, space or `<` can end it early."""
    text = str(value)
    if not re.match(r"https?://", text, re.IGNORECASE):
        return Markup("#")
    return Markup(quote(printable(text), safe=":/#?&=%+,;@!$*'~._-"))


def _md_finalize(value: Any, clean: Clean) -> str:
    if isinstance(value, Markup):  # made safe for its context by a filter
        return str(value)
    return md_inline(clean(str(value)))


def _markdown_filters(clean: Clean) -> dict[str, Callable[..., Any]]:
    return {
        "md": lambda value: Markup(md_inline(clean(str(value)))),
        "code": lambda value, cell=False: code_span(clean(str(value)), cell=cell),
        "html": lambda value: html_text(clean(str(value))),
        "url": lambda value: link_target(clean(str(value))),
        "prose": lambda value: prose(clean(str(value))),
        # The body of a fenced block: shown literally; the template puts `|fence` of the same value
        # around it, longer than any backtick run inside, so the value cannot close it.
        "verbatim": lambda value: Markup(printable(clean(str(value)), keep_newlines=True)),
        "fence": lambda value: Markup(fence(clean(str(value)))),
    }


# ---- HTML ------------------------------------------------------------------------------------


def _html_finalize(value: Any, clean: Clean) -> Any:
    if isinstance(value, Markup):
        return value
    # Autoescape then escapes <, >, & and quotes; here only what HTML escaping leaves alone.
    return printable(clean(str(value)), keep_newlines=True)
