"""The result record: one JSON object per run. Other tools (report, bisect, bundle) read these.

Keys are stable; add new ones, never rename. Schema version bumps only on incompatible change.

The record's keys are declared once, as the fields of `RunRecord` below, each with what it
holds: `RECORD_KEYS` and the shape the host checks records against (repro.core.shapes.RUN) are
read from it.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import os
from typing import TYPE_CHECKING, Any, TypedDict, cast

if TYPE_CHECKING:
    from repro.workload.device import RanOn

SCHEMA_VERSION = 1


class Scenario(str, enum.Enum):
    """What a run trains with: the ZeRO-3 control or one of the MiCS gather paths."""

    ZERO3 = "zero3"
    MICS = "mics"
    MICS_HIER = "mics-hier"
    MICS_REPLICA = "mics-replica"
    CUSTOM = "custom"  # the user's own command (`python -m repro run --cmd`), judged from its output


class Patch(str, enum.Enum):
    STOCK = "stock"  # DeepSpeed as released
    FIXED = "fixed"  # our fix applied at run time


class Dtype(str, enum.Enum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Transport(str, enum.Enum):
    """How collectives travel: NCCL/RCCL on GPUs, else one of the gloo adapter's modes, or gloo
    without the adapter ("plain": what a CPU user of torch and DeepSpeed gets as released)."""

    NATIVE = "native"
    ASYNC = "async"
    SYNC = "sync"
    STRICT = "strict"
    PLAIN = "plain"


class Outcome(str, enum.Enum):
    """Outcome of one run: a closed set (see classify.py for what each means)."""

    REPRODUCED = "reproduced"
    CLEAN = "clean"
    CRASHED = "crashed"
    HUNG = "hung"
    ENV_ERROR = "env-error"
    UNSUPPORTED = "unsupported"
    INTERRUPTED = "interrupted"
    # The run ended but says nothing about the bug either way: a pytest session that ran no test,
    # a job that exited 0 without a training step or never imported DeepSpeed, an own job whose
    # losses differ from its other run's without the bug's path (no IllegalWork seen by the hook).
    NO_EVIDENCE = "no-evidence"


class Signature(str, enum.Enum):
    """Which kind of evidence the outcome rests on: a closed set, so that bisection and the report
    can tell two runs with the same outcome but a different failure mode apart."""

    ILLEGAL_WORK_CRASH = "illegal-work-crash"  # died with an exception raised from an _IllegalWork object
    # died in torch's coalescing manager waiting the work its release lost (pytorch#122807), in the
    # same synchronous MiCS gather that otherwise dies on the _IllegalWork
    LOST_WORK_CRASH = "lost-work-crash"
    ILLEGAL_WORK_DIVERGENCE = "illegal-work-divergence"  # warnings and losses leave the control's / storm
    ILLEGAL_WORK_WARNINGS = "illegal-work-warnings"  # IllegalWork warnings, yet losses match the control
    DIVERGENCE = "divergence"  # losses leave the control's without any IllegalWork message
    OVERFLOW_STORM = "overflow-storm"  # fp16 overflow/skipped steps the control does not have, nothing else
    CRASH = "crash"  # another exception / non-zero exit
    HANG = "hang"  # timed out
    NONE = "none"  # no evidence of anything wrong


# The same sets as plain tuples of their values (argparse choices, CLI validation, older callers).
# The suite's scenarios (what --scenarios accepts); "custom" records come from `repro run` only.
SCENARIOS = tuple(s.value for s in Scenario if s is not Scenario.CUSTOM)
CUSTOM_SCENARIO = Scenario.CUSTOM.value
CONTROL_SCENARIO = Scenario.ZERO3.value
MICS_SCENARIOS = tuple(s.value for s in Scenario if s not in (Scenario.ZERO3, Scenario.CUSTOM))
PATCHES = tuple(p.value for p in Patch)
DTYPES = tuple(d.value for d in Dtype)
TRANSPORTS = tuple(t.value for t in Transport)
# The gloo adapter's modes (CPU); GPUs always use "native".
TRANSPORT_MODES = tuple(t.value for t in Transport if t not in (Transport.NATIVE, Transport.PLAIN))
# What a CPU suite run can use: the adapter's modes, or plain gloo (no adapter: gloo lacks the
# coalescing that DeepSpeed's MiCS gather enters, so stock MiCS fails there; the fix falls back).
CPU_TRANSPORTS = (*TRANSPORT_MODES, Transport.PLAIN.value)
OUTCOMES = tuple(o.value for o in Outcome)
SIGNATURES = tuple(s.value for s in Signature)


# How a multi-node layout was made (the record's `layout`).
class Layout(TypedDict):
    nodes: int
    devices_per_node: int
    how: str


# The exception that ended a run (the record's `exception`; a rank's, without `rank`, in rank*.json).
class RecordedException(TypedDict, total=False):
    type: str | None
    message: str | None
    rank: int | None
    traceback: str | None


# The job's packages (REQUIREMENTS=/PACKAGES=) as the records and the job layer's marker say them.
class DepsRecord(TypedDict):
    requirements_file: str | None  # REQUIREMENTS=
    packages: str | None  # PACKAGES=
    lines: list[str]  # the requirement lines of both
    digest: str


# The job's layer as the engines record it (Engine.prepare_job): results.json's env `job_layer`,
# a custom run's job `requirements`.
class LayerRecord(DepsRecord):
    layer: str  # the layer venv, or the job image's tag
    base: str  # the env's venv or image it stands on
    added: dict[str, str]  # what the layer installed: name -> version


class ImageLayerRecord(LayerRecord):  # the Docker engine's: the job image's id too
    image_id: str


# What decided a custom run's verdict: the record's job.patterns (judge.patterns_used).
class Patterns(TypedDict):
    loss: dict[str, str | None]  # {"name", "regex"} of the loss pattern
    illegal_work: str
    overflow: dict[str, str]  # name: regex of each overflow pattern the log matched


# job.json's and a custom run's job `rendezvous`: the port, and who chose it ("repro" | "job").
class Rendezvous(TypedDict):
    port: int | None
    set_by: str


# A pytest job's `job.pytest`: pytest's report as the hook recorded it (hooksign.PytestSummary's keys,
# None where it lacks one), and the devices the CPU twin gave DeepSpeed's test harness.
class PytestBlock(TypedDict):
    exitstatus: int | None
    collected: int | None
    counts: dict[str, int] | None
    ran: int | None
    tests: dict[str, dict[str, str]] | None  # test id: {"outcome", "message"}
    tests_cut: int | None
    collect_errors: list[dict[str, str]] | None
    harness_devices: int | None


# A custom run's `job` (scenario "custom", `python -m repro run --cmd`), as repro/run/job.py writes it.
class CustomJob(TypedDict, total=False):
    command: str | None
    workdir: str | None
    workdir_digest: str
    job_id: str  # custom_job_id: which job this is (stock and fixed of one job share it)
    patterns: Patterns
    notes: list[str]
    exit_code: int | None
    survivors: list[int]  # pids alive after SIGKILL
    left_running: dict[str, str]  # {pid: command line} still running after the command, stopped by the runner
    processes: dict[str, str]  # pid: argv of every hooked Python process
    loss_steps: list[int | None]
    deepspeed_imported: bool
    rendezvous: Rendezvous | None
    hook_pth: str | None  # the hook's .pth in the env's site-packages
    first_parting_step: int | None
    pytest: PytestBlock | None  # None: not a pytest job
    job_wrote: list[str]  # paths the job created or changed in its results folder besides the lab's files
    # the two IllegalWork counts: with hook_signed (the runner verified the hook's signatures,
    # repro/workload/hooksign.py) only the hook's is evidence, the log's corroborates
    illegal_work_in_log: int
    illegal_work_by_hook: int
    nan_logged_as_zero_from: int | None  # step
    hook_signed: bool
    forged_hook_records: list[dict[str, str]]  # [{"file", "why"}]: hook records that did not verify
    requirements: LayerRecord | None  # REQUIREMENTS=/PACKAGES= (None without)


# The record: the one declaration of its keys (RECORD_KEYS and repro.core.shapes.RUN are read from
# these fields). A TypedDict over the JSON object itself, so reading and writing keep the exact same
# bytes. total=False: records of older tools lack newer keys. (Annotations stay strings, as for
# every module the envs import: their Python is 3.9 or newer, repro/matrix/compat.py.)
class RunRecord(TypedDict, total=False):
    schema: int  # SCHEMA_VERSION
    env: str  # env id (e.g. "cpu", "rocm56", or a derived "cpu+torch2.2.2")
    scenario: str  # one of SCENARIOS, or "custom" (`python -m repro run --cmd`)
    patch: str  # "stock" (DeepSpeed as released) or "fixed" (our fix applied at run time)
    run_name: str  # "<scenario>-<patch>-<dtype>-<transport>-w<world_size>": unique within an env
    control_run: str | None  # run_name of the zero3 run this one was compared with (null for the control)
    dtype: str  # "fp32" | "bf16" | "fp16"
    world_size: int  # ranks launched by torchrun
    shard_size: int | None  # MiCS shard size, null for zero3
    hierarchical: bool  # mics_hierarchical_params_gather
    layout: Layout
    backend: str | None  # "gloo" | "nccl" (RCCL on ROCm is exposed through torch's nccl backend)
    # "native" on GPUs, else the gloo adapter mode: "async" | "sync" | "strict", or "plain" (CPU:
    # gloo as torch ships it, no adapter; transport_info.adapter null)
    transport: str
    steps: int
    seed: int
    outcome: str  # one of OUTCOMES (set by the judge)
    signature: str  # one of SIGNATURES (set by the judge)
    reason: str  # human sentence naming the evidence
    losses: list[float | None]  # per-step loss of rank 0, null where NaN/inf
    loss_scale: list[float | None] | None  # per-step loss scale (fp16 dynamic scaler), null when not fp16
    skipped_steps: int  # steps the optimizer skipped for overflow
    illegal_work_messages: int  # count of DeepSpeed's IllegalWork log lines (all levels, all ranks)
    first_divergent_step: int | None  # first step whose loss leaves the control's (null: none / no control)
    exception: RecordedException | None
    # {rank: int} as reported by the ranks, plus "launcher": torchrun's code
    exit_codes: dict[str, int | None]
    durations: dict[str, float | None]  # {"total_s": float, "train_s": float | null}
    # {"python", "torch", "deepspeed", "hip", "cuda", "nccl"} (null when absent)
    versions: dict[str, str | None]
    weights_checksum: str | None  # sha256 of the final full weights (gathered without DeepSpeed's paths)
    config: Any  # the DeepSpeed config the run used
    config_adaptations: list[str]  # every change made to a user config to fit the model
    config_problems: list[str]  # inconsistencies found in a user config (not fixed)
    stacks: dict[str, str]  # {rank: python stack text} captured on a hang, else {}
    logs: dict[str, str]  # {name: path relative to the results folder}
    timeout_s: float | None  # the run's time limit
    started_at: str  # ISO 8601 UTC
    fix: Any  # what the run-time fix patched (fixed runs), else null
    transport_info: dict[str, Any]  # what the CPU adapter / placeholder modules added (CPU runs), else {}
    # What the run really used (repro/workload/device.py), from rank 0: {"device": "cpu" | "gpu" |
    # null (never launched), "backend": "gloo" | "nccl", "gpu_count", "gpus": [names], "arch": [gfx
    # arch (ROCm gcnArchName; "unknown" without it) or "sm_XY" (CUDA compute capability)], "hip",
    # "cuda" (torch.version.*), "nccl" (NCCL/RCCL version), "ran": bool, "visible_devices":
    # {*_VISIBLE_DEVICES}, "passed_env": {host NCCL_*/RCCL_*/HSA_*/MIOPEN_*/*_VISIBLE_DEVICES the
    # engine passed (repro/engines/passthrough.py)}, "dropped_env": {host NCCL network settings
    # (NCCL_SOCKET_IFNAME, NCCL_IB_*...) held back from a networkless container}, "rocm_runtime":
    # {"container", "host"} ROCm versions (/opt/rocm/.info/version in the env; MICS_REPRO_HOST_ROCM
    # from the cluster scripts), ROCm runs only, "env_platform": what the env asked for (cpu | rocm |
    # cuda | gpu | null: auto), "planned_device" (never-launched runs only)}; null in older records.
    # A run whose ran_on does not match its env's platform is not evidence for that env
    # (repro/core/evidence.py). Custom runs: from the hook in every process that joined a process
    # group (rank 0's view plus "devices", "processes", "joined_group"; device null when none
    # joined: no GPU evidence).
    ran_on: RanOn | None
    # Custom runs only (CustomJob says what each key holds), else null
    job: CustomJob | None
    # How the ranks were started: {"kind": "prefork" (forked from the suite's pre-imported launcher,
    # repro/workload/prefork_server.py; CPU) | "torchrun", "note": why torchrun ran a run meant for
    # prefork, else ""}; null when nothing was launched and in older records. The evidence is the
    # same either way.
    launcher: dict[str, str] | None


def record_annotations() -> dict[str, str]:
    """Each record key with its annotation as written in RunRecord (a string: typing keeps it as a
    forward reference on some Pythons), in declaration order."""
    return {key: str(getattr(tp, "__forward_arg__", tp)) for key, tp in RunRecord.__annotations__.items()}


RECORD_KEYS = tuple(record_annotations())


def custom_job_id(command: str, workdir: str) -> str:
    """Which custom job a record belongs to: a digest of its command and the folder it ran in. The
    stock and fixed runs of one job share it; two jobs in one env (merged results folders) differ."""
    return hashlib.sha256(f"{command}\0{workdir}".encode()).hexdigest()[:12]


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/inf: the record stores them as null."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def empty_record(**fields: Any) -> RunRecord:
    """A record with every documented key present (null where nothing says more), filled from `fields`."""
    unknown = set(fields) - set(RECORD_KEYS)
    if unknown:
        raise KeyError(f"not record keys: {sorted(unknown)}")
    rec = RunRecord(
        schema=SCHEMA_VERSION,
        losses=[],
        loss_scale=[],
        skipped_steps=0,
        illegal_work_messages=0,
        exit_codes={},
        durations={},
        versions={},
        config_adaptations=[],
        config_problems=[],
        stacks={},
        logs={},
        reason="",
    )
    return cast(RunRecord, {**dict.fromkeys(RECORD_KEYS), **rec, **fields})


def write_json_atomic(path: str, data: Any) -> None:
    """Write JSON so that a reader never sees half a file (tmp file + rename in one folder)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # Not mkstemp: its 0600 would make results unreadable to the group; O_EXCL + 0666 gets the
    # umask applied by the kernel, as for any file the user writes.
    tmp = os.path.join(folder, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True, allow_nan=False)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(path: str) -> Any:
    with open(path) as fh:
        return json.load(fh)
