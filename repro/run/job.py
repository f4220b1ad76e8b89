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
import re
import shlex
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from repro.core import console, launchers
from repro.core.diskfull import disk_full_at
from repro.core.errors import UsageError
from repro.core.make_options import checked_pairs
from repro.core.makeline import make_line
from repro.core.results import InvocationDir
from repro.core.verdict import env_verdicts
from repro.engines import jobdeps
from repro.engines.base import Engine, Prepared, SuiteRun
from repro.engines.passthrough import passthrough
from repro.run import job_resume
from repro.run.orchestrate import check_time_limits, env_info
from repro.workload import judge, ladder
from repro.workload.device import RanOn
from repro.workload.diskfull import EXIT_DISK_FULL
from repro.workload.record import (
    CUSTOM_SCENARIO,
    PATCHES,
    LayerRecord,
    PytestBlock,
    RunRecord,
    custom_job_id,
    empty_record,
)

if TYPE_CHECKING:
    from repro.matrix.model import Env
    from repro.workload.fix import FixReport
    from repro.workload.hooksign import EngineFacts, HookRecord
    from repro.workload.job import JobResult
    from repro.workload.pytest_outcomes import PytestSummary

JOB_MODULE = "repro.workload.job"
DIGEST_MAX_FILES = 20000
DIGEST_MAX_BYTES = 1 << 20  # files above this are digested by size only
DIGEST_MAX_S = 120.0  # the walk runs after the job, on a folder the job could fill


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
    deps: jobdeps.JobDeps | None = None  # REQUIREMENTS=/PACKAGES=: a layer over the env
    engine: str | None = None  # ENGINE= as given (the reproduce line repeats it)
    # DEEPSPEED_SRC=: a DeepSpeed checkout pip-installed into a layer over the env instead of its
    # release (repro/bisect/source_overlay.py); the job's packages go into a layer over that one.
    deepspeed_src: Path | None = None
    # The user's environment the job inherits and a reproduce line must repeat (PYTHONPATH, the
    # GPU selection and NCCL settings an engine passes through): name -> value.
    inherited: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.command.strip():
            raise UsageError("CMD= is empty", fix='give the command to run, e.g. CMD="torchrun train.py"')
        bad = [p for p in self.patches if p not in PATCHES]
        if bad or not self.patches:
            raise UsageError(f"unknown patch {', '.join(bad) or '(none)'}", fix=f"use {','.join(PATCHES)}")
        check_time_limits((("TIMEOUT", self.timeout_s), ("STALL_TIMEOUT", self.stall_s)), "1800")
        if not self.workdir.is_dir():
            raise UsageError(
                f"WORKDIR={self.workdir} is not a folder", fix="give the folder the command runs in"
            )
        if self.loss_regex:
            try:
                re.compile(self.loss_regex)
            except re.error as exc:
                raise UsageError(
                    f"LOSS_REGEX= does not compile: {exc}",
                    fix="a Python regex with a group named `loss` (optional `step`)",
                ) from None


def job_args(request: JobRequest, patch: str, device: str) -> list[str]:
    """Arguments of the in-env runner; engines add `--out`."""
    args = ["--cmd", request.command, "--workdir", str(request.workdir.resolve()), "--patch", patch]
    args += ["--device", device, "--transport", request.transport, "--timeout", f"{request.timeout_s:g}"]
    return [*args, "--stall-timeout", f"{request.stall_s:g}"]


def workdir_digest(folder: Path, max_s: float = DIGEST_MAX_S) -> str:
    """sha256 over the folder's file names, sizes and (below 1 MiB) contents: says whether two
    records ran the same code. Version-control and cache folders are left out.

    The folder was writable by the job (in verify-bundle: by someone else's container), so only
    regular files are read (a FIFO would block the read forever, a device never end) and the walk
    has a time limit; a digest cut short says so."""
    h = hashlib.sha256()
    count = 0
    deadline = time.monotonic() + max_s
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(
            d for d in dirs if d not in (".git", "__pycache__", ".venv", "results", ".mypy_cache")
        )
        for name in sorted(files):
            path = Path(root) / name
            try:
                info = path.lstat()
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue  # links, FIFOs, sockets, devices: named by nothing a run needs
            size = info.st_size
            h.update(f"{path.relative_to(folder)}\0{size}\0".encode())
            if size <= DIGEST_MAX_BYTES:
                data = _regular_prefix(path, DIGEST_MAX_BYTES + 1, os.O_NOFOLLOW)  # links not followed
                h.update(b"" if data is None else hashlib.sha256(data).digest())
            count += 1
            if count >= DIGEST_MAX_FILES:
                return "sha256:" + h.hexdigest() + f" (first {DIGEST_MAX_FILES} files)"
            if time.monotonic() > deadline:
                return "sha256:" + h.hexdigest() + f" (first {count} files: time limit of {max_s:g} s)"
    return "sha256:" + h.hexdigest()


def _regular_prefix(path: Path, limit: int, flags: int = 0) -> bytes | None:
    """The first `limit` bytes of a file checked to be regular once opened (non-blocking: it may be
    a FIFO, or have been swapped for one since it was seen); None when it is not, or is unreadable."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | flags), "rb") as fh:
            return fh.read(limit) if stat.S_ISREG(os.fstat(fh.fileno()).st_mode) else None
    except OSError:
        return None


@dataclass(frozen=True)
class RawRun:
    """What the in-env runner left for one patch: job.json and the log text."""

    patch: str
    job: JobResult  # as read: a runner that died may have left only some keys, or none
    log_text: str
    log_rel: str | None


def build_records(
    env_id: str,
    raws: Sequence[RawRun],
    loss_regex: str | None,
    digest: str,
    timeout_s: float | None,
    platform: str | None = None,
) -> list[RunRecord]:
    """Judge every patch's run against the other's and make the records (pure)."""
    parsed = {raw.patch: _parse(raw, loss_regex) for raw in raws}
    stock, fixed = parsed.get("stock"), parsed.get("fixed")
    verdicts: dict[str, ladder.Judgement] = {}
    for raw in sorted(raws, key=lambda r: r.patch != "fixed"):  # the fixed run first: the stock run's control
        other = fixed if raw.patch != "fixed" else None
        verdicts[raw.patch] = _judge_one(raw, parsed[raw.patch], other, verdicts.get("fixed"))
    parting = judge.first_parting_step(stock.losses, fixed.losses) if stock and fixed else None
    engines = {raw.patch: _engine(raw) for raw in raws}
    records = [
        _record(
            env_id,
            raw,
            parsed[raw.patch],
            verdicts[raw.patch],
            engines,
            loss_regex,
            digest,
            timeout_s,
            parting,
            platform,
        )
        for raw in raws
    ]
    zero_from = judge.nan_logged_as_zero(stock.losses, fixed.losses, parting) if stock and fixed else None
    for raw, record in zip(raws, records):
        _say_where_evidence_came_from(record, parsed[raw.patch], zero_from if raw.patch == "stock" else None)
    return records


UNKNOWN_DTYPE = "unknown"


def _fix_in_workdir(job: JobResult) -> str:
    """Where the fix went when the job imports a DeepSpeed of its own folder (a checkout whose
    deepspeed/ shadows the env's): said, so nobody takes it for the env's release."""
    none: FixReport = {}
    fix = next((r["fix"] for r in job.get("hook_reports") or [] if r.get("fix")), none)
    where, workdir = fix.get("package_dir"), job.get("workdir")
    if not where or not workdir:
        return ""
    try:
        inside = Path(str(where)).resolve().relative_to(Path(str(workdir)).resolve())
    except ValueError:
        return ""
    return (
        f"the fix was applied to the DeepSpeed the job imports from its own folder ({inside}/, "
        f"DeepSpeed {fix.get('deepspeed')}), which shadows the env's"
    )


def _pytest_block(session: PytestSummary | None, reports: Sequence[HookRecord]) -> PytestBlock | None:
    """pytest's report as the hook recorded it, and the "devices" the CPU twin gave the session for
    DeepSpeed's test harness (jobhook.pytest_session_started; None: the user's or a launcher's
    LOCAL_SIZE stood)."""
    if session is None:
        return None
    devices = next((r["test_harness_devices"] for r in reports if r.get("test_harness_devices")), None)
    return {
        "exitstatus": session.get("exitstatus"),
        "collected": session.get("collected"),
        "counts": session.get("counts"),
        "ran": session.get("ran"),
        "tests": session.get("tests"),
        "tests_cut": session.get("tests_cut"),
        "collect_errors": session.get("collect_errors"),
        "harness_devices": devices,
    }


def _engine(raw: RawRun) -> EngineFacts:
    """What the hook saw of DeepSpeed's engine in this run (dtype, world size); {} before a step."""
    reports = raw.job.get("hook_reports") or []
    none: EngineFacts = {}
    return next((r["engine"] for r in reports if r.get("engine")), none)


def _shape(raw: RawRun, engines: Mapping[str, EngineFacts]) -> tuple[str, int | None]:
    """The run's dtype and world size as its own engine said them. A run that failed before its first
    step saw neither: its dtype is the one the same command's other run trained with (the job's
    config), its world size the ranks its launcher line asks for (it may have died before it started
    them all, so not the other run's); else "unknown" and None, never a default."""
    own = engines.get(raw.patch) or {}
    others = [e for patch, e in engines.items() if patch != raw.patch and e]
    dtype = own.get("dtype") or next((e["dtype"] for e in others if e.get("dtype")), None)
    world = own.get("world_size")
    if world is None:
        job = raw.job
        asked = launchers.asked_ranks(str(job.get("command") or ""), Path(str(job.get("workdir") or ".")))
        world = asked.ranks if asked is not None and not asked.single_process else None
    return str(dtype or UNKNOWN_DTYPE), (int(world) if world else None)


def _parse(raw: RawRun, loss_regex: str | None) -> judge.Parsed:
    """The log, and the hook's records the runner verified (`hook_signed`: a runner that signs;
    an older one's records count as before)."""
    job = raw.job
    forged = [f for f in job.get("forged_hook_records") or [] if isinstance(f, dict)]
    return judge.with_hook(
        judge.parse(raw.log_text, loss_regex),
        job.get("hook_reports") or [],
        forged=forged,
        signed=job.get("hook_signed") is True,
    )


def job_wrote(job: JobResult) -> str:
    """The verdict's words for files the job left in its results folder ("" when none)."""
    paths = [str(p) for p in job.get("job_wrote") or []]
    return f"the job wrote into the results folder: {', '.join(paths)}" if paths else ""


def _say_where_evidence_came_from(record: RunRecord, parsed: judge.Parsed, zero_from: int | None) -> None:
    """A job's own log may hide the evidence, or hold lines the job printed itself: the reason
    (summary, report) says where the evidence came from and what was not counted."""
    extra = [
        judge.hidden_illegal_work(parsed),
        judge.log_only_illegal_work(parsed),
        judge.forged_records(parsed),
    ]
    if zero_from is not None:
        extra.append(
            f"NaN losses logged as 0.0 from step {zero_from}: the fixed run's losses there are finite "
            "(its framework logs a non-finite loss as 0.0, e.g. HF Trainer's logging_nan_inf_filter)"
        )
    extra = [e for e in extra if e]
    if extra:
        record["reason"] = "; ".join([str(record.get("reason") or ""), *extra])
    job = record.get("job")
    if job is not None:
        job["illegal_work_in_log"] = parsed.illegal_work_in_log
        job["illegal_work_by_hook"] = parsed.illegal_work_by_hook
        job["nan_logged_as_zero_from"] = zero_from
        job["hook_signed"] = parsed.hook_signed
        job["forged_hook_records"] = parsed.forged_hook_records


def _judge_one(
    raw: RawRun, parsed: judge.Parsed, other: judge.Parsed | None, control: ladder.Judgement | None
) -> ladder.Judgement:
    """The run's verdict; `other` and `control` are the fixed run's log and verdict (for the stock run)."""
    reports = raw.job.get("hook_reports") or []
    fix_error = next((r["fix_error"] for r in reports if r.get("fix_error")), None)
    return judge.judge(
        parsed,
        patch=raw.patch,
        exit_code=raw.job.get("exit_code"),
        status=raw.job.get("status"),
        used_deepspeed=imported_deepspeed(reports),
        fix_error=fix_error,
        other=other,
        other_clean=control is not None and control.outcome == "clean",
        device=str(raw.job.get("device") or "gpu"),
        framework_dirs=framework_dirs(reports),
    )


def imported_deepspeed(reports: Sequence[HookRecord]) -> bool:
    """Some hooked process imported DeepSpeed (a pytest session's record may come without it)."""
    return any(r.get("deepspeed") for r in reports)


def framework_dirs(reports: Sequence[HookRecord]) -> tuple[str, ...]:
    """The torch.distributed and DeepSpeed folders the job's hooked processes imported (from the
    hook's verified records): where the bug's exception must be raised to count."""
    found = {str(d) for r in reports for d in (r.get("framework_dirs") or []) if isinstance(d, str) and d}
    return tuple(sorted(found))


def _reason(job: JobResult, judged: str) -> str:
    """The verdict's reason, with what the runner saw beside it: a hang's detail, processes the job
    left running or that survived, files the job wrote into the results folder."""
    reason = judged
    if job.get("status") == "hung" and job.get("hang_detail"):
        reason = f"{job['hang_detail']}; {len(job.get('stacks') or {})} Python stacks recorded"
    stray = job.get("left_running") or {}
    if stray and isinstance(stray, dict):
        reason += (
            f"; {len(stray)} process(es) the job left running after its command ended "
            f"(outside its process group: setsid, a double fork) were stopped: {sorted(stray)}"
        )
    if job.get("survivors"):
        reason += f"; processes still alive after SIGKILL: {job['survivors']}"
    if job_wrote(job):
        reason += f"; {job_wrote(job)}"
    return reason


def _notes(job: JobResult, verdict: ladder.Judgement, engine: EngineFacts, ran_on: RanOn) -> list[str]:
    """The verdict's notes, plus fewer ranks than the launcher asked for, and a dtype not seen."""
    notes = list(verdict.notes)
    fewer = launchers.shortfall(
        launchers.asked_ranks(str(job.get("command") or ""), Path(str(job.get("workdir") or "."))),
        engine.get("world_size") or ran_on.get("processes"),
    )
    if fewer:
        notes.append(fewer)
    shadowing = _fix_in_workdir(job)
    if shadowing:
        notes.append(shadowing)
    if engine.get("dtype") is None:
        notes.append(
            "no DeepSpeed engine step seen in this run: its dtype is the other run's of the same command "
            "(else unknown), its world size the ranks its launcher line asks for (else unknown)"
        )
    return notes


def _record(
    env_id: str,
    raw: RawRun,
    parsed: judge.Parsed,
    verdict: ladder.Judgement,
    engines: Mapping[str, EngineFacts],
    loss_regex: str | None,
    digest: str,
    timeout_s: float | None,
    parting: int | None,
    platform: str | None,
) -> RunRecord:
    job = raw.job
    reports = job.get("hook_reports") or []
    first = reports[0] if reports else {}
    reason = _reason(job, verdict.reason)
    ran_on = job_ran_on(reports, platform)
    notes = _notes(job, verdict, engines[raw.patch], ran_on)
    dtype, world_size = _shape(raw, engines)
    return empty_record(
        env=env_id,
        scenario=CUSTOM_SCENARIO,
        dtype=dtype,
        world_size=world_size,
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
        ran_on=ran_on,
        job={
            "command": job.get("command"),
            "workdir": job.get("workdir"),
            "workdir_digest": digest,
            "job_id": custom_job_id(str(job.get("command") or ""), str(job.get("workdir") or "")),
            "patterns": judge.patterns_used(parsed, loss_regex),
            "notes": notes,
            "exit_code": job.get("exit_code"),
            "survivors": job.get("survivors") or [],
            "left_running": job.get("left_running") or {},  # stopped after the command (leftovers.py)
            "processes": job.get("processes") or {},
            "loss_steps": parsed.loss_steps,
            "deepspeed_imported": imported_deepspeed(reports),
            "rendezvous": job.get("rendezvous"),  # the port the run got (job.py `rendezvous`)
            "hook_pth": job.get("hook_pth"),
            "first_parting_step": parting,
            # pytest's own report of the session (repro/workload/pytest_outcomes.py): counts and
            # each test id's outcome, so stock and fixed compare per test; None: not a pytest job
            "pytest": _pytest_block(parsed.pytest, reports),
            "job_wrote": [str(p) for p in job.get("job_wrote") or []],  # into OUT besides the lab's files
        },
    )


def job_ran_on(reports: Sequence[HookRecord], platform: str | None) -> RanOn:
    """The record's `ran_on` (repro/workload/device.py) of a custom run: what the hook saw in the
    processes that joined a process group (rank 0's view, the devices of all of them). A job none of
    whose processes joined one says so (device null, `joined_group` false): the evidence check
    (repro/core/evidence.py) never counts it for a GPU env."""
    seen = [r["ran_on"] for r in reports if isinstance(r.get("ran_on"), dict)]
    if not seen:
        return {"device": None, "backend": None, "ran": True, "joined_group": False, "env_platform": platform}
    first = next((x for x in seen if x.get("rank") == 0), seen[0])
    devices = sorted({str(x.get("device")) for x in seen})
    return {
        **first,
        # One process on CPU makes the job no GPU evidence: rank 0's view alone could hide it.
        "device": devices[0] if len(devices) == 1 else "cpu",
        "devices": devices,
        "processes": len(seen),
        "joined_group": True,
        "env_platform": platform,
    }


def execute_job(
    request: JobRequest,
    env: Env,
    engine: Engine,
    invocation: InvocationDir,
    say: Callable[[str], None] = console.result,
    resume: bool = False,
) -> list[RunRecord]:
    """Prepare the env once, run the command per patch, record every run. `resume` (RESUME=1):
    finish an earlier, unfinished invocation of this job in `invocation`: only the runs that did
    not finish run again, and both records are rebuilt from every run's files."""
    if request.deps is not None:  # refused at the front door, before anything is built
        jobdeps.check_pins(request.deps, env.package_pins(), env_id=env.id, python=env.python)
    env_dir = invocation.folder / env.id  # made once the env is ready (nothing left if it is not)
    workdir = str(request.workdir.resolve())
    todo = list(request.patches)
    job_resume.check_run_folders(invocation, env.id, request.patches)
    if resume:  # RESUME=1: the runs that finished are kept (repro/run/job_resume.py)
        todo = job_resume.unfinished_patches(env_dir, request.patches, request.command, workdir)
        invocation.forget_runs(env.id)  # rebuilt below from every run's files
        say(f"== {env.id}: resume: running {', '.join(todo) or 'nothing'} again")
    earlier = invocation.data["envs"].get(env.id)
    prepared: Prepared | None = None
    layer = earlier.get("job_layer") if earlier else None
    if todo or earlier is None:  # every run finished before: the env is not prepared again
        prepared, layer = _prepare(request, env, engine, invocation, say)
        invocation.env_dir(env.id)
    device = "cpu" if env.platform.value == "cpu" else "gpu"
    raws: list[RawRun] = []
    digest = workdir_digest(request.workdir.resolve())
    for patch in request.patches:
        out = job_resume.run_folder(env_dir, patch)
        if patch not in todo:
            say(f"== {env.id}: {patch}: finished before, kept")
            raws.append(read_raw(patch, out, invocation.folder, SuiteRun(0, False, 0.0, out, None)))
            continue
        job_resume.clear_unfinished(env_dir, patch)
        assert prepared is not None  # a run to do prepared the env above
        say(f"== {env.id}: {patch}: {request.command}")
        try:
            ran = engine.run_job(
                prepared,
                job_args(request, patch, device),
                out,
                request.workdir.resolve(),
                request.timeout_s + 120,
                network=request.network,
            )
        except KeyboardInterrupt as stop:
            # What finished is recorded (and this run, as interrupted); RESUME=1 runs the rest.
            cut = read_raw(patch, out, invocation.folder, SuiteRun(130, False, 0.0, out, None))
            if not (out / job_resume.JOB_JSON).exists():  # the runner had no time to say how it ended
                cut.job["status"] = "interrupted"
            _record_job(request, env, invocation, [*raws, cut], digest, layer)
            raise invocation.interrupted(stop) from None
        if ran.exit_code == EXIT_DISK_FULL:  # the in-env runner said why on stderr; the run ends here
            raise disk_full_at(f"the {patch} run's files (job.log, job.json)", out / "job.log")
        raws.append(read_raw(patch, out, invocation.folder, ran))
    records = _record_job(request, env, invocation, raws, digest, layer)
    invocation.finish()
    return records


def _prepare(
    request: JobRequest, env: Env, engine: Engine, invocation: InvocationDir, say: Callable[[str], None]
) -> tuple[Prepared, LayerRecord | None]:
    """The env (and the job's layer over it) ready to run the job, and its entry in results.json."""
    engine.preflight(env)
    prepared, layer = engine.prepare(env), None
    if request.deps is not None:
        prepared, layer = engine.prepare_job(env, prepared, request.deps)
    say(f"== {env.id}: {'reused' if prepared.reused else 'ready'} {prepared.label}")
    # `make bundle` packs the image a Docker run used (the venv engine has none).
    image = prepared.handle if engine.kind.value == "docker" else None
    invocation.add_env(
        env.id,
        {
            **env_info(env, engine.kind.value, image, prepared.label),
            "custom_command": request.command,
            "job_layer": layer,  # the job's packages (REQUIREMENTS=/PACKAGES=): lines, layer, added
        },
    )
    return prepared, layer


def _record_job(
    request: JobRequest,
    env: Env,
    invocation: InvocationDir,
    raws: Sequence[RawRun],
    digest: str,
    layer: LayerRecord | None,
) -> list[RunRecord]:
    """Judge the runs against each other and record them (replacing none: the caller forgot any)."""
    records = build_records(env.id, raws, request.loss_regex, digest, request.timeout_s, env.platform.value)
    for record in records:
        job = record.get("job")
        if job is not None:
            job["requirements"] = layer
    invocation.add_runs(env.id, [r.copy() for r in records])
    return records


MAX_LOG_BYTES = 256 << 20  # what the judge reads of a job's log; the file itself is kept whole


def read_raw(patch: str, out: Path, folder: Path, ran: SuiteRun) -> RawRun:
    # job.json is written inside the env (in verify-bundle: by someone else's image), read bounded;
    # none, or one that cannot be read, is what a runner that died leaves: a crash with its exit code.
    job = job_resume.read_job(out)
    if job is None:
        # the keys the judge needs
        job = {"status": "hung" if ran.timed_out else None, "exit_code": ran.exit_code, "hook_reports": []}
    log = out / "job.log"
    text = (_regular_prefix(log, MAX_LOG_BYTES) or b"").decode(errors="replace") if log.exists() else ""
    rel = str(log.relative_to(folder)) if log.exists() else None
    return RawRun(patch, job, text, rel)


def reproduce_line(request: JobRequest) -> str:
    """The line that runs this job again as it ran: `VAR=... make run ENV=... ENGINE=... WORKDIR=...
    REQUIREMENTS=... PACKAGES=... PATCH=... CMD=...`, with the user's environment the job inherited
    before `make` (PYTHONPATH, GPU selection, NCCL settings) and every option that differs from
    its default. Printed by `run`, saved as the invocation's command (summary, report, bundle)."""

    def changed(field: str, text: str) -> str | None:  # the option's text, None when it is the default
        return text if getattr(request, field) != JobRequest.__dataclass_fields__[field].default else None

    # Where and with what first, the command last: the order this line had before the table
    # (repro/core/make_options.py), which saved results keep; checked_pairs checks the names only.
    pairs = checked_pairs(
        [
            ("ENV", request.env_id),
            ("ENGINE", request.engine),
            ("WORKDIR", str(request.workdir.resolve())),
            ("DEEPSPEED_SRC", str(request.deepspeed_src.resolve()) if request.deepspeed_src else None),
            *jobdeps.line_pairs(request.deps),
            ("PATCH", changed("patches", ",".join(request.patches))),
            ("TRANSPORT", changed("transport", request.transport)),
            ("LOSS_REGEX", request.loss_regex),
            ("TIMEOUT", changed("timeout_s", f"{request.timeout_s:g}")),
            ("STALL_TIMEOUT", changed("stall_s", f"{request.stall_s:g}")),
            ("NETWORK", "1" if request.network else None),
            ("CMD", request.command),
        ]
    )
    prefix = " ".join(f"{name}={shlex.quote(value)}" for name, value in request.inherited)
    return f"{prefix} {make_line('run', pairs)}".strip()


def inherited_environment(environ: dict[str, str], platform: str) -> tuple[tuple[str, str], ...]:
    """What of the user's environment reaches the job and so belongs in its reproduce line:
    PYTHONPATH (the venv engine hands it to the job) and the GPU/NCCL variables every engine
    passes through (repro/engines/passthrough.py)."""
    found = dict(passthrough(environ, platform))
    if environ.get("PYTHONPATH"):
        found["PYTHONPATH"] = environ["PYTHONPATH"]
    return tuple(sorted(found.items()))


def describe(request: JobRequest, engine_label: str) -> str:
    return (
        f"custom command in {request.env_id} ({engine_label}), patches {','.join(request.patches)}:\n"
        f"  cd {shlex.quote(str(request.workdir.resolve()))} && {request.command}"
    )


def custom_lines(runs: Sequence[RunRecord]) -> list[str]:
    """What each custom run says, under the summary; the conclusion is the env verdict's pair of
    that job (repro.core.verdict), the same one the headline above it rests on."""
    mine = [r for r in runs if r.get("scenario") == CUSTOM_SCENARIO]
    lines: list[str] = []
    for r in mine:  # each run's notes under its own line
        lines.append(f"{r.get('patch')}: {r.get('outcome')} ({r.get('signature')}): {r.get('reason')}")
        lines += [f"  note: {n}" for n in (r.get("job") or {}).get("notes") or []]
    for verdict in env_verdicts(mine):
        lines += [f"=> {p.status.value}: {p.detail}" for p in verdict.pairs]
    return lines
