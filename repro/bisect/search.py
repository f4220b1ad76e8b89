"""Pure bisection and survey over an ordered list of candidates (versions, commits, anything).

Nothing here knows about pip, Docker or records: callers feed verdicts (bisect) or keys (survey)
for the index the state machine asks for, so every decision is unit-testable with literal lists.

Bisection: both ends are probed first, walking inward past unknowns; the verdict found at the
start side is the "before" state, the end side must show the other one, and a binary search finds
the adjacent pair where it flips. An unknown in the middle is stepped around by probing the
nearest untried candidate instead. With no unknowns, a single transition among N candidates costs
2 + ceil(log2(N - 1)) <= ceil(log2 N) + 2 probes.

Survey: find every index where the key (e.g. outcome + signature) changes, splitting a segment
only when its two probed ends differ; `every=True` probes each candidate instead. Unknown probes
(key None) are stepped around the same way and reported between the change points they hide in.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


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


def _nearest_untried(lo: int, hi: int, tried: Callable[[int], bool]) -> int | None:
    """The untried index strictly inside (lo, hi) closest to the midpoint (lower one on ties)."""
    mid = (lo + hi) // 2
    for dist in range(hi - lo):
        for cand in (mid - dist, mid + dist):
            if lo < cand < hi and not tried(cand):
                return cand
    return None


class Bisection:
    """Ask `next_probe()`, answer with `record(index, verdict)`, until `next_probe()` is None."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.verdicts: dict[int, ProbeVerdict] = {}
        self.order: list[int] = []
        self._lo: int | None = None  # first known index from the start side
        self._hi: int | None = None  # first known index from the end side
        self._before: ProbeVerdict | None = None

    # -- state ---------------------------------------------------------------------------------
    def _tried(self, i: int) -> bool:
        return i in self.verdicts

    def _walk_start(self) -> int | None:
        """Next index of the inward walk from the start, or None once a known verdict is found."""
        for i in range(self.count):
            if i not in self.verdicts:
                return i
            if self.verdicts[i] is not ProbeVerdict.UNKNOWN:
                return None
        return None

    def _first_known(self, indices: range) -> int | None:
        return next(
            (i for i in indices if self.verdicts.get(i, ProbeVerdict.UNKNOWN) is not ProbeVerdict.UNKNOWN), None
        )

    def _walk_end(self, floor: int) -> int | None:
        for i in range(self.count - 1, floor, -1):
            if i not in self.verdicts:
                return i
            if self.verdicts[i] is not ProbeVerdict.UNKNOWN:
                return None
        return None

    def next_probe(self) -> int | None:
        if self.count < 2:
            return None
        if self._lo is None:
            step = self._walk_start()
            if step is not None:
                return step
            self._lo = self._first_known(range(self.count))
            if self._lo is None:
                return None
        if self._hi is None:
            step = self._walk_end(self._lo)
            if step is not None:
                return step
            self._hi = self._first_known(range(self.count - 1, self._lo, -1))
            if self._hi is None:
                return None
            if self.verdicts[self._hi] is self.verdicts[self._lo]:
                return None  # no transition to look for
            self._before = self.verdicts[self._lo]
        if self._before is None:
            return None
        return _nearest_untried(self._lo, self._hi, self._tried)

    def record(self, index: int, verdict: ProbeVerdict) -> None:
        if index in self.verdicts:
            raise ValueError(f"candidate {index} was already probed")
        if not 0 <= index < self.count:
            raise IndexError(index)
        self.verdicts[index] = verdict
        self.order.append(index)
        if self._before is None or verdict is ProbeVerdict.UNKNOWN:
            return
        assert self._lo is not None and self._hi is not None
        if self._lo < index < self._hi:
            if verdict is self._before:
                self._lo = index
            else:
                self._hi = index

    def bounds(self) -> tuple[int, int]:
        """The narrowest range still known to hold the transition (for resuming after Ctrl-C)."""
        if self._before is None or self._lo is None or self._hi is None:
            return 0, self.count - 1
        return self._lo, self._hi

    def result(self) -> BisectResult:
        probes = tuple((i, self.verdicts[i]) for i in self.order)
        if self.count < 2:
            return BisectResult(BisectStatus.TOO_FEW, None, None, None, (), probes)
        known = [i for i in self.order if self.verdicts[i] is not ProbeVerdict.UNKNOWN]
        if not known:
            return BisectResult(BisectStatus.NO_VERDICT, None, None, None, (), probes)
        if self._lo is None or self._hi is None or self.verdicts[self._hi] is self.verdicts[self._lo]:
            return BisectResult(BisectStatus.NO_TRANSITION, None, None, self.verdicts[known[0]], (), probes)
        between = tuple(i for i in range(self._lo + 1, self._hi) if i in self.verdicts)
        return BisectResult(BisectStatus.FOUND, self._lo, self._hi, self.verdicts[self._lo], between, probes)


def bisect(items: Sequence[T], judge: Callable[[T], ProbeVerdict]) -> BisectResult:
    """Run a whole bisection with `judge` (tests and simple callers)."""
    state = Bisection(len(items))
    while (i := state.next_probe()) is not None:
        state.record(i, judge(items[i]))
    return state.result()


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


class Survey(Generic[K]):
    """Like `Bisection`, for many transitions: keys instead of verdicts, None meaning unknown."""

    def __init__(self, count: int, every: bool = False) -> None:
        self.count = count
        self.every = every
        self.keys: dict[int, K | None] = {}
        self.order: list[int] = []

    def _known(self) -> list[int]:
        return sorted(i for i, k in self.keys.items() if k is not None)

    def next_probe(self) -> int | None:
        untried = [i for i in range(self.count) if i not in self.keys]
        if not untried:
            return None
        if self.every:
            return untried[0]
        known = self._known()
        if not known:
            return untried[0]  # walking in from the start until something is known
        if untried[-1] > known[-1]:
            return untried[-1]  # walking in from the end until something is known
        # Split the leftmost segment whose ends differ and that still has untried candidates.
        for a, b in zip(known, known[1:]):
            if self.keys[a] != self.keys[b]:
                cand = _nearest_untried(a, b, lambda i: i in self.keys)
                if cand is not None:
                    return cand
        return None

    def record(self, index: int, key: K | None) -> None:
        if index in self.keys:
            raise ValueError(f"candidate {index} was already probed")
        if not 0 <= index < self.count:
            raise IndexError(index)
        self.keys[index] = key
        self.order.append(index)

    def result(self) -> SurveyResult[K]:
        known = self._known()
        points = []
        for a, b in zip(known, known[1:]):
            ka, kb = self.keys[a], self.keys[b]
            if ka != kb:
                assert ka is not None and kb is not None
                unknown = tuple(i for i in range(a + 1, b) if i in self.keys)
                points.append(ChangePoint(a, b, ka, kb, unknown))
        return SurveyResult(dict(self.keys), tuple(self.order), tuple(points))


def survey(items: Sequence[T], key_of: Callable[[T], K | None], every: bool = False) -> SurveyResult[K]:
    state: Survey[K] = Survey(len(items), every=every)
    while (i := state.next_probe()) is not None:
        state.record(i, key_of(items[i]))
    return state.result()
