"""The one builder of "the make line that reproduces this": results.json, bisect.json, survey
resume hints, probe rows and bundles all print a line a user can paste into a shell.

Unset values (None, "", False) are left out, so the line names only what was asked for; values
are shell-quoted, which leaves ordinary ids, versions and comma lists (`mics,zero3`) unchanged.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def make_line(target: str, pairs: Iterable[tuple[str, object]] = ()) -> str:
    """`make TARGET VAR=value ...` for the pairs that carry a value, in the order given."""
    parts = [f"make {target}"]
    parts += [f"{var}={shlex.quote(str(value))}" for var, value in pairs if _given(value)]
    return " ".join(parts)


def _given(value: object) -> bool:
    # Not `value in (None, "", False)`: 0 == False, and STEPS=0 must still show in the line.
    return not (value is None or value is False or value == "")
