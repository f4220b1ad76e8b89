"""DeepSpeed's git history as bisect candidates (AXIS=deepspeed-commit): one cached mirror of
DS_REPO (a local checkout or a git URL), the first-parent commits between two refs, what each
commit is (subject, date, PR), and a work tree per probe slot checked out at the commit to probe.

The mirror lives under the cache (`git clone --mirror` once, `git fetch` on later use), so the
user's checkout is never touched (no worktrees added to it, nothing checked out in it) and its
branches and tags resolve as they do there. Work trees are per slot (PARALLEL=k probes use k of
them), reused across commits: `checkout --force` + `clean -ffdx` leaves exactly the commit's
tracked files, so a file deleted in a later commit does not survive into the next probe.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from repro.core import cmd
from repro.core.errors import UsageError
from repro.core.paths import cache_root
from repro.core.safe_git import SafeGit
from repro.core.walk_files import CommitRow

UPSTREAM_URL = "https://github.com/deepspeedai/DeepSpeed"
# "Fix the replica groups (#8060)" (squash merges) or "Merge pull request #8060 from ..."
_PR = re.compile(r"\(#(\d+)\)\s*$|^Merge pull request #(\d+)\b")
_SEP = "\x1f"
# Folders a DeepSpeed build reads (deepspeed/ links into accelerator/, op_builder/ and csrc/).
SPARSE = ("deepspeed", "accelerator", "op_builder", "csrc", "requirements")


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    short: str
    subject: str
    date: str  # committer date, ISO 8601
    pr: int | None

    def pr_url(self, repo_url: str) -> str | None:
        if self.pr is None or "github.com" not in repo_url:
            return None
        return f"{repo_url.removesuffix('.git').rstrip('/')}/pull/{self.pr}"

    def as_dict(self, repo_url: str) -> CommitRow:
        return {
            "sha": self.sha,
            "short": self.short,
            "subject": self.subject,
            "date": self.date,
            "pr": self.pr,
            "pr_url": self.pr_url(repo_url),
        }


def pr_number(subject: str) -> int | None:
    match = _PR.search(subject)
    return int(match.group(1) or match.group(2)) if match else None


# The transports DS_REPO may name. Not `ext::`/`fd::` (they run commands), not plain http (no TLS).
URL_SCHEMES = ("https", "ssh", "git", "file")
# scp-like ssh, `[user@]host:path` (git's rule: a colon before the first slash); a host starting
# with '-' would reach ssh as an option.
_SCP = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9][A-Za-z0-9.-]*:[^\s:]")


def is_url(spec: str) -> bool:
    return "://" in spec or (":" in spec.split("/", 1)[0] and "::" not in spec)


def check_source(spec: str) -> str:
    """DS_REPO as git may take it: a URL of URL_SCHEMES, `[user@]host:path`, or a local folder.
    Refused with what is wrong with the value before git sees it: git reads a value starting
    with '-' as an option (`--upload-pack=...` runs a command), runs `ext::` transports, and
    reports a URL it cannot use as a failure to reach it."""
    fix = f"give a DeepSpeed checkout (DS_REPO=~/DeepSpeed) or a git URL such as {UPSTREAM_URL}"
    if not spec.strip():
        raise UsageError("DS_REPO= is empty", fix=fix)
    if spec.startswith("-"):
        raise UsageError(
            f"DS_REPO={spec} starts with '-'",
            why="git would read it as one of its own options, not as a repository",
            fix=fix,
        )
    if "::" in spec.split("/", 1)[0]:  # git's transport helpers (`ext::sh -c ...`) run commands
        raise UsageError(
            f"DS_REPO={spec} names a git transport helper",
            why=f"only {', '.join(URL_SCHEMES)} URLs, ssh addresses (user@host:path) and folders are taken",
            fix=fix,
        )
    if "://" in spec:
        url = urllib.parse.urlsplit(spec)
        if url.scheme.lower() not in URL_SCHEMES:
            raise UsageError(
                f"DS_REPO={spec} is a {url.scheme or 'scheme-less'}:// URL",
                why=f"only {', '.join(URL_SCHEMES)} URLs are taken (plain http has no TLS)",
                fix=fix,
            )
        host = url.hostname or ""
        if url.scheme.lower() != "file" and (not host or host.startswith("-")):
            raise UsageError(f"DS_REPO={spec} names no valid host", fix=fix)
        return spec
    if is_url(spec):
        if not _SCP.match(spec):
            raise UsageError(
                f"DS_REPO={spec} is not a valid ssh address",
                why="a colon before the first '/' makes it user@host:path to git",
                fix=fix + " (a local folder whose name holds ':' is written ./name)",
            )
        return spec
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise UsageError(
            f"DS_REPO={spec} is not a git repository "
            + ("(a file, not a folder)" if path.exists() else "(no such folder on this machine)"),
            why="a DS_REPO without a URL scheme is a local checkout",
            fix=fix,
        )
    return spec


class DsRepo:
    """The cached mirror of one DS_REPO and its probe work trees."""

    def __init__(self, source: str, root: Path | None = None, runner: Callable[..., cmd.CmdResult] = cmd.run):
        check_source(source)
        self.source = source if is_url(source) else str(Path(source).expanduser().resolve())
        digest = hashlib.sha256(self.source.encode()).hexdigest()[:10]
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.source.rstrip("/").rsplit("/", 1)[-1])[:40]
        base = (root or cache_root()) / "git"
        self.mirror = base / f"{name}-{digest}.git"
        self.trees = base / f"{name}-{digest}.trees"
        self.runner = runner
        # Every git call, in the mirror, its work trees or the user's checkout: no GIT_* of the
        # caller (an exported GIT_DIR would make `sparse-checkout` write into that repository),
        # no hooks, fsmonitor or drivers (repro/core/safe_git.py).
        self.safe = SafeGit(runner)
        self._url: str | None = None

    # -- git --------------------------------------------------------------------------------------
    def _failed(self, what: str, result: cmd.CmdResult, fix: str) -> UsageError:
        """A git call that failed: `what` follows DS_REPO=..., git's exit code and its last lines."""
        return UsageError(
            f"DS_REPO={self.source}{what} (git exit {result.returncode})",
            why=result.tail(5) or "git printed nothing",
            fix=fix,
        )

    def _git(self, *args: str, what: str, cwd: Path | None = None) -> str:
        where = ["-C", str(cwd)] if cwd else ["--git-dir", str(self.mirror)]
        result = self.safe.run(*args, where=where)
        if not result.ok:
            fix = "check DS_REPO= (a DeepSpeed checkout or git URL) and the refs given"
            raise self._failed(f": {what} failed", result, fix)
        return str(result.stdout)

    def check(self) -> None:
        """What can be known without the network: a local DS_REPO must be a git repository."""
        if not is_url(self.source) and not (Path(self.source) / ".git").exists():
            if not (Path(self.source) / "HEAD").is_file():  # neither a checkout nor a bare repository
                raise UsageError(
                    f"DS_REPO={self.source} is not a git repository",
                    fix="pass a DeepSpeed git checkout, or a URL such as " + UPSTREAM_URL,
                )

    def sync(self, fetch: bool = True) -> None:
        """Clone the mirror once; later uses fetch what changed (a local checkout is cheap)."""
        self.check()
        if not (self.mirror / "HEAD").is_file():
            self.mirror.parent.mkdir(parents=True, exist_ok=True)
            # `--`: whatever DS_REPO holds, git takes it as the repository, never as an option.
            result = self.safe.run(
                "clone", "--mirror", "--quiet", "--", self.source, str(self.mirror), echo=True
            )
            if not result.ok:
                fix = "check the URL (and the network, for a remote one), or clone DeepSpeed somewhere "
                fix += "this machine can read and pass that folder as DS_REPO="
                raise self._failed(" cannot be cloned", result, fix)
        elif fetch:
            self._git("fetch", "--prune", "--quiet", "origin", what="fetching new commits")

    def resolve(self, ref: str) -> str:
        if not ref.strip() or ref.startswith("-"):  # git would read it as an option
            raise UsageError(
                f"{ref!r} is not a git ref",
                why="a ref (GOOD=, BAD=, FROM=, TO=, DEEPSPEED_COMMIT=) names a tag, branch or commit",
                fix="give a tag (v0.19.2), a branch or a commit SHA",
            )
        return self._git(
            "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", what=f"resolving {ref}"
        ).strip()

    def first_parent_range(self, good: str, bad: str) -> list[str]:
        """`good`, then every first-parent commit after it up to `bad` (oldest first)."""
        lo, hi = self.resolve(good), self.resolve(bad)
        listed = self._git("rev-list", "--first-parent", "--reverse", f"{lo}..{hi}", what="listing commits")
        return [lo, *listed.split()]

    def is_ancestor(self, older: str, newer: str) -> bool:
        """Whether commit `older` is in the history of `newer` (both resolved SHAs)."""
        where = ["--git-dir", str(self.mirror)]
        result = self.safe.run("merge-base", "--is-ancestor", older, newer, where=where)
        if result.returncode not in (0, 1):  # 1: not an ancestor; else git itself failed
            what = f": comparing {older[:12]} and {newer[:12]} failed"
            raise self._failed(what, result, "check DS_REPO= and the refs given")
        return result.returncode == 0

    def describe(self, shas: list[str]) -> dict[str, CommitInfo]:
        if not shas:
            return {}
        fmt = _SEP.join(("%H", "%h", "%s", "%cI"))
        text = self._git("show", "--no-patch", f"--format={fmt}", *shas, what="reading commit subjects")
        infos = {}
        for line in text.splitlines():
            parts = line.split(_SEP)
            if len(parts) == 4:
                sha, short, subject, date = parts
                infos[sha] = CommitInfo(sha, short, subject, date, pr_number(subject))
        return infos

    def files_changed(self, sha: str) -> str:
        return self._git("show", "--stat", "--format=", sha, what="listing the files changed").rstrip()

    def url(self) -> str:
        """Where a maintainer gets the commit: the URL given, or the local checkout's origin."""
        if is_url(self.source):
            return self.source
        if self._url is not None:
            return self._url
        result = self.safe.run("config", "--get", "remote.origin.url", where=["-C", self.source])
        found = str(result.stdout).strip() if result.ok else ""
        self._url = found if is_url(found) else UPSTREAM_URL
        return self._url

    # -- work trees -------------------------------------------------------------------------------
    def checkout(self, sha: str, slot: int = 0) -> Path:
        """Work tree `slot` at `sha`, with nothing else in it (no build leftovers, no deleted files)."""
        tree = self.trees / f"slot-{slot}"
        if not (tree / ".git").exists():
            self._git("worktree", "prune", what="pruning stale work trees")
            tree.parent.mkdir(parents=True, exist_ok=True)
            self._git(
                "worktree",
                "add",
                "--force",
                "--no-checkout",
                "--detach",
                str(tree),
                sha,
                what="adding a work tree",
            )
            # Only what a DeepSpeed wheel is built from (and the top-level files): a tenth of the
            # files to write per commit, and no docs/blog media (mirrors may even lack those blobs).
            self._git("sparse-checkout", "set", "--cone", *SPARSE, what="limiting the work tree", cwd=tree)
        self._git(
            "checkout", "--force", "--detach", "--quiet", sha, what=f"checking out {sha[:12]}", cwd=tree
        )
        self._git("clean", "-ffdxq", what="cleaning the work tree", cwd=tree)
        return tree


def tag_for(version: str) -> str:
    """DeepSpeed tags its releases v<version>."""
    return version if version.startswith("v") else f"v{version}"
