"""`python -m repro COMMAND`: the same front door as the Makefile, for people who do not use make.

Every error of the tool is a `ReproError` caught once here: its message says what, why and what
to do, and its exit code tells the kind (see repro/core/errors.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from repro.core import paths
from repro.core.errors import ReproError, UsageError
from repro.workload.record import PATCHES, SCENARIOS

REPO_ROOT = paths.REPO_ROOT
DEFAULT_RESULTS_ROOT = paths.DEFAULT_RESULTS_ROOT

Handler = Callable[[argparse.Namespace], int]
_HANDLERS: dict[str, Handler] = {}


def _csv(text: str | None) -> tuple[str, ...] | None:
    if text is None or not text.strip():
        return None
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help="env id(s), comma-separated (default: the matrix default, cpu)")
    p.add_argument("--engine", default=None, help="docker|venv|auto (default: $ENGINE or auto)")
    p.add_argument("--torch", default=None, help="override the env's torch pin (derived env)")
    p.add_argument("--deepspeed", default=None, help="override the env's DeepSpeed pin (derived env)")
    p.add_argument("--scenarios", default=None, help=f"comma-separated subset of {','.join(SCENARIOS)}")
    p.add_argument("--patch", default=None, help=f"comma-separated subset of {','.join(PATCHES)}")
    p.add_argument("--dtype", default=None, help="fp32|bf16|fp16 (default: the config's, else fp32)")
    p.add_argument("--transport", default=None, help="CPU adapter modes: async,sync,strict (default async)")
    p.add_argument("--config", default=None, help="your DeepSpeed config JSON")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--timeout", type=float, default=None, help="per-run time limit in seconds")
    p.add_argument("--stall-timeout", type=float, default=None,
                   help="a run with no training step for this many seconds is hung (default 60)")
    p.add_argument("--jobs", type=int, default=None,
                   help="runs at once inside an env (default: 1 on GPUs, on CPU max(2, cores // ranks))")
    p.add_argument("--no-sync-proof", action="store_true",
                   help="skip the extra mics stock run over the sync transport (the cause control)")
    p.add_argument("--out", default=None, help="results folder (default: results/<timestamp>-<envs>)")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    p.add_argument("--matrix", default=None, help="env matrix TOML (default env_matrix/envs.toml)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")


def command(name: str, help_text: str, configure: Callable[[argparse.ArgumentParser], None] | None = None
            ) -> Callable[[Handler], Handler]:
    """Register a subcommand; feature modules add theirs with this decorator."""
    def wrap(fn: Handler) -> Handler:
        _HANDLERS[name] = fn
        _SPECS.append((name, help_text, configure))
        return fn
    return wrap


_SPECS: list[tuple[str, str, Callable[[argparse.ArgumentParser], None] | None]] = []


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m repro", description=(
        "Reproduce DeepSpeed MiCS + torch>=2.1 IllegalWork bug (deepspeedai/DeepSpeed#5080) in pinned "
        "environments, with and without our fix."))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text, configure in _SPECS:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if configure is not None:
            configure(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    _load_commands()
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    if not args.command:
        parser.print_help()
        return 2
    args.argv = args_list
    try:
        return _HANDLERS[args.command](args)
    except ReproError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _load_commands() -> None:
    """Import the modules that register subcommands (kept lazy: heavy deps load on use only)."""
    from repro.cli import run_commands as commands  # noqa: F401
    for optional in ("repro.cli.bisect_commands", "repro.cli.upstream_commands"):
        try:
            __import__(optional)
        except ModuleNotFoundError as exc:
            if exc.name != optional:
                raise


def request_from_args(args: Any, default_env: str) -> Any:
    from repro.run.orchestrate import Request

    def opt(value: Any) -> Any:
        return value if value not in ("", None) else None

    kwargs: dict[str, Any] = dict(env_ids=_csv(args.env) or (default_env,), torch=opt(args.torch),
                                  deepspeed=opt(args.deepspeed), dtype=opt(args.dtype),
                                  config_path=opt(args.config), steps=args.steps, world_size=args.world_size,
                                  timeout_s=args.timeout, stall_s=getattr(args, "stall_timeout", None),
                                  sync_proof=not getattr(args, "no_sync_proof", False),
                                  jobs=getattr(args, "jobs", None))
    for key, value in (("scenarios", _csv(args.scenarios)), ("patches", _csv(args.patch)),
                       ("transports", _csv(args.transport))):
        if value is not None:
            kwargs[key] = value
    try:
        return Request(**kwargs)
    except TypeError as exc:  # pragma: no cover - programming error surfaced readably
        raise UsageError(str(exc)) from None
