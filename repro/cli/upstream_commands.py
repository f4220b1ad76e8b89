"""Subcommands for handing the reproduction upstream: bundle, verify-bundle, cluster, pr-regression."""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.cli.options import DEFAULT_RESULTS_ROOT, RunTarget, add_matrix_option
from repro.cli.registry import command
from repro.core import console, safe_write, script_values
from repro.core.errors import DockerUnavailableError, UsageError
from repro.core.make_options import reproduce_pairs
from repro.core.makeline import make_line
from repro.core.paths import REPO_ROOT, check_output_folder
from repro.core.results import new_invocation_dir, resolve_results_dir
from repro.run.orchestrate import Request
from repro.run.usecase import load_matrix, run_request
from repro.workload.record import DTYPES

if TYPE_CHECKING:
    from repro.core.scrub import Scrubber


def _docker_client() -> Any:
    from repro.engines.docker.engine import DockerEngine, daemon_status

    up, why = daemon_status()
    if not up:
        raise DockerUnavailableError(
            "a bundle needs a Docker daemon",
            why=why,
            fix="start one (.ci/start-docker.sh on Debian) or set DOCKER_HOST",
        )
    return DockerEngine.connect().client


def _scrubber() -> Scrubber:
    """What a bundle and an issue scrub: this host's names, the repository's and the cache's paths."""
    from repro.core.scrub import Scrubber

    cache = os.environ.get("MICS_REPRO_CACHE")
    return Scrubber.from_host(paths={"<repo>": str(REPO_ROOT), **({"<cache>": cache} if cache else {})})


def _bundle_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help="env id (default: the matrix default, cpu)")
    p.add_argument("--out", default=None, help="bundle folder (default bundles/<env>/); never overwritten")
    p.add_argument(
        "--results",
        default=None,
        help="results folder of a Docker run of the env (default: run `make repro ENV=` now)",
    )
    p.add_argument(
        "--gzip-level",
        type=int,
        default=1,
        choices=range(1, 10),
        metavar="1-9",
        help="gzip level of image.tar.gz (1: fastest, default)",
    )
    p.add_argument("--no-archive", action="store_true", help="skip bundles/<env>.tar")
    p.add_argument("--keep-image", action="store_true", help="keep the flattened image after saving it")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    add_matrix_option(p)


def _run_repro_first(env_id: str, results_root: Path, matrix: str | None) -> Path:
    """`make repro ENV=<env> ENGINE=docker` into a fresh results folder; returns it."""
    folder = new_invocation_dir(results_root, [env_id])
    argv = [
        "repro",
        "--env",
        env_id,
        "--engine",
        "docker",
        "--out",
        str(folder),
        "--results-root",
        str(results_root),
    ]
    if matrix:
        argv += ["--matrix", matrix]
    target = RunTarget(
        engine="docker",
        results_root=results_root,
        out=folder,
        matrix=matrix,
        argv=tuple(argv),
        make_command=make_line("repro", reproduce_pairs({"ENV": env_id, "ENGINE": "docker"})),
    )
    console.info(f"bundle: no RESULTS= given; running the reproduction of {env_id} in Docker first")
    run_request(Request(env_ids=(env_id,)), target)
    return folder


@command(
    "bundle",
    "package an env's image, results, report, fix and issue comment for maintainers",
    _bundle_options,
)
def cmd_bundle(args: argparse.Namespace) -> int:
    from repro.upstream.bundle.make import BundleRequest, default_out, make_bundle, summary

    matrix = load_matrix(args.matrix)
    env_id = args.env or matrix.default_id
    if "+" not in env_id:
        matrix.get(env_id)  # an unknown id fails here with the list of valid ones
    if args.out:  # before anything is built: a file in the way is a usage error, not a traceback
        check_output_folder(Path(args.out))
    client = _docker_client()
    root = Path(args.results_root)
    results = (
        resolve_results_dir(root, args.results)
        if args.results
        else _run_repro_first(env_id, root, args.matrix)
    )
    scrubber = _scrubber()
    request = BundleRequest(
        env_id=env_id,
        out=Path(args.out) if args.out else default_out(env_id),
        results=results,
        gzip_level=args.gzip_level,
        archive=not args.no_archive,
        keep_image=args.keep_image,
    )
    console.result(summary(make_bundle(request, client, scrubber)))
    return 0


def _verify_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", required=True, help="bundle folder or its .tar archive")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    p.add_argument("--remove-image", action="store_true", help="remove the loaded image afterwards")
    p.add_argument(
        "--reuse-image",
        action="store_true",
        help="use the manifest's image if Docker already has it (by id) instead of loading the tarball, "
        "whose hash is still checked (make: REUSE_IMAGE=1)",
    )
    p.add_argument(
        "--allow-gpu-privileges",
        action="store_true",
        help="consent to a ROCm/CUDA bundle's device access and weaker isolation (make: ALLOW_PRIVILEGES=1)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="a custom command's working directory, when the bundle says it was too large to carry",
    )


@command(
    "verify-bundle",
    "load a bundle's image, rerun the reproduction offline, compare with its manifest",
    _verify_options,
)
def cmd_verify_bundle(args: argparse.Namespace) -> int:
    from repro.upstream.bundle.verify import report, require_match, verify

    clients: list[Any] = []  # Docker is asked for only once the bundle itself has passed its checks

    def connect() -> Any:
        clients.append(_docker_client())
        return clients[-1]

    result = verify(
        Path(args.bundle),
        None,
        Path(args.results_root),
        argv=list(args.argv),
        connect=connect,
        allow_privileges=args.allow_gpu_privileges,
        workdir=args.workdir,
        reuse_image=args.reuse_image,
    )
    console.result(report(result))
    if args.remove_image and clients:
        clients[-1].images.remove(result.image_id, force=True)
    require_match(result)
    return 0


def _cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layout", default="reporter", help="reporter | cpu-twin")
    p.add_argument("--platform", choices=("rocm", "cuda", "cpu"), default=None)
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--procs-per-node", type=int, default=None)
    p.add_argument("--ndev-per-node", type=int, default=None)
    p.add_argument("--shard-size", type=int, default=None)
    p.add_argument("--dtype", default=None, help="fp32|bf16|fp16 (default: the layout's)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--env", default="rocm56", help="env id the image belongs to (names and comments)")
    p.add_argument("--image-ref", default=None, help="image tag after docker load")


@command(
    "cluster",
    "write Slurm (Apptainer/Singularity) and torchrun launchers for a multi-node run",
    _cluster_options,
)
def cmd_cluster(args: argparse.Namespace) -> int:
    from repro.upstream.cluster import scripts as cluster

    if args.layout not in cluster.LAYOUTS:
        raise UsageError(
            f"LAYOUT={args.layout} is not valid", fix=f"use one of: {', '.join(sorted(cluster.LAYOUTS))}"
        )
    if args.dtype is not None and args.dtype not in DTYPES:
        raise UsageError(f"DTYPE={args.dtype} is not valid", fix=f"use one of: {', '.join(DTYPES)}")
    overrides = {
        key: value
        for key, value in (
            ("platform", args.platform),
            ("nodes", args.nodes),
            ("procs_per_node", args.procs_per_node),
            ("ndev_per_node", args.ndev_per_node),
            ("shard_size", args.shard_size),
            ("dtype", args.dtype),
            ("steps", args.steps),
        )
        if value is not None
    }
    layout = replace(cluster.LAYOUTS[args.layout], **overrides)
    # Both are written into the job script and its launcher: refused here, before anything is written.
    script_values.name(args.env, "ENV= (--env)")
    if args.image_ref is not None:
        script_values.image_ref(args.image_ref, "--image-ref")
    scripts = cluster.render(
        layout, env_id=args.env, image_ref=args.image_ref or f"mics-repro-bundle:{args.env}"
    )
    for path in cluster.write(scripts, args.out):
        console.result(f"wrote {path}")
    return 0


def _pr_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--python",
        default=None,
        help="python of a venv with torch + DeepSpeed (default $MICS_TEST_PYTHON_T21)",
    )
    p.add_argument("--variant", choices=("stock", "patched", "both"), default="both")
    p.add_argument("--transport", default="async", choices=("async", "sync", "strict"))
    p.add_argument("--work", type=Path, default=None, help="folder for reports and the patched copy")


@command(
    "pr-regression",
    "run the PR's regression test on stock, then patched DeepSpeed (fail, then pass)",
    _pr_options,
)
def cmd_pr_regression(args: argparse.Namespace) -> int:
    from repro.upstream.pr.regression import RegressionTestError, Variant, discriminates, run_variant, summary

    python = args.python or os.environ.get("MICS_TEST_PYTHON_T21")
    if not python:
        raise UsageError(
            "no venv python given", fix="pass --python (PYTHON_VENV= with make) or set MICS_TEST_PYTHON_T21"
        )
    # --work new or empty: the patched copy and the pytest reports never mix with the user's files.
    work = (
        safe_write.claim_folder(args.work, option="--work", owned_by=())
        if args.work
        else Path(tempfile.mkdtemp(prefix="mics-pr-"))
    )
    variants = [Variant.STOCK, Variant.PATCHED] if args.variant == "both" else [Variant(args.variant)]
    runs = [run_variant(python, v, work / v.value, args.transport) for v in variants]
    console.result(summary(runs))
    if len(runs) == 2:
        problems = discriminates(*runs)
        if problems:
            raise RegressionTestError(
                "the regression test does not tell stock from patched DeepSpeed",
                why="; ".join(problems),
                fix=f"read the pytest logs in {work}",
            )
        console.result("ok: every test fails on stock DeepSpeed and passes with the patch")
    return 0


def _issue_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--results", default=None, help="a run, repro, bisect or survey results folder (default: the latest)"
    )
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    p.add_argument("--out", default=None, help="where to write it (default RESULTS/ISSUE.md)")


@command("issue", "write ISSUE.md for the upstream tracker from a results folder of any kind", _issue_options)
def cmd_issue(args: argparse.Namespace) -> int:
    from repro.upstream.issue.make import write

    folder = resolve_results_dir(Path(args.results_root), args.results, console.info)
    scrubber = _scrubber()
    path = write(folder, scrubber, Path(args.out) if args.out else None)
    console.result(f"issue: {path}")
    return 0
