"""Where pr-verify's probes, surveys and DeepSpeed-harness sessions write: a folder of their own
each, never one an earlier (interrupted) run left, with its log beside it."""

from __future__ import annotations

from pathlib import Path


def log_path(out: Path) -> Path:
    """OUT's log beside it: `torch2.13.0-ref` -> `torch2.13.0-ref.log` (not with_suffix, which
    would cut the name at the version's dots)."""
    return out.parent / f"{out.name}.log"


def fresh_folder(base: Path) -> Path:
    """base, or base-2, base-3... when taken: a probe's or survey's OUT must be new, and an
    interrupted earlier run left its own results.json in the first (kept: it is what it saw)."""
    n, where = 1, base
    while where.exists() or log_path(where).exists():
        n += 1
        where = base.with_name(f"{base.name}-{n}")
    return where
