"""Maintenance subcommands (what CI and the docs run besides the reproduction itself):

    python -m repro dockerfiles --check|--write|--print ENV   docker/<id>.Dockerfile vs the matrix
    python -m repro lint-dockerfiles [--hadolint require]     our Dockerfile rules, plus hadolint
    python -m repro patches --check|--write|--print VERSION   patches/*.patch vs repro/workload/fix.py
    python -m repro bench [--env cpu] [--engine venv]         warm speed figures (results/bench.jsonl)

Thin handlers: the work is in repro.engines.docker.{dockerfiles,lint}, repro.upstream.patchgen and
repro.run.bench. A check that finds problems exits 1 (2 and up are errors, see docs/options.md "Exit codes").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repro.cli.registry import command
from repro.core import console
from repro.core.paths import PATCH_DIR, REPO_ROOT

# A check ran and found problems (drift, lint findings): not an error of the tool.
EXIT_FINDINGS = 1


def _dockerfiles_options(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 if a committed Dockerfile is out of sync")
    mode.add_argument("--write", action="store_true", help="regenerate docker/<id>.Dockerfile")
    mode.add_argument("--print", metavar="ENV", help="print the Dockerfile of ENV (derived ids work too)")
    p.add_argument("--matrix", type=Path, default=None, help="envs.toml (default: the repo's)")
    p.add_argument("--root", type=Path, default=REPO_ROOT, help="repository root")


@command(
    "dockerfiles", "check, write or print the Dockerfiles generated from the matrix", _dockerfiles_options
)
def cmd_dockerfiles(args: argparse.Namespace) -> int:
    from repro.engines.docker import dockerfiles
    from repro.matrix.schema import load_matrix

    matrix = load_matrix(args.matrix or args.root / "env_matrix" / "envs.toml")
    if args.print:
        sys.stdout.write(dockerfiles.render(matrix.get(args.print)))
        return 0
    if args.write:
        for path in dockerfiles.write_all(matrix, args.root):
            console.result(f"wrote {path.relative_to(args.root)}")
    problems = dockerfiles.out_of_sync(matrix, args.root)
    for problem in problems:
        console.result(problem.render())
    if problems:
        return EXIT_FINDINGS
    console.result(f"{len(matrix)} Dockerfiles in sync with {matrix.path}")
    return 0


def _lint_options(p: argparse.ArgumentParser) -> None:
    # The values of repro.engines.docker.lint.Hadolint, spelt out: building the parser must not
    # import the Dockerfile modules for every command.
    p.add_argument(
        "--hadolint",
        choices=("auto", "require", "skip"),
        default="auto",
        help="auto: run hadolint when installed; require: fail without it; skip",
    )
    p.add_argument("--root", type=Path, default=REPO_ROOT, help="repository root")


@command("lint-dockerfiles", "lint every env's Dockerfile (our rules, plus hadolint)", _lint_options)
def cmd_lint_dockerfiles(args: argparse.Namespace) -> int:
    from repro.engines.docker.lint import Hadolint, lint_matrix
    from repro.matrix.schema import load_matrix

    matrix = load_matrix(args.root / "env_matrix" / "envs.toml")
    findings = lint_matrix(matrix, args.root, Hadolint(args.hadolint))
    for finding in findings:
        console.result(finding.render())
    console.result(f"{len(matrix)} Dockerfiles, {len(findings)} finding(s)")
    return EXIT_FINDINGS if findings else 0


def _patches_options(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail (exit 21) if a shipped patch differs")
    mode.add_argument("--write", action="store_true", help="regenerate the shipped patches")
    mode.add_argument("--print", metavar="VERSION", help="print the patch for one release")
    p.add_argument("--wheelhouse", type=Path, default=None, help="folder with deepspeed-*.tar.gz")
    p.add_argument("--patch-dir", type=Path, default=PATCH_DIR)
    p.add_argument("--versions", nargs="+", default=None, help="releases (default: the shipped ones)")


@command(
    "patches", "check, write or print patches/deepspeed-<version>.patch from the fix's text", _patches_options
)
def cmd_patches(args: argparse.Namespace) -> int:
    from repro.upstream import patchgen

    wheelhouse = args.wheelhouse or patchgen.default_wheelhouse()
    versions = args.versions or list(patchgen.SHIPPED)
    if args.print:
        sys.stdout.write(patchgen.generate(args.print, wheelhouse)[0])
        return 0
    if args.write:
        args.patch_dir.mkdir(parents=True, exist_ok=True)
        for version in versions:
            text, diffs = patchgen.generate(version, wheelhouse)
            path = patchgen.patch_file(version, args.patch_dir)
            path.write_text(text)
            console.result(f"wrote {path}: {patchgen.stats(diffs)}")
        return 0
    drifted = patchgen.check(versions, wheelhouse, args.patch_dir)
    if drifted:
        raise patchgen.PatchDriftError(
            f"shipped patches differ from repro/workload/fix.py for {', '.join(drifted)}",
            why="the fix's text changed (or a patch was edited by hand)",
            fix="run `python -m repro patches --write` and review the diff",
        )
    return 0


def _bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default="cpu")
    p.add_argument("--engine", default="venv")
    p.add_argument("--ds-repo", default=None, help="with --deepspeed-commit: also time a warm commit probe")
    p.add_argument("--deepspeed-commit", default=None, help="the commit (ref) of --ds-repo to probe")
    p.add_argument(
        "--no-hang",
        action="store_true",
        help="skip the hung vs clean probe pair (torch 2.13.0, DeepSpeed 0.19.2/0.19.3: two env builds once)",
    )


@command(
    "bench",
    "time one env warm: the full suite under torchrun and prefork, the bare start-up of the same jobs, "
    "a hung vs a clean probe, a probe, env reuse",
    _bench_options,
)
def cmd_bench(args: argparse.Namespace) -> int:
    from repro.run.bench import bench

    return bench(args.env, args.engine, args.ds_repo, args.deepspeed_commit, hang=not args.no_hang)
