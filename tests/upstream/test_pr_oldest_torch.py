"""pr-verify takes the oldest torch REF imports with, probed (#43 item 6): the candidates between
the reporter's torch and the others taken, a binary search with REF's own zero3 probe, and the
torch found verified like the others (its zero3 probe from the cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from repro.upstream.pr import oldest_torch as pr_oldest
from repro.upstream.pr import verify_run as pr_verify_run
from repro.upstream.pr.verify import TriedJSON
from tests.fixtures.pr_verify_standins import (
    NO_IMPORT,
    StandInProbe,
    ds,  # noqa: F401 - a fixture
    made,  # noqa: F401 - a fixture
    regression_stand_in,
)

RELEASES = ("2.1.0", "2.2.0", "2.2.2", "2.3.1", "2.4.0", "2.4.1", "2.5.0rc1", "2.5.1", "2.6.0", "2.7.1",
            "2.8.0", "2.9.1", "2.10.0", "2.13.0")  # fmt: skip


def test_the_candidates_are_the_newest_release_of_each_minor_between() -> None:
    assert pr_oldest.candidates(RELEASES, "2.1.0", "2.9.1") == [
        "2.2.2", "2.3.1", "2.4.1", "2.5.1", "2.6.0", "2.7.1", "2.8.0",
    ]  # fmt: skip
    assert pr_oldest.candidates(["2.2.0+cpu", "x", "2.3.0.dev1"], "2.1.0", "2.9.1") == []


def test_the_search_finds_the_first_that_imports_in_few_probes() -> None:
    torches = pr_oldest.candidates(RELEASES, "2.1.0", "2.9.1")
    for first in [*torches, None]:
        asked: list[str] = []

        def probe(torch: str, first: str | None = first, asked: list[str] = asked) -> TriedJSON:
            asked.append(torch)
            ok = first is not None and torches.index(torch) >= torches.index(first)
            return TriedJSON(torch=torch, imports=ok, why="")

        found, tried = pr_oldest.search(torches, probe)
        assert (
            found == first
            and len(asked) <= 3
            and [t["torch"] for t in tried] == sorted(asked, key=torches.index)
        )


def test_pr_verify_adds_the_oldest_torch_ref_imports_with(
    made: tuple[Path, dict[str, Any]],  # noqa: F811
    ds: Any,  # noqa: F811
) -> None:
    out, pr = made
    answers = {("ref", "zero3", t): NO_IMPORT for t in ("2.1.0", "2.2.2", "2.3.1")}
    answers |= {("branch", "zero3", t): NO_IMPORT for t in ("2.1.0",)}
    answers |= {(s, k, "2.1.0"): NO_IMPORT for s in ("ref", "branch") for k in ("mics", "mics-hier")}
    probe = StandInProbe(pr, answers)
    args = pr_verify_run.VerifyRequest(ds_repo=str(ds.path), engine="venv", verify=True, range=False)
    runners = {"probe": probe, "regression": regression_stand_in, "releases": lambda: RELEASES}
    pr_verify_run.run(out, args, runners)

    data = json.loads((out / "verify.json").read_text())
    oldest = data["oldest_torch"]
    assert oldest["torch"] == "2.4.1", oldest
    assert [(t["torch"], t["imports"]) for t in oldest["tried"]] == [
        ("2.1.0", False), ("2.3.1", False), ("2.4.1", True), ("2.6.0", True),
    ]  # fmt: skip
    # this REF has no CI workflow: the candidates lie between the reporter's torch and the newest
    assert [s["torch"] for s in data["stacks"]] == ["2.1.0", "2.4.1", "2.13.0"]
    checked = {(c["key"], c["torch"]): c["ok"] for c in data["checks"]}
    assert checked[("mics", "2.4.1")] is True and checked[("zero3", "2.4.1")] is True
    # REF's zero3 probe on 2.4.1 answered the search and the check: probed once
    ref_zero3 = [
        c for c in probe.calls if (c.scenario, c.torch, c.commit) == ("zero3", "2.4.1", pr["ref_sha"])
    ]
    assert len(ref_zero3) == 1
    text = (out / "PR_DESCRIPTION.md").read_text()
    said = "The oldest torch REF imports with, probed (2.1.0 does not, 2.3.1 does not, 2.4.1 imports, "
    assert said + "2.6.0 imports): torch 2.4.1, verified below." in text


def test_with_torches_given_nothing_is_probed_for_the_oldest(
    made: tuple[Path, dict[str, Any]],  # noqa: F811
    ds: Any,  # noqa: F811
) -> None:
    out, pr = made
    probe = StandInProbe(pr)
    args = pr_verify_run.VerifyRequest(
        ds_repo=str(ds.path), engine="venv", verify=True, range=False, torches="2.13.0"
    )
    asked: list[str] = []
    runners = {
        "probe": probe,
        "regression": regression_stand_in,
        "releases": lambda: asked.append("x") or RELEASES,
    }
    pr_verify_run.run(out, args, runners)
    assert asked == [] and {c.torch for c in probe.calls} == {"2.13.0"}
