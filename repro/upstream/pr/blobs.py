"""The bytes `make pr` commits: staged exactly as written, and checked in the commit afterwards.

The files are staged as blobs of their bytes (`git hash-object --no-filters` + `update-index
--cacheinfo`), not with `git add`, so no attribute of the clone (a filter, `ident`, `eol`,
`working-tree-encoding`) can change what is committed. After the commit each file's blob id and
mode in the new commit are compared with the id git gives those bytes (computed here, with the
repository's hash), and the commit must change no other path: a mismatch is refused before the
branch exists, so no branch ever holds other bytes than the fix's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from repro.core.errors import UsageError
from repro.upstream.pr.git import Checkout


@dataclass(frozen=True)
class Wanted:
    data: bytes
    executable: bool

    @property
    def mode(self) -> str:
        return "100755" if self.executable else "100644"


def blob_id(data: bytes, object_id_length: int) -> str:
    """The object id git gives a blob of `data` (SHA-1 repositories: 40 hex digits, SHA-256: 64)."""
    algorithm = hashlib.sha256 if object_id_length == 64 else hashlib.sha1
    return algorithm(b"blob %d\0" % len(data) + data).hexdigest()


def stage(checkout: Checkout, worktree: Path, wanted: Mapping[str, Wanted]) -> None:
    """Put each file's bytes, as they are in the work tree, into the index."""
    for path, want in wanted.items():
        oid = checkout.git(
            "hash-object", "-w", "--no-filters", "--", path, cwd=worktree, what="git hash-object"
        ).strip()
        checkout.git(
            "update-index", "--add", "--cacheinfo", f"{want.mode},{oid},{path}",
            cwd=worktree, what="git update-index",
        )  # fmt: skip


def check_committed(
    checkout: Checkout, worktree: Path, parent: str, commit: str, wanted: Mapping[str, Wanted]
) -> None:
    """Refuse a commit whose files are not exactly `wanted` (ids, modes, and no other path)."""
    listed = checkout.git("ls-tree", "-z", commit, "--", *wanted, cwd=worktree, what="git ls-tree")
    found: dict[str, tuple[str, str]] = {}
    for entry in filter(None, listed.split("\0")):
        meta, _, path = entry.partition("\t")
        mode, _, oid = meta.split(" ", 2)
        found[path] = (mode, oid)
    changed = checkout.git(
        "diff-tree", "-r", "-z", "--no-renames", "--name-only", parent, commit,
        cwd=worktree, what="git diff-tree",
    )  # fmt: skip
    wrong = sorted(
        p for p, want in wanted.items() if found.get(p) != (want.mode, blob_id(want.data, len(commit)))
    )
    extra = sorted(set(filter(None, changed.split("\0"))) - set(wanted))
    if wrong or extra:
        raise UsageError(
            f"DS_REPO={checkout.spec}: the commit does not hold the fix's bytes "
            f"({', '.join(wrong + extra)}); no branch was made",
            why="git stored other bytes or modes than make pr wrote, or changed other files "
            "(something in the clone's git configuration or attributes rewrites content)",
            fix=f"check `git -C {checkout.path} config --list --show-origin` and .gitattributes, "
            "or make the branch in a fresh clone",
        )
