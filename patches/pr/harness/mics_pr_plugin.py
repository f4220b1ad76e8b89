"""pytest plugin: run DeepSpeed-style `DistributedTest` classes on CPU, one process per rank.

Used as `python -m pytest -p mics_pr_plugin patches/pr/tests/...` with this folder and the repo
root on PYTHONPATH (`repro.upstream.pr.regression` sets that up). It stands in for what DeepSpeed's
tests/conftest.py and tests/unit/common.py do on GPUs, and adds what CPU runs need:
- before pytest imports a test module (which imports deepspeed): DS_ACCELERATOR=cpu and the empty
  placeholder modules DeepSpeed < 0.14.1 needs for its CPU accelerator (repro.workload.cpu.shims);
- in every rank: the gloo-speaking CPU accelerator, `deepspeed.init_distributed("gloo")`, and the
  project's gloo transport adapter (repro.workload.cpu.gloo_transport), which gives gloo the
  coalescing and tensor collectives NCCL has. The `_IllegalWork` placeholders still come from
  torch's own `_coalescing_manager`; nothing of DeepSpeed is changed by the harness.

MICS_PR_TRANSPORT picks the adapter mode (async: NCCL-like, the default; strict: outputs stay
poisoned until waited, which makes any missing wait visible). MICS_PR_HANG_S (default 900) is a
guard against a deadlocked test, never a performance limit: a test that hits it fails as hung.
"""

from __future__ import annotations

import importlib.util
import inspect
import multiprocessing
import os
import queue
import socket
import sys
import time
import traceback
from typing import Any

import pytest

TRANSPORT_ENV = "MICS_PR_TRANSPORT"
HANG_ENV = "MICS_PR_HANG_S"
DEFAULT_HANG_S = 900.0
# After one rank has failed, how long the others get to report before they are stopped: a rank
# left waiting in a collective its failed peer never joins would otherwise hold the test forever.
PEER_GRACE_S = 60.0


def _prepare_process() -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from repro.workload.cpu import shims as cpu_shims

    cpu_shims.install_placeholders(cpu_shims.deepspeed_version())


# At plugin import, i.e. before collection imports deepspeed, in the parent and in every rank.
_prepare_process()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _load_module(path: str, name: str) -> Any:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot import {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _rank_main(rank: int, world: int, port: int, test_file: str, module_name: str, cls_name: str,
               method: str, kwargs: dict[str, Any], mode: str, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    try:
        from repro.workload.cpu import shims as cpu_shims
        from repro.workload.cpu import gloo_transport

        cpu_shims.prepare_cpu("fp32")
        gloo_transport.install(mode)
        module = _load_module(test_file, module_name)
        getattr(getattr(module, cls_name)(), method)(**kwargs)
        results.put((rank, "passed", ""))
    except BaseException as exc:  # the parent reports it; a rank must always answer
        kind = "skipped" if isinstance(exc, pytest.skip.Exception) else "failed"
        detail = str(exc) if kind == "skipped" else traceback.format_exc()
        results.put((rank, kind, detail))


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def launch(item: pytest.Item, cls: type, world: int) -> dict[int, tuple[str, str]]:
    """Run the item's method in `world` spawned ranks; {rank: (passed|failed|skipped|hung, detail)}."""
    func = item.obj  # type: ignore[attr-defined]
    wanted = [p for p in inspect.signature(func).parameters if p != "self"]
    funcargs = item.funcargs  # type: ignore[attr-defined]
    kwargs = {name: funcargs[name] for name in wanted if name in funcargs}
    mode = os.environ.get(TRANSPORT_ENV, "async")
    hang_s = float(os.environ.get(HANG_ENV, DEFAULT_HANG_S))
    ctx = multiprocessing.get_context("spawn")  # torch must not be forked mid-initialisation
    results = ctx.Queue()
    port = _free_port()
    module = item.module  # type: ignore[attr-defined]
    procs = [ctx.Process(target=_rank_main, name=f"rank{r}",
                         args=(r, world, port, str(item.path), module.__name__, cls.__name__,
                               func.__name__, kwargs, mode, results))
             for r in range(world)]
    for proc in procs:
        proc.start()
    outcome: dict[int, tuple[str, str]] = {}
    deadline = time.monotonic() + hang_s
    try:
        while len(outcome) < world:
            try:
                rank, kind, detail = results.get(timeout=1.0)
            except queue.Empty:
                # A rank that died without answering (a crash in C++) must not cost the whole guard.
                if not any(p.is_alive() for p in procs) or time.monotonic() > deadline:
                    break
                continue
            outcome[rank] = (kind, detail)
            if kind == "failed":
                deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
    finally:
        _stop(procs)
    for rank, proc in enumerate(procs):
        if rank not in outcome:
            outcome[rank] = ("hung", f"rank {rank} gave no result (exit code {proc.exitcode})")
    return outcome


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    cls = getattr(item, "cls", None)
    if cls is None or not getattr(cls, "is_dist_test", False):
        return
    outcome = launch(item, cls, int(cls.world_size))
    item.runtest = lambda: None  # type: ignore[method-assign]  # ran in the ranks already
    failed = {r: d for r, (k, d) in sorted(outcome.items()) if k in ("failed", "hung")}
    if failed:
        text = "\n".join(f"--- rank {r} ---\n{d}" for r, d in failed.items())
        pytest.fail(f"{len(failed)} of {len(outcome)} ranks failed:\n{text}", pytrace=False)
    skipped = {d for k, d in outcome.values() if k == "skipped"}
    if skipped:
        pytest.skip("; ".join(sorted(skipped)))
