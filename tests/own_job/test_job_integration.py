"""`make run` with a DeepSpeed training script that is not ours, on the CPU twin (torch 2.1.0 +
DeepSpeed 0.13.1, venv engine): the script has its own model, data loader and ZeRO-3 + MiCS
config, is launched with torchrun on 2 ranks and knows nothing of this lab. The startup hook gets
it running on CPU/gloo and applies the fix in the fixed run; the judge reads its output.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from repro.workload.fix import FIX_ID
from repro.workload.job import alive
from repro.workload.record import RECORD_KEYS
from tests.envpython import env_python
from tests.fixtures.classifier_job import make

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture
def project(classifier_project: Path) -> Path:
    return classifier_project


@pytest.fixture
def custom_run(classifier_run: tuple[Path, str, dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    out, _stdout, results = classifier_run
    return out, results


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
    # On the default (async) transport whether the stock job's losses leave the fixed run's is a
    # real race: most runs part (NaN or far off), one warm CI rehearsal stayed within the judge's 2%
    # (1.2385 vs 1.2326 at step 1). Both are the bug's IllegalWork evidence; the signature must say
    # which it was. tests/own_job/test_job_deps_docker.py runs a job on the strict transport, where the
    # divergence is certain, and asserts it.
    assert stock["signature"] in ("illegal-work-divergence", "illegal-work-warnings")
    parted = stock["signature"] == "illegal-work-divergence"
    assert (stock["first_divergent_step"] is not None) == parted, stock["first_divergent_step"]
    assert fixed["outcome"] == "clean" and fixed["illegal_work_messages"] == 0
    assert fixed["fix"]["fix_id"] == FIX_ID and stock["fix"] is None
    assert len(fixed["losses"]) == 6 and all(v is not None for v in fixed["losses"])


def test_both_records_are_in_the_report(custom_run: tuple[Path, dict[str, Any]]) -> None:
    out, _ = custom_run
    done = make("report", f"RESULTS={out}")
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

    # Output every second while the rank imports and joins: the stall limit counts silence, so
    # it cannot fire before both ranks are inside this file, however slow the imports are.
    up = threading.Event()

    def _talk():
        while not up.wait(1.0):
            print("starting", flush=True)

    threading.Thread(target=_talk, daemon=True).start()
    import deepspeed
    import torch.distributed as dist

    deepspeed.init_distributed()
    print(f"rank {dist.get_rank()} up", flush=True)
    dist.barrier()
    up.set()
    if dist.get_rank() == 0:
        open("both-up", "w").close()  # the command's own printer (CMD below) stops on it
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
    done = make(
        "run",
        "ENV=cpu",
        "PATCH=stock",
        f"WORKDIR={work}",
        f"OUT={out}",
        # Both ranks must be inside deadlock.py when the limit ends the run (asserted below). The
        # job prints each second until both passed the first barrier, so the limit counts only
        # the silence of the deadlock itself (a fixed 20 s once ended a rank still importing
        # beside CI's Docker side stream); 8 s: long past the barrier's last print. The shell
        # prints too, from the start until then: torchrun's own start (importing torch before
        # any rank runs) once took over 8 s on a loaded host, so the limit fired first.
        "STALL_TIMEOUT=8",
        "CMD=(until [ -e both-up ]; do echo launching; sleep 1; done) & "
        "exec torchrun --nproc_per_node 2 deadlock.py",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    [run] = json.loads((out / "results.json").read_text())["runs"]
    assert (run["outcome"], run["signature"]) == ("hung", "hang")
    assert "stall limit 8 s" in run["reason"], run["reason"]  # silence, not a proven deadlock
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
    done = make(
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


def test_stock_evidence_is_the_hooks_signed_count(custom_run: tuple[Path, dict[str, Any]]) -> None:
    """The real job's IllegalWork evidence comes from the hook's signed records (every rank's
    record verified with the run's key, none forged), not from its log lines, and the job left
    nothing of its own in its results folder."""
    _, results = custom_run
    runs = {r["patch"]: r for r in results["runs"]}
    for record in runs.values():
        job = record["job"]
        assert job["hook_signed"] is True and job["forged_hook_records"] == [] and job["job_wrote"] == []
        assert (
            job["deepspeed_imported"] and record["ran_on"]["processes"] == 2
        )  # both ranks' records verified
    stock = runs["stock"]
    assert stock["outcome"] == "reproduced" and stock["signature"].startswith("illegal-work-")
    assert stock["job"]["illegal_work_by_hook"] > 0
    assert stock["illegal_work_messages"] == stock["job"]["illegal_work_by_hook"]
    assert "counted by the hook" in stock["reason"]
    assert runs["fixed"]["job"]["illegal_work_by_hook"] == 0
