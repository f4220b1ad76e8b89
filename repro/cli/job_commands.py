"""`run` (a user's own command in an env, stock and fixed, judged from its output) and `shell`
(an interactive shell in an env with the same interpreter-start hook). README "Your own job"."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from repro.cli.options import DEFAULT_RESULTS_ROOT, add_matrix_option, csv
from repro.cli.registry import command
from repro.core.errors import UsageError
from repro.core.makeline import make_line
from repro.workload.record import PATCHES, TRANSPORT_MODES


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help="env id (default: the matrix default, cpu)")
    p.add_argument("--engine", default=None, help="docker|venv|auto (default: $ENGINE or auto)")
    p.add_argument(
        "--transport",
        default="async",
        choices=TRANSPORT_MODES,
        help="gloo adapter mode on CPU envs (default async)",
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
    p.add_argument("--out", default=None, help="results folder (default results/<timestamp>-<env>)")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))


def _env(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from repro.matrix.schema import load_matrix

    matrix = load_matrix(args.matrix) if args.matrix else load_matrix()
    return matrix.get(args.env or matrix.default_id)


def _engine(choice: str | None, *, shell: bool = False):  # type: ignore[no-untyped-def]
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


@command("run", "run YOUR command in an env, stock and fixed, judged from its own output", _run_options)
def cmd_run(args: argparse.Namespace) -> int:
    from repro.core.results import InvocationDir, invocation_meta, open_invocation_dir, point_latest
    from repro.run.job import JobRequest, custom_lines, describe, execute_job
    from repro.run.summary import render

    env = _env(args)
    request = JobRequest(
        env_id=env.id,
        command=args.cmd,
        patches=csv(args.patch) or (),
        workdir=Path(args.workdir),
        transport=args.transport,
        loss_regex=args.loss_regex,
        timeout_s=args.timeout,
        stall_s=args.stall_timeout,
        network=args.network,
    )
    engine = _engine(args.engine)
    root = Path(args.results_root)
    out = Path(args.out) if args.out else None
    folder, _made = open_invocation_dir(root, out, [env.id])
    line = make_line(
        "run",
        [
            ("ENV", args.env),
            ("CMD", args.cmd),
            ("PATCH", args.patch),
            ("WORKDIR", args.workdir),
            ("TRANSPORT", args.transport),
            ("LOSS_REGEX", args.loss_regex),
        ],
    )
    invocation = InvocationDir(folder, invocation_meta(list(args.argv), line))
    invocation.save()
    if out is None:
        point_latest(root, folder)
    print(describe(request, engine.describe()))
    print(f"results: {folder}")
    runs = execute_job(request, env, engine, invocation)
    print()
    print(render(runs, str(folder)))
    print("\ncustom command:")
    print("\n".join(f"  {line}" for line in custom_lines(runs)))
    return 0


def _shell_options(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--patch", default="stock", choices=PATCHES, help="stock or fixed (default stock)")


@command(
    "shell",
    "an interactive shell in an env with the startup hook active (PATCH=fixed applies the fix)",
    _shell_options,
)
def cmd_shell(args: argparse.Namespace) -> int:
    from repro.workload.job import hook_environment

    env = _env(args)
    engine = _engine(args.engine, shell=True)
    engine.preflight(env)
    prepared = engine.prepare(env)
    bin_dir = str(Path(prepared.handle) / "bin")
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
    # hook_environment put this (host) interpreter's folder first; the env's venv must win.
    shell_env["PATH"] = os.pathsep.join((bin_dir, shell_env["PATH"]))
    shell_env["PS1"] = f"({env.id} {args.patch}) \\w$ "
    print(
        f"{env.id} ({prepared.label}), patch {args.patch}: the hook is active in every python; exit to leave"
    )
    # exec, not the subprocess door: an interactive shell needs this terminal's session and job
    # control, which cmd.run's new session (for stopping process groups) would take away.
    shell = os.environ.get("SHELL") or "/bin/bash"
    os.execvpe(shell, [shell, "-i"], shell_env)
    return 0  # not reached
