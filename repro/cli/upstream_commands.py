"""Subcommands for handing the reproduction upstream: bundle, verify-bundle, cluster, pr-regression."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from repro.cli.main import DEFAULT_RESULTS_ROOT, REPO_ROOT, build_parser, command
from repro.core.errors import DockerUnavailableError, UsageError


def _docker_client() -> Any:
    from repro.engines.docker.engine import DockerEngine, daemon_status

    up, why = daemon_status()
    if not up:
        raise DockerUnavailableError("a bundle needs a Docker daemon", why=why,
                                     fix="start one (.ci/start-docker.sh on Debian) or set DOCKER_HOST")
    return DockerEngine.connect().client


def _bundle_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help="env id (default: the matrix default, cpu)")
    p.add_argument("--out", default=None, help="bundle folder (default bundles/<env>/); never overwritten")
    p.add_argument("--results", default=None,
                   help="results folder of a Docker run of the env (default: run `make repro ENV=` now)")
    p.add_argument("--gzip-level", type=int, default=1, choices=range(1, 10), metavar="1-9",
                   help="gzip level of image.tar.gz (1: fastest, default)")
    p.add_argument("--no-archive", action="store_true", help="skip bundles/<env>.tar")
    p.add_argument("--keep-image", action="store_true", help="keep the flattened image after saving it")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    p.add_argument("--matrix", default=None)


def _run_repro_first(env_id: str, results_root: Path, matrix: str | None) -> Path:
    """`make repro ENV=<env> ENGINE=docker` into a fresh results folder; returns it."""
    from repro.cli.run_commands import _run
    from repro.core.results import new_invocation_dir

    folder = new_invocation_dir(results_root, [env_id])
    argv = ["repro", "--env", env_id, "--engine", "docker", "--out", str(folder),
            "--results-root", str(results_root)]
    if matrix:
        argv += ["--matrix", matrix]
    args = build_parser().parse_args(argv)
    args.argv = argv
    print(f"bundle: no RESULTS= given; running the reproduction of {env_id} in Docker first")
    _run(args)
    return folder


@command("bundle", "package an env's image, results, report, fix and issue comment for maintainers",
         _bundle_options)
def cmd_bundle(args: argparse.Namespace) -> int:
    from repro.core.results import resolve_results_dir
    from repro.matrix.schema import load_matrix
    from repro.upstream.bundle import BundleRequest, default_out, make_bundle, summary
    from repro.upstream.scrub import Scrubber

    matrix = load_matrix(args.matrix) if args.matrix else load_matrix()
    env_id = args.env or matrix.default_id
    if "+" not in env_id:
        matrix.get(env_id)  # an unknown id fails here with the list of valid ones
    client = _docker_client()
    root = Path(args.results_root)
    results = (resolve_results_dir(root, args.results) if args.results
               else _run_repro_first(env_id, root, args.matrix))
    cache = os.environ.get("MICS_REPRO_CACHE")
    scrubber = Scrubber.from_host(paths={"<repo>": str(REPO_ROOT), **({"<cache>": cache} if cache else {})})
    request = BundleRequest(env_id=env_id, out=Path(args.out) if args.out else default_out(env_id),
                            results=results, gzip_level=args.gzip_level, archive=not args.no_archive,
                            keep_image=args.keep_image)
    print(summary(make_bundle(request, client, scrubber)))
    return 0


def _verify_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", required=True, help="bundle folder or its .tar archive")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    p.add_argument("--remove-image", action="store_true", help="remove the loaded image afterwards")


@command("verify-bundle", "load a bundle's image, rerun the reproduction offline, compare with its manifest",
         _verify_options)
def cmd_verify_bundle(args: argparse.Namespace) -> int:
    from repro.upstream.verify_bundle import report, require_match, verify

    client = _docker_client()
    result = verify(Path(args.bundle), client, Path(args.results_root), argv=list(args.argv))
    print(report(result))
    if args.remove_image:
        client.images.remove(result.image_id, force=True)
    require_match(result)
    return 0


def _cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True)
    p.add_argument("--layout", default="reporter", help="reporter | cpu-twin")
    p.add_argument("--env", default="rocm56")
    p.add_argument("--image-ref", default=None)


@command("cluster", "write Slurm (Apptainer/Singularity) and torchrun launchers for a multi-node run",
         _cluster_options)
def cmd_cluster(args: argparse.Namespace) -> int:
    from repro.upstream.cluster import main as cluster_main

    argv = ["--out", args.out, "--layout", args.layout, "--env", args.env]
    if args.image_ref:
        argv += ["--image-ref", args.image_ref]
    return cluster_main(argv)


def _pr_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--python", default=None,
                   help="python of a venv with torch + DeepSpeed (default $MICS_TEST_PYTHON_T21)")
    p.add_argument("--transport", default="async", choices=("async", "sync", "strict"))


@command("pr-regression", "run the PR's regression test on stock, then patched DeepSpeed (fail, then pass)",
         _pr_options)
def cmd_pr_regression(args: argparse.Namespace) -> int:
    from repro.upstream.pr_regression import main as pr_main

    python = args.python or os.environ.get("MICS_TEST_PYTHON_T21")
    if not python:
        raise UsageError("no venv python given",
                         fix="pass --python (PYTHON= with make) or set MICS_TEST_PYTHON_T21")
    return pr_main(["--python", python, "--transport", args.transport])


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: python -m repro bundle|verify-bundle|cluster|pr-regression")
