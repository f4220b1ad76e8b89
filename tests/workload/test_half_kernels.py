"""The Half kernels adapter (repro/workload/cpu/half_kernels.py) against a real torch.

A child program runs in an env's venv (torch 2.1 for `cpu`, torch 2.13 for `cpu-latest`), tries
fp16 ops without and with the adapter and writes what it saw as JSON; the tests compare that
with what fp16 storage must give: the fp32 result rounded to fp16, inf on overflow, NaN kept.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.envpython import env_python

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

_CHILD = r"""
import json, sys
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from repro.workload.cpu import shims

h = torch.float16
obs = {"torch": torch.__version__}
g = torch.Generator().manual_seed(0)
x = torch.randn(4, 8, generator=g).to(h)
w = torch.randn(8, 8, generator=g).to(h)


def error(fn):
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


obs["before"] = error(lambda: x @ w)
first = shims.install_half_kernels()
obs["installed"] = first
obs["second_is_first"] = shims.install_half_kernels() is first
obs["modes_pushed"] = len(_get_current_dispatch_mode_stack())
if first is None:
    json.dump(obs, sys.stdout)
    sys.exit(0)

y = x @ w
obs["mm_dtype"] = str(y.dtype)
obs["mm_equals_fp32_rounded"] = torch.equal(y, (x.float() @ w.float()).to(h))
big = torch.full((2, 2), 300.0, dtype=h)  # 300 * 300 * 2 = 180000 > fp16's 65504
obs["overflow"] = [str(v) for v in (big @ big).flatten().tolist()]
poisoned = x.clone()
poisoned[0, 0] = float("nan")
obs["nan_row"] = [v != v for v in (poisoned @ w)[0].tolist()]
obs["nan_other_rows_finite"] = bool(torch.isfinite((poisoned @ w)[1:]).all())
acc = torch.zeros(2, 2, dtype=h)
returned = acc.addmm_(big / 100, big / 100)
obs["inplace_returns_self"] = returned is acc
obs["inplace_values"] = acc.flatten().tolist()
out = torch.empty(0, dtype=h)
torch.mm(big / 100, big / 100, out=out)
obs["out_shape"] = list(out.shape)
obs["out_values"] = out.flatten().tolist()
xs = x.clone().requires_grad_()
ws = w.clone().requires_grad_()
loss = F.cross_entropy(F.gelu(F.layer_norm(xs @ ws, (8,))).softmax(-1), torch.zeros(4, dtype=torch.long))
loss.backward()
obs["loss_dtype"] = str(loss.dtype)
obs["grad_dtypes"] = [str(xs.grad.dtype), str(ws.grad.dtype)]
obs["grads_finite"] = bool(torch.isfinite(xs.grad).all() and torch.isfinite(ws.grad).all())
obs["mixed_dtypes_error"] = error(lambda: torch.mm(x, w.float()))
obs["fp32_untouched"] = torch.equal(x.float() @ w.float(), torch.mm(x.float(), w.float()))
obs["upcast_ops"] = list(first["upcast_ops"])
json.dump(obs, sys.stdout)
"""


def _observe(env_id: str) -> dict[str, Any]:
    python = env_python(env_id)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [python, "-c", _CHILD]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout)
    return found


@pytest.fixture(scope="module")
def torch21() -> dict[str, Any]:
    return _observe("cpu")


def test_torch_2_1_lacks_half_matmul_on_cpu_and_the_adapter_is_installed(torch21: dict[str, Any]) -> None:
    assert torch21["torch"].startswith("2.1.")
    assert "not implemented for 'Half'" in torch21["before"]
    installed = torch21["installed"]
    assert installed["reason"] and "not implemented for 'Half'" in installed["reason"]
    assert installed["what"].startswith("fp32 compute, fp16 storage")
    assert torch21["second_is_first"] is True and torch21["modes_pushed"] == 1


def test_results_are_fp32_arithmetic_stored_as_fp16(torch21: dict[str, Any]) -> None:
    assert torch21["mm_dtype"] == "torch.float16"
    assert torch21["mm_equals_fp32_rounded"] is True
    assert torch21["overflow"] == ["inf"] * 4
    assert torch21["nan_row"] == [True] * 8 and torch21["nan_other_rows_finite"] is True


def test_inplace_and_out_variants_write_the_callers_fp16_tensors(torch21: dict[str, Any]) -> None:
    assert torch21["inplace_returns_self"] is True
    assert torch21["inplace_values"] == [18.0] * 4  # 3 * 3 * 2
    assert torch21["out_shape"] == [2, 2] and torch21["out_values"] == [18.0] * 4


def test_forward_and_backward_of_a_small_model_stay_fp16(torch21: dict[str, Any]) -> None:
    assert torch21["loss_dtype"] == "torch.float16"
    assert torch21["grad_dtypes"] == ["torch.float16", "torch.float16"]
    assert torch21["grads_finite"] is True
    for name in ("mm", "native_layer_norm_backward", "_softmax_backward_data"):
        assert f"aten.{name}.default" in torch21["upcast_ops"]


def test_other_errors_and_other_dtypes_pass_through(torch21: dict[str, Any]) -> None:
    # a mismatch torch refuses is still refused, not computed in fp32
    # (mm is already known to lack Half by then, so this is the remembered-op path)
    assert torch21["mixed_dtypes_error"] is not None
    assert torch21["mixed_dtypes_error"].startswith("RuntimeError: expected")
    assert torch21["fp32_untouched"] is True


def test_torch_with_half_cpu_kernels_gets_no_adapter() -> None:
    latest = _observe("cpu-latest")
    assert latest["before"] is None  # torch 2.13 multiplies fp16 on CPU itself
    assert latest["installed"] is None and latest["modes_pushed"] == 0


_HOOKED = """
import json, sys
import deepspeed
from deepspeed.accelerator import get_accelerator
from repro.workload import jobhook

accelerator = get_accelerator()
json.dump({
    "fp16_supported": accelerator.is_fp16_supported(),
    "dtypes": [str(d) for d in accelerator.supported_dtypes()],
    "half_kernels": jobhook._REPORT["transport_info"].get("half_kernels"),
    # DeepSpeed 0.13.1's ZeRO-3 no-gather handle calls this (None on its CPU accelerator)
    "stream_synchronized": accelerator.current_stream().synchronize() is None,
    "default_stream": type(accelerator.default_stream()).__name__,
}, sys.stdout)
"""


def test_a_hooked_process_gets_the_adapter_and_an_accelerator_that_supports_fp16() -> None:
    """What DeepSpeed's test harness asks (`is_fp16_supported`) before it makes fp16 or bf16
    data, in a process of a user's job on the CPU twin (the hook's CPU setup, no job runner)."""
    hook = REPO / "repro" / "workload" / "hook"
    env = dict(os.environ, MICS_REPRO_HOOK="1", MICS_REPRO_DEVICE="cpu", MICS_REPRO_ROOT=str(REPO))
    env["PYTHONPATH"] = str(hook)
    argv = [env_python("cpu"), "-c", _HOOKED]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["fp16_supported"] is True and "torch.float16" in seen["dtypes"]
    assert "not implemented for 'Half'" in seen["half_kernels"]["reason"]
    assert seen["stream_synchronized"] is True and seen["default_stream"] == "HostStream"
