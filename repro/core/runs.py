"""A typed, read-only view of one run record: what the verdict, the summary and the report read.

The record dict (`repro.workload.record.RunRecord`) stays the source of truth and is never
rewritten; this class only names its fields, types them and maps the closed sets to their Enums.
The report's `Run` extends it with where the record was found (its invocation folder).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from repro.workload.controls import ControlKey
from repro.workload.record import CONTROL_SCENARIO, MICS_SCENARIOS, Outcome, Signature, Transport


@dataclass(frozen=True)
class RunKey:
    """Identifies a run within a merged result set; `patch` aside, it pairs stock with fixed."""

    env: str
    scenario: str
    patch: str
    dtype: str
    transport: str
    world_size: int
    shard_size: int | None
    hierarchical: bool

    def without_patch(self) -> tuple[str, str, str, str, int, int | None, bool]:
        return (
            self.env,
            self.scenario,
            self.dtype,
            self.transport,
            self.world_size,
            self.shard_size,
            self.hierarchical,
        )

    @property
    def control_key(self) -> ControlKey:
        return ControlKey(self.dtype, self.transport, self.world_size, self.patch)


@dataclass(frozen=True)
class RunView:
    # Mapping, not RunRecord: records of older tools and hand-made test records are views too.
    record: Mapping[str, Any] = field(repr=False)

    # -- identity -------------------------------------------------------------------------
    @property
    def key(self) -> RunKey:
        r = self.record
        return RunKey(
            env=str(r["env"]),
            scenario=str(r["scenario"]),
            patch=str(r["patch"]),
            dtype=str(r["dtype"]),
            transport=str(r.get("transport") or Transport.NATIVE.value),
            world_size=int(r.get("world_size") or 0),
            shard_size=None if r.get("shard_size") is None else int(r["shard_size"]),
            hierarchical=bool(r.get("hierarchical")),
        )

    @property
    def name(self) -> str:
        """The record's run_name (unique within an env); rebuilt the same way for older records."""
        given = self.record.get("run_name")
        if given:
            return str(given)
        k = self.key
        return f"{k.scenario}-{k.patch}-{k.dtype}-{k.transport}-w{k.world_size}"

    @property
    def ident(self) -> str:
        return f"{self.env}/{self.name}"

    @property
    def env(self) -> str:
        return self.key.env

    @property
    def scenario(self) -> str:
        return self.key.scenario

    @property
    def patch(self) -> str:
        return self.key.patch

    @property
    def is_sync_control(self) -> bool:
        """Sync transport completes every collective at once: a cause control, not a reproduction try."""
        return self.key.transport == Transport.SYNC.value

    @property
    def control_run(self) -> str | None:
        value = self.record.get("control_run")
        return str(value) if value else None

    @property
    def is_mics(self) -> bool:
        return self.scenario in MICS_SCENARIOS

    @property
    def is_control(self) -> bool:
        return self.scenario == CONTROL_SCENARIO

    # -- evidence -------------------------------------------------------------------------
    @property
    def outcome(self) -> Outcome:
        return Outcome(self.record["outcome"])

    @property
    def signature(self) -> Signature:
        return Signature(self.record["signature"])

    @property
    def reason(self) -> str:
        return str(self.record.get("reason") or "")

    @property
    def losses(self) -> list[float | None]:
        return [None if v is None else float(v) for v in (self.record.get("losses") or [])]

    @property
    def loss_scale(self) -> list[float | None]:
        return [None if v is None else float(v) for v in (self.record.get("loss_scale") or [])]

    @property
    def illegal_work_messages(self) -> int:
        return int(self.record.get("illegal_work_messages") or 0)

    @property
    def skipped_steps(self) -> int:
        return int(self.record.get("skipped_steps") or 0)

    @property
    def first_divergent_step(self) -> int | None:
        value = self.record.get("first_divergent_step")
        return None if value is None else int(value)

    @property
    def weights_checksum(self) -> str | None:
        value = self.record.get("weights_checksum")
        return None if value is None else str(value)

    @property
    def exception(self) -> Mapping[str, Any] | None:
        exc = self.record.get("exception")
        return exc if isinstance(exc, Mapping) else None

    @property
    def exception_line(self) -> str | None:
        exc = self.exception
        if exc is None:
            return None
        message = str(exc.get("message") or "").strip().splitlines()
        head = f"{exc.get('type') or 'Exception'}: {message[0] if message else ''}".rstrip(": ")
        rank = exc.get("rank")
        return head if rank is None else f"{head} (rank {rank})"

    @property
    def stacks(self) -> Mapping[str, str]:
        stacks = self.record.get("stacks") or {}
        return {str(k): str(v) for k, v in stacks.items()}

    @property
    def versions(self) -> Mapping[str, Any]:
        return dict(self.record.get("versions") or {})


SCENARIO_LABELS = {
    "zero3": "ZeRO-3 (control)",
    "mics": "MiCS flat gather",
    "mics-hier": "MiCS hierarchical gather",
    "mics-replica": "MiCS with replica groups",
}


def run_label(run: RunView) -> str:
    k = run.key
    layout = f"{k.world_size} ranks" + (f", shard {k.shard_size}" if k.shard_size else "")
    transport = "" if k.transport == Transport.NATIVE.value else f", {k.transport} transport"
    return f"{SCENARIO_LABELS.get(k.scenario, k.scenario)} ({k.patch}, {k.dtype}{transport}, {layout})"


def shows_bug(run: RunView) -> bool:
    """The run exhibits the reported bug: classify said reproduced, or it died from an IllegalWork."""
    if run.outcome is Outcome.REPRODUCED:
        return True
    return run.outcome is Outcome.CRASHED and run.signature is Signature.ILLEGAL_WORK_CRASH


def describe(run: RunView) -> str:
    """A sentence of the run's evidence, only from its record."""
    parts = [f"{run_label(run)}: {run.outcome.value}", f"signature {run.signature.value}"]
    if run.illegal_work_messages:
        parts.append(f"{run.illegal_work_messages} IllegalWork messages")
    if run.first_divergent_step is not None:
        parts.append(f"losses leave the control's at step {run.first_divergent_step}")
    if run.skipped_steps:
        parts.append(f"{run.skipped_steps} skipped (overflow) steps")
    nan_steps = sum(1 for v in run.losses if v is None)
    if nan_steps:
        parts.append(f"{nan_steps} NaN/inf loss steps")
    if run.exception_line:
        parts.append(run.exception_line)
    return "; ".join(parts)
