"""Per-env plots: loss per step (control vs MiCS stock vs MiCS fixed) and the fp16 loss scale.

Built on matplotlib's object API with the Agg canvas, so no pyplot global state and no display.
Steps whose loss is null in the record (NaN/inf) are drawn as crosses on the bottom edge of the
plot, so a run that is NaN from step 0 is visible instead of leaving an empty axis.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from repro.core.jobname import short_command
from repro.report.merge import MergedResults
from repro.report.model import Run

DPI = 80
COLORS = {
    ("zero3", "stock"): "#222222",
    ("zero3", "fixed"): "#777777",
    ("mics", "stock"): "#d62728",
    ("mics", "fixed"): "#2ca02c",
    ("mics-hier", "stock"): "#ff7f0e",
    ("mics-hier", "fixed"): "#17becf",
    ("mics-replica", "stock"): "#9467bd",
    ("mics-replica", "fixed"): "#8c564b",
}
# Custom jobs (scenario `custom`) get a colour pair each, dark for stock and light for fixed, so two
# jobs in one plot are told apart (matplotlib's tab20 pairs, minus the suite's own reds and greens).
JOB_COLORS = (
    ("#1f77b4", "#aec7e8"),
    ("#ff7f0e", "#ffbb78"),
    ("#9467bd", "#c5b0d5"),
    ("#8c564b", "#c49c94"),
    ("#e377c2", "#f7b6d2"),
    ("#17becf", "#9edae5"),
    ("#bcbd22", "#dbdb8d"),
)


# The keyword arguments of matplotlib's Axes.plot that draw one kind of series.
class LineStyle(TypedDict, total=False):
    linewidth: float
    alpha: float
    solid_capstyle: str
    linestyle: str
    marker: str
    markersize: float


# Runs that match the control draw exactly on top of it: a wide pale control line, solid stock lines
# and dashed fixed lines keep every series visible where they coincide.
LINE_STYLES: dict[str, LineStyle] = {
    "control": {"linewidth": 6.0, "alpha": 0.3, "solid_capstyle": "round"},
    "stock": {"linewidth": 1.5, "marker": "."},
    "fixed": {"linewidth": 1.5, "linestyle": "--", "marker": "o", "markersize": 3},
}


@dataclass(frozen=True)
class Series:
    run: str  # Run.ident
    label: str
    values: tuple[float | None, ...]
    kind: str = "stock"  # "control" | "stock" | "fixed": decides the line style

    @property
    def null_steps(self) -> tuple[int, ...]:
        return tuple(i for i, v in enumerate(self.values) if v is None)


# A Series in report.json: which run, and the steps whose loss is NaN/inf.
class SeriesData(TypedDict):
    run: str
    label: str
    null_steps: list[int]


# A Plot in report.json (the picture itself is the PNG file).
class PlotData(TypedDict):
    env: str
    slug: str
    title: str
    loss: list[SeriesData]
    loss_scale: list[SeriesData]
    unplotted: list[str]


@dataclass(frozen=True)
class Plot:
    env: str
    slug: str  # file stem, unique in one report
    title: str
    png: bytes
    loss: tuple[Series, ...]
    loss_scale: tuple[Series, ...]
    unplotted: tuple[str, ...]  # runs of the group without any loss (e.g. crashed before step 0)

    def to_dict(self) -> PlotData:
        def series(items: tuple[Series, ...]) -> list[SeriesData]:
            return [{"run": s.run, "label": s.label, "null_steps": list(s.null_steps)} for s in items]

        return {
            "env": self.env,
            "slug": self.slug,
            "title": self.title,
            "loss": series(self.loss),
            "loss_scale": series(self.loss_scale),
            "unplotted": list(self.unplotted),
        }

    @property
    def alt(self) -> str:
        marked = sum(len(s.null_steps) for s in self.loss)
        return f"{self.title}: {len(self.loss)} runs, {marked} NaN/inf steps marked"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def _series_label(run: Run) -> str:
    if run.is_control:
        return f"zero3 control ({run.patch})"
    if run.key.job:  # by its command: a hash says nothing in a legend
        name = short_command(run.job_command or "", LEGEND_WIDTH) or run.key.job
        return f"{name} [{run.key.job[:6]}] {run.patch}"
    return f"{run.scenario} {run.patch}"


LEGEND_WIDTH = 32


def run_colors(runs: Sequence[Run]) -> dict[str, str]:
    """A colour per run: the suite's by scenario and patch, each custom job its own pair."""
    jobs = sorted({r.key.job for r in runs if r.key.job})
    colors = {}
    for r in runs:
        if r.key.job:
            dark, light = JOB_COLORS[jobs.index(r.key.job) % len(JOB_COLORS)]
            colors[r.ident] = light if r.patch == "fixed" else dark
        else:
            colors[r.ident] = COLORS.get((r.scenario, r.patch), "#1f77b4")
    return colors


def _kind(run: Run) -> str:
    return "control" if run.is_control else run.patch


def _group_runs(runs: Sequence[Run]) -> dict[tuple[str, str, int], list[Run]]:
    groups: dict[tuple[str, str, int], list[Run]] = {}
    for run in runs:
        k = run.key
        groups.setdefault((k.dtype, k.transport, k.world_size), []).append(run)
    return groups


def _draw(ax: Axes, series: Sequence[Series], colors: Sequence[str], ylabel: str, log: bool) -> None:
    transform = ax.get_xaxis_transform()  # x in data units, y in axes fraction
    finite = [v for s in series for v in s.values if v is not None]
    for s, color in zip(series, colors):
        steps = list(range(len(s.values)))
        ys = [float("nan") if v is None else v for v in s.values]
        ax.plot(steps, ys, color=color, label=s.label, **LINE_STYLES.get(s.kind, LINE_STYLES["stock"]))
        if s.null_steps:
            ax.scatter(
                list(s.null_steps),
                [0.03] * len(s.null_steps),
                transform=transform,
                marker="x",
                color=color,
                s=36,
                linewidths=1.6,
                clip_on=False,
                zorder=5,
            )
    if log and finite and min(finite) > 0:
        ax.set_yscale("log", base=2)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)


def plot_group(env: str, key: tuple[str, str, int], runs: Sequence[Run]) -> Plot | None:
    dtype, transport, world = key
    runs = sorted(runs, key=lambda r: (not r.is_control, r.scenario, r.patch != "stock"))
    # NaN the job's framework logged as 0.0 is drawn as NaN (the hook saw it: Run.losses_seen).
    loss = tuple(
        Series(r.ident, _series_label(r), tuple(r.losses_seen), _kind(r)) for r in runs if r.losses_seen
    )
    unplotted = tuple(f"{_series_label(r)} ({r.outcome.value})" for r in runs if not r.losses_seen)
    if not loss:
        return None
    scale = tuple(
        Series(r.ident, _series_label(r), tuple(r.loss_scale), _kind(r))
        for r in runs
        if dtype == "fp16" and r.loss_scale
    )
    colors = run_colors(runs)
    shown = f"{transport} transport, " if transport != "native" else ""
    title = f"{env}: {dtype}, {shown}{world} ranks"

    fig = Figure(figsize=(9.0, 5.6 if scale else 3.4), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(2 if scale else 1, 1, sharex=True, squeeze=False)[:, 0]
    _draw(axes[0], loss, [colors[s.run] for s in loss], "loss", log=False)
    axes[0].set_title(title, fontsize=10)
    handles, _ = axes[0].get_legend_handles_labels()
    if any(s.null_steps for s in loss):
        handles.append(
            Line2D([], [], color="#444444", marker="x", linestyle="none", label="NaN/inf loss (null)")
        )
    # Outside the axes: never hides a line, and fixed margins are much cheaper than tight_layout.
    axes[0].legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if scale:
        _draw(axes[1], scale, [colors[s.run] for s in scale], "fp16 loss scale", log=True)
    axes[-1].set_xlabel("step")
    fig.subplots_adjust(
        left=0.09, right=0.72, top=0.9 if not scale else 0.94, bottom=0.14 if not scale else 0.09, hspace=0.08
    )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    slug = _slug(f"{env}-{dtype}-{transport}-w{world}")
    return Plot(
        env=env, slug=slug, title=title, png=buf.getvalue(), loss=loss, loss_scale=scale, unplotted=unplotted
    )


def env_plots(merged: MergedResults, env_id: str) -> list[Plot]:
    groups = _group_runs(merged.runs_of(env_id)).items()
    return [plot for key, runs in groups if (plot := plot_group(env_id, key, runs)) is not None]
