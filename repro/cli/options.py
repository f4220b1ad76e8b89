"""Option definitions shared by several subcommands, and the one translation of run options
into the typed `Request` that everything below the CLI takes (no argparse.Namespace there)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from repro.core import paths
from repro.core.errors import UsageError
from repro.core.flags import env_bool
from repro.core.make_options import checked_pairs
from repro.core.makeline import make_line
from repro.run.orchestrate import Request
from repro.run.usecase import RunTarget as RunTarget  # the CLI builds it; the use case owns it
from repro.workload.record import PATCHES, SCENARIOS

DEFAULT_RESULTS_ROOT = paths.DEFAULT_RESULTS_ROOT


def csv(text: str | None) -> tuple[str, ...] | None:
    if text is None or not text.strip():
        return None
    return tuple(t.strip() for t in text.split(",") if t.strip())


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--env", default=None, help="env id(s), comma-separated (default: the matrix default, cpu)"
    )
    p.add_argument("--engine", default=None, help="docker|venv|auto (default: $ENGINE or auto)")
    p.add_argument("--torch", default=None, help="override the env's torch pin (derived env)")
    p.add_argument("--deepspeed", default=None, help="override the env's DeepSpeed pin (derived env)")
    p.add_argument("--scenarios", default=None, help=f"comma-separated subset of {','.join(SCENARIOS)}")
    p.add_argument("--patch", default=None, help=f"comma-separated subset of {','.join(PATCHES)}")
    p.add_argument("--dtype", default=None, help="fp32|bf16|fp16 (default: the config's, else fp32)")
    p.add_argument(
        "--transport",
        default=None,
        help="CPU transports: the gloo adapter's modes async,sync,strict (default async), or plain "
        "(gloo as torch ships it, no adapter)",
    )
    p.add_argument("--config", default=None, help="your DeepSpeed config JSON")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (>= 1)")
    p.add_argument("--world-size", type=int, default=None, help="ranks per run (even, >= 2)")
    p.add_argument("--timeout", type=float, default=None, help="per-run time limit in seconds (> 0)")
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        help="a run with no training step for this many seconds is hung (default 60)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="runs at once inside an env (default: 1 on GPUs, on CPU max(2, cores // ranks))",
    )
    p.add_argument(
        "--launcher",
        default=None,
        help="how ranks start: prefork (CPU default: forked from one process that imported torch "
        "and DeepSpeed once), torchrun (one torchrun per run; GPUs always), auto",
    )
    p.add_argument(
        "--no-sync-proof",
        action="store_true",
        help="skip the extra mics stock run over the sync transport (the cause control)",
    )
    p.add_argument("--out", default=None, help="results folder (default: results/<timestamp>-<envs>)")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    add_matrix_option(p)
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    add_resume_option(p, "runs")


def add_resume_option(p: argparse.ArgumentParser, runs: str) -> None:
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"finish an interrupted run in --out (default results/latest): run again only the {runs} "
        "that did not finish, into the same results.json (make: RESUME=1)",
    )


def add_matrix_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--matrix", default=None, help="env matrix TOML (default env_matrix/envs.toml)")


def _given(value: str | None) -> str | None:
    return value if value not in ("", None) else None


def request_from_args(args: argparse.Namespace, default_env: str) -> Request:
    """The run options as a validated Request (bad names and numbers raise UsageError here)."""
    optional: dict[str, tuple[str, ...]] = {
        key: value
        for key, value in (
            ("scenarios", csv(args.scenarios)),
            ("patches", csv(args.patch)),
            ("transports", csv(args.transport)),
        )
        if value is not None
    }
    try:
        return Request(
            env_ids=csv(args.env) or (default_env,),
            torch=_given(args.torch),
            deepspeed=_given(args.deepspeed),
            dtype=_given(args.dtype),
            config_path=_given(args.config),
            steps=args.steps,
            world_size=args.world_size,
            timeout_s=args.timeout,
            stall_s=args.stall_timeout,
            sync_proof=not args.no_sync_proof,
            jobs=args.jobs,
            launcher=_given(args.launcher),
            **optional,
        )
    except TypeError as exc:  # pragma: no cover - programming error surfaced readably
        raise UsageError(str(exc)) from None


def run_make_line(target: str, args: argparse.Namespace) -> str:
    """The make line for the run options as given (the user's own spellings, not the defaults)."""
    # ENGINE right after ENV, before the pins (the table puts it after them): the order this line
    # had before the table, which results.json files keep; checked_pairs checks the names only.
    return make_line(
        target,
        checked_pairs(
            [
                ("ENV", args.env),
                ("ENGINE", args.engine),
                ("TORCH", args.torch),
                ("DEEPSPEED", args.deepspeed),
                ("SCENARIOS", args.scenarios),
                ("PATCH", args.patch),
                ("DTYPE", args.dtype),
                ("TRANSPORT", args.transport),
                ("CONFIG", args.config),
                ("STEPS", args.steps),
                ("WORLD_SIZE", args.world_size),
            ]
        ),
    )


def run_target_from_args(args: argparse.Namespace) -> RunTarget:
    return RunTarget(
        engine=args.engine,
        results_root=Path(args.results_root),
        out=Path(args.out) if args.out else None,
        matrix=args.matrix,
        dry_run=args.dry_run,
        argv=tuple(args.argv),
        make_command=run_make_line(args.command, args),
        # `make repro RESUME=1`: make hands its command-line variables to the recipe's environment
        resume=bool(getattr(args, "resume", False)) or env_bool("RESUME", os.environ),
    )
