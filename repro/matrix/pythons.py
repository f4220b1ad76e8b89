"""Which Pythons a host may have for each env (ENGINE=venv, `make gpu-check`): env_matrix/README.md.

A venv is made with the host's Python, not the image's; its pins are then chosen for that Python
(Env.for_python). The table is generated from the matrix, so it cannot drift from what the venv
engine accepts: `python -m repro.matrix.pythons` prints it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from repro.matrix.model import Env, Matrix

__all__ = ["render_table", "row"]


def row(env: Env) -> tuple[str, str, str, str, str]:
    """(env, torch, image's Python, accepted Pythons, the one to install when none is there)."""
    accepted = env.pythons()
    return (
        env.id,
        env.torch,
        env.python,
        ", ".join(accepted) if accepted is not None else "any (torch's range is not in the table)",
        env.python_to_install(),
    )


def render_table(matrix: Matrix) -> str:
    """Markdown: one row per named env."""
    head = ("env", "torch", "image's Python", "a host's Python may be", "install if none is there")
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for env_id in matrix.ids():
        cells = row(matrix.get(env_id))
        lines.append(f"| `{cells[0]}` | " + " | ".join(cells[1:]) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m repro.matrix.pythons", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--matrix", help="an envs.toml (default: env_matrix/envs.toml)")
    args = parser.parse_args(argv)
    from repro.matrix.schema import load_matrix

    print(render_table(load_matrix(args.matrix) if args.matrix else load_matrix()))
    return 0


if __name__ == "__main__":  # pragma: no cover - a command-line entry
    raise SystemExit(main())
