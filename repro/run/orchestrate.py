"""Plan as data, then execute: a request becomes a list of frozen steps; execution walks it.

`plan()` is pure (unit-tested from a small matrix); `execute()` is the only place that calls
engines, and records every env's runs in the invocation's results folder as soon as they exist.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.core import console, records, shapes
from repro.core.errors import ConfigError, UsageError
from repro.core.results import EnvInfo, InvocationDir
from repro.core.smallfile import FileTooLarge, NotRegularFile, read_regular
from repro.engines.preflight import check_world_size
from repro.workload.ds_config import type_problems
from repro.workload.record import (
    CPU_TRANSPORTS,
    DTYPES,
    PATCHES,
    SCENARIOS,
    Outcome,
    RunRecord,
)
from repro.workload.suite import LAUNCHERS, SuiteMeta, needs_sync_proof, planned_keys

if TYPE_CHECKING:
    from repro.engines.base import Engine, Prepared
    from repro.matrix.model import Env, Matrix


@dataclass(frozen=True)
class Request:
    """What the user asked for, already parsed from make variables / CLI flags."""

    env_ids: tuple[str, ...]
    torch: str | None = None
    deepspeed: str | None = None
    scenarios: tuple[str, ...] = SCENARIOS
    patches: tuple[str, ...] = PATCHES
    dtype: str | None = None
    transports: tuple[str, ...] = ("async",)
    config_path: str | None = None
    steps: int | None = None
    world_size: int | None = None
    timeout_s: float | None = None
    stall_s: float | None = None
    sync_proof: bool = True
    jobs: int | None = None
    # how ranks start inside the env (repro/workload/suite.py): prefork (CPU default), torchrun
    launcher: str | None = None

    def __post_init__(self) -> None:
        for name, values, allowed in (
            ("SCENARIOS", self.scenarios, SCENARIOS),
            ("PATCH", self.patches, PATCHES),
            ("TRANSPORT", self.transports, CPU_TRANSPORTS),
        ):
            bad = [v for v in values if v not in allowed]
            if bad or not values:
                raise UsageError(
                    f"{name}={','.join(values)} is not valid",
                    fix=f"use a comma-separated subset of: {', '.join(allowed)}",
                )
        repeated = sorted({e for e in self.env_ids if self.env_ids.count(e) > 1})
        if repeated:
            raise UsageError(
                f"ENV={','.join(self.env_ids)} names {', '.join(repeated)} more than once",
                why="each env runs once per invocation, into its own folder",
                fix="name each env once",
            )
        if self.launcher is not None and self.launcher not in LAUNCHERS:
            raise UsageError(
                f"LAUNCHER={self.launcher} is not valid", fix=f"use one of: {', '.join(LAUNCHERS)}"
            )
        if self.dtype is not None and self.dtype not in DTYPES:
            raise UsageError(f"DTYPE={self.dtype} is not valid", fix=f"use one of: {', '.join(DTYPES)}")
        _check_numbers(self)


def _check_numbers(request: Request) -> None:
    """Numbers are checked here, before any build: the suite would only reject them (or, for
    TIMEOUT=nan, silently run with no time limit) after a possibly multi-GB install."""
    for name, value in (("STEPS", request.steps), ("JOBS", request.jobs)):
        if value is not None and value < 1:
            raise UsageError(f"{name}={value} is not valid", fix=f"use a whole number >= 1 for {name}")
    size = request.world_size
    # The suite's own rule: 1 runs the control only (MiCS needs 2 ranks and is unsupported there).
    if size is not None and (size < 1 or (size > 1 and size % 2)):
        raise UsageError(
            f"WORLD_SIZE={size} is not valid",
            why="the MiCS scenarios split the ranks in halves",
            fix="use 1 (the control only) or an even number >= 2 (2, 4, 6, ...)",
        )
    check_time_limits((("TIMEOUT", request.timeout_s), ("STALL_TIMEOUT", request.stall_s)), "600")


def check_time_limits(limits: Sequence[tuple[str, float | None]], example: str) -> None:
    """TIMEOUT=/STALL_TIMEOUT= of `repro` and `run` alike (None: not given): nan would mean no limit."""
    for name, seconds in limits:
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
            raise UsageError(
                f"{name}={seconds} is not valid",
                why="a time limit must be a finite number",
                fix=f"use a number of seconds > 0 and finite for {name} (e.g. {example})",
            )


@dataclass(frozen=True)
class Step:
    """One env to prepare and run: the unit `execute` walks."""

    env: Env
    suite_args: tuple[str, ...]
    # Time the whole suite may take inside the engine: the sum of the per-run limits + slack.
    timeout_s: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)


# The engine's overall limit only guards against a stuck engine (per-run hangs are caught inside
# the suite): the sum of the per-run limits of the runs the suite will plan, plus this slack.
_ENGINE_SLACK_S = 600.0


def planned_runs(request: Request) -> int:
    """How many runs the suite plans for `request`: the same rule as repro.workload.suite.plan
    (a control per transport, each MiCS scenario x patch per transport, the sync proof), which a
    test keeps in step. An upper bound on GPUs, where the suite runs the native transport only."""
    mics = [s for s in request.scenarios if s != "zero3"]
    runs = len(request.transports) * (1 + len(mics) * len(request.patches))
    if request.sync_proof and "mics" in request.scenarios and needs_sync_proof(request.transports):
        runs += 1
    return runs


# A DeepSpeed config is a few KB; it travels to the suite as one command-line argument, which
# Linux caps at 128 KiB (MAX_ARG_STRLEN).
MAX_CONFIG_BYTES = 64 << 10


def load_user_config(path: str | None) -> dict[str, Any] | None:
    """CONFIG=: the user's DeepSpeed config (free-form: DeepSpeed's own keys), checked to be one."""
    if path is None:
        return None
    fix = "pass the path of a DeepSpeed config JSON"
    try:
        data = json.loads(read_regular(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except (NotRegularFile, FileTooLarge) as exc:
        why = f"{exc}; a config is a regular JSON file of at most {MAX_CONFIG_BYTES >> 10} KiB"
        raise ConfigError(f"CONFIG={path} is not a DeepSpeed config file", why=why, fix=fix) from None
    except OSError as exc:
        raise ConfigError(f"cannot read CONFIG={path}", why=str(exc), fix=fix) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"CONFIG={path} is not valid JSON",
            why=f"line {exc.lineno} column {exc.colno}: {exc.msg}",
            fix="fix the JSON (DeepSpeed configs are plain JSON, no comments)",
        ) from None
    except (UnicodeDecodeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else f"not UTF-8 text ({exc.reason})"
        raise ConfigError(f"CONFIG={path} is not valid JSON", why=why, fix=fix) from None
    if not isinstance(data, dict) or not isinstance(data.get("zero_optimization", {}), dict):
        raise ConfigError(
            f"CONFIG={path} is not a DeepSpeed config object",
            fix="pass a JSON object like repro/configs/reporter_ds_config.json",
        )
    problems = type_problems(data)
    if problems:
        raise ConfigError(
            f"CONFIG={path} has values of the wrong type",
            why="; ".join(problems),
            fix="compare with repro/configs/reporter_ds_config.json (DeepSpeed's config reference)",
        )
    return data


def suite_args(
    request: Request,
    env_id: str,
    user_config: dict[str, Any] | None,  # the user's DeepSpeed config: free-form
    platform: str = "cpu",
) -> tuple[str, ...]:
    """The suite's command line. `--device` is the env's platform: a cpu env runs on CPU also on a
    GPU host, a rocm/cuda env only on GPUs of its kind (else every run ends env-error), never a
    silent fallback. Without DTYPE= the suite picks the precision (fp16, the reporter's, on GPUs)."""
    args = ["--env", env_id, "--device", platform]
    for flag, values in (
        ("--scenarios", request.scenarios),
        ("--patches", request.patches),
        ("--transports", request.transports),
    ):
        args += [flag, ",".join(values)]
    if request.dtype:
        args += ["--dtype", request.dtype]
    if user_config is not None:
        args += ["--config-json", json.dumps(user_config, separators=(",", ":"))]
    for flag, value in (
        ("--steps", request.steps),
        ("--world-size", request.world_size),
        ("--timeout", request.timeout_s),
        ("--stall-timeout", request.stall_s),
        ("--jobs", request.jobs),
        ("--launcher", request.launcher),
    ):
        if value is not None:
            args += [flag, str(value)]
    if not request.sync_proof:
        args.append("--no-sync-proof")
    return tuple(args)


def plan(matrix: Matrix, request: Request) -> list[Step]:
    """Pure: the steps this request makes. Unknown envs / bad overrides raise before any work."""
    user_config = load_user_config(request.config_path)
    steps = []
    per_run = request.timeout_s or 600.0
    for env_id in request.env_ids:
        if request.torch or request.deepspeed:
            env = matrix.derive(env_id, torch=request.torch, deepspeed=request.deepspeed)
        else:
            env = matrix.get(env_id)
        steps.append(
            Step(
                env=env,
                suite_args=suite_args(request, env.id, user_config, env.platform.value),
                timeout_s=per_run * planned_runs(request) + _ENGINE_SLACK_S,
            )
        )
    return steps


def describe(steps: Sequence[Step], engine_label: str) -> str:
    """The preamble: what is about to happen, with the resolved pins."""
    lines = [f"engine: {engine_label}"]
    for step in steps:
        env = step.env
        pins = ", ".join(f"{k}={v}" for k, v in env.pins().items())
        derived = f", derived from {env.derived_from}" if env.derived_from else ""
        lines.append(f"env {env.id} ({env.platform.value}{derived}): {pins}")
        if env.python_choice is not None:
            lines.append(f"  {env.id}: {env.python_choice.describe()}")
    return "\n".join(lines)


def _world_size(suite_args: Sequence[str]) -> int | None:
    args = list(suite_args)
    return int(args[args.index("--world-size") + 1]) if "--world-size" in args else None


def execute(
    steps: Sequence[Step],
    engine: Engine,
    invocation: InvocationDir,
    say: Callable[[str], None] = console.result,
) -> list[RunRecord]:
    """Prepare and run every step; record each env's runs as soon as its suite ends."""
    for step in steps:
        engine.preflight(step.env)
        # WORLD_SIZE= above the GPUs this host shows the env is refused before any build (exit 45).
        check_world_size(step.env, _world_size(step.suite_args))
    for n, step in enumerate(steps, 1):
        env = step.env
        say(f"== [{n}/{len(steps)}] {env.id}: preparing ({engine.kind.value}) ...")
        started = time.monotonic()
        try:
            prepared = engine.prepare(env)
            say(
                f"== {env.id}: {'reused' if prepared.reused else 'ready'} {prepared.label} "
                f"({time.monotonic() - started:.0f} s)"
            )
            out = invocation.env_dir(env.id)
            # Shown only on a live display: in plain lines the suite's own output is the progress.
            with console.task(f"{env.id}: running the suite (results: {out})", plain=False):
                suite = engine.run_suite(prepared, step.suite_args, out, step.timeout_s)
        except KeyboardInterrupt as stop:
            _collect(invocation, env, None, invocation.env_dir(env.id), engine.kind.value)
            raise invocation.interrupted(stop) from None
        _collect(invocation, env, prepared, out, engine.kind.value, suite.exit_code, suite.timed_out)
    invocation.finish()
    return invocation.runs


def env_info(env: Env, engine: str, image_id: str | None, venv: str | None) -> EnvInfo:
    """An env's entry in results.json before its runs ended: what it is and what they ran in."""
    return {
        "platform": env.platform.value,
        "engine": engine,
        "pins": env.pins(),
        "derived_from": env.derived_from,
        "image_id": image_id,
        "venv": venv,
        "artifacts": {},
        "suite_exit_code": None,
        "suite_timed_out": False,
        "interrupted": False,
    }


# An env's suite.json, as repro/workload/suite.py writes it: its meta and its runs.
class SuiteFile(SuiteMeta, total=False):
    runs: list[RunRecord]


def _collect(
    invocation: InvocationDir,
    env: Env,
    prepared: Prepared | None,
    out: Path,
    engine: str,
    exit_code: int | None = None,
    timed_out: bool = False,
) -> None:
    suite_file = out / "suite.json"
    suite: SuiteFile = (
        records.load(suite_file, shapes.SUITE, "suite file") if suite_file.exists() else {"runs": []}
    )
    docker = engine == "docker"
    info = env_info(
        env,
        engine,
        prepared.details.get("image_id", prepared.handle) if prepared is not None and docker else None,
        prepared.label if prepared is not None and not docker else None,
    )
    info.update(
        {
            "artifacts": {k: f"{env.id}/{v}" for k, v in (suite.get("artifacts") or {}).items()},
            "suite_exit_code": exit_code,
            "suite_timed_out": timed_out,
            "interrupted": bool(suite.get("interrupted")),
        }
    )
    invocation.add_env(env.id, info)
    invocation.add_runs(env.id, list(suite.get("runs") or []))


def suite_failures(invocation: InvocationDir, steps: Sequence[Step] = ()) -> list[str]:
    """Why the verdict of this invocation is incomplete, one line per env ([] when every suite
    ran its plan). A suite exits 0 once every planned run has a record; anything else (bad
    arguments it rejected, a crash, a timeout, no record at all, a planned run without a record)
    must not end `make repro` with 0. The plan of each env in `steps` is the suite's own
    (repro.workload.suite.planned_keys of the same command line)."""
    plans = {step.env.id: planned_keys(list(step.suite_args)) for step in steps}
    problems = []
    for env_id, info in invocation.data["envs"].items():
        records = [run for run in invocation.runs if run.get("env") == env_id]
        code = info.get("suite_exit_code")
        if info.get("suite_timed_out"):
            problems.append(f"{env_id}: the suite ran past its time limit")
        elif code != 0:
            problems.append(f"{env_id}: the suite exited with {code}")
        elif not records:
            problems.append(f"{env_id}: the suite recorded no run")
        elif missing := _missing_runs(plans.get(env_id, []), records):
            problems.append(
                f"{env_id}: no record for {len(missing)} planned run(s): "
                + ", ".join("/".join(key) for key in missing)
            )
    return problems


def unfinished_envs(invocation: InvocationDir, steps: Sequence[Step]) -> list[str]:
    """The envs of `steps` that an earlier (interrupted or killed) invocation did not finish: no
    entry (a SIGKILL left `finished_at: null` before the env's suite was recorded), interrupted,
    a suite that did not run its whole plan, or a run recorded as interrupted. RESUME=1 finishes
    these (`resume_step`); an env whose runs all finished is neither prepared nor run again."""
    done = {line.split(":", 1)[0] for line in suite_failures(invocation, steps)}
    envs = invocation.data["envs"]
    cut = {str(r.get("env")) for r in invocation.runs if r.get("outcome") == Outcome.INTERRUPTED.value}
    return [
        s.env.id
        for s in steps
        if s.env.id not in envs or envs[s.env.id].get("interrupted") or s.env.id in done | cut
    ]


def resume_step(step: Step) -> Step:
    """The step that finishes an env's unfinished suite in its folder: the suite keeps the runs
    that finished and runs only the others again (repro/workload/resume.py)."""
    return replace(step, suite_args=(*step.suite_args, "--resume"))


def _missing_runs(
    planned: Sequence[tuple[str, str, str, str]], records: Sequence[RunRecord]
) -> list[tuple[str, str, str, str]]:
    """The planned (scenario, patch, transport, dtype) keys that no record answers, in plan order."""
    left = Counter(
        (str(r.get("scenario")), str(r.get("patch")), str(r.get("transport")), str(r.get("dtype")))
        for r in records
    )
    missing = []
    for key in planned:
        if left[key] > 0:
            left[key] -= 1
        else:
            missing.append(key)
    return missing
