"""The ranks a job's command asks for, read from its launcher's words (repro/core/launchers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.core.launchers import asked_ranks, shortfall


@pytest.mark.parametrize(
    ("command", "launcher", "ranks"),
    [
        ("torchrun --nproc_per_node 2 train.py", "torchrun", 2),
        ("torchrun --nproc-per-node=4 train.py --lr 1", "torchrun", 4),
        ("torchrun --nnodes 2 --nproc_per_node 2 train.py", "torchrun", 4),
        ("torchrun --nnodes 1:2 --nproc_per_node 2 train.py", "torchrun", None),
        ("torchrun --nproc_per_node gpu train.py", "torchrun", None),
        ("torchrun train.py", "torchrun", 1),
        ("python -m torch.distributed.run --nproc_per_node 2 train.py", "torchrun", 2),
        ("/env/bin/python -m torch.distributed.launch --nproc_per_node=3 t.py", "torchrun", 3),
        ("deepspeed --num_gpus 2 train.py --deepspeed_config c.json", "deepspeed", 2),
        ("deepspeed train.py", "deepspeed", None),
        ("accelerate launch --multi_gpu --num_processes 2 loop.py", "accelerate launch", 2),
        ("accelerate launch --num_processes 2 loop.py", "accelerate launch", 2),
        ("env FOO=1 /venv/bin/torchrun --nproc_per_node 2 t.py", "torchrun", 2),
    ],
)
def test_the_launchers_count(command: str, launcher: str, ranks: int | None) -> None:
    asked = asked_ranks(command)
    assert asked is not None and (asked.launcher, asked.ranks) == (launcher, ranks)


def test_no_launcher_is_no_claim() -> None:
    assert asked_ranks("python train.py --nproc_per_node 2") is None
    assert asked_ranks("bash -c 'unbalanced") is None


def test_accelerate_without_multi_gpu_starts_one_process_and_says_which_flag() -> None:
    asked = asked_ranks("accelerate launch --num_processes 2 loop.py")
    assert asked is not None and asked.single_process
    note = shortfall(asked, 1)
    assert "asks for 2 ranks (accelerate launch --num_processes 2) but 1 started" in note
    assert "--multi_gpu" in note
    multi = asked_ranks("accelerate launch --multi_gpu --num_processes 2 loop.py")
    assert multi is not None and not multi.single_process and shortfall(multi, 2) == ""
    # its one process crashed before it joined a process group (nothing counted): still said
    early = shortfall(asked, None)
    assert "asks for 2 ranks (accelerate launch --num_processes 2) but 1 started" in early, early
    assert "--multi_gpu" in early and shortfall(multi, None) == ""


def test_accelerate_reads_its_config_file(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 2\n"
    )
    (tmp_path / "multi.yaml").write_text(
        "distributed_type: MULTI_GPU\nnum_processes: 2\nsub:\n  num_processes: 9\n"
    )
    one = asked_ranks("accelerate launch --config_file one.yaml loop.py", tmp_path)
    multi = asked_ranks(f"accelerate launch --config-file={tmp_path / 'multi.yaml'} loop.py")
    assert one is not None and (one.ranks, one.single_process) == (2, True)
    assert "num_processes: 2 in its config file" in shortfall(one, 1)
    assert multi is not None and (multi.ranks, multi.single_process) == (2, False)


def test_shortfall_only_when_fewer_started() -> None:
    asked = asked_ranks("torchrun --nproc_per_node 2 t.py")
    assert shortfall(asked, 2) == "" and shortfall(asked, None) == "" and shortfall(None, 1) == ""
    assert shortfall(asked, 1).startswith(
        "the command asks for 2 ranks (torchrun --nproc_per_node 2) but 1 started"
    )
