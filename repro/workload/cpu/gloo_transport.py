"""CPU transport adapter: gives torch's gloo backend the tensor collectives NCCL has.

What this is: test scaffolding that lets DeepSpeed ZeRO-3/MiCS run on CPUs. It is NOT part of
the bug and NOT part of the fix. torch's and DeepSpeed's Python code run unmodified on top of it;
in particular the `_IllegalWork` placeholder still comes from torch's own `_coalescing_manager`.

Why it is needed: gloo lacks some of the single-tensor collectives (`_allgather_base`,
`_reduce_scatter_base` and their `*_coalesced` forms on torch 2.1; bf16 on torch 2.1) and no
torch release's gloo gives `startCoalescing`/`endCoalescing` NCCL's meaning (2.1+ raise, 2.0's
are no-ops), yet DeepSpeed's MiCS path enters them (it always passes `device=`). The adapter
assigns Python methods on the pybind class `torch.distributed.ProcessGroup`; they act on gloo
groups only and hand every other backend to the original method. What gloo lacks is found by
probing a private 1-rank gloo group, not from version numbers.

Semantics modelled on NCCL (documented because the bug is a missing wait):
- a collective's outputs are defined only once its work completes; inputs are captured at issue;
- collectives issued between `_start_coalescing` and `_end_coalescing` form one group that
  completes as a unit: waiting the group's work (torch >= 2.1: what `_end_coalescing` returns)
  or any member's work (torch 2.0, where DeepSpeed waits `reqs[-1]`) waits all of them;
- one NCCL stream per communicator runs collectives in issue order, so waiting a work also
  completes every work issued before it on the same process group;
- a device synchronize (DeepSpeed's `get_accelerator().synchronize()`, repro/workload/cpu/shims.py)
  waits for every collective in flight, as a GPU's waits for its communication streams;
- where the release's NCCL loses a coalescing block's work (`LOSES_BLOCK_WORK`, pytorch#122807), a
  `*_coalesced` collective issued inside a block does not join it, and `_end_coalescing` returns
  None for a block nothing joined: torch's `_coalescing_manager(device=...)` then overwrites the real
  work with None exactly as it does on those GPUs.

Modes (`MODES`):
- async:  the collective runs on gloo's own threads; a delivery thread per process group copies
          each result into the caller's output as soon as gloo completes it, in issue order,
          whether or not anyone waits, as NCCL eventually writes its buffer. Reading before
          wait() is a real race.
- sync:   every collective has completed before the call returns. A control: with it a missing
          wait cannot be observed, so a bug that disappears here is a missing-wait bug.
- strict: outputs are poisoned (NaN, or the dtype's max for integers) when the collective is
          issued and get the real values only when the work (or its group, or a later work of
          the same process group) is waited. Makes a missing wait deterministic.
"""

from __future__ import annotations

import datetime
import enum
import itertools
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, TypedDict

import torch
import torch.distributed as dist

from repro.workload.record import TRANSPORT_MODES, Transport

MODES = TRANSPORT_MODES  # the adapter's modes, as the module docstring lists them


class Mode(enum.Enum):
    """The adapter's modes: the record's transports other than native and plain (one closed set)."""

    ASYNC = Transport.ASYNC.value
    SYNC = Transport.SYNC.value
    STRICT = Transport.STRICT.value


# ProcessGroup methods torch's Python layer calls for the tensor collectives; which of them exist
# depends on the release (2.0/2.1: _allgather_base...; 2.13: all_gather_single...).
_GATHER_NAMES = ("_allgather_base", "all_gather_single")
_REDUCE_SCATTER_NAMES = ("_reduce_scatter_base", "reduce_scatter_single")
_GATHER_COALESCED_NAMES = ("allgather_into_tensor_coalesced", "all_gather_single_coalesced")
_REDUCE_SCATTER_COALESCED_NAMES = ("reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced")
_COALESCING_NAMES = ("_start_coalescing", "_end_coalescing")

_HALF_TYPES = (torch.float16, torch.bfloat16)

# torch releases whose ProcessGroupNCCL gives a `*_coalesced` collective its own work without
# registering it with an open coalescing block, so `endCoalescing()` returns nullptr and the
# Python `_coalescing_manager(device=...)` of the same release overwrites the fast path's real
# work with it (pytorch#122807; NCCL registers the collective again from 2.4.0, pytorch#122849).
# docs/background.md section 3 says how each release was read.
LOSES_BLOCK_WORK: frozenset[tuple[int, int]] = frozenset({(2, 3)})


def release_loses_block_work(version: str) -> bool:
    """Whether this torch release's NCCL loses a coalescing block's work (`LOSES_BLOCK_WORK`)."""
    parts = version.split("+")[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) in LOSES_BLOCK_WORK
    except (IndexError, ValueError):
        return False


@dataclass(frozen=True)
class GlooCapabilities:
    """What the installed torch's gloo backend does natively, found by probing a private 1-rank group."""

    allgather_base: bool  # `_allgather_base` on a byte tensor
    reduce_scatter_base: bool  # `_reduce_scatter_base` on fp32
    bf16: bool  # broadcast and allreduce of bf16 tensors


def _runs(fn: Callable[[], Any]) -> bool:
    try:
        work = fn()
        if work is not None:
            work.wait()
        return True
    except (RuntimeError, AttributeError, TypeError, NotImplementedError):
        return False


def probe_gloo() -> GlooCapabilities:
    """Ask a standalone 1-rank gloo backend (no rendezvous with other ranks) what it implements."""
    backend = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))
    byte_in, byte_out = torch.ones(4, dtype=torch.uint8), torch.empty(4, dtype=torch.uint8)
    f32_in, f32_out = torch.ones(4), torch.empty(4)
    bf16 = torch.ones(4, dtype=torch.bfloat16)
    return GlooCapabilities(
        allgather_base=_runs(lambda: backend._allgather_base(byte_out, byte_in)),
        reduce_scatter_base=_runs(lambda: backend._reduce_scatter_base(f32_out, f32_in)),
        bf16=_runs(lambda: backend.allreduce([bf16])) and _runs(lambda: backend.broadcast([bf16])),
    )


@torch.no_grad()
def _poison(tensor: torch.Tensor) -> None:
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(float("nan"))
    elif tensor.dtype == torch.bool:
        tensor.fill_(True)
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).max)


class _Pending:
    """One collective issued on gloo: its gloo work and how its result reaches the caller's outputs."""

    def __init__(self, seq: int, gloo_work: Any, deliver: Callable[[], None], eager: bool) -> None:
        self.seq = seq
        self.gloo_work = gloo_work
        self._deliver = deliver
        self._completing = threading.Lock()  # one delivery, whichever thread gets there first
        self._lock = threading.Lock()  # guards _done/_callbacks handoff only, never held while waiting
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], None]] = []
        # eager: a delivery thread completes it (async); otherwise only finish() does (strict)
        self.eager = eager

    @property
    def delivered(self) -> bool:
        return self._done.is_set()

    def complete(self) -> None:
        """Wait for gloo and copy the result out; runs once (caller's thread or a delivery thread)."""
        with self._completing:
            if self._done.is_set():
                return
            try:
                self.gloo_work.wait()
                # outputs may be parameters; c10d writes them outside autograd and so do we
                with torch.no_grad():
                    self._deliver()
            except BaseException as exc:  # handed to whoever waits, like a failed NCCL work
                self._error = exc
            with self._lock:
                self._done.set()
                callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def finish(self) -> None:
        """Block until the result is in the caller's outputs (delivering it now if held back)."""
        if self.eager:
            self._done.wait()
        else:
            self.complete()
        if self._error is not None:
            raise RuntimeError(f"gloo transport failed: {self._error}") from self._error

    def on_done(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()


class _PgState:
    """Per process group: issue order, open coalescing block, works not yet known complete."""

    def __init__(self, pg: Any) -> None:
        self.pg = pg  # keeps the id() key valid for the life of the state
        self.lock = threading.Lock()
        self.seq = itertools.count()
        self.pending: list[_Pending] = []
        # The open coalescing block: collectives that complete as a unit, as every work's group does.
        self.open_group: list[_Pending] | None = None
        self._queue: queue.Queue[_Pending] | None = None

    def forget(self, item: _Pending) -> None:
        with self.lock:
            if item in self.pending:
                self.pending.remove(item)

    def complete_through(self, seq: int) -> None:
        # Never hold the lock while waiting: the delivery thread takes it.
        with self.lock:
            due = [p for p in self.pending if p.seq <= seq]
        for item in due:
            item.finish()
            self.forget(item)

    def deliver_in_background(self, item: _Pending) -> None:
        """Async mode: one thread per group completes works in issue order, as a NCCL stream would.

        Not torch Future callbacks: some gloo works (torch 2.13 `_reduce_scatter_base`) have none.
        """
        with self.lock:
            if self._queue is None:
                self._queue = queue.Queue()
                threading.Thread(
                    target=self._drain, args=(self._queue,), daemon=True, name=f"gloo-adapter-{id(self.pg):x}"
                ).start()
        self._queue.put(item)

    def _drain(self, items: queue.Queue[_Pending]) -> None:
        while True:
            item = items.get()
            item.complete()
            self.forget(item)


class AdapterWork(dist.Work):
    """The work handed to torch/DeepSpeed for a collective or a coalescing block."""

    def __init__(self, state: _PgState, group: list[_Pending], outputs: list[torch.Tensor]) -> None:
        super().__init__()
        self._state = state
        self._group = group
        self._outputs = outputs

    def wait(self, timeout: Any = None) -> bool:
        self._state.complete_through(max((m.seq for m in self._group), default=-1))
        for member in self._group:
            member.finish()
        return True

    def is_completed(self) -> bool:
        return all(m.delivered for m in self._group)

    def is_success(self) -> bool:
        return self.is_completed()

    def exception(self) -> Any:
        return None

    def result(self) -> list[torch.Tensor]:
        return list(self._outputs)

    def synchronize(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        raise RuntimeError("source_rank is only defined for recv works")

    def get_future(self) -> torch.futures.Future:
        """Completes with the outputs once every member delivered.

        In strict mode asking for the future counts as a wait (a future nobody can complete
        would hang its user instead of exposing a missing wait).
        """
        members = list(self._group)
        if not all(m.eager or m.delivered for m in members):
            self.wait()
        fut: torch.futures.Future = torch.futures.Future()
        outputs = list(self._outputs)
        remaining = [len(members)]
        lock = threading.Lock()

        def one_done() -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                fut.set_result(outputs)

        if not members:
            fut.set_result(outputs)
        for member in members:
            member.on_done(one_done)
        return fut


class _Transport:
    def __init__(self, mode: Mode, caps: GlooCapabilities, loses_block_work: bool = False) -> None:
        self.mode = mode
        self.caps = caps
        self.loses_block_work = loses_block_work
        self._states: dict[int, _PgState] = {}
        self._lock = threading.Lock()

    def state(self, pg: Any) -> _PgState:
        with self._lock:
            st = self._states.get(id(pg))
            if st is None or st.pg is not pg:
                st = self._states[id(pg)] = _PgState(pg)
            return st

    # -- issuing -------------------------------------------------------------------------------
    def _launch(
        self, pg: Any, outputs: list[torch.Tensor], run: Callable[[], Any], deliver: Callable[[], None]
    ) -> _Pending:
        """Common path for every collective: poison, issue on gloo, attach delivery per mode."""
        st = self.state(pg)
        if self.mode is Mode.STRICT:
            for out in outputs:
                _poison(out)
        gloo_work = run()
        item = _Pending(next(st.seq), gloo_work, deliver, eager=self.mode is Mode.ASYNC)
        if self.mode is Mode.SYNC:
            item.finish()
            return item
        with st.lock:
            st.pending.append(item)
        if self.mode is Mode.ASYNC:
            st.deliver_in_background(item)
        return item

    def gather(self, pg: Any, output: torch.Tensor, inp: torch.Tensor) -> _Pending:
        backend = pg._get_backend(torch.device("cpu"))
        world = pg.size()
        # Gathers only move bytes, so any dtype (bf16 included, which torch 2.1's gloo rejects)
        # travels as its raw bytes.
        src = inp.detach().contiguous().clone()
        staged = torch.empty(output.shape, dtype=output.dtype)
        if staged.numel() != world * src.numel():
            raise RuntimeError(
                f"all-gather output has {output.numel()} elements, expected {world} x {src.numel()}"
            )
        src_bytes = src.reshape(-1).view(torch.uint8)
        out_bytes = staged.reshape(-1).view(torch.uint8)

        def run() -> Any:
            if self.caps.allgather_base:
                return backend._allgather_base(out_bytes, src_bytes)
            return backend.allgather([list(out_bytes.split(src_bytes.numel()))], [src_bytes])

        def deliver() -> None:
            output.copy_(staged)

        return self._launch(pg, [output], run, deliver)

    def reduce_scatter(self, pg: Any, output: torch.Tensor, inp: torch.Tensor, op: Any) -> _Pending:
        backend = pg._get_backend(torch.device("cpu"))
        world, rank = pg.size(), pg.rank()
        average = op == dist.ReduceOp.AVG
        reduce_op = dist.ReduceOp.SUM if average else op
        # Half types are reduced in fp32 and rounded once, so the sum does not depend on the order
        # gloo adds the ranks' contributions in.
        work_dtype = torch.float32 if inp.dtype in _HALF_TYPES else inp.dtype
        src = inp.detach().reshape(-1).to(work_dtype, copy=True)
        if src.numel() != world * output.numel():
            raise RuntimeError(
                f"reduce-scatter input has {inp.numel()} elements, expected {world} x {output.numel()}"
            )
        native = self.caps.reduce_scatter_base
        staged = torch.empty(output.numel(), dtype=work_dtype) if native else src

        def run() -> Any:
            if native:
                opts = dist.ReduceScatterOptions()
                opts.reduceOp = reduce_op
                return backend._reduce_scatter_base(staged, src, opts)
            opts = dist.AllreduceOptions()
            opts.reduceOp = reduce_op
            return backend.allreduce([src], opts)

        def deliver() -> None:
            mine = staged if native else src.view(world, -1)[rank]
            if average:
                mine = mine / world
            output.copy_(mine.view(output.shape))

        return self._launch(pg, [output], run, deliver)

    def broadcast(self, pg: Any, tensor: torch.Tensor, root: int) -> _Pending:
        """Broadcast as raw bytes (for dtypes gloo lacks, bf16 on torch 2.1)."""
        backend = pg._get_backend(torch.device("cpu"))
        staged = tensor.detach().contiguous().clone()
        staged_bytes = staged.reshape(-1).view(torch.uint8)

        def run() -> Any:
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = root, 0
            return backend.broadcast([staged_bytes], opts)

        def deliver() -> None:
            tensor.copy_(staged)

        return self._launch(pg, [] if pg.rank() == root else [tensor], run, deliver)

    def allreduce(self, pg: Any, tensor: torch.Tensor, op: Any) -> _Pending:
        """All-reduce computed in fp32 and rounded once (for half types gloo lacks)."""
        backend = pg._get_backend(torch.device("cpu"))
        average = op == dist.ReduceOp.AVG
        staged = tensor.detach().to(torch.float32, copy=True)

        def run() -> Any:
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.SUM if average else op
            return backend.allreduce([staged], opts)

        def deliver() -> None:
            tensor.copy_(staged / pg.size() if average else staged)

        return self._launch(pg, [tensor], run, deliver)

    def gather_list(self, pg: Any, outputs: list[torch.Tensor], inp: torch.Tensor) -> _Pending:
        """List all-gather as raw bytes (for dtypes gloo lacks)."""
        backend = pg._get_backend(torch.device("cpu"))
        src_bytes = inp.detach().contiguous().clone().reshape(-1).view(torch.uint8)
        staged = [torch.empty(o.shape, dtype=o.dtype) for o in outputs]

        def run() -> Any:
            return backend.allgather([[t.reshape(-1).view(torch.uint8) for t in staged]], [src_bytes])

        def deliver() -> None:
            for out, got in zip(outputs, staged):
                out.copy_(got)

        return self._launch(pg, list(outputs), run, deliver)

    # -- grouping ------------------------------------------------------------------------------
    def as_work(
        self, pg: Any, items: list[_Pending], outputs: list[torch.Tensor], *, coalesced: bool = False
    ) -> AdapterWork:
        st = self.state(pg)
        group = st.open_group
        if coalesced and self.loses_block_work:
            group = None  # a `*_coalesced` call's work is its own; it does not join an open block
        if group is None:
            group = list(items)
        else:
            group.extend(i for i in items if i not in group)
        return AdapterWork(st, group, outputs)

    def start_coalescing(self, pg: Any) -> None:
        st = self.state(pg)
        if st.open_group is not None:
            raise RuntimeError("coalescing block already open on this process group")
        st.open_group = []

    def end_coalescing(self, pg: Any) -> AdapterWork | None:
        st = self.state(pg)
        group = st.open_group
        if group is None:
            raise RuntimeError("_end_coalescing without _start_coalescing")
        st.open_group = None
        if self.loses_block_work and not group:
            return None  # NCCL's endCoalescing() with nothing registered: nullptr
        return AdapterWork(st, group, [])

    def synchronize(self) -> None:
        """Complete every collective in flight on every process group (a device synchronize)."""
        with self._lock:
            states = list(self._states.values())
        for st in states:
            with st.lock:
                last = max((p.seq for p in st.pending), default=-1)
            st.complete_through(last)


_TRANSPORT: _Transport | None = None
_ORIGINALS: dict[str, Callable[..., Any]] = {}


# What install() added, for the record (transport_info.adapter).
class Adapter(TypedDict, total=False):
    mode: str
    torch: str
    block_work: str  # "lost" | "kept"
    patched: list[str]
    gloo_native: dict[str, bool]


_INSTALLED: Adapter = {}


def _is_gloo(pg: Any) -> bool:
    try:
        return str(pg._get_backend_name()) == "gloo"
    except (RuntimeError, AttributeError):
        return False


def _wrapped(name: str, adapted: Callable[..., Any]) -> Callable[..., Any]:
    """ProcessGroup's method `name`: `adapted(transport, group, *args)` on a gloo group while the
    adapter is installed; torch's own method otherwise, and where `adapted` returns NotImplemented
    (a call it leaves to gloo)."""
    original = _ORIGINALS[name] = getattr(dist.ProcessGroup, name)

    def method(self: Any, *args: Any) -> Any:
        if _TRANSPORT is not None and _is_gloo(self):
            result = adapted(_TRANSPORT, self, *args)
            if result is not NotImplemented:
                return result
        return original(self, *args)

    method.__name__ = name
    return method


def _op(rest: tuple[Any, ...]) -> Any:
    return rest[0].reduceOp if rest else dist.ReduceOp.SUM


def _gather(t: _Transport, pg: Any, output: Any, input: Any, *rest: Any) -> Any:
    return t.as_work(pg, [t.gather(pg, output, input)], [output])


def _reduce_scatter(t: _Transport, pg: Any, output: Any, input: Any, *rest: Any) -> Any:
    return t.as_work(pg, [t.reduce_scatter(pg, output, input, _op(rest))], [output])


def _gather_coalesced(t: _Transport, pg: Any, outputs: Any, inputs: Any, *rest: Any) -> Any:
    items = [t.gather(pg, o, i) for o, i in zip(outputs, inputs)]
    return t.as_work(pg, items, list(outputs), coalesced=True)


def _reduce_scatter_coalesced(t: _Transport, pg: Any, outputs: Any, inputs: Any, *rest: Any) -> Any:
    items = [t.reduce_scatter(pg, o, i, _op(rest)) for o, i in zip(outputs, inputs)]
    return t.as_work(pg, items, list(outputs), coalesced=True)


def _start_coalescing(t: _Transport, pg: Any, device: Any) -> None:
    t.start_coalescing(pg)


# torch 2.0 passes the block's request list (`_end_coalescing(device, reqs)`); 2.1+ does not.
def _end_coalescing(t: _Transport, pg: Any, device: Any, *rest: Any) -> AdapterWork | None:
    return t.end_coalescing(pg)


def _needs_bytes(tensors: Any) -> bool:
    return isinstance(tensors, (list, tuple)) and any(
        isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in tensors
    )


# The bf16 stand-ins take over only calls with bf16 tensors (NotImplemented: gloo's own method).
def _bf16_broadcast(t: _Transport, pg: Any, tensors: Any, opts: Any = None, *rest: Any) -> Any:
    if not _needs_bytes(tensors) or not isinstance(opts, dist.BroadcastOptions):
        return NotImplemented
    return t.as_work(pg, [t.broadcast(pg, tensors[opts.rootTensor], opts.rootRank)], list(tensors))


def _bf16_allreduce(options: type[Any]) -> Callable[..., Any]:
    def adapted(t: _Transport, pg: Any, tensors: Any, opts: Any = None, *rest: Any) -> Any:
        if not _needs_bytes(tensors) or not isinstance(opts, options):
            return NotImplemented
        return t.as_work(pg, [t.allreduce(pg, x, opts.reduceOp) for x in tensors], list(tensors))

    return adapted


def _bf16_allgather(t: _Transport, pg: Any, output_lists: Any, inputs: Any, *rest: Any) -> Any:
    if not _needs_bytes(inputs) or len(inputs) != 1 or len(output_lists) != 1:
        return NotImplemented
    return t.as_work(pg, [t.gather_list(pg, list(output_lists[0]), inputs[0])], list(output_lists[0]))


_ADAPTED: dict[tuple[str, ...], Callable[..., Any]] = {
    _GATHER_NAMES: _gather,
    _REDUCE_SCATTER_NAMES: _reduce_scatter,
    _GATHER_COALESCED_NAMES: _gather_coalesced,
    _REDUCE_SCATTER_COALESCED_NAMES: _reduce_scatter_coalesced,
}


def install(mode: str, loses_block_work: bool | None = None) -> Adapter:
    """Add the adapter's methods to `torch.distributed.ProcessGroup` (gloo groups only).

    `loses_block_work`: model an NCCL that loses a coalescing block's work (module docstring);
    None: as the installed torch release's NCCL does (`LOSES_BLOCK_WORK`). Idempotent for the same
    settings; switching within one process is refused because works already issued would mix two
    semantics.
    """
    global _TRANSPORT
    wanted = Mode(mode)
    lost = release_loses_block_work(torch.__version__) if loses_block_work is None else loses_block_work
    if _TRANSPORT is not None:
        if _TRANSPORT.mode is not wanted or _TRANSPORT.loses_block_work is not lost:
            raise RuntimeError(
                f"gloo transport already installed in mode {_TRANSPORT.mode.value!r}"
                f" (block work {'lost' if _TRANSPORT.loses_block_work else 'kept'})"
            )
        return _INSTALLED.copy()
    pg_cls = dist.ProcessGroup
    caps = probe_gloo()
    patched: list[str] = []
    for names, adapted in _ADAPTED.items():
        for name in names:
            if hasattr(pg_cls, name):
                setattr(pg_cls, name, _wrapped(name, adapted))
                patched.append(name)
    if all(hasattr(pg_cls, n) for n in _COALESCING_NAMES):
        pg_cls._start_coalescing = _wrapped("_start_coalescing", _start_coalescing)
        pg_cls._end_coalescing = _wrapped("_end_coalescing", _end_coalescing)
        patched.extend(_COALESCING_NAMES)
    if not caps.bf16:
        # gloo collectives torch/DeepSpeed also call with bf16 tensors (parameter broadcast at
        # zero.Init, replica gradient all-reduce, norms); other dtypes go straight to gloo.
        bf16: dict[str, Callable[..., Any]] = {
            "broadcast": _bf16_broadcast,
            "allreduce": _bf16_allreduce(dist.AllreduceOptions),
            "allreduce_coalesced": _bf16_allreduce(dist.AllreduceCoalescedOptions),
            "allgather": _bf16_allgather,
        }
        for name, adapted in bf16.items():
            setattr(pg_cls, name, _wrapped(name, adapted))
            patched.append(f"{name} (bf16 only)")
    _TRANSPORT = _Transport(wanted, caps, lost)
    _INSTALLED.update(
        {
            "mode": wanted.value,
            "torch": torch.__version__,
            # "lost": as NCCL on this release, _end_coalescing returns None for a block whose
            # collectives were all `*_coalesced` calls (pytorch#122807)
            "block_work": "lost" if lost else "kept",
            "patched": patched,
            "gloo_native": {
                "allgather_base": caps.allgather_base,
                "reduce_scatter_base": caps.reduce_scatter_base,
                "bf16": caps.bf16,
            },
        }
    )
    return _INSTALLED.copy()


def synchronize_device() -> None:
    """What a device synchronize means on the twin: every collective in flight completes."""
    if _TRANSPORT is not None:
        _TRANSPORT.synchronize()


def uninstall() -> None:
    """Restore torch's own ProcessGroup methods (works already handed out keep their semantics)."""
    global _TRANSPORT, _INSTALLED
    for name, original in _ORIGINALS.items():
        setattr(dist.ProcessGroup, name, original)
    _ORIGINALS.clear()
    _INSTALLED = {}
    _TRANSPORT = None
