"""The env x scenario table: one row per run configuration, stock and fixed side by side."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from repro.core.jobname import job_label
from repro.core.records import as_json
from repro.core.runs import world_size_text
from repro.report.merge import MergedResults
from repro.report.model import SCENARIOS_ORDER, Run

EXCEPTION_CHARS = 120


def cell(run: Run) -> CellData:
    """What one run contributes to the table."""
    exc = run.exception_line
    if exc and len(exc) > EXCEPTION_CHARS:
        exc = exc[: EXCEPTION_CHARS - 1] + "…"
    return {
        "run": run.ident,
        "outcome": run.outcome.value,
        "signature": run.signature.value,
        "illegal_work": run.illegal_work_messages,
        "first_divergent_step": run.first_divergent_step,
        "skipped_steps": run.skipped_steps,
        "nan_steps": sum(1 for v in run.losses_seen if v is None),
        "exception": exc,
    }


# A table cell: what one run contributes (and its form in report.json).
class CellData(TypedDict):
    run: str
    outcome: str
    signature: str
    illegal_work: int
    first_divergent_step: int | None
    skipped_steps: int
    nan_steps: int
    exception: str | None


@dataclass(frozen=True)
class Row:
    env: str
    scenario: str
    dtype: str
    transport: str
    world_size: int | None  # None: no run of the pair said (it died before its first step)
    shard_size: int | None
    hierarchical: bool
    stock: CellData | None
    fixed: CellData | None
    job: str | None = None  # a custom job's id: two jobs of one env are two rows
    job_command: str | None = None  # and its command, which names it for a person

    @property
    def layout(self) -> str:
        shard = f"/{self.shard_size}" if self.shard_size else ""
        return f"{world_size_text(self.world_size)}{shard}" + (" hier" if self.hierarchical else "")

    @property
    def what(self) -> str:
        """The scenario column: a custom job is named by its command (its id settles ties)."""
        return f"{self.scenario} {job_label(self.job_command or '', self.job)}" if self.job else self.scenario

    def to_dict(self) -> RowData:
        return cast(RowData, as_json(self))


# A table Row in report.json.
class RowData(TypedDict):
    env: str
    scenario: str
    job: str | None
    job_command: str | None
    dtype: str
    transport: str
    world_size: int | None
    shard_size: int | None
    hierarchical: bool
    stock: CellData | None
    fixed: CellData | None


def rows(merged: MergedResults) -> list[Row]:
    env_order = list(merged.envs)
    groups: dict[tuple[Any, ...], dict[str, Run]] = {}
    for run in merged.runs:
        groups.setdefault(run.key.without_patch(), {})[run.patch] = run
    out = []
    for sides in groups.values():
        # A custom job's pair is keyed by its job id: its layout and dtype come from the side that
        # said them (a run that died before its first step knows neither).
        known = sorted(sides.values(), key=lambda r: not r.record.get("world_size"))
        k = known[0].key
        out.append(
            Row(
                env=k.env,
                scenario=k.scenario,
                dtype=k.dtype,
                transport=k.transport,
                world_size=k.world_size or None,
                shard_size=k.shard_size,
                hierarchical=k.hierarchical,
                stock=cell(sides["stock"]) if "stock" in sides else None,
                fixed=cell(sides["fixed"]) if "fixed" in sides else None,
                job=k.job,
                job_command=known[0].job_command,
            )
        )
    out.sort(
        key=lambda r: (
            env_order.index(r.env) if r.env in env_order else len(env_order),
            SCENARIOS_ORDER.index(r.scenario) if r.scenario in SCENARIOS_ORDER else len(SCENARIOS_ORDER),
            r.dtype,
            r.transport,
            r.world_size or 0,
            r.job or "",
        )
    )
    return out


def _side(data: CellData | None, name: str) -> str:
    value = None if data is None else data.get(name)
    return "–" if value is None else str(value)


COLUMNS: Sequence[tuple[str, str]] = (
    ("outcome", "outcome"),
    ("signature", "signature"),
    ("illegal_work", "IllegalWork msgs"),
    ("first_divergent_step", "first divergent step"),
    ("skipped_steps", "skipped steps"),
    ("nan_steps", "NaN steps"),
    ("exception", "exception"),
)


def row_values(row: Row) -> list[str]:
    """Display values of the comparison columns, 'stock → fixed', one value when both sides agree."""
    pairs = [(_side(row.stock, name), _side(row.fixed, name)) for name, _ in COLUMNS]
    return [stock if stock == fixed else f"{stock} → {fixed}" for stock, fixed in pairs]
