"""Entry point: results folders in, OUT/report.html + OUT/REPORT.md + OUT/report.json + OUT/plots/ out."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from repro.core import safe_write
from repro.core.errors import ReproError
from repro.core.scrub import Form, Scrubber, hand_out
from repro.report.answers import DEFAULT_GPU_ENV_HINT, answer_all
from repro.report.merge import load_and_merge
from repro.report.plots import env_plots
from repro.report.render import Page, env_details, render_html, render_markdown, report_data
from repro.report.tables import rows
from repro.report.timeline import load_timelines

PLOT_DIR = "plots"


@dataclass(frozen=True)
class ReportPaths:
    html: Path
    markdown: Path
    data: Path
    plots: tuple[Path, ...]


def gpu_env_ids() -> tuple[str, ...]:
    """ROCm envs first, then CUDA, from the env matrix; the default hint when the matrix is unavailable."""
    from repro.matrix.schema import load_matrix

    try:
        matrix = load_matrix()
    except (ReproError, OSError, ImportError):
        # A broken matrix only costs the hint its env name; the report itself is built from records.
        return DEFAULT_GPU_ENV_HINT
    envs = [matrix.get(env_id) for env_id in matrix.ids()]
    ids = tuple(e.id for platform in ("rocm", "cuda") for e in envs if e.platform.value == platform)
    return ids or DEFAULT_GPU_ENV_HINT


REPORT_FILES = ("report.html", "REPORT.md", "report.json")
# What the report wrote last time (its plots above all), so a re-render removes only those.
MANIFEST = ".report-files.json"
# A folder the report may write into besides a new or empty one: one this tool wrote (a results,
# bisect or survey folder, or an earlier report's).
OWNED_BY = ("results.json", "bisect.json", "survey.json", MANIFEST)


def _earlier_files(out_dir: Path) -> frozenset[str]:
    """The files an earlier report wrote into out_dir: its manifest, else (a report made before
    there was one) the plots its report.json names and the report files themselves."""
    listed = safe_write.read_manifest(out_dir, MANIFEST)
    if listed or (out_dir / MANIFEST).exists():
        return listed
    data = out_dir / "report.json"
    if data.is_symlink() or not data.is_file():
        return frozenset()
    try:
        plots = json.loads(data.read_text()).get("plots", [])
        slugs = [p["slug"] for p in plots if isinstance(p, dict) and isinstance(p.get("slug"), str)]
    except (OSError, ValueError, AttributeError, TypeError):
        return frozenset()
    return frozenset(
        f"{PLOT_DIR}/{slug}.png" for slug in slugs if "/" not in slug and slug not in ("", ".", "..")
    )


def _write_files(out_dir: Path, files: dict[str, bytes]) -> None:
    """Write the report's files; remove the plots of an earlier report that are not among them
    (an env no longer in it). Only files this tool wrote are replaced or removed: the report's
    own names in its own folder, and what the last report listed in its manifest."""
    earlier = _earlier_files(out_dir)
    ours = earlier | set(REPORT_FILES)
    safe_write.check_writable(out_dir, files, ours)  # refused before the manifest claims anything
    for stale in sorted(earlier - set(files)):
        if stale.startswith(f"{PLOT_DIR}/"):
            safe_write.remove_file(out_dir, stale)
    # The manifest first: a report cut short still lists every file it may have left.
    safe_write.write_manifest(out_dir, MANIFEST, files)
    for rel, data in files.items():
        safe_write.write_file(out_dir, rel, data, replace=rel in ours)


def build_report(
    result_dirs: Sequence[Path],
    out_dir: Path,
    *,
    gpu_env_hint: Sequence[str] | None = None,
    generated_at: str | None = None,
    scrubber: Scrubber | None = None,
) -> ReportPaths:
    """`scrubber`: what to keep out of the report; by default this host's secrets and every
    secret's shape, not its paths (a report read here links to the run's logs). The records are
    scrubbed as they are read and each written text passes `hand_out`: nothing is written when a
    secret survives (LeakError)."""
    active = Scrubber.secrets() if scrubber is None else scrubber

    def clean(data: object) -> object:
        # Each folder's command lines add their secret values to what every text here replaces
        # (quoted or escaped as they may be rendered), before anything is read from the folder.
        nonlocal active
        active = active.with_command_secrets(data)
        return active.data(data)

    merged = load_and_merge([Path(d) for d in result_dirs], clean)
    scrubber = active
    answers = answer_all(merged, gpu_env_ids() if gpu_env_hint is None else gpu_env_hint)
    table = rows(merged)
    out_dir = safe_write.claim_folder(Path(out_dir), option="OUT", owned_by=OWNED_BY)
    timelines = load_timelines(out_dir)
    plots = {env_id: env_plots(merged, env_id) for env_id in merged.envs}
    details = [env_details(a, merged, plots[a.env.id], answers.findings, scrubber.text) for a in answers.envs]
    all_plots = [p for env_plots_ in plots.values() for p in env_plots_]
    data = report_data(merged, answers, table, timelines, all_plots)
    stamp = generated_at or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    page = Page(merged, answers, table, details, timelines, data, stamp)
    texts = {
        "report.html": render_html(page),
        "REPORT.md": render_markdown(page, PLOT_DIR),
        "report.json": json.dumps(scrubber.data(data), indent=2, sort_keys=True, allow_nan=False) + "\n",
    }
    plot_files = {f"{PLOT_DIR}/{p.slug}.png": p.png for p in all_plots}
    handed = {
        name: hand_out(text, scrubber, name, Form.for_path(Path(name))).encode()
        for name, text in texts.items()
    }
    _write_files(out_dir, {**plot_files, **handed})
    return ReportPaths(
        html=out_dir / "report.html",
        markdown=out_dir / "REPORT.md",
        data=out_dir / "report.json",
        plots=tuple(out_dir / rel for rel in plot_files),
    )
