"""The layout planner (repro/workload/layout.py): every GPU count from 1 to 16 and two real nodes,
the reporter's 8-GPU node, CPU unchanged, and the docs' table generated from the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from repro.workload import layout as lay
from repro.workload.record import SCENARIOS
from tests.fixtures.layouts import layout_shapes, reporter_layouts

LAYOUT_DOC = Path(__file__).resolve().parents[2] / "docs" / "how-it-works.md"


def _check_layout(layout: lay.Layout, ranks: int, nodes: int) -> None:
    """What DeepSpeed needs of each layout, so that no run can fail for the layout's sake."""
    assert layout.world_size == ranks
    if not layout.supported:
        assert layout.needs > ranks and layout.shard_size is None
        return
    assert layout.world_size % layout.devices_per_node == 0
    assert layout.real_nodes == nodes
    if layout.scenario == "zero3":
        assert layout.shard_size is None and not layout.hierarchical
        return
    assert layout.shard_size is not None and layout.shard_size >= 2
    assert layout.world_size % layout.shard_size == 0
    if layout.scenario == "mics":
        assert layout.shard_size == layout.world_size and not layout.hierarchical
    if layout.scenario == "mics-hier":
        # mics_utils asserts the hierarchical shard group spans more than one node
        assert layout.hierarchical and layout.shard_size // layout.devices_per_node > 1
    if layout.scenario == "mics-replica":
        assert layout.world_size // layout.shard_size == 2 and not layout.hierarchical


@pytest.mark.parametrize("gpus", range(1, 17))
def test_every_gpu_count_on_one_node(gpus: int) -> None:
    plan = lay.plan_layouts("gpu", gpus_per_node=gpus)
    used = gpus if gpus == 1 or gpus % 2 == 0 else gpus - 1  # the largest even subset
    assert plan.used == used and plan.available == gpus
    assert (gpus > 1 and gpus % 2 == 1) == any("largest even subset" in n for n in plan.notes)
    for layout in plan.layouts:
        _check_layout(layout, used, 1)
        assert layout.supported == (used >= lay.MIN_GPU_RANKS[layout.scenario])
        if not layout.supported:
            assert any(n.startswith(f"{layout.scenario}: unsupported") for n in plan.notes)
    assert plan.get("zero3").supported  # the control always runs


@pytest.mark.parametrize("nodes, per_node", [(2, 8), (2, 4), (4, 8), (2, 1), (2, 7)])
def test_real_nodes(nodes: int, per_node: int) -> None:
    plan = lay.plan_layouts("gpu", gpus_per_node=per_node, nodes=nodes)
    even = per_node if per_node == 1 or per_node % 2 == 0 else per_node - 1
    for layout in plan.layouts:
        _check_layout(layout, even * nodes, nodes)
        if layout.supported:
            assert not layout.emulated  # real nodes: nothing emulated


def test_the_reporters_node_and_cluster() -> None:
    node = lay.plan_layouts("gpu", gpus_per_node=8)
    assert (node.get("mics").world_size, node.get("mics").shard_size, node.get("mics").nodes) == (8, 8, 1)
    hier = node.get("mics-hier")
    assert (hier.shard_size, hier.nodes, hier.devices_per_node, hier.emulated) == (8, 2, 4, True)
    assert (node.get("mics-replica").world_size, node.get("mics-replica").shard_size) == (8, 4)
    cluster = lay.plan_layouts("gpu", gpus_per_node=8, nodes=2)
    assert cluster.get("mics-replica").shard_size == 8  # the reporter's config: shard 8 on 2 x 8
    assert (cluster.get("mics-hier").nodes, cluster.get("mics-hier").devices_per_node) == (2, 8)


def test_small_counts_say_what_they_need() -> None:
    one = lay.plan_layouts("gpu", gpus_per_node=1)
    assert {s: one.get(s).needs for s in SCENARIOS} == {
        "zero3": 0,
        "mics": 2,
        "mics-hier": 2,
        "mics-replica": 4,
    }
    assert one.get("mics").describe() == "unsupported: needs 2 GPUs"
    two = lay.plan_layouts("gpu", gpus_per_node=2)
    assert two.get("mics-hier").supported and two.get("mics-hier").devices_per_node == 1
    assert two.get("mics-replica").needs == 4


def test_world_size_chooses_a_subset_and_may_not_exceed_the_gpus() -> None:
    plan = lay.plan_layouts("gpu", world_size=4, gpus_per_node=8)
    assert plan.used == 4 and plan.get("mics-hier").devices_per_node == 2
    with pytest.raises(lay.LayoutError, match="WORLD_SIZE=16 .* 8 GPU"):
        lay.plan_layouts("gpu", world_size=16, gpus_per_node=8)
    assert lay.check_world_size(16, 8) is not None and lay.check_world_size(8, 8) is None
    assert lay.check_world_size(None, 1) is None
    with pytest.raises(lay.LayoutError):
        lay.plan_layouts("gpu", gpus_per_node=0)


def test_cpu_keeps_the_layout_it_always_had() -> None:
    plan = lay.plan_layouts("cpu")
    assert layout_shapes(plan.layouts) == reporter_layouts(4)
    assert plan.get("mics-hier").how("cpu") == (
        "2 nodes emulated on one host: NDEV_PER_NODE/LOCAL_SIZE=2 with world size 4"
    )
    one = lay.plan_layouts("cpu", 1)
    assert one.get("zero3").supported and one.get("mics").needs == 2 and one.get("mics-replica").needs == 2
    two = lay.plan_layouts("cpu", 2)
    assert two.get("mics-hier").devices_per_node == 1 and two.get("mics-replica").shard_size == 1


def test_docs_table_is_generated_from_the_code() -> None:
    text = LAYOUT_DOC.read_text()
    found = re.search(r"<!-- layout-table:start[^>]*-->\n(.*?)\n<!-- layout-table:end -->", text, re.S)
    assert found, "docs/how-it-works.md lacks the generated layout table markers"
    assert found.group(1).strip() == lay.render_table().strip(), (
        "docs/how-it-works.md's layout table is stale: regenerate it with `python -m repro.workload.layout`"
    )
    rows = lay.render_table().splitlines()[2:]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == [c[0] for c in lay.TABLE_CASES]
