"""Hang by evidence (#34) on the real CPU twin: `python -m repro run` (what `make run` calls)
with a 4-rank torchrun job whose ranks 0,1 call all_reduce while ranks 2,3 call broadcast on the
world group, after agreeing on three all_reduce calls. The stall limit is 600 s, so only the
collective records can end it early; the record must say hung with the deadlock as its reason.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.envpython import env_python
from tests.fixtures.own_job import repro_run

pytestmark = pytest.mark.integration

JOB = textwrap.dedent("""\
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)  # every rank agrees here
    print(f"rank {rank}: agreed", flush=True)
    if rank < 2:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)
    print(f"rank {rank}: passed the mismatch", flush=True)
""")


def test_a_job_whose_ranks_disagree_is_hung_by_its_deadlock_not_its_stall_limit(tmp_path: Path) -> None:
    env_python("cpu")  # skips with the command that builds the env when it is not there
    work = tmp_path / "work"
    work.mkdir()
    (work / "mismatch.py").write_text(JOB)
    out = tmp_path / "out"
    done = repro_run(
        work, out, "torchrun --nproc_per_node 4 mismatch.py", "--patch", "stock", "--stall-timeout", "600"
    )
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 1
    record = runs[0]
    assert record["outcome"] == "hung", record["reason"]
    assert (
        "deadlock: ranks 0,1 in all_reduce and ranks 2,3 in broadcast on group [0,1,2,3]" in record["reason"]
    )
    assert "collective #4 of that group" in record["reason"]
    assert len(record["stacks"]) >= 4  # the ranks' stacks (and the launcher's), dumped as before
    assert record["job"]["survivors"] == []
