"""A user's own command in an env, stock and fixed: plan, run, judge, record.

`python -m repro run --env cpu --cmd "torchrun ... train.py"` runs the command once per patch
through the engine's `run_job` (the in-env runner is repro/workload/job.py; the interpreter-start
hook does the patching), judges each run from its own output (repro/workload/judge.py; the stock
and fixed runs are each other's control) and writes one record per run, scenario "custom", into
OUT/results.json, so the summary and `make report` show them like the suite's.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from repro.core.errors import UsageError
from repro.core.results import InvocationDir
from repro.engines.base import Prepared, SuiteRun
from repro.workload import judge
from repro.workload.record import CUSTOM_SCENARIO, PATCHES, RunRecord, empty_record, read_json

if TYPE_CHECKING:
    from repro.matrix.model import Env

JOB_MODULE = "repro.workload.job"
DIGEST_MAX_FILES = 20000
DIGEST_MAX_BYTES = 1 << 20  # files above this are digested by size only


class JobEngine(Protocol):
    """The engines that can run a custom command (VenvEngine, DockerEngine)."""

    def run_job(
        self,
        prepared: Prepared,
        args: Sequence[str],
        out_dir: Path,
        workdir: Path,
        timeout_s: float | None,
        *,
        network: bool = False,
    ) -> SuiteRun: ...


@dataclass(frozen=True)
class JobRequest:
    env_id: str
    command: str
    patches: tuple[str, ...] = ("stock", "fixed")
    workdir: Path = Path(".")
    transport: str = "async"
    loss_regex: str | None = None
    timeout_s: float = 1800.0
    stall_s: float = 300.0
    network: bool = False  # Docker engine: the container gets a network only when asked (NETWORK=1)

    def __post_init__(self) -> None:
        if not self.command.strip():
            raise UsageError("CMD= is empty", fix='give the command to run, e.g. CMD="torchrun train.py"')
        bad = [p for p in self.patches if p not in PATCHES]
        if bad or not self.patches:
            raise UsageError(f"unknown patch {', '.join(bad) or '(none)'}", fix=f"use {','.join(PATCHES)}")
        if not self.workdir.is_dir():
            raise UsageError(
                f"WORKDIR={self.workdir} is not a folder", fix="give the folder the command runs in"
            )
        if self.loss_regex:
            import re

            try:
                re.compile(self.loss_regex)
            except re.error as exc:
                raise UsageError(
                    f"LOSS_REGEX= does not compile: {exc}",
                    fix="a Python regex with a group named `loss` (optional `step`)",
                ) from None


def job_args(request: JobRequest, patch: str, device: str) -> list[str]:
    """Arguments of the in-env runner; engines add `--out`."""
    return [
        "--cmd",
        request.command,
        "--workdir",
        str(request.workdir.resolve()),
        "--patch",
        patch,
        "--device",
        device,
        "--transport",
        request.transport,
        "--timeout",
        f"{request.timeout_s:g}",
        "--stall-timeout",
        f"{request.stall_s:g}",
    ]


def workdir_digest(folder: Path) -> str:
    """sha256 over the folder's file names, sizes and (below 1 MiB) contents: says whether two
    records ran the same code. Version-control and cache folders are left out."""
    h = hashlib.sha256()
    count = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(
            d for d in dirs if d not in (".git", "__pycache__", ".venv", "results", ".mypy_cache")
        )
        for name in sorted(files):
            path = Path(root) / name
            try:
                size = path.stat().st_size
            except OSError:
                continue
            h.update(f"{path.relative_to(folder)}\0{size}\0".encode())
            if size <= DIGEST_MAX_BYTES:
                try:
                    h.update(hashlib.sha256(path.read_bytes()).digest())
                except OSError:
                    pass
            count += 1
            if count >= DIGEST_MAX_FILES:
                return "sha256:" + h.hexdigest() + f" (first {DIGEST_MAX_FILES} files)"
    return "sha256:" + h.hexdigest()


@dataclass(frozen=True)
class RawRun:
    """What the in-env runner left for one patch: job.json and the log text."""

    patch: str
    job: dict[str, Any]
    log_text: str
    log_rel: str | None


def build_records(
    env_id: str, raws: Sequence[RawRun], loss_regex: str | None, digest: str, timeout_s: float | None
) -> list[RunRecord]:
    """Judge every patch's run against the other's and make the records (pure)."""
    parsed = {
        raw.patch: judge.with_hook(judge.parse(raw.log_text, loss_regex), raw.job.get("hook_reports") or [])
        for raw in raws
    }
    fixed_raw = next((r for r in raws if r.patch == "fixed"), None)
    fixed_clean = False
    verdicts: dict[str, judge.Judgement] = {}
    if fixed_raw is not None:  # the fixed run first: it is the stock run's control
        verdicts["fixed"] = _judge_one(fixed_raw, parsed["fixed"], None, False)
        fixed_clean = verdicts["fixed"].outcome == "clean"
    for raw in raws:
        if raw.patch != "fixed":
            verdicts[raw.patch] = _judge_one(raw, parsed[raw.patch], parsed.get("fixed"), fixed_clean)
    stock, fixed = parsed.get("stock"), parsed.get("fixed")
    parting = (
        judge.first_parting_step(stock.losses, fixed.losses)
        if stock is not None and fixed is not None
        else None
    )
    return [
        _record(env_id, raw, parsed[raw.patch], verdicts[raw.patch], loss_regex, digest, timeout_s, parting)
        for raw in raws
    ]


def _judge_one(
    raw: RawRun, parsed: judge.Parsed, other: judge.Parsed | None, other_clean: bool
) -> judge.Judgement:
    reports = raw.job.get("hook_reports") or []
    fix_error = next((r["fix_error"] for r in reports if r.get("fix_error")), None)
    return judge.judge(
        parsed,
        patch=raw.patch,
        exit_code=raw.job.get("exit_code"),
        status=raw.job.get("status"),
        used_deepspeed=bool(reports),
        fix_error=fix_error,
        other=other,
        other_clean=other_clean,
    )


def _record(
    env_id: str,
    raw: RawRun,
    parsed: judge.Parsed,
    verdict: judge.Judgement,
    loss_regex: str | None,
    digest: str,
    timeout_s: float | None,
    parting: int | None,
) -> RunRecord:
    job = raw.job
    reports = job.get("hook_reports") or []
    first = reports[0] if reports else {}
    reason = verdict.reason
    if job.get("status") == "hung" and job.get("hang_detail"):
        reason = f"{job['hang_detail']}; {len(job.get('stacks') or {})} Python stacks recorded"
    if job.get("survivors"):
        reason += f"; processes still alive after SIGKILL: {job['survivors']}"
    engine: dict[str, Any] = next((r["engine"] for r in reports if r.get("engine")), {})
    notes = list(verdict.notes)
    dtype = engine.get("dtype")
    if dtype is None:  # the report needs one; say it was not seen
        dtype = "fp32"
        notes.append("no DeepSpeed engine step seen: dtype recorded as fp32 by default")
    record = empty_record(
        env=env_id,
        scenario=CUSTOM_SCENARIO,
        dtype=dtype,
        world_size=engine.get("world_size"),
        patch=raw.patch,
        run_name=f"{CUSTOM_SCENARIO}-{raw.patch}",
        transport=job.get("transport"),
        outcome=verdict.outcome,
        signature=verdict.signature,
        reason=reason,
        losses=parsed.losses,
        loss_scale=parsed.loss_scale or None,
        skipped_steps=parsed.skipped_steps,
        illegal_work_messages=parsed.illegal_work_messages,
        first_divergent_step=verdict.first_divergent_step
        if verdict.first_divergent_step is not None
        else (parting if raw.patch == "stock" else None),
        exception=parsed.exception,
        exit_codes={"launcher": job.get("exit_code")},
        durations={"total_s": job.get("wall_s"), "train_s": None},
        versions=job.get("versions") or {},
        stacks=job.get("stacks") or {},
        logs={"job": raw.log_rel} if raw.log_rel else {},
        timeout_s=timeout_s,
        fix=first.get("fix") if raw.patch == "fixed" else None,
        transport_info=first.get("transport_info") or {},
        job={
            "command": job.get("command"),
            "workdir": job.get("workdir"),
            "workdir_digest": digest,
            "patterns": judge.patterns_used(parsed, loss_regex),
            "notes": notes,
            "exit_code": job.get("exit_code"),
            "survivors": job.get("survivors") or [],
            "processes": job.get("processes") or {},
            "loss_steps": parsed.loss_steps,
            "deepspeed_imported": bool(reports),
            "first_parting_step": parting,
        },
    )
    return record  # type: ignore[return-value]


def execute_job(
    request: JobRequest, env: Env, engine: Any, invocation: InvocationDir, say: Callable[[str], None] = print
) -> list[RunRecord]:
    """Prepare the env once, run the command per patch, record every run."""
    if not hasattr(engine, "run_job"):
        raise UsageError(f"the {engine.kind.value} engine cannot run custom commands", fix="use ENGINE=venv")
    engine.preflight(env)
    prepared = engine.prepare(env)
    say(f"== {env.id}: {'reused' if prepared.reused else 'ready'} {prepared.label}")
    device = "cpu" if env.platform.value == "cpu" else "gpu"
    env_dir = invocation.env_dir(env.id)
    raws: list[RawRun] = []
    invocation.add_env(
        env.id,
        {
            "platform": env.platform.value,
            "engine": engine.kind.value,
            "pins": env.pins(),
            "derived_from": env.derived_from,
            # `make bundle` packs the image a Docker run used (the venv engine has none).
            "image_id": prepared.handle if engine.kind.value == "docker" else None,
            "venv": prepared.label,
            "artifacts": {},
            "suite_exit_code": None,
            "suite_timed_out": False,
            "interrupted": False,
            "custom_command": request.command,
        },
    )
    digest = workdir_digest(request.workdir.resolve())
    for patch in request.patches:
        out = env_dir / f"custom-{patch}"
        say(f"== {env.id}: {patch}: {request.command}")
        ran = engine.run_job(
            prepared,
            job_args(request, patch, device),
            out,
            request.workdir.resolve(),
            request.timeout_s + 120,
            network=request.network,
        )
        raws.append(read_raw(patch, out, invocation.folder, ran))
    records = build_records(env.id, raws, request.loss_regex, digest, request.timeout_s)
    invocation.add_runs(env.id, [dict(r) for r in records])  # type: ignore[misc]
    invocation.finish()
    return records


def read_raw(patch: str, out: Path, folder: Path, ran: SuiteRun) -> RawRun:
    job_file = out / "job.json"
    if job_file.exists():
        job: dict[str, Any] = read_json(str(job_file))
    else:  # the runner itself died (or the engine could not start it): a crash with its exit code
        job = {"status": "hung" if ran.timed_out else None, "exit_code": ran.exit_code, "hook_reports": []}
    log = out / "job.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    rel = str(log.relative_to(folder)) if log.exists() else None
    return RawRun(patch, job, text, rel)


def describe(request: JobRequest, engine_label: str) -> str:
    return (
        f"custom command in {request.env_id} ({engine_label}), patches {','.join(request.patches)}:\n"
        f"  cd {shlex.quote(str(request.workdir.resolve()))} && {request.command}"
    )


def custom_lines(runs: Sequence[RunRecord]) -> list[str]:
    """What the custom runs say, under the summary (the env verdict knows only our scenarios)."""
    by_patch = {r.get("patch"): r for r in runs if r.get("scenario") == CUSTOM_SCENARIO}
    lines = [
        f"{patch}: {r.get('outcome')} ({r.get('signature')}): {r.get('reason')}"
        for patch, r in by_patch.items()
    ]
    for r in by_patch.values():
        lines += [f"  note: {n}" for n in (r.get("job") or {}).get("notes") or []]
    stock, fixed = by_patch.get("stock"), by_patch.get("fixed")
    if stock and fixed:
        s, f = stock.get("outcome"), fixed.get("outcome")
        if s == "reproduced" and f == "clean":
            lines.append("=> stock shows the bug and the fix makes this command clean")
        elif f != "clean":
            lines.append(f"=> the fixed run is not clean ({f}): the fix does not make this command clean")
        else:
            lines.append(f"=> stock {s}, fixed clean: this command does not show the bug as stock")
    return lines
