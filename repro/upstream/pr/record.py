"""The record `make pr` leaves (pr.json): what was made, from which commit, and who calls the
changed function there. PR_DESCRIPTION.md is rendered from it alone.

`pr-verify PR=dir` reads it back from a folder the user names: `pr_data_problem` takes nothing on
trust (a hand-edited or foreign pr.json is a UsageError naming the key, never a traceback), and
the two commits it holds must be SHAs, since they reach git as revisions."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from repro.upstream.pr.fix import Caller, CallerKind

# pr.json's schema version; a record without it was written before the field existed (the same
# keys as version 1).
FORMAT = 1
_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


@dataclass(frozen=True)
class FileStat:
    path: str
    added: int
    removed: int


@dataclass(frozen=True)
class PrRecord:
    """What `make pr` made; pr.json holds it and PR_DESCRIPTION.md is rendered from it alone."""

    ref: str
    ref_sha: str
    branch: str
    commit: str
    subject: str
    author: str
    fix_id: str
    changed: tuple[str, ...]  # qualnames of the replaced methods
    files: tuple[FileStat, ...]
    test_path: str
    patch_file: str
    swallowed_before: bool  # REF's MiCS handle caught the failed wait (the AVAILABLE point)
    callers: tuple[Caller, ...]
    worktree: str | None  # kept work tree (KEEP=1), else None
    checkout_untouched: bool

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"format": FORMAT, **asdict(self)}
        data["callers"] = [{**asdict(c), "kind": c.kind.value} for c in self.callers]
        return data


_TEXTS = ("ref", "branch", "subject", "author", "fix_id", "test_path", "patch_file")
_FLAGS = ("swallowed_before", "checkout_untouched")
_FILE_KEYS = {"path": str, "added": int, "removed": int}
_CALLER_KEYS = {"path": str, "line": int, "text": str, "kind": str}


def _is(value: Any, kind: type) -> bool:
    # bool is an int to isinstance; a count or line number is not true/false, nor the other way
    return type(value) is kind


def _entries(data: Mapping[str, Any], key: str, keys: Mapping[str, type]) -> str | None:
    items = data[key]
    if not isinstance(items, list):
        return f"`{key}` is {type(items).__name__}, not a list"
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            return f"`{key}[{n}]` is {type(item).__name__}, not an object"
        for name, kind in keys.items():
            if not _is(item.get(name), kind):
                return f"`{key}[{n}].{name}` is missing or not {kind.__name__}"
    return None


def pr_data_problem(data: Any) -> str | None:
    """What is wrong with pr.json's parsed content (None when it is a record `make pr` writes)."""
    if not isinstance(data, dict):
        return f"it holds {type(data).__name__}, not an object"
    version = data.get("format", FORMAT)
    if not (_is(version, int) and version == FORMAT):
        return f"its format is {version!r}; this version of the tool reads format {FORMAT}"
    missing = [f for f in PrRecord.__dataclass_fields__ if f not in data]
    if missing:
        return f"it lacks {', '.join(f'`{m}`' for m in missing)}"
    wrong = [k for k in _TEXTS if not _is(data[k], str)] + [k for k in _FLAGS if not _is(data[k], bool)]
    if data["worktree"] is not None and not _is(data["worktree"], str):
        wrong.append("worktree")
    if wrong:
        return f"{', '.join(f'`{k}`' for k in wrong)} of the wrong type"
    for key in ("ref_sha", "commit"):
        if not (_is(data[key], str) and _SHA.match(data[key])):
            return f"`{key}` is not a full commit SHA: {data[key]!r}"
    changed = data["changed"]
    if not isinstance(changed, list) or not all(_is(c, str) for c in changed):
        return "`changed` is not a list of method names"
    problem = _entries(data, "files", _FILE_KEYS) or _entries(data, "callers", _CALLER_KEYS)
    if problem:
        return problem
    kinds = {k.value for k in CallerKind}
    for n, caller in enumerate(data["callers"]):
        function = caller.get("function")
        if caller["kind"] not in kinds or not (function is None or _is(function, str)):
            return f"`callers[{n}]` has an unknown kind {caller['kind']!r} or a function that is not text"
    return None
