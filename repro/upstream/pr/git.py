"""The git side of `make pr`: what a DeepSpeed checkout is (preflight) and the few writes allowed in it.

Every call goes through `repro.core.safe_git` (and so `repro.core.cmd.run`) as
`git -C <checkout> ...`: no GIT_* variable of the caller, none of the clone's hooks, fsmonitor,
filter or diff drivers (safe_git says how). User values come after `--` or `--end-of-options`
(and are refused when they start with '-'), so a REF or BRANCH cannot turn into a git option.
The checkout's own work tree, index, HEAD and existing refs are never written: the only changes
are one detached work tree (added and removed again) and, at the very end, one new branch ref
created with `update-ref <ref> <sha> ""`, which git refuses if the ref exists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from repro.core import cmd
from repro.core.errors import UsageError
from repro.core.safe_git import SafeGit

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_EMAIL = re.compile(r"^[^\s<>@]+@[^\s<>@]+$")


@dataclass(frozen=True)
class Identity:
    """Author and committer of the commit; never taken silently from the user's global config."""

    name: str
    email: str
    source: str  # "options" or "checkout config": said in the preamble

    def env(self) -> dict[str, str]:
        # The environment outranks every config file, so a GIT_AUTHOR_* already exported by the
        # user cannot replace the identity that was checked and shown.
        return {
            "GIT_AUTHOR_NAME": self.name,
            "GIT_AUTHOR_EMAIL": self.email,
            "GIT_COMMITTER_NAME": self.name,
            "GIT_COMMITTER_EMAIL": self.email,
        }


def check_identity(name: str, email: str, source: str) -> Identity:
    fix = "give AUTHOR_NAME= and AUTHOR_EMAIL= (--author-name/--author-email) as you sign DeepSpeed commits"
    if not name.strip() or _CONTROL.search(name) or "<" in name or ">" in name:
        raise UsageError(
            f"author name {name!r} ({source}) cannot go into a commit",
            why="it is empty or holds '<', '>' or a control character",
            fix=fix,
        )
    if not _EMAIL.match(email) or _CONTROL.search(email):
        raise UsageError(f"author email {email!r} ({source}) is not an address", fix=fix)
    return Identity(name.strip(), email, source)


def _git_word(value: str, shown: str, what: str, fix: str) -> str:
    # A value git takes as a branch or revision: one starting with '-' or holding a control
    # character would reach git as something else.
    if not value or value.startswith("-") or _CONTROL.search(value):
        raise UsageError(
            f"{shown} is not {what}",
            why="a value starting with '-' or holding a control character would reach git as something else",
            fix=fix,
        )
    return value


class Checkout:
    """A local DeepSpeed repository (work tree or bare) and the git calls `make pr` makes in it."""

    def __init__(self, spec: str) -> None:
        # The CLI has already run DS_REPO through repro.bisect.commits.check_source (the one
        # checker); this use case takes only a folder on this machine, and says so.
        if spec.startswith("-") or "://" in spec or ":" in spec.split("/", 1)[0]:
            raise UsageError(
                f"DS_REPO={spec} is not a folder on this machine",
                why="`make pr` adds a branch to a local clone; it never clones, fetches or pushes",
                fix="clone it first (git clone https://github.com/deepspeedai/DeepSpeed), give that folder",
            )
        if not Path(spec).expanduser().is_dir():
            raise UsageError(
                f"DS_REPO={spec} is not a git repository (no such folder)",
                fix="give the folder of a DeepSpeed clone",
            )
        self.spec = spec
        self.path = Path(spec).expanduser().resolve()
        self.safe = SafeGit()  # it looks cmd.run up now, so a test's stand-in for it is used

    def git(
        self,
        *args: str,
        what: str,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        echo: bool = False,
    ) -> str:
        result = self.try_git(*args, cwd=cwd, env=env, echo=echo)
        if not result.ok:
            raise UsageError(
                f"DS_REPO={self.spec}: {what} failed (git exit {result.returncode})",
                why=result.tail(5) or "git printed nothing",
                fix="check DS_REPO= (a DeepSpeed checkout) and REF=",
            )
        return result.stdout

    def try_git(
        self, *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None, echo: bool = False
    ) -> cmd.CmdResult:
        # Hooks, fsmonitor and drivers are the checkout's code (post-checkout on `worktree add`,
        # DeepSpeed's pre-commit on commit, a filter on add): none runs for any call (safe_git).
        return self.safe.run(*args, where=("-C", str(cwd or self.path)), extra_env=env, echo=echo)

    # -- what the checkout is ---------------------------------------------------------------------
    def preflight(self) -> bool:
        """Refuse what `make pr` must not build on; returns whether the repository is bare."""
        probe = self.try_git("rev-parse", "--is-bare-repository", "--is-shallow-repository")
        lines = probe.stdout.split()
        if not probe.ok or len(lines) != 2:
            raise UsageError(
                f"DS_REPO={self.spec} is not a git repository",
                why=probe.tail(3) or "git rev-parse answered nothing",
                fix="give the folder of a DeepSpeed clone (git clone https://github.com/deepspeedai/DeepSpeed)",
            )
        bare, shallow = lines[0] == "true", lines[1] == "true"
        if shallow:
            raise UsageError(
                f"DS_REPO={self.spec} is a shallow clone",
                why="its history is cut off: REF may not resolve as upstream has it, and a branch made "
                "on a grafted commit cannot be pushed or rebased reliably",
                fix=f"fetch the full history first: git -C {self.path} fetch --unshallow",
            )
        if not bare:
            dirty = self.git("status", "--porcelain", "--untracked-files=no", what="git status")
            if dirty.strip():
                raise UsageError(
                    f"DS_REPO={self.spec} has uncommitted changes",
                    why="the branch is made from REF, not from your work tree; changes you see there "
                    "would silently be missing from it (make pr never touches your work tree)",
                    fix=f"commit or stash them first (git -C {self.path} status)",
                )
        return bare

    def resolve(self, ref: str) -> str:
        _git_word(
            ref, f"REF={ref!r}", "a revision", "give a branch, tag or commit of the checkout (REF=master)"
        )
        result = self.try_git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
        sha = result.stdout.strip()
        if not result.ok or not re.fullmatch(r"[0-9a-f]{40,64}", sha):
            raise UsageError(
                f"REF={ref} is not a commit in DS_REPO={self.spec}",
                why="git rev-parse cannot find it (a branch, tag or SHA the checkout does not have)",
                fix=f"fetch it first (git -C {self.path} fetch origin), or give REF=master / a SHA",
            )
        return sha

    def check_new_branch(self, branch: str) -> None:
        _git_word(
            branch, f"BRANCH={branch!r}", "a branch name", "use a plain name such as mics-coalesced-wait"
        )
        if not self.try_git("check-ref-format", "--branch", branch).ok:
            raise UsageError(
                f"BRANCH={branch} is not a valid git branch name", fix="use e.g. mics-coalesced-wait"
            )
        if self.try_git("show-ref", "--verify", "--quiet", f"refs/heads/{branch}").ok:
            raise UsageError(
                f"DS_REPO={self.spec} already has a branch {branch}",
                why="make pr never moves or overwrites a branch you have",
                fix=f"give another BRANCH=, or delete that one (git -C {self.path} branch -D {branch})",
            )

    def local_identity(self) -> tuple[str, str] | None:
        """user.name/user.email from this repository's own config only (not ~/.gitconfig)."""
        name = self.try_git("config", "--local", "--get", "user.name").stdout.strip()
        email = self.try_git("config", "--local", "--get", "user.email").stdout.strip()
        return (name, email) if name and email else None

    def snapshot(self) -> tuple[str, str]:
        """(refs, work tree status): compared before and after by the tests and by `make pr` itself."""
        refs = self.git("for-each-ref", "--format=%(refname) %(objectname)", what="git for-each-ref")
        status = self.try_git("status", "--porcelain").stdout
        return refs, status

    # -- the writes -------------------------------------------------------------------------------
    def add_worktree(self, where: Path, sha: str) -> None:
        # No checkout: only the index is set to the commit (trees, not blobs), and only the files we
        # change are written. A DeepSpeed tree is thousands of files, its blogs hold large images
        # (absent from partial clones), and a checkout would run the repository's smudge filters.
        add = ["worktree", "add", "--no-checkout", "--detach", "--", str(where), sha]
        self.git(*add, what="git worktree add", echo=True)
        self.git("reset", "--quiet", "--mixed", sha, "--", cwd=where, what="git reset (index only)")

    def remove_worktree(self, where: Path) -> bool:
        return self.try_git("worktree", "remove", "--force", "--", str(where), echo=True).ok

    def create_branch(self, branch: str, sha: str) -> None:
        # An empty old value: git refuses if the ref appeared since the preflight looked.
        ref = f"refs/heads/{branch}"
        self.git("update-ref", "-m", "make pr", "--", ref, sha, "", what="git update-ref", echo=True)
