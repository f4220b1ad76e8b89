"""The DeepSpeed config builder: scenario layout, adaptations of a user config, reported problems."""

from __future__ import annotations

import json
from pathlib import Path

from repro.workload import ds_config as dc

REPORTER = Path(__file__).resolve().parents[2] / "repro" / "configs" / "reporter_ds_config.json"


def shape(
    scenario: str = "mics", world: int = 4, shard: int | None = 4, hier: bool = False
) -> dc.ScenarioShape:
    return dc.ScenarioShape(scenario, world, shard, hier, 2)


def test_default_has_reporter_settings_and_shards_every_weight() -> None:
    built = dc.build_config(shape(), dtype="fp16")
    zero = built.config["zero_optimization"]
    assert zero["stage"] == 3 and zero["overlap_comm"] and zero["reduce_scatter"]
    assert zero["contiguous_gradients"] and zero["stage3_param_persistence_threshold"] == 0
    assert zero["mics_shard_size"] == 4 and zero["mics_hierarchical_params_gather"] is False
    fp16 = built.config["fp16"]
    assert fp16 == {
        "enabled": True,
        "loss_scale": 0,
        "initial_scale_power": 12,
        "loss_scale_window": 1000,
        "hysteresis": 2,
        "min_loss_scale": 1,
    }
    assert built.config["gradient_clipping"] == 1.0
    assert built.adaptations == [] and built.problems == []


def test_zero3_control_has_no_mics_keys() -> None:
    built = dc.build_config(shape("zero3", shard=None))
    assert "mics_shard_size" not in built.config["zero_optimization"]


def test_dtype_selection() -> None:
    assert dc.config_dtype(dc.build_config(shape(), dtype="bf16").config) == "bf16"
    assert dc.config_dtype(dc.build_config(shape(), dtype="fp32").config) == "fp32"


def test_reporter_config_is_adapted_and_its_batch_problem_reported() -> None:
    user = json.loads(REPORTER.read_text())
    built = dc.build_config(shape("mics-hier", hier=True), user_config=user)
    zero = built.config["zero_optimization"]
    # Kept: the user's communication and precision settings.
    assert built.config["fp16"]["enabled"] and built.config["comms_logger"]["enabled"]
    assert dc.config_dtype(built.config) == "fp16"
    # Adapted, and every adaptation listed.
    assert zero["reduce_bucket_size"] == dc.SMALL_BUCKET
    assert zero["mics_shard_size"] == 4 and zero["mics_hierarchical_params_gather"] is True
    joined = "\n".join(built.adaptations)
    for key in (
        "mics_shard_size",
        "mics_hierarchical_params_gather",
        "reduce_bucket_size",
        "stage3_param_persistence_threshold",
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
    ):
        assert key in joined, key
    # Not fixed silently: 8 != 1536 x accumulation x ranks.
    assert any("train_batch_size 8" in p for p in built.problems)
    # The user's dict is not modified.
    assert user["zero_optimization"]["mics_shard_size"] == 8


def test_consistent_user_config_has_no_problems() -> None:
    user = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3},
    }
    assert dc.build_config(shape(), user_config=user).problems == []
