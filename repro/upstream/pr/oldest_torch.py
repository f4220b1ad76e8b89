"""The oldest torch REF imports with, probed (#43 item 6): the low end of the torches REF's users
may run it on, verified like the other torches.

Only without TORCHES=, and only when REF does not import with the reporter's torch (then the
reporter's stack is already the oldest). The candidates are the newest release of each torch minor
between the reporter's torch and the oldest torch pr-verify takes anyway (REF's CI presets, the
matrix's newest), as PyPI lists them for the env's Python. Each is probed with REF's own zero3 check
(the same probe as the check, so the verification takes its result from the cache), in a binary
search: a commit that imports with a torch is taken to import with every newer one. A torch the
lab cannot install counts as one REF does not import with: it could be no stack either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from repro.core import console
from repro.core.errors import UsageError
from repro.core.walk_files import ProbeRow
from repro.upstream.pr.affected_range import newest_of_each_minor
from repro.upstream.pr.checks import Seen, stopped_before_running
from repro.upstream.pr.verify import CellCache, OldestJSON, ProbeCall, ProbeRunner, TriedJSON, cached_probe

# The probe that answers "does REF import with this torch": REF's control check.
SCENARIO, TRANSPORT = "zero3", "async"


def imports(probe: ProbeRow) -> tuple[bool, str]:
    """Whether a REF probe got past importing DeepSpeed (a run that trained, crashed or hung did)."""
    seen = Seen.from_probe(probe)
    return not stopped_before_running(seen), f"{seen.short()}: {seen.reason}"[:300]


def candidates(releases: Sequence[str], above: str, below: str) -> list[str]:
    """The newest release of each minor strictly between `above`'s and `below`'s, oldest first."""
    low, high = Version(above).release[:2], Version(below).release[:2]
    inside = newest_of_each_minor(releases, lambda v: v.local is None and low < v.release[:2] < high)
    return [str(v) for v in inside]


def search(torches: Sequence[str], probe: Callable[[str], TriedJSON]) -> tuple[str | None, list[TriedJSON]]:
    """The oldest of `torches` (oldest first) that imports, in a binary search; None when none
    does. The torch just above the list is known to import."""
    lo, hi, tried = 0, len(torches), []
    while lo < hi:
        mid = (lo + hi) // 2
        seen = probe(torches[mid])
        tried.append(seen)
        if seen["imports"]:
            hi = mid
        else:
            lo = mid + 1
    return (torches[lo] if lo < len(torches) else None), sorted(tried, key=lambda t: Version(t["torch"]))


@dataclass
class OldestTorch:
    """The search for one REF. `env_for(torch)`: the env a torch's stack runs on."""

    ref_sha: str
    ds_repo: str
    folder: Path  # OUT/verify
    env_for: Callable[[str], str]
    probe: ProbeRunner
    cache: CellCache
    engine: str = "venv"

    def _try(self, torch: str) -> TriedJSON:
        console.info(f"== verify: does REF {self.ref_sha[:10]} import with torch {torch}?")
        try:
            env = self.env_for(torch)
        except UsageError as exc:  # no env of this lab has this torch: no stack either
            return {"torch": torch, "imports": False, "why": f"no env: {exc.what}"}
        call = ProbeCall(
            env, torch, self.ref_sha, SCENARIO, TRANSPORT,
            self.folder / f"oldest-torch{torch}-{SCENARIO}-ref", self.engine,
        )  # fmt: skip
        ok, why = imports(cached_probe(call, self.cache, self.probe, self.ds_repo))
        console.info(f"verify: torch {torch}: {'imports' if ok else 'does not import'}")
        return {"torch": torch, "imports": ok, "why": why}

    def run(self, reporter: str, oldest_taken: str, releases: Sequence[str]) -> OldestJSON:
        """The torch found (None: the reporter's imports, or no candidate does) and every probe's
        answer."""
        first = self._try(reporter)
        if first["imports"]:
            why = f"REF imports with the reporter's torch {reporter}"
            return {"torch": None, "why": why, "tried": [first]}
        between = candidates(releases, reporter, oldest_taken)
        found, tried = search(between, self._try)
        named = ", ".join(between) or "no release"
        if found:
            why = f"the oldest of {named} (between {reporter} and {oldest_taken}) that REF imports with"
        else:
            why = f"REF imports with none of {named} (between {reporter} and {oldest_taken})"
        return {"torch": found, "why": why, "tried": [first, *tried]}
