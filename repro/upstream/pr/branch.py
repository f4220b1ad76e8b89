"""`make pr`: the fix as a commit on a branch of a local DeepSpeed checkout, with the PR's files.

    python -m repro pr --ds-repo ~/DeepSpeed [--ref master] [--branch mics-coalesced-wait] [--out DIR]

Checks first, writes after: the checkout must be a full (not shallow) clone without uncommitted
changes, REF must resolve, BRANCH must be new, and an author must be given or set in the checkout's
own config. Then a detached work tree at REF is added under OUT/worktree, the fix is spliced into
DeepSpeed's files there (repro.workload.fix, as for the shipped patches), the regression test
goes to tests/unit/runtime/zero/, and one commit is made of exactly those bytes, with hooks,
fsmonitor and filters off (they are the checkout's code, not ours to run: repro/core/safe_git.py),
and checked blob by blob (repro/upstream/pr/blobs.py). Only when all of that worked is
refs/heads/BRANCH created. OUT receives
the `git format-patch` file, COMMIT_MSG.txt, pr.json (the records) and PR_DESCRIPTION.md rendered
from them. The work tree is removed afterwards unless keep=True (make: KEEP=1), which leaves it
checked out on the branch for running the test. Nothing is pushed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from repro.core import console, safe_write
from repro.core.errors import UsageError
from repro.upstream.pr import blobs as pr_blobs
from repro.upstream.pr import fix as pr_fix
from repro.upstream.pr.blobs import Wanted
from repro.upstream.pr.description import render
from repro.upstream.pr.git import Checkout, Identity, check_identity
from repro.upstream.pr.record import FileStat, PrRecord
from repro.workload import fix

DEFAULT_BRANCH = "mics-coalesced-wait"
DEFAULT_REF = "master"
SUBJECT = "Wait on the coalescing manager's work in MiCS all-gathers"
# DeepSpeed's style: a short imperative subject, a body that says why, the issue it fixes.
# `--signoff` adds the DCO line DeepSpeed's CI checks.
BODY = """\
Since torch 2.1, a collective issued inside torch's _coalescing_manager
returns an _IllegalWork placeholder whose wait() raises; the real work
is kept by the manager. TorchBackend.all_gather_coalesced dropped the
manager and returned (or waited on) the last placeholder, so nothing
waited for the real all-gather: flat MiCS logged the error, marked the
parameters AVAILABLE and computed on buffers that were not filled yet,
and hierarchical MiCS crashed.

Bind the manager and wait on its work: the asynchronous call returns
it as the handle, the synchronous call waits on it before returning.
torch 2.0, where the manager yields nothing and the works are real,
keeps the old path. MiCS_AllGatherCoalescedHandle.wait no longer
swallows a failed wait, so a failed collective reaches the caller
instead of leaving the parameters AVAILABLE over data that never
arrived.

Add {test},
which fails before this change and passes with it.

Fixes #5080
"""
GREP_PATHS = "deepspeed/"


@dataclass(frozen=True)
class PrRequest:
    ds_repo: str
    out: Path
    ref: str = DEFAULT_REF
    branch: str = DEFAULT_BRANCH
    keep: bool = False
    author_name: str | None = None
    author_email: str | None = None


def identity(request: PrRequest, checkout: Checkout) -> Identity:
    given = (request.author_name, request.author_email)
    if any(v is not None for v in given):
        if not all(given):
            raise UsageError(
                "give both AUTHOR_NAME= and AUTHOR_EMAIL= (--author-name/--author-email)",
                why="a commit needs a name and an address",
            )
        return check_identity(str(request.author_name), str(request.author_email), "options")
    local = checkout.local_identity()
    if local is None:
        raise UsageError(
            f"no author for the commit: DS_REPO={checkout.spec} sets no user.name/user.email",
            why="make pr does not take your global git identity silently; the commit's author is "
            "what DeepSpeed's DCO check reads",
            fix="give AUTHOR_NAME= and AUTHOR_EMAIL=, or set them in the checkout: "
            f"git -C {checkout.path} config user.name 'Your Name' (and user.email)",
        )
    return check_identity(local[0], local[1], "checkout config")


def check_out_folder(out: Path, checkout: Checkout) -> Path:
    resolved = out.expanduser().resolve()
    if resolved == checkout.path or checkout.path in resolved.parents:
        raise UsageError(
            f"OUT={out} is inside DS_REPO={checkout.spec}",
            why="the work tree and the PR files would land in the checkout make pr must not touch",
            fix="choose an OUT= outside the checkout (default: results/pr-<time>)",
        )
    for gitdir in git_folders(checkout):
        if resolved == gitdir or gitdir in resolved.parents:
            raise UsageError(
                f"OUT={out} is inside the git folder {gitdir} of DS_REPO={checkout.spec}",
                why="a linked work tree or a separate git folder keeps the repository outside DS_REPO; "
                "files written there would mix with git's own (refs, objects, work tree records)",
                fix="choose an OUT= outside the checkout and its git folders (default: results/pr-<time>)",
            )
    return resolved


def git_folders(checkout: Checkout) -> list[Path]:
    """The checkout's own git folder and the one its work trees share: for a linked work tree
    (`.git` is a file) or `clone --separate-git-dir` both lie outside the checkout."""
    found = checkout.try_git("rev-parse", "--path-format=absolute", "--git-dir", "--git-common-dir")
    if not found.ok:
        return []
    return sorted({Path(line).resolve() for line in found.stdout.splitlines() if line.strip()})


@dataclass(frozen=True)
class Blob:
    text: str
    executable: bool  # the file's git mode is kept: DeepSpeed's comm/torch.py is 100755


def read_at(checkout: Checkout, sha: str, paths: list[str]) -> dict[str, Blob | None]:
    """Each path's committed text at sha (None when absent): blobs, never a link followed."""
    out: dict[str, Blob | None] = {}
    for path in paths:
        entry = checkout.try_git("ls-tree", sha, "--", path).stdout.split(None, 3)
        if len(entry) < 4 or entry[1] != "blob":
            out[path] = None
            continue
        if entry[0] == "120000":
            raise pr_fix.FixDoesNotApplyError(
                f"{path} is a symbolic link at REF", fix="choose a REF where it is a regular file"
            )
        result = checkout.try_git("cat-file", "blob", f"{sha}:{path}")
        out[path] = Blob(result.stdout, entry[0] == "100755") if result.ok else None
    return out


def _numstat(text: str) -> tuple[FileStat, ...]:
    def count(n: str) -> int:
        return int(n) if n.isdigit() else 0  # git writes "-" for a binary file

    rows = [(line.split("\t", 2) + ["", ""])[:3] for line in text.splitlines()]
    return tuple(FileStat(path, count(added), count(removed)) for added, removed, path in rows if path)


def commit_args(ident: Identity, message: Path) -> list[str]:
    return [
        "-c", f"user.name={ident.name}", "-c", f"user.email={ident.email}",
        # The checkout's hooks are its code (DeepSpeed's pre-commit would reformat or fetch): off.
        "-c", "core.hooksPath=/dev/null",
        "commit", "--quiet", "--no-verify", "--signoff", "-F", str(message),
    ]  # fmt: skip


def wanted_files(changed: Mapping[str, str], blobs: Mapping[str, Blob | None]) -> dict[str, Wanted]:
    """The bytes (and modes) the branch must hold: the changed files and the regression test."""
    wanted = {}
    for path, text in changed.items():
        blob = blobs[path]
        wanted[path] = Wanted(text.encode(), blob.executable if blob else False)
    wanted[str(pr_fix.TEST_REL)] = Wanted(pr_fix.TEST_SOURCE.read_bytes(), False)
    return wanted


def commit_fix(
    checkout: Checkout,
    worktree: Path,
    out: Path,
    sha: str,
    wanted: Mapping[str, Wanted],
    ident: Identity,
    written: list[str],
) -> str:
    """Write, stage and commit exactly `wanted` in the work tree at `sha`; the new commit's SHA.
    `written` gains the names of the files written into OUT (removed again if the run fails)."""
    for path, want in wanted.items():
        safe_write.write_file(worktree, path, want.data, replace=True, executable=want.executable)
    message = safe_write.write_file(
        out, "COMMIT_MSG.txt", f"{SUBJECT}\n\n{BODY.format(test=pr_fix.TEST_REL)}".encode()
    )
    written.append(message.name)
    pr_blobs.stage(checkout, worktree, wanted)
    checkout.git(*commit_args(ident, message), cwd=worktree, env=ident.env(), what="git commit", echo=True)
    commit = checkout.git("rev-parse", "--verify", "HEAD", cwd=worktree, what="git rev-parse").strip()
    pr_blobs.check_committed(checkout, worktree, sha, commit, wanted)
    return commit


@dataclass(frozen=True)
class Made:
    """What the work tree step made: the commit, its diff stat and format-patch file."""

    commit: str
    files: tuple[FileStat, ...]
    patch: str
    grep: str  # `git grep -n -w all_gather_coalesced` at REF
    worktree: Path | None  # kept (KEEP=1), else None


def make_pr(request: PrRequest) -> PrRecord:
    checkout = Checkout(request.ds_repo)
    checkout.preflight()
    sha = checkout.resolve(request.ref)
    checkout.check_new_branch(request.branch)
    ident = identity(request, checkout)
    out = check_out_folder(request.out, checkout)
    targets = sorted({t.path for t in fix.TARGETS})
    blobs = read_at(checkout, sha, targets)
    # A fix that does not apply stops here, before anything is written.
    changed = pr_fix.changed_files({p: b.text if b else None for p, b in blobs.items()})
    console.info(
        f"pr: DS_REPO={checkout.path} REF={request.ref} ({sha[:10]}) -> branch {request.branch}; "
        f"author {ident.name} <{ident.email}> ({ident.source})"
    )
    made_out = not out.exists()
    safe_write.claim_folder(out, option="OUT", owned_by=())
    written: list[str] = []  # OUT's files this run wrote, removed again if it fails
    try:
        before = checkout.snapshot()
        made = _commit_in_worktree(checkout, request, ident, sha, blobs, changed, out, written)
        after = checkout.snapshot()
        same = untouched(before, after, request.branch, made.commit)
        record = _record(request, ident, sha, blobs, made, same)
        if not record.checkout_untouched:
            console.warn(
                "pr: the checkout's refs or status changed beyond the new branch; check `git status` there"
            )
        files = {
            "pr.json": json.dumps(record.to_dict(), indent=2) + "\n",
            "PR_DESCRIPTION.md": render(record),
        }
        for name, text in files.items():
            safe_write.write_file(out, name, text.encode())
            written.append(name)
    except BaseException:
        # A failed run leaves OUT as it found it (new or empty), so the same command can run again.
        _forget(out, written, made_out)
        raise
    return record


def _forget(out: Path, written: list[str], made_out: bool) -> None:
    for name in written:
        try:
            safe_write.remove_file(out, name)
        except UsageError as exc:  # the failure that got here is the one to report
            console.warn(f"pr: could not remove {out / name}: {exc.what}")
    if made_out:
        try:
            out.rmdir()  # only when empty: a work tree git could not remove stays, with its warning
        except OSError:
            pass


def _commit_in_worktree(
    checkout: Checkout,
    request: PrRequest,
    ident: Identity,
    sha: str,
    blobs: Mapping[str, Blob | None],
    changed: Mapping[str, str],
    out: Path,
    written: list[str],
) -> Made:
    """The fix committed in a detached work tree at REF, format-patch into OUT, then the branch.
    The work tree goes again unless KEEP=1 (and always when a step fails)."""
    worktree = out / "worktree"
    checkout.add_worktree(worktree, sha)
    kept = False
    try:
        commit = commit_fix(checkout, worktree, out, sha, wanted_files(changed, blobs), ident, written)
        files = _numstat(checkout.git("diff", "--numstat", sha, commit, "--", cwd=worktree, what="git diff"))
        one_patch = ["format-patch", "--no-signature", "-o", str(out), "-1", commit]
        patch = checkout.git(*one_patch, cwd=worktree, what="git format-patch", echo=True).strip()
        if Path(patch).parent.resolve() == out.resolve():
            written.append(Path(patch).name)
        grep = checkout.try_git("grep", "-n", "-w", pr_fix.FUNCTION, sha, "--", GREP_PATHS)
        checkout.create_branch(request.branch, commit)
        if request.keep:
            checkout.git("switch", "--quiet", request.branch, cwd=worktree, what="git switch")
            checkout.git("reset", "--quiet", "--hard", cwd=worktree, what="git reset --hard (KEEP=1)")
            kept = True
    finally:
        if not kept and not checkout.remove_worktree(worktree):
            console.warn(
                f"pr: could not remove the work tree {worktree}; `git -C {checkout.path} worktree prune`"
            )
    return Made(commit, files, patch, grep.stdout, worktree if kept else None)


def _record(
    request: PrRequest,
    ident: Identity,
    sha: str,
    blobs: Mapping[str, Blob | None],
    made: Made,
    checkout_untouched: bool,
) -> PrRecord:
    mics_blob = blobs.get(pr_fix.MICS)
    mics_source = mics_blob.text if mics_blob else ""
    return PrRecord(
        ref=request.ref,
        ref_sha=sha,
        branch=request.branch,
        commit=made.commit,
        subject=SUBJECT,
        author=f"{ident.name} <{ident.email}>",
        fix_id=fix.FIX_ID,
        changed=tuple(t.qualname for t in fix.TARGETS),
        files=made.files,
        test_path=str(pr_fix.TEST_REL),
        patch_file=Path(made.patch).name,
        swallowed_before=pr_fix.wait_swallows(mics_source) if mics_source else False,
        callers=tuple(
            replace(c, function=pr_fix.enclosing_function(mics_source, c.line))
            if c.path == pr_fix.MICS
            else c
            for c in pr_fix.parse_grep(made.grep, sha)
        ),
        worktree=str(made.worktree) if made.worktree else None,
        checkout_untouched=checkout_untouched,
    )


def untouched(before: tuple[str, str], after: tuple[str, str], branch: str, commit: str) -> bool:
    """Refs gained exactly refs/heads/<branch> at the commit, and the work tree's status is the same."""
    new = f"refs/heads/{branch} {commit}"
    return set(after[0].splitlines()) == set(before[0].splitlines()) | {new} and before[1] == after[1]


def summary(record: PrRecord, out: Path) -> Mapping[str, str]:
    return {
        "branch": f"{record.branch} at {record.commit[:10]} (on {record.ref} {record.ref_sha[:10]})",
        "patch": str(out / record.patch_file),
        "description": str(out / "PR_DESCRIPTION.md"),
        "work tree": record.worktree or "removed (KEEP=1 keeps it)",
    }
