"""The core subcommands: list, build, repro, check-fix, matrix, report, base-image."""

from __future__ import annotations

import argparse
import shutil
from dataclasses import replace
from pathlib import Path

from repro.cli.options import (
    DEFAULT_RESULTS_ROOT,
    add_matrix_option,
    add_run_options,
    request_from_args,
    run_target_from_args,
)
from repro.cli.registry import command
from repro.core import console, safe_write
from repro.core.errors import UsageError
from repro.core.paths import REPO_ROOT
from repro.core.results import resolve_results_dir
from repro.engines.base import as_built
from repro.engines.preflight import host_can_run
from repro.run.orchestrate import describe, plan
from repro.run.usecase import check_fix_outcome, load_matrix, run_request
from repro.run.usecase import choose_engine as _engine  # the seam tests replace (stand_in_engine.py)
from repro.workload.record import RunRecord


@command("list", "list the envs of the matrix and whether this host can run them", add_matrix_option)
def cmd_list(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    console.result(
        f"{'env':<14} {'platform':<8} {'torch':<8} {'deepspeed':<10} {'rocm/cuda':<10} {'here':<5} notes"
    )
    for env_id in matrix.ids():
        env = matrix.get(env_id)
        ok, _why = host_can_run(env)
        accel = env.rocm or env.cuda or "-"
        default = " (default)" if env_id == matrix.default_id else ""
        console.result(
            f"{env_id:<14} {env.platform.value:<8} {env.torch:<8} {env.deepspeed:<10} {accel:<10} "
            f"{'yes' if ok else 'no':<5} {env.notes.splitlines()[0] if env.notes else ''}{default}"
        )
    return 0


@command("build", "build (or reuse) the image / venv of an env", add_run_options)
def cmd_build(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    steps = plan(matrix, request_from_args(args, matrix.default_id))
    if args.dry_run:
        from repro.engines.docker.buildplan import dry_run_text
        from repro.engines.venv.engine import dry_run_text as venv_dry_run_text

        for step in steps:
            console.result(dry_run_text(step.env))
            console.result(venv_dry_run_text(step.env))
        return 0
    engine = _engine(args.engine)
    for step in steps:
        engine.preflight(step.env)
    steps = [replace(step, env=as_built(engine, step.env)) for step in steps]
    console.info(describe(steps, engine.describe()))
    for step in steps:
        prepared = engine.prepare(step.env)
        console.info(f"{step.env.id}: {'reused' if prepared.reused else 'built'} {prepared.label}")
    return 0


def _run(
    args: argparse.Namespace, *, fixed_only: bool = False, env_ids: tuple[str, ...] | None = None
) -> list[RunRecord]:
    matrix = load_matrix(args.matrix)
    request = request_from_args(args, matrix.default_id)
    if env_ids is not None:
        request = replace(request, env_ids=env_ids)
    if fixed_only:
        request = replace(request, patches=("fixed",), sync_proof=False)
    return run_request(request, run_target_from_args(args), matrix, engine_for=_engine)


@command(
    "repro", "run the control and the MiCS scenarios, stock and fixed, and print the verdict", add_run_options
)
def cmd_repro(args: argparse.Namespace) -> int:
    _run(args)
    return 0


@command(
    "check-fix",
    "run the fixed MiCS scenarios (and the control); exit non-zero unless all are clean",
    add_run_options,
)
def cmd_check_fix(args: argparse.Namespace) -> int:
    runs = _run(args, fixed_only=True)
    if not args.dry_run:
        check_fix_outcome(runs)  # the one verdict's answer; raises its exit code
    return 0


@command("matrix", "run the reproduction in every env this host can run", add_run_options)
def cmd_matrix(args: argparse.Namespace) -> int:
    matrix = load_matrix(args.matrix)
    runnable: list[str] = []
    skipped: list[str] = []
    for env_id in matrix.ids():
        ok, why = host_can_run(matrix.get(env_id))
        (runnable if ok else skipped).append(env_id if ok else f"{env_id} ({why})")
    for line in skipped:
        console.info(f"skipping {line}")
    if not runnable:
        raise UsageError("no env of the matrix can run on this host")
    _run(args, env_ids=tuple(runnable))
    return 0


def _report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results", default=None, help="results folder(s), comma-separated (default results/latest)"
    )
    p.add_argument(
        "--out", default=None, help="where report.html and REPORT.md go (default: first results folder)"
    )
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))


@command("report", "write report.html and REPORT.md from one or more results folders", _report_options)
def cmd_report(args: argparse.Namespace) -> int:
    from repro.report import build_report

    root = Path(args.results_root)
    given = [s for s in (args.results or "").split(",") if s.strip()]
    folders = [resolve_results_dir(root, g, console.info) for g in given] or [
        resolve_results_dir(root, None, console.info)
    ]
    out = Path(args.out) if args.out else folders[0]
    paths = build_report(folders, out)
    for path in (paths.html, paths.markdown):
        console.result(f"wrote {path}")
    return 0


def _base_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="rebuild even if the image exists")


@command("base-image", "make the local CPU base image with debootstrap (no registry needed)", _base_options)
def cmd_base_image(args: argparse.Namespace) -> int:
    from repro.engines.docker.base_image import make_base_image

    make_base_image(force=args.force)
    return 0


@command("clean", "remove results/ and temporary build folders (not the download/venv cache)")
def cmd_clean(args: argparse.Namespace) -> int:
    paths = (DEFAULT_RESULTS_ROOT, REPO_ROOT / "bundles", REPO_ROOT / "test-artifacts")
    for path in paths:  # all checked before anything is removed
        if path.is_symlink():
            # What the link leads to was not made by this tool; removing the link alone would
            # look like a clean that did not clean.
            raise safe_write.link_error(
                path, fix=f"remove the link {path} yourself if it is no longer needed"
            )
    for path in paths:
        if path.exists():
            shutil.rmtree(path)
            console.result(f"removed {path}")
    _remove_stand_in_images()
    return 0


def _remove_stand_in_images() -> None:
    # The test suite's stand-in GPU images (repro/engines/docker/standin.py), when Docker answers.
    from repro.engines.docker.standin import remove_stand_ins, stand_in_client

    try:
        client = stand_in_client()
    except Exception:  # no docker-py, no daemon: nothing of ours can be there to remove
        return
    for tag in remove_stand_ins(client):
        console.result(f"removed image {tag}")


def _venv_python_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", required=True, help="env id (derived ids like cpu+torch2.2.2 work too)")
    add_matrix_option(p)


@command(
    "venv-python",
    "build (or reuse) an env's cached venv and print its interpreter's path last",
    _venv_python_options,
)
def cmd_venv_python(args: argparse.Namespace) -> int:
    # For scripts and CI: `PY=$(python -m repro venv-python --env cpu | tail -n 1)`.
    from repro.engines.venv.engine import VenvEngine

    engine = VenvEngine()
    env = load_matrix(args.matrix).get(args.env)
    engine.preflight(env)
    prepared = engine.prepare(env)
    console.result(prepared.details["python"])
    return 0
