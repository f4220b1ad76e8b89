"""What ISSUE.md says, as typed facts read from any results folder `make issue` accepts: a bisect
(release or commit, with or without a transition), a survey (with unknown probes, interrupted), or
a plain `make run`/`make repro` folder. Every field the template reads is here with a default, so a
folder that lacks a key renders (the template's StrictUndefined catches a misspelt name in tests).

The statements are decided here, from the same probe rows the table shows, so the text never says
what its own table contradicts (no "no probe showed it" beside a reproduced row).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from repro.core.jobname import short_command
from repro.core.make_options import reproduce_pairs
from repro.core.makeline import make_line
from repro.core.runs import RunFinding, RunKey, finding_of
from repro.workload.record import CUSTOM_SCENARIO, RunRecord

ISSUE_URL = "https://github.com/deepspeedai/DeepSpeed/issues/5080"
ADAPTER = "repro/workload/cpu/gloo_transport.py"
JOB_FOLDER = "<your job folder>"
# A DeepSpeed config up to this size is inlined in the issue; a larger one is named only.
SMALL_CONFIG_BYTES = 4096
MAX_FILE_NAMES = 40
AXIS_WORDS = {"deepspeed": "DeepSpeed", "torch": "torch", "deepspeed-commit": "DeepSpeed commit"}


@dataclass(frozen=True)
class Row:
    """One probe (or, for a run folder, one run) as the table shows it."""

    axis: str
    version: str
    outcome: str
    signature: str
    verdict: str
    seconds: str
    reason: str = ""
    env: str = ""
    record: str | None = None
    versions: Mapping[str, Any] = field(default_factory=dict)
    run: RunKey | None = None  # a run folder's row: which run it is (a value, never its label)

    @property
    def finding(self) -> RunFinding:
        return finding_of(self.outcome, self.signature) or RunFinding.NO_OUTCOME  # unknown: says nothing

    @property
    def is_bug(self) -> bool:
        return self.finding is RunFinding.BUG

    @property
    def is_clean(self) -> bool:
        return self.finding is RunFinding.CLEAN

    @property
    def illegal_work(self) -> bool:
        return self.signature.startswith("illegal-work")

    def said(self) -> str:
        return f"**{self.outcome}** ({self.signature})"


def _verdict_of(row: Mapping[str, Any], finding: RunFinding) -> str:
    given = row.get("verdict")
    if given:
        return str(given)
    # A survey has no verdicts of its own: the default rule's reading of the outcome (probe.py).
    words = {RunFinding.BUG: "bad", RunFinding.CLEAN: "good"}
    return words.get(finding, "unknown")


def row_of(raw: Mapping[str, Any], axis: str) -> Row:
    seconds = raw.get("seconds")
    row = Row(
        axis=axis,
        version=str(raw.get("version") or raw.get("run_name") or "?"),
        outcome=str(raw.get("outcome") or "unknown"),
        signature=str(raw.get("signature") or "none"),
        verdict="",
        seconds="" if seconds is None else str(seconds),
        reason=" ".join(str(raw.get("reason") or "").split())[:300],
        env=str(raw.get("env") or ""),
        record=raw.get("record") if isinstance(raw.get("record"), str) else None,
        versions=dict(raw.get("versions") or {}) if isinstance(raw.get("versions"), Mapping) else {},
    )
    return replace(row, verdict=_verdict_of(raw, row.finding))


@dataclass(frozen=True)
class Transition:
    """The change the issue is about: `good` (expected) and `bad` (what happens); either may be
    missing (no probe of that kind ran)."""

    bad: Row | None = None
    good: Row | None = None
    both_bad: bool = False  # the change is between two kinds of bad (a crash became warnings)


def transition(data: Mapping[str, Any], rows: Sequence[Row], candidates: Sequence[str]) -> Transition:
    """From a bisect's boundary, a survey's first change point that involves the bug, or else the
    rows themselves (the first bad one; the first clean one)."""
    by_version = {r.version: r for r in rows}
    evidence = data.get("evidence") or {}
    if isinstance(evidence, Mapping) and evidence.get("first_bad") and evidence.get("last_good"):
        # A bisect's boundary is what BAD_IF= called good and bad (a hang is bad for `failed`).
        axis = str(data.get("axis") or "")
        good, bad = row_of(evidence["last_good"], axis), row_of(evidence["first_bad"], axis)
        return Transition(bad=bad, good=good, both_bad=good.is_bug)
    pairs: list[tuple[Row, Row]] = []
    for change in data.get("change_points") or []:
        before, after = by_version.get(str(change.get("before"))), by_version.get(str(change.get("after")))
        if before and after:
            pairs.append((before, after))
    # The change that involves the bug first; else one from clean to another failure (the replica
    # hang); else one between two kinds of the bug (a crash that became warnings).
    for a, b in pairs:
        if a.is_bug != b.is_bug:
            bad, good = (a, b) if a.is_bug else (b, a)
            return Transition(bad=bad, good=good)
    for a, b in pairs:
        if {a.finding, b.finding} == {RunFinding.CLEAN, RunFinding.OTHER_FAILURE}:
            bad, good = (a, b) if b.is_clean else (b, a)
            return Transition(bad=bad, good=good)
    for a, b in pairs:
        if a.is_bug and b.is_bug:
            order = {name: i for i, name in enumerate(candidates)}
            older, newer = (a, b) if order.get(a.version, 0) <= order.get(b.version, 0) else (b, a)
            return Transition(bad=newer, good=older, both_bad=True)
    first_bad = next((r for r in rows if r.is_bug), None) or next(
        (r for r in rows if r.verdict == "bad"), None
    )
    return Transition(bad=first_bad, good=next((r for r in rows if r.is_clean), None))


@dataclass(frozen=True)
class JobFacts:
    """The user's own command, as a maintainer needs it: what it runs, in which files, with which
    packages and DeepSpeed config. No host path: the folder is <your job folder>."""

    command: str
    short: str
    job_id: str
    files: tuple[str, ...] = ()
    files_note: str = ""
    packages: tuple[str, ...] = ()  # REQUIREMENTS=/PACKAGES= lines
    resolved: tuple[str, ...] = ()  # name==version the layer added
    ds_config: str = ""  # its name in the job folder
    ds_config_text: str = ""  # inlined when small
    ds_config_note: str = ""


_CONFIG_FLAGS = ("--deepspeed", "--deepspeed_config", "--deepspeed-config", "--ds_config", "--ds-config")


def config_named(command: str) -> str | None:
    """The DeepSpeed config file a command names: after --deepspeed/--deepspeed_config (or as
    --flag=FILE), else a token ending in .json."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        tokens = command.split()
    for i, token in enumerate(tokens):
        name, eq, value = token.partition("=")
        if name in _CONFIG_FLAGS:
            if eq and value.endswith(".json"):
                return value
            if not eq and i + 1 < len(tokens) and tokens[i + 1].endswith(".json"):
                return tokens[i + 1]
    return next((t for t in tokens if t.endswith(".json") and not t.startswith("-")), None)


def _inside(folder: Path, name: str) -> Path | None:
    path = (folder / name).resolve()
    try:
        path.relative_to(folder.resolve())
    except ValueError:
        return None  # a config outside the job folder: named, never read
    return path


def _same_folder(workdir: Path, recorded: Any) -> bool:
    """Whether `workdir` is the folder the run used: its digest (repro.run.job) is the record's."""
    from repro.run.job import workdir_digest

    if not isinstance(recorded, str) or not recorded or not workdir.is_dir():
        return False
    try:
        return workdir_digest(workdir) == recorded
    except OSError:
        return False


def job_facts(record: RunRecord) -> JobFacts | None:
    job = record.get("job")
    if not isinstance(job, Mapping) or not job.get("command"):
        return None
    command = str(job["command"])
    workdir = Path(str(job.get("workdir") or "."))
    files: tuple[str, ...] = ()
    files_note = ""
    # Read only the folder the run used: a results folder from elsewhere (or edited) could name any
    # folder of this host, and its files would end up in a text meant for the public tracker.
    same = _same_folder(workdir, job.get("workdir_digest"))
    try:
        names = sorted(e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in os.scandir(workdir))
        files = tuple(names[:MAX_FILE_NAMES]) if same else ()
        if len(names) > MAX_FILE_NAMES and same:
            files_note = f"and {len(names) - MAX_FILE_NAMES} more"
        if not same:
            files_note = (
                "not listed: the job folder here is not the one the run used, or changed since "
                "(its digest differs from the record's)"
            )
    except OSError:
        files_note = "the job folder is not on this host"
    layer = job.get("requirements")  # a JSON object, or anything else in an edited file
    lines = layer.get("lines") if isinstance(layer, dict) else None
    added = layer.get("added") if isinstance(layer, dict) else None
    config = config_named(command) or ""
    text, note = "", ""
    if config:
        path = _inside(workdir, config)
        if path is None:
            note = "outside the job folder: not read"
        elif not same:
            note = "not read: the job folder is not the one the run used, or changed since; attach it"
        elif not path.is_file():
            note = "not found in the job folder on this host"
        elif path.stat().st_size > SMALL_CONFIG_BYTES:
            note = f"{path.stat().st_size} bytes: attach it"
        else:
            text = path.read_text(errors="replace").strip()
    return JobFacts(
        command=command,
        short=short_command(command),
        job_id=str(job.get("job_id") or ""),
        files=files,
        files_note=files_note,
        packages=tuple(_portable_requirement(str(line), workdir) for line in lines or ()),
        resolved=tuple(f"{k}=={v}" for k, v in sorted(added.items() if isinstance(added, dict) else ())),
        ds_config=config,
        ds_config_text=text,
        ds_config_note=note,
    )


def _portable_requirement(line: str, workdir: Path) -> str:
    """A requirement line without host paths: a local wheel or folder is named by its file name (in
    the job folder: <your job folder>/...); the version the layer installed is listed apart."""
    out = []
    for token in line.split():
        path = token.removeprefix("file://")
        if path.startswith("/"):
            try:
                token = f"{JOB_FOLDER}/{Path(path).relative_to(workdir)}"
            except ValueError:
                token = Path(path).name
        out.append(token)
    return " ".join(out)


def portable_line(line: str, workdir: str | None) -> str:
    """A reproduce line without host paths: WORKDIR= becomes <your job folder>, REQUIREMENTS= a
    file in it, inherited variables before `make` (PYTHONPATH...) say to set them as on your host."""
    try:
        tokens = shlex.split(line)
    except ValueError:
        return line
    out: list[str] = []
    before_make = True
    folder = workdir.rstrip("/") if workdir else None
    for token in tokens:
        name, eq, value = token.partition("=")
        if token == "make":
            before_make = False
            out.append(token)
        elif eq and before_make and re.fullmatch(r"[A-Z_][A-Z0-9_]*", name) and "/" in value:
            out.append(f"{name}=<as on your host>")
        elif eq and name == "WORKDIR":
            out.append(f"WORKDIR={JOB_FOLDER}")
        elif eq and name == "REQUIREMENTS" and value.startswith("/"):
            inside = bool(folder) and value.startswith(f"{folder}/")
            rel = value[len(folder or "") + 1 :] if inside else Path(value).name
            out.append(f"REQUIREMENTS={JOB_FOLDER}/{rel}")
        else:
            out.append(shlex.quote(token))
    return " ".join(out)


# What a walk's make line says about the walk itself, not about one probe of it.
_WALK_ONLY = ("AXIS", "FROM", "TO", "GOOD", "BAD", "BAD_IF", "VERSIONS", "EVERY", "COMMITS", "PARALLEL",
              "RUNNER", "DEVICES", "PRERELEASES", "DS_REPO")  # fmt: skip


def probe_line(walk_line: str, axis: str, version: str, custom: bool) -> str:
    """`make probe` of one release of a survey/bisect line: the walk's options without the range,
    the walked package pinned to `version` (SCENARIO= dropped for the user's command: not used)."""
    try:
        tokens = shlex.split(walk_line)
    except ValueError:
        return walk_line
    if "make" not in tokens or axis not in ("torch", "deepspeed"):
        return walk_line
    at = tokens.index("make")
    if tokens[at + 1 : at + 2] not in (["survey"], ["bisect"]):
        return walk_line
    drop = set(_WALK_ONLY) | ({"SCENARIO"} if custom else set())
    rest = [t for t in tokens[at + 2 :] if t.partition("=")[0] not in drop]
    pin = f"{axis.upper()}={version}"
    env = [i for i, t in enumerate(rest) if t.startswith("ENV=")]
    rest.insert(env[0] + 1 if env else 0, pin)
    return shlex.join([*tokens[:at], "make", "probe", *rest])


def adapter_note(stacks: Mapping[str, str], groups: Sequence[Any]) -> str:
    """Said when a hung run's stacks pass through the lab's CPU transport adapter, so a maintainer
    does not suspect it: what it is, and that the ranks stopped in different collectives."""
    through = sorted(
        (r for r, text in stacks.items() if "gloo_transport.py" in text), key=lambda r: (len(r), r)
    )
    if not through:
        return ""
    where = "; ".join(f"ranks {', '.join(g.ranks)} in {_frame_name(g.where)}" for g in groups)
    return (
        f"Ranks {', '.join(through)} wait in `gloo_transport.py`: that is this lab's CPU transport "
        f"adapter ({ADAPTER}), which adds the collectives torch's gloo lacks (coalescing, tensor "
        "all-gather and reduce-scatter) on top of gloo's own, so DeepSpeed's MiCS code runs unmodified "
        "on CPU. A rank waits there for a collective its peers have not joined; the stacks show the "
        f"ranks in different collectives ({where}), which no transport can complete."
    )


def _frame_name(frame: str) -> str:
    found = re.search(r" in (\S+)\s*$", frame)
    return f"`{found.group(1)}`" if found else f"`{frame}`"


def bundle_steps(env: str, line: str, docker: bool) -> tuple[str, tuple[str, ...]]:
    """(the container line, the steps that make one): `make bundle` only works on a Docker run's
    results (a venv run's exits 16), so for those it is the same probe/run in Docker, then the bundle."""
    if docker:
        return make_line("bundle", reproduce_pairs({"ENV": env, "RESULTS": "<results>"})), ()
    tokens = line.split()
    if " ENGINE=" in f" {line}":
        tokens = [("ENGINE=docker" if t.startswith("ENGINE=") else t) for t in tokens]
    elif "make" in tokens:
        at = tokens.index("make") + 2  # after `make <target>`
        tokens[at:at] = ["ENGINE=docker"]
    bundle = make_line("bundle", reproduce_pairs({"ENV": env, "RESULTS": "results/latest"}))
    return "", (" ".join(tokens), bundle)


def subject(scenario: str, patch: str, job: JobFacts | None) -> str:
    if scenario == CUSTOM_SCENARIO and job:
        return f"MiCS, own job `{job.short}` ({patch})"
    return f"MiCS ({scenario}, {patch})"
