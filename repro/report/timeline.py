"""Optional survey/bisect section: read OUT/survey.json and OUT/bisect.json when another step wrote them.

Shape (written by the survey/bisect command):
  {"change_points": [{"before", "after", "outcome_before", "outcome_after", "signature_before",
                      "signature_after"}], "probes": [{"version", "outcome", "signature", "verdict"}]}
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from repro.core import records, shapes
from repro.core.errors import UsageError
from repro.core.runs import finding_of

TIMELINE_FILES = ("survey.json", "bisect.json")
CHANGE_KEYS = ("before", "after", "outcome_before", "outcome_after", "signature_before", "signature_after")
PROBE_KEYS = ("version", "outcome", "signature", "verdict")
FIX = "re-run the survey/bisect step, or remove the file to build the report without it"


# One walk file's change points and probes, as the report's table shows them (and report.json holds them).
class Timeline(TypedDict):
    source: str  # file name
    change_points: list[dict[str, str]]
    probes: list[dict[str, str]]


def _rows(data: Mapping[str, Any], name: str, keys: tuple[str, ...], path: Path) -> list[dict[str, str]]:
    items = data.get(name, [])
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise UsageError(f"{path}: {name!r} is not a list of objects", fix=FIX)
    return [{k: "" if i.get(k) is None else str(i.get(k)) for k in keys} for i in items]


def _with_verdict(probe: dict[str, str]) -> dict[str, str]:
    """A survey's probes have no good/bad verdict (no BAD_IF): the column gives what each run says
    about the bug instead, read from its outcome and signature as the env verdict reads them."""
    if probe["verdict"]:
        return probe
    finding = finding_of(probe["outcome"], probe["signature"])  # None: a value this version does not know
    return {**probe, "verdict": finding.value if finding else "unknown"}


def load_timelines(out_dir: Path) -> list[Timeline]:
    found: list[Timeline] = []
    for name in TIMELINE_FILES:
        path = out_dir / name
        if not path.is_file():
            continue
        data = records.load(path, shapes.WALK, f"{path.stem} file", fix=FIX)
        changes = _rows(data, "change_points", CHANGE_KEYS, path)
        probes = [_with_verdict(p) for p in _rows(data, "probes", PROBE_KEYS, path)]
        found.append({"source": name, "change_points": changes, "probes": probes})
    return found
