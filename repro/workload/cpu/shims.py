"""What DeepSpeed needs to run its CPU accelerator over gloo (CPU runs only; never on GPUs).

Test scaffolding, not part of the bug:
- DeepSpeed < 0.14.1 (before PR #5206) refuses `DS_ACCELERATOR=cpu` unless
  `intel_extension_for_pytorch` imports, and its CPU accelerator imports
  `oneccl_bindings_for_pytorch` at module level. Neither exists for the torch releases we test on
  CPU (IPEX on PyPI starts at torch 2.6). When a module is missing we provide an EMPTY
  placeholder module of that name (a meta path finder, last in `sys.meta_path`, so a real
  installation always wins). Nothing in DeepSpeed's CPU path uses their contents.
- The CPU accelerator names "ccl" as its communication backend; we register a subclass of it
  (DeepSpeed's documented `set_accelerator`) that names "gloo", and start DeepSpeed's
  distributed layer with `deepspeed.init_distributed(dist_backend="gloo")`.
- The accelerator counts devices with `numactl` unless `LOCAL_SIZE` is set; we default it to
  torchrun's LOCAL_WORLD_SIZE (the launcher sets it smaller to emulate several nodes).
- DeepSpeed >= 0.14 JIT-compiles its shared-memory all-reduce op ("ShareMemCommBuilder", used
  only by `inference_all_reduce`) when its comm backend starts: minutes of C++ compilation per
  environment, in a cache that DeepSpeed releases overwrite for each other. Training never uses
  it, so the subclass answers that op builder with None, which DeepSpeed treats as "op absent".
- triton is hidden (`UNUSED_ON_CPU`): `import deepspeed` tries `import triton` (deepspeed/__init__.py,
  for HAS_TRITON) and PyPI's CUDA build of torch brings it along, which costs about 1 s of CPU per
  import on a loaded 2-core host. DeepSpeed uses triton only in its GPU inference kernels and
  sparse attention; torch only in inductor and its CUDA sparse kernels. Neither is on a CPU
  training path, and a CPU build of torch has no triton at all. DeepSpeed then runs with
  HAS_TRITON = False, as on such an install. Recorded in each run's `cpu_shims.hidden_modules`.
- fp16: the CPU accelerator reports fp16 unsupported unless oneDNN has fp16 kernels for this CPU,
  and torch < 2.2 has no Half kernels on CPU for matmul, layer norm, softmax and more. Where
  torch lacks them, the Half kernels adapter (repro/workload/cpu/half_kernels.py) supplies them
  (fp32 compute, fp16 storage) and the subclass reports fp16 as supported, so DeepSpeed's fp16
  engine, loss scaler and collectives, and a harness that asks the accelerator which dtype to
  use, run fp16 as released.
- Streams: DeepSpeed's CPU accelerator answers `current_stream()` and `default_stream()` with
  None, yet DeepSpeed < 0.14 calls `get_accelerator().current_stream().synchronize()` in ZeRO-3's
  no-gather handles (shard or partition size 1; later releases ask `resolves_data_dependency()`
  first). The subclass answers with `HostStream`, whose synchronize and waits return at once: CPU
  kernels finish before they return, as a GPU stream's do once synchronized. It is not a device
  synchronize: collectives in flight are not waited for, as on a GPU's compute stream.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from repro.workload.cpu.gloo_transport import Adapter
    from repro.workload.cpu.half_kernels import HalfKernels

PLACEHOLDER_MODULES = ("intel_extension_for_pytorch", "oneccl_bindings_for_pytorch")
_SKIPPED_OP_BUILDERS = ("ShareMemCommBuilder",)
# DeepSpeed 0.14.1 (PR #5206) falls back to gloo without oneCCL and stopped requiring IPEX.
_FIRST_DS_WITHOUT_PLACEHOLDERS = (0, 14, 1)


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds empty placeholder modules for names no real finder resolved."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any | None:
        if fullname in self.names:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: Any) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = (
            "Empty placeholder created by repro.workload.cpu.shims so that DeepSpeed < 0.14.1 "
            "can load its CPU accelerator; it provides nothing."
        )
        module.__dict__["__repro_placeholder__"] = True


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def deepspeed_version() -> str | None:
    try:
        return importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return None


def install_placeholders(ds_version: str | None) -> list[str]:
    """Make missing IPEX/oneCCL importable as empty modules when this DeepSpeed needs them."""
    if ds_version is None or _version_tuple(ds_version) >= _FIRST_DS_WITHOUT_PLACEHOLDERS:
        return []
    installed = [f for f in sys.meta_path if isinstance(f, _PlaceholderFinder)]
    if installed:  # already in place (a second call, or a rank forked after the first one)
        return list(installed[0].names)
    missing = [name for name in PLACEHOLDER_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        sys.meta_path.append(_PlaceholderFinder(missing))
    return missing


def torch_runs_fp16_on_cpu() -> tuple[bool, str]:
    """Try the fp16 ops the model uses; returns (ok, first error)."""
    import torch
    from torch.nn import functional as F

    x = torch.ones(2, 4, dtype=torch.float16)
    w = torch.ones(4, 4, dtype=torch.float16)
    try:
        F.linear(x, w, torch.zeros(4, dtype=torch.float16))
        F.layer_norm(x, (4,), torch.ones(4, dtype=torch.float16), torch.zeros(4, dtype=torch.float16))
        F.gelu(x)
        (x @ w).softmax(dim=-1)
        F.embedding(torch.zeros(2, dtype=torch.int64), w)
    except RuntimeError as exc:
        return False, str(exc).splitlines()[0]
    return True, ""


def install_half_kernels() -> HalfKernels | None:
    """The Half kernels adapter in this thread when this torch lacks Half kernels on CPU
    (repro/workload/cpu/half_kernels.py), for the record; None where torch has them."""
    from repro.workload.cpu import half_kernels

    if half_kernels.installed():  # the probe below would pass under the adapter itself
        return half_kernels.installed()
    ok, error = torch_runs_fp16_on_cpu()
    return None if ok else half_kernels.install(error)


class HostStream:
    """The CPU's one stream (module docstring, Streams): every operation on it has completed."""

    def synchronize(self) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def query(self) -> bool:
        return True


def _gloo_accelerator(claim_fp16: bool) -> Any:
    import torch
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    class GlooCpuAccelerator(CPU_Accelerator):
        """DeepSpeed's CPU accelerator talking gloo (and, when torch can compute it, fp16)."""

        def __init__(self) -> None:
            super().__init__()
            self._communication_backend_name = "gloo"

        def is_fp16_supported(self) -> bool:
            return True if claim_fp16 else bool(super().is_fp16_supported())

        def supported_dtypes(self) -> list[Any]:
            dtypes = list(super().supported_dtypes())
            if claim_fp16 and torch.float16 not in dtypes:
                dtypes.append(torch.float16)
            return dtypes

        def create_op_builder(self, op_name: str) -> Any:
            if op_name in _SKIPPED_OP_BUILDERS:
                return None
            return super().create_op_builder(op_name)

        def current_stream(self, device_index: Any = None) -> Any:
            stream = super().current_stream(device_index)
            return HostStream() if stream is None else stream

        def default_stream(self, device_index: Any = None) -> Any:
            stream = super().default_stream(device_index)
            return HostStream() if stream is None else stream

        def synchronize(self, device_index: Any = None) -> Any:
            # On a GPU, a device synchronize also waits for the communication streams, and
            # DeepSpeed relies on it ("guarantee the communication to be completed"; our fix when
            # a release lost the coalesced work). DeepSpeed's CPU accelerator returns at once;
            # here the gloo adapter's collectives in flight complete first.
            from repro.workload.cpu import gloo_transport

            gloo_transport.synchronize_device()
            return super().synchronize(device_index)

    return GlooCpuAccelerator()


# Importable in the env, imported by `import deepspeed` (and by nothing torch does on CPU), used
# by no CPU training path: hidden before DeepSpeed is imported (module docstring).
UNUSED_ON_CPU = ("triton",)


def hide_unused_modules(names: Sequence[str] = UNUSED_ON_CPU) -> list[str]:
    """Make `import NAME` fail with ModuleNotFoundError (None in sys.modules, Python's documented
    way) for each of `names` not imported yet; returns those hidden now or earlier. A module
    already imported is left alone: it was wanted."""
    hidden = []
    for name in names:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]
        if sys.modules[name] is None:
            hidden.append(name)
    return hidden


# Set by `before_deepspeed_import` in this process: the pre-imported launcher
# (repro/workload/prefork_server.py) runs it, imports DeepSpeed, then forks the ranks.
_PREPARED_BEFORE_IMPORT = False


# What prepare_cpu (or only its pre-import step) did: the record's transport_info.cpu_shims.
class CpuShims(TypedDict, total=False):
    DS_ACCELERATOR: str
    LOCAL_SIZE: str
    placeholders: list[str]
    hidden_modules: list[str]
    accelerator: str
    skipped_op_builders: list[str]
    fp16_claimed: bool
    dist_backend: str


# A CPU run's transport_info (train.py) and the hook's (jobhook.py).
class TransportInfo(TypedDict):
    adapter: Adapter | None  # None: plain gloo
    cpu_shims: CpuShims
    half_kernels: HalfKernels | None


def before_deepspeed_import() -> CpuShims:
    """What must hold when DeepSpeed is imported on CPU: the accelerator forced to cpu, for
    DeepSpeed < 0.14.1 the placeholder modules, and triton hidden. Idempotent; returns what was
    done."""
    global _PREPARED_BEFORE_IMPORT
    done: CpuShims = {}
    # forced, not defaulted: DeepSpeed < 0.14.1 would otherwise pick cuda on a CUDA build of torch
    done["DS_ACCELERATOR"] = os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))
    done["LOCAL_SIZE"] = os.environ["LOCAL_SIZE"]
    done["placeholders"] = install_placeholders(deepspeed_version())
    done["hidden_modules"] = hide_unused_modules()
    _PREPARED_BEFORE_IMPORT = True
    return done


def prepare_cpu(dtype: str) -> CpuShims:
    """Get DeepSpeed running on CPU/gloo. Must run before `import deepspeed` (imports it), unless
    `before_deepspeed_import` ran in this process before DeepSpeed was imported (a forked rank
    of the pre-imported launcher): the same steps in the same order, the import already done.

    Returns what was done, for the run record.
    """
    if "deepspeed" in sys.modules and not _PREPARED_BEFORE_IMPORT:
        raise RuntimeError("prepare_cpu() must run before deepspeed is imported")
    done = before_deepspeed_import()

    # fp16 on a torch without Half CPU kernels needs `install_half_kernels` too (train.py)
    claim_fp16 = dtype == "fp16"
    import deepspeed
    from deepspeed.accelerator import get_accelerator, set_accelerator

    if claim_fp16 and get_accelerator().is_fp16_supported():
        claim_fp16 = False  # DeepSpeed already allows it: nothing to claim
    set_accelerator(_gloo_accelerator(claim_fp16))
    done["accelerator"] = "cpu accelerator with communication backend gloo"
    done["skipped_op_builders"] = list(_SKIPPED_OP_BUILDERS)
    done["fp16_claimed"] = claim_fp16
    deepspeed.init_distributed(dist_backend="gloo")
    done["dist_backend"] = "gloo"
    return done
