"""Load one or more results folders and merge them into one consistent view.

Rules (each leaves a note in the report so nothing is dropped silently):
  * the same folder given twice (also through the `latest` symlink) counts once;
  * the same run (env + scenario + patch + dtype + transport + layout; for a custom job: env +
    job id + patch) in two invocations: the newest record wins, the older one is listed as
    superseded; two different custom jobs of one env are both reported;
  * the same env id with different pins in two folders is an error: the two sets of runs
    answer different questions and must not be mixed under one name;
  * the same env id and pins but another image id: kept, noted (an image was rebuilt).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from repro.core import results
from repro.core.errors import UsageError
from repro.core.evidence import as_evidence
from repro.core.paths import confined
from repro.core.results import RESULTS_FILE
from repro.report.model import EnvInfo, InvocationView, Run, check_closed_sets


@dataclass(frozen=True)
class ResultsFolder:
    invocation: InvocationView
    envs: Mapping[str, EnvInfo]
    runs: tuple[Run, ...]
    notes: tuple[str, ...] = ()  # what was refused while reading (e.g. an artifact outside the folder)


@dataclass(frozen=True)
class MergedResults:
    invocations: tuple[InvocationView, ...]  # oldest first
    envs: Mapping[str, EnvInfo]  # in first-seen order
    runs: tuple[Run, ...]
    superseded: tuple[Run, ...]
    notes: tuple[str, ...]

    def runs_of(self, env_id: str) -> list[Run]:
        return [run for run in self.runs if run.env == env_id]


def _timestamp(text: str | None) -> datetime:
    """Order ISO 8601 stamps; unparsable or missing ones sort first (oldest)."""
    if not text:
        return datetime.min.replace(tzinfo=timezone.utc)
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.min.replace(tzinfo=timezone.utc)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def _artifacts(folder: Path, env_id: str, raw: Any, notes: list[str]) -> dict[str, Path]:
    """The env's artifacts that lie inside the results folder; any other path is noted, never read."""
    out: dict[str, Path] = {}
    for name, rel in (raw if isinstance(raw, dict) else {}).items():
        if not rel:
            continue
        path = confined(folder, str(rel))
        if path is None:
            notes.append(
                f"env {env_id}: artifact {name} names {str(rel)!r:.120}, outside the results folder "
                f"{folder.name}; not read"
            )
            continue
        out[str(name)] = path
    return out


def load_folder(folder: Path, clean: Callable[[Any], Any]) -> ResultsFolder:
    """`clean` rewrites the parsed results.json before anything is read from it (the report's
    scrubber: a secret in a command or a log excerpt never reaches a rendered text)."""
    folder = folder.resolve()
    path = folder / RESULTS_FILE
    if not path.is_file():
        raise UsageError(
            f"no {RESULTS_FILE} in {folder}",
            why="a results folder is what one `make repro` invocation writes",
            fix="pass folders under results/ (e.g. results/latest), or run `make repro` first",
        )
    # Read, its schema and its fields' types checked, once for every reader (repro.core.results.load)
    data = clean(results.load(folder, fix="the invocation was probably killed while writing; re-run it"))
    inv_data = data["invocation"]
    invocation = InvocationView(
        folder=folder,
        tool_version=str(data.get("tool_version") or "unknown"),
        command=str(inv_data.get("command") or ""),
        argv=tuple(str(a) for a in inv_data.get("argv") or ()),
        started_at=str(inv_data.get("started_at") or ""),
        finished_at=inv_data.get("finished_at"),
        interrupted=bool(inv_data.get("interrupted")),
        host=dict(inv_data.get("host") or {}),
    )
    envs: dict[str, EnvInfo] = {}
    notes: list[str] = []
    for env_id, env in data["envs"].items():
        artifacts = _artifacts(folder, env_id, env.get("artifacts"), notes)
        envs[env_id] = EnvInfo(
            id=env_id,
            platform=str(env.get("platform") or "unknown"),
            engine=str(env.get("engine") or ""),
            image_id=env.get("image_id"),
            pins={str(k): str(v) for k, v in (env.get("pins") or {}).items()},
            derived_from=env.get("derived_from"),
            artifacts=artifacts,
            invocation=invocation,
            suite_exit_code=env.get("suite_exit_code"),
            suite_timed_out=bool(env.get("suite_timed_out")),
            interrupted=bool(env.get("interrupted")),
            venv=env.get("venv"),
        )
    runs: list[Run] = []
    for index, record in enumerate(data["runs"]):
        where = f"{path} run #{index}"
        check_closed_sets(record, where)
        env_id = record["env"]
        if env_id not in envs:
            raise UsageError(
                f"{where} names env {env_id!r}, which results.json does not describe",
                why=f"described envs: {', '.join(envs) or 'none'}",
                fix="re-run the invocation; the folder looks damaged",
            )
        # A run that did not run on its env's platform is shown as what it is: no evidence.
        record = as_evidence([record], {env_id: envs[env_id].platform})[0]
        runs.append(Run(record=record, invocation=invocation, env_platform=envs[env_id].platform))
    return ResultsFolder(invocation=invocation, envs=envs, runs=tuple(runs), notes=tuple(notes))


def _merge_env(old: EnvInfo, new: EnvInfo, notes: list[str]) -> EnvInfo:
    """Both describe the same env id; `new` comes from the newer invocation."""
    if dict(old.pins) != dict(new.pins) or old.platform != new.platform:
        differing = sorted(k for k in set(old.pins) | set(new.pins) if old.pins.get(k) != new.pins.get(k))
        raise UsageError(
            f"env {old.id!r} has different pins in {old.invocation.folder} and {new.invocation.folder}",
            why=f"pins that differ: {', '.join(differing) or 'platform'}; runs of different installs "
            "cannot share one row of the report",
            fix="report those folders separately, or re-run one of them with TORCH=/DEEPSPEED= so it "
            "gets a derived env id",
        )
    if old.image_id != new.image_id and old.image_id and new.image_id:
        notes.append(
            f"env {old.id}: image rebuilt between invocations ({old.image_id} -> {new.image_id}); "
            "pins are identical"
        )
    return new


def merge(folders: Sequence[ResultsFolder]) -> MergedResults:
    notes: list[str] = []
    unique: dict[Path, ResultsFolder] = {}
    for item in folders:
        if item.invocation.folder in unique:
            notes.append(f"{item.invocation.folder} was given more than once; read once")
            continue
        unique[item.invocation.folder] = item
        notes.extend(item.notes)
    ordered = sorted(unique.values(), key=lambda f: _timestamp(f.invocation.started_at))

    envs: dict[str, EnvInfo] = {}
    # A run's identity: a suite run by its key, a custom run by its job id and patch, so two
    # different jobs of one env are both kept and the same job run twice is the "newer one" case.
    chosen: dict[Any, Run] = {}
    superseded: list[Run] = []
    for item in ordered:
        for env_id, env in item.envs.items():
            envs[env_id] = _merge_env(envs[env_id], env, notes) if env_id in envs else env
        for run in item.runs:
            previous = chosen.get(run.key.identity())
            if previous is None:
                chosen[run.key.identity()] = run
                continue
            newer, older = (
                (run, previous)
                if _timestamp(run.started_at) >= _timestamp(previous.started_at)
                else (previous, run)
            )
            chosen[run.key.identity()] = newer
            superseded.append(older)
            notes.append(
                f"{run.ident}: ran in {older.invocation.folder.name} and {newer.invocation.folder.name}; "
                f"the newer one is reported (older outcome: {older.outcome.value}, "
                f"newer: {newer.outcome.value})"
            )
        if item.invocation.interrupted:
            notes.append(
                f"invocation {item.invocation.folder.name} was interrupted: its envs may be missing runs"
            )
    return MergedResults(
        invocations=tuple(f.invocation for f in ordered),
        envs=envs,
        runs=tuple(chosen.values()),
        superseded=tuple(superseded),
        notes=tuple(notes),
    )


def load_and_merge(
    result_dirs: Sequence[Path], clean: Callable[[Any], Any] = lambda data: data
) -> MergedResults:
    if not result_dirs:
        raise UsageError("no results folder given", fix="pass RESULTS=dir1,dir2 (default: results/latest)")
    return merge([load_folder(Path(d), clean) for d in result_dirs])
