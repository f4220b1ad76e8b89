"""Summarize cluster runs from the per-rank result files: `python3 summarize.py RESULTS_DIR`.

Shipped in bundles as cluster/summarize.py, so it uses the standard library only and runs with
any Python 3 on a login node. One line per run: how many ranks reported, their exceptions, the
IllegalWork message count, and rank 0's losses (NaN shown as such). It states facts; the
classification into outcomes is done by mics-repro on the records of a suite.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for mypy only: the script ships alone, and a login node's Python 3.7 lacks TypedDict
    from typing import TypedDict

    from repro.workload.record import RecordedException
    from repro.workload.train import RankRecord

    # One run of summary.json: what its rank files say.
    class RunSummary(TypedDict):
        run: str  # the run's folder name
        exit_code: str | None  # the launcher's, as its exit_code file holds it
        ranks_reported: int
        world_size: int | None
        steps_completed: int | None
        illegal_work_messages: int
        non_finite_losses: int
        first_loss: float | None
        last_loss: float | None
        losses: int
        errors: list[str]  # "Type: message" of each distinct exception


def _rank_files(run_dir: Path) -> list[RankRecord]:
    ranks = []
    for path in sorted(run_dir.glob("rank*.json")):
        try:
            ranks.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return ranks


def _error(exc: RecordedException) -> str:
    return f"{exc.get('type')}: {exc.get('message', '')}"[:160]


def summarize_run(run_dir: Path) -> RunSummary:
    ranks = _rank_files(run_dir)
    rank0: RankRecord = next((r for r in ranks if r.get("rank") == 0), None) or (ranks[0] if ranks else {})
    losses = rank0.get("losses") or []
    errors = sorted({_error(exc) for r in ranks for exc in [r.get("exception")] if exc})
    exit_file = run_dir / "exit_code"
    return {
        "run": run_dir.name,
        "exit_code": exit_file.read_text().strip() if exit_file.is_file() else None,
        "ranks_reported": len(ranks),
        "world_size": rank0.get("world_size"),
        "steps_completed": rank0.get("steps_completed"),
        "illegal_work_messages": sum(int(r.get("illegal_work_messages") or 0) for r in ranks),
        "non_finite_losses": sum(1 for v in losses if v is None),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "losses": len(losses),
        "errors": errors,
    }


def render(rows: list[RunSummary]) -> str:
    def loss(v: Any) -> str:
        return "NaN/inf" if v is None else f"{v:.4g}"

    lines = []
    for row in rows:
        steps = "-" if row["steps_completed"] is None else row["steps_completed"]
        text = (
            f"{row['run']:<22} exit {row['exit_code'] or '?':<4} ranks {row['ranks_reported']}/"
            f"{row['world_size'] or '?'} steps {steps}  IllegalWork msgs {row['illegal_work_messages']}"
            + (
                f"  loss {loss(row['first_loss'])} -> {loss(row['last_loss'])}"
                f" ({row['non_finite_losses']} non-finite)"
                if row["losses"]
                else "  no losses"
            )
        )
        lines.append(text)
        lines += [f"{'':<22} error: {e}" for e in row["errors"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: summarize.py RESULTS_DIR", file=sys.stderr)
        return 2
    root = Path(argv[0])
    rows = (
        [summarize_run(d) for d in sorted(p for p in root.iterdir() if p.is_dir())] if root.is_dir() else []
    )
    if not rows:
        print(f"no runs under {root}", file=sys.stderr)
        return 1
    print(render(rows))
    (root / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
