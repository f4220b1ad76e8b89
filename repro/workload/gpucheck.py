"""In-env probes of `python -m repro gpu-check`: torch's coalescing manager and DeepSpeed's
`all_gather_coalesced` on the real backend (NCCL, which is RCCL on ROCm), one process, one GPU.

    python -m repro.workload.gpucheck raw-torch --device gpu --out FILE
    python -m repro.workload.gpucheck ds-gather --device gpu --out FILE

Each writes facts as JSON (what the placeholder was, what raised, whether the data arrived); the
host side (repro/run/gpu_check/judge.py) turns them into verdicts. `--device cpu` runs the same
probes on gloo with the CPU transport adapter, so the probes themselves are tested without a GPU.
World size 1 is enough: the manager hands out the `_IllegalWork` placeholder whatever the world
size, and one rank needs no launcher. Runs inside the envs: standard library, torch and DeepSpeed.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, TypedDict

if TYPE_CHECKING:
    from repro.workload.device import RanOn
    from repro.workload.fix import FixReport

PROBES = ("raw-torch", "ds-gather")


# One call's outcome: the type it returned, or what it raised.
class Outcome(TypedDict):
    ok: bool
    result: str | None
    error: str | None


# DeepSpeed's all_gather_coalesced, called async then sync (_gather_probe).
class GatherFacts(TypedDict, total=False):
    async_call: Outcome
    async_handle: str | None
    async_wait: Outcome | None
    async_landed_after_wait: bool
    sync_call: Outcome
    sync_landed: bool


# The --out JSON: raw-torch's facts or ds-gather's, with what ran.
class Report(TypedDict, total=False):
    probe: str
    torch: str
    ran_on: RanOn
    manager: str | None  # raw-torch
    placeholder_type: str
    placeholder_wait: Outcome
    cm_works: int
    async_landed: bool
    sync_exit: Outcome
    sync_landed: bool
    deepspeed: str  # ds-gather
    stock: GatherFacts
    fix: FixReport
    fixed: GatherFacts


def _outcome(call: Callable[[], Any]) -> Outcome:
    try:
        result = call()
    except Exception as exc:  # the probes record what raised; nothing here may stop the report
        return {"ok": False, "result": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "result": type(result).__name__, "error": None}


def _start(device: str, ds: bool) -> Any:
    """The process group of one rank and the torch device it computes on."""
    if device == "cpu":
        if ds:
            from repro.workload.cpu import shims
            from repro.workload.runner import free_port

            # prepare_cpu brings DeepSpeed's comm up on gloo, from the launcher's variables.
            for name, value in (
                ("RANK", "0"),
                ("LOCAL_RANK", "0"),
                ("WORLD_SIZE", "1"),
                ("LOCAL_SIZE", "1"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", str(free_port())),
            ):
                os.environ.setdefault(name, value)
            shims.prepare_cpu("fp32")  # before `import deepspeed`: placeholders, gloo accelerator
        from repro.workload.cpu import gloo_transport

        gloo_transport.install("async")
    import torch
    import torch.distributed as dist

    if device == "cpu":
        backend, dev = "gloo", torch.device("cpu")
    else:
        torch.cuda.set_device(0)
        backend, dev = "nccl", torch.device("cuda", 0)
    if not dist.is_initialized():
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return dev


def _sync(dev: Any) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _tensors(dev: Any) -> tuple[Any, Any]:
    import torch

    return torch.zeros(4, device=dev), torch.arange(1.0, 5.0, device=dev)


def _landed(out: Any, inp: Any) -> bool:
    import torch

    return bool(torch.equal(out.cpu(), inp.cpu()))


def raw_torch(dev: Any) -> Report:
    """torch's own `_coalescing_manager` with `device=` set, as DeepSpeed calls it."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    facts: Report = {"manager": None}
    manager = getattr(c10d, "_coalescing_manager", None)
    if manager is None or "async_ops" not in inspect.signature(manager).parameters:
        facts["manager"] = "before torch 2.1: no placeholder, requests are real works"
        return facts
    facts["manager"] = "async_ops"
    out, inp = _tensors(dev)
    with manager(group=None, device=dev, async_ops=True) as cm:
        work = dist.all_gather_into_tensor(out, inp, async_op=True)
    facts["placeholder_type"] = type(work).__name__
    facts["placeholder_wait"] = _outcome(lambda: work.wait())
    facts["cm_works"] = len(cm.works)  # 0: the work was lost (pytorch#122807)
    cm.wait()
    _sync(dev)
    facts["async_landed"] = _landed(out, inp)
    out.zero_()

    def sync_form() -> None:  # how DeepSpeed's hierarchical gather enters it
        with manager(group=None, device=dev, async_ops=False):
            dist.all_gather_into_tensor(out, inp, async_op=True)

    facts["sync_exit"] = _outcome(sync_form)  # AttributeError: the lost work again
    _sync(dev)
    facts["sync_landed"] = _landed(out, inp)
    return facts


def _gather_probe(dev: Any) -> GatherFacts:
    ct = importlib.import_module("deepspeed.comm.torch")
    gather = ct.TorchBackend.all_gather_coalesced
    facts: GatherFacts = {}
    out, inp = _tensors(dev)
    handle: list[Any] = []
    facts["async_call"] = _outcome(
        lambda: handle.append(gather(object(), [out], [inp], group=None, async_op=True))
    )
    facts["async_handle"] = type(handle[0]).__name__ if handle else None
    wait = facts["async_wait"] = _outcome(lambda: handle[0].wait()) if handle else None
    facts["async_landed_after_wait"] = wait is not None and wait["ok"] and _landed(out, inp)
    _sync(dev)  # whatever the stock handle did, the real gather must finish before the next probe
    out.zero_()
    facts["sync_call"] = _outcome(lambda: gather(object(), [out], [inp], group=None, async_op=False))
    facts["sync_landed"] = facts["sync_call"]["ok"] and _landed(out, inp)
    _sync(dev)
    return facts


def ds_gather(dev: Any) -> Report:
    """DeepSpeed's TorchBackend.all_gather_coalesced as released, then with our fix applied."""
    import deepspeed

    from repro.workload import fix

    facts: Report = {"deepspeed": deepspeed.__version__, "stock": _gather_probe(dev)}
    try:
        facts["fix"] = fix.apply()
    except fix.FixNotApplicableError as exc:
        facts["fix"] = {"applied": False, "reason": exc.reason}
        return facts
    facts["fixed"] = _gather_probe(dev)
    return facts


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.workload.gpucheck")
    p.add_argument("probe", choices=PROBES)
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    dev = _start(args.device, ds=args.probe == "ds-gather")
    import torch

    from repro.workload.device import ran_on

    report: Report = {
        "probe": args.probe,
        "torch": torch.__version__,
        "ran_on": ran_on("gpu" if dev.type == "cuda" else "cpu", "nccl" if dev.type == "cuda" else "gloo"),
    }
    report.update(raw_torch(dev) if args.probe == "raw-torch" else ds_gather(dev))
    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
