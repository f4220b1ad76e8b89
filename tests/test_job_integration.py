"""`make run` with a DeepSpeed training script that is not ours, on the CPU twin (torch 2.1.0 +
DeepSpeed 0.13.1, venv engine): the script has its own model, data loader and ZeRO-3 + MiCS
config, is launched with torchrun on 2 ranks and knows nothing of this lab. The startup hook gets
it running on CPU/gloo and applies the fix in the fixed run; the judge reads its output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from envpython import env_python

from repro.workload.fix import FIX_ID
from repro.workload.job import alive
from repro.workload.record import RECORD_KEYS

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration

TRAIN = textwrap.dedent("""\
    import deepspeed
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(12, 48)
            self.head = torch.nn.Linear(48, 3)

        def forward(self, x):
            return self.head(torch.tanh(self.embed(x)))


    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},  # no JIT build
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": 3, "mics_shard_size": 2, "mics_hierarchical_params_gather": False},
        "steps_per_print": 100,
    }
    deepspeed.init_distributed()
    torch.manual_seed(7)
    with deepspeed.zero.MiCS_Init(config_dict_or_path=config):
        model = Classifier()
    engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(24, 12, generator=g), torch.randint(0, 3, (24,), generator=g))
    for it, (x, y) in enumerate(DataLoader(data, batch_size=4, shuffle=False)):
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        if torch.distributed.get_rank() == 0:
            print(f"iter {it} | loss {loss.item():.6f}", flush=True)
""")


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make on PATH")
    return subprocess.run(
        [make, "--no-print-directory", f"PYTHON={sys.executable}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, ENGINE="venv"),
    )


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_python("cpu")  # skips (or fails in CI) when the env's venv is not built
    work = tmp_path_factory.mktemp("their-project")
    (work / "train_classifier.py").write_text(TRAIN)
    return work


@pytest.fixture(scope="module")
def custom_run(project: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    work = project
    out = tmp_path_factory.mktemp("custom") / "results"
    done = _make(
        "run",
        "ENV=cpu",
        f"WORKDIR={work}",
        f"OUT={out}",
        "STALL_TIMEOUT=240",
        "CMD=torchrun --nproc_per_node 2 train_classifier.py",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text())


def test_stock_reproduces_and_fixed_is_clean(custom_run: tuple[Path, dict[str, Any]]) -> None:
    out, results = custom_run
    runs = {r["patch"]: r for r in results["runs"]}
    assert set(runs) == {"stock", "fixed"}
    for record in runs.values():
        assert set(RECORD_KEYS) <= set(record)
        assert record["scenario"] == "custom" and record["world_size"] == 2
        assert record["job"]["command"] == "torchrun --nproc_per_node 2 train_classifier.py"
        assert record["job"]["workdir_digest"].startswith("sha256:")
        assert record["job"]["patterns"]["loss"]["name"] == "generic"
        assert record["job"]["survivors"] == []
        assert not [pid for pid in record["job"]["processes"] if alive(int(pid))]
        assert (out / record["logs"]["job"]).is_file()
    stock, fixed = runs["stock"], runs["fixed"]
    assert stock["outcome"] == "reproduced" and stock["illegal_work_messages"] > 0
    assert stock["signature"] == "illegal-work-divergence"
    assert stock["first_divergent_step"] is not None  # the losses leave the fixed run's
    assert fixed["outcome"] == "clean" and fixed["illegal_work_messages"] == 0
    assert fixed["fix"]["fix_id"] == FIX_ID and stock["fix"] is None
    assert len(fixed["losses"]) == 6 and all(v is not None for v in fixed["losses"])


def test_both_records_are_in_the_report(custom_run: tuple[Path, dict[str, Any]]) -> None:
    out, _ = custom_run
    done = _make("report", f"RESULTS={out}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (out / "REPORT.md").read_text()
    # The scenario column names the job (`custom <job id>`): two jobs of one env are two rows.
    rows = [line for line in report.splitlines() if line.startswith("| cpu | custom ")]
    assert rows and "reproduced → clean" in rows[0]


def test_one_real_probe_of_the_command_is_bad_on_stock(project: Path, tmp_path: Path) -> None:
    """The probe that each step of `make bisect ... CMD=` runs (`python -m repro probe --cmd`, the
    form `git bisect run` calls; make would turn its exit 1 into 2): bad, because stock reproduces."""
    out = tmp_path / "probe"
    command = "torchrun --nproc_per_node 2 train_classifier.py"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro",
            "probe",
            "--env",
            "cpu",
            "--engine",
            "venv",
            "--cmd",
            command,
            "--workdir",
            str(project),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-3000:]
    probe = json.loads((out / "probe.json").read_text())
    [run] = json.loads((out / "results.json").read_text())["runs"]
    assert (run["scenario"], run["patch"], run["outcome"]) == ("custom", "stock", "reproduced")
    assert run["job"]["command"] == command
    assert probe["exit_code"] == 1 and probe["probes"][0]["verdict"] == "bad"


DEADLOCK = textwrap.dedent("""\
    import threading

    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed()
    print(f"rank {dist.get_rank()} up", flush=True)
    dist.barrier()
    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never comes: a deadlock, silent from here on
    else:
        threading.Event().wait()
""")


def test_deadlocked_command_ends_hung_with_stacks_and_no_survivors(tmp_path: Path) -> None:
    env_python("cpu")
    work = tmp_path / "proj"
    work.mkdir()
    (work / "deadlock.py").write_text(DEADLOCK)
    out = tmp_path / "out"
    done = _make(
        "run",
        "ENV=cpu",
        "PATCH=stock",
        f"WORKDIR={work}",
        f"OUT={out}",
        "STALL_TIMEOUT=20",
        "CMD=torchrun --nproc_per_node 2 deadlock.py",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    [run] = json.loads((out / "results.json").read_text())["runs"]
    assert (run["outcome"], run["signature"]) == ("hung", "hang")
    # torchrun and both ranks are hooked Python processes: each left its stack.
    assert len(run["stacks"]) == 3, sorted(run["stacks"])
    assert sum("deadlock.py" in text for text in run["stacks"].values()) == 2
    assert run["job"]["survivors"] == []
    assert len(run["job"]["processes"]) == 3
    assert not [pid for pid in run["job"]["processes"] if alive(int(pid))]


def test_deepspeed_launcher_on_cpu(project: Path, tmp_path: Path) -> None:
    """DeepSpeed's own launcher asks the accelerator for a device count before it starts the
    ranks (numactl on CPU, absent here): the hook gives the launcher one per core, the ranks their
    own count, and the stock run reproduces."""
    out = tmp_path / "out"
    done = _make(
        "run",
        "ENV=cpu",
        "PATCH=stock",
        f"WORKDIR={project}",
        f"OUT={out}",
        "STALL_TIMEOUT=240",
        "CMD=deepspeed --num_gpus 2 train_classifier.py",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    [run] = json.loads((out / "results.json").read_text())["runs"]
    assert (run["outcome"], run["world_size"]) == ("reproduced", 2)
    assert run["illegal_work_messages"] > 0
