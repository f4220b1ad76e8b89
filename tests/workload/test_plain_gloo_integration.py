"""MiCS on plain gloo (no transport adapter), with the real torch 2.13.0 + DeepSpeed 0.19.6 (env
cpu-latest): gloo implements no `startCoalescing`, so torch's `_coalescing_manager(device=...)`
refuses on entry. Stock DeepSpeed dies there; the fix gathers one by one and waits each.

Two checks: the gather itself in one gloo rank (torch's manager, torch's refusal, DeepSpeed's
method), and the suite's stock/fixed pair over `--transport plain` (2 ranks, a few steps), as
`make repro ENV=cpu-latest TRANSPORT=plain SCENARIOS=mics` runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from envpython import env_python

from repro.workload.runner import _rank_pids, alive

REPO = Path(__file__).resolve().parents[2]
REFUSAL = "does not implement startCoalescing"
pytestmark = pytest.mark.integration

# One rank of plain gloo: nothing is added to the process group.
PROBE = r"""
import importlib, json, sys
import torch
import torch.distributed as dist
import deepspeed
from repro.workload import fix

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
c10d = dist.distributed_c10d
pg = c10d._get_default_group()
ct = importlib.import_module("deepspeed.comm.torch")

def outcome(call):
    try:
        return {"result": type(call()).__name__, "error": None, "message": None}
    except Exception as exc:
        return {"result": None, "error": type(exc).__name__, "message": str(exc)}

def probe():
    gather = ct.TorchBackend.all_gather_coalesced  # looked up now: apply() replaces it
    res = {}
    outs, ins = [torch.zeros(3), torch.zeros(2)], [torch.arange(1.0, 4.0), torch.arange(5.0, 7.0)]
    handles = []
    res["async"] = outcome(lambda: handles.append(gather(object(), outs, ins, group=pg, async_op=True)))
    res["handle"] = type(handles[0]).__name__ if handles else None
    res["async_wait"] = outcome(lambda: handles[0].wait()) if handles else None
    res["async_landed"] = all(torch.equal(o, i) for o, i in zip(outs, ins))
    for o in outs:
        o.zero_()
    res["sync"] = outcome(lambda: gather(object(), outs, ins, group=pg, async_op=False))
    res["sync_landed"] = all(torch.equal(o, i) for o, i in zip(outs, ins))
    # torch leaves a group whose backend refused registered as coalescing: a collective on it
    # is then only recorded and returns torch's placeholder
    res["left_coalescing"] = pg in c10d._world.pg_coalesce_state
    return res

report = {"torch": torch.__version__, "stock": probe()}
c10d._world.pg_coalesce_state.pop(pg, None)  # what stock left behind, so the fixed probe starts clean
report["apply"] = fix.apply()
report["fixed"] = probe()
work = dist.all_reduce(torch.ones(1), async_op=True)
report["next_collective"] = type(work).__name__
with open(sys.argv[1], "w") as fh:
    json.dump(report, fh)
"""


def test_real_gloo_refuses_coalescing_and_the_fix_gathers_one_by_one(tmp_path: Path) -> None:
    python = env_python("cpu-latest")
    (tmp_path / "probe.py").write_text(PROBE)
    proc = subprocess.run(
        [python, "probe.py", str(tmp_path / "out.json")],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO), DS_ACCELERATOR="cpu"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["apply"]["deepspeed"] == "0.19.6"

    stock = report["stock"]
    for call in ("async", "sync"):
        assert stock[call]["error"] == "RuntimeError" and REFUSAL in stock[call]["message"], stock
    assert stock["left_coalescing"] is True

    fixed = report["fixed"]
    assert fixed["async"]["error"] is None and fixed["handle"] == "_CoalescingManager"
    assert fixed["async_wait"]["error"] is None and fixed["async_landed"] is True
    assert fixed["sync"] == {"result": "NoneType", "error": None, "message": None}
    assert fixed["sync_landed"] is True
    assert fixed["left_coalescing"] is False
    assert report["next_collective"] != "_IllegalWork"


def _rank_exceptions(out: Path, record: dict[str, Any]) -> list[dict[str, Any] | None]:
    run_dir = (out / record["logs"]["launcher"]).parent
    ranks = sorted(run_dir.glob("rank*.json"))
    assert len(ranks) == record["world_size"], ranks
    return [json.loads(p.read_text())["exception"] for p in ranks]


def test_plain_gloo_suite_stock_fails_fixed_matches_the_control(tmp_path: Path) -> None:
    env_python("cpu-latest")  # skips (or fails in CI) when the env's venv is not built
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "repro", "repro", "--env", "cpu-latest", "--engine", "venv"]
        + ["--scenarios", "mics", "--transport", "plain", "--world-size", "2", "--steps", "3"]
        + ["--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = {r["run_name"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    # plain only: no sync proof (it would run the adapter)
    assert set(runs) == {"zero3-stock-fp32-plain-w2", "mics-stock-fp32-plain-w2", "mics-fixed-fp32-plain-w2"}
    for record in runs.values():
        assert record["transport"] == "plain" and record["backend"] == "gloo"
        assert record["transport_info"]["adapter"] is None
        run_dir = (out / record["logs"]["launcher"]).parent
        assert not [p for p in _rank_pids(str(run_dir)) if alive(p)], record["run_name"]

    control, stock, fixed = (runs[f"{n}-fp32-plain-w2"] for n in ("zero3-stock", "mics-stock", "mics-fixed"))
    assert control["outcome"] == "clean" and len(control["losses"]) == 3

    assert stock["outcome"] == "crashed" and stock["signature"] == "crash"
    assert stock["illegal_work_messages"] == 0
    for exc in _rank_exceptions(out, stock):  # every rank dies on the refusal
        assert exc is not None and exc["type"] == "RuntimeError" and REFUSAL in exc["message"], exc

    assert fixed["outcome"] == "clean" and fixed["signature"] == "none"
    assert fixed["fix"]["applied"] is True and fixed["illegal_work_messages"] == 0
    assert _rank_exceptions(out, fixed) == [None, None]
    assert fixed["losses"] == control["losses"]
    assert fixed["weights_checksum"] == control["weights_checksum"]
    assert "gone with the fix: MiCS flat gather" in done.stdout
