"""Pure bisection and survey over an ordered list of candidates (versions, commits, anything).

Nothing here knows about pip, Docker or records: callers feed verdicts (bisect) or keys (survey)
for the index the state machine asks for, so every decision is unit-testable with literal lists.

Bisection: both ends are probed first; once two neighbouring known candidates disagree, a binary
search between them finds the adjacent pair where the verdict flips, and `before_verdict` is the
one on the start side of that pair. An unknown in the middle is stepped around by probing the
nearest untried candidate instead. An unknown end is not walked one candidate at a time: the
untried run between the outermost known candidate and the nearest unknown beyond it is halved
(an unknown answer means the unknown block starts lower), which finds a known candidate of the
other verdict, or the edge of the block, in logarithmic steps. Unknowns further out are probed
only when that found no transition, so scattered unknowns cannot hide one.
Cost of a single transition among N candidates:
- no unknowns, or one contiguous block of unknowns at one end: at most
  2 + ceil(log2(N - 1)) <= ceil(log2 N) + 2 probes;
- blocks at both ends: the ends, then the widest untried run is halved until a candidate is known
  (one probe when the middle one is), then at most a binary search on each side of it:
  at most 2 * ceil(log2 N) + 1 probes when the middle candidate is known;
- no transition behind an unknown end: every unknown there is probed (as they must be to prove
  it), plus at most the ceil(log2 N) + 2 probes of the search above.

Survey: find every index where the key (e.g. outcome + signature) changes, splitting a segment
only when its two probed ends differ; `every=True` probes each candidate instead. Unknown probes
(key None) are stepped around the same way and reported between the change points they hide in.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Optional, TypeVar

A = TypeVar("A")


class ProbeVerdict(enum.Enum):
    """What one probe says about the bisected property (not the env verdict of core/verdict.py)."""

    GOOD = "good"
    BAD = "bad"
    UNKNOWN = "unknown"


class BisectStatus(enum.Enum):
    FOUND = "found"  # a good/bad boundary (maybe with unknowns inside it)
    NO_TRANSITION = "no-transition"  # both ends gave the same verdict
    NO_VERDICT = "no-verdict"  # every candidate was unknown
    TOO_FEW = "too-few"  # fewer than two candidates


@dataclass(frozen=True)
class BisectResult:
    status: BisectStatus
    # Indices of the boundary: `before` shows `before_verdict`, `after` the other verdict.
    before: int | None
    after: int | None
    before_verdict: ProbeVerdict | None
    unknown_between: tuple[int, ...]  # untestable candidates inside the boundary (ambiguity)
    probes: tuple[tuple[int, ProbeVerdict], ...]  # in probe order

    @property
    def probe_count(self) -> int:
        return len(self.probes)


def _nearest_untried(lo: int, hi: int, tried: Callable[[int], bool], target: int | None = None) -> int | None:
    """The untried index strictly inside (lo, hi) closest to `target` (default the midpoint;
    the lower one on ties)."""
    mid = (lo + hi) // 2 if target is None else target
    for dist in range(hi - lo + abs(mid - lo) + 1):
        for cand in (mid - dist, mid + dist):
            if lo < cand < hi and not tried(cand):
                return cand
    return None


def _spread(lo: int, hi: int, k: int, tried: Callable[[int], bool]) -> list[int]:
    """Up to k untried indices strictly inside (lo, hi) that split it into k + 1 near-equal parts
    (target j is lo + floor(j * (hi - lo) / (k + 1)), so no part is wider than
    ceil((hi - lo) / (k + 1))); a target already tried (an unknown) is replaced by the nearest
    untried index. k = 1 is the binary search's midpoint."""
    picked: list[int] = []

    def taken(i: int) -> bool:
        return tried(i) or i in picked

    for j in range(1, k + 1):
        cand = _nearest_untried(lo, hi, taken, lo + (j * (hi - lo)) // (k + 1))
        if cand is None:
            break
        picked.append(cand)
    return sorted(picked)


class _Probed(Generic[A]):
    """What the probes so far answered (`answers`, by candidate index), and in which order."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.answers: dict[int, A] = {}
        self.order: list[int] = []

    def record(self, index: int, answer: A) -> None:
        if index in self.answers:
            raise ValueError(f"candidate {index} was already probed")
        if not 0 <= index < self.count:
            raise IndexError(index)
        self.answers[index] = answer
        self.order.append(index)

    def _tried(self, i: int) -> bool:
        return i in self.answers

    def _round(self, k: int) -> list[int]:
        raise NotImplementedError

    def next_round(self, k: int) -> list[int]:
        """Up to k candidates to probe side by side (PARALLEL=k), in index order; [] when done."""
        if k < 1:
            raise ValueError("a round probes at least one candidate")
        return self._round(k)

    def next_probe(self) -> int | None:
        """The one candidate a sequential search probes next (None when done): `next_round(1)`'s."""
        return next(iter(self.next_round(1)), None)


class Bisection(_Probed[ProbeVerdict]):
    """Ask `next_round(k)`, answer each with `record(index, verdict)`, until it asks for none.

    Every decision is recomputed from the verdicts so far, so the state is just what was probed.
    """

    # -- state ---------------------------------------------------------------------------------
    def _known(self) -> list[int]:
        return sorted(i for i, v in self.answers.items() if v is not ProbeVerdict.UNKNOWN)

    def _boundary(self, known: list[int]) -> tuple[int, int] | None:
        """The first pair of neighbouring known candidates whose verdicts differ."""
        for a, b in zip(known, known[1:]):
            if self.answers[a] is not self.answers[b]:
                return a, b
        return None

    def _gap_to_split(self, known: list[int]) -> tuple[int, int] | None:
        """While every verdict so far agrees: the run of untried candidates to probe the middle of.

        Gaps are runs of untried candidates between two probed ones (both ends are probed first,
        so every untried candidate lies in one). An unknown end usually heads a contiguous block
        (a DeepSpeed that cannot import on newer torch), so the gap between the outermost known
        candidate and the nearest unknown beyond it is halved first: that finds a known candidate
        of the other verdict, or the block's edge, in logarithmic steps. Only then are the gaps
        further out (between unknowns) probed, since a known candidate hidden there could still
        hold the other verdict. Gaps between two agreeing known candidates are never probed: like
        any bisection, this assumes the verdict does not flip and flip back between them.
        """
        tried = sorted(self.answers)
        gaps = [(a, b) for a, b in zip(tried, tried[1:]) if b - a > 1]
        if not known:
            # Nothing decided yet: halve the widest gap (the earlier one on ties).
            return max(gaps, key=lambda g: g[1] - g[0], default=None)
        first, last = known[0], known[-1]
        inner = [g for g in gaps if g[0] == last or g[1] == first]
        if inner:
            # Wider first; on ties the end side, where unknown blocks are most common.
            return max(inner, key=lambda g: (g[1] - g[0], g[0]))
        outer = [g for g in gaps if g[0] >= last or g[1] <= first]

        def distance(g: tuple[int, int]) -> tuple[int, int]:
            return (g[0] - last if g[0] >= last else first - g[1]), -g[0]

        return min(outer, key=distance, default=None)

    def _round(self, k: int) -> list[int]:
        """Both ends first (and, for k > 2, k - 2 points between them), then the boundary, or
        while every verdict agrees the gap `_gap_to_split` picks, split by k points (k = 1: the
        binary search's midpoint; an unknown midpoint is stepped around). Without unknowns a
        transition among N candidates takes at most 1 + ceil(log_(k+1)(N - 1)) rounds for k >= 2
        (2 + ceil(log2(N - 1)) for k = 1: one probe per round). The answer is `result()`'s, so for
        a single transition it is the binary search's.
        """
        if self.count < 2:
            return []
        ends = [end for end in (0, self.count - 1) if end not in self.answers]
        if ends:
            picks = ends[:k]
            if k > 2 and len(ends) == 2:
                picks += _spread(0, self.count - 1, k - 2, self._tried)
            return sorted(picks)
        known = self._known()
        pair = self._boundary(known)
        if pair is None:
            pair = self._gap_to_split(known)
            if pair is None:
                return []
        return _spread(pair[0], pair[1], k, self._tried)

    def bounds(self) -> tuple[int, int]:
        """The narrowest range still known to hold the transition (for resuming after Ctrl-C).

        A search over the returned range reaches the same boundary as this one would have.
        """
        known = self._known()
        pair = self._boundary(known)
        if pair is not None:
            return pair
        lo, hi = 0, self.count - 1
        if known:
            # The other verdict can only lie beyond the known candidates, on a side with untried ones.
            untried = [i for i in range(self.count) if i not in self.answers]
            below = any(i < known[0] for i in untried)
            above = any(i > known[-1] for i in untried)
            if above and not below:
                lo = known[-1]
            elif below and not above:
                hi = known[0]
        # An unknown candidate is never either side of a boundary: leave probed unknown ends out.
        while hi - lo > 1 and self.answers.get(lo) is ProbeVerdict.UNKNOWN:
            lo += 1
        while hi - lo > 1 and self.answers.get(hi) is ProbeVerdict.UNKNOWN:
            hi -= 1
        return lo, hi

    def result(self) -> BisectResult:
        probes = tuple((i, self.answers[i]) for i in self.order)
        if self.count < 2:
            return BisectResult(BisectStatus.TOO_FEW, None, None, None, (), probes)
        known = self._known()
        if not known:
            return BisectResult(BisectStatus.NO_VERDICT, None, None, None, (), probes)
        pair = self._boundary(known)
        if pair is None:
            first = next(i for i in self.order if self.answers[i] is not ProbeVerdict.UNKNOWN)
            return BisectResult(BisectStatus.NO_TRANSITION, None, None, self.answers[first], (), probes)
        lo, hi = pair
        between = tuple(i for i in range(lo + 1, hi) if i in self.answers)
        return BisectResult(BisectStatus.FOUND, lo, hi, self.answers[lo], between, probes)


def round_bound(n: int, k: int) -> int:
    """Rounds of `next_round(k)` for one transition among n candidates without unknowns."""
    if n < 2:
        return n
    rounds, reach = (2 if k == 1 else 1), 1
    while reach < n - 1:  # ceil(log_(k+1)(n - 1)) in integers
        rounds, reach = rounds + 1, reach * (k + 1)
    return rounds


# -- survey ------------------------------------------------------------------------------------
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class ChangePoint(Generic[K]):
    before: int
    after: int
    key_before: K
    key_after: K
    unknown_between: tuple[int, ...]


@dataclass(frozen=True)
class SurveyResult(Generic[K]):
    keys: dict[int, K | None]  # every probed index -> its key (None: unknown)
    order: tuple[int, ...]  # probe order
    change_points: tuple[ChangePoint[K], ...]  # in candidate order

    @property
    def probe_count(self) -> int:
        return len(self.order)


class Survey(_Probed[Optional[K]]):
    """Like `Bisection`, for many transitions: keys instead of verdicts, None meaning unknown."""

    def __init__(self, count: int, every: bool = False) -> None:
        super().__init__(count)
        self.every = every

    def _known(self) -> list[int]:
        return sorted(i for i, k in self.answers.items() if k is not None)

    def _round(self, k: int) -> list[int]:
        """The walk-in from both ends first (until something is known), then each segment whose
        ends differ split by the slots left, leftmost first; `every` probes them all in order."""
        untried = [i for i in range(self.count) if i not in self.answers]
        if not untried or self.every:
            return untried[:k]
        known = self._known()
        picks: list[int] = []
        if not known:
            picks.append(untried[0])
        if untried[-1] > (known[-1] if known else untried[0]) and len(picks) < k:
            picks.append(untried[-1])
        if not known:
            return sorted(picks)

        def tried(i: int) -> bool:
            return i in self.answers or i in picks

        for a, b in zip(known, known[1:]):
            if len(picks) >= k:
                break
            if self.answers[a] != self.answers[b]:
                picks += _spread(a, b, k - len(picks), tried)
        return sorted(picks)

    def result(self) -> SurveyResult[K]:
        known = self._known()
        points = []
        for a, b in zip(known, known[1:]):
            ka, kb = self.answers[a], self.answers[b]
            if ka != kb:
                assert ka is not None and kb is not None
                unknown = tuple(i for i in range(a + 1, b) if i in self.answers)
                points.append(ChangePoint(a, b, ka, kb, unknown))
        return SurveyResult(dict(self.answers), tuple(self.order), tuple(points))
