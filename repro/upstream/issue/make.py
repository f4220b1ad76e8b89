"""ISSUE.md for the upstream tracker from a results folder (`make issue RESULTS=...`).

Read from the folder's bisect.json (a release bisect, a commit bisect, or a release bisect with
its `commits`) or survey.json, else its results.json (a `make run`/`make repro` folder), and from
the bad run's record (its job, its stacks when it hung). What the text says is decided in
repro/upstream/issue/facts.py.
Everything written passes through the bundle's scrubbing (repro.core.scrub): the folder's data is
scrubbed as it is read, the finished text passes `hand_out` (refused when a secret survives), so no
host paths, user names, host names or secrets reach the text; the folder's own path is <results>.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypedDict

import jinja2

from repro.core import records, results, safe_write, shapes, templating
from repro.core.errors import UsageError
from repro.core.paths import confined
from repro.core.results import Invocation, ResultsData
from repro.core.runs import RunFinding, RunView
from repro.core.scrub import Scrubber, hand_out
from repro.core.walk_files import WalkData
from repro.upstream.issue import facts
from repro.workload.record import CONTROL_SCENARIO, CUSTOM_SCENARIO, RunRecord

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"  # repro/upstream/templates
ISSUE_FILE = "ISSUE.md"
VERSION_KEYS = ("python", "torch", "deepspeed", "cuda", "hip", "nccl")
_STACKS = records.Shape((dict,), fields={"stacks": records.STR_MAP})
MARKERS = {"bisect": "bisect.json", "survey": "survey.json", "run": "results.json"}


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose hang stacks end in the same frame: the ones that wait and the ones that went on."""

    ranks: tuple[str, ...]
    where: str  # the innermost frame line
    stack: str  # one rank's whole stack (the first of the group)


def main_stack(text: str) -> str:
    """The stack of the thread that was running (faulthandler's "Current thread" block, most
    recent call first); the whole text when there is no such block (another dump format)."""
    blocks = re.split(r"\n\s*\n", text.strip())
    current = [b for b in blocks if b.lstrip().startswith("Current thread")]
    return current[0].strip() if current else text.strip()


def stack_groups(stacks: Mapping[str, str]) -> list[StackGroup]:
    """Ranks grouped by the innermost DeepSpeed frame of their running thread, so the ranks that
    wait in one collective and those that went on to another are told apart."""
    groups: dict[str, list[str]] = {}
    for rank in sorted(stacks, key=lambda r: (len(r), r)):
        lines = [line.strip() for line in main_stack(stacks[rank]).splitlines() if line.strip()]
        frames = [line for line in lines if line.startswith("File ")]
        if "most recent call first" not in (lines[0] if lines else ""):
            frames.reverse()  # a Python traceback: the innermost frame comes last
        # Where DeepSpeed was when the rank stopped (the frames below it are torch's and the
        # transport's waits, the same for every rank); else the innermost frame.
        ours = [f for f in frames if "/deepspeed/" in f]
        where = (ours or frames or lines[-1:] or ["(empty)"])[0]
        where = re.sub(r'File "[^"]*/(deepspeed/[^"]*)"', r'File "\1"', where)  # the package's own path
        groups.setdefault(where, []).append(rank)
    return [StackGroup(tuple(r), where, main_stack(stacks[r[0]])) for where, r in groups.items()]


# The folder's kind, its bisect.json or survey.json ({} in a run folder) and its results.json (a
# walk's: its probes' records, None when missing or damaged).
def _load(folder: Path) -> tuple[str, WalkData, ResultsData | None]:
    for kind in ("bisect", "survey"):
        path = folder / f"{kind}.json"
        if path.exists():
            return kind, records.load(path, shapes.WALK, f"{kind} file"), _results(folder)
    if (folder / "results.json").exists():
        return "run", {}, results.load(folder)
    raise UsageError(
        f"{folder} holds none of bisect.json, survey.json or results.json",
        fix="pass RESULTS= of a `make run`, `make repro`, `make bisect` or `make survey` folder",
    )


def _results(folder: Path) -> ResultsData | None:
    """A walk folder's results.json (its probes' records); None when it is missing or damaged: the
    walk's own file says what ISSUE.md needs, the records only add the job and the stacks."""
    try:
        data = results.load(folder)
    except UsageError:
        return None
    return data


def _record(folder: Path, rel: str | None) -> RunRecord:
    path = confined(folder, rel) if rel else None
    if path is None or not path.is_file():
        return {}
    # The record only adds the hung ranks' stacks: a damaged one is left out, not fatal.
    try:
        record: RunRecord = records.check(records.read(path, "run record"), _STACKS, path)  # a dict
    except UsageError:
        return {}
    return record


def _record_of(folder: Path, runs: Sequence[RunRecord], row: facts.Row | None, patch: str) -> RunRecord:
    """The record behind a probe row: results.json's (a custom run's has its `job` block there, its
    run folder's job.json is only the runner's), else the file the row names."""
    if row is None:
        return {}
    if row.record:
        where = row.record.rsplit("/", 1)[0] + "/"
        for run in runs:
            logs = run.get("logs") or {}
            if run.get("env") == row.env and any(str(v).startswith(where) for v in logs.values()):
                return run.copy()
    for run in runs:
        if run.get("env") == row.env and run.get("patch") == patch and run.get("scenario") != "zero3":
            return run.copy()
    return _record(folder, row.record)


def _run_rows(runs: Sequence[Mapping[str, Any]]) -> list[facts.Row]:
    """A run folder's table: one row per record, the bug's runs first (stock before fixed)."""

    def order(r: Mapping[str, Any]) -> tuple[int, int, str]:
        return (r.get("scenario") == "zero3", r.get("patch") != "stock", str(r.get("run_name")))

    rows = []
    for run in sorted(runs, key=order):
        name = str(run.get("run_name") or f"{run.get('scenario')}-{run.get('patch')}")
        row = facts.row_of({**run, "version": f"{run.get('env')}: {name}", "seconds": None}, "run")
        rows.append(replace(row, run=RunView(run).key))
    return rows


def _same_job(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    ja, jb = a.get("job") or {}, b.get("job") or {}
    return isinstance(ja, dict) and isinstance(jb, dict) and ja.get("job_id") == jb.get("job_id")


def _fixed_twin(runs: Sequence[RunRecord], bad: RunRecord) -> RunRecord | None:
    """The lab's fixed run of the same env and scenario (same job for a custom one), if one ran."""
    for run in runs:
        if (
            run.get("patch") == "fixed"
            and run.get("env") == bad.get("env")
            and run.get("scenario") == bad.get("scenario")
            and (bad.get("scenario") != CUSTOM_SCENARIO or _same_job(run, bad))
        ):
            return run
    return None


# ISSUE.md's fix section: the patch file, what the lab's fixed run showed, else the line that runs one
# ("try" is a keyword, hence the call).
_Fix = TypedDict(
    "_Fix",
    {"patch_file": str, "deepspeed": str, "outcome": str, "signature": str, "reason": str, "try": str},
)


def _title(subject: str, axis: str, trans: facts.Transition, rows: Sequence[facts.Row], kind: str) -> str:
    bad, good, word = trans.bad, trans.good, facts.AXIS_WORDS.get(axis, axis)
    if bad is None:
        span = f" in {word} {rows[0].version} .. {rows[-1].version}" if kind != "run" and rows else ""
        return f"{subject}: the bug did not show{span}"
    said = f"{bad.outcome} ({bad.signature})"
    if kind == "run" or good is None or good.axis == "run":
        pins = ", ".join(f"{k} {v}" for k, v in bad.versions.items() if k in ("deepspeed", "torch") and v)
        where = f"{word} {bad.version}" if kind != "run" else (pins or bad.env)
        return f"{subject}: {said} with {where}"
    if trans.both_bad:
        before = f"{good.outcome} ({good.signature}) with {word} {good.version}"
        return f"{subject}: {before}, {said} from {bad.version}"
    if _is_older(bad.version, good.version, rows):
        return f"{subject}: {said} up to {word} {bad.version}, {good.outcome} from {good.version}"
    return f"{subject}: {said} from {word} {bad.version} ({good.version}: {good.outcome})"


def _is_older(a: str, b: str, rows: Sequence[facts.Row]) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) < Version(b)
    except InvalidVersion:
        order = [r.version for r in rows]
        return order.index(a) < order.index(b) if a in order and b in order else False


def context(folder: Path, clean: Callable[[Any], Any] = lambda data: data) -> dict[str, Any]:
    """What ISSUE.md says (the template's names, values of many shapes: free-form); `clean`
    rewrites what is read from the folder (the scrubber's `data`), applied to the finished
    context (host paths are first turned into placeholders here)."""
    kind, data, results = _load(folder)
    runs = list(results["runs"]) if results else []  # the folder's records: a walk's probes made them too
    commit_data = _commit_bisect(data)
    axis = str(data.get("axis") or ("run" if kind == "run" else ""))
    rows, trans = _table(kind, data, axis, runs, commit_data)
    bad, good = trans.bad, trans.good
    record = _bad_record(folder, kind, data, runs, bad)
    job = facts.job_facts(record)
    scenario = str(data.get("scenario") or record.get("scenario") or "")
    patch = str(data.get("patch") or record.get("patch") or "")
    env = (bad.env if bad else "") or str(data.get("env") or record.get("env") or "")
    first_commit = (commit_data or {}).get("first_bad_commit")
    subject = facts.subject(scenario, patch, job)
    if first_commit and bad:
        title = f'{subject}: {bad.outcome} since {first_commit["short"]} "{first_commit["subject"]}"'
    else:
        title = _title(subject, axis, trans, rows, kind)
    versions = dict(bad.versions if bad else record.get("versions") or {})
    versions = {k: v for k, v in versions.items() if k in VERSION_KEYS and v}
    workdir = str((record.get("job") or {}).get("workdir") or "") or None
    invocation: Invocation = results["invocation"] if results and kind == "run" else {}
    line = _recorded_line(data, invocation, commit_data)
    if kind != "run" and bad is not None and not data.get("repro_command") and not first_commit:
        line = facts.probe_line(line, axis, bad.version, scenario == CUSTOM_SCENARIO)
    line = facts.portable_line(line, workdir) if line else ""
    engine = (results["envs"].get(env) or {}).get("engine") if results else None
    container, steps = facts.bundle_steps(env, line, engine == "docker")
    hung = bool(bad and bad.outcome == "hung")
    stacks = dict(record.get("stacks") or {})
    groups = stack_groups(stacks) if hung else []
    ctx = {
        "kind": kind,
        "title": title,
        "axis_word": facts.AXIS_WORDS.get(bad.axis if bad else axis, axis),
        "subject": subject,
        "env": env,
        "scenario": scenario,
        "patch": patch,
        "bad_if": str(data.get("bad_if") or ""),
        "commit": commit_data,
        "first_commit": first_commit,
        "bad": _plain(bad),
        "good": _plain(good),
        "both_bad": trans.both_bad,
        "good_is_clean": bool(good and good.is_clean and not trans.both_bad),
        "links": [facts.ISSUE_URL] if bad and bad.illegal_work else [],
        "job": _plain(job),
        "fix": _fix_of(bad, record, runs, versions, axis, line),
        "versions": versions,
        "first_release": _first_release(kind, data),
        "changes": [c for c in data.get("change_points") or [] if isinstance(c, dict)]
        if kind == "survey"
        else [],
        "reproduce": line,
        "container": container,
        "bundle_steps": list(steps),
        "stacks": [{"ranks": list(g.ranks), "where": g.where, "stack": g.stack} for g in groups],
        "adapter_note": facts.adapter_note(stacks, groups) if hung else "",
        "rows": [_plain(r) for r in rows],
        "unfinished": bool(data.get("interrupted"))
        or data.get("status") == "in-progress"
        or bool(invocation.get("interrupted")),
        "resume": _resume_line(kind, data, workdir),
        "next": _next_steps(data, workdir),
        "signature_note": str(data.get("signature_note") or ""),
    }
    return clean(ctx)  # type: ignore[no-any-return]


def _commit_bisect(data: WalkData) -> WalkData | None:
    """The folder's commit bisect: the folder's own file, its `commits`, or a survey's first found one
    (JSON, as _load reads it)."""
    if data.get("axis") == "deepspeed-commit":
        return data
    commits = data.get("commits")
    if isinstance(commits, list):  # a survey's: one commit bisect per change point, the first found
        commits = next((c for c in commits if isinstance(c, dict) and c.get("status") == "found"), None)
    commits = commits if isinstance(commits, dict) else None
    return commits if commits and commits.get("kind") == "bisect" else None


def _table(
    kind: str,
    data: WalkData,
    axis: str,
    runs: Sequence[Mapping[str, Any]],
    commit_data: WalkData | None,
) -> tuple[list[facts.Row], facts.Transition]:
    """The table's rows (a commit bisect's after the folder's own) and the change that ISSUE.md reports."""
    if kind == "run":
        rows = _run_rows(runs)
        trans = _run_transition(rows)
    else:
        rows = [facts.row_of(p, axis) for p in data.get("probes") or [] if isinstance(p, dict)]
        trans = facts.transition(data, rows, [str(c) for c in data.get("candidates") or []])
    if commit_data is not None and commit_data is not data:
        rows += [facts.row_of(p, str(commit_data.get("axis"))) for p in commit_data.get("probes") or []]
    if commit_data and commit_data.get("status") == "found":
        trans = facts.transition(commit_data, rows, [])
    return rows, trans


def _run_transition(rows: Sequence[facts.Row]) -> facts.Transition:
    """A run folder's change: its first bug run (bad) against its first clean run (good)."""
    # The bug's stock runs; else another failure of a MiCS run (the replica hang).
    mics = [r for r in rows if r.run is not None and r.run.scenario != CONTROL_SCENARIO]
    bug = [r for r in mics if r.is_bug and r.run is not None and r.run.patch != "fixed"] or [
        r for r in mics if r.finding is RunFinding.OTHER_FAILURE
    ]
    clean_rows = [r for r in rows if r.is_clean]
    return facts.Transition(bad=bug[0] if bug else None, good=clean_rows[0] if clean_rows else None)


def _bad_record(
    folder: Path, kind: str, data: WalkData, runs: Sequence[RunRecord], bad: facts.Row | None
) -> RunRecord:
    """The record of the bad row's run: a run folder's own record of it, else the probe's."""
    bad_run: RunRecord | None = None
    if kind == "run" and bad is not None:
        bad_run = next((r for r in runs if RunView(r).key == bad.run), None)
    return bad_run or _record_of(folder, runs, bad, str(data.get("patch") or ""))


def _recorded_line(data: WalkData, invocation: Invocation, commit_data: WalkData | None) -> str:
    """The command line the folder recorded that made it (its own, or its commit bisect's)."""
    reproduce = commit_data.get("reproduce") if commit_data else None
    return str(
        data.get("repro_command")
        or data.get("command")
        or invocation.get("command")
        or (reproduce.get("make") if reproduce else None)
        or ""
    )


def _fix_of(
    bad: facts.Row | None,
    record: RunRecord,
    runs: Sequence[RunRecord],
    versions: Mapping[str, Any],
    axis: str,
    line: str,
) -> _Fix | None:
    """The fix's section: what the lab's fixed run showed, else the line that runs one."""
    # The fix is for the IllegalWork bug only (the replica hang is another; docs/background.md §2).
    if not (bad and bad.is_bug):
        return None
    from repro.upstream import patchgen

    twin = _fixed_twin(runs, record) if record else None
    version = versions.get("deepspeed") or (bad.version if axis == "deepspeed" else None)
    shipped = patchgen.patch_file(version) if version else None
    return {
        "patch_file": f"patches/{shipped.name}" if shipped and shipped.is_file() else "",
        "deepspeed": version or "",
        "outcome": str(twin.get("outcome") or "") if twin else "",
        "signature": str(twin.get("signature") or "") if twin else "",
        "reason": " ".join(str((twin or {}).get("reason") or "").split())[:300],
        "try": "" if twin else _try_fix(line),
    }


def _try_fix(line: str) -> str:
    """The reproduce line with the fixed patch added ("" when it names no PATCH=stock)."""
    # No fixed run in the folder: the same line runs one (a probe runs one patch at a time).
    tokens = line.split()
    both = "PATCH=fixed" if "probe" in tokens else "PATCH=stock,fixed"
    return " ".join(both if t == "PATCH=stock" else t for t in tokens) if "PATCH=stock" in tokens else ""


class _FirstRelease(TypedDict):  # a release bisect's answer, as the walk's file says it
    first_bad: Any
    last_good: Any
    unknown_between: list[Any]


class _NextSteps(TypedDict):  # what the walk suggests running next, and why
    why: str
    lines: list[str]


def _first_release(kind: str, data: WalkData) -> _FirstRelease | None:
    """A release bisect's answer: the first bad release, the last good one, the unknowns between."""
    if kind != "bisect" or not data.get("first_bad"):
        return None
    return {
        "first_bad": data.get("first_bad"),
        "last_good": data.get("last_good"),
        "unknown_between": list(data.get("unknown_between") or []),
    }


def _resume_line(kind: str, data: WalkData, workdir: str | None) -> str:
    """The line that finishes an unfinished walk."""
    # A bisect saves the narrowed range's line; a survey is run again (built envs are reused).
    return facts.portable_line(
        str(data.get("resume_command") or (data.get("command") if kind == "survey" else "") or ""),
        workdir,
    )


def _next_steps(data: WalkData, workdir: str | None) -> _NextSteps:
    """What the walk suggests running next, and why."""
    next_steps = data.get("next")
    if not isinstance(next_steps, dict):  # none, or an edited file's
        return {"why": "", "lines": []}
    return {
        "why": str(next_steps.get("why") or ""),
        "lines": [facts.portable_line(str(x), workdir) for x in next_steps.get("lines") or []],
    }


def _plain(value: Any) -> Any:
    """Dataclasses and tuples as the JSON-like values the scrubber rewrites (and Jinja reads)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def render(folder: Path, scrubber: Scrubber) -> str:
    paths: dict[str, str | Path] = {"<results>": folder.resolve()}
    raw = context(folder)
    repo = (raw["commit"] or {}).get("ds_repo")
    if isinstance(repo, str) and repo.startswith("/"):  # a local checkout: where it is says nothing
        paths["<DS_REPO>"] = repo
    # Each secret value of the folder's command lines is replaced wherever it appears, quoted or
    # not (a reproduce line quotes CMD='...' once more); the lines themselves word by word.
    _, data, results = _load(folder)
    recorded = [raw, data, results or {}]
    scrub = scrubber.with_paths(paths).with_command_secrets(recorded)
    # The records are scrubbed as they are read, each value again before it is escaped for
    # Markdown (a secret is matched as recorded, not in its escaped form), and the whole text
    # passes the hand-out gate after, for what the template itself holds.
    ctx = context(folder, scrub.data)
    env = templating.environment(TEMPLATES, target=templating.Target.MARKDOWN, clean=scrub.text)
    try:
        text = env.get_template("ISSUE.md.j2").render(**ctx)
    except jinja2.UndefinedError as exc:  # every field is in the context (issue_facts): a bug here
        raise UsageError(
            f"{folder / MARKERS[ctx['kind']]} lacks a field ISSUE.md needs",
            why=str(exc),
            fix="write it again with this tool version, and report the field to its maintainers",
        ) from None
    return hand_out(text, scrub, "ISSUE.md")


def write(folder: Path, scrubber: Scrubber, out: Path | None = None) -> Path:
    """ISSUE.md in the bisect/survey folder (replacing the one written there before; never through
    a link), or OUT= as a new file: a file that is already there may be the user's."""
    text = render(folder, scrubber).encode()
    if out is None:
        return safe_write.write_file(folder, ISSUE_FILE, text, replace=True)
    out = Path(out)
    if not out.name or out.name in (".", ".."):
        raise UsageError(f"OUT={out} is not a file name", fix="pass OUT=<new file>.md")
    return safe_write.write_file(out.parent, out.name, text, replace=False)
