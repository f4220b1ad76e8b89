"""Launchers for clusters without Docker: a Slurm batch script (Apptainer/Singularity) and torchrun.

    python -m repro cluster --out DIR                      the reporter's layout (2 nodes x 8 GPUs, shard 16)
    python -m repro cluster --out DIR --layout cpu-twin    1 node, 4 CPU ranks (hier: MiCS told 2 per node)

Writes DIR/<job>.sbatch, DIR/launch-node.sh (what every node runs: torchrun with c10d rendezvous,
inside the image), DIR/configs/<run>.json (each run's DeepSpeed config, built by the same code as
the suite's), DIR/summarize.py and DIR/README.md. Bundles carry them in cluster/. The runs are
the control (plain ZeRO-3), hierarchical MiCS, flat MiCS and MiCS with replica groups (the
reporter's config: shard 8 on 2 x 8 GPUs), stock and with the fix.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from repro import __version__
from repro.core import safe_write, script_values, templating
from repro.core.errors import UsageError
from repro.workload import ds_config
from repro.workload import layout as lay
from repro.workload.defaults import DEFAULT_SEED, DEFAULT_STEPS
from repro.workload.suite import DEFAULT_STALL_S, DEFAULT_TIMEOUT_S

TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "cluster"
SUMMARY_SOURCE = Path(__file__).resolve().parent / "summary.py"
PLATFORMS = ("rocm", "cuda", "cpu")
# The files `write` wrote into OUT= (so a second run replaces only those).
MANIFEST = ".cluster-files.json"


@dataclass(frozen=True)
class Layout:
    """Where the ranks go: `nodes` machines with `procs_per_node` ranks each (one per GPU). Each
    scenario's shard size and what MiCS is told a node holds (NDEV_PER_NODE) come from the planner
    the suite uses (repro/workload/layout.py), so the two cannot drift; `shard_size` and
    `ndev_per_node`, when given, override the planner's for the MiCS runs (--shard-size,
    --ndev-per-node)."""

    platform: str
    nodes: int
    procs_per_node: int
    dtype: str
    shard_size: int | None = None
    ndev_per_node: int | None = None
    steps: int = DEFAULT_STEPS
    seed: int = DEFAULT_SEED
    port: int = 29500
    transport: str = "async"

    @property
    def device(self) -> str:
        return "cpu" if self.platform == "cpu" else "gpu"

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def plan(self) -> lay.LayoutPlan:
        """The planner's layouts for these ranks: CPU ranks on one host (MiCS nodes emulated), or
        `procs_per_node` GPUs on each of `nodes` real nodes."""
        try:
            if self.device == "cpu":
                return lay.plan_layouts("cpu", self.world_size)
            return lay.plan_layouts("gpu", gpus_per_node=self.procs_per_node, nodes=self.nodes)
        except lay.LayoutError as exc:
            raise UsageError(f"the cluster layout cannot run: {exc}") from None

    def shape(self, scenario: str) -> ds_config.ScenarioShape:
        """One scenario's shape: the planner's, with the overrides applied to the MiCS runs."""
        planned = self.plan().get(scenario)
        shard = planned.shard_size
        ndev = planned.devices_per_node
        # mics-replica keeps the planner's shard (half the world): the overrides would merge its
        # replica groups into one.
        if shard is not None and scenario != "mics-replica":
            shard = self.shard_size or shard
            ndev = self.ndev_per_node or ndev
        return ds_config.ScenarioShape(scenario, planned.world_size, shard, planned.hierarchical, ndev)

    def describe(self) -> str:
        unit = "CPU ranks" if self.device == "cpu" else "GPUs"
        parts = [f"{self.nodes} node(s) x {self.procs_per_node} {unit}"]
        for scenario in sorted({run.scenario for run in RUNS if run.scenario != "zero3"}):
            shape = self.shape(scenario)
            text = f"{scenario} shard {shape.shard_size}"
            if shape.nodes > 1:
                emulated = "emulated " if shape.nodes > self.nodes else ""
                text += f" over {shape.nodes} {emulated}MiCS nodes of {shape.devices_per_node}"
            parts.append(text)
        return ", ".join([*parts, self.dtype])

    def check(self) -> None:
        if self.platform not in PLATFORMS:
            raise UsageError(f"platform {self.platform!r} is not one of {', '.join(PLATFORMS)}")
        overrides = [value for value in (self.shard_size, self.ndev_per_node) if value is not None]
        if min(self.nodes, self.procs_per_node, *overrides) < 1:
            raise UsageError("nodes, ranks per node, devices per node and shard size must be positive")
        plan = self.plan()
        if plan.used != self.world_size:  # the planner would leave ranks out (an odd count per node)
            raise UsageError(
                f"{self.procs_per_node} ranks per node: {'; '.join(plan.notes)}",
                fix="use an even number of ranks per node",
            )
        for scenario in sorted({run.scenario for run in RUNS}):
            if not plan.get(scenario).supported:
                raise UsageError(
                    f"{scenario} needs {plan.get(scenario).needs} ranks; this layout has {self.world_size}"
                )
            shape = self.shape(scenario)
            if shape.shard_size is None:
                continue
            if self.world_size % shape.shard_size or self.world_size % shape.devices_per_node:
                raise UsageError(
                    f"{self.world_size} ranks cannot be split into shards of {shape.shard_size} "
                    f"and nodes of {shape.devices_per_node}"
                )
            if shape.hierarchical and shape.shard_size <= shape.devices_per_node:
                # DeepSpeed's mics_utils asserts the hierarchical gather's shard group spans > 1 node.
                raise UsageError(
                    f"shard size {shape.shard_size} fits in one node of {shape.devices_per_node}: "
                    "the hierarchical gather needs a shard group spanning more than one node",
                    fix="use a shard size larger than the devices per node",
                )


# The reporter's cluster (2 nodes x 8 MI-series GPUs, fp16) and its CPU twin (4 ranks on one
# host); the shard sizes and MiCS node sizes are the planner's.
REPORTER = Layout("rocm", nodes=2, procs_per_node=8, dtype="fp16")
CPU_TWIN = Layout("cpu", nodes=1, procs_per_node=4, dtype="fp32")
LAYOUTS = {"reporter": REPORTER, "cpu-twin": CPU_TWIN}


@dataclass(frozen=True)
class ClusterRun:
    name: str
    scenario: str
    patch: str


RUNS = (
    ClusterRun("zero3-stock", "zero3", "stock"),
    ClusterRun("mics-hier-stock", "mics-hier", "stock"),
    ClusterRun("mics-hier-fixed", "mics-hier", "fixed"),
    ClusterRun("mics-stock", "mics", "stock"),
    ClusterRun("mics-fixed", "mics", "fixed"),
    # The reporter's own config on 2 x 8 GPUs (shard 8, two replica groups; docs/how-it-works.md layouts).
    ClusterRun("mics-replica-stock", "mics-replica", "stock"),
    ClusterRun("mics-replica-fixed", "mics-replica", "fixed"),
)


def docker_cli_pairs(platform: str) -> list[tuple[str, str]]:
    """`docker run` (flag, value) pairs for the platform's devices, as the Docker engine passes them."""
    from repro.engines.docker.engine import run_options

    return run_options(platform, ()).cli_pairs()


def passthrough_pattern() -> str:
    """The pass-through allowlist (repro/engines/passthrough.py) as one bash `case` pattern."""
    from repro.engines.passthrough import PASSTHROUGH_NAMES, PASSTHROUGH_PREFIXES

    return " | ".join([*PASSTHROUGH_NAMES, *(f"{prefix}*" for prefix in PASSTHROUGH_PREFIXES)])


def job_time_limit(runs: int, timeout_s: float, margin_s: float = 900) -> str:
    """sbatch --time for `runs` runs of at most `timeout_s` each (+60 s to start and stop each), plus
    `margin_s` for building the Apptainer image once: H:MM:SS, rounded up to a minute."""
    minutes = -(-int(runs * (timeout_s + 60) + margin_s) // 60)
    return f"{minutes // 60}:{minutes % 60:02d}:00"


def docker_cli_flags(platform: str) -> list[str]:
    return [token for pair in docker_cli_pairs(platform) for token in pair]


@dataclass(frozen=True)
class Script:
    path: str
    text: str
    executable: bool = False


def render(
    layout: Layout,
    *,
    env_id: str,
    image_ref: str,
    image_file: str = "image.tar.gz",
    time_limit: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    stall_s: float = DEFAULT_STALL_S,
) -> list[Script]:
    """`timeout_s`/`stall_s`: each run's limits (the suite's defaults); `time_limit`: the job's, by
    default enough for every run to use its whole limit."""
    layout.check()
    # Each of these is written into the scripts (job name, image paths, #SBATCH --time): checked
    # against its grammar here, and quoted or refused again by the templates' filters.
    script_values.name(env_id, "the env id (ENV=, --env)")
    script_values.image_ref(image_ref, "the image reference (--image-ref)")
    script_values.name(image_file, "the image file name")
    if time_limit is not None:
        script_values.slurm_time(time_limit, "the job's time limit")
    env = templating.environment(TEMPLATES, filters=script_values.script_filters())
    sbatch_name = f"mics-{'cpu-twin' if layout.device == 'cpu' else 'hier'}.sbatch"
    # launch-node.sh passes --ipc host itself.
    device_pairs = [pair for pair in docker_cli_pairs(layout.platform) if pair[0] != "--ipc"]
    context = dict(
        layout=layout,
        env_id=env_id,
        image_ref=image_ref,
        image_file=image_file,
        sif_name=f"mics-repro-{env_id}.sif",
        sbatch_name=sbatch_name,
        runs=RUNS,
        ndev_by_scenario=[
            (scenario, layout.shape(scenario).devices_per_node)
            for scenario in dict.fromkeys(run.scenario for run in RUNS)
        ],
        tool_version=__version__,
        time_limit=time_limit or job_time_limit(len(RUNS), timeout_s),
        timeout_s=f"{timeout_s:g}",
        stall_s=f"{stall_s:g}",
        passthrough_pattern=passthrough_pattern(),
        passthrough_doc="*_VISIBLE_DEVICES, NCCL_*, RCCL_*, HSA_*, MIOPEN_*",
        docker_device_flags=device_pairs,
    )
    scripts = [
        Script(sbatch_name, env.get_template("job.sbatch.j2").render(**context), executable=True),
        Script("launch-node.sh", env.get_template("launch-node.sh.j2").render(**context), executable=True),
        Script("summarize.py", SUMMARY_SOURCE.read_text(), executable=True),
        Script("README.md", env.get_template("README.md.j2").render(**context)),
    ]
    for run in RUNS:
        config = ds_config.build_config(layout.shape(run.scenario), dtype=layout.dtype).config
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        scripts.append(Script(f"configs/{run.name}.json", text))
    return scripts


def write(scripts: Sequence[Script], out: Path) -> list[Path]:
    """The launchers in OUT=: a new or empty folder, or one this command wrote before (its
    manifest lists the files it may replace or, when the layout no longer has them, remove)."""
    out = safe_write.claim_folder(Path(out), option="OUT", owned_by=(MANIFEST,))
    earlier = safe_write.read_manifest(out, MANIFEST)
    now = [script.path for script in scripts]
    safe_write.check_writable(out, now, earlier)  # refused before the manifest claims anything
    # Listed before they are written: a run cut short still names every file it may have left.
    safe_write.write_manifest(out, MANIFEST, [*earlier, *now])
    written = [
        safe_write.write_file(
            out, s.path, s.text.encode(), replace=s.path in earlier, executable=s.executable
        )
        for s in scripts
    ]
    for stale in sorted(earlier - set(now)):
        safe_write.remove_file(out, stale)
    safe_write.write_manifest(out, MANIFEST, now)
    return written
