"""The pure bisection when candidates are unknown: unknown ends are searched in logarithmic steps
(issue 14), unknowns in the middle or scattered are stepped around, and the resume range after an
interruption leads to the same answer."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.bisect.search import Bisection, BisectResult, BisectStatus, ProbeVerdict
from tests.fixtures.scripted_verdicts import B, G, U, bisect, regressions, scripted


def masked(n: int, first_bad: int, unknown: set[int]) -> list[ProbeVerdict]:
    """A regression at `first_bad` seen through unknowns at the given indices."""
    return [U if i in unknown else (G if i < first_bad else B) for i in range(n)]


def one_end_bound(n: int) -> int:
    """Probes for a transition with no unknowns or with one unknown block at one end."""
    return math.ceil(math.log2(n)) + 2


def assert_correct(seen: Sequence[ProbeVerdict], result: BisectResult) -> None:
    """The answer is the adjacent good/bad pair among the known candidates, when there is one."""
    n = len(seen)
    assert len({i for i, _ in result.probes}) == result.probe_count <= n
    known = [i for i in range(n) if seen[i] is not U]
    if not known:
        assert result.status is BisectStatus.NO_VERDICT
        assert result.probe_count == n  # an all-unknown range is proven so by probing each one
        return
    pairs = [(a, b) for a, b in zip(known, known[1:]) if seen[a] is not seen[b]]
    if not pairs:
        assert result.status is BisectStatus.NO_TRANSITION
        assert result.before_verdict is seen[known[0]]
        return
    assert result.status is BisectStatus.FOUND
    assert (result.before, result.after) == pairs[0]
    assert result.before_verdict is seen[pairs[0][0]]
    # Everything strictly inside the boundary was tried and found unknown.
    assert result.unknown_between == tuple(range(pairs[0][0] + 1, pairs[0][1]))


# -- the measured case of issue 14 ------------------------------------------------------------
TORCH = "2.0.1 2.1.0 2.1.1 2.1.2 2.2.0 2.2.1 2.2.2 2.3.0 2.3.1 2.4.0 2.4.1 2.5.0 2.5.1".split()
# DeepSpeed 0.13.1 cannot import on torch >= 2.4, and MiCS breaks from torch 2.1.0 on.
TORCH_DS_0_13_1 = {v: G for v in TORCH[:1]} | {v: B for v in TORCH[1:9]} | {v: U for v in TORCH[9:]}


def test_torch_bisect_with_an_unknown_bad_end_finds_2_1_0_in_six_probes() -> None:
    asked: list[str] = []

    def judge(version: str) -> ProbeVerdict:
        asked.append(version)
        return TORCH_DS_0_13_1[version]

    result = bisect(TORCH, judge)
    assert result.status is BisectStatus.FOUND
    assert result.before is not None and result.after is not None
    assert (TORCH[result.before], TORCH[result.after], result.before_verdict) == ("2.0.1", "2.1.0", G)
    assert result.unknown_between == ()
    assert result.probe_count <= 6, asked
    # Both ends, then straight into the range instead of walking down 2.5.0, 2.4.1, 2.4.0.
    assert asked[:3] == ["2.0.1", "2.5.1", "2.2.2"]
    assert "2.5.0" not in asked and "2.4.1" not in asked


# -- literal lists ---------------------------------------------------------------------------
def test_unknown_start_is_searched_from_the_known_end() -> None:
    asked, judge = scripted([U, U, U, U, U, U, G, G, B, B, B, B])
    result = bisect(range(12), judge)
    assert asked[:2] == [0, 11]  # both ends first, as without unknowns
    assert (result.before, result.after) == (7, 8)
    assert result.probe_count <= one_end_bound(12)


def test_unknown_blocks_at_both_ends_are_searched_from_the_middle() -> None:
    seen = [U, U, U, U, G, G, G, B, B, B, B, U, U, U, U, U]
    asked, judge = scripted(seen)
    result = bisect(range(16), judge)
    assert asked[:3] == [0, 15, 7]
    assert (result.before, result.after) == (6, 7)


def test_a_transition_before_a_known_middle_is_still_found() -> None:
    # The first known candidate is bad, so the boundary is on its start side.
    seen = [U, U, U, G, B, B, B, B, U, U, U]
    result = bisect(range(11), scripted(seen)[1])
    assert (result.before, result.after, result.before_verdict) == (3, 4, G)


def test_a_good_candidate_beyond_scattered_unknowns_is_not_missed() -> None:
    # The unknown block's edge (2 | 3) is found first; the candidates beyond it are then checked.
    seen = [G, G, G, U, B, U, U, U]
    result = bisect(range(8), scripted(seen)[1])
    assert_correct(seen, result)
    assert (result.before, result.after, result.unknown_between) == (2, 4, (3,))


def test_no_transition_behind_an_unknown_end_checks_every_unknown() -> None:
    seen = [G, G, G, G, U, U, U, U]
    asked, judge = scripted(seen)
    result = bisect(range(8), judge)
    assert result.status is BisectStatus.NO_TRANSITION and result.before_verdict is G
    assert sorted(i for i in asked if seen[i] is U) == [4, 5, 6, 7]


def test_all_unknown_ends_with_no_verdict() -> None:
    result = bisect(range(9), scripted([U] * 9)[1])
    assert result.status is BisectStatus.NO_VERDICT
    assert (result.before, result.after, result.before_verdict) == (None, None, None)


def test_search_keeps_going_after_an_unknown_answer() -> None:
    state = Bisection(5)
    order = []
    seen = [G, U, U, U, U]
    while (i := state.next_probe()) is not None:
        order.append(i)
        state.record(i, seen[i])
    assert sorted(order) == [0, 1, 2, 3, 4]
    assert state.result().status is BisectStatus.NO_TRANSITION


# -- bounds for contiguous unknown end blocks ---------------------------------------------------
@pytest.mark.parametrize("n", range(3, 40))
def test_one_unknown_end_block_keeps_the_bound_exhaustive(n: int) -> None:
    limit = one_end_bound(n)
    for block in range(1, n - 1):
        for at_end in (True, False):
            unknown = set(range(n - block, n)) if at_end else set(range(block))
            known = [i for i in range(n) if i not in unknown]
            for first_bad in range(known[0] + 1, known[-1] + 1):
                seen = masked(n, first_bad, unknown)
                result = bisect(range(n), scripted(seen)[1])
                assert_correct(seen, result)
                assert result.probe_count <= limit, (n, block, at_end, first_bad, result.probes)


def both_ends_bound(n: int) -> int:
    """Unknown blocks at both ends, the middle candidate known: the ends, the middle, then a binary
    search on each side of it at worst."""
    return 2 * math.ceil(math.log2(n)) + 1


@settings(max_examples=400, deadline=None)
@given(
    st.integers(3, 300).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.integers(0, n - 2),  # unknown block at the start
            st.integers(0, n - 2),  # unknown block at the end
            st.booleans(),  # whether both blocks are kept (otherwise only the end one)
            st.integers(1, n - 1),  # first bad candidate of the truth
        )
    )
)
def test_unknown_end_blocks_keep_a_stated_bound(case: tuple[int, int, int, bool, int]) -> None:
    n, head, tail, both, first_bad = case
    head = head if both else 0
    if head + tail > n - 2:
        tail = max(0, n - 2 - head)
    unknown = set(range(head)) | set(range(n - tail, n))
    seen = masked(n, first_bad, unknown)
    result = bisect(range(n), scripted(seen)[1])
    assert_correct(seen, result)
    if result.status is not BisectStatus.FOUND:
        # No transition among the known ones: every unknown beyond them must be checked.
        if head == 0 or tail == 0:
            assert result.probe_count <= len(unknown) + one_end_bound(n), (n, head, tail, result.probes)
        return
    if head == 0 or tail == 0:
        assert result.probe_count <= one_end_bound(n), (n, head, tail, first_bad, result.probes)
    elif seen[(n - 1) // 2] is not U:
        assert result.probe_count <= both_ends_bound(n), (n, head, tail, first_bad, result.probes)


# -- correctness with unknowns anywhere -------------------------------------------------------
@settings(max_examples=500, deadline=None)
@given(
    regressions(
        80,
        lambda n: st.integers(0, n),  # block at the start
        lambda n: st.integers(0, n),  # block at the end
        lambda n: st.tuples(st.integers(0, n - 1), st.integers(0, n)),  # a block in the middle
        lambda n: st.lists(st.integers(0, n - 1), max_size=n),  # scattered unknowns
        lambda _: st.booleans(),  # a fix (bad then good) instead of a regression
    )
)
def test_unknowns_anywhere_never_give_a_wrong_answer(
    case: tuple[int, int, int, int, tuple[int, int], list[int], bool],
) -> None:
    n, first_bad, head, tail, (mid_at, mid_len), scattered, fix = case
    unknown = set(range(head)) | set(range(n - tail, n)) | set(range(mid_at, min(n, mid_at + mid_len)))
    unknown |= set(scattered)
    seen = masked(n, first_bad, unknown)
    if fix:
        seen = [{G: B, B: G, U: U}[v] for v in seen]
    assert_correct(seen, bisect(range(n), scripted(seen)[1]))


@settings(max_examples=300, deadline=None)
@given(
    regressions(
        60,
        lambda n: st.integers(0, n - 1),  # block at the end
        lambda n: st.lists(st.integers(0, n - 1), max_size=n // 2),
        lambda _: st.integers(0, 12),  # probes done before the interruption
    )
)
def test_the_resume_range_leads_to_the_same_answer(
    case: tuple[int, int, int, list[int], int],
) -> None:
    n, first_bad, tail, scattered, stop_after = case
    seen = masked(n, first_bad, set(range(n - tail, n)) | set(scattered))
    full = bisect(range(n), scripted(seen)[1])
    state = Bisection(n)
    for _ in range(stop_after):
        if (i := state.next_probe()) is None:
            break
        state.record(i, seen[i])
    lo, hi = state.bounds()
    assert 0 <= lo < hi < n or n < 2
    resumed = bisect(range(lo, hi + 1), scripted(seen)[1])
    if full.status is BisectStatus.FOUND:
        assert resumed.status is BisectStatus.FOUND
        assert resumed.before is not None and resumed.after is not None
        assert (resumed.before + lo, resumed.after + lo) == (full.before, full.after)
    else:
        assert resumed.status is not BisectStatus.FOUND


def test_bounds_leave_out_probed_unknown_ends() -> None:
    state = Bisection(13)
    for i, v in ((0, G), (12, U)):
        state.record(i, v)
    assert state.bounds() == (0, 11)
    state.record(6, G)  # everything up to 6 agrees: only the side beyond it is left
    assert state.bounds() == (6, 11)
    state.record(9, B)
    assert state.bounds() == (6, 9)
