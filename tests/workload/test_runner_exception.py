"""Which rank's exception a run's record shows (repro/workload/runner.py `_pick_exception`).

When one rank fails, torchrun sends SIGTERM to the others and they record `Terminated`; the
record must name the rank that failed on its own, not the lowest rank the launcher stopped
(seen in the affected range: "crashed on rank 0: Terminated" where rank 1 had
`AttributeError: module 'torch' has no attribute 'compiler'`).
"""

from __future__ import annotations

from typing import Any

from repro.workload import runner

TERMINATED = {"type": "Terminated", "message": "SIGTERM received (traceback: where the main thread was)"}
OWN = {"type": "AttributeError", "message": "module 'torch' has no attribute 'compiler'"}
ILLEGAL = {"type": "RuntimeError", "message": "Illegal to call wait on IllegalWork object"}


def pick(ranks: dict[int, dict[str, Any]]) -> tuple[Any, Any]:
    exc = runner._pick_exception({r: {"exception": e} if e else {} for r, e in ranks.items()})
    return (exc["rank"], exc["type"]) if exc else (None, None)


def test_a_rank_that_failed_on_its_own_wins_over_lower_terminated_ranks() -> None:
    assert pick({0: TERMINATED, 1: OWN, 2: TERMINATED, 3: OWN}) == (1, "AttributeError")


def test_an_illegal_work_error_wins_over_any_other() -> None:
    assert pick({0: OWN, 1: TERMINATED, 2: ILLEGAL}) == (2, "RuntimeError")


def test_only_terminated_ranks_name_the_lowest() -> None:
    assert pick({0: None, 1: TERMINATED, 2: TERMINATED}) == (1, "Terminated")


def test_no_exception() -> None:
    assert pick({0: None, 1: None}) == (None, None)
