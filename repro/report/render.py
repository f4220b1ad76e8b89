"""Turn answers, table rows and plots into report.html (self-contained) and REPORT.md (for GitHub)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from markupsafe import Markup

from repro import __version__
from repro.core import templating
from repro.core.jobname import job_label
from repro.core.paths import confined
from repro.report.answers import Answers, AnswersData
from repro.report.merge import MergedResults
from repro.report.model import EnvInfo, InvocationView, Run
from repro.report.per_env import EnvAnswer
from repro.report.plots import Plot, PlotData
from repro.report.tables import COLUMNS, Row, RowData, row_values
from repro.report.timeline import Timeline
from repro.report.verdicts import Finding

TEMPLATES = Path(__file__).parent / "templates"
ARTIFACT_CHARS = 40_000
DATA_ELEMENT_ID = "mics-repro-report-data"
MD_DATA_INFO = "json mics-repro-report"
# Forbid every fetch: the report must open offline and must not leak that it was opened.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


@dataclass(frozen=True)
class Source:
    """Where some of an env's runs came from: a job (or the suite's runs) and the results folder
    that holds them, with the line that runs them again. A report over several folders shows one
    per job, not only the newest folder's."""

    what: str  # `torchrun ...` (job 7e50...), or "the suite's runs"
    invocation: InvocationView

    @property
    def command(self) -> str:
        inv = self.invocation
        return inv.command or " ".join(inv.argv) or "(not recorded)"


def sources(runs: Sequence[Run]) -> tuple[Source, ...]:
    found: dict[tuple[Path, str | None], Source] = {}
    for run in runs:
        job = run.key.job
        what = job_label(run.job_command or "", job) if job else "the suite's runs"
        found.setdefault((run.invocation.folder, job), Source(what, run.invocation))
    return tuple(found.values())


@dataclass(frozen=True)
class EnvDetails:
    answer: EnvAnswer
    plots: tuple[Plot, ...]
    findings: tuple[Finding, ...]
    versions_seen: tuple[Mapping[str, Any], ...]
    artifacts: tuple[tuple[str, str, str], ...]  # (name, shown path, text)
    invocation: InvocationView
    fix_info: str  # what the run-time fix patched, as the first fixed run recorded it ("" if none)
    sources: tuple[Source, ...] = ()  # each job's (or the suite's) results folder and reproduce line

    @property
    def env(self) -> EnvInfo:
        return self.answer.env


def _artifact_text(path: Path, root: Path, clean: Callable[[str], str]) -> str:
    # merge.load_folder keeps only artifacts inside the folder; checked again where the file is read.
    rel = path.relative_to(root) if path.is_relative_to(root) else None
    if rel is None or confined(root, rel) is None:
        return "(not read: the path leads outside the results folder)"
    if not path.is_file():
        return f"(missing: {path})"
    # Scrubbed whole, before it is cut: half a token no longer has a token's shape.
    text = clean(path.read_text(errors="replace"))
    if len(text) > ARTIFACT_CHARS:
        return text[:ARTIFACT_CHARS] + f"\n... ({len(text) - ARTIFACT_CHARS} more characters in {path.name})"
    return text


def env_details(
    answer: EnvAnswer,
    merged: MergedResults,
    plots: Sequence[Plot],
    findings: Sequence[Finding],
    clean: Callable[[str], str],
) -> EnvDetails:
    """`clean`: the report's scrubber, for the artifacts (collect_env, ds_report) read here."""
    env = answer.env
    versions: list[Mapping[str, Any]] = []
    for run in merged.runs_of(env.id):
        seen = {k: v for k, v in run.versions.items() if v is not None}
        if seen and seen not in versions:
            versions.append(seen)
    artifacts = tuple(
        (
            name,
            str(path.relative_to(env.invocation.folder.parent))
            if path.is_relative_to(env.invocation.folder.parent)
            else str(path),
            _artifact_text(path, env.invocation.folder, clean),
        )
        for name, path in sorted(env.artifacts.items())
    )
    return EnvDetails(
        answer=answer,
        plots=tuple(plots),
        findings=tuple(f for f in findings if f.env == env.id),
        versions_seen=tuple(versions),
        artifacts=artifacts,
        invocation=env.invocation,
        fix_info=_fix_info(merged.runs_of(env.id)),
        sources=sources(merged.runs_of(env.id)) or (Source("the runs", env.invocation),),
    )


def _fix_info(runs: Sequence[Run]) -> str:
    info = next((r.record.get("fix") for r in runs if r.patch == "fixed" and r.record.get("fix")), None)
    return "" if info is None else json.dumps(info, indent=1, sort_keys=True, default=str)


# report.json: the answers, the table, the timelines and the plots, and the folders read.
class ReportData(AnswersData):
    schema: int
    tool_version: str
    results: list[str]
    table: list[RowData]
    notes: list[str]
    timelines: list[Timeline]
    plots: list[PlotData]


def report_data(
    merged: MergedResults,
    answers: Answers,
    rows: Sequence[Row],
    timelines: Sequence[Timeline],
    plots: Sequence[Plot] = (),
) -> ReportData:
    """The machine-readable twin of the report (embedded in both outputs, written as report.json)."""
    return {
        "schema": 1,
        "tool_version": __version__,
        "results": [str(inv.folder) for inv in merged.invocations],
        **answers.to_dict(),
        "table": [r.to_dict() for r in rows],
        "notes": list(merged.notes),
        "timelines": list(timelines),
        "plots": [p.to_dict() for p in plots],
    }


# SummaryData's parts: an env's headline entry, the upgrade answer (report.json's, in part).
class _HeadlineSummary(TypedDict):
    env: str
    versions: dict[str, str | None]
    reproduces: str
    signatures: list[str]
    fixed: str


class _UpgradeSummary(TypedDict):
    verdict: str
    baseline: str | None
    steps: list[dict[str, str]]  # {"env", "relation", "outcome"}


# The compact part of report.json that goes into REPORT.md: verdicts, not the evidence prose.
class SummaryData(TypedDict):
    schema: int
    tool_version: str
    headline: list[_HeadlineSummary]
    cause: str
    upgrade: _UpgradeSummary
    findings: list[dict[str, str | None]]  # {"kind", "env", "run"}


def summary_data(data: ReportData) -> SummaryData:
    """The compact part that goes into REPORT.md: verdicts, not the evidence prose."""
    upgrade = data["upgrade"]
    return {
        "schema": data["schema"],
        "tool_version": data["tool_version"],
        "headline": [
            {
                "env": e["env"],
                "versions": e["versions"],
                "reproduces": e["reproduces"],
                "signatures": e["signatures"],
                "fixed": e["fixed"],
            }
            for e in data["headline"]
        ],
        "cause": data["cause"]["verdict"],
        "upgrade": {
            "verdict": upgrade["verdict"],
            "baseline": upgrade["baseline"],
            "steps": [
                {"env": s["env"], "relation": s["relation"], "outcome": s["outcome"]}
                for s in upgrade["steps"]
            ],
        },
        "findings": [{"kind": f["kind"], "env": f["env"], "run": f["run"]} for f in data["findings"]],
    }


def _json_for_script(data: Any) -> str:
    # "<", ">" and "&" escaped so the JSON can never close the <script> element it lives in.
    text = json.dumps(data, indent=1, sort_keys=True, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@dataclass(frozen=True)
class Page:
    """What report.html and REPORT.md are both rendered from."""

    merged: MergedResults
    answers: Answers
    rows: Sequence[Row]
    details: Sequence[EnvDetails]
    timelines: Sequence[Timeline]
    data: ReportData
    generated_at: str


def _render(page: Page, target: templating.Target, template: str, **only: str) -> str:
    """One of the two pages; `only`: the names only its template reads (data_json: report.json
    whole for HTML, its summary for Markdown; plot_dir: Markdown's)."""
    # Every value is escaped for its target by the shared environment (repro.core.templating).
    env = templating.environment(TEMPLATES, target=target)
    env.filters["b64"] = lambda data: base64.b64encode(data).decode("ascii")
    env.globals.update(columns=COLUMNS, row_values=row_values)
    return env.get_template(template).render(
        answers=page.answers,
        rows=page.rows,
        details=page.details,
        timelines=page.timelines,
        merged=page.merged,
        generated_at=page.generated_at,
        tool_version=__version__,
        csp=CSP,
        data_id=DATA_ELEMENT_ID,
        md_data_info=MD_DATA_INFO,
        **only,
    )


def render_html(page: Page) -> str:
    return _render(
        page, templating.Target.HTML, "report.html.j2", data_json=Markup(_json_for_script(page.data))
    )


def render_markdown(page: Page, plot_dir: str) -> str:
    summary = json.dumps(summary_data(page.data), indent=1, sort_keys=True, allow_nan=False)
    return _render(page, templating.Target.MARKDOWN, "REPORT.md.j2", data_json=summary, plot_dir=plot_dir)
