"""How each scenario lays its ranks out on the devices a run has: pure, no torch.

One rank per GPU on GPUs; on CPU the ranks are processes and WORLD_SIZE chooses their number
(default 4, the layout this lab has always used there). The suite plans its runs from here, the
table of layouts in docs/how-it-works.md is rendered from here (`python -m repro.workload.layout`), and the
cluster scripts can ask for several real nodes.

Rules on GPUs (N visible on each of `nodes` nodes):
- Every scenario uses the same ranks: all GPUs, or WORLD_SIZE of them. An odd count above one
  uses the largest even subset (the MiCS scenarios split the ranks in halves) and says so.
- `zero3`: plain ZeRO-3 over every rank (the control).
- `mics`: one flat shard group over every rank (8 GPUs: shard 8, the reporter's node).
- `mics-hier`: the same shard with the hierarchical gather, which DeepSpeed only takes when the
  shard group spans more than one node (mics_utils asserts it). On one host two nodes are
  emulated by telling MiCS a node holds half the ranks (NDEV_PER_NODE; 8 GPUs: 2 nodes of 4).
- `mics-replica`: shard groups of half the ranks, so there are two replica groups (8 GPUs:
  world 8, shard 4; 2 nodes x 8: shard 8, which is the reporter's own layout).
A scenario that needs more ranks than there are is `unsupported` with the number it needs:
its gather needs a group of at least two ranks (`mics`, `mics-hier`: 2 GPUs), and replica
groups need two shards of at least two (`mics-replica`: 4 GPUs). Such a run is never launched,
so it cannot be counted as a failure of the fix.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from repro.workload.defaults import DEFAULT_WORLD_SIZE
from repro.workload.record import SCENARIOS

# Ranks each scenario needs on GPUs to exercise what it is named after (see the module doc).
MIN_GPU_RANKS = {"zero3": 1, "mics": 2, "mics-hier": 2, "mics-replica": 4}
# On CPU (processes, not GPUs) a MiCS scenario only needs a group to gather over: mics-replica's
# two replica groups may hold one rank each.
MIN_CPU_RANKS = {**MIN_GPU_RANKS, "mics-replica": 2}


class LayoutError(ValueError):
    """The request cannot be laid out at all (e.g. WORLD_SIZE above the GPU count)."""


@dataclass(frozen=True)
class Layout:
    scenario: str
    world_size: int  # ranks torchrun starts (one per GPU on GPUs)
    shard_size: int | None  # MiCS shard size; None for zero3 and for unsupported runs
    hierarchical: bool
    devices_per_node: int  # what MiCS is told a node holds (NDEV_PER_NODE / LOCAL_SIZE)
    real_nodes: int = 1  # machines the ranks really run on
    needs: int = 0  # > 0: unsupported here; the GPUs this scenario needs

    @property
    def supported(self) -> bool:
        return self.needs == 0

    @property
    def nodes(self) -> int:
        """Nodes MiCS sees; more than `real_nodes` when nodes are emulated on one host."""
        return max(self.world_size // max(self.devices_per_node, 1), 1)

    @property
    def emulated(self) -> bool:
        return self.nodes > self.real_nodes

    def how(self, device: str) -> str:
        """The record's layout["how"]: how a multi-node layout was made."""
        if self.nodes <= 1:
            return "one node"
        if not self.emulated:
            return f"{self.nodes} nodes of {self.devices_per_node}"
        if device == "cpu":
            return (
                f"{self.nodes} nodes emulated on one host: "
                f"NDEV_PER_NODE/LOCAL_SIZE={self.devices_per_node}"
                f" with world size {self.world_size}"
            )
        return f"{self.nodes} nodes emulated on one host: NDEV_PER_NODE={self.devices_per_node}"

    def describe(self, device: str = "gpu") -> str:
        """One table cell: what runs, or why nothing does."""
        unit = "GPUs" if device == "gpu" else "ranks"
        if not self.supported:
            return f"unsupported: needs {self.needs} {unit}"
        text = f"world {self.world_size}"
        if self.shard_size is None:
            return text
        text += f", shard {self.shard_size}"
        if self.hierarchical and self.nodes > 1:
            kind = "emulated nodes" if self.emulated else "nodes"
            text += f" over {self.nodes} {kind} of {self.devices_per_node}"
        replicas = self.world_size // self.shard_size
        if replicas > 1:
            text += f" ({replicas} replica groups)"
        return text


@dataclass(frozen=True)
class LayoutPlan:
    device: str
    available: int  # GPUs seen (all nodes), or the CPU ranks asked for
    used: int  # ranks the layouts use
    layouts: tuple[Layout, ...]
    notes: tuple[str, ...] = ()

    def get(self, scenario: str) -> Layout:
        for layout in self.layouts:
            if layout.scenario == scenario:
                return layout
        raise KeyError(scenario)


def check_world_size(requested: int | None, gpus: int) -> str | None:
    """Why WORLD_SIZE cannot run on `gpus` GPUs (one rank per GPU), or None. For preflight too."""
    if requested is not None and requested > gpus:
        return (
            f"WORLD_SIZE={requested} asks for more ranks than the {gpus} GPU(s) this env sees "
            f"(one rank per GPU): set WORLD_SIZE<={gpus}, or leave it unset to use them all"
        )
    return None


def cpu_layout(scenario: str, world: int) -> Layout:
    """CPU: the layout this lab has always used (docs/how-it-works.md); WORLD_SIZE chooses `world`."""
    return gpu_layout(scenario, world, 1, MIN_CPU_RANKS)


def gpu_layout(scenario: str, per_node: int, nodes: int, minimum: dict[str, int] = MIN_GPU_RANKS) -> Layout:
    """GPUs: `per_node` ranks (already even, or 1) on each of `nodes` real nodes."""
    world = per_node * nodes
    if scenario not in minimum:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    if world < minimum[scenario]:
        return Layout(
            scenario, world, None, scenario == "mics-hier", per_node, nodes, needs=minimum[scenario]
        )
    if scenario == "zero3":
        return Layout(scenario, world, None, False, per_node, nodes)
    if scenario == "mics":
        return Layout(scenario, world, world, False, per_node, nodes)
    if scenario == "mics-hier":
        # Real nodes already give a shard group spanning them; one host emulates two.
        return Layout(scenario, world, world, True, per_node if nodes > 1 else world // 2, nodes)
    return Layout(scenario, world, world // 2, False, per_node, nodes)


def plan_layouts(
    device: str,
    world_size: int | None = None,
    gpus_per_node: int = 0,
    nodes: int = 1,
) -> LayoutPlan:
    """Every scenario's layout. CPU: `world_size` ranks (default 4). GPU: `gpus_per_node` GPUs on
    each of `nodes` nodes, or `world_size` of them. Raises LayoutError for what cannot run at all."""
    if device == "cpu":
        world = world_size or DEFAULT_WORLD_SIZE
        return LayoutPlan("cpu", world, world, tuple(cpu_layout(s, world) for s in SCENARIOS))
    if nodes < 1 or gpus_per_node < 1:
        raise LayoutError(f"no GPU to lay ranks out on ({gpus_per_node} per node, {nodes} node(s))")
    total = gpus_per_node * nodes
    problem = check_world_size(world_size, total)
    if problem:
        raise LayoutError(problem)
    notes: list[str] = []
    per_node = gpus_per_node
    if world_size is not None:
        if world_size % nodes:
            raise LayoutError(f"WORLD_SIZE={world_size} does not split evenly over {nodes} nodes")
        per_node = world_size // nodes
    if per_node > 1 and per_node % 2:
        # The MiCS scenarios halve the ranks (shard groups, emulated nodes): an odd count cannot.
        notes.append(
            f"{per_node} GPUs per node: using {per_node - 1}, the largest even subset "
            f"(the MiCS scenarios split the ranks in halves)"
        )
        per_node -= 1
    layouts = tuple(gpu_layout(s, per_node, nodes) for s in SCENARIOS)
    used = per_node * nodes
    notes += [
        f"{x.scenario}: unsupported with {used} GPU(s), needs {x.needs}" for x in layouts if not x.supported
    ]
    return LayoutPlan("gpu", total, used, layouts, tuple(notes))


# -- the docs' table -------------------------------------------------------------------------------
# (label, GPUs per node, nodes): the cases docs/how-it-works.md shows.
TABLE_CASES = (
    ("1 GPU", 1, 1),
    ("2 GPUs", 2, 1),
    ("4 GPUs", 4, 1),
    ("8 GPUs", 8, 1),
    ("16 GPUs", 16, 1),
    ("2 nodes x 8 GPUs", 8, 2),
)


def render_table(cases: Sequence[tuple[str, int, int]] = TABLE_CASES) -> str:
    """Markdown: one row per case, one column per scenario."""
    lines = ["| GPUs | " + " | ".join(f"`{s}`" for s in SCENARIOS) + " |", "|---|" + "---|" * len(SCENARIOS)]
    for label, per_node, nodes in cases:
        plan = plan_layouts("gpu", gpus_per_node=per_node, nodes=nodes)
        lines.append(f"| {label} | " + " | ".join(plan.get(s).describe() for s in SCENARIOS) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.workload.layout", description=__doc__.splitlines()[0])
    p.add_argument(
        "--gpus", type=int, help="GPUs per node (default: print the table of docs/how-it-works.md)"
    )
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--world-size", type=int)
    args = p.parse_args(argv)
    if args.gpus is None:
        print(render_table())
        return 0
    try:
        plan = plan_layouts("gpu", args.world_size, args.gpus, args.nodes)
    except LayoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for layout in plan.layouts:
        print(f"{layout.scenario:<13} {layout.describe()}")
    for note in plan.notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
