"""The fix on a real install (integration tier): the real torch + DeepSpeed of a dev venv, one
rank of gloo, with torch's own `_coalescing_manager` and `_IllegalWork`; stock fails, fixed gathers.
The venvs are named by variables (VENVS, MICS_TEST_PYTHON_*). The default tier, on the compiled
code with fakes, is tests/workload/test_fix.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from repro.workload import fix

COMM, MICS = fix.TARGETS
REPO = Path(__file__).resolve().parents[2]

# One rank of gloo. gloo has no coalescing support, so the process group class gets the methods
# torch's manager calls, written to behave like an asynchronous transport: outputs are written
# when the work is waited. Everything else (the manager, _IllegalWork, DeepSpeed) is real.
PROBE = r"""
import importlib, json, sys
import torch
import torch.distributed as dist
import deepspeed
from repro.workload import fix

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
pg = dist.distributed_c10d._get_default_group()
pending, made = [], []

class DeferredWork:
    def __init__(self, pairs):
        self.pairs, self.waits = pairs, 0
    def wait(self, timeout=None):
        self.waits += 1
        for out, inp in self.pairs:
            out.copy_(inp)
        return True

def fast_path(self, outputs, inputs, *opts):
    pending.extend(zip(outputs, inputs))

def end(self, device, *rest):
    made.append(DeferredWork(list(pending)))
    pending.clear()
    return made[-1]

# pybind makes the instance's method attributes read-only; the class takes new ones
PG = type(pg)
PG._start_coalescing = lambda self, device: None
PG._end_coalescing = end
PG.allgather_into_tensor_coalesced = fast_path   # torch 2.1
PG.all_gather_single_coalesced = fast_path       # torch 2.13

ct = importlib.import_module("deepspeed.comm.torch")
mics = importlib.import_module("deepspeed.runtime.zero.mics")

def outcome(call):
    try:
        return {"result": type(call()).__name__, "error": None}
    except Exception as exc:
        return {"result": None, "error": type(exc).__name__}

def probe():
    made.clear()
    out, inp = torch.zeros(3), torch.arange(1.0, 4.0)
    res = {}
    h = ct.TorchBackend.all_gather_coalesced(object(), [out], [inp], group=None, async_op=True)
    res["async_landed_before_wait"] = bool(torch.equal(out, inp))
    res["async_wait"] = outcome(lambda: h.wait())  # on _IllegalWork even the attribute raises
    res["async_landed"] = bool(torch.equal(out, inp))
    out.zero_()
    gather = ct.TorchBackend.all_gather_coalesced
    res["sync"] = outcome(lambda: gather(object(), [out], [inp], async_op=False))
    res["sync_landed"] = bool(torch.equal(out, inp))
    res["real_waits"] = [w.waits for w in made]
    handle = mics.MiCS_AllGatherCoalescedHandle.__new__(mics.MiCS_AllGatherCoalescedHandle)
    handle.allgather_handle, handle.params, handle.complete = dist.distributed_c10d._IllegalWork(), [], False
    res["mics_wait"] = outcome(handle.wait)
    return res

report = {"torch": torch.__version__, "stock": probe()}
report["apply"] = fix.apply()
report["fixed"] = probe()
with open(sys.argv[1], "w") as fh:
    json.dump(report, fh)
"""

VENVS = [
    pytest.param("MICS_TEST_PYTHON_T21", "0.13.1", "RuntimeError", id="torch2.1-ds0.13.1"),
    pytest.param("MICS_TEST_PYTHON_T213_DS0196", "0.19.6", "ValueError", id="torch2.13-ds0.19.6"),
]


def venv_python(var: str) -> str:
    python = os.environ.get(var)
    if not python:
        pytest.skip(f"{var} is not set (path of a dev venv's python with torch + DeepSpeed)")
    if not Path(python).is_file():
        pytest.skip(f"{var}={python} does not exist")
    return python


def run_in_venv(python: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([python, *args], cwd=tmp_path, env=env, capture_output=True, text=True)


@pytest.mark.integration
@pytest.mark.parametrize("var,version,placeholder_error", VENVS)
def test_real_deepspeed_stock_vs_fixed(
    var: str, version: str, placeholder_error: str, tmp_path: Path
) -> None:
    python = venv_python(var)
    (tmp_path / "probe.py").write_text(PROBE)
    proc = run_in_venv(python, ["probe.py", str(tmp_path / "out.json")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["apply"]["deepspeed"] == version
    assert report["apply"]["patched"] == [COMM.qualname, MICS.qualname]

    stock = report["stock"]
    assert stock["async_wait"]["error"] == placeholder_error
    assert stock["sync"]["error"] == placeholder_error
    # stock 0.13.1 lets ValueError through; here each torch raises what its DeepSpeed catches
    assert stock["mics_wait"]["error"] is None

    fixed = report["fixed"]
    assert fixed["async_landed_before_wait"] is False
    assert fixed["async_wait"]["error"] is None and fixed["async_landed"] is True
    assert fixed["sync"] == {"result": "NoneType", "error": None} and fixed["sync_landed"] is True
    assert fixed["real_waits"] == [1, 1]
    assert fixed["mics_wait"]["error"] == placeholder_error


@pytest.mark.integration
def test_release_without_mics_is_refused(tmp_path: Path) -> None:
    python = venv_python("MICS_TEST_PYTHON_T213_DS0198")
    proc = run_in_venv(python, ["-m", "repro.workload.fix", "--out", str(tmp_path / "out.json")], tmp_path)
    assert proc.returncode == 3, proc.stderr[-4000:]
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["applied"] is False and "deepspeed.runtime.zero.mics" in result["reason"]
