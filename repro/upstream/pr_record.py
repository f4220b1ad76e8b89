"""The record `make pr` leaves (pr.json): what was made, from which commit, and who calls the
changed function there. PR_DESCRIPTION.md is rendered from it alone."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from repro.upstream.pr_fix import Caller


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
        data = asdict(self)
        data["callers"] = [{**asdict(c), "kind": c.kind.value} for c in self.callers]
        return data
