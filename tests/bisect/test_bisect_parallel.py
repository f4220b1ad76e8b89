"""The k-ary search core (PARALLEL=k): k candidates per round give the binary search's answer for
any verdict sequence with at most one transition (unknowns anywhere), in about log_(k+1) N rounds,
and k = 1 is exactly the textbook binary search."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.bisect.search import Bisection, ProbeVerdict, Survey
from repro.bisect.search import (
    round_bound as printed_bound,
)
from tests.fixtures.scripted_verdicts import bisect, bisect_rounds, survey

G, B, U = ProbeVerdict.GOOD, ProbeVerdict.BAD, ProbeVerdict.UNKNOWN


def round_bound(n: int, k: int) -> int:
    """The documented bound, computed independently of search.round_bound (which the CLI prints)."""
    return (2 if k == 1 else 1) + math.ceil(math.log(n - 1, k + 1) - 1e-9) if n > 2 else 2 if k == 1 else 1


def one_transition(n: int, at: int, fix: bool, unknown: Sequence[bool]) -> list[ProbeVerdict]:
    """A regression (or fix) at `at`, seen through unknowns where `unknown` says so."""
    before, after = (B, G) if fix else (G, B)
    return [U if unknown[i] else (before if i < at else after) for i in range(n)]


def judged(verdicts: Sequence[ProbeVerdict], k: int) -> tuple[object, int, list[list[int]]]:
    rounds: list[list[int]] = []

    def judge_round(batch: list[int]) -> list[ProbeVerdict]:
        assert 1 <= len(batch) <= k and batch == sorted(set(batch))
        rounds.append(batch)
        return [verdicts[i] for i in batch]

    result, count = bisect_rounds(range(len(verdicts)), judge_round, k)
    return result, count, rounds


def same_answer(a: object, b: object) -> bool:
    fields = ("status", "before", "after", "before_verdict", "unknown_between")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


@settings(max_examples=500, deadline=None)
@given(
    st.integers(2, 80).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.integers(0, n),  # n or 0: no transition at all
            st.booleans(),
            st.lists(st.booleans(), min_size=n, max_size=n),
            st.integers(1, 7),
        )
    )
)
def test_same_answer_as_the_binary_search(case: tuple[int, int, bool, list[bool], int]) -> None:
    n, at, fix, unknown, k = case
    verdicts = one_transition(n, at, fix, unknown)
    sequential = bisect(range(n), lambda i: verdicts[i])
    parallel, _, rounds = judged(verdicts, k)
    assert same_answer(parallel, sequential), (verdicts, k)
    probed = [i for batch in rounds for i in batch]
    assert len(probed) == len(set(probed)) <= n  # nothing probed twice


@settings(max_examples=300, deadline=None)
@given(
    st.integers(2, 400).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(1, n - 1), st.booleans(), st.integers(1, 8))
    )
)
def test_round_bound_without_unknowns(case: tuple[int, int, bool, int]) -> None:
    n, at, fix, k = case
    result, count, _ = judged(one_transition(n, at, fix, [False] * n), k)
    assert (result.before, result.after) == (at - 1, at)  # type: ignore[attr-defined]
    assert count <= round_bound(n, k), (n, at, k, count)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_round_bound_exhaustive_small_ranges(k: int) -> None:
    for n in range(2, 60):
        for at in range(1, n):
            result, count, _ = judged(one_transition(n, at, False, [False] * n), k)
            assert (result.before, result.after) == (at - 1, at)  # type: ignore[attr-defined]
            assert count <= round_bound(n, k), (n, at, count)


def test_parallel_needs_fewer_rounds_than_probes_in_sequence() -> None:
    # 64 commits, two probes a round: 1 + ceil(log3 63) = 5 rounds against up to 8 probes.
    verdicts = one_transition(64, 41, False, [False] * 64)
    sequential = bisect(range(64), lambda i: verdicts[i])
    _, count, rounds = judged(verdicts, 2)
    assert rounds[0] == [0, 63]
    assert count <= 5 < sequential.probe_count


@settings(max_examples=300, deadline=None)
def textbook_binary_search(verdicts: Sequence[ProbeVerdict]) -> list[int]:
    """What a binary search probes over a range whose two ends differ: both ends, then each
    midpoint (the lower one when two), keeping the half whose ends differ. Written here, apart from
    repro.bisect.search, whose sequential search (`next_probe`) is its rounds of one."""
    lo, hi = 0, len(verdicts) - 1
    asked = [lo, hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        asked.append(mid)
        lo, hi = (mid, hi) if verdicts[mid] == verdicts[lo] else (lo, mid)
    return asked


@pytest.mark.parametrize("fix", [False, True])
def test_one_per_round_is_the_textbook_binary_search(fix: bool) -> None:
    for n in range(2, 70):
        for at in range(1, n):
            verdicts = one_transition(n, at, fix, [False] * n)
            state = Bisection(n)
            asked = []
            while (i := state.next_probe()) is not None:
                asked.append(i)
                state.record(i, verdicts[i])
            assert asked == textbook_binary_search(verdicts), (n, at)
            _, _, rounds = judged(verdicts, 1)
            assert [batch[0] for batch in rounds] == asked


def test_unknown_ends_are_searched_in_parallel() -> None:
    # A block of unknowns at each end (DeepSpeed commits that do not import on this torch).
    verdicts = [U] * 5 + [G] * 6 + [B] * 7 + [U] * 6
    result, _, rounds = judged(verdicts, 3)
    assert (result.before, result.after, result.unknown_between) == (10, 11, ())  # type: ignore[attr-defined]
    assert rounds[0][:1] == [0] and rounds[0][-1] == len(verdicts) - 1


def test_unknowns_in_the_middle_are_stepped_around() -> None:
    verdicts = [G] * 4 + [U, U, U] + [B] * 5
    result, _, rounds = judged(verdicts, 2)
    assert (result.before, result.after, result.unknown_between) == (3, 7, (4, 5, 6))  # type: ignore[attr-defined]
    probed = [i for batch in rounds for i in batch]
    assert {4, 5, 6} <= set(probed)


def test_a_round_never_asks_for_nothing_useful() -> None:
    with pytest.raises(ValueError):
        Bisection(5).next_round(0)
    assert Bisection(1).next_round(3) == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=40),
    st.integers(1, 6),
)
def test_survey_rounds_find_every_change_between_blocks(keys: list[str | None], k: int) -> None:
    """Rounds of one (the sequential survey) and of k: nothing probed twice, and where every key is
    known and no key comes back after another, the change points are exactly where the list
    changes (computed here from the list, not by repro.bisect.search)."""
    sequential = survey(keys, lambda x: x)
    assert len(sequential.order) == len(set(sequential.order))
    par: Survey[str] = Survey(len(keys))
    while batch := par.next_round(k):
        assert len(batch) <= k
        for i in batch:
            par.record(i, keys[i])
    assert len(par.order) == len(set(par.order))
    if all(x is not None for x in keys) and len(set(keys)) == len([g for g in _blocks(keys)]):
        changes = [(i, i + 1) for i in range(len(keys) - 1) if keys[i] != keys[i + 1]]
        assert [(c.before, c.after) for c in sequential.change_points] == changes
        assert [(c.before, c.after) for c in par.result().change_points] == changes


def _blocks(keys: list[str | None]) -> list[str | None]:
    return [x for i, x in enumerate(keys) if i == 0 or keys[i - 1] != x]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_the_printed_bound_is_the_documented_one(k: int) -> None:
    assert [printed_bound(n, k) for n in range(2, 300)] == [round_bound(n, k) for n in range(2, 300)]
