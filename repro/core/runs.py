"""A typed, read-only view of one run record: what the verdict, the summary and the report read.

The record dict (`repro.workload.record.RunRecord`) stays the source of truth and is never
rewritten; this class only names its fields, types them and maps the closed sets to their Enums.
The report's `Run` extends it with where the record was found (its invocation folder).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from repro.core.jobname import job_label
from repro.workload.closed import assert_never
from repro.workload.controls import ControlKey
from repro.workload.record import (
    CONTROL_SCENARIO,
    CUSTOM_SCENARIO,
    MICS_SCENARIOS,
    Outcome,
    Signature,
    Transport,
    custom_job_id,
)


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
    # A custom run's job id (repro.workload.record.custom_job_id); None for the suite's runs.
    job: str | None = None

    def without_patch(self) -> tuple[str, str, str, str, int, int | None, bool, str | None]:
        """What pairs a stock run with its fixed twin. A custom job's two runs are one pair by
        their job id alone: a run that died before DeepSpeed said its dtype or world size (world
        size 0: unknown) is still the same job."""
        if self.job is not None:
            return (self.env, self.scenario, "", "", 0, None, False, self.job)
        return (
            self.env,
            self.scenario,
            self.dtype,
            self.transport,
            self.world_size,
            self.shard_size,
            self.hierarchical,
            None,
        )

    def identity(self) -> tuple[str, tuple[str, str, str, str, int, int | None, bool, str | None]]:
        """The same run in two results folders (the newer one is reported)."""
        return self.patch, self.without_patch()

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
            job=self.job_id,
        )

    @property
    def is_custom(self) -> bool:
        """The user's own command (`make run CMD=...`), judged from its output."""
        return self.record.get("scenario") == CUSTOM_SCENARIO

    @property
    def job_id(self) -> str | None:
        """Which custom job this run belongs to (None for the suite's runs). Records from before
        job ids existed get one from their command and workdir, the same way."""
        if not self.is_custom:
            return None
        job = self.record.get("job") or {}
        given = job.get("job_id")
        if given:
            return str(given)
        return custom_job_id(str(job.get("command") or ""), str(job.get("workdir") or ""))

    @property
    def name(self) -> str:
        """The record's run_name (unique within an env; a custom run's gets its job id, so two jobs
        in one env stay apart); rebuilt the same way for older records."""
        given = self.record.get("run_name")
        if given and self.is_custom:
            return f"{given}@{self.job_id}"
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
    def failed_tests(self) -> dict[str, str] | None:
        """A pytest job's failed tests (id -> pytest's first line for it); None: not a pytest job."""
        session = (self.record.get("job") or {}).get("pytest")
        if not isinstance(session, Mapping):
            return None
        tests = session.get("tests") or {}
        return {
            str(test): str((entry or {}).get("message") or "")
            for test, entry in tests.items()
            if isinstance(entry, Mapping) and entry.get("outcome") in ("failed", "error")
        }

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
    def losses_seen(self) -> list[float | None]:
        """The losses as the run had them: where the job hook saw NaN logged as a number (a
        framework that logs a non-finite loss as 0.0, job.nan_logged_as_zero_from: an index into
        `losses`), those 0.0 values are NaN again (None). What the report draws and counts."""
        losses = self.losses
        job = self.record.get("job")
        start = job.get("nan_logged_as_zero_from") if isinstance(job, dict) else None
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            return losses
        return [None if i >= start and v == 0.0 else v for i, v in enumerate(losses)]

    @property
    def job_command(self) -> str | None:
        """A custom run's command (None for the suite's runs)."""
        job = self.record.get("job")
        command = job.get("command") if isinstance(job, dict) else None
        return str(command) if command else None

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
    "custom": "your command",
}


def run_label(run: RunView) -> str:
    k = run.key
    layout = f"{world_size_text(k.world_size)} ranks" + (f", shard {k.shard_size}" if k.shard_size else "")
    transport = "" if k.transport == Transport.NATIVE.value else f", {k.transport} transport"
    what = SCENARIO_LABELS.get(k.scenario, k.scenario) + (
        f" {job_label(run.job_command or '', k.job)}" if k.job else ""
    )
    return f"{what} ({k.patch}, {k.dtype}{transport}, {layout})"


def world_size_text(size: int | None) -> str:
    """A run that died before it said how many ranks it had (0 or None): unknown, shown as `?`."""
    return str(size) if size else "?"


class RunFinding(str, enum.Enum):
    """What one run says about the bug: the one reading of an outcome that the env verdict and the
    probe's good/bad/unknown share (repro/core/verdict.py, repro/bisect/probe.py)."""

    BUG = "bug"  # shows the IllegalWork bug
    CLEAN = "clean"
    OTHER_FAILURE = "other-failure"  # crashed or hung, not from an IllegalWork
    UNSUPPORTED = "unsupported"  # no MiCS / the fix cannot patch this DeepSpeed
    # env-error or interrupted: nothing ran to an outcome; no-evidence: it ran, but said nothing
    # about the bug (no test ran, no training step, losses that differ without the bug's path)
    NO_OUTCOME = "no-outcome"


def run_finding(outcome: Outcome, signature: Signature) -> RunFinding:
    if outcome is Outcome.REPRODUCED:
        return RunFinding.BUG
    if outcome is Outcome.CRASHED:
        return RunFinding.BUG if signature is Signature.ILLEGAL_WORK_CRASH else RunFinding.OTHER_FAILURE
    if outcome is Outcome.HUNG:
        return RunFinding.OTHER_FAILURE
    if outcome is Outcome.CLEAN:
        return RunFinding.CLEAN
    if outcome is Outcome.UNSUPPORTED:
        return RunFinding.UNSUPPORTED
    if outcome is Outcome.ENV_ERROR or outcome is Outcome.INTERRUPTED or outcome is Outcome.NO_EVIDENCE:
        return RunFinding.NO_OUTCOME
    assert_never(outcome)


def finding_of(outcome: object, signature: object) -> RunFinding | None:
    """`run_finding` of an outcome and a signature read from a file; None where either is a value
    this tool does not know (a foreign or newer record says nothing about the bug)."""
    try:
        return run_finding(Outcome(outcome), Signature(signature))
    except ValueError:
        return None


def shows_bug(run: RunView) -> bool:
    """The run exhibits the reported bug: classify said reproduced, or it died from an IllegalWork."""
    return run_finding(run.outcome, run.signature) is RunFinding.BUG


def parting_words(run: RunView, step: int) -> str:
    """What the run's divergence step was measured against, named only from its record: the
    control it names, the fixed run of the same job, or its own first non-finite loss (a run with
    nothing to compare with, e.g. a stock-only probe)."""
    if run.control_run:
        return f"losses leave the control's ({run.control_run}) at step {step}"
    job = run.record.get("job") or {}
    if run.is_custom and job.get("first_parting_step") == step:
        return f"losses part from the fixed run's at step {step}"
    if next((i for i, v in enumerate(run.losses_seen) if v is None), None) == step:
        return f"non-finite loss from step {step}"
    return f"losses part at step {step} (the record names no run it was compared with)"


def describe(run: RunView) -> str:
    """A sentence of the run's evidence, only from its record."""
    parts = [f"{run_label(run)}: {run.outcome.value}", f"signature {run.signature.value}"]
    if run.illegal_work_messages:
        parts.append(f"{run.illegal_work_messages} IllegalWork messages")
    if run.first_divergent_step is not None:
        parts.append(parting_words(run, run.first_divergent_step))
    if run.skipped_steps:
        parts.append(f"{run.skipped_steps} skipped (overflow) steps")
    nan_steps = sum(1 for v in run.losses_seen if v is None)
    if nan_steps:
        parts.append(f"{nan_steps} NaN/inf loss steps")
    if run.exception_line:
        parts.append(run.exception_line)
    return "; ".join(parts)
