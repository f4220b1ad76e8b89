"""`pr`: the fix as a branch of a local DeepSpeed checkout, with the patch and PR_DESCRIPTION.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.cli.options import DEFAULT_RESULTS_ROOT
from repro.cli.registry import command
from repro.core import console


def _options(p: argparse.ArgumentParser) -> None:
    from repro.upstream.pr_branch import DEFAULT_BRANCH, DEFAULT_REF

    p.add_argument(
        "--ds-repo", required=True, help="a local DeepSpeed clone (full history, no uncommitted changes)"
    )
    p.add_argument("--ref", default=DEFAULT_REF, help=f"commit to build on (default {DEFAULT_REF})")
    p.add_argument("--branch", default=DEFAULT_BRANCH, help=f"new branch name (default {DEFAULT_BRANCH})")
    p.add_argument("--out", type=Path, default=None, help="new or empty folder (default results/pr-<time>)")
    p.add_argument("--keep", action="store_true", help="keep the work tree (OUT/worktree) on the branch")
    p.add_argument("--author-name", default=None, help="commit author (default: the checkout's user.name)")
    p.add_argument(
        "--author-email", default=None, help="commit author email (default: the checkout's user.email)"
    )
    p.add_argument("--results-root", type=Path, default=DEFAULT_RESULTS_ROOT)


@command(
    "pr", "make the fix a branch of a DeepSpeed checkout, with format-patch and PR_DESCRIPTION.md", _options
)
def cmd_pr(args: argparse.Namespace) -> int:
    import datetime as dt

    from repro.bisect.commits import check_source
    from repro.upstream.pr_branch import PrRequest, make_pr, summary

    check_source(args.ds_repo)  # the one DS_REPO checker: options, transport helpers, bad URLs

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or Path(args.results_root) / f"pr-{stamp}"
    request = PrRequest(
        ds_repo=args.ds_repo,
        out=out,
        ref=args.ref,
        branch=args.branch,
        keep=args.keep,
        author_name=args.author_name,
        author_email=args.author_email,
    )
    record = make_pr(request)
    for key, value in summary(record, Path(out).expanduser().resolve()).items():
        console.result(f"{key + ':':<12} {value}")
    console.result("nothing was pushed: review the branch, then push it to your fork yourself")
    return 0
