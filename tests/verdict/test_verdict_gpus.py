"""Issue 33 item 4: on 1 GPU every MiCS run is recorded `unsupported` (its shard group needs two
ranks), and the verdict read "no evidence (MiCS unsupported here)", as if DeepSpeed lacked MiCS.
The verdict now names the cause, the GPU count, and the smallest host that can test it; an env
whose DeepSpeed has no MiCS keeps its own words. Records are made from the suite's own plan."""

from __future__ import annotations

from typing import Any

from repro.core.verdict import TOO_FEW_DEVICES_FIX_WORDS, Reproduces, env_verdicts, reproduces_words
from repro.report.upgrade import upgrade_outcome
from repro.report.verdicts import UpgradeOutcome
from repro.workload import layout as lay
from repro.workload import record as rec
from repro.workload import suite

SCENARIOS = ["zero3", "mics", "mics-hier"]


def _records(env: str, device: str, count: int, *, no_mics: bool = False) -> list[dict[str, Any]]:
    """What the suite records on `count` GPUs (or ranks): unlaunched runs carry their skip reason,
    the control ran clean; with `no_mics` the MiCS runs had their layout but no MiCS to run."""
    layouts = lay.plan_layouts(device, count if device == "cpu" else None, count)
    transport = "native" if device == "gpu" else "async"
    planned = suite.plan(SCENARIOS, ["stock", "fixed"], "fp32", [transport], count, False, layouts)
    out = []
    for item in planned:
        record = rec.empty_record(
            env=env,
            scenario=item.scenario,
            patch=item.patch,
            dtype=item.dtype,
            world_size=item.shape.world_size,
            shard_size=item.shape.shard_size,
            hierarchical=item.shape.hierarchical,
            backend="nccl" if device == "gpu" else "gloo",
            transport=item.transport,
            run_name=f"{item.scenario}-{item.patch}-fp32-{item.transport}-w{item.shape.world_size}",
        )
        if item.skip is not None:
            record.update(outcome=item.skip[0], signature="none", reason=item.skip[1])
        elif no_mics and item.scenario != "zero3":
            record.update(outcome="unsupported", signature="none", reason="this DeepSpeed has no MiCS")
        else:
            record.update(outcome="clean", signature="none", reason="ran clean", losses=[2.5, 2.25])
        out.append(record)
    return out


def test_one_gpu_names_the_gpu_count_and_the_smallest_host() -> None:
    (verdict,) = env_verdicts(_records("rocm56", "gpu", 1))
    assert verdict.reproduces is Reproduces.TOO_FEW_DEVICES
    assert verdict.shortfall is not None
    assert (verdict.shortfall.have, verdict.shortfall.needs, verdict.shortfall.on_gpus) == (1, 2, True)
    text = verdict.reproduces_text
    assert "unsupported" not in text and "1 GPU" in text and "2 or more GPUs" in text
    assert verdict.fix_text == TOO_FEW_DEVICES_FIX_WORDS
    assert verdict.to_dict()["shortfall"] == {"have": 1, "needs": 2, "on_gpus": True}
    assert verdict.to_dict()["reproduces"] == "too-few-devices"
    # An upgrade to an env that only lacked GPUs is not "MiCS removed".
    assert upgrade_outcome(verdict.reproduces) is UpgradeOutcome.INCONCLUSIVE


def test_one_cpu_rank_names_world_size() -> None:
    (verdict,) = env_verdicts(_records("cpu", "cpu", 1))
    assert verdict.reproduces is Reproduces.TOO_FEW_DEVICES
    assert verdict.shortfall is not None and not verdict.shortfall.on_gpus
    assert "WORLD_SIZE=2" in verdict.reproduces_text


def test_no_mics_in_deepspeed_keeps_its_words() -> None:
    (verdict,) = env_verdicts(_records("cpu-ds0198", "gpu", 2, no_mics=True))
    assert verdict.reproduces is Reproduces.UNSUPPORTED and verdict.shortfall is None
    assert verdict.reproduces_text == reproduces_words(Reproduces.UNSUPPORTED)
    assert upgrade_outcome(verdict.reproduces) is UpgradeOutcome.MICS_REMOVED


def test_two_gpus_run_mics() -> None:
    (verdict,) = env_verdicts(_records("rocm56", "gpu", 2))
    assert verdict.reproduces is Reproduces.NO and verdict.shortfall is None
