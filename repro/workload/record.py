"""The result record: one JSON object per run. Other tools (report, bisect, bundle) read these.

Keys are stable; add new ones, never rename. Schema version bumps only on incompatible change.

Record keys (`RECORD_KEYS`):
  schema              int, SCHEMA_VERSION
  env                 env id (e.g. "cpu", "rocm56", or a derived "cpu+torch2.2.2")
  scenario            one of SCENARIOS
  patch               "stock" (DeepSpeed as released) or "fixed" (our fix applied at run time)
  run_name            "<scenario>-<patch>-<dtype>-<transport>-w<world_size>": unique within an env
  control_run         run_name of the zero3 run this one was compared with (null for the control)
  dtype               "fp32" | "bf16" | "fp16"
  world_size          int, ranks launched by torchrun
  shard_size          int MiCS shard size, null for zero3
  hierarchical        bool, mics_hierarchical_params_gather
  layout              {"nodes", "devices_per_node", "how"}: how a multi-node layout was made
  backend             "gloo" | "nccl" (RCCL on ROCm is exposed through torch's nccl backend)
  transport           "native" on GPUs, else the gloo adapter mode: "async" | "sync" | "strict"
  steps, seed         ints
  outcome             one of OUTCOMES (set by classify.classify)
  signature           one of SIGNATURES (set by classify.classify)
  reason              human sentence naming the evidence
  losses              per-step loss of rank 0, null where NaN/inf
  loss_scale          per-step loss scale (fp16 dynamic scaler), null when not fp16
  skipped_steps       steps the optimizer skipped for overflow
  illegal_work_messages  count of DeepSpeed's IllegalWork log lines (all levels, all ranks)
  first_divergent_step   first step whose loss leaves the control's (null: none / no control)
  exception           {"type", "message", "rank", "traceback"} or null
  exit_codes          {rank: int} as reported by the ranks, plus "launcher": torchrun's code
  durations           {"total_s": float, "train_s": float | null}
  versions            {"python", "torch", "deepspeed", "hip", "cuda", "nccl"} (null when absent)
  weights_checksum    sha256 of the final full weights (gathered without DeepSpeed's paths)
  config              the DeepSpeed config the run used
  config_adaptations  list of strings: every change made to a user config to fit the model
  config_problems     list of strings: inconsistencies found in a user config (not fixed)
  stacks              {rank: python stack text} captured on a hang, else {}
  logs                {name: path relative to the results folder}
  timeout_s           the run's time limit
  fix                 what the run-time fix patched (fixed runs), else null
  transport_info      what the CPU adapter / placeholder modules added (CPU runs), else {}
  started_at          ISO 8601 UTC
  ran_on              what the run really used (repro/workload/device.py), from rank 0:
                      {"device": "cpu" | "gpu" | null (never launched), "backend": "gloo" | "nccl",
                       "gpu_count", "gpus": [names], "arch": [gfx arch (ROCm gcnArchName) or
                       "sm_XY" (CUDA compute capability)], "hip", "cuda" (torch.version.*), "nccl"
                       (NCCL/RCCL version), "ran": bool, "visible_devices": {*_VISIBLE_DEVICES},
                       "env_platform": what the env asked for (cpu | rocm | cuda | gpu | null: auto),
                       "planned_device" (never-launched runs only)}; null in older records.
                      A run whose ran_on does not match its env's platform is not evidence for that
                      env (repro/core/evidence.py).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

SCHEMA_VERSION = 1

SCENARIOS = ("zero3", "mics", "mics-hier", "mics-replica")
CONTROL_SCENARIO = "zero3"
PATCHES = ("stock", "fixed")
DTYPES = ("fp32", "bf16", "fp16")
TRANSPORT_MODES = ("async", "sync", "strict")

# Outcome of one run: a closed set.
OUTCOMES = ("reproduced", "clean", "crashed", "hung", "env-error", "unsupported", "interrupted")

# Which kind of evidence the outcome rests on: a closed set, so that bisection and the report
# can tell two runs with the same outcome but a different failure mode apart.
SIGNATURES = (
    "illegal-work-crash",       # the run died with an exception raised from an _IllegalWork object
    "illegal-work-divergence",  # IllegalWork warnings and losses leave the control's (or overflow storm)
    "illegal-work-warnings",    # IllegalWork warnings, yet losses match the control
    "divergence",               # losses leave the control's without any IllegalWork message
    "overflow-storm",           # fp16 overflow/skipped steps the control does not have, nothing else
    "crash",                    # another exception / non-zero exit
    "hang",                     # timed out
    "none",                     # no evidence of anything wrong
)

RECORD_KEYS = (
    "schema", "env", "scenario", "patch", "run_name", "control_run", "dtype", "world_size", "shard_size", "hierarchical",
    "layout", "backend", "transport", "steps", "seed", "outcome", "signature", "reason", "losses",
    "loss_scale", "skipped_steps", "illegal_work_messages", "first_divergent_step", "exception",
    "exit_codes", "durations", "versions", "weights_checksum", "config", "config_adaptations",
    "config_problems", "stacks", "logs", "timeout_s", "started_at", "fix", "transport_info", "ran_on",
)


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/inf: the record stores them as null."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def empty_record(**fields: Any) -> dict[str, Any]:
    """A record with every documented key present, filled from `fields`."""
    rec: dict[str, Any] = {key: None for key in RECORD_KEYS}
    rec.update(
        schema=SCHEMA_VERSION, losses=[], loss_scale=[], skipped_steps=0, illegal_work_messages=0,
        exit_codes={}, durations={}, versions={}, config_adaptations=[], config_problems=[],
        stacks={}, logs={}, outcome=None, signature=None, reason="",
    )
    unknown = set(fields) - set(RECORD_KEYS)
    if unknown:
        raise KeyError(f"not record keys: {sorted(unknown)}")
    rec.update(fields)
    return rec


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
