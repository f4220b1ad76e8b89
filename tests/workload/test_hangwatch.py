"""Hang by evidence (#34): the collective record (repro/workload/collectives.py) and the
watcher's decision (repro/workload/hangwatch.py) with stand-in ranks and a literal clock.

No torch and no real time: ranks are Recorders writing the files a real rank writes; the
watcher is given the times of its polls."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from repro.workload import collectives, hangwatch
from repro.workload.collectives import Recorder
from repro.workload.hangwatch import HangKind, HangWatch

WORLD = ("0", (0, 1, 2, 3))


class Tensor:
    def __init__(self, numel: int = 4, dtype: str = "torch.float32") -> None:
        self.n, self.dtype = numel, dtype

    def numel(self) -> int:
        return self.n


def _ranks(
    folder: Path, world: int = 4, groups: dict[Any, tuple[str, tuple[int, ...]]] | None = None
) -> list[Recorder]:
    def resolve(group: Any) -> tuple[str, tuple[int, ...]]:
        return (groups or {}).get(group, ("0", tuple(range(world))))

    return [
        Recorder(str(folder / f"rank{r}.json"), resolve, lambda r=r: (r, world))  # type: ignore[misc]
        for r in range(world)
    ]


def _call(rank: Recorder, op: str, group: Any = None, numel: int = 4) -> None:
    rank.leave(rank.enter(op, group, [Tensor(numel)], False))


def _views(folder: Path) -> list[hangwatch.RankView]:
    # The stand-ins share this test's pid: every record counts as a live process.
    return hangwatch.read_views(str(folder), lambda pid: True)


def test_different_collectives_at_one_position_are_a_deadlock_named_by_ranks(tmp_path: Path) -> None:
    ranks = _ranks(tmp_path)
    for _ in range(3):
        for rank in ranks:
            _call(rank, "all_reduce")
    for r, rank in enumerate(ranks):  # MiCS replica groups on DeepSpeed 0.19.3
        rank.enter("all_reduce_coalesced" if r < 2 else "reduce_scatter_tensor", None, [Tensor()], False)
    watch = HangWatch(stall_s=600.0)
    views = _views(tmp_path)
    assert watch.observe(100.0, views) is None  # first sight: confirmed only when nothing moves
    hang = watch.observe(100.0 + hangwatch.CONFIRM_S, _views(tmp_path))
    assert hang is not None and hang.kind is HangKind.DEADLOCK
    assert hang.reason == (
        "deadlock: ranks 0,1 in all_reduce_coalesced and ranks 2,3 in reduce_scatter_tensor"
        " on group [0,1,2,3] (collective #4 of that group)"
    )
    assert hang.evidence["seq"] == 4 and hang.evidence["ranks_inside_a_call"] == [0, 1, 2, 3]
    assert hang.evidence["calls"]["2"] == {
        "op": "reduce_scatter_tensor",
        "seq": 4,
        "sizes": [4],
        "dtype": "float32",
    }


def test_a_mismatch_that_still_moves_is_not_called_yet(tmp_path: Path) -> None:
    ranks = _ranks(tmp_path, world=2)
    ranks[0].enter("all_reduce", None, [Tensor()], False)
    ranks[1].enter("broadcast", None, [Tensor()], False)
    watch = HangWatch(stall_s=600.0)
    assert watch.observe(0.0, _views(tmp_path)) is None
    ranks_groups = {"other": ("1", (0,))}
    ranks[0].resolve = lambda group: ranks_groups.get(group, ("0", (0, 1)))
    # Another thread of rank 0 still records something: the ranks are not still.
    side = threading.Thread(target=_call, args=(ranks[0], "barrier", "other"))
    side.start()
    side.join()
    assert watch.observe(hangwatch.CONFIRM_S, _views(tmp_path)) is None
    assert watch.observe(2 * hangwatch.CONFIRM_S, _views(tmp_path)) is not None


def test_ranks_at_different_positions_or_missing_members_prove_nothing(tmp_path: Path) -> None:
    ranks = _ranks(tmp_path)
    for rank in ranks[:3]:
        _call(rank, "all_reduce")
    ranks[3].enter("broadcast", None, [Tensor()], False)  # its #1 while the others wait in #2
    for rank in ranks[:3]:
        rank.enter("all_reduce", None, [Tensor()], False)
    watch = HangWatch(stall_s=600.0)
    assert watch.observe(0.0, _views(tmp_path)) is None
    assert watch.observe(1000.0, _views(tmp_path)) is None  # no step seen: the caller's fixed limit
    # Rank 3's record gone (its process ended): a group with an unseen member proves nothing.
    os.remove(tmp_path / "rank3.json")
    assert hangwatch.find_mismatch(_views(tmp_path)) is None


def _steps(watch: HangWatch, ranks: list[Recorder], folder: Path, steps: int, step_s: float) -> float:
    """Ranks agree on one all_reduce per step; the heartbeat changes after each. Returns the time."""
    now = 0.0
    watch.observe(now, _views(folder), heartbeat=0.0)
    for step in range(1, steps + 1):
        for rank in ranks:
            _call(rank, "all_reduce")
        now = step * step_s
        assert watch.observe(now, _views(folder), heartbeat=float(step)) is None
    return now


def test_ranks_that_stop_after_several_steps_hang_after_the_calibrated_limit(tmp_path: Path) -> None:
    ranks = _ranks(tmp_path)
    watch = HangWatch(stall_s=600.0)
    stopped = _steps(watch, ranks, tmp_path, steps=5, step_s=4.0)
    for rank in ranks:  # all enter the same collective, which never returns
        rank.enter("all_reduce", None, [Tensor()], False)
    assert watch.limit() == 40.0  # 10 x the slowest step (4 s), above the 30 s floor
    assert watch.observe(stopped + 0.1, _views(tmp_path), heartbeat=5.0) is None
    assert (
        watch.observe(stopped + 40.0, _views(tmp_path), heartbeat=5.0) is None
    )  # same collective, just slow
    hang = watch.observe(stopped + 40.2, _views(tmp_path), heartbeat=5.0)
    assert hang is not None and hang.kind is HangKind.STALL
    assert "all 4 ranks inside collectives (all_reduce #6)" in hang.reason
    assert hang.evidence["limit_s"] == 40.0 and hang.evidence["steps_seen"] == 5


def test_the_calibrated_limit_has_a_floor_and_never_exceeds_the_fixed_one(tmp_path: Path) -> None:
    ranks = _ranks(tmp_path)
    fast = HangWatch(stall_s=600.0)
    _steps(fast, ranks, tmp_path, steps=3, step_s=0.5)
    assert fast.limit() == hangwatch.STALL_FLOOR_S
    slow = HangWatch(stall_s=60.0)
    _steps(slow, _ranks(tmp_path / "slow"), tmp_path / "slow", steps=3, step_s=20.0)
    assert slow.limit() == 60.0


def test_a_rank_outside_any_collective_is_not_blocked(tmp_path: Path) -> None:
    """Rank 0 computes (or writes a checkpoint) while the others wait for it: no calibrated hang."""
    ranks = _ranks(tmp_path)
    watch = HangWatch(stall_s=600.0)
    stopped = _steps(watch, ranks, tmp_path, steps=3, step_s=1.0)
    for rank in ranks[1:]:
        rank.enter("barrier", None, [], False)
    assert watch.observe(stopped + 1000.0, _views(tmp_path), heartbeat=3.0) is None


def test_record_passes_calls_through_and_counts_positions_per_group(tmp_path: Path) -> None:
    seen: list[tuple[Any, ...]] = []
    shard = object()
    groups = {None: ("0", (0, 1, 2, 3)), shard: ("3", (0, 1))}
    rec = Recorder(str(tmp_path / "r.json"), lambda g: groups.get(g, groups[None]), lambda: (0, 4))

    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> str:
        seen.append(("all_reduce", tensor, op, group, async_op))
        inner(tensor)  # torch calling its own public function: part of this call
        return "work"

    def inner(tensor: Any) -> None:
        seen.append(("inner",))

    def _all_gather_base(output: Any, input: Any, group: Any = None, async_op: bool = False) -> None:
        raise RuntimeError("backend says no")

    inner = collectives.wrap(rec, "broadcast", inner)  # type: ignore[assignment]
    wrapped = collectives.wrap(rec, "all_reduce", all_reduce)
    gather = collectives.wrap(rec, "_all_gather_base", _all_gather_base)
    t = Tensor(8)
    assert wrapped(t, "SUM", shard, True) == "work"
    assert wrapped(tensor=t) == "work"
    assert seen[0] == ("all_reduce", t, "SUM", shard, True) and seen[1] == ("inner",)
    with pytest.raises(RuntimeError, match="backend says no"):
        gather(Tensor(2), Tensor(1), group=shard)
    view = hangwatch.parse((tmp_path / "r.json").read_text())
    assert view is not None and view.current is None and view.done == 3
    assert view.last["3"].op == "all_gather_into_tensor" and view.last["3"].seq == 2  # an alias, #2 there
    assert view.last["0"].seq == 1 and view.last["0"].sizes == (8,)
    assert wrapped.__wrapped__ is all_reduce  # type: ignore[attr-defined]


def test_a_coalescing_block_records_its_exit_as_one_collective(tmp_path: Path) -> None:
    import contextlib

    rec = Recorder(str(tmp_path / "r.json"), lambda g: WORLD, lambda: (0, 4))
    exits: list[str] = []

    @contextlib.contextmanager
    def manager(group: Any, device: Any = None, async_ops: bool = False) -> Any:
        yield "cm"
        exits.append("issued")

    coalescing = collectives.wrap_coalescing(rec, manager)
    gather = collectives.wrap(
        rec, "all_gather_into_tensor", lambda out, inp, group=None, async_op=False: None
    )
    with coalescing(None, async_ops=True) as cm:
        assert cm == "cm"
        gather(Tensor(), Tensor(), async_op=True)
        gather(Tensor(), Tensor(), async_op=True)
    with coalescing(None):  # batch_isend_irecv's kind of block: nothing recorded inside
        pass
    assert exits == ["issued", "issued"]
    view = hangwatch.parse((tmp_path / "r.json").read_text())
    assert view is not None and view.last["0"].op == collectives.COALESCED and view.last["0"].seq == 3


@pytest.mark.parametrize(
    "text",
    [
        '{"n": 3, "pid": 1, "rank": 0, "world": 2, "done": 0, "current": null, "groups": {}, "z": 2}',
        '{"n": 3, "pid": 1, "rank": 0, "wor',
        "",
        "[]",
        '{"n": 1, "z": 1}',
    ],
)
def test_a_torn_or_foreign_record_is_skipped(text: str) -> None:
    assert hangwatch.parse(text) is None


def test_records_of_ended_processes_do_not_count(tmp_path: Path) -> None:
    ranks = _ranks(tmp_path, world=2)
    _call(ranks[0], "all_reduce")
    _call(ranks[1], "all_reduce")
    assert len(hangwatch.read_views(str(tmp_path), lambda pid: False)) == 0


def _replica_hang(folder: Path, rank3_collective: str = "reduce_scatter_tensor") -> list[Recorder]:
    """The records of DeepSpeed 0.19.3's replica-group hang (world 4, shard 2), as the CPU twin
    wrote them: after six agreed world-group reductions, ranks 0,1 enter all_reduce_coalesced on
    their replica groups [0,2] and [1,3]; ranks 2,3 skip it and enter the world's seventh."""
    groups = {None: ("0", (0, 1, 2, 3)), "r02": ("3", (0, 2)), "r13": ("4", (1, 3))}
    ranks = _ranks(folder, groups=groups)
    for _ in range(6):
        for rank in ranks:
            _call(rank, "reduce_scatter_tensor")
    ranks[0].enter("all_reduce_coalesced", "r02", [Tensor()], False)
    ranks[1].enter("all_reduce_coalesced", "r13", [Tensor()], False)
    ranks[2].enter("reduce_scatter_tensor", None, [Tensor()], False)
    ranks[3].enter(rank3_collective, None, [Tensor()], False)
    return ranks


def test_every_rank_waiting_for_a_rank_blocked_elsewhere_is_a_deadlock(tmp_path: Path) -> None:
    _replica_hang(tmp_path)
    watch = HangWatch(stall_s=60.0)
    assert watch.observe(0.0, _views(tmp_path)) is None
    hang = watch.observe(hangwatch.CONFIRM_S, _views(tmp_path))
    assert hang is not None and hang.kind is HangKind.DEADLOCK
    assert hang.reason == (
        "deadlock: ranks 0,1 in all_reduce_coalesced on groups [0,2] #1, [1,3] #1 and ranks 2,3 in"
        " reduce_scatter_tensor on group [0,1,2,3] #7; each waits for a rank blocked in another collective"
    )
    assert hang.evidence["issued"]["0"] == {"0": 6, "3": 1}
    assert hang.evidence["calls"]["2"]["group_ranks"] == [0, 1, 2, 3]


def test_a_blocked_rank_whose_call_can_still_complete_is_no_deadlock(tmp_path: Path) -> None:
    """Rank 1 already issued (asynchronously) what rank 0 waits in: that call can finish."""
    groups = {None: ("0", (0, 1)), "side": ("1", (0, 1))}
    ranks = _ranks(tmp_path, world=2, groups=groups)
    ranks[1].leave(ranks[1].enter("all_reduce", None, [Tensor()], True))  # async: returned at once
    ranks[0].enter("all_reduce", None, [Tensor()], False)
    ranks[1].enter("barrier", "side", [], False)  # and now waits on another group
    assert hangwatch.find_blocked(_views(tmp_path)) is None
    assert hangwatch.find_mismatch(_views(tmp_path)) is None
