"""`run` (a user's own command in an env, stock and fixed, judged from its output) and `shell`
(an interactive shell in an env with the same interpreter-start hook). docs/own-job.md."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from repro.cli.options import DEFAULT_RESULTS_ROOT, add_matrix_option, add_resume_option, csv
from repro.cli.registry import command
from repro.core import cmd, console
from repro.core.errors import UsageError
from repro.core.flags import env_bool
from repro.core.paths import cache_root
from repro.engines import jobdeps
from repro.engines.base import REPO_ROOT
from repro.run.job import JobRequest, inherited_environment
from repro.run.shellrc import launch
from repro.run.usecase import load_matrix
from repro.workload.record import CPU_TRANSPORTS, PATCHES

if TYPE_CHECKING:
    from repro.engines.base import Engine
    from repro.matrix.model import Env


# What a DEEPSPEED_SRC= checkout that does not build or import means for `make run`.
DS_SRC_FAILED = "the checkout must build with DS_BUILD_OPS=0 over the env's torch: see pip's output above"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help="env id (default: the matrix default, cpu)")
    p.add_argument("--engine", default=None, help="docker|venv|auto (default: $ENGINE or auto)")
    p.add_argument(
        "--transport",
        default="async",
        choices=CPU_TRANSPORTS,
        help="CPU envs: the gloo adapter's mode (default async), or plain (gloo as torch ships it)",
    )
    add_matrix_option(p)


def _run_options(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--cmd", required=True, help='the command, e.g. "torchrun --nproc_per_node 2 train.py"')
    p.add_argument("--patch", default=",".join(PATCHES), help="comma-separated stock,fixed (default both)")
    p.add_argument("--workdir", default=".", help="folder the command runs in (default .)")
    p.add_argument("--loss-regex", default=None, help="regex with a group `loss` (and optional `step`)")
    p.add_argument("--timeout", type=float, default=1800.0, help="time limit per run, seconds")
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=300.0,
        help="no output and no DeepSpeed step for this long: hung (seconds)",
    )
    p.add_argument("--network", action="store_true", help="Docker engine: give the container a network")
    p.add_argument(
        "--deepspeed-src",
        default=None,
        help="venv engine: a DeepSpeed checkout pip-installed into a layer over the env, not its release",
    )
    _deps_options(p)
    p.add_argument("--out", default=None, help="results folder (default results/<timestamp>-<env>)")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    add_resume_option(p, "stock/fixed runs")


def _deps_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--requirements",
        default=None,
        help="the job's own packages (a requirements file), installed as a layer over the env",
    )
    p.add_argument("--packages", default=None, help='the job\'s own packages as a list, e.g. "a==1 b"')


def _env(args: argparse.Namespace) -> Env:
    matrix = load_matrix(args.matrix)
    return matrix.get(args.env or matrix.default_id)


def _engine(choice: str | None, *, shell: bool = False) -> Engine:
    """As for `make repro` (ENGINE=auto: Docker when its daemon answers); `shell` needs a venv."""
    from repro.engines.select import choose_engine

    if shell:
        name = choice or os.environ.get("ENGINE") or "venv"
        if name not in ("venv", "auto"):
            raise UsageError(
                f"ENGINE={name}: make shell opens a shell in the env's venv only",
                fix="use ENGINE=venv, or `docker run -it <the env's image> bash`",
            )
        return choose_engine("venv")
    return choose_engine(choice or None)


def job_request(args: argparse.Namespace, env_id: str, platform: str, environ: dict[str, str]) -> JobRequest:
    """`run`'s options and the user's environment as a JobRequest (its reproduce line says them back)."""
    return JobRequest(
        env_id=env_id,
        command=args.cmd,
        patches=csv(args.patch) or (),
        workdir=Path(args.workdir),
        transport=args.transport,
        loss_regex=args.loss_regex,
        timeout_s=args.timeout,
        stall_s=args.stall_timeout,
        network=args.network,
        deps=jobdeps.parse(args.requirements, args.packages),
        engine=args.engine or environ.get("ENGINE") or None,
        deepspeed_src=Path(args.deepspeed_src) if args.deepspeed_src else None,
        inherited=inherited_environment(environ, platform),
    )


@command("run", "run YOUR command in an env, stock and fixed, judged from its own output", _run_options)
def cmd_run(args: argparse.Namespace) -> int:
    from repro.core.results import discard_unused, open_results, resumable
    from repro.run.job import custom_lines, describe, execute_job, reproduce_line
    from repro.run.job_resume import check_same_job
    from repro.run.summary import render

    env = _env(args)
    request = job_request(args, env.id, env.platform.value, dict(os.environ))
    engine = _engine(args.engine)
    if request.deepspeed_src is not None:
        from repro.bisect.source_overlay import SourceOverlay

        engine = SourceOverlay(engine, request.deepspeed_src, failure_fix=DS_SRC_FAILED)
    root = Path(args.results_root)
    out = Path(args.out) if args.out else None
    line = reproduce_line(request)
    # `make run RESUME=1`: make hands its command-line variables to the recipe's environment
    resumed = resumable(root, out, args.resume or env_bool("RESUME", os.environ))
    opened = open_results(root, out, [env.id], list(args.argv), line, resumed)
    folder, invocation = opened.folder, opened.invocation
    if resumed is not None:
        check_same_job(invocation.data["envs"], env.id, request.command, folder)
        console.result(f"resume: {folder}")
    console.result(describe(request, engine.describe()))
    console.result(f"results: {folder}")
    try:
        runs = execute_job(request, env, engine, invocation, resume=resumed is not None)
    except BaseException:
        # Nothing ran (the env could not be prepared): no results folder, latest stays where it was.
        if not invocation.data["envs"] and discard_unused(folder, opened.made, root, opened.previous_latest):
            console.result(f"nothing was recorded; removed {folder}")
        raise
    console.result("")
    console.result(render(runs, str(folder)))
    console.result("\ncustom command:")
    console.result("\n".join(f"  {text}" for text in custom_lines(runs)))
    console.result(f"\nreproduce: {line}")
    return 0


def _shell_options(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--patch", default="stock", choices=PATCHES, help="stock or fixed (default stock)")
    _deps_options(p)


@command(
    "shell",
    "an interactive shell in an env with the startup hook active (PATCH=fixed applies the fix)",
    _shell_options,
)
def cmd_shell(args: argparse.Namespace) -> int:
    from repro.workload.job import hook_environment

    env = _env(args)
    deps = jobdeps.parse(args.requirements, args.packages)
    if deps is not None:
        jobdeps.check_pins(deps, env.package_pins(), env_id=env.id, python=env.python)
    engine = _engine(args.engine, shell=True)
    engine.preflight(env)
    prepared = engine.prepare(env)
    if deps is not None:
        prepared, _layer = engine.prepare_job(env, prepared, deps)
    bin_dir = str(Path(prepared.handle) / "bin")
    _install_hook_pth(bin_dir)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base["PATH"] = os.pathsep.join((bin_dir, base.get("PATH", "")))
    base["VIRTUAL_ENV"] = prepared.handle
    shell_env = hook_environment(
        base,
        patch=args.patch,
        device="cpu" if env.platform.value == "cpu" else "gpu",
        transport=args.transport,
        job_dir=None,
        user_pythonpath=os.environ.get("PYTHONPATH"),
    )
    # hook_environment put this (host) interpreter's folder first; the env's venv must win, also
    # over what the user's rc files put first (conda/pyenv init): our rc file runs after theirs.
    shell_env["PATH"] = os.pathsep.join((bin_dir, shell_env["PATH"]))
    prompt = f"({env.id} {args.patch}) "
    shell_env["PS1"] = prompt + "\\w$ "
    started = launch(
        os.environ.get("SHELL"),
        bin_dir,
        prepared.handle,
        prompt,
        cache_root() / "shell" / f"{Path(prepared.handle).name}-{args.patch}",  # rewritten each time
        dict(os.environ),
    )
    shell_env.update(started.env)
    if started.note:
        print(started.note)
    print(
        f"{env.id} ({prepared.label}), patch {args.patch}: the hook is active in every python; exit to leave"
    )
    # exec, not the subprocess door: an interactive shell needs this terminal's session and job
    # control, which cmd.run's new session (for stopping process groups) would take away.
    os.execvpe(started.argv[0], started.argv, shell_env)
    return 0  # not reached


def _install_hook_pth(bin_dir: str) -> None:
    """The hook's .pth in the env's site-packages (repro/workload/hookpth.py): a python started in
    the shell with its own PYTHONPATH is hooked too."""
    python = Path(bin_dir) / "python"
    if python.exists():
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(REPO_ROOT)
        cmd.run([str(python), "-m", "repro.workload.hookpth"], env=env, capture=True, echo=False)
