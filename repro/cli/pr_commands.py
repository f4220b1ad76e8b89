"""`pr`: the fix as a branch of a local DeepSpeed checkout, with the patch and PR_DESCRIPTION.md."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from repro.bisect.commits import DsRepo, check_source
from repro.cli.options import DEFAULT_RESULTS_ROOT
from repro.cli.registry import command
from repro.core import console
from repro.upstream.pr import verify as pr_verify
from repro.upstream.pr.branch import DEFAULT_BRANCH, DEFAULT_REF, PrRequest, make_pr, summary


def _options(p: argparse.ArgumentParser) -> None:
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
    _verify_flags(p)


def _verify_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--verify", action="store_true", help="verify the branch at its commit in the lab (make: VERIFY=1)"
    )
    p.add_argument(
        "--range", action="store_true", help="the affected range, releases x torch (make: RANGE=1)"
    )
    p.add_argument("--engine", default="venv", help="engine of the lab's probes (default venv: the CPU twin)")
    p.add_argument(
        "--range-torch",
        default=None,
        help="torch versions of the range (default 2.0.1,2.1.0,2.3.1 and the matrix's newest)",
    )
    p.add_argument("--releases", default=None, help="DeepSpeed releases of the range (default: see docs)")
    p.add_argument("--parallel", type=int, default=1, help="releases probed side by side in the range")
    p.add_argument(
        "--torches",
        default=None,
        help="torch versions to verify with (default: the reporter's, REF's CPU CI presets, the newest)",
    )


@command(
    "pr", "make the fix a branch of a DeepSpeed checkout, with format-patch and PR_DESCRIPTION.md", _options
)
def cmd_pr(args: argparse.Namespace) -> int:
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
    folder = Path(out).expanduser().resolve()
    for key, value in summary(record, folder).items():
        console.result(f"{key + ':':<12} {value}")
    console.result("nothing was pushed: review the branch, then push it to your fork yourself")
    if args.verify or args.range:
        return verify_folder(folder, args)
    return 0


def _pr_verify_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pr", required=True, type=Path, help="the OUT folder of a `make pr` run (holds pr.json)")
    p.add_argument("--ds-repo", required=True, help="the DeepSpeed clone `make pr` made the branch in")
    _verify_flags(p)


@command(
    "pr-verify",
    "verify a `make pr` branch in the lab (and the affected range); re-render PR_DESCRIPTION.md",
    _pr_verify_options,
)
def cmd_pr_verify(args: argparse.Namespace) -> int:
    check_source(args.ds_repo)
    if not (args.verify or args.range):
        args.verify = True
    return verify_folder(args.pr.expanduser().resolve(), args)


def verify_folder(folder: Path, args: argparse.Namespace) -> int:
    """The lab's verification and/or range for the branch recorded in folder/pr.json, then
    PR_DESCRIPTION.md again. Exit 0 when verified (or only the range was asked), 1 when not."""
    from repro.upstream.pr import verify_run as pr_verify_run

    pr_verify.read_pr(folder)  # a folder without pr.json stops before git is touched
    # The probes' cached clone of DS_REPO (AXIS=deepspeed-commit's) must hold the branch's commit.
    DsRepo(args.ds_repo).sync(fetch=True)
    request = pr_verify_run.VerifyRequest(
        ds_repo=args.ds_repo,
        engine=args.engine,
        verify=bool(args.verify),
        range=bool(args.range),
        range_torch=args.range_torch,
        releases=args.releases,
        parallel=args.parallel,
        torches=args.torches,
    )
    verified = pr_verify_run.run(folder, request)
    console.result(f"description: {folder / 'PR_DESCRIPTION.md'}")
    return 0 if verified in (None, True) else 1
