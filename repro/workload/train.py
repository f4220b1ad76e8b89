"""Per-rank training entry point: `torchrun ... -m repro.workload.train --run-dir DIR ...`.

Each rank trains the small model for a few steps with DeepSpeed ZeRO-3 or MiCS and writes
DIR/rank{RANK}.json (see `RankRecord`), also when it fails. Before anything heavy it writes
DIR/rank{RANK}.pid, sends its stdout/stderr (C level included) to DIR/rank{RANK}.log and arms
SIGUSR1 to dump every thread's Python stack into DIR/rank{RANK}.stack, so the launcher can see a
hang. SIGTERM writes the json (with the main thread's stack) and exits at once, even while the
main thread is stuck inside a collective; SIGINT ends the run through the normal error path.

Imports only the standard library at module level; torch and DeepSpeed load after the setup.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import importlib.metadata
import json
import os
import platform
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict, cast

from repro.workload.defaults import DEFAULT_SEED, DEFAULT_STEPS
from repro.workload.ds_config import config_dtype
from repro.workload.record import (
    CPU_TRANSPORTS,
    PATCHES,
    SCENARIOS,
    RecordedException,
    Transport,
    finite_or_none,
    write_json_atomic,
)

if TYPE_CHECKING:
    from repro.workload.device import RanOn
    from repro.workload.fix import FixReport

DEVICES = ("cpu", "gpu")


# A rank's DIR/rank{RANK}.json, read into the run's record by the runner: the rank writes every key
# (null until it gets that far); total=False for what a reader finds.
class RankRecord(TypedDict, total=False):
    rank: int
    world_size: int
    pid: int
    losses: list[float | None]
    loss_scale: list[float | None] | None
    skipped_steps: int
    illegal_work_messages: int
    exception: RecordedException | None
    weights_checksum: str | None
    train_s: float | None
    backend: str | None
    transport: str | None
    versions: dict[str, str | None]
    fix: FixReport | None
    devices_per_node: int | None
    steps_completed: int
    # extras: what the CPU scaffolding did (each module's report) and the model that ran
    transport_info: dict[str, Any] | None
    model: dict[str, int] | None
    # what the run really used: device, backend, GPUs, arch, runtimes (repro/workload/device.py)
    ran_on: RanOn | None


RANK_KEYS = tuple(RankRecord.__annotations__)


class ScenarioUnsupported(RuntimeError):
    """The installed DeepSpeed cannot run the requested scenario (e.g. no MiCS in 0.19.8)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m repro.workload.train", description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True)
    p.add_argument("--ds-config", required=True, help="DeepSpeed config json, used as is")
    p.add_argument("--scenario", choices=SCENARIOS, required=True)
    p.add_argument("--patch", choices=PATCHES, default="stock")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument(
        "--transport",
        choices=CPU_TRANSPORTS,
        default="async",
        help="gloo adapter mode (CPU), or plain: gloo as torch ships it, no adapter",
    )
    p.add_argument("--device", choices=DEVICES, default="cpu")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    return p.parse_args(argv)


def _keep_open(handle: Any) -> Any:
    _OPEN_FILES.append(handle)
    return handle


_OPEN_FILES: list[Any] = []


def heartbeat(run_dir: str, rank: int) -> None:
    """Touch DIR/rank{RANK}.heartbeat when training starts and after each step: a run that stops
    touching it for --stall-timeout seconds hung, without waiting for the whole time limit."""
    with open(os.path.join(run_dir, f"rank{rank}.heartbeat"), "w") as fh:
        fh.write(f"{time.time()}\n")


def setup_rank_files(run_dir: str, rank: int) -> None:
    log = _keep_open(open(os.path.join(run_dir, f"rank{rank}.log"), "a", buffering=1))
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    stack = _keep_open(open(os.path.join(run_dir, f"rank{rank}.stack"), "w"))
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
    # The pid goes last: the launcher signals (SIGUSR1 for stacks) only pids it has read, and
    # SIGUSR1 before the handler is armed would kill the rank instead of dumping its stack.
    with open(os.path.join(run_dir, f"rank{rank}.pid"), "w") as fh:
        fh.write(f"{os.getpid()}\n")


_FINISHED = threading.Event()


def arm_termination(record_path: str, out: RankRecord) -> None:
    """On SIGTERM (torchrun stopping the surviving ranks, the launcher after a hang) write the
    record and exit now. A Python signal handler would only run once the main thread returns from
    C code, which a rank blocked in a collective never does; the C-level handler still writes the
    signal number to the wakeup fd, and a watcher thread acts on it.
    """
    reader, writer = socket.socketpair()
    _keep_open(reader)
    _keep_open(writer)
    writer.setblocking(False)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the watcher does the work
    signal.set_wakeup_fd(writer.fileno())
    main_thread = threading.get_ident()

    def watch() -> None:
        while int(signal.SIGTERM) not in reader.recv(64):
            pass
        if not _FINISHED.is_set():
            frame = sys._current_frames().get(main_thread)
            snapshot = out.copy()  # with the lists the main thread still appends to
            snapshot["losses"] = list(out["losses"])
            snapshot["loss_scale"] = None if out["loss_scale"] is None else list(out["loss_scale"])
            if snapshot["exception"] is None:
                where = "".join(traceback.format_stack(frame)) if frame is not None else ""
                snapshot["exception"] = {
                    "type": "Terminated",
                    "traceback": where,
                    "message": "SIGTERM received (traceback: where the main thread was)",
                }
            write_rank_record(record_path, snapshot)
        os._exit(128 + int(signal.SIGTERM))

    threading.Thread(target=watch, name="sigterm-recorder", daemon=True).start()


# `config` below: the run's DeepSpeed config, free-form JSON (ds_config.py).
def check_scenario(scenario: str, config: dict[str, Any], world_size: int) -> None:
    """Refuse a config that would silently run another scenario than the one recorded."""
    zero = config.get("zero_optimization", {})
    if zero.get("stage") != 3:
        raise ValueError("the config must select ZeRO stage 3")
    shard = zero.get("mics_shard_size", -1) or -1
    hierarchical = bool(zero.get("mics_hierarchical_params_gather", False))
    expected = {
        "zero3": shard <= 0,
        "mics": 0 < shard and not hierarchical,
        "mics-hier": 0 < shard and hierarchical,
        "mics-replica": 0 < shard < world_size and not hierarchical,
    }[scenario]
    if not expected:
        raise ValueError(
            f"scenario {scenario!r} does not match the config (mics_shard_size={shard}, "
            f"mics_hierarchical_params_gather={hierarchical}, world size {world_size})"
        )


def collect_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    found.update(dict.fromkeys(("torch", "deepspeed", "hip", "cuda", "nccl")))
    try:
        import torch
    except ImportError:
        return found
    found["torch"] = torch.__version__
    found["hip"] = getattr(torch.version, "hip", None)
    found["cuda"] = torch.version.cuda
    import torch.distributed as dist

    from repro.workload.device import nccl_version

    if dist.is_nccl_available():
        found["nccl"] = nccl_version(torch)
    if "deepspeed" in sys.modules:
        found["deepspeed"] = sys.modules["deepspeed"].__version__
    else:  # failed before DeepSpeed was imported: the installed distribution still says which
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found["deepspeed"] = importlib.metadata.version("deepspeed")
    return found


def start_distributed(args: argparse.Namespace, dtype: str, out: RankRecord) -> Any:
    """Bring up DeepSpeed's distributed layer; returns the torch device ranks compute on."""
    if args.device == "cpu":
        from repro.workload.cpu import gloo_transport
        from repro.workload.cpu import shims as cpu_shims

        out["backend"], out["transport"] = "gloo", args.transport
        shims = cpu_shims.prepare_cpu(dtype)
        # plain: torch's gloo as released, what a CPU user gets; it lacks the coalescing that
        # MiCS's gather enters, so that is what this transport tests.
        plain = args.transport == Transport.PLAIN.value
        adapter = None if plain else gloo_transport.install(args.transport)
        # fp16 on a torch without Half CPU kernels: the adapter supplies them (fp32 compute)
        half = cpu_shims.install_half_kernels() if dtype == "fp16" else None
        out["transport_info"] = {"adapter": adapter, "cpu_shims": shims, "half_kernels": half}
        import torch

        return torch.device("cpu")
    import deepspeed
    import torch

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    out["backend"], out["transport"] = "nccl", "native"
    deepspeed.init_distributed(dist_backend="nccl")
    return torch.device("cuda", local_rank)


def build_model(args: argparse.Namespace, config: dict[str, Any]) -> Any:
    import deepspeed
    import torch

    from repro.workload.model import ModelShape, TinyGPT

    shape = ModelShape(
        vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.heads, seq_len=args.seq_len
    )
    if args.scenario == "zero3":
        context = deepspeed.zero.Init
    else:
        context = getattr(deepspeed.zero, "MiCS_Init", None)
        if context is None:
            raise ScenarioUnsupported(f"DeepSpeed {deepspeed.__version__} has no deepspeed.zero.MiCS_Init")
    torch.manual_seed(args.seed)
    with context(config_dict_or_path=config):
        return TinyGPT(shape)


def train(args: argparse.Namespace, config: dict[str, Any], out: RankRecord) -> None:
    dtype = config_dtype(config)
    check_scenario(args.scenario, config, int(out["world_size"]))
    from repro.workload import logcount

    counter = logcount.install()
    from repro.workload import collectives

    # Record only (calls pass through unchanged): the runner's hang watcher reads these files.
    # Before DeepSpeed's init_distributed: its TorchBackend binds reduce_scatter_tensor and
    # all_gather_into_tensor once, when it is made.
    collectives.install(os.path.join(args.run_dir, collectives.FOLDER))
    device = start_distributed(args, dtype, out)
    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    from repro.workload.model import rank_rows, synthetic_batch

    out["versions"] = collect_versions()
    if out["rank"] == 0:  # rank 0 speaks for the run; every rank uses the same kind of device
        from repro.workload.device import ran_on

        out["ran_on"] = ran_on(args.device, out["backend"])
    if args.patch == "fixed":
        from repro.workload import fix

        out["fix"] = fix.apply()
    out["devices_per_node"] = int(get_accelerator().device_count())
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(args, config)
    parameters = sum(int(p.ds_numel) for p in model.parameters())
    out["model"] = {**dataclasses.asdict(model.shape), "parameters": parameters}
    engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    rows = engine.train_micro_batch_size_per_gpu() * world
    out["loss_scale"] = [] if dtype == "fp16" else None
    started = time.perf_counter()
    heartbeat(args.run_dir, rank)  # training starts: from here a silent rank counts as stalled
    try:
        for step in range(args.steps):
            batch = rank_rows(synthetic_batch(model.shape, args.seed, step, rows), rank, world).to(device)
            skipped_before = engine.skipped_steps
            loss = engine(batch)
            engine.backward(loss)
            engine.step()
            mean = loss.detach().float().reshape(1).clone()
            dist.all_reduce(mean)
            out["losses"].append(finite_or_none(mean.item() / world))
            if out["loss_scale"] is not None:  # the scale after this step's update
                out["loss_scale"].append(finite_or_none(engine.optimizer.cur_scale))
            out["skipped_steps"] += engine.skipped_steps - skipped_before
            out["steps_completed"] = step + 1
            heartbeat(args.run_dir, rank)
            out["illegal_work_messages"] = counter.failures
    finally:
        out["train_s"] = round(time.perf_counter() - started, 3)
        out["illegal_work_messages"] = counter.failures
    out["weights_checksum"] = weights_checksum(engine.module)


def _partition_position(param: Any) -> tuple[int, int]:
    """(index of this rank's partition, number of partitions) of a ZeRO-3 or MiCS parameter."""
    import torch.distributed as dist

    comm = getattr(param, "comm", None)  # MiCS attaches its shard/replica groups here
    if comm is not None and getattr(comm, "param_shard_size", -1) > 0:
        return int(comm.param_shard_rank), int(comm.param_shard_size)
    group = param.ds_process_group
    return dist.get_rank(group), dist.get_world_size(group)


def weights_checksum(module: Any) -> str:
    """sha256 of every parameter's full fp32 values, in name order.

    Built from each rank's own partition (`ds_tensor`) exchanged with a plain list collective,
    never through DeepSpeed's gather paths (those are what is under test). With MiCS, replicas
    hold the same partition; the lowest rank's copy is used.
    """
    import ctypes
    import hashlib

    import torch
    import torch.distributed as dist

    mine = []
    for name, param in module.named_parameters():
        index, parts = _partition_position(param)
        data = param.ds_tensor.detach().float().cpu().clone()
        mine.append((name, index, parts, int(param.ds_numel), tuple(param.ds_shape), data))
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    pieces: dict[str, dict[int, Any]] = {}
    meta: dict[str, tuple[int, int, tuple[int, ...]]] = {}
    for rank_entries in everyone:
        for name, index, parts, numel, shape, data in rank_entries:
            pieces.setdefault(name, {}).setdefault(index, data)
            meta[name] = (parts, numel, shape)
    digest = hashlib.sha256()
    for name in sorted(pieces):
        parts, numel, shape = meta[name]
        if sorted(pieces[name]) != list(range(parts)):
            raise RuntimeError(f"partitions of {name} missing: have {sorted(pieces[name])} of {parts}")
        full = torch.cat([pieces[name][i].reshape(-1) for i in range(parts)])[:numel].contiguous()
        digest.update(f"{name}:{list(shape)}:".encode())
        # raw bytes without numpy, which not every torch environment has
        digest.update(ctypes.string_at(full.data_ptr(), full.numel() * full.element_size()))
    return digest.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    # Every key from the start (null until the rank gets that far), as the runner reads them.
    out = cast(RankRecord, dict.fromkeys(RANK_KEYS))
    out.update(
        RankRecord(
            rank=rank,
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            pid=os.getpid(),
            losses=[],
            skipped_steps=0,
            illegal_work_messages=0,
            versions={"python": platform.python_version()},
            steps_completed=0,
        )
    )
    setup_rank_files(args.run_dir, rank)
    record_path = os.path.join(args.run_dir, f"rank{rank}.json")
    arm_termination(record_path, out)
    code = 0
    try:
        with open(args.ds_config) as fh:
            config = json.load(fh)
        train(args, config, out)
    except BaseException as exc:  # the record must exist whatever happened
        code = 1
        out["exception"] = {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }
        traceback.print_exc()
        if out["versions"].get("torch") is None:
            out["versions"] = collect_versions()
    finally:
        write_rank_record(record_path, out)
        _FINISHED.set()
    return code


def write_rank_record(path: str, out: RankRecord) -> None:
    try:
        write_json_atomic(path, out)
    except (TypeError, ValueError) as exc:  # something unserialisable slipped in: keep the essentials
        slim = {key: out.get(key) for key in ("rank", "world_size", "pid", "losses", "steps_completed")}
        slim["exception"] = out.get("exception") or {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "",
        }
        write_json_atomic(path, {key: slim.get(key) for key in RANK_KEYS})


def exit_now(code: int) -> NoReturn:
    """Leave without interpreter teardown once the record is on disk.

    Tearing down torch, DeepSpeed and the gloo groups takes seconds per rank on a loaded host and
    proves nothing about the bug; every result this rank owes is already written atomically.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
