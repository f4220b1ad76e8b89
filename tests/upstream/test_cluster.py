"""Cluster launchers: what they contain, that shellcheck accepts them, and that their logic runs.

The launch logic is exercised for real where this machine allows: the batch script runs under
bash with stand-ins for `srun`, `scontrol` and `apptainer` that record what they were asked to do,
and launch-node.sh runs with a recording `python` (default tier, `real_subprocess`). The CPU twin
runs for real through launch-node.sh with a real venv (torchrun, c10d rendezvous) in
tests/upstream/test_cluster_integration.py, in the env's image in
tests/upstream/test_cluster_docker.py, and through a real `sbatch` when a Slurm controller answers
on this host in tests/upstream/test_cluster_slurm.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from repro.core.errors import UsageError
from repro.upstream.cluster import scripts as cluster
from repro.upstream.cluster import summary as cluster_summary
from repro.workload import layout as lay
from repro.workload import suite as workload_suite
from repro.workload.defaults import DEFAULT_STEPS
from tests.fixtures.cluster_twin import BASH, written


def test_reporter_layout_is_two_nodes_of_eight_gpus_with_shard_16(tmp_path: Path) -> None:
    out = written(tmp_path, cluster.REPORTER)
    sbatch = (out / "mics-hier.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in sbatch and "#SBATCH --gpus-per-node=8\n" in sbatch
    assert "docker-archive://$scratch/image.tar" in sbatch and '"$RUNTIME" build "$SIF"' in sbatch
    launch = (out / "launch-node.sh").read_text()
    assert "--rdzv_backend c10d" in launch and '--rdzv_endpoint "$head_address:$PORT"' in launch
    # the device nodes, not --rocm: torch's wheel ignores its library path ($ORIGIN rpaths)
    assert "flags+=(--bind /dev/kfd --bind /dev/dri)" in launch and "--nv" not in launch
    assert "(--rocm)" not in launch and "MICS_REPRO_HOST_ROCM=" in launch
    assert os.access(out / "launch-node.sh", os.X_OK) and os.access(out / "mics-hier.sbatch", os.X_OK)

    hier = json.loads((out / "configs" / "mics-hier-stock.json").read_text())["zero_optimization"]
    assert hier["mics_shard_size"] == 16 and hier["mics_hierarchical_params_gather"] is True
    flat = json.loads((out / "configs" / "mics-fixed.json").read_text())["zero_optimization"]
    assert flat["mics_shard_size"] == 16 and flat["mics_hierarchical_params_gather"] is False
    control = json.loads((out / "configs" / "zero3-stock.json").read_text())
    assert "mics_shard_size" not in control["zero_optimization"] and control["fp16"]["enabled"] is True
    # the reporter's own config (README's 2 x 8 row): shard 8, two replica groups, stock and fixed
    for patch in ("stock", "fixed"):
        replica = json.loads((out / "configs" / f"mics-replica-{patch}.json").read_text())[
            "zero_optimization"
        ]
        assert replica["mics_shard_size"] == 8 and replica["mics_hierarchical_params_gather"] is False
        assert f'mics-replica-{patch}) echo "mics-replica {patch}" ;;' in sbatch


@pytest.mark.parametrize("name", sorted(cluster.LAYOUTS))
def test_cluster_layouts_are_the_suites_planner(tmp_path: Path, name: str) -> None:
    """Every run's config and NDEV_PER_NODE come from repro/workload/layout.py, as the suite's do."""
    layout = cluster.LAYOUTS[name]
    plan = (
        lay.plan_layouts("cpu", layout.world_size)
        if layout.device == "cpu"
        else lay.plan_layouts("gpu", gpus_per_node=layout.procs_per_node, nodes=layout.nodes)
    )
    out = written(tmp_path, layout, "cpu" if layout.device == "cpu" else "rocm56")
    launch = (out / "launch-node.sh").read_text()
    for run in cluster.RUNS:
        planned = plan.get(run.scenario)
        assert layout.shape(run.scenario) == workload_suite.shape_of(planned)
        config = json.loads((out / "configs" / f"{run.name}.json").read_text())["zero_optimization"]
        assert config.get("mics_shard_size") == planned.shard_size
        assert f"    {run.scenario}) planned_ndev={planned.devices_per_node} ;;" in launch


@pytest.mark.parametrize(
    "change,message",
    [
        ({"procs_per_node": 3}, "even number of ranks per node"),
        ({"procs_per_node": 1, "nodes": 1}, "needs 2 ranks"),
        ({"nodes": 0}, "must be positive"),
    ],
)
def test_layouts_the_planner_cannot_serve_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        replace(cluster.REPORTER, **change).check()  # type: ignore[arg-type]


def test_cuda_layout_asks_for_nvidia_devices(tmp_path: Path) -> None:
    out = written(tmp_path, replace(cluster.REPORTER, platform="cuda"), "cuda")
    launch = (out / "launch-node.sh").read_text()
    assert "flags+=(--nv)" in launch and 'flags+=("--gpus" "all")' in launch and "/dev/kfd" not in launch


@pytest.mark.parametrize(
    "change,message",
    [
        ({"shard_size": 8}, "spanning more than one node"),
        ({"shard_size": 12}, "cannot be split"),
        ({"platform": "tpu"}, "is not one of"),
    ],
)
def test_impossible_layouts_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        replace(cluster.REPORTER, **change).check()  # type: ignore[arg-type]


@pytest.mark.parametrize("layout", ["reporter", "cpu-twin", "cuda"])
def test_generated_scripts_pass_shellcheck(tmp_path: Path, layout: str, real_subprocess: None) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    chosen = replace(cluster.REPORTER, platform="cuda") if layout == "cuda" else cluster.LAYOUTS[layout]
    out = written(tmp_path, chosen)
    scripts = sorted(str(p) for p in out.iterdir() if p.suffix in (".sh", ".sbatch"))
    proc = subprocess.run(
        ["shellcheck", "--severity=style", "--shell=bash", *scripts], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout


# ---- the launch logic, run for real with recording stand-ins ------------------------------------

RECORDER = """#!/usr/bin/env bash
# Records one call per line: the tool's name, then its arguments, tab-separated.
printf '%s' "$(basename "$0")" >> "$CALLS"
for arg in "$@"; do printf '\\t%s' "$arg" >> "$CALLS"; done
printf '\\n' >> "$CALLS"
"""


def stub(bin_dir: Path, name: str, body: str = "") -> None:
    path = bin_dir / name
    path.write_text(RECORDER + body)
    path.chmod(0o755)


def calls(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def launch_node(
    tmp_path: Path, out: Path, tool: tuple[str, str], argv: list[str], **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The written launch-node.sh run for real for the run folder of `argv`'s scenario and patch
    (runs/<scenario>-<patch>, a ds_config.json in it), with `argv` after that folder: `tool` (its
    name, the body after the recorder) the one stand-in on PATH, its calls in tmp_path/calls, the
    variables `env` added to this process's. Returns the finished script and the run folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub(bin_dir, *tool)
    run_dir = tmp_path / "runs" / f"{argv[0]}-{argv[1]}"
    run_dir.mkdir(parents=True)
    (run_dir / "ds_config.json").write_text("{}")
    environ = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(tmp_path / "calls"), **env)
    proc = subprocess.run(
        [BASH, str(out / "launch-node.sh"), str(run_dir), *argv], env=environ, capture_output=True, text=True
    )
    return proc, run_dir


def test_launch_node_runs_torchrun_with_rendezvous_and_layout(tmp_path: Path, real_subprocess: None) -> None:
    out = written(tmp_path, cluster.CPU_TWIN, "cpu")
    proc, run_dir = launch_node(
        tmp_path,
        out,
        (
            "python",
            'env | grep -E "^(NDEV_PER_NODE|LOCAL_SIZE|DS_ACCELERATOR|PYTHONPATH)=" | sort > "$CALLS.env"\n',
        ),
        ["mics-hier", "stock", "node-a", "job7-mics-hier-stock"],
        RUNTIME="none",
        PYTHON=str(tmp_path / "bin" / "python"),
        REPRO_SRC="/src/mics-repro",
    )
    assert proc.returncode == 0, proc.stderr
    (call,) = calls(tmp_path / "calls")
    assert call[:2] == ["python", "-m"] and call[2] == "torch.distributed.run"
    args = call[3:]
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--nnodes"] == "1" and pairs["--nproc_per_node"] == "4"
    assert pairs["--rdzv_backend"] == "c10d" and pairs["--rdzv_endpoint"] == "node-a:29500"
    assert pairs["--rdzv_id"] == "job7-mics-hier-stock"
    i = args.index("repro.workload.train")
    train = dict(zip(args[i + 1 :: 2], args[i + 2 :: 2]))
    assert train == {
        "--run-dir": str(run_dir),
        "--ds-config": f"{run_dir}/ds_config.json",
        "--scenario": "mics-hier",
        "--patch": "stock",
        "--steps": str(DEFAULT_STEPS),
        "--seed": "1234",
        "--device": "cpu",
        "--transport": "async",
    }
    assert (tmp_path / "calls.env").read_text().split() == [
        "DS_ACCELERATOR=cpu",
        "LOCAL_SIZE=2",
        "NDEV_PER_NODE=2",
        "PYTHONPATH=/src/mics-repro",
    ]


def test_launch_node_refuses_a_run_dir_without_config(tmp_path: Path, real_subprocess: None) -> None:
    out = written(tmp_path, cluster.CPU_TWIN, "cpu")
    proc = subprocess.run(
        [BASH, str(out / "launch-node.sh"), str(tmp_path), "mics", "stock", "h"],
        capture_output=True,
        text=True,
        env=dict(os.environ, RUNTIME="none"),
    )
    assert proc.returncode == 2 and "ds_config.json not found" in proc.stderr


def test_batch_script_builds_the_image_once_and_runs_every_run_on_every_node(
    tmp_path: Path, real_subprocess: None
) -> None:
    out = written(tmp_path, cluster.REPORTER)
    bundle_dir = out.parent
    import gzip

    (bundle_dir / "image.tar.gz").write_bytes(gzip.compress(b"docker save output"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub(bin_dir, "scontrol", "echo gpu-node-01; echo gpu-node-02\n")
    # srun stands in for the nodes: it runs the task once and fails it for stock MiCS runs.
    stub(
        bin_dir,
        "srun",
        'while [[ "$1" == --* ]]; do shift; done\n'
        'case "$3" in mics-hier) [ "$4" = stock ] && exit 1 ;; esac\nexit 0\n',
    )
    stub(
        bin_dir,
        "apptainer",
        '[ "$1" = build ] && { cmp -s "${3#docker-archive://}" '
        '<(printf "docker save output") && touch "$2"; }\nexit 0\n',
    )
    stub(bin_dir, "python3")
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        CALLS=str(tmp_path / "calls"),
        SLURM_JOB_ID="77",
        SLURM_JOB_NODELIST="gpu-node-[01-02]",
        SLURM_JOB_NUM_NODES="2",
        SLURM_SUBMIT_DIR=str(bundle_dir),
    )
    for attempt in (1, 2):
        proc = subprocess.run([BASH, str(out / "mics-hier.sbatch")], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        recorded = calls(tmp_path / "calls")
        builds = [c for c in recorded if c[:2] == ["apptainer", "build"]]
        assert len(builds) == 1, f"attempt {attempt}: the SIF is built once and then reused"
    assert builds[0][2] == f"{bundle_dir}/mics-repro-rocm56.sif"
    sruns = [c for c in recorded if c[0] == "srun"]
    assert len(sruns) == 2 * len(cluster.RUNS)
    first = sruns[: len(cluster.RUNS)]
    for run, call in zip(cluster.RUNS, first):
        assert "--nodes=2" in call and "--ntasks-per-node=1" in call
        task = call[call.index(f"{out}/launch-node.sh") :]
        assert task[2:5] == [run.scenario, run.patch, "gpu-node-01"] and task[5] == f"77-{run.name}"
        run_dir = Path(task[1])
        assert json.loads((run_dir / "ds_config.json").read_text()) == json.loads(
            (out / "configs" / f"{run.name}.json").read_text()
        )
        assert (run_dir / "exit_code").read_text().strip() == ("1" if run.name == "mics-hier-stock" else "0")
    assert ["python3", f"{out}/summarize.py", f"{bundle_dir}/cluster-results/77"] in recorded
    assert "1 run(s) exited non-zero" in proc.stdout


# ---- pass-through and per-run limits -----------------------------------------------------------------

GPU_HOST_ENV = {
    "HIP_VISIBLE_DEVICES": "0,1",
    "NCCL_DEBUG": "INFO",
    "HSA_XNACK": "1",
    "NCCL_SOCKET_IFNAME": 'ib0,"odd\\name',
}


def _gpu_run(
    tmp_path: Path, runtime: str, body: str, **extra: str
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    out = written(tmp_path, cluster.REPORTER)
    proc, run_dir = launch_node(
        tmp_path,
        out,
        (runtime, body),
        ["mics", "stock", "node-a"],
        RUNTIME=runtime,
        SIF=str(tmp_path / "x.sif"),
        AWS_SECRET_ACCESS_KEY="not-for-the-run",
        **GPU_HOST_ENV,
        **extra,
    )
    return proc, run_dir, tmp_path / "calls.env"


@pytest.mark.parametrize("runtime", ["apptainer", "singularity"])
def test_cleanenv_still_gets_the_allowlisted_gpu_variables(
    tmp_path: Path, real_subprocess: None, runtime: str
) -> None:
    prefix = "APPTAINERENV_" if runtime == "apptainer" else "SINGULARITYENV_"
    proc, _, seen = _gpu_run(tmp_path, runtime, f'env | grep "^{prefix}" | sort > "$CALLS.env"\n')
    assert proc.returncode == 0, proc.stderr
    (call,) = calls(tmp_path / "calls")
    assert call[:3] == [runtime, "exec", "--cleanenv"] and "--rocm" not in call
    assert "/dev/kfd" in call and "/dev/dri" in call
    passed = dict(line[len(prefix) :].split("=", 1) for line in seen.read_text().splitlines())
    described = json.loads(passed.pop("MICS_REPRO_PASSTHROUGH"))
    assert passed == GPU_HOST_ENV and described == GPU_HOST_ENV  # commas, quotes, backslashes intact
    assert "AWS_SECRET_ACCESS_KEY" not in seen.read_text()


def test_docker_runtime_passes_the_same_variables(tmp_path: Path, real_subprocess: None) -> None:
    proc, _, _ = _gpu_run(tmp_path, "docker", "")
    assert proc.returncode == 0, proc.stderr
    (call,) = calls(tmp_path / "calls")
    values = [call[i + 1] for i, arg in enumerate(call) if arg == "-e"]
    assert {f"{k}={v}" for k, v in GPU_HOST_ENV.items()} <= set(values)
    assert not any(v.startswith("AWS_") for v in values)


def test_a_run_over_its_time_limit_is_stopped(tmp_path: Path, real_subprocess: None) -> None:
    proc, _, _ = _gpu_run(tmp_path, "apptainer", "exec sleep 60\n", TIMEOUT="2")
    assert proc.returncode == 124, proc.stderr


def test_a_run_without_heartbeats_is_stopped_as_hung(tmp_path: Path, real_subprocess: None) -> None:
    # The "ranks" start training (one heartbeat), then hang; the time limit is far away.
    body = (
        'for a in "$@"; do case "$a" in --run-dir) next=1 ;; '
        '*) [ -n "${next:-}" ] && { dir=$a; next=; } ;; esac; done\n'
        'touch "$dir/rank0.heartbeat"\nexec sleep 60\n'
    )
    proc, run_dir, _ = _gpu_run(tmp_path, "apptainer", body, TIMEOUT="300", STALL_TIMEOUT="2")
    assert proc.returncode != 0 and "no rank heartbeat" in proc.stderr
    assert (run_dir / "stalled").is_file()


def test_job_time_limit_covers_every_run_at_its_limit(tmp_path: Path) -> None:
    assert cluster.job_time_limit(5, 600) == "1:10:00"
    assert cluster.job_time_limit(7, 600) == "1:32:00" and len(cluster.RUNS) == 7
    sbatch = (written(tmp_path, cluster.REPORTER) / "mics-hier.sbatch").read_text()
    assert "#SBATCH --time=1:32:00\n" in sbatch
    launch = (tmp_path / "bundle" / "cluster" / "launch-node.sh").read_text()
    assert "TIMEOUT=${TIMEOUT:-600}" in launch and "STALL_TIMEOUT=${STALL_TIMEOUT:-60}" in launch


# ---- the summary --------------------------------------------------------------------------------------


def test_summary_states_what_each_run_did(tmp_path: Path) -> None:
    stock = tmp_path / "mics-hier-stock"
    fixed = tmp_path / "mics-hier-fixed"
    crash = {"type": "RuntimeError", "message": "Illegal to call wait on IllegalWork object"}
    for folder, exc, losses in ((stock, crash, []), (fixed, None, [5.0, None, 4.5])):
        folder.mkdir()
        for rank in range(2):
            (folder / f"rank{rank}.json").write_text(
                json.dumps(
                    {
                        "rank": rank,
                        "world_size": 2,
                        "losses": losses,
                        "exception": exc,
                        "steps_completed": len(losses),
                        "illegal_work_messages": 3 if exc else 0,
                    }
                )
            )
    (stock / "exit_code").write_text("1\n")
    rows = {r["run"]: r for r in (cluster_summary.summarize_run(d) for d in (stock, fixed))}
    assert rows["mics-hier-stock"]["errors"] == ["RuntimeError: Illegal to call wait on IllegalWork object"]
    assert rows["mics-hier-stock"]["exit_code"] == "1"
    assert rows["mics-hier-stock"]["illegal_work_messages"] == 6
    assert rows["mics-hier-fixed"]["non_finite_losses"] == 1 and rows["mics-hier-fixed"]["last_loss"] == 4.5
    assert cluster_summary.main([str(tmp_path)]) == 0
    assert len(json.loads((tmp_path / "summary.json").read_text())) == 2
