"""Say what happened: the summary table printed at the end of every invocation, and under it THE env
verdict (repro.core.verdict), the same one the report and the bundle give."""

from __future__ import annotations

from collections.abc import Sequence

from repro.core.printable import printable
from repro.core.runs import world_size_text
from repro.core.verdict import env_verdicts
from repro.workload.record import RunRecord

COLUMNS = (
    ("env", 14),
    ("scenario", 12),
    ("patch", 6),
    ("dtype", 5),
    ("transport", 9),
    ("ws", 3),
    ("outcome", 12),
    ("signature", 23),
    ("IllegalWork", 11),
    ("div@", 4),
    ("skip", 4),
    ("exception", 22),
    ("secs", 6),
)


def _value(run: RunRecord, key: str) -> str:
    if key == "ws":
        return world_size_text(run.get("world_size"))
    if key == "IllegalWork":
        return str(run.get("illegal_work_messages", 0))
    if key == "div@":
        step = run.get("first_divergent_step")
        return "-" if step is None else str(step)
    if key == "skip":
        return str(run.get("skipped_steps", 0))
    if key == "exception":
        exc = run.get("exception")
        return exc.get("type") or "?" if exc else "-"
    if key == "secs":
        secs = (run.get("durations") or {}).get("total_s")
        return "-" if secs is None else f"{secs:.0f}"
    value = run.get(key)
    return "-" if value is None else str(value)


def table(runs: Sequence[RunRecord]) -> str:
    head = "  ".join(name.ljust(width) for name, width in COLUMNS)
    lines = [head, "-" * len(head)]
    for run in runs:
        # Escaped before it is cut to the column: a record's ESC or bidi character is shown, not acted on.
        lines.append("  ".join(printable(_value(run, name))[:width].ljust(width) for name, width in COLUMNS))
    return "\n".join(lines)


def verdict_lines(runs: Sequence[RunRecord]) -> list[str]:
    """Each env's headline, then what it adds: separate problems, or that nothing was verified."""
    lines: list[str] = []
    for verdict in env_verdicts([r for r in runs if r.get("env")]):
        lines.append(verdict.headline())
        lines += [f"  {note}" for note in verdict.notes()]
    return lines


def render(runs: Sequence[RunRecord], results_dir: str) -> str:
    results_dir = printable(results_dir)
    if not runs:
        return f"no runs were recorded (results folder: {results_dir})"
    parts = [table(runs), "", "verdict:"]
    parts += [f"  {printable(line)}" for line in verdict_lines(runs)]
    parts += ["", f"results: {results_dir}/results.json"]
    return "\n".join(parts)
