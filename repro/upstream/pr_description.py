"""PR_DESCRIPTION.md from the records `make pr` made (pr.json), never from hand-written facts.

The torch references are constants read from torch 2.1.0's released
torch/distributed/distributed_c10d.py (the first release with the placeholder); everything about
the DeepSpeed commit (its files, the diff stat, the callers) comes from the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.core import templating
from repro.upstream import pr_fix
from repro.upstream.pr_record import PrRecord

TEMPLATES = Path(__file__).resolve().parent / "templates"
TORCH_TAG = "v2.1.0"
TORCH_FILE = "torch/distributed/distributed_c10d.py"


@dataclass(frozen=True)
class TorchRef:
    name: str
    start: int
    end: int
    what: str

    def url(self) -> str:
        return f"https://github.com/pytorch/pytorch/blob/{TORCH_TAG}/{TORCH_FILE}#L{self.start}-L{self.end}"


TORCH_REFS = (
    TorchRef(
        "_IllegalWork",
        1647,
        1650,
        "the placeholder a collective returns inside the manager; every attribute raises",
    ),
    TorchRef("_CoalescingManager", 1653, 1663, "holds the real work (`works`) and waits on it (`wait()`)"),
    TorchRef(
        "_coalescing_manager",
        1666,
        1752,
        "issues the recorded collectives on exit and yields the `_CoalescingManager`",
    ),
)


def code(text: str) -> str:
    """`text` as one Markdown code span, whatever backticks it holds."""
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    tick = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{tick}{pad}{text}{pad}{tick}"


def context(record: PrRecord) -> dict[str, Any]:
    calls = [c for c in record.callers if c.kind is pr_fix.CallerKind.CALL]
    outside = pr_fix.callers_outside_mics(record.callers)
    return {
        "r": record,
        "torch_refs": TORCH_REFS,
        "calls": calls,
        "outside": outside,
        "mics": pr_fix.MICS,
        "added": sum(f.added for f in record.files),
        "removed": sum(f.removed for f in record.files),
    }


def render(record: PrRecord) -> str:
    env = templating.environment(TEMPLATES, filters={"code": code})
    return env.get_template("PR_DESCRIPTION.md.j2").render(**context(record))
