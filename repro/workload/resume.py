"""RESUME=1 inside the suite: which planned runs an earlier, unfinished suite in the same folder
already finished (their records and files are kept as they are) and which run again.

A run is kept when its record is final (any outcome but `interrupted`; a run the suite never
reached has no record at all), it is the same run as planned (same key, steps, seed and
DeepSpeed config) and, for a MiCS run, the control it was judged against is kept too and is the
one the suite would pick now (repro/workload/controls.py). A control that runs again takes the
runs judged against it along: they run again rather than being re-judged, because the judgement
(classify.classify) needs the launch status that only exists while the suite runs, and a run
recorded against an interrupted control was started alongside it, in the same stopped suite.
Pure, apart from `previous_records` and `clear_stale` (the suite's own folder).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Sequence
from typing import NamedTuple

from repro.workload.controls import ControlKey, choose_control
from repro.workload.record import CONTROL_SCENARIO, Outcome, RunRecord, read_json

SUITE_FILE = "suite.json"


class RunKey(NamedTuple):
    """What makes a run of one env's suite: its record's unit in suite.json and results.json."""

    scenario: str
    patch: str
    transport: str
    dtype: str
    world_size: int

    @property
    def is_control(self) -> bool:
        return self.scenario == CONTROL_SCENARIO and self.patch == "stock"

    @property
    def run_name(self) -> str:  # as repro.workload.runner.RunSpec.run_name
        return f"{self.scenario}-{self.patch}-{self.dtype}-{self.transport}-w{self.world_size}"


def record_run_key(record: RunRecord) -> RunKey:
    return RunKey(
        str(record.get("scenario")),
        str(record.get("patch")),
        str(record.get("transport")),
        str(record.get("dtype")),
        int(record.get("world_size") or 0),
    )


def is_final(record: RunRecord) -> bool:
    """A record the run finished with (an interrupted run, or one with no outcome, is redone)."""
    outcome = record.get("outcome")
    return outcome is not None and outcome != Outcome.INTERRUPTED.value


def split(
    planned: Sequence[RunKey],
    previous: Sequence[RunRecord],
    same_run: Callable[[int, RunRecord], bool] = lambda i, record: True,
) -> tuple[list[RunRecord], list[int]]:
    """(records kept, in plan order; indexes into `planned` of the runs to do again, in plan
    order). `same_run(i, record)` says whether a record answers planned run i as it is planned
    now (steps, seed, config)."""
    found: dict[int, RunRecord] = {}
    for i, key in enumerate(planned):
        match = next(
            (r for r in previous if record_run_key(r) == key and is_final(r) and same_run(i, r)), None
        )
        if match is not None:
            found[i] = match
    controls = [i for i, key in enumerate(planned) if key.is_control]

    def control_key(i: int) -> ControlKey:
        return ControlKey(planned[i].dtype, planned[i].transport, planned[i].world_size, planned[i].patch)

    kept: dict[int, RunRecord] = {i: found[i] for i in controls if i in found}
    for i, record in found.items():
        if planned[i].is_control:
            continue
        chosen = choose_control(control_key(i), controls, control_key)
        judged_against = record.get("control_run")
        if chosen is None:
            ok = judged_against is None
        else:
            ok = chosen in kept and judged_against == kept[chosen].get("run_name")
        if ok:
            kept[i] = record
    redo = [i for i in range(len(planned)) if i not in kept]
    return [kept[i].copy() for i in sorted(kept)], redo


def previous_records(out: str) -> list[RunRecord]:
    """The records the earlier suite in `out` left ([] when it left none, or no readable file)."""
    try:
        data = read_json(os.path.join(out, SUITE_FILE))
    except (OSError, ValueError):
        return []
    runs = data.get("runs") if isinstance(data, dict) else None
    records: list[RunRecord] = runs if isinstance(runs, list) else []
    return [r for r in records if isinstance(r, dict)]


def clear_stale(out: str, names: Sequence[str]) -> list[str]:
    """Remove the folders an unfinished attempt of these runs left under out/runs (the run's own
    name, or that name with the time suffix a second attempt gets), so the run's new record and
    its evidence are the only ones. Returns what was removed."""
    runs_dir = os.path.join(out, "runs")
    if os.path.islink(out) or os.path.islink(runs_dir):
        return []  # never clear through a link: what is there is not this suite's (the host refuses it too)
    try:
        entries = sorted(os.listdir(runs_dir))
    except OSError:
        return []
    removed = []
    for name in names:
        pattern = re.compile(re.escape(name) + r"(-\d+)?")
        for entry in entries:
            path = os.path.join(runs_dir, entry)
            if pattern.fullmatch(entry) and os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
                removed.append(entry)
    return removed
