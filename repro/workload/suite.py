"""Run the reproduction suite of one environment: the control, the MiCS scenarios, stock and fixed.

Runs inside the env (container or venv): `python -m repro.workload.suite --env ID --out DIR ...`.
Writes DIR/suite.json ({"runs": [...]}, rewritten after every run so an interruption loses
nothing), DIR/runs/<run>/ (rank logs, stacks), DIR/artifacts/ (ds_report, collect_env).
Exits 0 when every planned run produced a record, whatever the outcomes; 130 on Ctrl-C,
SIGTERM or SIGHUP (the runs started so far are stopped and recorded).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import importlib.util
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypedDict

from repro.workload import classify as cls
from repro.workload import device as dev
from repro.workload import ds_config, parentwatch, resume, runner
from repro.workload import layout as lay
from repro.workload import record as rec
from repro.workload.artifacts import ArtifactCapture
from repro.workload.controls import ControlKey, choose_control, record_key
from repro.workload.defaults import DEFAULT_SEED, DEFAULT_STEPS, DEFAULT_WORLD_SIZE
from repro.workload.prefork import PreforkServer

if TYPE_CHECKING:  # annotations only (a subscripted dict at run time needs Python 3.9)
    from collections.abc import Callable

    from repro.workload.prefork_server import Reply

    # A run's DeepSpeed config from its shape (the suite's dtype and the user's config bound).
    Build = Callable[[ds_config.ScenarioShape], ds_config.BuiltConfig]

    # The stock zero3 runs judged so far, by (dtype, transport, world size): the controls.
    Controls = dict[tuple[str, str, int], rec.RunRecord]

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_STALL_S = 60.0


@dataclass(frozen=True)
class PlannedRun:
    scenario: str
    patch: str
    dtype: str
    transport: str
    layout: lay.Layout
    # (outcome, reason) for a run that is recorded without being launched: the env cannot run it
    # (env-error: no GPU of its platform) or the layout cannot (unsupported: too few GPUs).
    skip: tuple[str, str] | None = None

    @property
    def shape(self) -> ds_config.ScenarioShape:
        return shape_of(self.layout)


def shape_of(layout: lay.Layout) -> ds_config.ScenarioShape:
    return ds_config.ScenarioShape(
        layout.scenario, layout.world_size, layout.shard_size, layout.hierarchical, layout.devices_per_node
    )


def _skip(layout: lay.Layout, device: str, error: str | None) -> tuple[str, str] | None:
    if error:
        return ("env-error", error)
    if not layout.supported:
        unit = "GPUs (one rank per GPU)" if device == "gpu" else "ranks"
        return (
            "unsupported",
            f"{layout.scenario} needs at least {layout.needs} {unit}; this layout has {layout.world_size}",
        )
    return None


def plan(
    scenarios: list[str],
    patches: list[str],
    dtype: str,
    transports: list[str],
    world_size: int,
    sync_proof: bool,
    layouts: lay.LayoutPlan | None = None,
    error: str | None = None,
) -> list[PlannedRun]:
    """Controls first (one zero3 stock run per transport), then each MiCS scenario x patch.
    `sync_proof` adds `mics` stock over the sync transport: IllegalWork messages yet a match
    with the control proves the missing wait, not the arithmetic, is the cause.
    `layouts` (default: the CPU layouts of `world_size`) decides every run's shape; `error` makes
    every run an env-error that is recorded without being launched."""
    chosen = layouts or lay.plan_layouts("cpu", world_size)

    def planned(scenario: str, patch: str, transport: str) -> PlannedRun:
        layout = chosen.get(scenario)
        return PlannedRun(scenario, patch, dtype, transport, layout, _skip(layout, chosen.device, error))

    runs: list[PlannedRun] = []
    for transport in transports:
        runs.append(planned("zero3", "stock", transport))
        for scenario in scenarios:
            for patch in patches:
                # zero3 stock is the control above; the fix does not touch ZeRO-3's own gather
                # path, so a zero3 fixed run would only repeat the control.
                if scenario == "zero3":
                    continue
                runs.append(planned(scenario, patch, transport))
    if sync_proof and "mics" in scenarios and needs_sync_proof(transports):
        runs.append(planned("mics", "stock", "sync"))
    return runs


def needs_sync_proof(transports: list[str] | tuple[str, ...]) -> bool:
    """The sync proof controls the adapter's other modes: not run when sync itself is asked for,
    on GPUs (native) or over plain gloo only (no adapter whose missing wait it could prove)."""
    adapter = [t for t in transports if t in rec.TRANSPORT_MODES]
    return bool(adapter) and "sync" not in adapter


def mics_available() -> bool:
    """Whether the installed DeepSpeed has MiCS, without importing deepspeed (slow)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = list(spec.submodule_search_locations)[0]
    return os.path.exists(os.path.join(root, "runtime", "zero", "mics.py"))


def detect_device(requested: str) -> tuple[dev.Decision, dev.TorchView | None]:
    """The env's platform decides (repro/workload/device.py); torch is asked only off CPU."""
    view = None if requested == "cpu" else dev.probe()
    return dev.decide(requested, view), view


def choose_layouts(decision: dev.Decision, world_size: int | None) -> tuple[lay.LayoutPlan, str | None]:
    """The layouts the runs use, and an error that stops every run (recorded, never launched)."""
    if decision.device == "cpu":
        return lay.plan_layouts("cpu", world_size), None
    if decision.error:  # no usable GPU: the runs are still planned (and named) from the request
        return lay.plan_layouts("cpu", world_size), decision.error
    try:
        return lay.plan_layouts("gpu", world_size, decision.gpus), None
    except lay.LayoutError as exc:
        return lay.plan_layouts("cpu", world_size), str(exc)


def default_dtype(device: str, user_config: dict[str, Any] | None) -> str:  # the user's config: free-form
    """Without DTYPE=: the user config's precision; else the reporter's fp16 (with their loss-scale
    settings, which our default config carries) on GPUs, where the overflow storm they saw shows;
    fp32 on CPU, as always (torch < 2.2 has no fp16 CPU kernels)."""
    if user_config:
        return ds_config.config_dtype(user_config)
    return "fp16" if device == "gpu" else "fp32"


def _progress_line(i: int, n: int, name: str, record: rec.RunRecord) -> str:
    secs = record.get("durations", {}).get("total_s")
    return f"[{i}/{n}] {name:<42} {record['outcome']:<12} {record['signature']:<24} {secs} s"


# RESUME=1: the earlier suite's runs kept (their names) and how many run again.
class Resumed(TypedDict):
    kept: list[str]
    redone: int


# How the suite's runs were started (suite.json's "launcher").
class LauncherUsed(TypedDict, total=False):
    requested: str
    used: str
    note: str
    server: Reply | None  # what the pre-imported launcher said when ready


# suite.json besides its "runs": what the suite was asked, saw and did.
class SuiteMeta(TypedDict, total=False):
    env: str
    device: str
    platform: str | None
    device_error: str | None
    layout_notes: list[str]
    started_at: str
    finished_at: str
    interrupted: bool
    artifacts: dict[str, str]
    resumed: Resumed
    launcher: LauncherUsed


def _save(out: str, runs: list[rec.RunRecord], meta: SuiteMeta) -> None:
    rec.write_json_atomic(os.path.join(out, "suite.json"), {**meta, "runs": runs})


def run_transports(device: str, requested: list[str]) -> list[str]:
    """GPUs use the native backend (NCCL/RCCL); the other transports are CPU (gloo) modes."""
    return ["native"] if device == "gpu" else requested


def _user_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """The user's DeepSpeed config (free-form: DeepSpeed's own keys), or None."""
    if args.config:
        with open(args.config) as fh:
            text = fh.read()
    elif args.config_json:
        text = args.config_json
    else:
        return None
    config: dict[str, Any] = json.loads(text)
    return config


def planned_keys(argv: list[str]) -> list[tuple[str, str, str, str]]:
    """(scenario, patch, transport, dtype) of every run the suite plans for its command line
    `argv` (without --out): the same rules as run_suite, for a --device that names the platform
    (cpu, gpu, rocm, cuda; the GPU platforms use GPUs or end every run env-error, recorded). The
    host checks each has a record. Pure: no torch, no device probe."""
    args = parser().parse_args([*argv, "--out", "-"])
    if args.device == "auto":
        raise ValueError("--device auto: the runs depend on the host's GPUs")
    device = "cpu" if args.device == "cpu" else "gpu"
    dtype = args.dtype or default_dtype(device, _user_config(args))
    transports = run_transports(device, args.transports)
    planned = plan(
        args.scenarios, args.patches, dtype, transports, DEFAULT_WORLD_SIZE, not args.no_sync_proof
    )
    return [(run.scenario, run.patch, run.transport, run.dtype) for run in planned]


@dataclass(frozen=True)
class RunOptions:
    """What every run of one suite shares, typed once from the command line: the functions below
    the parser take this, never the argparse namespace."""

    env: str
    steps: int
    seed: int
    timeout_s: float
    stall_s: float
    results_root: str | None
    model_args: tuple[str, ...]
    jobs: int | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RunOptions:
        return cls(
            env=args.env,
            steps=args.steps,
            seed=args.seed,
            timeout_s=args.timeout,
            stall_s=args.stall_timeout,
            results_root=args.results_root,
            model_args=tuple(args.model_args or ()),
            jobs=args.jobs,
        )


def run_suite(args: argparse.Namespace) -> int:
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    decision, view = detect_device(args.device)
    device = decision.device
    layouts, error = choose_layouts(decision, args.world_size)
    transports = run_transports(device, args.transports)
    user_config = _user_config(args)
    dtype = args.dtype or default_dtype(device, user_config)
    build = functools.partial(ds_config.build_config, dtype=dtype, user_config=user_config)
    sync_proof = not args.no_sync_proof
    planned = plan(args.scenarios, args.patches, dtype, transports, layouts.used, sync_proof, layouts, error)
    meta: SuiteMeta = {
        "env": args.env,
        "device": device,
        "platform": decision.platform,
        "device_error": error,
        "layout_notes": list(layouts.notes),
        "started_at": _now(),
        "interrupted": False,
        "artifacts": {},
    }
    opts = RunOptions.from_args(args)
    kept: list[rec.RunRecord] = []
    if args.resume:  # finish an earlier suite in this folder: its finished runs are kept
        kept, planned = _resume(out, planned, opts, build)
        meta["resumed"] = {"kept": [str(r.get("run_name")) for r in kept], "redone": len(planned)}
        print(f"resume: kept {len(kept)} finished run(s), running {len(planned)} again", flush=True)
    # Every record says what ran; a run never launched keeps what the suite saw (nothing ran).
    not_run: dev.RanOn = {**dev.view_summary(view, device), "env_platform": decision.platform}
    if error:
        print(f"error: {error}", flush=True)
    for note in layouts.notes:
        print(f"layout: {note}", flush=True)
    launcher, note = choose_launcher(device, args.launcher)
    meta["launcher"] = {"requested": args.launcher, "used": launcher, "note": note}
    if note:
        print(f"launcher: {note}", flush=True)
    # The server imports while the suite prepares; nothing to start when no run will launch.
    wanted = launcher == "prefork" and any(item.skip is None for item in planned)
    server = start_prefork(out, device) if wanted else None
    if wanted and server is None:
        meta["launcher"].update({"used": "torchrun", "note": "the pre-imported launcher could not start"})
    capture = None
    if not args.no_artifacts:
        print("capturing ds_report and collect_env in the background ...", flush=True)
        capture = ArtifactCapture(out, device, server)
    try:
        return _run_planned(opts, out, planned, meta, device, build, capture, not_run, server, kept)
    finally:
        if capture is not None:
            capture.abandon()
        if server is not None:
            server.close()


LAUNCHERS = ("auto", "prefork", "torchrun")


def _resume(
    out: str,
    planned: list[PlannedRun],
    opts: RunOptions,
    build: Build,
) -> tuple[list[rec.RunRecord], list[PlannedRun]]:
    """(the earlier suite's records kept, the planned runs to do again): repro/workload/resume.py.
    A record answers a planned run only when it ran the same steps, seed and DeepSpeed config."""
    keys = [resume.RunKey(p.scenario, p.patch, p.transport, p.dtype, p.shape.world_size) for p in planned]

    def same_run(i: int, record: rec.RunRecord) -> bool:
        config = json.loads(json.dumps(build(planned[i].shape).config))  # as the record holds it (JSON)
        ran = (record.get("steps"), record.get("seed"), record.get("config"))
        return ran == (opts.steps, opts.seed, config)

    kept, redo = resume.split(keys, resume.previous_records(out), same_run)
    resume.clear_stale(out, [keys[i].run_name for i in redo])
    return kept, [planned[i] for i in redo]


def choose_launcher(device: str, requested: str) -> tuple[str, str]:
    """(launcher, note). CPU runs fork from the pre-imported launcher unless torchrun is asked
    for; GPU runs always use torchrun (forking after the GPU runtime is loaded is undefined)."""
    if device != "cpu":
        cpu_only = "the pre-imported launcher is CPU only: GPU runs use torchrun"
        return "torchrun", cpu_only if requested == "prefork" else ""
    return ("torchrun", "") if requested == "torchrun" else ("prefork", "")


def start_prefork(out: str, device: str) -> PreforkServer | None:
    """The pre-imported launcher for this suite's CPU runs (its log: DIR/prefork.log); None when
    it cannot even be started, and every run goes through torchrun."""
    env = runner.base_env(device)
    try:
        return PreforkServer(env, runner.REPO_ROOT, os.path.join(out, "prefork.log"), runner.alive)
    except OSError as exc:
        print(f"launcher: the pre-imported launcher could not start ({exc}): torchrun", flush=True)
        return None


def default_jobs(device: str, world_size: int) -> int:
    """Runs at once. GPUs: one (each run owns every device). CPU: at least two, because a run
    leaves a core idle while torchrun starts, ranks rendezvous and gloo waits; two at once cut
    the full set by about a sixth on 2 cores without changing any outcome (measured)."""
    if device != "cpu":
        return 1
    return max(2, (os.cpu_count() or 2) // max(world_size, 1))


def _run_planned(
    opts: RunOptions,
    out: str,
    planned: list[PlannedRun],
    meta: SuiteMeta,
    device: str,
    build: Build,
    capture: ArtifactCapture | None,
    not_run: dev.RanOn | None = None,
    server: PreforkServer | None = None,
    kept: list[rec.RunRecord] | None = None,
) -> int:
    """Launch up to `jobs` runs at once; classify and record them in plan order, so a run is
    always judged after its control (controls come first in the plan). `kept`: an earlier suite's
    finished records (RESUME=1), recorded first; its controls judge the runs done now."""
    has_mics = mics_available()
    runs: list[rec.RunRecord] = list(kept or [])
    controls: Controls = {
        (str(r["dtype"]), str(r["transport"]), int(r["world_size"])): r
        for r in runs
        if r.get("scenario") == rec.CONTROL_SCENARIO and r.get("patch") == "stock"
    }
    _save(out, runs, meta)
    prepared = []
    for item in planned:
        spec = _spec(opts, out, item, device)
        built = build(item.shape)
        rec.write_json_atomic(spec.ds_config_path, built.config)
        base = _base_record(opts, spec, item, built)
        base["ran_on"] = not_run
        prepared.append((item, spec, base))
    total = len(prepared)
    jobs = opts.jobs or default_jobs(device, prepared[0][1].world_size if prepared else 1)
    stop = threading.Event()

    def launched(item: PlannedRun) -> bool:
        return item.skip is None and (item.scenario == "zero3" or has_mics)

    def execute(i: int, spec: runner.RunSpec, item: PlannedRun) -> runner.LaunchResult | None:
        if stop.is_set():
            return NOT_STARTED
        _say(f"[{i}/{total}] {spec.run_name} ...")
        if not launched(item):
            return None
        return runner.launch(spec, stop=stop, server=server)

    return _execute_all(out, prepared, execute, jobs, stop, controls, runs, meta, capture, server)


def _execute_all(
    out: str,
    prepared: list[tuple[PlannedRun, runner.RunSpec, rec.RunRecord]],
    execute: Callable[[int, runner.RunSpec, PlannedRun], runner.LaunchResult | None],
    jobs: int,
    stop: threading.Event,
    controls: Controls,
    runs: list[rec.RunRecord],
    meta: SuiteMeta,
    capture: ArtifactCapture | None,
    server: PreforkServer | None,
) -> int:
    total = len(prepared)
    earlier = len(runs)  # records kept from an earlier suite (RESUME=1) come first

    with ThreadPoolExecutor(max_workers=max(jobs, 1), thread_name_prefix="run") as pool:
        futures = [pool.submit(execute, i, spec, item) for i, (item, spec, _b) in enumerate(prepared, 1)]
        try:
            for i, (future, (item, spec, base)) in enumerate(zip(futures, prepared), 1):
                status = _record_run(out, future.result(), item, spec, base, controls, runs, meta)
                _say(_progress_line(i, total, spec.run_name, runs[-1]))
                if status == "interrupted":
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            stop.set()
            if server is not None:  # a run still waiting for it must not wait out its imports
                server.abandon()
            # Runs already started stop their process groups and come back as interrupted.
            for future, (item, spec, base) in list(zip(futures, prepared))[len(runs) - earlier :]:
                if not future.cancel() and (result := future.result()) is not NOT_STARTED:
                    _record_run(out, result, item, spec, base, controls, runs, meta)
            meta["interrupted"] = True
            _save(out, runs, meta)
            print("interrupted: records so far are in", os.path.join(out, "suite.json"), flush=True)
            return 130
    if capture is not None:
        meta["artifacts"] = capture.finish()
    if server is not None:
        meta["launcher"]["server"] = server.ready_info()
    meta["finished_at"] = _now()
    _save(out, runs, meta)
    return 0


# A queued run the pool reached after the stop: nothing ran, so it gets no record.
NOT_STARTED = runner.LaunchResult("not-started", None, 0.0, {}, "")


def _say(line: str) -> None:
    """One write per line: runs finish in several threads and must not interleave mid-line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _record_run(
    out: str,
    result: runner.LaunchResult | None,
    item: PlannedRun,
    spec: runner.RunSpec,
    base: rec.RunRecord,
    controls: Controls,
    runs: list[rec.RunRecord],
    meta: SuiteMeta,
) -> str | None:
    """Classify one finished run against its control, write its record and the suite file."""
    if result is None:  # not launched: the env or the layout cannot run it, or this DeepSpeed has no MiCS
        record = rec.empty_record(**base, run_name=spec.run_name)
        no_mics = ("unsupported", "this DeepSpeed has no MiCS (deepspeed/runtime/zero/mics.py is absent)")
        outcome, reason = item.skip or no_mics
        verdict = cls.Classification(outcome, "none", reason, None)
        status: str | None = outcome
    else:
        record, status = runner.assemble(spec, result, base)
        control = None if item.scenario == "zero3" and item.patch == "stock" else _control_for(controls, item)
        record["control_run"] = control["run_name"] if control else None
        verdict = cls.classify(record, control, status)
    record.update(
        {
            "outcome": verdict.outcome,
            "signature": verdict.signature,
            "reason": verdict.reason,
            "first_divergent_step": verdict.first_divergent_step,
        }
    )
    if item.scenario == "zero3" and item.patch == "stock":
        controls[(item.dtype, item.transport, item.shape.world_size)] = record
    rec.write_json_atomic(os.path.join(spec.run_dir, "record.json"), record)
    runs.append(record)
    _save(out, runs, meta)
    return status


def _control_for(controls: Controls, item: PlannedRun) -> rec.RunRecord | None:
    """The stock zero3 run this run is compared with (the one rule in workload/controls.py)."""
    want = ControlKey(item.dtype, item.transport, item.shape.world_size, item.patch)
    return choose_control(want, list(controls.values()), record_key)


def _spec(opts: RunOptions, out: str, item: PlannedRun, device: str) -> runner.RunSpec:
    shape = item.shape
    spec = runner.RunSpec(
        env=opts.env,
        scenario=item.scenario,
        patch=item.patch,
        dtype=item.dtype,
        transport=item.transport,
        world_size=shape.world_size,
        shard_size=shape.shard_size,
        hierarchical=shape.hierarchical,
        devices_per_node=shape.devices_per_node,
        steps=opts.steps,
        seed=opts.seed,
        timeout_s=opts.timeout_s,
        stall_s=opts.stall_s,
        device=device,
        run_dir="",
        results_root=opts.results_root or out,
        ds_config_path="",
        model_args=opts.model_args,
    )
    run_dir = os.path.join(out, "runs", spec.run_name)
    if os.path.exists(run_dir):  # never overwrite an earlier run's evidence
        run_dir = f"{run_dir}-{dt.datetime.now(dt.timezone.utc).strftime('%H%M%S%f')}"
    return replace(spec, run_dir=run_dir, ds_config_path=os.path.join(run_dir, "ds_config.json"))


def _base_record(
    opts: RunOptions, spec: runner.RunSpec, item: PlannedRun, built: ds_config.BuiltConfig
) -> rec.RunRecord:
    shape = item.shape
    how = item.layout.how(spec.device)  # the suite's layouts are on one host: more nodes are emulated
    return rec.RunRecord(
        env=opts.env,
        scenario=item.scenario,
        patch=item.patch,
        dtype=item.dtype,
        world_size=shape.world_size,
        shard_size=shape.shard_size,
        hierarchical=shape.hierarchical,
        layout={"nodes": shape.nodes, "devices_per_node": shape.devices_per_node, "how": how},
        backend="gloo" if spec.device == "cpu" else "nccl",
        transport=item.transport,
        steps=opts.steps,
        seed=opts.seed,
        config=built.config,
        config_adaptations=built.adaptations,
        config_problems=built.problems,
        timeout_s=opts.timeout_s,
        started_at=_now(),
    )


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _csv(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return items

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m repro.workload.suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--env", required=True, help="env id recorded in every record")
    p.add_argument("--out", required=True, help="folder for suite.json, runs/ and artifacts/")
    p.add_argument("--results-root", help="folder that record log paths are relative to (default --out)")
    p.add_argument("--scenarios", type=_csv(rec.SCENARIOS), default=list(rec.SCENARIOS))
    p.add_argument("--patches", type=_csv(rec.PATCHES), default=list(rec.PATCHES))
    p.add_argument("--dtype", choices=rec.DTYPES, help="default: the config's precision, else fp32")
    p.add_argument(
        "--transports",
        type=_csv(rec.CPU_TRANSPORTS),
        default=["async"],
        help="CPU transports to run: the gloo adapter's modes, or plain (gloo as torch ships it, no "
        "adapter); GPU runs use the native backend",
    )
    p.add_argument("--no-sync-proof", action="store_true", help="skip the extra mics/stock/sync run")
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help=f"ranks (default: {DEFAULT_WORLD_SIZE} on CPU; every GPU, or the largest even number "
        "of them, on GPUs; above the GPU count every run ends env-error)",
    )
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="runs at once (default: 1 on GPUs; on CPU max(2, cores // world size))",
    )
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="auto",
        help="how ranks start: prefork (forked from one process that imported torch and DeepSpeed "
        "once; CPU only), torchrun (one torchrun per run); auto: prefork on CPU, torchrun on GPUs",
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-run limit, seconds")
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=DEFAULT_STALL_S,
        help="a run with no step progress for this long is hung",
    )
    p.add_argument(
        "--device",
        choices=dev.REQUESTS,
        default="auto",
        help="the env's platform decides: cpu (also on a GPU host), rocm or cuda (GPUs of that "
        "kind, else every run ends env-error), gpu (any GPU); auto: a GPU if torch sees one",
    )
    p.add_argument("--config", help="your DeepSpeed config JSON (ZeRO/MiCS/precision/comm settings kept)")
    p.add_argument("--config-json", help="the same, given inline (engines use it: no file to copy in)")
    p.add_argument("--no-artifacts", action="store_true", help="skip ds_report / collect_env")
    p.add_argument(
        "--resume",
        action="store_true",
        help="finish the suite in --out: keep its finished runs, run the rest again (make: RESUME=1)",
    )
    p.add_argument("--model-args", nargs=argparse.REMAINDER, help="passed to the per-rank trainer")
    return p


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a real command line (tests pass argv): SIGTERM/SIGHUP act like Ctrl-C
        runner.install_stop_handlers()
        # ... and the tool's death (even SIGKILL) is a SIGTERM here: nothing outlives the tool.
        parentwatch.follow_tool()
    args = parser().parse_args(argv)
    if args.world_size is not None and (args.world_size < 1 or (args.world_size > 1 and args.world_size % 2)):
        # 1 is a layout too (one GPU: the control only; a bundle of such runs asks for it).
        parser().error("--world-size must be 1 or an even number >= 2 (MiCS scenarios split it in halves)")
    try:
        return run_suite(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
