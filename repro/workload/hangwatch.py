"""Decide from the ranks' collective records (repro/workload/collectives.py) that a run hung.

Two kinds of evidence, both read from files, so the suite's runner (repro/workload/runner.py),
the job runner (repro/workload/job.py) and a GPU host use the same decision:

- DEADLOCK, proven: every member of one group has issued its collective number N on that group,
  and they are not all the same collective (ranks 0,1 in all_reduce, ranks 2,3 in broadcast).
  Those calls can never meet. Or: every rank of the world is inside a collective and none of
  them can complete, because some member of each call's group has not issued that position of
  it and is blocked elsewhere (DeepSpeed 0.19.3's replica-group hang: ranks 0,1 in
  all_reduce_coalesced on their replica groups, ranks 2,3 in the world group's next
  reduce_scatter_tensor). The watcher waits only until nothing has
  moved for CONFIRM_S (no rank recorded anything), so a mismatch that a backend would still
  report as an error is given its chance to, and says `hung` at once after that, whatever the
  stall limit. The same mismatch is what torch's TORCH_DISTRIBUTED_DEBUG=DETAIL check raises on;
  collectives.py says why that check is not switched on.
- STALL, calibrated: every rank is inside a collective and no rank has recorded anything, nor
  touched its heartbeat, for max(STEP_FACTOR x the slowest step seen, a floor), at most the run's
  fixed stall limit. Steps are the heartbeat's changes; before two have been seen the fixed
  limit applies (the caller's own check), because the first step carries start-up costs that
  say nothing about how long a step takes.

The watcher is pure apart from reading the folder: the caller passes the clock, so tests drive
it with literal times.
"""

from __future__ import annotations

import enum
import glob
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, TypedDict

CONFIRM_S = 2.0  # a mismatch must stand still this long before it is called a deadlock
STEP_FACTOR = 10.0
STALL_FLOOR_S = 30.0  # the calibrated limit is never shorter (a loaded host's hiccups)
# Users' jobs: a first collective on a new NCCL group sets up its communicator inside the call,
# which can take tens of seconds; our own runs know their groups.
JOB_STALL_FLOOR_S = 60.0


class HangKind(str, enum.Enum):
    DEADLOCK = "deadlock"
    STALL = "stall"


@dataclass(frozen=True)
class Call:
    op: str
    group: str
    ranks: tuple[int, ...]
    seq: int
    sizes: tuple[int, ...] = ()
    dtype: str | None = None


@dataclass(frozen=True)
class RankView:
    """One process's record as last written (None fields: it said nothing about them yet)."""

    pid: int
    rank: int
    world: int
    update: int
    done: int
    current: Call | None
    last: Mapping[str, Call] = field(default_factory=dict)  # group name -> last call issued there


# One rank's call in a Hang's evidence (group_ranks: find_blocked's only).
class CallFacts(TypedDict, total=False):
    op: str
    seq: int
    sizes: list[int]
    dtype: str | None
    group_ranks: list[int]


# What a Hang rests on: a mismatch's group, the blocked ranks' calls, a stall's limit.
class Evidence(TypedDict, total=False):
    group: str
    group_ranks: list[int]
    seq: int
    calls: dict[str, CallFacts]  # rank -> its call
    ranks_inside_a_call: list[int]
    issued: dict[str, dict[str, int]]  # rank -> {group name: last position issued}
    limit_s: float
    slowest_step_s: float
    steps_seen: int


@dataclass(frozen=True)
class Hang:
    kind: HangKind
    reason: str
    evidence: Evidence


def hang_detail(found: Hang | None, quiet: str, stall_s: float, timeout_s: float) -> str:
    """Why a run counts as hung: what the watcher found, else `quiet` (how long nothing moved, ""
    while within the stall limit) or the time limit (the suite's runner and the job runner)."""
    if found is not None:
        return found.reason
    if quiet:
        return f"{quiet} (stall limit {stall_s:g} s)"
    return f"exceeded the {timeout_s:g} s time limit"


def _call(data: Mapping[str, Any], group: str | None = None) -> Call:
    return Call(
        op=str(data["op"]),
        group=str(group if group is not None else data["group"]),
        ranks=tuple(int(r) for r in data["ranks"]),
        seq=int(data["seq"]),
        sizes=tuple(int(s) for s in data.get("sizes") or ()),
        dtype=None if data.get("dtype") is None else str(data["dtype"]),
    )


def parse(text: str) -> RankView | None:
    """A record, or None when the read caught a write half done (or it is no record)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("n") != data.get("z"):
            return None
        current = data.get("current")
        groups = data.get("groups") or {}
        last = {
            str(name): _call(entry, name) for name, entry in groups.items() if entry.get("op") is not None
        }
        return RankView(
            pid=int(data["pid"]),
            rank=int(data["rank"]),
            world=int(data["world"]),
            update=int(data["n"]),
            done=int(data["done"]),
            current=None if current is None else _call(current),
            last=last,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def read_views(folder: str, alive: Callable[[int], bool]) -> list[RankView]:
    """The records of processes still running (a finished earlier world's ranks do not count)."""
    views = []
    for path in glob.glob(os.path.join(folder, "*.json")):
        try:
            with open(path, errors="replace") as fh:
                view = parse(fh.read())
        except OSError:
            continue
        if view is not None and alive(view.pid):
            views.append(view)
    return sorted(views, key=lambda v: (v.rank, v.pid))


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in sorted(ranks))


def find_mismatch(views: list[RankView]) -> Hang | None:
    """Members of one group whose last calls there share a position but not a collective."""
    by_rank = {v.rank: v for v in views}
    seen: set[tuple[str, tuple[int, ...]]] = set()
    for view in views:
        for name, call in sorted(view.last.items()):
            if (name, call.ranks) in seen:
                continue
            seen.add((name, call.ranks))
            members = [by_rank.get(r) for r in call.ranks]
            calls = [m.last.get(name) if m is not None else None for m in members]
            if any(c is None for c in calls):
                continue  # a member we cannot see, or that never used the group: no proof
            found = [c for c in calls if c is not None]
            if len({c.seq for c in found}) != 1 or len({c.op for c in found}) == 1:
                continue
            by_op: dict[str, list[int]] = {}
            for rank, c in zip(call.ranks, found):
                by_op.setdefault(c.op, []).append(rank)
            parts = [f"{_ranks_text(r)} in {op}" for op, r in sorted(by_op.items(), key=lambda i: min(i[1]))]
            inside = sorted(r for r in call.ranks if by_rank[r].current is not None)
            reason = (
                f"deadlock: {' and '.join(parts)} on group [{','.join(map(str, call.ranks))}]"
                f" (collective #{found[0].seq} of that group)"
            )
            evidence: Evidence = {
                "group": name,
                "group_ranks": list(call.ranks),
                "seq": found[0].seq,
                "calls": {str(r): _describe(c) for r, c in zip(call.ranks, found)},
                "ranks_inside_a_call": inside,
            }
            return Hang(HangKind.DEADLOCK, reason, evidence)
    return None


def _can_complete(call: Call, by_rank: Mapping[int, RankView]) -> bool:
    """Every member of the call's group has issued this position of it with the same collective
    (one that has moved past it is taken to have): only then can it finish."""
    for rank in call.ranks:
        member = by_rank.get(rank)
        last = member.last.get(call.group) if member is not None else None
        if last is None or last.seq < call.seq or (last.seq == call.seq and last.op != call.op):
            return False
    return True


def find_blocked(views: list[RankView]) -> Hang | None:
    """Every rank of the world is inside a collective and none of those can complete: each waits
    for a rank that is blocked in another one (the replica-group hang of DeepSpeed 0.19.3: ranks
    0,1 in all_reduce_coalesced on their replica groups, ranks 2,3 in the world group's next
    reduce_scatter_tensor, which ranks 0,1 have not reached)."""
    if not all_blocked(views):
        return None
    by_rank = {v.rank: v for v in views}
    current = {v.rank: v.current for v in views if v.current is not None}
    if any(_can_complete(call, by_rank) for call in current.values()):
        return None
    by_op: dict[str, list[int]] = {}
    for rank, call in sorted(current.items()):
        by_op.setdefault(call.op, []).append(rank)
    parts = []
    for op, ranks in by_op.items():
        places = sorted({(current[r].ranks, current[r].seq) for r in ranks})
        where = ", ".join(f"[{','.join(map(str, g))}] #{seq}" for g, seq in places)
        parts.append(f"{_ranks_text(ranks)} in {op} on group{'s' if len(places) > 1 else ''} {where}")
    reason = f"deadlock: {' and '.join(parts)}; each waits for a rank blocked in another collective"
    evidence: Evidence = {
        "calls": {str(r): {**_describe(c), "group_ranks": list(c.ranks)} for r, c in sorted(current.items())},
        "issued": {str(v.rank): {n: c.seq for n, c in sorted(v.last.items())} for v in views},
    }
    return Hang(HangKind.DEADLOCK, reason, evidence)


def _describe(call: Call) -> CallFacts:
    return {"op": call.op, "seq": call.seq, "sizes": list(call.sizes), "dtype": call.dtype}


def all_blocked(views: list[RankView]) -> bool:
    """Every rank of the world has a record and is inside a collective right now."""
    if not views:
        return False
    world = views[0].world
    ranks = {v.rank for v in views if v.world == world}
    return ranks == set(range(world)) and all(v.current is not None for v in views)


class HangWatch:
    """Feed it the records and the latest heartbeat on every poll; it answers with a Hang once
    the evidence holds. `stall_s` is the run's fixed limit (the calibrated one never exceeds it)."""

    def __init__(self, stall_s: float, *, floor_s: float = STALL_FLOOR_S) -> None:
        self.stall_s, self.floor_s = stall_s, floor_s
        self.moved_at: float | None = None
        self.state: tuple[Any, ...] | None = None
        self.beat: float | None = None
        self.beat_seen_at: float | None = None
        self.slowest_step: float | None = None
        self.steps = 0

    def limit(self) -> float | None:
        """The calibrated stall limit, None before a whole step was seen."""
        if self.slowest_step is None:
            return None
        return min(self.stall_s, max(STEP_FACTOR * self.slowest_step, self.floor_s))

    def observe(
        self,
        now: float,
        views: list[RankView],
        heartbeat: float | None = None,
        activity: float | None = None,
    ) -> Hang | None:
        """`heartbeat`: when a step last ended (steps are its changes); `activity`: anything else
        that shows life (a job's last output), which resets the stall clock but is no step."""
        self._note_step(now, heartbeat)
        state = (heartbeat, activity, tuple((v.pid, v.update) for v in views))
        if state != self.state or self.moved_at is None:
            self.state, self.moved_at = state, now
        still = now - self.moved_at
        mismatch = find_mismatch(views) or find_blocked(views)
        if mismatch is not None and still >= CONFIRM_S:
            return mismatch
        limit = self.limit()
        if limit is not None and still >= limit and all_blocked(views):
            where = sorted({f"{v.current.op} #{v.current.seq}" for v in views if v.current is not None})
            assert self.slowest_step is not None
            reason = (
                f"stall: all {len(views)} ranks inside collectives ({', '.join(where)}) with no progress"
                f" for {still:.0f} s (limit {limit:.0f} s = max({STEP_FACTOR:g} x slowest step"
                f" {self.slowest_step:.1f} s, {self.floor_s:g} s))"
            )
            evidence: Evidence = {
                "calls": {str(v.rank): _describe(v.current) for v in views if v.current is not None},
                "limit_s": round(limit, 2),
                "slowest_step_s": round(self.slowest_step, 3),
                "steps_seen": self.steps,
            }
            return Hang(HangKind.STALL, reason, evidence)
        return None

    def _note_step(self, now: float, heartbeat: float | None) -> None:
        """A step is the time between two heartbeat changes as this watcher saw them."""
        if heartbeat is None or heartbeat == self.beat:
            return
        if self.beat is not None and self.beat_seen_at is not None:
            step = now - self.beat_seen_at
            self.slowest_step = step if self.slowest_step is None else max(self.slowest_step, step)
            self.steps += 1
        self.beat, self.beat_seen_at = heartbeat, now
