"""`python -m repro gpu-check` (`make gpu-check`): the GPU host self-check (repro/run/gpu_check.py).

Thin: parses, picks the results folder, calls the use case, prints the verdict per step. Exit 0
when every step is proven or not provable on this host; 15 (RunError) when a step failed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from repro.cli.options import DEFAULT_RESULTS_ROOT, add_matrix_option
from repro.cli.registry import command
from repro.core import console
from repro.core.errors import RunError
from repro.core.results import utc_now
from repro.run.usecase import load_matrix


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default=None, help="env id (default: cuda on NVIDIA, a ROCm env by GPU arch)")
    p.add_argument("--out", default=None, help="folder for gpu-check.json (default results/gpu-check-<time>)")
    p.add_argument("--results-root", default=str(DEFAULT_RESULTS_ROOT))
    add_matrix_option(p)


@command(
    "gpu-check", "prove this GPU host end to end (GPUs, venv, torch, DeepSpeed, repro, check-fix)", _options
)
def cmd_gpu_check(args: argparse.Namespace) -> int:
    from repro.run.gpu_check import gpu_check
    from repro.run.gpu_check_device import HostDevice

    matrix = load_matrix(args.matrix)
    stamp = utc_now().replace(":", "").replace("-", "")[:15]
    folder = Path(args.out) if args.out else Path(args.results_root) / f"gpu-check-{stamp}"
    check = gpu_check(folder, HostDevice(), matrix, args.env, say=console.info)
    console.result(check.text())
    console.result(f"details: {folder / 'gpu-check.json'}")
    if not check.ok:
        failed = [r.kind.value for r in check.results if not r.verdict.ok]
        raise RunError(
            f"gpu-check: {', '.join(failed)} did not pass", fix=f"read {folder / 'gpu-check.json'}"
        )
    return 0
