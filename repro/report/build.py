"""Entry point: results folders in, OUT/report.html + OUT/REPORT.md + OUT/report.json + OUT/plots/ out."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from repro.core.errors import ReproError
from repro.core.scrub import Form, Scrubber, hand_out
from repro.report.answers import DEFAULT_GPU_ENV_HINT, answer_all
from repro.report.merge import load_and_merge
from repro.report.plots import Plot, env_plots
from repro.report.render import env_details, render_html, render_markdown, report_data
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
    try:
        from repro.matrix.schema import load_matrix  # written by the matrix step; optional here
    except ImportError:
        return DEFAULT_GPU_ENV_HINT
    try:
        matrix = load_matrix()
    except (ReproError, OSError, ImportError):
        # A broken matrix only costs the hint its env name; the report itself is built from records.
        return DEFAULT_GPU_ENV_HINT
    by_platform: dict[str, list[str]] = {}
    for env_id in matrix.ids():
        by_platform.setdefault(str(getattr(matrix.get(env_id).platform, "value", "")), []).append(env_id)
    ids = tuple(by_platform.get("rocm", []) + by_platform.get("cuda", []))
    return ids or DEFAULT_GPU_ENV_HINT


def _write_atomic(path: Path, data: bytes) -> None:
    """Readers (a browser, CI) never see half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp (0600): the report is for sharing; the umask decides, as for any file written.
    tmp = str(path.parent / f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_plots(out_dir: Path, plots: Sequence[Plot]) -> tuple[Path, ...]:
    folder = out_dir / PLOT_DIR
    wanted = {f"{p.slug}.png" for p in plots}
    if folder.is_dir():
        # The folder belongs to the report: drop plots of envs that are no longer in it.
        for stale in folder.glob("*.png"):
            if stale.name not in wanted:
                stale.unlink()
    written = []
    for plot in plots:
        path = folder / f"{plot.slug}.png"
        _write_atomic(path, plot.png)
        written.append(path)
    return tuple(written)


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
    scrubber = Scrubber.secrets() if scrubber is None else scrubber
    merged = load_and_merge([Path(d) for d in result_dirs], scrubber.data)
    answers = answer_all(merged, gpu_env_ids() if gpu_env_hint is None else gpu_env_hint)
    table = rows(merged)
    out_dir = Path(out_dir)
    timelines = load_timelines(out_dir)
    plots = {env_id: env_plots(merged, env_id) for env_id in merged.envs}
    details = [env_details(a, merged, plots[a.env.id], answers.findings, scrubber.text) for a in answers.envs]
    all_plots = [p for env_plots_ in plots.values() for p in env_plots_]
    data = report_data(merged, answers, table, timelines, all_plots)
    stamp = generated_at or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    html = hand_out(
        render_html(merged, answers, table, details, timelines, data, stamp),
        scrubber,
        "report.html",
        Form.HTML,
    )
    markdown = hand_out(
        render_markdown(merged, answers, table, details, timelines, data, stamp, PLOT_DIR),
        scrubber,
        "REPORT.md",
    )
    data_text = hand_out(
        json.dumps(scrubber.data(data), indent=2, sort_keys=True, allow_nan=False) + "\n",
        scrubber,
        "report.json",
    )
    plot_paths = _write_plots(out_dir, all_plots)
    paths = ReportPaths(
        html=out_dir / "report.html",
        markdown=out_dir / "REPORT.md",
        data=out_dir / "report.json",
        plots=plot_paths,
    )
    _write_atomic(paths.data, data_text.encode())
    _write_atomic(paths.markdown, markdown.encode())
    _write_atomic(paths.html, html.encode())
    return paths
