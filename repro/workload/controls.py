"""Which ZeRO-3 control run a MiCS run is compared with: one rule for the suite and the report.

The suite picks a control while it classifies (from the stock zero3 runs done so far); the report
picks one again when it reads the records (older records do not name theirs). Both use this
function, so the comparison the report shows is the one the classifier made.

Rule: the control must have the same dtype and world size (the arithmetic depends on both);
among those prefer the same transport (transports do not change the arithmetic, so any one is a
valid comparison), then the same patch, then a stock one; ties go to the earliest candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")


class ControlKey(NamedTuple):
    """What matching looks at, for the run and for each candidate control."""

    dtype: str
    transport: str
    world_size: int
    patch: str


def choose_control(want: ControlKey, candidates: Sequence[T], key: Callable[[T], ControlKey]) -> T | None:
    """The best control run among `candidates` (already filtered to zero3 runs of the same env)."""
    usable = [c for c in candidates if key(c).dtype == want.dtype and key(c).world_size == want.world_size]

    def preference(candidate: T) -> tuple[bool, bool, bool]:
        k = key(candidate)
        return (k.transport != want.transport, k.patch != want.patch, k.patch != "stock")

    usable.sort(key=preference)  # stable: the earliest of equally good candidates wins
    return usable[0] if usable else None


def record_key(record: Mapping[str, Any]) -> ControlKey:
    """The matching key of a record dict (the suite's side; the report keys its typed views)."""
    return ControlKey(
        str(record.get("dtype")),
        str(record.get("transport") or "native"),
        int(record.get("world_size") or 0),
        str(record.get("patch")),
    )
