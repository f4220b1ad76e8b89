"""Each rank's collectives, recorded in order into a small file the hang watcher reads.

What it is: a record, not a check. `install(folder)` replaces the public collective functions
of `torch.distributed` (the package attributes that DeepSpeed's comm/torch.py and user scripts
call: all_reduce, reduce_scatter_tensor, broadcast, barrier, ...) and
`distributed_c10d._coalescing_manager` by wrappers that call the original with the same
arguments and return its result (exceptions pass through). Around the call they note, per
process, in FOLDER/<pid>.json: the call now in progress (entered, not returned), the last one
issued on every group with its position in that group (a sequence number per group, counted
from this process's first recorded collective), and how many calls returned. The watcher
(repro/workload/hangwatch.py) compares those files across ranks: ranks of one group at the same
position in different collectives can never meet (a deadlock, proven), and counters that stop
moving are a stall.

Why not torch's own check: `TORCH_DISTRIBUTED_DEBUG=DETAIL` finds the same mismatch (it wraps
every process group in a ProcessGroupWrapper that runs an extra gloo collective of the
operation's fingerprint before each call), but that changes what runs: an extra collective per
call, another process group, different timing on the very code path under test, and it raises
instead of letting the hang be seen as a hang. The record here adds no communication and leaves
torch's own functions (distributed_c10d's globals, which torch compares by identity inside the
coalescing manager) untouched: only the package's names are replaced.

Backend neutral: the record holds operation names, group names and ranks, element counts and
dtypes, never anything gloo or NCCL specific, so our CPU ranks, GPU ranks and users' jobs
(repro/workload/jobhook.py) write the same file. On GPUs an NCCL collective returns once it is
enqueued, so a rank there is seldom seen *inside* a call; the last issued call per group still
shows a mismatch.

Nested calls (all_gather_object calls all_gather, torch calling its own public functions) are
part of the outermost call: one record per call the program made. Recording never raises into
the program: a failure to describe a call just leaves it out.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, Callable, TypedDict

FORMAT = 1
FOLDER = "collectives"  # in a run's folder (ours) or a job's folder (users' jobs)
# The public collectives whose calls are recorded (point-to-point send/recv are not collectives
# of a group: the watcher cannot compare them across its members).
OPS = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "reduce",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)
# Old names of the same collective: a rank calling one and its peer the other still meet.
ALIASES = {"_all_gather_base": "all_gather_into_tensor", "_reduce_scatter_base": "reduce_scatter_tensor"}
COALESCED = "coalesced"  # the collective a _coalescing_manager block issues when it exits
MAX_SIZES = 4  # element counts kept per call: enough to tell calls apart, small to write
_MARK = "_mics_repro_recorded"


def canonical(op: str) -> str:
    return ALIASES.get(op, op)


GroupInfo = tuple[str, tuple[int, ...]]  # (the group's name, its global ranks)
# One call as the file holds it ("async" is a keyword: the functional form).
CallRecord = TypedDict(
    "CallRecord",
    {
        "op": str,
        "group": str,
        "ranks": "list[int]",
        "seq": int,
        "sizes": "list[int]",
        "dtype": "str | None",
        "async": bool,
    },
)


# The last call issued on one group (sizes and dtype once it issued one).
class GroupRecord(TypedDict, total=False):
    ranks: list[int]
    seq: int
    op: str | None
    sizes: list[int]
    dtype: str | None


# FOLDER/<pid>.json: what hangwatch.parse reads.
class Snapshot(TypedDict):
    n: int
    format: int
    pid: int
    rank: int
    world: int
    done: int
    current: CallRecord | None
    groups: dict[str, GroupRecord]
    z: int


# What install() wrapped (the hook's and the run's record).
class Installed(TypedDict, total=False):
    recorded: list[str]
    why: str
    folder: str


class Recorder:
    """One process's record; `resolve(group)` names a group (None: the default group) and lists
    its ranks, `identity()` says (rank, world size). Both come from torch in `install`."""

    def __init__(
        self,
        path: str,
        resolve: Callable[[Any], GroupInfo | None],
        identity: Callable[[], tuple[int, int]],
    ) -> None:
        self.path, self.resolve, self.identity = path, resolve, identity
        self.lock = threading.Lock()
        self.local = threading.local()
        self.update = 0
        self.done = 0
        self.inflight: dict[int, CallRecord] = {}  # call id -> the call
        self.groups: dict[str, GroupRecord] = {}  # group name -> ranks, seq, last op
        self.calls = 0
        self.fd: int | None = None
        self.written = 0

    # -- around one call -------------------------------------------------------------------
    def enter(self, op: str, group: Any, tensors: list[Any], async_op: bool) -> int | None:
        """Note a call about to be made; returns its id for `leave`, None when not recorded."""
        depth = getattr(self.local, "depth", 0)
        self.local.depth = depth + 1
        if depth:
            return None  # inside a recorded call: part of it
        try:
            info = self.resolve(group)
            if info is None:
                return None
            name, ranks = info
            sizes, dtype = describe(tensors)
            with self.lock:
                entry = self.groups.setdefault(name, {"ranks": list(ranks), "seq": 0, "op": None})
                entry["seq"] += 1
                entry["op"] = canonical(op)
                self.calls += 1
                call: CallRecord = {
                    "op": canonical(op),
                    "group": name,
                    "ranks": list(ranks),
                    "seq": entry["seq"],
                    "sizes": sizes,
                    "dtype": dtype,
                    "async": async_op,
                }
                entry["sizes"], entry["dtype"] = sizes, dtype
                self.inflight[self.calls] = call
                self._write()
                return self.calls
        except Exception:  # noqa: BLE001 - recording must never break the program's collective
            return None

    def leave(self, token: int | None) -> None:
        self.local.depth = max(0, getattr(self.local, "depth", 1) - 1)
        if token is None:
            return
        with contextlib.suppress(Exception), self.lock:  # as in enter: never break the program
            self.inflight.pop(token, None)
            self.done += 1
            self._write()

    # -- the file ----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        rank, world = self.identity()
        current = self.inflight[min(self.inflight)] if self.inflight else None
        return {
            "n": self.update,
            "format": FORMAT,
            "pid": os.getpid(),
            "rank": rank,
            "world": world,
            "done": self.done,
            "current": current,
            "groups": self.groups,
            "z": self.update,  # equal to "n" only when the reader saw one whole write
        }

    def _write(self) -> None:
        """Overwrite the file in place with one pwrite (no rename, no fsync: two syscalls per
        call). The watcher rejects a read that caught a write half done (n != z, or no JSON)."""
        self.update += 1
        data = json.dumps(self.snapshot(), separators=(",", ":")).encode()
        if self.fd is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        padded = data + b" " * max(0, self.written - len(data))  # cover what a longer write left
        os.pwrite(self.fd, padded, 0)
        self.written = max(self.written, len(data))


def describe(tensors: list[Any]) -> tuple[list[int], str | None]:
    """Element counts (at most MAX_SIZES) and the dtype of the call's tensors."""
    flat: list[Any] = []
    for item in tensors:
        if isinstance(item, (list, tuple)):
            flat.extend(item)
        else:
            flat.append(item)
    found = [t for t in flat if hasattr(t, "numel") and hasattr(t, "dtype")]
    sizes = [int(t.numel()) for t in found[:MAX_SIZES]]
    return sizes, (str(found[0].dtype).replace("torch.", "") if found else None)


def _position(fn: Callable[..., Any], name: str) -> int | None:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return params.index(name) if name in params else None


def wrap(recorder: Recorder, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` with the call recorded around it; arguments and result pass unchanged."""
    group_at = _position(original, "group")
    async_at = _position(original, "async_op")

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        group = kwargs.get("group", args[group_at] if group_at is not None and len(args) > group_at else None)
        if async_at is not None and len(args) > async_at:
            async_op = bool(args[async_at])
        else:
            async_op = bool(kwargs.get("async_op", False))
        tensors = list(args[:2]) + [v for k, v in kwargs.items() if k not in ("group", "async_op", "op")]
        token = recorder.enter(op, group, tensors, async_op)
        try:
            return original(*args, **kwargs)
        finally:
            recorder.leave(token)

    setattr(call, _MARK, True)
    return call


def wrap_coalescing(recorder: Recorder, original: Callable[..., Any]) -> Callable[..., Any]:
    """`_coalescing_manager` (a context manager) with its exit recorded as one collective when
    the block recorded one: calls inside the block only queue (torch >= 2.1), the exit issues
    them. A block without a recorded collective (batch_isend_irecv's) records nothing."""
    group_at = _position(original, "group")

    @functools.wraps(original)
    @contextlib.contextmanager
    def call(*args: Any, **kwargs: Any) -> Iterator[Any]:
        group = kwargs.get("group", args[group_at] if group_at is not None and len(args) > group_at else None)
        before = recorder.calls
        manager = original(*args, **kwargs)
        value = manager.__enter__()
        try:
            yield value
        except BaseException:
            if not manager.__exit__(*sys.exc_info()):
                raise
        else:
            issued = recorder.calls > before
            token = recorder.enter(COALESCED, group, [], False) if issued else None
            try:
                manager.__exit__(None, None, None)
            finally:
                if issued:
                    recorder.leave(token)

    setattr(call, _MARK, True)
    return call


def _torch_group_info(c10d: Any) -> Callable[[Any], GroupInfo | None]:
    cache: dict[int, tuple[Any, GroupInfo]] = {}

    def resolve(group: Any) -> GroupInfo | None:
        if group is None:
            group = c10d._get_default_group()
        if group is getattr(c10d.GroupMember, "NON_GROUP_MEMBER", object()):
            return None  # this rank takes no part: torch returns without communicating
        hit = cache.get(id(group))
        if hit is not None and hit[0] is group:
            return hit[1]
        name_of = getattr(c10d, "_get_process_group_name", None)
        name = str(name_of(group) if name_of is not None else c10d._world.pg_names[group])
        ranks = tuple(int(r) for r in c10d.get_process_group_ranks(group))
        cache[id(group)] = (group, (name, ranks))
        return name, ranks

    return resolve


def install(folder: str) -> Installed:
    """Record this process's collectives into FOLDER/<pid>.json (idempotent). Returns what was
    wrapped, for the run's record."""
    import torch.distributed as dist

    if not dist.is_available():
        return {"recorded": [], "why": "torch.distributed is not available"}
    c10d = dist.distributed_c10d
    recorder = Recorder(
        os.path.join(folder, f"{os.getpid()}.json"),
        _torch_group_info(c10d),
        lambda: (int(dist.get_rank()), int(dist.get_world_size())),
    )
    wrapped = []
    for op in OPS:
        original = getattr(dist, op, None)
        if original is None or getattr(original, _MARK, False):
            continue
        setattr(dist, op, wrap(recorder, op, original))
        wrapped.append(op)
    manager = getattr(c10d, "_coalescing_manager", None)
    if manager is not None and not getattr(manager, _MARK, False):
        c10d._coalescing_manager = wrap_coalescing(recorder, manager)
        wrapped.append("_coalescing_manager")
    return {"recorded": wrapped, "folder": folder}
