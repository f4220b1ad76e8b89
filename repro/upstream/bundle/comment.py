"""ISSUE_COMMENT.md for deepspeedai/DeepSpeed#5080, computed from one env's records.

Headline facts first (what reproduced, how, and that the patch fixes it), then the env table,
the evidence table (one row per run), the root cause with links to the lines of THAT DeepSpeed
release (repro.upstream.bundle.source_refs), the patch, and ds_report / collect_env folded in <details>. Every
statement about outcomes is read from the records; nothing here knows what "should" happen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.core import templating
from repro.core.runs import RunView
from repro.core.verdict import EnvVerdict, FixVerdict, Reproduces, env_verdicts
from repro.upstream.bundle.source_refs import Refs

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"  # repro/upstream/templates
ISSUE_URL = "https://github.com/deepspeedai/DeepSpeed/issues/5080"
# GitHub refuses comments longer than this many characters.
GITHUB_COMMENT_LIMIT = 65536
SCENARIO_TITLES = {
    "zero3": "Plain ZeRO-3 (control)",
    "mics": "Flat MiCS",
    "mics-hier": "Hierarchical MiCS",
    "mics-replica": "MiCS with replica groups",
    "custom": "Your command",
}


@dataclass(frozen=True)
class RunRow:
    """One run as the evidence table shows it."""

    run_name: str
    scenario: str
    patch: str
    dtype: str
    transport: str
    ranks: str
    outcome: str
    signature: str
    illegal_work: int
    first_divergent_step: int | None
    losses: str
    error: str
    reason: str
    control_run: str | None = None
    ident: str = ""  # RunView.ident: how the env verdict names this run (its evidence cites it)

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> RunRow:
        shard = rec.get("shard_size")
        ranks = f"{rec.get('world_size')}" + (f" / shard {shard}" if shard else "")
        if rec.get("hierarchical"):
            ranks += " (hier)"
        exc = rec.get("exception") or {}
        error = f"{exc.get('type', '')}: {exc.get('message', '')}".strip(": ") if exc else ""
        return cls(
            run_name=str(rec.get("run_name")),
            scenario=str(rec.get("scenario")),
            patch=str(rec.get("patch")),
            dtype=str(rec.get("dtype")),
            transport=str(rec.get("transport")),
            ranks=ranks,
            outcome=str(rec.get("outcome")),
            signature=str(rec.get("signature")),
            illegal_work=int(rec.get("illegal_work_messages") or 0),
            first_divergent_step=rec.get("first_divergent_step"),
            losses=_losses(rec.get("losses") or []),
            error=_one_line(error, 160),
            reason=_one_line(str(rec.get("reason") or ""), 300),
            control_run=rec.get("control_run"),
            ident=RunView(rec).ident if all(rec.get(k) for k in ("env", "scenario", "patch")) else "",
        )


@dataclass(frozen=True)
class Headline:
    scenario: str
    title: str
    stock: RunRow | None
    fixed: RunRow | None


@dataclass(frozen=True)
class IssueInput:
    env_id: str
    env: Mapping[str, Any]  # results.json envs[env_id]
    records: Sequence[Mapping[str, Any]]
    refs: Refs
    patch_name: str
    patch_text: str
    ds_report: str
    collect_env: str
    reproduce: Sequence[str]  # shell lines a maintainer runs
    results_command: str


def _losses(losses: Sequence[float | None]) -> str:
    if not losses:
        return "none"

    def fmt(v: float | None) -> str:
        return "NaN/inf" if v is None else f"{v:.4g}"

    return f"{fmt(losses[0])} → {fmt(losses[-1])} ({len(losses)} steps)"


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def primary_transport(rows: Sequence[RunRow]) -> str:
    """The transport the suite was asked for: native on GPUs, else the one of the control run."""
    for row in rows:
        if row.scenario == "zero3" and row.patch == "stock":
            return row.transport
    return rows[0].transport if rows else "native"


def headlines(rows: Sequence[RunRow]) -> list[Headline]:
    transport = primary_transport(rows)
    out = []
    for scenario, title in SCENARIO_TITLES.items():
        pick = {
            p: next((r for r in rows if (r.scenario, r.patch, r.transport) == (scenario, p, transport)), None)
            for p in ("stock", "fixed")
        }
        if pick["stock"] or pick["fixed"]:
            out.append(Headline(scenario, title, pick["stock"], pick["fixed"]))
    return out


def sync_proof(rows: Sequence[RunRow]) -> RunRow | None:
    """Stock flat MiCS over the synchronous transport, when the suite ran it."""
    return next((r for r in rows if (r.scenario, r.patch, r.transport) == ("mics", "stock", "sync")), None)


@dataclass(frozen=True)
class Answer:
    title: str
    summary: str
    reproduced: tuple[str, ...]
    fixed: bool | None  # None: no patched MiCS run
    verdict: str = ""  # THE env verdict's headline (repro.core.verdict), word for word


def answer(
    heads: Sequence[Headline], versions: Mapping[str, Any], records: Sequence[Mapping[str, Any]]
) -> Answer:
    """The first lines of the comment: what reproduced and whether the patch fixes it, as THE env
    verdict (repro.core.verdict) says, so the comment, the report and the summary agree."""
    stack = f"torch {versions.get('torch', '?')} + DeepSpeed {versions.get('deepspeed', '?')}"
    verdicts = env_verdicts(records)
    verdict = verdicts[0] if len(verdicts) == 1 else None
    bug_runs = (
        {ident for e in verdict.reproduce_evidence for ident in e.runs}
        if verdict is not None and verdict.reproduces is Reproduces.YES
        else set()
    )
    mics = [h for h in heads if h.scenario != "zero3"]
    reproduced = tuple(h.title for h in mics if h.stock and h.stock.ident in bug_runs)
    patched = [h.fixed for h in mics if h.fixed]
    control = next((h.stock for h in heads if h.scenario == "zero3" and h.stock), None)
    title = f"Reproduced on {stack}: {', '.join(reproduced)}" if reproduced else f"Not reproduced on {stack}"
    parts = []
    if control is not None:
        parts.append(f"Plain ZeRO-3 on the same install: **{control.outcome}**.")
    fixed = _fixed(verdict, patched)
    if fixed is True:
        parts.append(_resolved_sentence(verdict, patched, compared=control is not None))
    elif fixed is False:
        # `fixed is False` only comes from a verdict; its fix failures name the runs to blame.
        failures = verdict.fix_failures if verdict else ()
        against = {ident for e in failures for ident in e.runs}
        bad = ", ".join(f"{r.run_name}: {r.outcome}" for r in patched if r.ident in against)
        parts.append(f"With the patch below not every MiCS run is clean ({bad}).")
    elif verdict is not None and verdict.fixed is FixVerdict.UNVERIFIED:
        parts.append(
            "With the patch below the MiCS runs are clean, but the ZeRO-3 control failed, so their "
            "losses could not be compared."
        )
    return Answer(title, " ".join(parts), reproduced, fixed, verdict.headline() if verdict else "")


def _fixed(verdict: EnvVerdict | None, patched: Sequence[RunRow]) -> bool | None:
    """True: the patch resolves what reproduced (or, nothing having reproduced, every patched run is
    clean); False: a patched run counts against it; None: no patched run, or no verdict either way."""
    if verdict is None or not patched:
        return None
    if verdict.fixed is FixVerdict.YES:
        return True
    if verdict.fixed is FixVerdict.NO:
        return False
    if verdict.fixed is FixVerdict.NOT_APPLICABLE:
        return True if verdict.all_fixed_clean else None
    return None


def _resolved_sentence(verdict: EnvVerdict | None, patched: Sequence[RunRow], *, compared: bool) -> str:
    """`compared`: the folder holds the plain ZeRO-3 run the patched runs' losses were matched
    with; without one the sentence claims no comparison (an own job's fixed run is judged from
    its own output)."""
    how = (
        "(losses match plain ZeRO-3)"
        if compared
        else "(no IllegalWork message; no plain ZeRO-3 run here to compare losses with)"
    )
    if verdict is None or verdict.all_fixed_clean:
        return f"With the patch below every MiCS run is **clean** {how}."
    others = "; ".join(e.text for e in verdict.other_failures)
    return (
        f"With the patch below every MiCS run that shows the bug is **clean** {how}. "
        f"Separately, and with or without the patch: {others}."
    )


def _backend(records: Sequence[Mapping[str, Any]]) -> str:
    backends = sorted({str(r.get("backend")) for r in records if r.get("backend")})
    transports = sorted(
        {str(r.get("transport")) for r in records if r.get("transport") not in (None, "native")}
    )
    text = ", ".join(backends) or "?"
    return f"{text} (transport: {', '.join(transports)})" if transports else text


def cell(value: object) -> str:
    """A table cell's value on one line ("–" when there is none); the Markdown environment
    escapes it like every value (repro.core.templating)."""
    text = "–" if value is None or value == "" else str(value)
    return " ".join(text.split())


def render(data: IssueInput, *, artifact_limit: int | None = None) -> str:
    rows = [RunRow.from_record(r) for r in data.records]
    versions: Mapping[str, Any] = next((r["versions"] for r in data.records if r.get("versions")), {})

    def clip(text: str) -> str:
        if artifact_limit is None or len(text) <= artifact_limit:
            return text.rstrip("\n")
        return text[:artifact_limit].rstrip("\n") + "\n[… cut to fit a GitHub comment; the bundle has it all]"

    heads = headlines(rows)
    return (
        templating.environment(TEMPLATES, target=templating.Target.MARKDOWN, filters={"cell": cell})
        .get_template("ISSUE_COMMENT.md.j2")
        .render(
            d=data,
            rows=rows,
            heads=heads,
            proof=sync_proof(rows),
            versions=versions,
            answer=answer(heads, versions, data.records),
            transport=primary_transport(rows),
            pins=dict(data.env.get("pins") or {}),
            platform=str(data.env.get("platform") or "?"),
            backend=_backend(data.records),
            reproduce_text="\n".join(data.reproduce),
            ds_report=clip(data.ds_report),
            collect_env=clip(data.collect_env),
        )
    )


def render_fitting(data: IssueInput) -> str:
    """The comment, with the folded artifacts shortened only if GitHub would refuse it otherwise."""
    text = render(data)
    limit = max(len(data.ds_report), len(data.collect_env))
    while len(text) > GITHUB_COMMENT_LIMIT and limit > 500:
        limit //= 2
        text = render(data, artifact_limit=limit)
    return text
