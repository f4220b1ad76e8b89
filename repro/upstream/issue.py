"""ISSUE.md for the upstream tracker from a bisect or survey folder (`make issue RESULTS=...`).

Read from the folder's bisect.json (a release bisect, a commit bisect, or a release bisect with
its `commits`) or survey.json, and from the first bad probe's record (its stacks when it hung).
Everything written passes through the bundle's scrubbing (repro.core.scrub): the folder's data is
scrubbed as it is read, the finished text passes `hand_out` (refused when a secret survives), so no
host paths, user names, host names or secrets reach the text; the folder's own path is <results>.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from repro.core import records, safe_write, shapes, templating
from repro.core.errors import UsageError
from repro.core.makeline import make_line
from repro.core.paths import confined
from repro.core.scrub import Scrubber, hand_out

TEMPLATES = Path(__file__).resolve().parent / "templates"
ISSUE_FILE = "ISSUE.md"
VERSION_KEYS = ("python", "torch", "deepspeed", "cuda", "hip", "nccl")
_STACKS = records.Shape((dict,), fields={"stacks": records.STR_MAP})


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


def _same(data: Any) -> Any:
    return data


def _load(folder: Path) -> tuple[str, dict[str, Any]]:
    for kind in ("bisect", "survey"):
        path = folder / f"{kind}.json"
        if path.exists():
            data: dict[str, Any] = records.load(path, shapes.WALK, f"{kind} file")
            return kind, data
    raise UsageError(
        f"{folder} holds neither bisect.json nor survey.json",
        fix="pass RESULTS= of a `make bisect` or `make survey` folder",
    )


def _record(folder: Path, probe: Mapping[str, Any] | None) -> dict[str, Any]:
    rel = (probe or {}).get("record")
    path = confined(folder, rel) if rel else None
    if path is None or not path.is_file():
        return {}
    # The record only adds the hung ranks' stacks: a damaged one is left out, not fatal.
    try:
        data = records.check(records.read(path, "run record"), _STACKS, path)
    except UsageError:
        return {}
    return data if isinstance(data, dict) else {}


def _probe_rows(probes: Sequence[Mapping[str, Any]], axis: str) -> list[dict[str, Any]]:
    return [
        {
            "axis": axis,
            "version": p.get("version"),
            "outcome": p.get("outcome"),
            "signature": p.get("signature"),
            "verdict": p.get("verdict", ""),
            "seconds": p.get("seconds"),
        }
        for p in probes
    ]


def context(folder: Path, clean: Callable[[Any], Any] = _same) -> dict[str, Any]:
    """What ISSUE.md says; `clean` rewrites what is read from the folder (the scrubber's `data`)."""
    kind, data = _load(folder)
    data = clean(data)
    commits = data.get("commits")
    if isinstance(commits, list):  # a survey's: one commit bisect per change point, the first found
        commits = next((c for c in commits if c.get("status") == "found"), None)
    commits = commits if isinstance(commits, dict) else None
    commit_data = commits if commits and commits.get("kind") == "bisect" else None
    if data.get("axis") == "deepspeed-commit":
        commit_data = data
    rows = _probe_rows(data.get("probes", []), data.get("axis", ""))
    if commit_data is not None and commit_data is not data:
        rows += _probe_rows(commit_data.get("probes", []), commit_data.get("axis", ""))
    found = commit_data if commit_data and commit_data.get("status") == "found" else data
    evidence = found.get("evidence") or {}
    bad, good = evidence.get("first_bad"), evidence.get("last_good")
    changes = data.get("change_points", [])
    if kind == "survey" and changes:
        by_version = {p["version"]: p for p in data.get("probes", [])}
        good, bad = by_version.get(changes[0]["before"]), by_version.get(changes[0]["after"])
    record = clean(_record(folder, bad))
    versions = {k: v for k, v in ((bad or {}).get("versions") or {}).items() if k in VERSION_KEYS and v}
    first_commit = (commit_data or {}).get("first_bad_commit")
    scenario, patch = data.get("scenario"), data.get("patch")
    if first_commit:
        title = (
            f"MiCS ({scenario}, {patch}): {bad['outcome'] if bad else 'bad'} since "
            f'{first_commit["short"]} "{first_commit["subject"]}"'
        )
    elif bad:
        title = f"MiCS ({scenario}, {patch}): {bad['outcome']} with DeepSpeed/torch {bad['version']}"
    else:
        title = f"MiCS ({scenario}, {patch}): no boundary found"
    return {
        "kind": kind,
        "title": title,
        "data": data,
        "commit": commit_data,
        "first_commit": first_commit,
        "bad": bad,
        "good": good,
        "record": record,
        "versions": versions,
        "stacks": stack_groups(record.get("stacks") or {}) if bad and bad.get("outcome") == "hung" else [],
        "changes": changes,
        "rows": rows,
        "bundle": make_line(
            "bundle", [("ENV", (bad or {}).get("env") or data.get("env")), ("RESULTS", "<results>")]
        ),
    }


def render(folder: Path, scrubber: Scrubber) -> str:
    paths: dict[str, str | Path] = {"<results>": folder.resolve()}
    repo = (context(folder)["commit"] or {}).get("ds_repo")
    if isinstance(repo, str) and repo.startswith("/"):  # a local checkout: where it is says nothing
        paths["<DS_REPO>"] = repo
    scrub = scrubber.with_paths(paths)
    # The records are scrubbed as they are read, each value again before it is escaped for
    # Markdown (a secret is matched as recorded, not in its escaped form), and the whole text
    # passes the hand-out gate after, for what the template itself holds.
    ctx = context(folder, scrub.data)
    env = templating.environment(TEMPLATES, target=templating.Target.MARKDOWN, clean=scrub.text)
    try:
        text = env.get_template("ISSUE.md.j2").render(**ctx)
    except jinja2.UndefinedError as exc:  # a key the shape leaves optional, yet ISSUE.md needs it
        raise UsageError(
            f"{folder / (ctx['kind'] + '.json')} lacks a field ISSUE.md needs",
            why=str(exc),
            fix="write it again with `make bisect` / `make survey` of this tool version",
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
