"""The one builder of "the make line that reproduces this": results.json, bisect.json, survey
resume hints, probe rows and bundles all print a line a user can paste into a shell.

Unset values (None, "", False) are left out, so the line names only what was asked for; values
are shell-quoted, which leaves ordinary ids, versions and comma lists (`mics,zero3`) unchanged.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

# What may stand unquoted before the `=` of a word: a variable (`CMD=`) or an option (`--token=`).
_ASSIGNED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|--?[A-Za-z][A-Za-z0-9_-]*")


def make_line(target: str, pairs: Iterable[tuple[str, object]] = ()) -> str:
    """`make TARGET VAR=value ...` for the pairs that carry a value, in the order given."""
    parts = [f"make {target}"]
    parts += [f"{var}={shlex.quote(str(value))}" for var, value in pairs if _given(value)]
    return " ".join(parts)


def shell_word(word: str) -> str:
    """One word of a shell line, quoted; `NAME=value` as `NAME='...'` (how a make line and an
    environment assignment are written; `--opt='...'` alike), so a line split and quoted again
    reads as it was made."""
    name, eq, value = word.partition("=")
    if eq and _ASSIGNED_NAME.fullmatch(name):
        return f"{name}={shlex.quote(value)}"
    return shlex.quote(word)


def _given(value: object) -> bool:
    # Not `value in (None, "", False)`: 0 == False, and STEPS=0 must still show in the line.
    return not (value is None or value is False or value == "")
