"""Build the DeepSpeed config for a scenario, from our default or from a user's config.

The default mirrors the config in the reporter's upstream bug report (shipped as
repro/configs/reporter_ds_config.json): stage 3 with overlap_comm, reduce_scatter, contiguous
gradients, the same fp16 dynamic loss-scaler settings and gradient clipping, with buckets scaled
down to the small model and a persistence threshold of 0 so that every weight is sharded (and so
goes through the gathers under test).

With a user config, its ZeRO, MiCS, precision and communication settings are kept. What cannot
fit the small model or the scenario is changed and every change is listed (`adaptations`);
inconsistencies in the config itself are listed (`problems`), never silently fixed.

A DeepSpeed config is free-form JSON (DeepSpeed's keys, a user's included) and is typed as such.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

# Bucket sizes for a model of ~1 M parameters: small enough that gathers and reductions are
# split into several buckets, as they are for the reporter's model with 5e8-element buckets.
SMALL_BUCKET = 50_000
SMALL_LIVE_PARAMS = 200_000
DEFAULT_MICRO_BATCH = 2

# Keys sized for the reporter's GPT that we scale to the small model.
_BUCKET_KEYS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size")
_LIVE_KEYS = ("stage3_max_live_parameters", "stage3_max_reuse_distance")


@dataclass(frozen=True)
class ScenarioShape:
    """What the scenario itself decides: sharding layout and gather mode."""

    scenario: str
    world_size: int
    shard_size: int | None
    hierarchical: bool
    devices_per_node: int

    @property
    def nodes(self) -> int:
        return self.world_size // self.devices_per_node


@dataclass
class BuiltConfig:
    config: dict[str, Any]
    adaptations: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def default_config() -> dict[str, Any]:
    """Our stand-in for the reporter's config, fitted to the small model."""
    return {
        "train_micro_batch_size_per_gpu": DEFAULT_MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1000,
        "zero_optimization": {
            "stage": 3,
            "reduce_scatter": True,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "allgather_partitions": True,
            "reduce_bucket_size": SMALL_BUCKET,
            "allgather_bucket_size": SMALL_BUCKET,
            "stage3_max_live_parameters": SMALL_LIVE_PARAMS,
            "stage3_prefetch_bucket_size": SMALL_BUCKET,
            "stage3_max_reuse_distance": SMALL_LIVE_PARAMS,
            "stage3_param_persistence_threshold": 0,
        },
        "fp16": {
            "enabled": False,
            "loss_scale": 0,
            "initial_scale_power": 12,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "gradient_clipping": 1.0,
        "wall_clock_breakdown": False,
    }


_OBJECT_KEYS = ("fp16", "bf16", "zero_optimization", "optimizer", "scheduler")
_COUNT_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def type_problems(config: dict[str, Any]) -> list[str]:
    """The keys this workload reads whose values have the wrong JSON type (`"fp16": true`,
    `"reduce_bucket_size": "big"`): checked on the host, before any build, instead of a crash in
    every run inside the env."""
    problems = [
        f"{key} is {type(config[key]).__name__}, not an object"
        for key in _OBJECT_KEYS
        if key in config and not isinstance(config[key], dict)
    ]
    for key in _COUNT_KEYS:
        value = config.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            problems.append(f"{key} is {value!r}, not a whole number >= 1")
    for section in ("fp16", "bf16"):
        enabled = config.get(section, {}).get("enabled") if isinstance(config.get(section), dict) else None
        if enabled is not None and not isinstance(enabled, bool):
            problems.append(f"{section}.enabled is {enabled!r}, not true or false")
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        stage = zero.get("stage")
        if stage is not None and stage not in (0, 1, 2, 3):
            problems.append(f"zero_optimization.stage is {stage!r}, not 0, 1, 2 or 3")
        for key in (*_BUCKET_KEYS, *_LIVE_KEYS, "stage3_param_persistence_threshold"):
            if key in zero and not (_number(zero[key]) and zero[key] >= 0):
                problems.append(f"zero_optimization.{key} is {zero[key]!r}, not a number >= 0")
    return problems


def config_dtype(config: dict[str, Any]) -> str:
    if config.get("fp16", {}).get("enabled"):
        return "fp16"
    if config.get("bf16", {}).get("enabled"):
        return "bf16"
    return "fp32"


def _check_batch(config: dict[str, Any], world_size: int, problems: list[str]) -> None:
    """DeepSpeed requires train = micro x accumulation x data-parallel ranks: report a mismatch."""
    train = config.get("train_batch_size")
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps")
    if train is not None and micro is not None:
        if accum is None:
            if train % (micro * world_size):
                problems.append(
                    f"train_batch_size {train} is not a multiple of train_micro_batch_size_per_gpu "
                    f"{micro} x {world_size} ranks: no gradient_accumulation_steps can produce it"
                )
        elif train != micro * accum * world_size:
            problems.append(
                f"train_batch_size {train} != train_micro_batch_size_per_gpu {micro} x "
                f"gradient_accumulation_steps {accum} x {world_size} ranks"
            )


def _set(section: dict[str, Any], key: str, value: Any, label: str, notes: list[str]) -> None:
    if key in section and section[key] != value:
        notes.append(f"{label}{key}: {section[key]!r} -> {value!r}")
    elif key not in section:
        notes.append(f"{label}{key}: (unset) -> {value!r}")
    section[key] = value


def build_config(
    shape: ScenarioShape,
    dtype: str | None = None,
    user_config: dict[str, Any] | None = None,
) -> BuiltConfig:
    """The config for one run. `dtype` None keeps the user's precision (or fp32 by default)."""
    adaptations: list[str] = []
    problems: list[str] = []
    if user_config is None:
        config = default_config()
        notes: list[str] = []  # our own default: changes to it are not user-visible adaptations
    else:
        config = copy.deepcopy(user_config)
        notes = adaptations
        # Checked against the user's own numbers before we replace them with ours below.
        _check_batch(config, shape.world_size, problems)

    # Batch sizes: always ours, so every scenario of an env sees the same data per step.
    for key in ("train_batch_size",):
        if key in config:
            notes.append(f"{key}: {config.pop(key)!r} -> derived from micro batch x ranks")
    _set(config, "train_micro_batch_size_per_gpu", DEFAULT_MICRO_BATCH, "", notes)
    _set(config, "gradient_accumulation_steps", 1, "", notes)

    zero = config.setdefault("zero_optimization", {})
    if zero.get("stage") != 3:
        _set(zero, "stage", 3, "zero_optimization.", notes)
    for key in _BUCKET_KEYS:
        if key in zero and float(zero[key]) > SMALL_BUCKET:
            _set(zero, key, SMALL_BUCKET, "zero_optimization.", notes)
    for key in _LIVE_KEYS:
        if key in zero and float(zero[key]) > SMALL_LIVE_PARAMS:
            _set(zero, key, SMALL_LIVE_PARAMS, "zero_optimization.", notes)
    if float(zero.get("stage3_param_persistence_threshold", 1e5)) > 0:
        _set(zero, "stage3_param_persistence_threshold", 0, "zero_optimization.", notes)

    # The scenario decides the sharding layout: a user's shard size sized for their cluster
    # cannot be kept on a 2-4 rank reproduction.
    if shape.shard_size is None:
        for key in ("mics_shard_size", "mics_hierarchical_params_gather"):
            if key in zero:
                notes.append(f"zero_optimization.{key}: {zero.pop(key)!r} -> removed (plain ZeRO-3 control)")
    else:
        _set(zero, "mics_shard_size", shape.shard_size, "zero_optimization.", notes)
        _set(zero, "mics_hierarchical_params_gather", shape.hierarchical, "zero_optimization.", notes)

    if dtype is not None and dtype != config_dtype(config):
        if user_config is not None:
            notes.append(f"precision: {config_dtype(config)} -> {dtype} (DTYPE=)")
        config.setdefault("fp16", {})["enabled"] = dtype == "fp16"
        config.setdefault("bf16", {})["enabled"] = dtype == "bf16"
    if "bf16" in config and not config["bf16"].get("enabled") and not config["bf16"]:
        config.pop("bf16")
    if "optimizer" not in config:
        config["optimizer"] = default_config()["optimizer"]
        notes.append("optimizer: (unset) -> Adam lr 1e-3 (the workload needs one)")
    return BuiltConfig(config=config, adaptations=adaptations, problems=problems)
