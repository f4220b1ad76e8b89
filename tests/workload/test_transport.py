"""The gloo transport adapter against a real torch, 2 gloo ranks, no DeepSpeed.

A child program (below) runs in the venv named by MICS_TEST_PYTHON (default: the cpu env's venv,
torch 2.1, when the venv engine has built it); both ranks install the adapter in each mode in
turn, exercise it and write what they observed to JSON. The tests compare those observations
with values computed here. Skipped when the venv is absent.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.envpython import cpu_python

REPO = Path(__file__).resolve().parents[2]
# Real torch in a child process: the integration tier (CI requires it, so a missing venv fails there).
PYTHON, pytestmark = cpu_python("MICS_TEST_PYTHON", "torch venv python")
WORLD = 2
N = 4  # elements each rank contributes

_CHILD = r'''
import contextlib, inspect, json, os, sys
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from repro.workload.cpu import gloo_transport as gt

out_dir, rank, world, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo", rank=rank, world_size=world)
pg = c10d._get_default_group()
cpu = torch.device("cpu")
NEW_MANAGER = "async_ops" in inspect.signature(c10d._coalescing_manager).parameters
# Newer torch (2.10 and 2.13 here) skips the sync block's wait when the backend hands back None
# ("work is not None"); torch 2.1 waits on whatever it got. Read from the installed source.
WAITS_ON_NONE = NEW_MANAGER and "work is not None" not in inspect.getsource(c10d._coalescing_manager)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
obs = {"torch": torch.__version__, "new_manager": NEW_MANAGER, "waits_on_none": WAITS_ON_NONE, "modes": {}}


def vals(t):
    return [float(x) for x in t.float().tolist()]


def gather_input(j=0, dtype=torch.float32):
    return (torch.arange(n) + 100 * rank + 10 * j).to(dtype)


def two_gathers():
    """Two outputs and the async works gathering into them, issued in order on one group."""
    a, b = torch.empty(world * n), torch.empty(world * n)
    works = [dist.all_gather_into_tensor(x, gather_input(j), async_op=True) for j, x in ((1, a), (2, b))]
    return a, b, *works


def new_manager_block(outs, bind):
    """DeepSpeed's pattern on torch >= 2.1; returns (manager or None, handles)."""
    handles = []
    manager = c10d._coalescing_manager(pg, cpu, async_ops=True)
    with manager as cm:
        for j, o in enumerate(outs):
            handles.append(dist.all_gather_into_tensor(o, gather_input(j), async_op=True))
    return (cm if bind else None), handles


def old_manager_block(outs):
    reqs = []
    with c10d._coalescing_manager(pg, cpu, reqs):
        for j, o in enumerate(outs):
            reqs.append(dist.all_gather_into_tensor(o, gather_input(j), async_op=True))
    return reqs


for mode in gt.MODES:
    info = gt.install(mode)
    o = obs["modes"][mode] = {"installed": info, "reinstall_same": gt.install(mode) == info}
    try:
        gt.install("sync" if mode != "sync" else "async")
    except RuntimeError as exc:
        o["reinstall_other_error"] = str(exc)

    for name, dt in DTYPES.items():
        out = torch.empty(world * n, dtype=dt)
        dist.all_gather_into_tensor(out, gather_input(0, dt), async_op=True).wait()
        o["gather_" + name] = vals(out)
        src = (torch.arange(world * n) * (rank + 1)).to(dt)
        got = torch.empty(n, dtype=dt)
        dist.reduce_scatter_tensor(got, src, op=dist.ReduceOp.SUM)
        o["rs_sum_" + name] = vals(got)
        dist.reduce_scatter_tensor(got, src, op=dist.ReduceOp.AVG)
        o["rs_avg_" + name] = vals(got)

    # DeepSpeed's ZeRO-3 gathers into the buffer its own partition lives in
    flat = torch.zeros(world * n)
    mine = flat.narrow(0, rank * n, n)
    mine.copy_(gather_input())
    dist.all_gather_into_tensor(flat, mine, async_op=True).wait()
    o["alias_gather"] = vals(flat)

    ints = torch.zeros(world * n, dtype=torch.int64)
    work = dist.all_gather_into_tensor(ints, gather_input(0, torch.int64), async_op=True)
    dist.barrier()
    o["int_before_wait"] = ints.tolist()
    work.wait()
    o["int_after_wait"] = ints.tolist()

    out = torch.empty(world * n)
    work = dist.all_gather_into_tensor(out, gather_input(), async_op=True)
    o["sync_returned_complete"] = bool(work.is_completed())
    o["before_wait"] = vals(out)
    dist.barrier()
    o["after_barrier_no_wait"] = vals(out)
    work.wait()

    # completion without wait(): the work's future completes when the transport delivers
    out = torch.empty(world * n)
    work = dist.all_gather_into_tensor(out, gather_input(), async_op=True)
    if mode == "async":
        work.get_future().wait()
        o["future_only"] = vals(out)
        o["future_only_completed"] = bool(work.is_completed())
    work.wait()

    # issue order: waiting a later work of the same group completes the earlier one
    a, b, wa, wb = two_gathers()
    wb.wait()
    o["order_a"] = vals(a)
    wa.wait()
    # ... but not the other way round (strict: b stays poisoned until waited)
    a, b, wa, wb = two_gathers()
    wa.wait()
    o["independent_b"] = vals(b)
    wb.wait()

    # a coalescing block completes as a unit
    outs = [torch.empty(world * n) for _ in range(3)]
    if NEW_MANAGER:
        cm, handles = new_manager_block(outs, bind=True)
        o["placeholder_type"] = type(handles[-1]).__name__
        o["block_before_wait"] = [vals(x) for x in outs]
        cm.wait()
    else:
        reqs = old_manager_block(outs)
        o["block_before_wait"] = [vals(x) for x in outs]
        reqs[-1].wait()
    o["block_after_wait"] = [vals(x) for x in outs]

    # torch 2.0 meaning: any request of the block waits the whole block
    outs = [torch.empty(world * n) for _ in range(3)]
    pg._start_coalescing(cpu)
    reqs = [dist.all_gather_into_tensor(x, gather_input(j), async_op=True) for j, x in enumerate(outs)]
    group_work = pg._end_coalescing(cpu, reqs) if not NEW_MANAGER else pg._end_coalescing(cpu)
    reqs[0].wait()
    o["member_wait"] = [vals(x) for x in outs]
    group_work.wait()

    # the DeepSpeed bug pattern: the manager is not bound and reqs[-1] is waited
    outs = [torch.empty(world * n) for _ in range(3)]
    if NEW_MANAGER:
        _, handles = new_manager_block(outs, bind=False)
        try:
            handles[-1].wait()
            o["bug_wait_error"] = None
        except (RuntimeError, ValueError) as exc:
            o["bug_wait_error"] = type(exc).__name__ + ": " + str(exc)
        o["bug_outputs"] = [vals(x) for x in outs]
    dist.barrier()

    if not info["gloo_native"]["bf16"]:
        t = torch.full((n,), 1.0 if rank == 0 else 0.0, dtype=torch.bfloat16)
        dist.broadcast(t, 0)
        o["bf16_broadcast"] = vals(t)
        t = torch.full((n,), 1.5 * (rank + 1), dtype=torch.bfloat16)
        dist.all_reduce(t)
        o["bf16_allreduce"] = vals(t)

    # drain everything still pending before the next mode
    dist.barrier()
    gt.uninstall()
    dist.barrier()

# An NCCL that loses the block's work (pytorch#122807), modelled under torch's own manager: the
# async block's cm.works is empty, the sync block's exit waits None, a device synchronize completes.
if NEW_MANAGER:
    lost = obs["lost"] = {"installed": gt.install("strict", loses_block_work=True)}
    outs = [torch.empty(world * n) for _ in range(2)]
    cm, _ = new_manager_block(outs, bind=True)
    lost["async_works"] = len(cm.works)
    lost["before_sync"] = [vals(x) for x in outs]
    gt.synchronize_device()
    lost["after_sync"] = [vals(x) for x in outs]
    outs = [torch.empty(world * n) for _ in range(2)]
    try:
        with c10d._coalescing_manager(pg, cpu, async_ops=False):
            for j, x in enumerate(outs):
                dist.all_gather_into_tensor(x, gather_input(j), async_op=True)
        lost["sync_error"] = None
    except AttributeError as exc:
        lost["sync_error"] = str(exc)
    gt.synchronize_device()
    dist.barrier()
    gt.uninstall()
    dist.barrier()

with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
    json.dump(obs, fh)
dist.destroy_process_group()
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    work = tmp_path_factory.mktemp("transport")
    script = work / "child.py"
    script.write_text(_CHILD)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
    )
    procs = [
        subprocess.Popen(
            [PYTHON, str(script), str(work), str(r), str(WORLD), str(N)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    logs = [p.communicate()[0] for p in procs]
    for rank, proc in enumerate(procs):
        if proc.returncode != 0:
            sys.stderr.write(logs[rank])
            pytest.fail(f"transport child rank {rank} exited {proc.returncode}:\n{logs[rank][-3000:]}")
    return {r: json.loads((work / f"rank{r}.json").read_text()) for r in range(WORLD)}


def _gather(j: int = 0) -> list[float]:
    return [float(k + 100 * r + 10 * j) for r in range(WORLD) for k in range(N)]


def _reduce_scatter(rank: int, average: bool) -> list[float]:
    total = [float(k * sum(r + 1 for r in range(WORLD))) for k in range(WORLD * N)]
    mine = total[rank * N : (rank + 1) * N]
    return [v / WORLD for v in mine] if average else mine


def _all_nan(values: list[float]) -> bool:
    return all(math.isnan(v) for v in values)


MODES = ("async", "sync", "strict")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_gather_and_reduce_scatter_are_correct(
    observed: dict[int, Any], mode: str, dtype: str, real_subprocess: None
) -> None:
    for rank, obs in observed.items():
        o = obs["modes"][mode]
        assert o[f"gather_{dtype}"] == _gather()
        assert o[f"rs_sum_{dtype}"] == _reduce_scatter(rank, average=False)
        assert o[f"rs_avg_{dtype}"] == _reduce_scatter(rank, average=True)


@pytest.mark.parametrize("mode", MODES)
def test_gather_into_the_buffer_holding_the_input(
    observed: dict[int, Any], mode: str, real_subprocess: None
) -> None:
    for obs in observed.values():
        assert obs["modes"][mode]["alias_gather"] == _gather()


def test_sync_mode_completes_before_returning(observed: dict[int, Any], real_subprocess: None) -> None:
    for obs in observed.values():
        o = obs["modes"]["sync"]
        assert o["sync_returned_complete"] is True
        assert o["before_wait"] == _gather()


def test_async_mode_delivers_without_anyone_waiting(observed: dict[int, Any], real_subprocess: None) -> None:
    for obs in observed.values():
        o = obs["modes"]["async"]
        assert o["future_only"] == _gather()
        assert o["future_only_completed"] is True


def test_strict_mode_poisons_until_wait(observed: dict[int, Any], real_subprocess: None) -> None:
    for obs in observed.values():
        o = obs["modes"]["strict"]
        assert o["sync_returned_complete"] is False
        assert _all_nan(o["before_wait"])
        assert _all_nan(o["after_barrier_no_wait"])  # the peer took part; still nothing without wait
        assert o["int_before_wait"] == [2**63 - 1] * (WORLD * N)
        assert o["int_after_wait"] == _gather()


def test_strict_mode_leaves_unwaited_later_work_poisoned(
    observed: dict[int, Any], real_subprocess: None
) -> None:
    for obs in observed.values():
        assert _all_nan(obs["modes"]["strict"]["independent_b"])


@pytest.mark.parametrize("mode", MODES)
def test_waiting_a_later_work_completes_earlier_ones(
    observed: dict[int, Any], mode: str, real_subprocess: None
) -> None:
    # one NCCL stream per communicator: the adapter must not report a race NCCL cannot have
    for obs in observed.values():
        assert obs["modes"][mode]["order_a"] == _gather(1)


@pytest.mark.parametrize("mode", MODES)
def test_coalesced_block_completes_as_a_unit(
    observed: dict[int, Any], mode: str, real_subprocess: None
) -> None:
    for obs in observed.values():
        o = obs["modes"][mode]
        assert o["block_after_wait"] == [_gather(j) for j in range(3)]
        assert o["member_wait"] == [_gather(j) for j in range(3)]
        if mode == "strict":
            assert all(_all_nan(v) for v in o["block_before_wait"])


def test_the_placeholder_and_the_bug_come_from_torch(observed: dict[int, Any], real_subprocess: None) -> None:
    for obs in observed.values():
        if not obs["new_manager"]:
            pytest.skip(f"torch {obs['torch']} has the old coalescing manager (no _IllegalWork)")
        strict = obs["modes"]["strict"]
        assert strict["placeholder_type"] == "_IllegalWork"
        assert "Illegal to call wait on IllegalWork object" in strict["bug_wait_error"]
        # nothing waits the real work: the outputs never receive the gathered values
        assert all(_all_nan(v) for v in strict["bug_outputs"])


@pytest.mark.parametrize("mode", MODES)
def test_install_is_idempotent_and_refuses_a_second_mode(
    observed: dict[int, Any], mode: str, real_subprocess: None
) -> None:
    for obs in observed.values():
        o = obs["modes"][mode]
        assert o["reinstall_same"] is True
        assert "already installed" in o["reinstall_other_error"]
        assert o["installed"]["mode"] == mode
        assert "_start_coalescing" in o["installed"]["patched"]


@pytest.mark.parametrize("mode", MODES)
def test_bf16_broadcast_and_allreduce_where_gloo_lacks_bf16(
    observed: dict[int, Any], mode: str, real_subprocess: None
) -> None:
    for obs in observed.values():
        o = obs["modes"][mode]
        if o["installed"]["gloo_native"]["bf16"]:
            pytest.skip(f"torch {obs['torch']}'s gloo has bf16; the adapter leaves it alone")
        assert o["bf16_broadcast"] == [1.0] * N
        assert o["bf16_allreduce"] == [1.5 * sum(r + 1 for r in range(WORLD))] * N


def test_release_default_keeps_the_block_work_on_torch_2_1(
    observed: dict[int, Any], real_subprocess: None
) -> None:
    for o in observed.values():
        expected = "lost" if o["torch"].startswith("2.3.") else "kept"
        assert all(m["installed"]["block_work"] == expected for m in o["modes"].values())


def test_lost_block_work_under_torchs_own_manager(observed: dict[int, Any], real_subprocess: None) -> None:
    for o in observed.values():
        if not o["new_manager"]:
            pytest.skip("torch 2.0's manager has no device-overwrite path")
        lost = o["lost"]
        assert lost["installed"]["block_work"] == "lost"
        assert lost["async_works"] == 0  # torch's manager dropped the None it got back
        assert all(_all_nan(v) for v in lost["before_sync"])  # nothing waited: still poisoned
        assert lost["after_sync"] == [_gather(0), _gather(1)]  # the device synchronize delivered
        # the sync block's exit: torch 2.1 waits the None it got; newer torch leaves it unwaited
        expected = "'NoneType' object has no attribute 'wait'" if o["waits_on_none"] else None
        assert lost["sync_error"] == expected
