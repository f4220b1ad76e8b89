"""The affected range for PR_DESCRIPTION.md (`make pr RANGE=1`, `make pr-verify PR=dir RANGE=1`).

Rows: the first DeepSpeed release with MiCS (the oldest release tag of DS_REPO whose tree has
deepspeed/runtime/zero/mics.py), the last release of every minor series up to REF's version.txt,
and REF itself. Columns: torch 2.0.1, 2.1.0, 2.3.1 and the matrix's newest. Each cell holds two
probes of flat MiCS on the CPU twin: stock, and fixed (for a release the lab's run-time fix, the
same splice as the branch; for REF the branch's commit, stock). Whether the fix applies to a
release is read from its tag's files (repro.upstream.pr.fix.changed_files, as `make pr` reads REF).

Releases run through the survey machinery (`python -m repro survey --every --versions ...`, one
survey per torch and patch, PARALLEL=k side by side); REF and the branch through commit probes.
Every probe's result is cached by what decides it (torch, env, DeepSpeed release or commit, patch,
the fix's id), so a second PR description, or an interrupted range, runs only what is missing.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from packaging.version import InvalidVersion, Version

from repro.core import console
from repro.core.errors import FixDoesNotApplyError
from repro.core.runs import RunFinding
from repro.core.walk_files import ProbeRow
from repro.upstream.pr import fix as pr_fix
from repro.upstream.pr import verify as pr_verify
from repro.upstream.pr.checks import Seen
from repro.upstream.pr.out_folders import fresh_folder
from repro.upstream.pr.verify import CellCache, CheckEntry, ProbeCall, ProbeRunner, front_door_probe
from repro.workload import fix
from repro.workload.record import write_json_atomic

FORMAT = 1
SCENARIO = "mics"
OLDER_TORCHES = ("2.0.1", "2.1.0", "2.3.1")
_TAG = re.compile(r"^v(\d+\.\d+\.\d+)$")


@dataclass(frozen=True)
class Column:
    torch: str
    env: str


# One row of range.json: a DeepSpeed release, or REF (is_ref), and its probes by torch and patch.
class RangeRow(TypedDict, total=False):
    deepspeed: str
    is_ref: bool
    applies: bool | None  # whether the fix applies (None: DS_REPO has no such tag)
    applies_why: str
    cells: dict[str, dict[str, ProbeRow]]  # torch -> patch -> the probe as probe.json holds it


# range.json: the affected range's rows (oldest release first, REF last) by the torch columns.
class RangeData(TypedDict):
    kind: str  # "pr-range"
    ref: str
    ref_sha: str
    scenario: str
    columns: list[dict[str, str]]  # Column's fields
    rows: list[RangeRow]
    complete: bool
    probes_run: int
    probes_cached: int
    seconds: float


def newest_of_each_minor(releases: Sequence[str], keep: Callable[[Version], bool]) -> list[Version]:
    """The newest final release of each minor series among `releases` that `keep` accepts, oldest
    first (the range's rows; pr-verify's candidates for the oldest torch REF imports with)."""
    chosen: dict[tuple[int, int], Version] = {}
    for text in releases:
        try:
            v = Version(text)
        except InvalidVersion:
            continue
        if v.is_prerelease or not keep(v):
            continue
        key = (v.major, v.minor)
        if key not in chosen or v > chosen[key]:
            chosen[key] = v
    return [chosen[key] for key in sorted(chosen)]


def release_rows(releases: Sequence[str], first: str, last: str) -> list[str]:
    """The first release with MiCS and the last of every minor series up to `last`, oldest first."""
    try:
        lo, hi = Version(first), Version(last)
    except InvalidVersion:
        return []
    rows = sorted({lo, *newest_of_each_minor(releases, lambda v: lo <= v <= hi)})
    return [str(v) for v in rows]


def first_mics_release(tags: Sequence[str], has_mics: Callable[[str], bool]) -> str | None:
    """The oldest vX.Y.Z tag whose tree holds mics.py (checked oldest first, stops at the first)."""
    versions = sorted((Version(m.group(1)), t) for t in tags if (m := _TAG.match(t)))
    for version, tag in versions:
        if has_mics(tag):
            return str(version)
    return None


def cell_key(column: Column, deepspeed: str, patch: str) -> str:
    fix_id = fix.FIX_ID if patch == "fixed" else None
    blob = json.dumps([FORMAT, column.torch, column.env, SCENARIO, "async", deepspeed, patch, fix_id])
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def cell_words(probe: ProbeRow | None) -> str:
    """A table cell's words for one probe."""
    if not probe:
        return "-"
    seen = Seen.from_probe(probe)
    if "does not import" in seen.reason or (seen.outcome == "env-error" and "ImportError" in seen.reason):
        return "does not import"
    if seen.outcome == "env-error" and "pip step deepspeed failed" in seen.reason:
        return "does not install"  # e.g. 0.9.x/0.10.x need pydantic < 2; the env pins 2
    finding = seen.finding
    if finding is RunFinding.BUG:
        return f"bug ({seen.signature})"
    if finding is RunFinding.CLEAN:
        return "clean"
    if finding is RunFinding.UNSUPPORTED:
        return "unsupported"
    return f"{seen.outcome} ({seen.signature})"


def cause(probe: ProbeRow) -> str:
    """The error at the heart of a probe's reason, for the table's notes: the last exception
    named in it (`Type: message`), without the lab's own wording around it."""
    reason = str(probe.get("reason") or "")
    found = re.findall(r"\b([A-Z]\w*(?:Error|Exception)): ([^()]+?)(?:\)|;|$| \(/)", reason)
    if found:
        kind, message = found[-1]
        return f"{kind}: {message.strip()}"
    return reason.split(": ", 1)[-1][:160]


def _ran(probe: ProbeRow | None) -> bool:
    """The stock probe trained (clean) or showed the bug: a fixed probe then says something."""
    return bool(probe) and Seen.from_probe(probe or {}).finding in (RunFinding.BUG, RunFinding.CLEAN)


SurveyRunner = Callable[[Column, str, Sequence[str], Path, int], list[ProbeRow]]


def survey_argv(column: Column, patch: str, versions: Sequence[str], out: Path, parallel: int) -> list[str]:
    return [
        sys.executable, "-m", "repro", "survey", "--axis", "deepspeed", "--every",
        "--versions", ",".join(versions), "--from", versions[0], "--to", versions[-1],
        "--env", column.env, "--engine", "venv", "--torch", column.torch,
        "--scenario", SCENARIO, "--patch", patch, "--parallel", str(parallel), "--out", str(out),
    ]  # fmt: skip


def front_door_survey(
    column: Column, patch: str, versions: Sequence[str], out: Path, parallel: int
) -> list[ProbeRow]:
    what = f"the survey of torch {column.torch} ({patch})"
    return pr_verify.front_door(survey_argv(column, patch, versions, out, parallel), out, "survey.json", what)


@dataclass
class AffectedRange:
    pr: Mapping[str, Any]
    columns: Sequence[Column]
    releases: Sequence[str]
    out: Path
    ds_repo: str
    tag_files: Callable[[str], Mapping[str, str | None]]  # tag -> {fix target path: text or None}
    verified: Mapping[str, Any] | None = None  # verify.json: its flat MiCS probes seed REF's cells
    parallel: int = 1
    cache: CellCache | None = None
    survey: SurveyRunner = front_door_survey
    probe: ProbeRunner = front_door_probe

    def run(self) -> RangeData:
        start = time.monotonic()
        cache = self.cache or CellCache("pr-range")
        folder = self.out / "range"
        rows: list[RangeRow] = []
        for v in self.releases:
            applies, why = self._applies(f"v{v}")
            rows.append({"deepspeed": v, "applies": applies, "applies_why": why, "cells": {}})
        ref_row: RangeRow = {
            "deepspeed": f"{self.pr['ref']} ({self.pr['ref_sha'][:10]})",
            "is_ref": True,
            "applies": True,
            "applies_why": f"the branch {self.pr['branch']}",
            "cells": {},
        }
        data: RangeData = {
            "kind": "pr-range", "ref": self.pr["ref"], "ref_sha": self.pr["ref_sha"], "scenario": SCENARIO,
            "columns": [vars(c) for c in self.columns], "rows": [*rows, ref_row], "complete": False,
            "probes_run": 0, "probes_cached": 0, "seconds": 0.0,
        }  # fmt: skip

        def save() -> None:
            data["seconds"] = round(time.monotonic() - start, 1)
            write_json_atomic(str(self.out / "range.json"), data)

        for column in self.columns:
            for patch in ("stock", "fixed"):
                cached, ran = self._release_cells(column, patch, rows, cache, folder)
                data["probes_cached"] += cached
                data["probes_run"] += ran
                save()
            for side, sha in (("stock", self.pr["ref_sha"]), ("fixed", self.pr["commit"])):
                probe, was_cached = self._ref_probe(column, side, sha, cache, folder)
                data["probes_cached"] += int(was_cached)
                data["probes_run"] += int(not was_cached)
                ref_row["cells"].setdefault(column.torch, {})[side] = probe
            save()
        data["complete"] = True
        save()
        return data

    def _release_cells(
        self,
        column: Column,
        patch: str,
        rows: Sequence[RangeRow],
        cache: CellCache,
        folder: Path,
    ) -> tuple[int, int]:
        """One torch's release cells of `patch`, from the cache or probed: (cells cached, cells probed)."""
        cached = ran = 0
        missing: list[str] = []
        for row in rows:
            if patch == "fixed" and not _ran(row["cells"].get(column.torch, {}).get("stock")):
                continue  # the release did not run MiCS on this torch: the fix has nothing to show
            hit = cache.get(cell_key(column, row["deepspeed"], patch))
            if hit is None:
                missing.append(row["deepspeed"])
            else:
                row["cells"].setdefault(column.torch, {})[patch] = hit
                cached += 1
        if missing:
            found = self._probe_releases(column, patch, missing, folder)
            for row in rows:
                if row["deepspeed"] in missing and row["deepspeed"] in found:
                    result = found[row["deepspeed"]]
                    cache.put(cell_key(column, row["deepspeed"], patch), result)
                    row["cells"].setdefault(column.torch, {})[patch] = result
                    ran += 1
        return cached, ran

    def _probe_releases(
        self, column: Column, patch: str, missing: Sequence[str], folder: Path
    ) -> dict[str | None, ProbeRow]:
        """The probes of the releases not cached, by version: one probe, or a survey of several."""
        console.info(f"== range: torch {column.torch}, {patch}: {len(missing)} release(s)")
        where = fresh_folder(folder / f"torch{column.torch}-{patch}")
        if len(missing) == 1:  # a survey needs two ends: one release is a probe
            call = ProbeCall(
                column.env, column.torch, "", SCENARIO, "async", where, patch=patch, deepspeed=missing[0]
            )
            return {missing[0]: self.probe(call, self.ds_repo).copy()}
        surveyed = self.survey(column, patch, missing, where, self.parallel)
        return {p.get("version"): p for p in surveyed}

    def _ref_probe(
        self, column: Column, side: str, sha: str, cache: CellCache, folder: Path
    ) -> tuple[ProbeRow, bool]:
        """REF's (stock) or the branch's (fixed) probe on one torch, and whether it was seeded or cached."""
        probe: ProbeRow | None = self._seeded(column, sha) or cache.get(cell_key(column, sha, "stock"))
        if probe is not None:
            return probe, True
        where = fresh_folder(folder / f"torch{column.torch}-ref-{side}")
        call = ProbeCall(column.env, column.torch, sha, SCENARIO, "async", where)
        probe = self.probe(call, self.ds_repo).copy()
        cache.put(cell_key(column, sha, "stock"), probe)
        return probe, False

    def _seeded(self, column: Column, sha: str) -> ProbeRow | None:
        """REF's or the branch's flat MiCS probe on this torch from verify.json, if it ran there."""
        checks: list[CheckEntry] = (self.verified or {}).get("checks", [])
        want = (SCENARIO, column.torch, column.env)
        for check in checks:
            if (check.get("key"), check.get("torch"), check.get("env")) == want:
                return (check["ref"] if sha == self.pr["ref_sha"] else check["branch"]).copy()
        return None

    def _applies(self, tag: str) -> tuple[bool | None, str]:
        """Whether the fix applies to the tag's files, and why."""
        files = self.tag_files(tag)
        if not any(files.values()):
            return None, f"no tag {tag} in DS_REPO"
        try:
            pr_fix.changed_files(files)
        except FixDoesNotApplyError as exc:
            if "already holds" in exc.what:
                return False, "already holds the fix"
            return False, exc.why or exc.what
        return True, f"{tag}: every target found"
