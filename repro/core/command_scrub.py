"""Secrets in a command line, found in its words before it is quoted (again).

A command line reaches the texts the lab hands out already shell-quoted, often twice: `make run
CMD='python t.py --password '"'"'a b'"'"''` is what `make_line` records for `--password 'a b'`.
A pattern over that text sees `'"'"'`, not the value. So a command line is split into its words
(shlex) first, each word's secret value is found by its shape (secret_shapes.argv_secret_spans,
VALUE_PATTERNS for token shapes and URL credentials), replaced, and only then is the line quoted
again. A word that is itself a command line (the value of `CMD=`, the argument of `--cmd` or
`bash -c`) is split and scrubbed the same way, at any depth.

`secret_values` gives the values found, so that every text rendered from the same records can also
replace each of them wherever it appears, whatever quoting or escaping surrounds it (`renderings`).
"""

from __future__ import annotations

import html
import json
import re
import shlex
from collections.abc import Iterator, Sequence
from typing import Any

from repro.core.makeline import shell_word
from repro.core.secret_shapes import VALUE_PATTERNS, argv_secret_spans

PLACEHOLDER = "<secret>"
ARGV, LINE = "argv", "line"
# Record keys whose strings are command lines (results.json's invocation.command and .argv, a job's
# command, bisect/survey lines, a bundle manifest's commands, ISSUE.md's reproduce lines).
_COMMAND_KEY = re.compile(
    r"(?:^|_)(?:commands?|cmd|argv|make|pip|lines|reproduce|resume|try|container|bundle_steps)$"
)
# Options whose argument is a whole command line (`make run`'s --cmd, `bash -c`), split in turn:
# `--cmd "PASSWORD='a b' python t.py"` is an assignment and a program, not one secret value.
COMMAND_OPTIONS = frozenset({"--cmd", "--command", "-c"})
# A nested command line is split at most this deep (CMD= inside a make line inside a manifest).
_MAX_DEPTH = 4
# URL credentials and `key: value` secrets are `user:password`: the password alone is a value too.
_USER_PASSWORD = re.compile(r"[^:\s]+:(?P<password>.+)", re.DOTALL)
# The user name right before a password that follows a colon (`-u alice:pw`, `--user=alice:pw`).
_USER_BEFORE = re.compile(r"(?<![^=\s])(?:-[uU])?[^=\s:]+:$")


def command_kind(key: object) -> str | None:
    """ARGV when a record's key holds an argv list, LINE when it holds a command line (or lines,
    or a mapping of them), else None."""
    if not isinstance(key, str):
        return None
    if key.lower() == ARGV:
        return ARGV
    return LINE if _COMMAND_KEY.search(key.lower()) is not None else None


def scrub_argv(argv: Sequence[str], depth: int = 0) -> tuple[list[str], set[str]]:
    """`argv` with every secret value replaced by PLACEHOLDER, and the values replaced."""
    out, found = list(argv), set()
    spans = [s for s in argv_secret_spans(argv) if not (s[0] and argv[s[0] - 1] in COMMAND_OPTIONS)]
    for index, start, end in reversed(spans):
        found.add(out[index][start:end])
        if (user := _USER_BEFORE.search(out[index], 0, start)) is not None:
            found.add(out[index][user.start() : end])  # `alice:pw` whole: its password may be short
        out[index] = out[index][:start] + PLACEHOLDER + out[index][end:]
    replaced = {index for index, _, _ in spans}
    for index, word in enumerate(out):
        if index in replaced:
            continue
        nested, secrets = _scrub_nested(word, depth)
        out[index] = nested
        found |= secrets
    for word in argv:  # token shapes and URL credentials, wherever they sit in a word
        found |= set(_shape_values(word))
    return out, found


def scrub_line(line: str, depth: int = 0) -> tuple[str, set[str]]:
    """`line` with its secrets replaced and quoted again, and the values replaced. A line with
    nothing to replace is returned as it is (its own quoting, `"$PWD/out"`, kept)."""
    try:
        words = shlex.split(line)
    except ValueError:  # an unbalanced quote: no words to find values in; the text patterns still run
        return line, set(_shape_values(line))
    scrubbed, found = scrub_argv(words, depth)
    if scrubbed == words:
        return line, found
    return " ".join(shell_word(w) for w in scrubbed), found


def secret_values(value: Any, kind: str | None = None) -> set[str]:
    """The secret values of every command line in a JSON-like record (see `command_kind`)."""
    found: set[str] = set()
    if isinstance(value, str) and kind is not None:
        found |= scrub_line(value)[1]
    elif isinstance(value, list):
        if kind == ARGV and all(isinstance(v, str) for v in value):
            found |= scrub_argv(value)[1]  # `--password` and its value are two items
        for item in value:
            found |= secret_values(item, LINE if kind is not None else None)
    elif isinstance(value, dict):
        for key, item in value.items():
            found |= secret_values(item, command_kind(key) or (LINE if kind is not None else None))
    return found


def renderings(value: str) -> set[str]:
    """How `value` may appear in a text rendered from a record: as is, JSON-escaped, HTML-escaped,
    or inside a shell word that was single-quoted again (`'"'"'`, `'\\''`)."""
    shell = {value, value.replace("'", "'\"'\"'"), value.replace("'", "'\\''")}
    out = set(shell)
    for form in shell:
        out |= {json.dumps(form)[1:-1], html.escape(form), html.escape(form, quote=False)}
    return out


def _scrub_nested(word: str, depth: int) -> tuple[str, set[str]]:
    """A word that is a command line itself (`CMD=python t.py --password x`, `bash -c "..."`)."""
    if depth >= _MAX_DEPTH or not any(c.isspace() for c in word):
        return word, set()
    name, eq, rest = word.partition("=")
    if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        scrubbed, found = scrub_line(rest, depth + 1)
        return f"{name}={scrubbed}", found
    return scrub_line(word, depth + 1)


def _shape_values(text: str) -> Iterator[str]:
    for pattern in VALUE_PATTERNS:
        for start, end in pattern.found(text):
            value = text[start:end]
            yield value
            if (pair := _USER_PASSWORD.fullmatch(value)) is not None:
                yield pair.group("password")
